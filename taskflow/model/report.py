"""The pydantic report models of a run (``FlowResult.report()``), imported on first use.

Values in a report (node results, and context entries when asked for) follow one rule: a value
JSON can carry stays a value, in the field named for it (``result``, ``context``); any other
value is left out of that field and its ``repr``, cut to 200 characters, goes in the field of
the same name ending in ``_repr`` (``result_repr``, ``context_repr``). JSON can carry ``None``,
``bool``, ``int``, finite ``float``, ``str``, and ``list``/``tuple`` and ``dict`` with ``str``
keys made of those, nested up to 100 levels (subclasses count as their base type: an
``IntEnum`` is its number, a tuple becomes a list). One value is never split: a list holding
one object JSON cannot carry is reported whole as its ``repr``.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

__all__ = ["ClampReport", "DetachedReport", "FlowReport", "HookErrorReport", "NodeReport", "OnCancelReport",
           "detached_report", "json_value", "short"]

# how deep a value may nest and still be carried as JSON
MAX_DEPTH = 100


class HookErrorReport(BaseModel):
    """A hook of the node raised (it did not change the node's outcome)."""

    model_config = ConfigDict(frozen=True)

    hook: str
    """``on_begin``, ``on_success`` or ``on_fail``."""
    type: str
    """The exception's class name."""
    message: str
    """``str()`` of the exception."""


class ClampReport(BaseModel):
    """A call a clamped client (``taskflow.http``) limited to its attempt's deadline."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    """The node's attempt that made the call (1-based; a hedged duplicate has its number)."""
    timeout: float
    """The seconds the call was given (connect and read), at most the time the attempt had."""


class OnCancelReport(BaseModel):
    """``ctx.on_cancel`` callbacks: registered, run (the attempt was abandoned) and raised."""

    model_config = ConfigDict(frozen=True)

    registered: int
    ran: int
    """Those called (``raised`` included); a callback of an attempt abandoned at the deadline
    may still be running when ``start`` returns."""
    raised: int
    """Those that raised (logged, never propagated)."""


class DetachedReport(BaseModel):
    """How a detached node (``detach=True``) ended, as far as known when the report was made."""

    model_config = ConfigDict(frozen=True)

    ended: bool
    """It had ended when the report was made (False: still running)."""
    state: str | None = None
    """Its final state (``SUCCESS``, ``EXCEPTION``, ``TIMEOUT``); None while it runs."""
    attempts: int = 0
    finished_at: float | None = None
    """Seconds from the run's start (it may end after the run returned)."""
    duration: float | None = None
    error_type: str | None = None
    error: str | None = None


def detached_report(fut: Future[Any] | None, t0: float) -> DetachedReport:
    """A detached node's ``DetachedReport`` from the Future of its final WorkResult."""
    if fut is None or not fut.done():
        return DetachedReport(ended=False)
    wr = fut.result()
    exc = wr.exception
    return DetachedReport(
        ended=True, state=wr.state.name, attempts=wr.attempts,
        finished_at=None if wr.finished_at is None else round(wr.finished_at - t0, 6),
        duration=None if wr.duration is None else round(wr.duration, 6),
        error_type=None if exc is None else type(exc).__name__,
        error=None if exc is None else str(exc))


class NodeReport(BaseModel):
    """One node of a run, JSON-ready. Times are seconds since the run started.

    ``result`` is the node's value when JSON can carry it, else None with its ``repr`` in
    ``result_repr`` (see the module docstring); ``result_repr`` is None whenever ``result``
    holds the value.
    """

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
    result: JsonValue = None
    result_repr: str | None = None
    error_type: str | None
    """The class name of the node's error ([`WorkResult.error`][taskflow.WorkResult])."""
    error: str | None
    """``str()`` of the node's error (``WorkResult.error``, also named ``exception``)."""
    cause: str | None
    not_run: str | None = None
    """Why the node never started, when it ended without running: ``"upstream failed"`` (a
    father it needed failed, so it failed fast; its ``state`` is still ``EXCEPTION`` or
    ``TIMEOUT`` after its father's kind of failure) or ``"budget ran out"``; None for a node
    that ran (or whose own gate, such as a breaker, refused it: its error says why)."""
    hook_error: HookErrorReport | None = None
    hedges: int = 0
    """Duplicate attempts started (``hedge``)."""
    shared: bool = False
    """Its outcome came from another run's call or the cache (``share_key``)."""
    batch: str | None = None
    """The batch call that answered it (``"<batch>#<n>"``): nodes with the same label were
    answered by one call (``batch``)."""
    retry_refused: bool = False
    """A retry was refused by its ``retry_budget``: it ended with its last error."""
    clamps: list[ClampReport] = []
    """The first calls (at most 16) a clamped client limited to their attempt's deadline."""
    clamped: int = 0
    """How many calls were clamped in all."""
    on_cancel: OnCancelReport | None = None
    """Its ``ctx.on_cancel`` callbacks (None: its attempts registered none)."""
    section: str | None = None
    """The [`Section`][taskflow.Section] it belongs to (None: none)."""
    deadline: float | None = None
    """Seconds from the run's start by which it had to end (its own ``deadline=`` or its
    section's, the earlier; None: the run's budget alone). Past it the node is ``TIMEOUT``
    (``DEGRADED`` with a fallback) and its error says so."""
    detached: DetachedReport | None = None
    """For a node handed off (state ``DETACHED``): how it ended, if it had."""


class FlowReport(BaseModel):
    """One run, JSON-ready (``model_dump_json()``).

    ``context`` and ``context_repr`` are None unless the report was made with
    ``show_context=True``; then ``context`` holds the entries JSON can carry and
    ``context_repr`` the ``repr`` of the others.
    """

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
    context: dict[str, JsonValue] | None = None
    context_repr: dict[str, str] | None = None
    degraded: list[str] = []
    """Nodes that ended DEGRADED (a fallback's value stood in)."""
    summary: str | None = None
    """What failed and why, in one line (see ``FlowResult.summary``); None when nothing failed
    or degraded."""
    on_cancel: OnCancelReport | None = None
    """Every node's ``ctx.on_cancel`` callbacks added up (None: none registered)."""


def short(value: Any, limit: int = 200) -> str | None:
    """``repr(value)``, cut to ``limit`` characters (None stays None; a ``repr`` that raises
    is named, never propagated)."""
    if value is None:
        return None
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a user __repr__ must not break a report
        text = f"<{type(value).__name__} object; repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _NotJson(Exception):
    """Raised inside [`json_value`][taskflow.model.report.json_value] for a value JSON cannot carry."""


def json_value(value: Any) -> tuple[JsonValue, str | None]:
    """``(value as plain JSON data, None)`` when JSON can carry ``value``, else
    ``(None, its repr cut to 200 characters)`` (the rule of the module docstring)."""
    try:
        return _plain(value, 0), None
    except _NotJson:
        return None, short(value)


def _plain(value: Any, depth: int) -> JsonValue:
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if depth >= MAX_DEPTH:
        raise _NotJson
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _NotJson
            out[str.__str__(k)] = _plain(v, depth + 1)
        return out
    raise _NotJson
