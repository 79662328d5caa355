"""Picklable tasks for tests/test_defects.py (process pools import them by reference)."""

from __future__ import annotations

from typing import Any


def const(ctx: Any, value: Any) -> Any:
    """Return ``param``."""
    return value
