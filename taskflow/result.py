"""Results: ``ResultState``, ``WorkResult`` (one node in one run), ``FlowResult`` (one run).

``WorkResult`` is a plain slotted object written by the engine (under the run's lock, result
before state) and frozen once the run returns; ``FlowResult.report()`` gives the pydantic view.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from taskflow.engine import _Run
    from taskflow.node import SchedulingNode

__all__ = ["FlowReport", "FlowResult", "NodeReport", "ResultState", "WorkResult"]

V = TypeVar("V")


class ResultState(enum.Enum):
    """How a node ended in one run. ``DEFAULT`` until it ends."""

    DEFAULT = "DEFAULT"
    SUCCESS = "SUCCESS"
    TIMEOUT = "TIMEOUT"
    EXCEPTION = "EXCEPTION"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"


class WorkResult(Generic[V]):
    """One node's outcome in one run.

    Attributes:
        result: the value ``task`` returned (None unless SUCCESS).
        state: the :class:`ResultState`; written after ``result``/``exception``.
        exception: the original exception; for a node failed fast, an ``UpstreamFailedError``
            whose ``__cause__`` is the father's exception.
        attempts: how many times ``task`` was started.
        queued_at / started_at / finished_at: ``time.monotonic()`` stamps (None if not reached);
            ``started_at`` is the first attempt's start.
        thread: name of the thread that ran the last attempt.
    """

    __slots__ = (
        "attempts",
        "exception",
        "finished_at",
        "queued_at",
        "result",
        "started_at",
        "state",
        "thread",
    )

    def __init__(self) -> None:
        self.result: V | None = None
        self.state = ResultState.DEFAULT
        self.exception: BaseException | None = None
        self.attempts = 0
        self.queued_at: float | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.thread: str | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from first start to the end, or None if it never started or has not ended."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    def __repr__(self) -> str:
        extra = f" exception={self.exception!r}" if self.exception is not None else ""
        return f"<WorkResult {self.state.name} result={self.result!r}{extra} attempts={self.attempts}>"


_FAILED = (ResultState.EXCEPTION, ResultState.TIMEOUT)


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


class FlowReport(BaseModel):
    """One run, JSON-ready (``model_dump_json()``)."""

    model_config = ConfigDict(frozen=True)

    flow_id: str
    ok: bool
    elapsed: float
    timeout: float | None
    cancelled: str | None
    counts: dict[str, int]
    nodes: list[NodeReport]


def _short(value: Any, limit: int = 200) -> str | None:
    if value is None:
        return None
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class FlowResult(Mapping[str, "SchedulingNode[Any, Any]"]):
    """The outcome of one run: a mapping of node name to that run's node.

    Attributes:
        flow_id: the run's id (also bound in its log lines).
        elapsed: seconds from start to return.
        started_at: ``time.monotonic()`` when the run started.
        timeout: the budget it had (None: none).
    """

    __slots__ = ("_failed", "_outputs", "_run", "elapsed", "flow_id", "started_at", "timeout")

    def __init__(self, run: _Run, elapsed: float) -> None:
        self._run = run
        self.flow_id: str = run.flow_id
        self.elapsed = elapsed
        self.started_at: float = run.t0
        self.timeout: float | None = None if math.isinf(run.budget) else run.budget
        self._outputs: dict[str, Any] | None = None
        self._failed: dict[str, WorkResult[Any]] | None = None

    # Mapping
    def __getitem__(self, name: str) -> SchedulingNode[Any, Any]:
        try:
            i = self._run.plan.index[name]
        except KeyError:
            raise KeyError(name) from None
        return self._run.node(i)

    def __iter__(self) -> Iterator[str]:
        return iter(self._run.plan.names)

    def __len__(self) -> int:
        return len(self._run.plan.names)

    def result_of(self, name: str) -> WorkResult[Any]:
        """The WorkResult of node ``name`` (KeyError if there is no such node)."""
        try:
            return self._run.results[self._run.plan.index[name]]
        except KeyError:
            raise KeyError(name) from None

    @property
    def outputs(self) -> dict[str, Any]:
        """name -> result of each node that ended SUCCESS.

        (Named ``values`` before 0.2; that name clashed with ``Mapping.values()``.)
        """
        if self._outputs is None:
            names = self._run.plan.names
            self._outputs = {
                names[i]: wr.result
                for i, wr in enumerate(self._run.results)
                if wr.state is ResultState.SUCCESS
            }
        return self._outputs

    @property
    def failed(self) -> dict[str, WorkResult[Any]]:
        """name -> WorkResult of each node that ended EXCEPTION or TIMEOUT."""
        if self._failed is None:
            names = self._run.plan.names
            self._failed = {
                names[i]: wr for i, wr in enumerate(self._run.results) if wr.state in _FAILED
            }
        return self._failed

    @property
    def cancelled(self) -> str | None:
        """The reason given to ``ctx.cancel`` if the run was cancelled, else None."""
        return self._run.cancel_reason

    @property
    def ok(self) -> bool:
        """True iff no node failed or timed out and the run was not cancelled."""
        return not self.failed and self._run.cancel_reason is None

    def states(self) -> dict[str, ResultState]:
        """name -> ResultState of every node."""
        names = self._run.plan.names
        return {names[i]: wr.state for i, wr in enumerate(self._run.results)}

    def raise_for_failure(self) -> None:
        """Raise if the run is not ``ok``; return None otherwise.

        Raises:
            BaseException: the earliest original exception of a node that ended EXCEPTION (the
                exception object itself, with a note naming the node).
            FlowTimeoutError: no original exception, but nodes timed out (names them).
            NodeCancelledError: the run was cancelled with ``ctx.cancel``.
            FlowFailedError: only failed-fast nodes remain (they are named).
        """
        from taskflow.errors import (
            FlowFailedError,
            FlowTimeoutError,
            NodeCancelledError,
            UpstreamFailedError,
        )

        if self.ok:
            return
        failed = self.failed
        originals = [
            (wr.finished_at or 0.0, name, wr)
            for name, wr in failed.items()
            if wr.state is ResultState.EXCEPTION
            and wr.exception is not None
            and not isinstance(wr.exception, UpstreamFailedError)
        ]
        if originals:
            originals.sort(key=lambda t: t[0])
            raise originals[0][2].exception  # type: ignore[misc]
        timed_out = [n for n, wr in failed.items() if wr.state is ResultState.TIMEOUT]
        if timed_out:
            raise FlowTimeoutError(timed_out, self.timeout)
        if self._run.cancel_reason is not None:
            raise NodeCancelledError(self.flow_id, self._run.cancel_reason)
        raise FlowFailedError(failed)

    def report(self) -> FlowReport:
        """A JSON-ready pydantic model of the run (``.model_dump_json()``)."""
        run = self._run
        t0 = run.t0
        plan = run.plan

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 6)

        nodes = []
        counts: dict[str, int] = {}
        for i, wr in enumerate(run.results):
            counts[wr.state.name] = counts.get(wr.state.name, 0) + 1
            exc = wr.exception
            cause = exc.__cause__ if exc is not None else None
            nodes.append(
                NodeReport(
                    name=plan.names[i],
                    state=wr.state.name,
                    node_state=run.node(i).state.name,
                    attempts=wr.attempts,
                    queued_at=rel(wr.queued_at),
                    started_at=rel(wr.started_at),
                    finished_at=rel(wr.finished_at),
                    duration=None if wr.duration is None else round(wr.duration, 6),
                    thread=wr.thread,
                    fathers=[plan.names[f] for f in plan.fathers[i]],
                    result=_short(wr.result),
                    error_type=type(exc).__name__ if exc is not None else None,
                    error=str(exc) if exc is not None else None,
                    cause=f"{type(cause).__name__}: {cause}" if cause is not None else None,
                )
            )
        return FlowReport(
            flow_id=self.flow_id,
            ok=self.ok,
            elapsed=round(self.elapsed, 6),
            timeout=self.timeout,
            cancelled=run.cancel_reason,
            counts=counts,
            nodes=nodes,
        )

    def to_mermaid(self) -> str:
        """A Mermaid Gantt chart of the run (one bar per node that started)."""
        from taskflow.viz import run_to_mermaid

        return run_to_mermaid(self)

    def to_html(self, **options: Any) -> str:
        """One self-contained HTML page of the run; options as ``taskflow.html.render_html``."""
        from taskflow.html import render_html

        return render_html(self, **options)

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"failed={sorted(self.failed)}"
        return f"<FlowResult {self.flow_id} {status} nodes={len(self)} elapsed={self.elapsed:.4f}s>"
