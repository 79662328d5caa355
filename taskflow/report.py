"""The pydantic report models of a run (``FlowResult.report()``), imported on first use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["FlowReport", "NodeReport", "short"]


class NodeReport(BaseModel):
    """One node of a run, JSON-ready. Times are seconds since the run started."""

    model_config = ConfigDict(frozen=True)

    name: str
    state: str
    node_state: str
    attempts: int
    queued_at: float | None
    started_at: float | None
    finished_at: float | None
    duration: float | None
    thread: str | None
    fathers: list[str]
    result: str | None
    error_type: str | None
    error: str | None
    cause: str | None
    hedges: int = 0
    """Duplicate attempts started (``hedge``)."""
    shared: bool = False
    """Its outcome came from another run's call or the cache (``share_key``)."""


class FlowReport(BaseModel):
    """One run, JSON-ready (``model_dump_json()``)."""

    model_config = ConfigDict(frozen=True)

    flow_id: str
    flow: str = ""
    """The flow's name (``start(..., name=...)``)."""
    ok: bool
    status: str = "COMPLETED"
    elapsed: float
    timeout: float | None
    cancelled: str | None
    counts: dict[str, int]
    nodes: list[NodeReport]
    degraded: list[str] = []
    """Nodes that ended DEGRADED (a fallback's value stood in)."""


def short(value: Any, limit: int = 200) -> str | None:
    """``repr(value)``, cut to ``limit`` characters (None stays None)."""
    if value is None:
        return None
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
