"""The facade: ``TaskScheduling.start`` (blocking), ``.submit`` (a Future), ``.stream`` (the nodes
as they settle) and ``run_async``."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

from taskflow import clock
from taskflow.engine import aio, closing, executors, looplag, shedding, streaming
from taskflow.engine.run import Run
from taskflow.engine.streaming import FlowStream
from taskflow.errors import (
    DeadlineWarning,
    FlowDefinitionError,
    InvalidArgumentError,
    InvalidArgumentValueError,
    RejectedExecutionError,
)
from taskflow.model.context import TaskContext, bind_context, current
from taskflow.model.graph import as_top_nodes, cached_plan, compile_plan, select_targets
from taskflow.model.node import check_timeout
from taskflow.model.overrides import override_plan
from taskflow.model.result import FlowResult

if TYPE_CHECKING:
    from taskflow.engine.shedding import Priority

__all__ = ["FlowStream", "TaskScheduling", "run_async", "set_event_loop", "set_loop_block_threshold"]

_TIMEOUT_MAX = threading.TIMEOUT_MAX


def _flow_name(name: Any, tops: tuple[Any, ...]) -> str:
    """The run's flow name: ``name``, or the name of the first top node."""
    if name is None:
        return tops[0].name if tops else ""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"name must be a str or None, got {type(name).__name__}",
                                   argument="name")
    if not name:
        raise InvalidArgumentValueError(
            "name must not be empty (None: the first top node's name)", argument="name")
    return name


def _budget(timeout: Any) -> float:
    """The run's budget from ``timeout``: None and ``inf`` are none (``inf``)."""
    if type(timeout) is float and 0.0 <= timeout < _TIMEOUT_MAX:  # the common case, first
        return timeout
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgumentError(
            f"timeout must be a number of seconds or None, got {type(timeout).__name__}",
            argument="timeout")
    try:
        budget = check_timeout(timeout)
    except FlowDefinitionError as exc:  # negative or NaN
        raise InvalidArgumentValueError(str(exc), argument="timeout") from None
    return math.inf if budget is None else budget


def _warn_late_deadlines(plan: Any, budget: float) -> None:
    """A ``DeadlineWarning`` for each node whose deadline the run's budget makes moot."""
    for name, d, section in zip(plan.names, plan.deadline, plan.section, strict=True):
        if d is not None and d >= budget:
            where = f" (section {section!r})" if section is not None else ""
            warnings.warn(
                f"node {name!r}: its deadline of {d:g}s{where} is not before the run's budget "
                f"of {budget:g}s: the budget ends it first", DeadlineWarning, stacklevel=4)


def _prepare(nodes: Any, executor: Any, timeout: Any, context: Any,
             future: Future[FlowResult] | None, targets: Any = None, name: Any = None,
             t0: float | None = None, overrides: Any = None, priority: Any = "normal",
             stream: bool = False, aio_loop: Any = None) -> Run:
    """Validate everything, shed the run if its priority is shed at the current load, and
    build the run; nothing has been submitted when this raises.

    ``t0`` is when the caller called (its budget counts from then, this work included).
    ``stream``: a streamed run, owned by the coordinator threads (a Future of its own) unless
    it is nested and runs inline. ``aio_loop``: ``run_async``'s loop, where its async nodes
    run (None: the process's, see ``aio.event_loop``)."""
    if not isinstance(executor, Executor):
        raise InvalidArgumentError(
            "executor must be a concurrent.futures.Executor (ThreadPoolExecutor, "
            f"taskflow.ThreadPool, ProcessPoolExecutor, ...), got {type(executor).__name__}",
            argument="executor")
    refused = executors.refusal(executor)
    if refused is not None:
        raise RejectedExecutionError(f"{refused}; nothing was submitted: start the flow on an "
                                     "executor that is running")
    budget = _budget(timeout)
    prio = shedding.check_priority(priority)
    if context is None:
        ctx = TaskContext()
    elif isinstance(context, TaskContext):
        ctx = context
    else:
        raise InvalidArgumentError(
            f"context must be a taskflow.TaskContext or None, got {type(context).__name__}",
            argument="context")
    plan = cached_plan(nodes)  # validated when it was compiled
    if plan is None:
        plan = compile_plan(as_top_nodes(nodes))
    flow_name = _flow_name(name, plan.tops)
    if targets is not None:
        plan = select_targets(plan, targets)
    if overrides is not None:
        plan = override_plan(plan, overrides)
    caps = executors.capabilities(executor)
    outer = current.__dict__.get("run")
    # nested start from a worker of the same pool (wrappers compared by what they wrap), or a
    # start from one of the pool's own threads outside any run: run the nodes in this thread,
    # so a saturated (e.g. one-worker) pool cannot deadlock on us
    inline = ((future is None or stream) and not caps.remote
              and (executors.same_executor(outer.executor, executor) if outer is not None
                   else executors.runs_on(executor)))
    if plan.any_deadline and budget != math.inf:
        _warn_late_deadlines(plan, budget)
    if stream:
        future = None
        if not inline:  # its caller goes away between items: the coordinator owns the run
            future = Future()
            future.set_running_or_notify_cancel()
    if plan.any_policy or caps.remote:
        executors.check_executor(plan, caps.remote, type(executor).__name__)
    if plan.any_async:
        aio.check_plan(plan, caps.remote, type(executor).__name__, future is None or stream,
                       aio_loop)
    elif plan.batches is not None and (future is None or stream):
        aio.check_batches(plan)  # an async batch function's calls run on a loop too
    if not inline:  # an inline run submits nothing: there is nothing to shed
        shedding.admit(plan, executor, prio, flow_name)
    run = Run(plan, executor, budget, ctx, future, caps, inline, flow_name, t0)
    if prio != "normal":  # the class-level defaults otherwise
        run.priority = prio
    if aio_loop is not None:
        run.aio_loop = aio_loop
    bind_context(ctx, run, context is None)
    return run


class TaskScheduling:
    """Starts flows. Stateless: every call builds its own run."""

    @staticmethod
    def start(nodes: Any, *, executor: Executor, timeout: float | None = None,
              context: TaskContext | None = None, targets: Any = None,
              name: str | None = None,
              overrides: Mapping[str, Any] | None = None,
              priority: Priority = "normal") -> FlowResult:
        """Run the graph connected to ``nodes`` on ``executor`` and wait for it.

        Args:
            nodes: one node or an iterable of nodes; the whole connected graph is found by
                following edges both ways (sons *and* fathers: a node shared with another
                page brings that page's nodes in).
            executor: any ``concurrent.futures.Executor``; it is never shut down by taskflow.
            timeout: the run's budget in seconds (None or ``inf``: none). ``start`` returns by
                then, always: unfinished nodes become TIMEOUT, queued work is cancelled, and
                their ``on_fail`` hooks run in this thread before it returns.
            context: the run's TaskContext (a new one if None).
            targets: run only these nodes and their ancestors (a node, a node name, or an
                iterable of them; each must be in the graph). The result holds only those
                nodes. None: run the whole connected graph.
            name: the flow's name, in logs, traces and statistics (``ctx.flow_name``,
                ``result.flow_name``); default: the name of the first node in ``nodes``.
            overrides: for tests, node name -> a value (the node succeeds with it) or a
                callable ``fn(ctx, param)`` called instead of the node's task; the node's hooks
                and options still apply, the nodes passed in are not changed. None: none.
            priority: ``"critical"``, ``"normal"`` (default) or ``"sheddable"``. When the
                executor or a bulkhead of the run is saturated, ``sheddable`` runs are refused
                first, then ``normal`` ones (``taskflow.set_load_shedding`` sets the loads);
                ``critical`` runs are never shed.

        Returns:
            The FlowResult; it does not raise for node failures (see ``raise_for_failure``).

        Raises:
            InvalidArgumentError: executor, timeout, context, name, priority or overrides of
                the wrong type (a ``TypeError``); ``argument`` names it.
            InvalidArgumentValueError: a negative or NaN timeout, an empty name, an unknown
                priority, a target or an override naming no node of the graph ("did you mean
                ...?") (a ``ValueError`` and a ``FlowDefinitionError``); ``argument`` names it.
                Both are ``taskflow.ArgumentError``s.
            FlowDefinitionError: invalid graph or node options (cycle, duplicate name, ...).
            InvalidNodeError: nodes (or a target) that are not nodes (a ``TypeError``).
            RejectedExecutionError: the executor is already shut down: nothing was
                submitted. One shut down during the run fails the nodes it refuses.
            LoadShedError: the run's priority is shed at the current load: nothing was
                submitted (counted per priority in ``PoolMonitor`` and Prometheus).
        """
        t0 = clock.now()  # the budget counts from the call
        run = _prepare(nodes, executor, timeout, context, None, targets, name, t0, overrides,
                       priority)
        run.begin()
        return closing.wait(run)

    @staticmethod
    def stream(nodes: Any, *, executor: Executor, timeout: float | None = None,
               context: TaskContext | None = None, targets: Any = None,
               name: str | None = None,
               overrides: Mapping[str, Any] | None = None,
               priority: Priority = "normal") -> FlowStream:
        """Start the run and hand out its nodes as they settle: a
        [`FlowStream`][taskflow.FlowStream] of ``(name, WorkResult)``.

        Arguments as [`start`][taskflow.scheduling.TaskScheduling.start] (``targets``,
        ``name``, ``overrides`` and ``priority`` included), validated the same way: a bad
        argument or a shed run raises here, before anything runs. Each node comes out once,
        in the order nodes settle; the iteration ends with the run (all settled, or the budget
        spent: the unfinished nodes come out last, TIMEOUT). ``next()`` never waits past the
        run's deadline; between two items the run goes on without the caller (taskflow's
        coordinator and timer threads keep it). Once the stream is exhausted (or closed),
        ``.result`` is the FlowResult ``start`` would have returned; before, it raises
        ``StreamNotFinishedError``. ``close()``, leaving a ``with`` block or dropping the
        stream cancels the run (unfinished nodes CANCELLED).

        Hooks run as in ``start``, once each. Opened by a node running on the same executor
        (a nested stream), the nested run is inline: its nodes run on the thread that calls
        ``next()``, so a one-worker pool does not deadlock.

        Example (a page that flushes each part as it is ready)::

            with TaskScheduling.stream(PAGE, executor=pool, timeout=0.5) as parts:
                for name, wr in parts:
                    if wr.state is ResultState.SUCCESS:
                        yield render(name, wr.result)
            log_run(parts.result)
        """
        t0 = clock.now()
        run = _prepare(nodes, executor, timeout, context, None, targets, name, t0, overrides,
                       priority, stream=True)
        return streaming.open_stream(run)

    @staticmethod
    def submit(nodes: Any, *, executor: Executor, timeout: float | None = None,
               context: TaskContext | None = None, targets: Any = None,
               name: str | None = None,
               overrides: Mapping[str, Any] | None = None,
               priority: Priority = "normal") -> Future[FlowResult]:
        """Start the run and return a Future of its FlowResult without waiting.

        Arguments as [`start`][taskflow.scheduling.TaskScheduling.start] (``targets``, ``name``,
        ``overrides`` and ``priority`` included; a shed run raises ``LoadShedError`` here). The budget is enforced by taskflow's timer thread: at the
        deadline the future resolves (with unfinished nodes TIMEOUT) and their ``on_fail`` hooks
        run on that thread. Validation errors are raised
        here, before anything runs.
        """
        t0 = clock.now()
        future: Future[FlowResult] = Future()
        future.set_running_or_notify_cancel()
        run = _prepare(nodes, executor, timeout, context, future, targets, name, t0, overrides,
                   priority)
        run.begin()
        return future


async def run_async(nodes: Any, *, executor: Executor, timeout: float | None = None,
                    context: TaskContext | None = None, targets: Any = None,
                    name: str | None = None,
                    overrides: Mapping[str, Any] | None = None,
                    priority: Priority = "normal") -> FlowResult:
    """``await`` a run from asyncio (ASGI apps); built on ``TaskScheduling.submit``.

    Arguments as ``TaskScheduling.start`` (``targets``, ``name``, ``overrides`` and
    ``priority`` included).
    The event loop is never blocked: nodes run on ``executor`` and the budget is kept by
    taskflow's timer thread. Cancelling the awaiting task cancels the run (``ctx.cancel``):
    it is closed when the ``await`` raises, and the ``on_fail`` hooks it owes run on a
    coordinator thread. No hook ever runs on the event loop's thread.
    """
    # loaded by the event loop awaiting this, long before: ``import taskflow`` skips asyncio,
    # and the run's clock starts after this line
    import asyncio

    t0 = clock.now()
    future: Future[FlowResult] = Future()
    future.set_running_or_notify_cancel()
    # its async nodes run on the awaiting loop
    run = _prepare(nodes, executor, timeout, context, future, targets, name, t0, overrides,
                   priority, aio_loop=asyncio.get_running_loop())
    # a sync task never runs on this loop: an executor that may run a task in the submitting
    # thread (an inline one, CALLER_RUNS when full) gets its first loops from a coordinator;
    # so does a remote one, whose submitter runs each attempt's on_begin hook
    remote = run.caps.remote
    run.begin(remote or not executors.queues(executor, remote))
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        run.cancel("the awaiting asyncio task was cancelled")
        raise


def set_event_loop(loop: Any) -> None:
    """Run the async nodes (tasks written ``async def``) of ``start``/``stream``/``submit`` runs
    on ``loop``, an application's running event loop, instead of taskflow's own loop thread;
    ``None`` goes back to taskflow's. (``run_async`` always uses the loop that awaits it.)

    Raises:
        InvalidArgumentError: ``loop`` is not an ``asyncio`` event loop (nor None).
        InvalidArgumentValueError: ``loop`` is closed.
    """
    aio.set_event_loop(loop)


def set_loop_block_threshold(seconds: float) -> None:
    """Count a step of an async task (from one ``await`` to the next) that holds its event loop
    ``seconds`` or more as blocking it (default 0.1): in the node's ``blocked_steps``
    (``taskflow_loop_blocked_steps_total``) and in the one WARNING logged per node; a step still
    running after ``max(seconds, 1.0)`` is reported while it blocks. Process-wide, for the
    steps that end from now on (every loop: taskflow's, ``set_event_loop``'s, ``run_async``'s);
    ``math.inf`` counts none.

    Raises:
        InvalidArgumentError: ``seconds`` is not a number (``argument == "seconds"``).
        InvalidArgumentValueError: ``seconds`` is not > 0 (0, negative or NaN).
    """
    looplag.set_block_threshold(seconds)
