"""Results: ``ResultState``, ``WorkResult`` (one node in one run), ``FlowResult`` (one run).

``WorkResult`` is a plain slotted object written by the engine (under the run's lock, result
before state) and frozen once the run returns; ``FlowResult.report()`` gives the pydantic view
(``taskflow.model.report``, imported on first use so that pydantic stays off the import path).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from taskflow.errors import (
    DetachedRefusedError,
    NodeTimeoutError,
    ResultNotAvailableError,
    UnknownNodeError,
    UpstreamFailedError,
)

if TYPE_CHECKING:
    from taskflow.model.report import FlowReport

__all__ = ["BUDGET_RAN_OUT", "UPSTREAM_FAILED", "AttemptNotes", "AttemptRecord", "DetachedRecord", "FlowResult",
           "FlowStatus",
           "HookError",
           "ResultState", "RunRecord", "WorkResult", "detached_future", "failure_summary", "not_run_reason"]

V = TypeVar("V")


class ResultState(enum.Enum):
    """How a node ended in one run. ``DEFAULT`` until it ends. ``str()`` is the bare name
    (``"SUCCESS"``), as the JSON report writes it."""

    DEFAULT = "DEFAULT"
    SUCCESS = "SUCCESS"
    TIMEOUT = "TIMEOUT"
    EXCEPTION = "EXCEPTION"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"
    DEGRADED = "DEGRADED"
    """Succeeded with a fallback value (a resilience policy); joins count it as a success."""
    DETACHED = "DETACHED"
    """Handed off (``detach=True``): the run did not wait for it. Its final outcome is the
    Future ``FlowResult.detached(name)``; a detached node that was refused, or never started,
    ends EXCEPTION, CANCELLED or TIMEOUT instead."""

    def __str__(self) -> str:
        """The bare name (``"SUCCESS"``), as the JSON report writes it."""
        return self.name


class FlowStatus(enum.Enum):
    """How a run ended, as a whole (see ``FlowResult.status``). ``str()`` is the bare name
    (``"COMPLETED"``), as the JSON report writes it."""

    COMPLETED = "COMPLETED"
    """Nothing failed or degraded."""
    COMPLETED_WITH_ERRORS = "COMPLETED_WITH_ERRORS"
    """Every failure was tolerated (an optional edge, a join that still fired, a detached node
    refused for want of a slot) and no other sink failed; or a node degraded."""
    FAILED = "FAILED"
    """A sink (a node without sons) failed."""
    TIMED_OUT = "TIMED_OUT"
    """The budget ended the run."""
    CANCELLED = "CANCELLED"
    """``ctx.cancel`` ended the run."""

    def __str__(self) -> str:
        """The bare name (``"COMPLETED"``), as the JSON report writes it."""
        return self.name


class HookError(NamedTuple):
    """A hook of a node raised (``FlowResult.hook_errors``); the node's outcome is unchanged."""

    hook: str
    """Which hook: ``"on_begin"``, ``"on_success"`` or ``"on_fail"``."""
    exception: BaseException
    """What it raised."""


class WorkResult(Generic[V]):
    """One node's outcome in one run.

    Attributes:
        result: the value ``task`` returned (None unless SUCCESS).
        state: the [`ResultState`][taskflow.ResultState]; written after ``result``/``exception``.
        error: the node's error, the original exception (None unless it failed or degraded);
            for a node failed fast, an ``UpstreamFailedError`` whose ``__cause__`` is the
            father's exception. The JSON report calls it ``error`` too (``NodeReport.error``,
            its text, and ``error_type``).
        exception: the same object as ``error`` (its first name, kept as an alias).
        attempts: how many times ``task`` was started.
        queued_at / started_at / finished_at: stamps of taskflow's monotonic clock (None if not
            reached; see ``FlowResult.started_at``); ``started_at`` is the first attempt's start.
        thread: name of the thread that ran the last attempt.
        hedges: duplicate attempts started for it (``hedge``).
        shared: its outcome came from another run's call or the cache (``share_key``).
        batch: the label (``"<batch>#<n>"``) of the batch call that answered it (``batch``);
            nodes with the same label were answered by one call.
        retry_refused: a retry it would have made was refused by its ``retry_budget``: it
            ended with its last error.

    A hook that raised is not here (hooks never change a node's outcome): see
    ``FlowResult.hook_errors``.
    """

    __slots__ = (
        "attempts",
        "batch",
        "exception",
        "finished_at",
        "hedges",
        "queued_at",
        "result",
        "retry_refused",
        "shared",
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
        self.hedges = 0
        self.shared = False
        self.batch: str | None = None
        self.retry_refused = False

    @property
    def error(self) -> BaseException | None:
        """The node's error (``exception``, under the name the report uses)."""
        return self.exception

    @property
    def marks(self) -> tuple[str, ...]:
        """What the resilience options did to it, for reports and charts: ``"fallback"``
        (DEGRADED), ``"hedged N"`` (N duplicate attempts), ``"shared"`` (another run's call or
        the cache gave its outcome), ``"batch <label>"`` (the batch call that answered it),
        ``"retry refused"`` (its retry budget was spent)."""
        marks: tuple[str, ...] = ()
        if self.state is ResultState.DEGRADED:
            marks += ("fallback",)
        if self.hedges:
            marks += (f"hedged {self.hedges}",)
        if self.shared:
            marks += ("shared",)
        if self.batch is not None:
            marks += (f"batch {self.batch}",)
        if self.retry_refused:
            marks += ("retry refused",)
        return marks

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
_SUCCEEDED = (ResultState.SUCCESS, ResultState.DEGRADED)


UPSTREAM_FAILED = "upstream failed"
"""``not_run_reason`` of a node failed fast because a father it needed failed."""
BUDGET_RAN_OUT = "budget ran out"
"""``not_run_reason`` of a node the run's budget ended before it started."""


def not_run_reason(wr: WorkResult[Any]) -> str | None:
    """Why a node that ended without starting never ran: ``UPSTREAM_FAILED`` or
    ``BUDGET_RAN_OUT``; None for a node that started, succeeded, was skipped or cancelled,
    or that its own gate (a breaker, a bulkhead, the executor) refused."""
    if wr.started_at is not None or wr.attempts:
        return None
    state = wr.state
    if state is not ResultState.EXCEPTION and state is not ResultState.TIMEOUT:
        return None
    exc = wr.exception
    if isinstance(exc, UpstreamFailedError):
        return UPSTREAM_FAILED
    if state is ResultState.TIMEOUT and isinstance(exc, NodeTimeoutError) and exc.budget:
        return BUDGET_RAN_OUT
    return None


def failure_summary(names: Sequence[str], results: Sequence[WorkResult[Any]], status: str,
                    cancel_reason: str | None = None, limit: int = 3) -> str | None:
    """What failed and why, in one line: the nodes that failed themselves (earliest first,
    with their error), then how many never ran because of them, then the degraded ones.

    None when no node failed or degraded and the run was not cancelled.
    """
    own: list[tuple[float, str, WorkResult[Any]]] = []
    upstream: list[str] = []
    late: list[str] = []
    degraded: list[str] = []
    for name, wr in zip(names, results, strict=True):
        state = wr.state
        if state is ResultState.DEGRADED:
            degraded.append(name)
        elif state is ResultState.EXCEPTION or state is ResultState.TIMEOUT:
            why = not_run_reason(wr)
            if why == UPSTREAM_FAILED:
                upstream.append(name)
            elif why == BUDGET_RAN_OUT:
                late.append(name)
            else:
                own.append((wr.finished_at or math.inf, name, wr))
    if not (own or upstream or late or degraded or cancel_reason):
        return None
    own.sort(key=lambda t: (t[0], t[1]))
    parts = [_failed_line(name, wr) for _, name, wr in own[:limit]]
    if len(own) > limit:
        parts.append(f"{len(own) - limit} more node(s) failed")
    if cancel_reason:
        parts.append(f"cancelled: {_clip(cancel_reason, 200)}")
    if late:
        parts.append(f"{_count(late)} not run: {BUDGET_RAN_OUT} ({_names(late, limit)})")
    if upstream:
        parts.append(f"{_count(upstream)} not run: {UPSTREAM_FAILED} ({_names(upstream, limit)})")
    if degraded:
        parts.append(f"{_count(degraded)} degraded to a fallback ({_names(degraded, limit)})")
    return f"{status}: " + "; ".join(parts)


def _failed_line(name: str, wr: WorkResult[Any]) -> str:
    exc = wr.exception
    if wr.state is ResultState.TIMEOUT:
        what = "timed out"
        if exc is not None:
            what += f" ({_clip(str(exc), 200)})"
    elif exc is None:
        what = "failed"
    else:
        what = f"raised {type(exc).__name__}: {_clip(str(exc), 200)}"
    return f"{name!r} {what}"


def _count(names: list[str]) -> str:
    return f"{len(names)} node{'' if len(names) == 1 else 's'}"


def _names(names: list[str], limit: int) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", +{len(names) - limit} more" if len(names) > limit else "")


def _clip(text: str, limit: int) -> str:
    """``text`` on one line: whole when it fits ``limit``, else its whole first sentence (up to
    three times ``limit``), else cut at the last word that fits, with ``...``."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    end = _SENTENCE_END.search(flat)
    if end is not None and end.end() <= 3 * limit:
        return flat[: end.end()] + " ..."
    cut = flat[: limit - 3]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut) + " ..."


_SENTENCE_END = re.compile(r"[.!?](?= )")



class AttemptNotes:
    """What a node's attempts did with their deadline (``FlowResult.attempt_notes``): only
    nodes whose tasks made clamped calls or registered ``ctx.on_cancel`` callbacks have one.

    Attributes:
        clamps: ``(attempt, seconds)`` of the first calls a clamped client (``taskflow.http``)
            limited to the attempt's deadline, in order (at most 16 kept).
        clamped: how many calls were clamped in all.
        registered: ``on_cancel`` callbacks registered by its attempts.
        ran: callbacks that ran (the attempt was abandoned), ``raised`` included.
        raised: callbacks that raised (logged, never propagated).
    """

    __slots__ = ("clamped", "clamps", "ran", "raised", "registered")

    def __init__(self, clamps: tuple[tuple[int, float], ...], clamped: int, registered: int,
                 ran: int, raised: int) -> None:
        self.clamps = clamps
        self.clamped = clamped
        self.registered = registered
        self.ran = ran
        self.raised = raised

    def __repr__(self) -> str:
        return (f"<AttemptNotes clamped={self.clamped} on_cancel registered={self.registered} "
                f"ran={self.ran} raised={self.raised}>")


class AttemptRecord(Protocol):
    """What a run keeps of its attempts' deadlines (the engine's ``attempts.Watch``)."""

    def notes(self) -> dict[int, AttemptNotes]:
        """Node index -> its clamped calls and ``on_cancel`` callbacks (nodes with any)."""


class DetachedRecord(Protocol):
    """A detached node after its hand-off (the engine's ``detached.Detached``)."""

    @property
    def future(self) -> Future[WorkResult[Any]]:
        """Resolves with its final WorkResult once it ends."""


def detached_future(run: RunRecord, i: int) -> Future[WorkResult[Any]] | None:
    """The Future of node ``i``'s final WorkResult if ``run`` handed it off, else None."""
    work = run.detached_work
    record = work.get(i) if work else None
    return None if record is None else record.future


class RunRecord(Protocol):
    """What a FlowResult reads of its run (the engine's run satisfies it)."""

    flow_id: str
    flow_name: str
    t0: float
    budget: float
    cancel_reason: str | None
    expired: bool
    names: tuple[str, ...]
    results: list[WorkResult[Any]]
    data: dict[str, Any]
    """The run's own context entries (its TaskContext's, kept when the context is reused)."""
    hook_errors: dict[int, HookError]
    """Node index -> the first error a hook of that node raised."""
    plan: Any
    """The compiled plan (``taskflow.model.graph.Plan``): ``section[i]`` and ``deadline[i]``
    are node ``i``'s section name and deadline from the run's start (or None)."""

    def node(self, i: int) -> Any:
        """This run's copy of node ``i``."""

    def index_of(self, name: str) -> int:
        """The index of node ``name`` (KeyError if there is none)."""

    def fathers_of(self, i: int) -> tuple[int, ...]:
        """Indices of the fathers of node ``i``."""

    def is_sink(self, i: int) -> bool:
        """Node ``i`` has no sons."""
    @property
    def watch(self) -> AttemptRecord | None:
        """What its attempts did with their deadline (None: no task of the run asked)."""

    @property
    def detached_work(self) -> Mapping[int, DetachedRecord] | None:
        """Node index -> what became of each node it handed off (``detach=True``); None:
        none."""


class FlowResult(Mapping[str, Any]):
    """The outcome of one run: a mapping of node name to that run's node.

    Attributes:
        flow_id: the run's id (also bound in its log lines).
        flow_name: the flow's name (``start(..., name=...)``; by default its first node's
            name), used by logs, traces and statistics.
        elapsed: seconds from start to return.
        started_at: when the run started, on taskflow's monotonic clock (``taskflow.clock.now()``):
            ``time.monotonic()`` in a process that never entered a ``FakeClock``; after one whose
            virtual time ran ahead, ``time.monotonic() + taskflow.clock.offset`` (time never goes
            back). Compare it with ``taskflow.clock.now()`` or with other stamps of taskflow,
            never with ``time.monotonic()``.
        timeout: the budget it had (None: none).
    """

    __slots__ = ("_failed", "_outputs", "_run", "_status", "elapsed", "flow_id", "flow_name",
                 "started_at", "timeout")

    def __init__(self, run: RunRecord, elapsed: float) -> None:
        self._run = run
        self.flow_id: str = run.flow_id
        self.flow_name: str = run.flow_name
        self.elapsed = elapsed
        self.started_at: float = run.t0
        self.timeout: float | None = None if math.isinf(run.budget) else run.budget
        self._outputs: dict[str, Any] | None = None
        self._failed: dict[str, WorkResult[Any]] | None = None
        self._status: FlowStatus | None = None

    # Mapping
    def __getitem__(self, name: str) -> Any:
        return self._run.node(self._index(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._run.names)

    def __len__(self) -> int:
        return len(self._run.names)

    def result_of(self, name: str) -> WorkResult[Any]:
        """The WorkResult of node ``name`` (``UnknownNodeError``, a KeyError, if there is no such
        node: its message names the closest node name, "did you mean 'product'?")."""
        return self._run.results[self._index(name)]

    def _index(self, name: str) -> int:
        try:
            return self._run.index_of(name)
        except KeyError:
            raise UnknownNodeError(name, self._run.names,
                                   f"no node named {name!r} in flow {self.flow_id}") from None

    @property
    def outputs(self) -> dict[str, Any]:
        """name -> result of each node that ended SUCCESS or DEGRADED.

        (Named ``values`` before 0.2; that name clashed with ``Mapping.values()``.)
        """
        if self._outputs is None:
            names = self._run.names
            self._outputs = {
                names[i]: wr.result
                for i, wr in enumerate(self._run.results)
                if wr.state in _SUCCEEDED
            }
        return self._outputs

    @property
    def failed(self) -> dict[str, WorkResult[Any]]:
        """name -> WorkResult of each node that ended EXCEPTION or TIMEOUT (tolerated failures
        included)."""
        if self._failed is None:
            names = self._run.names
            self._failed = {
                names[i]: wr for i, wr in enumerate(self._run.results) if wr.state in _FAILED
            }
        return self._failed

    @property
    def degraded(self) -> dict[str, WorkResult[Any]]:
        """name -> WorkResult of each node that ended DEGRADED."""
        names = self._run.names
        return {names[i]: wr for i, wr in enumerate(self._run.results)
                if wr.state is ResultState.DEGRADED}

    @property
    def hook_errors(self) -> dict[str, HookError]:
        """name -> [`HookError`][taskflow.model.result.HookError] of each node one of whose hooks raised (the first such
        error of the node in this run).

        Hooks never change a node's outcome: this is where their failures show without logging
        (also in ``report()`` and ``to_html()``). A hook still running when the run returned
        (a slow hook at the deadline, past a short grace) is only logged.
        """
        names = self._run.names
        return {names[i]: err for i, err in sorted(self._run.hook_errors.items())}

    @property
    def context(self) -> Mapping[str, Any]:
        """A read-only view of the run's context entries (its ``TaskContext``'s).

        The entries this run left, whatever later runs of the same context write: a reused
        context starts each run with a copy. Reports and pages leave them out unless asked
        (``report(show_context=True)``, ``to_html(show_context=True)``): they often hold the
        request.
        """
        return MappingProxyType(self._run.data)

    @property
    def cancelled(self) -> str | None:
        """The reason given to ``ctx.cancel`` if the run was cancelled, else None."""
        return self._run.cancel_reason

    @property
    def status(self) -> FlowStatus:
        """How the run ended as a whole (see [`FlowStatus`][taskflow.FlowStatus])."""
        if self._status is None:
            run = self._run
            if run.cancel_reason is not None:
                status = FlowStatus.CANCELLED
            elif run.expired:
                status = FlowStatus.TIMED_OUT
            else:
                status = FlowStatus.COMPLETED
                for i, wr in enumerate(run.results):
                    st = wr.state
                    if st in _FAILED:
                        # a detached node refused for want of a slot: nothing waited for it
                        if run.is_sink(i) and not isinstance(wr.exception,
                                                             DetachedRefusedError):
                            status = FlowStatus.FAILED
                            break
                        status = FlowStatus.COMPLETED_WITH_ERRORS
                    elif st is ResultState.DEGRADED:
                        status = FlowStatus.COMPLETED_WITH_ERRORS
            self._status = status
        return self._status

    @property
    def ok(self) -> bool:
        """``status`` is COMPLETED or COMPLETED_WITH_ERRORS: a page whose optional backend
        failed is ok, while ``failed`` still lists the failure."""
        return self.status in (FlowStatus.COMPLETED, FlowStatus.COMPLETED_WITH_ERRORS)

    def states(self) -> dict[str, ResultState]:
        """name -> ResultState of every node."""
        names = self._run.names
        return {names[i]: wr.state for i, wr in enumerate(self._run.results)}

    @property
    def summary(self) -> str | None:
        """What failed and why, in one line, for a log line or the top of a page: the nodes
        that failed themselves with their errors (earliest first), then how many never ran
        ("not run: upstream failed", "not run: budget ran out"), then the degraded ones,
        prefixed by the run's status. None when nothing failed or degraded.

        ``FAILED: 'stock' raised ConnectionError: refused; 2 nodes not run: upstream failed
        ('page', 'audit')``
        """
        run = self._run
        return failure_summary(run.names, run.results, self.status.name, run.cancel_reason)

    def raise_for_failure(self) -> None:
        """Raise if the run is not ``ok``; return None otherwise.

        A run that is ``ok`` with tolerated failures (COMPLETED_WITH_ERRORS) does not raise.

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
            for wr in self._run.results:
                if wr.state is ResultState.CANCELLED and isinstance(wr.exception,
                                                                   NodeCancelledError):
                    raise wr.exception  # names the node and carries the reason
            raise NodeCancelledError(self._run.names[0], self._run.cancel_reason)
        raise FlowFailedError(failed)

    def detached(self, name: str) -> Future[WorkResult[Any]]:
        """The Future of detached node ``name``'s final WorkResult (``detach=True``).

        The run did not wait for the node: its WorkResult here is ``DETACHED``, and this Future
        resolves once it ends (SUCCESS, EXCEPTION or TIMEOUT under its own ``timeout``), after
        its ``on_success``/``on_fail`` hook returned, on the thread that ended it. It never
        raises the node's error: read the WorkResult's ``state`` and ``exception``. A detached
        node that was refused (``DetachedRefusedError``) or never started (the run ended
        first) gets a Future already resolved with its WorkResult in this run.

        Raises:
            UnknownNodeError: no node of that name in the run (a ``KeyError``, "did you
                mean ...?").
            ResultNotAvailableError: the node is not a detached one.
        """
        run = self._run
        i = self._index(name)
        fut = detached_future(run, i)
        if fut is not None:
            return fut
        if not run.node(i).__dict__.get("detach", False):
            raise ResultNotAvailableError(name, "not a detached node (detach=True)")
        done: Future[WorkResult[Any]] = Future()
        done.set_running_or_notify_cancel()
        done.set_result(run.results[i])
        return done

    @property
    def attempt_notes(self) -> dict[str, AttemptNotes]:
        """Node name -> what its attempts did with their deadline: the calls a clamped client
        limited to it and the ``ctx.on_cancel`` callbacks registered, run and raised (only
        nodes with any; callbacks of attempts abandoned at the deadline may still be running
        when ``start`` returns, so the counts can still grow)."""
        names = self._run.names
        watch = self._run.watch
        return {} if watch is None else {names[i]: n for i, n in watch.notes().items()}

    @property
    def deadlines(self) -> dict[str, tuple[str | None, float]]:
        """Node name -> (its section's name or None, its deadline in seconds from the run's
        start), for the nodes that have one (``deadline=``, a ``Section``)."""
        run = self._run
        out: dict[str, tuple[str | None, float]] = {}
        plan = run.plan
        for name, section, deadline in zip(run.names, plan.section, plan.deadline, strict=True):
            if deadline is not None:
                out[name] = (section, deadline)
        return out

    def report(self, *, show_context: bool = False) -> FlowReport:
        """A JSON-ready pydantic model of the run (``.model_dump_json()``).

        Node results are JSON values where JSON can carry them (``result``), else their
        ``repr`` (``result_repr``); see [`NodeReport`][taskflow.model.report.NodeReport]. A hook that raised
        is in the node's ``hook_error``.

        Args:
            show_context: include the run's context entries (``context``, and
                ``context_repr`` for values JSON cannot carry). Off by default: contexts often
                hold the request (cookies, tokens).
        """
        from taskflow.model.report import (
            ClampReport,
            FlowReport,
            HookErrorReport,
            NodeReport,
            OnCancelReport,
            detached_report,
            json_value,
        )

        run = self._run
        t0 = run.t0
        names = run.names

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 6)

        nodes = []
        counts: dict[str, int] = {}
        hook_errors = run.hook_errors
        sections, deadlines = run.plan.section, run.plan.deadline
        notes = {} if run.watch is None else run.watch.notes()
        totals = [0, 0, 0]
        for i, wr in enumerate(run.results):
            counts[wr.state.name] = counts.get(wr.state.name, 0) + 1
            exc = wr.exception
            cause = exc.__cause__ if exc is not None else None
            value, value_repr = json_value(wr.result)
            hook = hook_errors.get(i)
            note = notes.get(i)
            clamps: list[ClampReport] = []
            on_cancel = None
            if note is not None:
                clamps = [ClampReport(attempt=a, timeout=round(t, 6)) for a, t in note.clamps]
                if note.registered:
                    on_cancel = OnCancelReport(registered=note.registered, ran=note.ran,
                                               raised=note.raised)
                    totals = [totals[0] + note.registered, totals[1] + note.ran,
                              totals[2] + note.raised]
            nodes.append(
                NodeReport(
                    name=names[i],
                    state=wr.state.name,
                    node_state=run.node(i).state.name,
                    attempts=wr.attempts,
                    queued_at=rel(wr.queued_at),
                    started_at=rel(wr.started_at),
                    finished_at=rel(wr.finished_at),
                    duration=None if wr.duration is None else round(wr.duration, 6),
                    thread=wr.thread,
                    fathers=[names[f] for f in run.fathers_of(i)],
                    result=value,
                    result_repr=value_repr,
                    error_type=type(exc).__name__ if exc is not None else None,
                    error=str(exc) if exc is not None else None,
                    cause=f"{type(cause).__name__}: {cause}" if cause is not None else None,
                    not_run=not_run_reason(wr),
                    hook_error=None if hook is None else HookErrorReport(
                        hook=hook.hook, type=type(hook.exception).__name__,
                        message=str(hook.exception)),
                    hedges=wr.hedges,
                    shared=wr.shared,
                    batch=wr.batch,
                    retry_refused=wr.retry_refused,
                    clamps=clamps,
                    clamped=0 if note is None else note.clamped,
                    on_cancel=on_cancel,
                    section=sections[i],
                    deadline=deadlines[i],
                    detached=None if wr.state is not ResultState.DETACHED
                    else detached_report(detached_future(run, i), t0),
                )
            )
        context: dict[str, Any] | None = None
        context_repr: dict[str, str] | None = None
        if show_context:
            context, context_repr = {}, {}
            for key, entry in list(run.data.items()):
                value, value_repr = json_value(entry)
                if value_repr is None:
                    context[str(key)] = value
                else:
                    context_repr[str(key)] = value_repr
        return FlowReport(
            flow_id=self.flow_id,
            flow=self.flow_name,
            ok=self.ok,
            status=self.status.name,
            elapsed=round(self.elapsed, 6),
            timeout=self.timeout,
            cancelled=run.cancel_reason,
            counts=counts,
            nodes=nodes,
            context=context,
            context_repr=context_repr,
            degraded=list(self.degraded),
            summary=self.summary,
            on_cancel=OnCancelReport(registered=totals[0], ran=totals[1], raised=totals[2])
            if totals[0] else None,
        )

    def to_mermaid(self) -> str:
        """A Mermaid Gantt chart of the run (one bar per node that started)."""
        from taskflow.observe.viz import run_to_mermaid

        return run_to_mermaid(self)

    def to_html(self, **options: Any) -> str:
        """One self-contained HTML page of the run; options as ``taskflow.observe.html.render_html``."""
        from taskflow.observe.html import render_html

        return render_html(self, **options)

    def __repr__(self) -> str:
        status = self.status.name
        if self.failed:
            status += f" failed={sorted(self.failed)}"
        return f"<FlowResult {self.flow_id} {status} nodes={len(self)} elapsed={self.elapsed:.4f}s>"
