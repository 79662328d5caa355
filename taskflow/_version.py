"""The one place taskflow's version is written; pyproject.toml reads it (``dynamic``)."""

from __future__ import annotations

__version__ = "0.1.0"
