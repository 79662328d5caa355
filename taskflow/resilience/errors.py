"""Errors raised by the resilience primitives; they live in ``taskflow.errors`` (re-exported
here for the primitives' own imports)."""

from __future__ import annotations

from taskflow.errors import BulkheadFullError, CircuitOpenError, FallbackError, UnhashableKeyError

__all__ = ["BulkheadFullError", "CircuitOpenError", "FallbackError", "UnhashableKeyError"]
