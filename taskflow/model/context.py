"""``TaskContext`` — the task bus shared by the nodes of one run — and ``TaskSupport`` for hooks.

Deadlines out and abandonment (``ctx.timeout``, ``ctx.deadline_headers``, ``ctx.on_cancel``)
are answered by the run the asking thread belongs to (``ContextView.asking``: the attempt of
the run that runs on this thread, as an ``AttemptView``): the engine knows the attempt's node,
its first start and the run's deadline. Nothing is stored per node unless a task asks.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Protocol

from taskflow import clock
from taskflow.errors import (
    BudgetExhaustedError,
    FlowDefinitionError,
    InvalidArgumentError,
    NodeCancelledError,
    ResultNotAvailableError,
    UnknownNodeError,
)
from taskflow.model.callables import callable_is_async
from taskflow.model.deadlines import check_seconds, deadline_headers_for
from taskflow.model.result import RunRecord, WorkResult

__all__ = [
    "AttemptView",
    "ContextView",
    "RunView",
    "TaskContext",
    "TaskSupport",
    "attach_view",
    "attempt_context",
    "bind_context",
    "current",
    "detach_run",
    "note_clamp",
]

# The engine sets ``current.run``/``current.idx`` around each task and hook call on the thread
# running it, so ``ctx.cancelled`` can also answer for the node that asks, and a task abandoned by
# an earlier run of a reused context still sees its own run. Read a field that may be missing as
# ``current.__dict__.get(name)`` (this thread's dict): ``getattr(current, name, None)`` costs an
# AttributeError raised and caught, about 0.8 us, on a thread that never set it.
current = threading.local()


class AttemptView(Protocol):
    """One attempt of a node, as its run sees it (``ContextView.asking``)."""

    def deadline(self) -> float:
        """Its deadline on taskflow's monotonic clock (``clock.now()``): the nearer of its node's and the run's (``inf``:
        none; ``-inf``: the run gave up on it)."""

    def on_cancel(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` once if the run gives up on it (at once if it already has)."""

    def note_clamp(self, seconds: float) -> None:
        """A client clamped one of its calls to ``seconds`` (for the report)."""


class ContextView(Protocol):
    """What a TaskContext asks of the run it belongs to (a run, or a snapshot in another
    process)."""

    flow_id: str
    flow_name: str
    deadline: float
    cancel_reason: str | None
    finished: bool

    def cancelled_for_caller(self) -> bool:
        """The run closed, or the asking node is already terminal."""

    def caller_name(self) -> str:
        """The name of the node asking (``"?"`` when it is not one of the run's)."""

    def value_of(self, name: str) -> Any:
        """The result of node ``name`` if it succeeded (``ResultNotAvailableError`` otherwise)."""

    def cancel(self, reason: str | None) -> None:
        """``ctx.cancel``: end the run early."""

    def asking(self) -> AttemptView | None:
        """The attempt of this run that runs on this thread (None when none asks: the
        caller, a hook, another thread)."""


class RunView(ContextView, RunRecord, Protocol):
    """What the model classes (nodes, contexts, results, hook supports) see of a run."""

    ctx: TaskContext
    data: dict[str, Any]

    def node(self, i: int) -> Any:
        """This run's copy of node ``i``."""

    def sons_of(self, i: int) -> tuple[int, ...]:
        """Indices of the sons of node ``i``."""


def attempt_context() -> TaskContext | None:
    """The context of the run whose attempt runs on this thread (a task, not a hook); None
    elsewhere, and in another process (where a task only has the context it was given)."""
    run = current.__dict__.get("run")
    if run is None or current.__dict__.get("hooking") is run:
        return None
    ctx: TaskContext = run.ctx
    return ctx


def note_clamp(ctx: TaskContext, seconds: float) -> None:
    """A client limited a call of the attempt asking on this thread to ``seconds`` (its
    deadline): the run's report says so."""
    view = ctx._view()
    attempt = view.asking() if view is not None else None
    if attempt is not None:
        attempt.note_clamp(seconds)


def attach_view(ctx: TaskContext, view: ContextView) -> None:
    """Point ``ctx`` at ``view`` (a snapshot in another process), holding it strongly."""
    ctx._run = lambda: view


def detach_run(ctx: TaskContext, run: RunView, record: Callable[[], ContextView]) -> None:
    """``run`` finished: if ``ctx`` still points at it, point it at ``record`` (what remains of
    the run, without a reference back to it, which returns itself when called) instead."""
    with ctx._lock:
        ref = ctx._run
        if ref is not None and ref() is run:
            ctx._run = record


def bind_context(ctx: TaskContext, run: RunView, new: bool = False) -> None:
    """Make ``ctx`` the context of ``run`` (which holds it); the context holds the run weakly.

    A context reused after an earlier run gets a fresh copy of its entries, left with the earlier
    run, so a task that run abandoned never writes into the new one. ``new``: the caller made
    ``ctx`` for this run and no other thread has seen it (no lock, nothing to check).

    Raises:
        FlowDefinitionError: the context belongs to a run that has not finished.
    """
    if new:
        run.data = ctx._data
        ctx._run = weakref.ref(run)
        return
    with ctx._lock:
        ref = ctx._run
        active = ref() if ref is not None else None
        if active is not None and not active.finished:
            raise FlowDefinitionError(
                f"context is already used by running flow {active.flow_id}; "
                "one context belongs to one run at a time"
            )
        if ref is not None:
            ctx._data = dict(ctx._data)
        run.data = ctx._data
        ctx._run = weakref.ref(run)


class TaskContext(MutableMapping[str, Any]):
    """A thread-safe mutable mapping shared by every node of one run.

    One context belongs to one run at a time. Beyond the mapping it tells a task about its run:
    ``flow_id``, ``flow_name``, ``remaining()``, ``cancelled``, ``cancel()``, ``result_of()``,
    and to the asking attempt: ``timeout()``, ``deadline_headers()``, ``on_cancel()``.

    On executors that run tasks in other processes, a task gets a picklable snapshot: its
    writes are not seen by other nodes, so results travel as return values.
    """

    __slots__ = ("__weakref__", "_data", "_lock", "_run")

    def __init__(self, initial: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._lock = threading.Lock()  # guards _data for compound operations, and _run
        self._data: dict[str, Any] = dict(initial or (), **kwargs) if initial or kwargs else {}
        # the latest run, held weakly (the run holds the context); a snapshot elsewhere
        self._run: Callable[[], ContextView | None] | None = None

    def _view(self) -> ContextView | None:
        """The run asking: the one running on this thread if it uses this context, else the
        latest run of the context."""
        run = current.__dict__.get("run")
        if run is not None and run.ctx is self:
            view: ContextView = run
            return view
        ref = self._run
        return ref() if ref is not None else None

    def _entries(self) -> dict[str, Any]:
        run = current.__dict__.get("run")
        if run is not None and run.ctx is self:
            data: dict[str, Any] = run.data
            return data
        return self._data

    # -- the mapping -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self._entries()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            self._entries()[key] = value

    def __delitem__(self, key: str) -> None:
        with self._lock:
            del self._entries()[key]

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._entries()))

    def __len__(self) -> int:
        return len(self._entries())

    def __contains__(self, key: object) -> bool:
        return key in self._entries()

    def get(self, key: str, default: Any = None) -> Any:
        return self._entries().get(key, default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._entries().setdefault(key, default)

    def incr(self, key: str, n: int = 1) -> int:
        """Atomically add ``n`` to ``self[key]`` (missing counts as 0) and return the new value."""
        with self._lock:
            data = self._entries()
            value: int = data.get(key, 0) + n
            data[key] = value
            return value

    def snapshot(self) -> dict[str, Any]:
        """A shallow copy of the entries (what travels to other processes)."""
        with self._lock:
            return dict(self._entries())

    # -- the run -----------------------------------------------------------------------------
    @property
    def flow_id(self) -> str | None:
        """The id of the run using this context (None outside a run)."""
        run = self._view()
        return run.flow_id if run is not None else None

    @property
    def operation_id(self) -> str | None:
        """A stable id of the asking node's work in this run: ``"<flow_id>:<node>"``, plus
        ``":<item id>"`` in a fan-out item. The same across the node's retries and hedged
        attempts (``support.attempt`` tells attempts apart), so pass it to a backend as an
        idempotency key. None outside a run.
        """
        run = self._view()
        if run is None:
            return None
        base = f"{run.flow_id}:{run.caller_name()}"
        item = current.__dict__.get("item")
        return base if item is None else f"{base}:{item}"

    @property
    def flow_name(self) -> str | None:
        """The name of the flow using this context (``start(..., name=...)``; by default its
        first node's name), None outside a run."""
        run = self._view()
        return run.flow_name if run is not None else None

    def remaining(self) -> float:
        """Seconds left of the run's budget: never negative, ``inf`` with no budget."""
        run = self._view()
        if run is None:
            return math.inf
        left = run.deadline - clock.now()
        return max(0.0, left)

    @property
    def cancelled(self) -> bool:
        """True once the run timed out or was cancelled, or the asking node was cancelled
        (a join no longer needs it, or its own timeout passed). Long tasks poll it."""
        run = self._view()
        return run is not None and run.cancelled_for_caller()

    def raise_if_cancelled(self) -> None:
        """Raise ``NodeCancelledError`` naming the asking node if [`cancelled`][taskflow.model.context.TaskContext.cancelled] is True."""
        run = self._view()
        if run is not None and run.cancelled_for_caller():
            raise NodeCancelledError(run.caller_name(), run.cancel_reason)

    def cancel(self, reason: str | None = None) -> None:
        """End the run early: unfinished nodes become CANCELLED and ``start`` returns.

        A node that calls this and returns keeps its own result. Safe from any thread. In
        another process (process pools, dask) it has no effect: return a value instead.
        """
        run = self._view()
        if run is not None:
            run.cancel(reason)

    # -- deadlines out, and abandonment -----------------------------------------------------
    def _time_left(self, cap: float | None) -> tuple[ContextView | None, float | None]:
        """(the asking attempt's run, its seconds left at most ``cap``); (None, cap) outside
        an attempt."""
        limit = check_seconds(cap, "cap", positive=True)
        view = self._view()
        attempt = view.asking() if view is not None else None
        if view is None or attempt is None:
            return None, limit
        deadline = attempt.deadline()
        left = deadline - clock.now()
        if left <= 0.0:
            why = ("the run gave up on this attempt" if deadline == -math.inf
                   else f"its deadline passed {-left:.3f}s ago")
            raise BudgetExhaustedError(view.caller_name(), view.flow_id, why)
        if math.isinf(left):
            return view, limit
        return view, left if limit is None else min(left, limit)

    def timeout(self, cap: float | None = None) -> float | None:
        """Seconds the asking attempt may still take: pass it as a backend call's timeout.

        The nearer of its node's deadline (``timeout=`` counts from the node's first start
        and covers all its attempts; in a fan-out item, ``item_timeout`` from the item's
        start) and the run's, at most ``cap``. Asked outside an attempt of a run using this
        context (the caller's thread, a hook, a thread the task started, after the run) it is
        ``cap``: there is no deadline to pass on (read ``timeout()`` in the task and hand the
        number to its threads). In another process (process pools, dask) it is the run's budget
        left when the task was sent.

        Args:
            cap: the most to give (seconds, > 0); None: no cap.

        Returns:
            Seconds (> 0), or None with no deadline and no ``cap``.

        Raises:
            BudgetExhaustedError: no time is left: a deadline has passed, or the run has
                given up on the attempt (also a ``TimeoutError``). Let it propagate.
            FlowDefinitionError: ``cap`` is zero, negative or NaN.
        """
        return self._time_left(cap)[1]

    def deadline_headers(self, cap: float | None = None) -> dict[str, str]:
        """The request headers that carry the asking attempt's deadline to the next service:
        ``grpc-timeout``, ``x-envoy-expected-rq-timeout-ms`` and ``X-Request-Deadline``, for
        ``timeout(cap)`` seconds (what ``taskflow.budget_from_headers`` reads on the other
        side). Empty outside an attempt, or with no deadline.

        Raises:
            BudgetExhaustedError: as ``timeout``.
        """
        view, seconds = self._time_left(cap)
        if view is None or seconds is None:
            return {}
        return deadline_headers_for(seconds)

    def on_cancel(self, fn: Callable[[], object]) -> None:
        """Have ``fn()`` called once if the run gives up on the asking attempt: the way to close
        a socket or a response its thread is blocked on.

        The attempt is abandoned when the run's deadline passes, its node's own timeout
        passes (or its fan-out item's), a hedged duplicate of it won, ``ctx.cancel`` ends the
        run (the node that called it is not abandoned), or a join no longer needs its node.
        ``fn`` then runs on a ``taskflow-coordinator`` thread, in the caller's contextvars,
        holding no lock of taskflow's, never on the timer thread; an exception in it is
        logged and counted (``report().nodes[].on_cancel``), never raised. It is not called
        when the attempt ends by itself (returning or raising) and the run takes its
        outcome. Registered after the attempt was abandoned, it runs at once, on this thread.
        Each attempt has its own callbacks: a retry starts with none.

        Outside an attempt (the caller, a hook, a thread the task started) and in another
        process it does nothing: there is no attempt to abandon, or no way to reach it.

        Raises:
            InvalidArgumentError: ``fn`` is not callable (also a TypeError), or is async (a
                coroutine function: it would never be awaited).
        """
        if not callable(fn):
            raise InvalidArgumentError(
                f"on_cancel needs a callable taking no arguments, got {type(fn).__name__}")
        if callable_is_async(fn):
            raise InvalidArgumentError(
                f"on_cancel needs a plain function, got the async "
                f"{getattr(fn, '__qualname__', type(fn).__name__)}: it is called "
                "on a coordinator thread and never awaited; in an async def task the "
                "cancellation is asyncio.CancelledError at its await: clean up there "
                "(try/finally, async with)")
        view = self._view()
        attempt = view.asking() if view is not None else None
        if attempt is not None:
            attempt.on_cancel(fn)

    def result_of(self, name: str) -> Any:
        """The value of node ``name`` if it finished with SUCCESS (or DEGRADED).

        Asked from a node of the run (its task or a hook), ``name`` must be upstream of it (a
        father, a father's father, ...) or the node itself: any other node may or may not have
        finished by then, so reading it is refused at once, whatever its state, with the edge
        to add. Asked from outside the run (after ``start`` returned), any node can be read. In
        another process only the fathers' results are available.

        Raises:
            UnknownNodeError: no node of that name in the run (a ``KeyError``; the message
                names the run's node closest to it, "did you mean 'product'?", or says how to
                wire the node in).
            ResultNotAvailableError: the node is not upstream of the asking node, or has not
                (or not successfully) finished.
        """
        run = self._view()
        if run is None:
            raise ResultNotAvailableError(name, "not part of a running flow")
        cur = current
        asking_run: RunView | None = cur.__dict__.get("run")
        if asking_run is not None and asking_run is run:  # asked by a task or hook of the run
            idx = cur.__dict__.get("idx")
            if isinstance(idx, int) and idx >= 0:
                _check_upstream(asking_run, idx, name)
        return run.value_of(name)

    def __repr__(self) -> str:
        return f"<TaskContext flow={self.flow_id} keys={sorted(self._data)!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaskContext, (self.snapshot(),))


def _check_upstream(run: RunView, asker: int, name: str) -> None:
    """Raise unless node ``name`` is node ``asker`` or one of its ancestors in ``run``.

    A direct father is found with one scan of the asker's fathers; only a farther read walks
    the ancestors (each at most once).
    """
    asking = run.names[asker]
    try:
        target = run.index_of(name)
    except KeyError:
        said = (f"node {asking!r} asked for the result of {name!r}, but no node of flow "
                f"{run.flow_id} is named {name!r}")
        err = UnknownNodeError(name, run.names, said)
        if err.close is None:
            err.message += (
                f"; wire the node that computes it upstream of {asking!r} "
                f"(<node {asking!r}>.depends_on(<node {name!r}>), or "
                f"<node {name!r}> >> <node {asking!r}>) so that the run includes it")
        raise err from None
    if target == asker:
        return
    fathers_of = run.fathers_of
    stack = list(fathers_of(asker))
    if target in stack:
        return
    seen = set(stack)
    while stack:
        for f in fathers_of(stack.pop()):
            if f == target:
                return
            if f not in seen:
                seen.add(f)
                stack.append(f)
    raise ResultNotAvailableError(
        name,
        f"not upstream of node {asking!r}, so whether it has finished when {asking!r} runs is "
        f"a race; wire it: <node {asking!r}>.depends_on(<node {name!r}>), or "
        f"<node {name!r}> >> <node {asking!r}>",
    )


class TaskSupport:
    """What a hook is given.

    Attributes:
        node: this run's node.
        work_result: its WorkResult.
        context: the run's TaskContext.
        attempt: the attempt number (1-based) the hook is about.
    """

    __slots__ = ("_idx", "_run", "attempt", "context", "node", "work_result")

    def __init__(self, run: RunView, idx: int, attempt: int) -> None:
        self._run = run
        self._idx = idx
        self.node: Any = run.node(idx)
        self.work_result: WorkResult[Any] = run.results[idx]
        self.context: TaskContext = run.ctx
        self.attempt = attempt

    @property
    def fathers(self) -> dict[str, WorkResult[Any]]:
        """father name -> its WorkResult in this run."""
        run = self._run
        names = run.names
        return {names[f]: run.results[f] for f in run.fathers_of(self._idx)}

    def __repr__(self) -> str:
        return f"<TaskSupport {self.node!r} attempt={self.attempt}>"
