"""Executors that run tasks in other processes (process pools, loky, dask).

Only a node's task can travel: each attempt is its own submission of ``remote_call`` with the node,
its param, a snapshot of the context, the fathers' results and the time left. Its future's
done-callback only hands the outcome to the run's coordinator (``start``'s caller, or the shared
``taskflow-coordinator`` thread for ``submit``), which settles it like any outcome, so hooks and
bookkeeping stay in this process.

In the worker (``remote_call``, ``remote_work``) a result and an exception are round-tripped
before they are returned, with the pickler the executor's transport will use (its last argument,
``cloud``, set from ``Capabilities.cloudpickle``: stdlib ``pickle`` for ``ProcessPoolExecutor``,
cloudpickle for loky and dask): a value that pickles but does not unpickle, or an exception whose
``__init__`` takes two arguments, would otherwise break the pool for every later run, and a value
only cloudpickle can carry (a local function, a lambda) would pass the check and then fail in
the stdlib pool's own pickling with a bare error. A result that cannot travel fails its node with
a ``TypeError`` naming it; an exception that cannot travel is replaced by
``RemoteTaskError`` carrying its type name, message and traceback text.

The coordinator thread is process-wide, started on first use, and started afresh in a forked child.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextvars import Context
from functools import partial
from queue import Empty, SimpleQueue
from types import CoroutineType
from typing import Any, Protocol

from taskflow import _fork, clock
from taskflow.engine import executors, guards, retrying, sections, timer
from taskflow.engine.economy import Economy
from taskflow.engine.states import BACKOFF, NO_LOOP, QUEUED, RUNNING
from taskflow.errors import (
    NodeCancelledError,
    RemoteTaskError,
    ResultNotAvailableError,
    returned_coroutine,
)
from taskflow.logs import logger
from taskflow.model.context import TaskContext, attach_view
from taskflow.model.result import ResultState, WorkResult

__all__ = [
    "Coordinator",
    "RemoteAttempt",
    "RemoteHost",
    "RemoteRunView",
    "coordinator",
    "dispatch",
    "preflight_pickle",
    "remote_call",
    "remote_work",
]

_FIELDS = ("node", "param", "context", "fathers' results")


def preflight_pickle(pickler: Any, executor_name: str, name: str,
                     args: tuple[Any, ...]) -> BaseException | None:
    """A TypeError naming the node and the field of ``args`` that cannot travel, or None."""
    # the param first: it also rides inside the node, and the message should name it
    # args has more fields than _FIELDS (budget, flow id, ...): only these four can fail to pickle
    checks = sorted(zip(_FIELDS, args, strict=False), key=lambda fv: fv[0] != "param")
    for field, value in checks:
        try:
            pickler.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling raises many types
            err = TypeError(
                f"node {name!r}: its {field} cannot be pickled to run on {executor_name}: {exc}"
            )
            err.__cause__ = exc
            return err
    return None


class RemoteHost(guards.GuardedRun, Protocol):
    """What running nodes on a remote executor needs from the run (``run.Run`` satisfies it):
    what the gates need (a remote node's attempts pass them too), what retries need
    (``retrying.BudgetedRun``), and more."""

    caps: executors.Capabilities
    flow_id: str
    flow_name: str
    debug: bool
    remote_futs: dict[int, Future[Any]]
    node_observers: tuple[Any, ...]
    ready: deque[int]
    ranks: list[tuple[float, float]] | None

    @property
    def log(self) -> Any:
        """The run's logger."""

    @property
    def economy(self) -> Economy:
        """The run's loop economy (its fields under ``lock``)."""

    def node(self, i: int) -> Any:
        """The run's copy of node ``i``."""

    def begin_attempt(self, i: int, wr: WorkResult[Any], thread: str, node: Any) -> None:
        """Stamp an attempt of node ``i`` and run its ``on_begin``."""

    def start_fanout(self, i: int, token: int, node: Any, tname: str) -> int:
        """Start fan-out node ``i``'s fan-out; the loop ``token``'s next node."""

    def route(self, i: int, node: Any, value: Any) -> None:
        """A switch's value: record the sons it chose."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread."""


def dispatch(host: RemoteHost) -> None:
    """The owner's thread: submit every queued node as its own task."""
    for i in _take_queued(host):
        _submit(host, i)


def _take_queued(host: RemoteHost) -> list[int]:
    """The ready nodes still QUEUED, moved to RUNNING (each becomes its own submission), in
    rank order when the run has ranks (stable: FIFO among equals)."""
    with host.lock:
        batch = []
        code = host.code
        for i in host.ready:
            if code[i] == QUEUED:
                host.move(i, RUNNING)
                batch.append(i)
        host.economy.clear_ready()
    if host.ranks is not None:
        ranks = host.ranks
        batch.sort(key=lambda i: ranks[i], reverse=True)  # stable: FIFO among equals
    return batch


def _complete(host: RemoteHost, i: int, value: Any, error: BaseException | None) -> None:
    """A remote attempt of node ``i`` ended for good (or could not be submitted)."""
    host.complete(i, NO_LOOP, value, error)


def _retry(host: RemoteHost, i: int, delay: float) -> bool:
    """Queue another attempt of node ``i`` now (``delay`` 0: True, dispatch it) or after
    ``delay`` seconds; False if the node was settled meanwhile."""
    with host.lock:
        if host.code[i] != RUNNING or host.results[i].state is not ResultState.DEFAULT:
            return False
        if delay == 0.0:
            host.move(i, QUEUED)
            host.economy.enqueue(i)
            return True
        host.move(i, BACKOFF)
        timer.schedule(clock.now() + delay, retrying.requeue, host, i)
        return False


def _submit(host: RemoteHost, i: int) -> None:
    """Submit one attempt of node ``i``; a refusal is its outcome."""
    plan = host.plan
    tname = type(host.executor).__name__
    if plan.fanout[i]:
        host.start_fanout(i, NO_LOOP, host.node(i), tname)  # on the owner's thread
        return
    guarded = plan.any_policy and plan.policy[i] is not None
    if guarded:
        gate = guards.admit(host, i)
        if gate == guards.PARKED:
            return  # back through dispatch when what it waits for arrives
        if gate == guards.DONE:
            _complete(host, i, *guards.take_outcome(host, i))
            return
    wr = host.results[i]
    host.begin_attempt(i, wr, tname, host.node(i))
    now = clock.now()
    defn = plan.nodes[i]
    results = host.results
    fathers = {plan.names[f]: results[f].result for f in plan.fathers[i]
               if results[f].state in (ResultState.SUCCESS, ResultState.DEGRADED)}
    limit = host.deadline  # the task's own deadline: its node's timeout counts too
    t = plan.timeout[i]
    if t is not None:
        limit = min(limit, (wr.started_at or now) + t)
    if plan.any_deadline:
        limit = sections.limit(plan, i, host.t0, limit)
    args = (defn, defn.param, host.ctx.snapshot(), fathers, limit - now, host.flow_id,
            host.flow_name, host.caps.cloudpickle)
    error = preflight_pickle(executors.pickler(host.caps), tname, plan.names[i], args)
    fut: Any = None
    if error is None:
        try:
            fut = host.executor.submit(remote_call, *args)
            if not isinstance(fut, Future):
                raise TypeError(
                    f"{tname}.submit returned {type(fut).__name__}, not a Future")
        except BaseException as exc:  # noqa: BLE001 - refused/unpicklable: the node's outcome
            error = exc
    if error is not None:
        if guarded:
            guards.attempt_done(host, i, False)
        _complete(host, i, None, error)
        return
    with host.lock:
        host.remote_futs[i] = fut
    fut.add_done_callback(partial(_post_outcome, host, i))


def _post_outcome(host: RemoteHost, i: int, fut: Future[Any]) -> None:
    """Done-callback of a remote attempt (the executor's thread): hand it to the owner."""
    host.post(_process, host, i, fut)


def _process(host: RemoteHost, i: int, fut: Future[Any]) -> None:
    """The owner's thread: one remote attempt ended; retry it or complete the node."""
    try:
        _outcome(host, i, fut)
    except BaseException as exc:  # noqa: BLE001 - a bug here must end the node, not hang it
        host.log.opt(exception=True).error("taskflow failed processing node {}",
                                           host.plan.names[i])
        _complete(host, i, None, exc)


def _outcome(host: RemoteHost, i: int, fut: Future[Any]) -> None:
    with host.lock:
        if host.remote_futs.get(i) is fut:
            del host.remote_futs[i]
    value: Any = None
    if fut.cancelled():
        error: BaseException | None = NodeCancelledError(host.plan.names[i],
                                                         "the executor cancelled it")
    else:
        error = fut.exception()
        value = fut.result() if error is None else None
    if error is None and host.plan.routes[i]:
        try:
            host.route(i, host.plan.nodes[i], value)
        except BaseException as exc:  # noqa: BLE001
            error = exc
    if host.plan.any_policy and host.plan.policy[i] is not None:
        guards.attempt_done(host, i, error is None)  # no hedging here: always True
    if error is not None:
        wr = host.results[i]
        delay = retrying.retry_delay(host, i, wr, error)
        if delay >= 0.0:
            if host.node_observers:
                retrying.retrying(host, i, wr.attempts, error, delay)
            if _retry(host, i, delay):
                dispatch(host)
            return
    _complete(host, i, value, error)


class Coordinator:
    """The threads, ``taskflow-coordinator``, that do the work handed over by runs started with
    ``submit`` (their callers do not wait): remote outcomes, refused loops, hooks and closing after
    a timeout. One thread when idle; when every thread is busy (a slow hook of one run) and work
    is waiting, another starts, so one run's hook never holds up another run's deadline. Threads
    above one exit after ``KEEP_ALIVE`` seconds without work. Started afresh in a forked child.
    """

    KEEP_ALIVE = 1.0  # real time even under a fake clock: it only retires idle threads
    MAX_THREADS = 64

    def __init__(self) -> None:
        self.queue: SimpleQueue[tuple[Context, Callable[..., Any], tuple[Any, ...]]] = (
            SimpleQueue())
        self.lock = threading.Lock()  # guards threads, idle, waiting
        self.threads = 0
        self.idle = 0  # threads waiting for work
        self.waiting = 0  # items put and not taken yet
        self.seq = 0

    def put(self, cv: Context, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``fn(*args)`` on a coordinator thread, in a copy of ``cv``."""
        with self.lock:
            self.waiting += 1
            start = self.waiting > self.idle and self.threads < self.MAX_THREADS
            if start:
                self.threads += 1
                self.seq += 1
                name = "taskflow-coordinator"
        if clock.counting:
            clock.work_queued()
        self.queue.put((cv, fn, args))
        if start:
            threading.Thread(target=self.serve, args=(self.queue,), name=name,
                             daemon=True).start()

    def quiet(self) -> bool:
        """Whether nothing handed over waits for a coordinator thread or runs on one."""
        with self.lock:
            return self.waiting == 0 and self.idle == self.threads

    def serve(self, queue: SimpleQueue[tuple[Context, Callable[..., Any], tuple[Any, ...]]]
              ) -> None:
        """A coordinator thread's loop."""
        while True:
            with self.lock:
                self.idle += 1
            try:
                cv, fn, args = clock.real_get(queue, self.KEEP_ALIVE)
            except Empty:
                with self.lock:
                    self.idle -= 1
                    if self.threads > 1 and queue is self.queue:
                        self.threads -= 1
                        return
                continue
            with self.lock:
                self.idle -= 1
                self.waiting -= 1
            counted = clock.counting
            if counted:
                clock.work_started()
            try:
                cv.copy().run(fn, *args)
            except BaseException:  # noqa: BLE001 - one run's bug must not stop the others
                logger.opt(exception=True).error("taskflow coordinator callback {!r} failed", fn)
            finally:
                if counted:
                    clock.work_ended()
            del cv, fn, args

    def after_fork_in_child(self) -> None:
        """A forked child has no coordinator thread: start afresh with an empty queue."""
        self.queue = SimpleQueue()
        self.lock = threading.Lock()
        self.threads = 0
        self.idle = 0
        self.waiting = 0


coordinator = Coordinator()

_fork.register(coordinator, after_in_child="after_fork_in_child")


class RemoteRunView:
    """What a TaskContext sees of its run inside another process: a snapshot."""

    def __init__(self, flow_id: str, remaining: float, fathers: dict[str, Any], name: str,
                 flow_name: str = "") -> None:
        self.flow_id = flow_id
        self.flow_name = flow_name
        self.deadline = clock.now() + remaining
        self.fathers = fathers
        self.name = name
        self.cancel_reason: str | None = None
        self.finished = False

    def cancelled_for_caller(self) -> bool:
        return clock.now() >= self.deadline

    def caller_name(self) -> str:
        return self.name

    def value_of(self, name: str) -> Any:
        try:
            return self.fathers[name]
        except KeyError:
            raise ResultNotAvailableError(
                name, "not available in another process (only the fathers' results travel)"
            ) from None

    def cancel(self, reason: str | None) -> None:
        logger.warning("ctx.cancel() in another process has no effect (flow {})", self.flow_id)

    def asking(self) -> RemoteAttempt:
        """The attempt this snapshot was sent for."""
        return RemoteAttempt(self.deadline)


class RemoteAttempt:
    """An attempt in another process: its deadline is the run's, as the task was sent (the
    caller's process enforces the node's own timeout); it cannot be told it was abandoned, and
    its clamps are not reported."""

    __slots__ = ("_deadline",)

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline

    def deadline(self) -> float:
        return self._deadline

    def on_cancel(self, fn: Callable[[], object]) -> None:
        """The caller's process cannot reach this attempt: nothing is registered."""

    def note_clamp(self, seconds: float) -> None:
        """Clamps in another process are not reported."""


def _round_trip(value: Any, cloud: bool) -> None:
    """Raise if ``value`` does not survive the way back to the caller's process: pickle, or,
    with ``cloud`` (the executor pickles with cloudpickle), cloudpickle where pickle fails."""
    import pickle  # in the executor's process, which got this call by pickle: loaded there

    try:
        pickle.loads(pickle.dumps(value))
        return
    except Exception as exc:  # maybe only cloudpickle can carry it (loky, dask)
        if not cloud:  # the executor's transport is pickle: its error stands
            raise
        first = exc
    try:
        import cloudpickle  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - loky and dask ship it
        raise first from None
    pickle.loads(cloudpickle.dumps(value))


def _portable(exc: BaseException, cloud: bool) -> BaseException:
    """``exc`` if it can travel back, else a RemoteTaskError standing in for it."""
    with contextlib.suppress(Exception):  # any failure to travel: a stand-in
        _round_trip(exc, cloud)
        return exc
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises
        message = "<unprintable>"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kind = type(exc)
    return RemoteTaskError(f"{kind.__module__}.{kind.__qualname__}", message, tb)


def _portable_value(name: str, value: Any, cloud: bool) -> Any:
    try:
        _round_trip(value, cloud)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            f"node {name!r}: its result ({type(value).__name__}) cannot be pickled to return "
            f"it: {exc!r}"
        ) from None
    return value


# a task (or a fan-out's work) that is a plain def returning a coroutine, in the worker
_NO_LOOP_HERE = ("an executor in other processes does not run coroutines: make it a plain def "
                 "that makes the call itself (asyncio.run(...) for an async client), or start "
                 "the flow on a thread pool with the async function itself as the task")


def _call(name: str, fn: Callable[[TaskContext, Any], Any], ctx: TaskContext, arg: Any,
          cloud: bool, what: str = "its task") -> Any:
    try:
        value = fn(ctx, arg)
        if type(value) is CoroutineType:  # nothing awaits it here: closed, the node fails
            raise returned_coroutine(f"node {name!r}", value, what, _NO_LOOP_HERE)
    except Exception as exc:
        portable = _portable(exc, cloud)
        if portable is exc:
            raise
        raise portable from None
    return _portable_value(name, value, cloud)


def remote_call(node: Any, param: Any, entries: dict[str, Any], fathers: dict[str, Any],
                remaining: float, flow_id: str, flow_name: str = "", cloud: bool = False) -> Any:
    """Runs in the executor's process: the task on a snapshot of the context. ``cloud``: the
    executor sends the result back with cloudpickle (else pickle)."""
    ctx = TaskContext(entries)
    view = RemoteRunView(flow_id, remaining, fathers, node.name, flow_name)
    attach_view(ctx, view)
    return _call(node.name, node.task, ctx, param, cloud)


def remote_work(blob: bytes, item: Any, entries: dict[str, Any], fathers: dict[str, Any],
                remaining: float, flow_id: str, flow_name: str = "", cloud: bool = False) -> Any:
    """Runs in the executor's process: one fan-out item (the node arrives pickled once, as
    ``blob``, without its param); ``cloud`` as for ``remote_call``."""
    import pickle  # loaded: this call came by pickle

    node = pickle.loads(blob)
    ctx = TaskContext(entries)
    view = RemoteRunView(flow_id, remaining, fathers, node.name, flow_name)
    attach_view(ctx, view)
    return _call(node.name, node.work, ctx, item, cloud, "its work()")
