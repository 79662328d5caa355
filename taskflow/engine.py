"""The per-run scheduler: readiness, joins, deadlines, cancellation.

How a run works
===============
A run (:class:`_Run`) executes one compiled :class:`~taskflow.graph.Plan` (flat tuples indexed by
node number, shared read-only by every run of the graph). Its own state is flat lists indexed the
same way: ``code`` (where each node is in its lifecycle), join counters (``left``, ``nsucc``,
``nskip``), ``results`` (one :class:`WorkResult` per node) and per-run node copies made on demand.

Nodes whose join fired are appended to the run's ``ready`` deque. The deque is drained by at most
``max_loops`` *loops*: callables submitted to the user's executor. A loop pops a node, runs its
attempts and hooks, then (under the run lock, in one critical section) records the outcome,
updates the sons' join counters, appends the sons that became ready, and pops its next node. So
a chain runs in one worker with no executor round trip, and a fan-out spreads over up to
``max_loops`` workers (the executor's worker count). A loop that finds the deque empty exits. No
loop ever waits for another node, so any DAG finishes on a one-worker pool, and long chains run
in a ``while`` loop, not by recursion.

Failure of a node settles its waiting sons at once (fail fast, cause chained, the father's kind
of failure); skipped fathers (unchosen switch branches) are ignored by joins; a son whose fathers
all skipped is skipped. Everything that settles without running is handled in the same critical
section with an explicit work list.

Time: the run has one deadline (``t0 + timeout``). ``start``'s caller waits on ``done`` until the
deadline; at the deadline it closes the run: every unsettled node becomes TIMEOUT, queued loop
futures are cancelled, running ones are reported abandoned to the executor (``mark_abandoned``),
the timed-out nodes' ``on_fail`` hooks run in the caller, and it returns. For ``submit`` the
process-wide timer thread closes the run instead. Per-node timeouts and retry back-offs are timer
entries too. The one bound the budget cannot give: ``start``'s caller submits the first loops
itself, so an executor whose ``submit`` blocks (a blocking bounded queue) or runs the task in the
caller (``CALLER_RUNS``) delays ``start`` by that long; every later submission is made by workers.

Executors that run tasks in other processes (process pools, loky, dask) cannot run loops: each
attempt is its own submission of the node's task alone (with a picklable snapshot of the context)
and its done-callback only enqueues the outcome; ``start``'s caller (or, for ``submit``, the shared
``taskflow-coordinator`` thread) takes outcomes off the queue and settles them as above, so hooks
and bookkeeping stay in this process and never run on the executor's callback thread.

Invariants
==========
* ``lock`` (one per run) guards ``code``, the join counters, ``ready``, ``loops``, ``pending``,
  ``closed``, ``finished``, the loop maps, and every write to a ``WorkResult``. User code (tasks,
  hooks), ``executor.submit`` and future callbacks are never called while holding it.
* A ``WorkResult``'s ``result``/``exception`` is written before its ``state``; ``state`` leaves
  ``DEFAULT`` exactly once. A late result (the node timed out, was cancelled, or the run closed)
  is dropped, so it never overwrites anything.
* ``pending`` counts nodes not yet settled (terminal *and* their hook returned and sons updated).
  The run finishes when it reaches 0, or when it is closed (deadline or ``ctx.cancel``), and
  ``done`` is set exactly once. After ``closed`` no hook starts, except those of the node that
  called ``ctx.cancel`` (the run waits for it), and no new node is dispatched. Hooks are
  admitted under the lock (``hooks_running``), and closing waits up to ``HOOK_GRACE`` for the
  admitted ones, so none begins after ``start`` has returned.
* A node's hook runs before its sons are made ready (happens-before): on the thread that ran it,
  or, for a node settled without running, on the thread that settled it, which updates the
  node's sons only after that ``on_fail`` returned.
* ``loops`` counts loops submitted and not exited; a loop stuck in a timed-out node is abandoned
  (not counted) and exits when its task returns.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from functools import partial
from queue import Empty, SimpleQueue
from typing import Any, Union

from loguru import logger

from taskflow import joins, timer
from taskflow.context import TaskContext, TaskSupport, current
from taskflow.errors import (
    FlowDefinitionError,
    NodeCancelledError,
    NodeTimeoutError,
    RejectedExecutionError,
    ResultNotAvailableError,
    TaskflowError,
    UpstreamFailedError,
)
from taskflow.graph import Plan
from taskflow.node import SchedulingNode
from taskflow.result import FlowResult, ResultState, WorkResult

__all__ = ["_Run"]

# node lifecycle codes within a run
WAITING, QUEUED, RUNNING, BACKOFF, TERMINAL, SETTLED = 0, 1, 2, 3, 4, 5
# how long closing a run waits for hooks already admitted (they are meant to be quick)
HOOK_GRACE = 0.05
REMOTE = -2  # the "loop token" of outcomes processed by a remote run's coordinator

_SUCCESS = ResultState.SUCCESS
_EXCEPTION = ResultState.EXCEPTION
_TIMEOUT = ResultState.TIMEOUT
_CANCELLED = ResultState.CANCELLED
_SKIPPED = ResultState.SKIPPED
_DEFAULT = ResultState.DEFAULT
_ALL, _ANY, _QUORUM = joins.ALL, joins.ANY, joins.QUORUM
_FAILED_STATES = (ResultState.EXCEPTION, ResultState.TIMEOUT, ResultState.CANCELLED)

_monotonic = time.monotonic
_current_thread = threading.current_thread
_copy_context = contextvars.copy_context


def _debug_enabled() -> bool:
    """Whether a DEBUG line from taskflow would reach any loguru sink (checked once per run)."""
    try:
        core = logger._core  # type: ignore[attr-defined]
        if not core.handlers or core.min_level > 10:
            return False
        name = "taskflow.engine."
        for prefix, status in core.activation_list:
            if name[: len(prefix)] == prefix:
                return bool(status)
        return True
    except Exception:  # noqa: BLE001 - loguru internals changed: log, and pay for it
        return True


def _note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` once (Python 3.10: the same ``__notes__`` list by hand)."""
    notes = getattr(exc, "__notes__", None)
    if notes is not None and note in notes:
        return
    try:
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:  # pragma: no cover - Python 3.10
            exc.__notes__ = [*(notes or ()), note]
    except Exception:  # noqa: BLE001 - an exception type that refuses attributes keeps its text
        pass


def parallelism(executor: Executor) -> int:
    """How many loops a run may keep on ``executor`` (its worker count when it says)."""
    n = getattr(executor, "max_size", None) or getattr(executor, "_max_workers", None)
    if isinstance(n, int) and n > 0:
        return n
    return min(32, (os.cpu_count() or 1) + 4)


class _Run:
    """One execution of a plan. Created and started by ``TaskScheduling``."""

    def __init__(self, plan: Plan, executor: Executor, budget: float, ctx: TaskContext,
                 future: Future[FlowResult] | None) -> None:
        n = len(plan.nodes)
        self.plan = plan
        self.executor = executor
        self.budget = budget
        self.ctx = ctx
        self.flow_id = os.urandom(5).hex()
        self.lock = threading.Lock()
        self.code = [WAITING] * n
        self.left = list(plan.nfathers)
        self.nsucc = [0] * n
        self.nskip = [0] * n
        self.results: list[WorkResult[Any]] = [WorkResult() for _ in range(n)]
        self.nodes: list[SchedulingNode[Any, Any] | None] = [None] * n
        self.ready: deque[int] = deque()
        self.loops = 0
        self.max_loops = parallelism(executor)
        self.loop_futs: dict[int, Future[Any]] = {}
        self.loop_node: dict[int, int] = {}  # loop token -> node it runs
        self.abandoned: set[int] = set()  # tokens of loops stuck in a timed-out node
        self.tokens = 0
        self.unstarted: set[int] = set()  # tokens of loops submitted but not started
        self.pending = n
        self.closed = False
        self.finished = False
        self.keep = -1  # node that called ctx.cancel: the run waits for it
        self.cancel_reason: str | None = None
        self.chosen: dict[int, frozenset[int]] = {}
        self.fans: dict[int, Any] = {}  # node -> its _FanOut while it fans out
        self.node_timers: dict[int, timer.Timer] = {}
        self.run_timer: timer.Timer | None = None
        self.done = threading.Event()
        self.hooks_running = 0  # hooks admitted and not returned (guarded by lock)
        self.hooks_idle = threading.Condition(self.lock)
        self.future = future
        self.inline = False  # the caller drains the deque itself (nested start on the pool)
        # executors that run tasks in other processes: one submission per attempt, outcomes
        # come back through ``inbox`` to a coordinator (start's caller, or the shared thread)
        self.remote = is_remote(executor)
        self.remote_futs: dict[int, Future[Any]] = {}
        self.inbox: SimpleQueue[tuple[Callable[[Any, Any], None] | None, Any, Any]] | None = None
        if self.remote:
            self.inbox = SimpleQueue()
            self.max_loops = 1 << 30
        self.wakeup: threading.Event | None = None
        self.cv = _copy_context()
        self.debug = _debug_enabled()
        self.t0 = _monotonic()
        self.deadline = self.t0 + budget
        self.flow_result: FlowResult | None = None
        self._log: Any = None

    # -- small helpers ---------------------------------------------------------------------------

    @property
    def log(self) -> Any:
        if self._log is None:
            self._log = logger.bind(flow_id=self.flow_id)
        return self._log

    def node(self, i: int) -> SchedulingNode[Any, Any]:
        """This run's copy of node ``i`` (made on first use)."""
        n = self.nodes[i]
        if n is None:
            with self.lock:
                n = self.nodes[i]
                if n is None:
                    n = self.nodes[i] = self._clone(i)
        return n

    # what TaskContext asks of its run (see RunView)
    def cancelled_for_caller(self) -> bool:
        if self.closed:
            return True
        cur = current
        if getattr(cur, "run", None) is self:
            return self.results[cur.idx].state is not _DEFAULT
        return False

    def caller_name(self) -> str:
        cur = current
        return self.plan.names[cur.idx] if getattr(cur, "run", None) is self else "?"

    def value_of(self, name: str) -> Any:
        try:
            wr = self.results[self.plan.index[name]]
        except KeyError:
            raise KeyError(f"no node named {name!r} in flow {self.flow_id}") from None
        if wr.state is not _SUCCESS:
            raise ResultNotAvailableError(name, wr.state.name)
        return wr.result

    def _clone(self, i: int) -> SchedulingNode[Any, Any]:
        defn = self.plan.nodes[i]
        obj = object.__new__(type(defn))
        d = obj.__dict__
        d.update(defn.__dict__)
        d["_run"] = self
        d["_idx"] = i
        d["_plans"] = ()
        return obj

    # -- starting --------------------------------------------------------------------------------

    def begin(self) -> None:
        """Queue the roots and dispatch; settle everything at once if the budget is spent."""
        plan = self.plan
        if not plan.nodes:
            self._finish()
            return
        if self.budget <= 0.0:
            self.expire()
            return
        now = self.t0
        results = self.results
        with self.lock:
            for i in plan.roots:
                self.code[i] = QUEUED
                results[i].queued_at = now
                self.ready.append(i)
            spawn = self._spawn_count()
        if self.future is not None and not math.isinf(self.budget):
            self.run_timer = timer.schedule(self.deadline, self.cv.copy().run, self.expire)
        self._spawn(spawn)

    def _spawn_count(self) -> int:
        """Under lock: how many new loops to submit for the ready nodes (and count them)."""
        k = min(len(self.ready), self.max_loops - self.loops)
        if k > 0:
            self.loops += k
            return k
        return 0

    def _spawn(self, k: int) -> None:
        """Submit ``k`` loops (outside the lock). A refused submission with no loop left to
        drain the queue fails the queued nodes with the executor's error."""
        if self.remote:
            if k:
                with self.lock:
                    self.loops -= k
                self._dispatch_remote()
            return
        if self.inline:
            if k:
                with self.lock:
                    self.loops -= k
                assert self.wakeup is not None
                self.wakeup.set()
            return
        for _ in range(k):
            with self.lock:
                self.tokens += 1
                token = self.tokens
                self.unstarted.add(token)
            try:
                fut = self.executor.submit(self._loop, token)
            except BaseException as exc:  # noqa: BLE001 - shut down, rejected, broken: a node outcome
                with self.lock:
                    self.unstarted.discard(token)
                self._refused(exc)
                continue
            with self.lock:
                self.loop_futs[token] = fut
            fut.add_done_callback(partial(self._loop_done, token))

    def _loop_done(self, token: int, fut: Future[Any]) -> None:
        """Done-callback of a loop future (any thread; kept tiny): a loop that never started
        (cancelled by ``shutdown(cancel_futures=True)``, dropped by a DISCARD policy, failed to
        pickle) is a refused submission."""
        with self.lock:
            if token not in self.unstarted:
                return
            self.unstarted.discard(token)
        exc = fut.exception() if not fut.cancelled() else None
        if exc is None:
            exc = RejectedExecutionError(f"the executor dropped taskflow work of flow {self.flow_id}")
        self._refused(exc)

    def _refused(self, exc: BaseException) -> None:
        hooks: list[int] = []
        with self.lock:
            self.loops -= 1
            if self.loops > 0 or self.closed:
                return
            now = _monotonic()
            victims = [i for i in self.ready if self.code[i] == QUEUED]
            self.ready.clear()
            for i in victims:
                self._fail(i, exc, _EXCEPTION, now)
                hooks.append(i)
                if not self.plan.has_fail[i]:
                    self._settle_sons(i, hooks, now)
        if self.debug:
            self.log.debug("executor refused work: {!r}", exc)
        if self._after_settle(hooks, 0):
            self._finish()

    # -- the loop (executor worker threads) -------------------------------------------------------

    def _loop(self, token: int) -> None:
        with self.lock:
            self.unstarted.discard(token)
            i = self._next(token)
        if i < 0:
            return
        cv = self.cv
        cur = current
        prev = cur.__dict__.get("run"), cur.__dict__.get("idx")
        cur.run = self
        tname = _current_thread().name
        try:
            while i >= 0:
                i = cv.copy().run(self._execute, i, token, tname)
        finally:
            cur.run, cur.idx = prev

    def _next(self, token: int) -> int:
        """Under lock: pop the next runnable node for loop ``token``, or exit the loop (-1)."""
        code = self.code
        ready = self.ready
        while ready:
            i = ready.popleft()
            if code[i] == QUEUED:
                code[i] = RUNNING
                self.loop_node[token] = i
                return i
        self.loops -= 1
        self.loop_node.pop(token, None)
        return -1

    def _execute(self, i: int, token: int, tname: str) -> int:
        """Run node ``i`` to its outcome, settle it, and return the loop's next node (or -1).

        Called in a fresh copy of the caller's contextvars, with ``current.run`` set to this run
        by the loop."""
        plan = self.plan
        wr = self.results[i]
        node: SchedulingNode[Any, Any] | None
        if plan.stateless[i]:
            node = plan.nodes[i]  # FunctionNode: its task reads nothing but fn, param
        else:
            node = self.nodes[i]
            if node is None:
                node = self.nodes[i] = self._clone(i)
        current.idx = i
        if plan.fanout[i]:
            return self._start_fanout(i, token, node)
        while True:
            if wr.state is not _DEFAULT:
                # settled while queued or between attempts (a join cancelled it, the run
                # closed): never start an attempt for it
                return self._late(i, token, None, None)
            self._begin_attempt(i, wr, tname, node)
            try:
                value = node.task(self.ctx, node.param)
                error: BaseException | None = None
                if plan.routes[i]:
                    self._route(i, node, value)
            except BaseException as exc:  # noqa: BLE001 - a task's failure is its node's outcome
                error = exc
                value = None
            if error is not None:
                delay = self._retry_delay(i, wr, error)
                if delay == 0.0:
                    continue
                if delay > 0.0:
                    with self.lock:
                        if self.code[i] == RUNNING and wr.state is _DEFAULT:
                            self.code[i] = BACKOFF
                            timer.schedule(_monotonic() + delay, self.cv.copy().run, self._requeue, i)
                        if token in self.abandoned:
                            return -1
                        return self._next(token)
            return self._complete(i, token, value, error)

    def _begin_attempt(self, i: int, wr: WorkResult[Any], thread: str,
                       node: SchedulingNode[Any, Any]) -> None:
        """Stamp an attempt of node ``i`` (arming its own timeout at the first) and run
        ``on_begin``."""
        if wr.started_at is None:
            now = _monotonic()
            wr.started_at = now
            if self.plan.timeout[i] is not None:
                self._arm_node_timeout(i, now)
        wr.attempts += 1
        wr.thread = thread
        if self.debug:
            name = self.plan.names[i]
            self.log.bind(node=name).debug("node {} attempt {} started", name, wr.attempts)
        if self.plan.has_begin[i] and not self.closed:
            self._hook(node.on_begin, i, wr.attempts)

    def _route(self, i: int, node: SchedulingNode[Any, Any], value: Any) -> None:
        """A switch returned ``value``: record which of its sons it chose (or raise)."""
        chosen = node._choose(value)  # type: ignore[attr-defined]
        if chosen is not None:
            self.chosen[i] = frozenset(plan_pos(self.plan, c) for c in chosen)

    def _start_fanout(self, i: int, token: int, node: SchedulingNode[Any, Any]) -> int:
        """Start node ``i``'s fan-out (taskflow.fanout) and give the loop its next node."""
        from taskflow.fanout import _FanOut

        self._begin_attempt(i, self.results[i], _current_thread().name, node)
        fan = _FanOut(self, i, node)  # type: ignore[arg-type]
        with self.lock:
            self.fans[i] = fan
        fan.start()
        if token == REMOTE:
            return -1
        with self.lock:
            if token in self.abandoned:
                return -1
            return self._next(token)

    def _retry_delay(self, i: int, wr: WorkResult[Any], error: BaseException) -> float:
        """0.0: retry now; > 0: retry after that back-off; < 0: no retry."""
        plan = self.plan
        if wr.attempts > plan.retries[i] or not isinstance(error, Exception) or self.closed:
            return -1.0
        if wr.state is not _DEFAULT:
            return -1.0
        delay = plan.backoff[i] * (2.0 ** (wr.attempts - 1))
        limit = self.deadline
        t = plan.timeout[i]
        if t is not None and wr.started_at is not None:
            limit = min(limit, wr.started_at + t)
        if _monotonic() + delay >= limit:
            return -1.0
        if self.debug:
            self.log.bind(node=plan.names[i]).debug("node {} failed attempt {}, retrying in {:.3f}s: {!r}", plan.names[i], wr.attempts, delay, error)
        return delay

    def _requeue(self, i: int) -> None:
        """Timer thread: a back-off ended; queue the next attempt."""
        with self.lock:
            if self.code[i] != BACKOFF or self.closed:
                return
            self.code[i] = QUEUED
            self.ready.append(i)
            spawn = self._spawn_count()
        self._spawn(spawn)

    def _complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Record node ``i``'s outcome, run its hook, settle its sons; return the next node."""
        plan = self.plan
        wr = self.results[i]
        now = _monotonic()
        late = False
        hooks: list[int] = []
        has_hook = plan.has_success[i] if error is None else plan.has_fail[i]
        with self.lock:
            if plan.fanout[i]:
                self.fans.pop(i, None)
            timer_entry = self.node_timers.pop(i, None) if plan.any_timeout else None
            if self.code[i] != RUNNING or wr.state is not _DEFAULT:
                late = True
            else:
                if error is None:
                    wr.result = value
                    wr.finished_at = now
                    wr.state = _SUCCESS
                    self.code[i] = TERMINAL
                else:
                    wr.result = value  # a fan-out's partial FanInResult; None otherwise
                    self._fail(i, error, _TIMEOUT if isinstance(error, NodeTimeoutError) else _EXCEPTION, now)
                if not has_hook:
                    self._settle_sons(i, hooks, now)
                    nxt = self._next(token) if token >= -1 and token not in self.abandoned else -1
                    spawn = self._spawn_count()
                    fin = self._settled(i)
        if late:
            return self._late(i, token, value, error)
        if timer_entry is not None:
            timer_entry.cancel()
        if self.debug or error is not None:
            self._log_outcome(i)
        if has_hook:
            if error is None:
                self._hook(self.node(i).on_success, i, wr.attempts)
            else:
                self._hook(self.node(i).on_fail, i, wr.attempts)
            with self.lock:
                self._settle_sons(i, hooks, now)
                nxt = self._next(token) if token >= -1 and token not in self.abandoned else -1
                spawn = self._spawn_count()
                fin = self._settled(i)
        if hooks:
            fin = self._after_settle(hooks, spawn) or fin
        elif spawn:
            self._spawn(spawn)
        if fin:
            self._finish()
        return nxt

    def _late(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """The node was settled without us (timeout, cancel, closed run): drop the outcome."""
        name = self.plan.names[i]
        if error is not None and not isinstance(error, NodeCancelledError):
            self.log.bind(node=name).warning(
                "late exception from abandoned node {} dropped: {!r}", name, error
            )
        elif self.debug:
            self.log.bind(node=name).debug("late result from node {} dropped", name)
        if token == REMOTE:
            return -1
        with self.lock:
            if token in self.abandoned:
                self.abandoned.discard(token)
                self.loop_node.pop(token, None)
                return -1
            if self.closed:
                self.loops -= 1
                self.loop_node.pop(token, None)
                return -1
            return self._next(token)

    # -- settling (all under lock) ----------------------------------------------------------------

    def _fail(self, i: int, exc: BaseException, state: ResultState, now: float) -> None:
        wr = self.results[i]
        if state is _EXCEPTION and not isinstance(exc, TaskflowError):
            _note(exc, f"taskflow: raised by node {self.plan.names[i]!r} of flow {self.flow_id}")
        wr.exception = exc
        wr.finished_at = now
        wr.state = state
        self.code[i] = TERMINAL

    def _settled(self, i: int) -> bool:
        """Under lock: node ``i``'s hook returned and its sons were updated. True: finish now."""
        self.code[i] = SETTLED
        if self.closed:
            return i == self.keep and not self.finished
        self.pending -= 1
        return self.pending == 0

    def _settle_sons(self, i: int, hooks: list[int], now: float) -> None:
        """Under lock: node ``i`` is terminal; update its sons' joins, transitively.

        Sons that fire go to ``ready``; sons that fail fast or are skipped become terminal here
        and are appended to ``hooks`` (their on_fail hook and settlement happen after the lock).
        """
        plan = self.plan
        code, left, nsucc = self.code, self.left, self.nsucc
        results = self.results
        kinds = plan.join_kind
        if results[i].state is _SUCCESS and not plan.routes[i]:
            # fast path: a success only fires sons or leaves them waiting
            for s in plan.sons[i]:
                if code[s] != WAITING:
                    continue
                left[s] -= 1
                nsucc[s] += 1
                kind = kinds[s]
                if kind == _ANY or (kind == _QUORUM and nsucc[s] >= plan.join_k[s]):
                    code[s] = QUEUED
                    results[s].queued_at = now
                    self.ready.append(s)
                    if left[s]:
                        self._cancel_unneeded(s, hooks, now)
                elif not left[s] and kind != _QUORUM:
                    code[s] = QUEUED
                    results[s].queued_at = now
                    self.ready.append(s)
            return
        nskip = self.nskip
        sons_of = plan.sons
        work = [i]
        while work:
            f = work.pop()
            st = results[f].state
            route = self.chosen.get(f) if st is _SUCCESS and plan.routes[f] else None
            for s in sons_of[f]:
                if code[s] != WAITING:
                    continue
                left[s] -= 1
                kind = kinds[s]
                if st is _SUCCESS and (route is None or s in route):
                    nsucc[s] += 1
                    if kind == _ALL:
                        if left[s]:
                            continue
                        fire = True
                    elif kind == _ANY:
                        fire = True
                    elif kind == _QUORUM:
                        if nsucc[s] >= plan.join_k[s]:
                            fire = True
                        elif left[s]:
                            continue
                        else:
                            fire = False  # cannot happen: k <= fathers; kept for safety
                    else:
                        if left[s]:
                            continue
                        fire = True
                    if fire:
                        code[s] = QUEUED
                        results[s].queued_at = now
                        self.ready.append(s)
                        if left[s] and kind != _ALL:
                            self._cancel_unneeded(s, hooks, now)
                        continue
                elif st is _SUCCESS:
                    # a case the switch did not choose: skipped, whatever else feeds it
                    results[s].state = _SKIPPED
                    results[s].finished_at = now
                    code[s] = TERMINAL
                    hooks.append(s)
                    work.append(s)
                    continue
                elif st is _SKIPPED:
                    nskip[s] += 1
                    failed_father = -1
                else:
                    failed_father = f
                    if kind == _ALL and f in plan.optional[s]:
                        failed_father = -2  # tolerated
                # a father failed or was skipped: decide whether s can still fire
                nf = plan.nfathers[s]
                if nskip[s] == nf:
                    results[s].state = _SKIPPED
                    results[s].finished_at = now
                    code[s] = TERMINAL
                    hooks.append(s)
                    work.append(s)
                    continue
                cause = -1
                if kind == _ALL:
                    if failed_father >= 0:
                        cause = f
                    elif left[s] == 0:
                        code[s] = QUEUED
                        results[s].queued_at = now
                        self.ready.append(s)
                        continue
                elif kind == _ANY:
                    if left[s] == 0 and nsucc[s] == 0:
                        cause = f
                elif kind == _QUORUM:
                    if nsucc[s] + left[s] < plan.join_k[s]:
                        cause = f
                elif left[s] == 0:  # BEST_EFFORT
                    code[s] = QUEUED
                    results[s].queued_at = now
                    self.ready.append(s)
                    continue
                if cause >= 0:
                    self._fail_fast(s, self._failed_father(s, cause), now)
                    hooks.append(s)
                    if not plan.has_fail[s]:
                        work.append(s)  # else its sons are settled after its on_fail hook

    def _failed_father(self, s: int, f: int) -> int:
        """Under lock: the father to blame for ``s`` failing: ``f`` if it failed, else the
        first father of ``s`` that did (``f`` may be a skipped father that ended the wait)."""
        results = self.results
        if results[f].state in _FAILED_STATES:
            return f
        for x in self.plan.fathers[s]:
            if results[x].state in _FAILED_STATES:
                return x
        return f

    def _fail_fast(self, s: int, f: int, now: float) -> None:
        """Under lock: son ``s`` fails without running because of father ``f``."""
        plan = self.plan
        fwr = self.results[f]
        err = UpstreamFailedError(plan.names[s], plan.names[f])
        err.__cause__ = fwr.exception
        st = fwr.state
        kind = st if st in (_TIMEOUT, _CANCELLED) else _EXCEPTION
        self._fail(s, err, kind, now)

    def _cancel_unneeded(self, s: int, hooks: list[int], now: float) -> None:
        """Under lock: ``s`` fired early; cancel its unfinished fathers nobody else waits for."""
        plan = self.plan
        code = self.code
        work = [s]
        while work:
            x = work.pop()
            for p in plan.fathers[x]:
                if code[p] >= TERMINAL:
                    continue
                if any(code[q] == WAITING for q in plan.sons[p]):
                    continue
                fan = self.fans.pop(p, None)
                if fan is not None:
                    self.results[p].result, running = fan.abort()  # stop pulling; keep what it had
                    if running:  # reported outside the run lock, on the timer thread
                        timer.schedule(_monotonic(), self._mark_abandoned, running)
                self._fail(p, NodeCancelledError(plan.names[p], f"join of {plan.names[s]!r} no longer needs it"), _CANCELLED, now)
                hooks.append(p)
                t = self.node_timers.pop(p, None)
                if t is not None:
                    t.cancel()
                work.append(p)  # its own fathers may be unneeded now

    def _after_settle(self, hooks: list[int], spawn: int) -> bool:
        """Outside the lock: run on_fail hooks of nodes settled without running, settle them,
        spawn loops. Returns True if the run is finished."""
        plan = self.plan
        fin = False
        k = 0
        while k < len(hooks):  # grows: settling a node after its hook may settle more
            s = hooks[k]
            k += 1
            deferred = plan.has_fail[s] and self.results[s].state is not _SKIPPED
            if self.debug or self.results[s].state is not _SKIPPED:
                self._log_outcome(s)
            if deferred and not self.closed:
                self._hook(self.node(s).on_fail, s, self.results[s].attempts)
            with self.lock:
                if deferred:  # its hook has returned: now its sons may move
                    self._settle_sons(s, hooks, _monotonic())
                if self.code[s] == TERMINAL:
                    fin = self._settled(s) or fin
                spawn += self._spawn_count()
        if spawn:
            self._spawn(spawn)
        return fin

    # -- hooks and logs ---------------------------------------------------------------------------

    def _hook(self, fn: Callable[[TaskSupport], None], i: int, attempt: int) -> None:
        """Call a hook; a raising hook is logged and changes nothing."""
        with self.lock:
            # admission and the closing check are one step, so no hook starts after a close
            # has waited for the admitted ones (see _close)
            if self.closed and not (i == self.keep and not self.finished):
                return
            self.hooks_running += 1
        cur = current
        prev = cur.__dict__.get("run"), cur.__dict__.get("idx"), cur.__dict__.get("hooking")
        cur.run, cur.idx, cur.hooking = self, i, self
        try:
            fn(TaskSupport(self, i, attempt))
        except BaseException:  # noqa: BLE001 - a hook never changes the flow
            name = self.plan.names[i]
            self.log.bind(node=name).opt(exception=True).error(
                "hook {} of node {} raised; ignored", getattr(fn, "__name__", "?"), name
            )
        finally:
            cur.run, cur.idx, cur.hooking = prev
            with self.lock:
                self.hooks_running -= 1
                if self.closed and self.hooks_running <= 1:
                    self.hooks_idle.notify_all()

    def _log_outcome(self, i: int) -> None:
        wr = self.results[i]
        name = self.plan.names[i]
        st = wr.state
        log = self.log.bind(node=name)
        if st is _EXCEPTION or st is _TIMEOUT:
            log.warning("node {} ended {}: {!r}", name, st.name, wr.exception)
        elif st is _CANCELLED:
            log.info("node {} ended CANCELLED: {}", name, wr.exception)
        else:
            log.debug("node {} ended {}", name, st.name)

    # -- time -------------------------------------------------------------------------------------

    def _arm_node_timeout(self, i: int, started: float) -> None:
        t = self.plan.timeout[i]
        assert t is not None
        when = started + t
        if when < self.deadline:
            self.node_timers[i] = timer.schedule(when, self.cv.copy().run, self._node_timeout, i)

    def _node_timeout(self, i: int) -> None:
        """Timer thread: node ``i``'s own timeout passed."""
        plan = self.plan
        hooks = [i]
        abandoned_fut = None
        fan = self.fans.get(i)
        if fan is not None:
            fan.finish(timed_out=True)
            return
        with self.lock:
            if self.closed or self.code[i] not in (QUEUED, RUNNING, BACKOFF):
                return
            now = _monotonic()
            running = self.code[i] == RUNNING
            self._fail(i, NodeTimeoutError(plan.names[i], plan.timeout[i]), _TIMEOUT, now)
            self.node_timers.pop(i, None)
            if running and self.remote:
                abandoned_fut = self.remote_futs.pop(i, None)
            elif running:
                for token, x in self.loop_node.items():
                    if x == i:
                        self.abandoned.add(token)
                        self.loops -= 1
                        abandoned_fut = self.loop_futs.get(token)
                        del self.loop_node[token]
                        break
            if not plan.has_fail[i]:
                self._settle_sons(i, hooks, now)  # else after its on_fail hook
            spawn = self._spawn_count()
        if abandoned_fut is not None:
            self._mark_abandoned([abandoned_fut])
        if self._after_settle(hooks, spawn):
            self._finish()

    def _mark_abandoned(self, futs: list[Future[Any]]) -> None:
        mark = getattr(self.executor, "mark_abandoned", None)
        if mark is None:
            return
        for f in futs:
            try:
                mark(f)
            except Exception:  # noqa: BLE001 - metrics must not break a run
                self.log.opt(exception=True).warning("mark_abandoned failed")

    def expire(self) -> None:
        """The budget is spent: close the run with every unsettled node TIMEOUT."""
        self._close(_TIMEOUT, None)

    def cancel(self, reason: str | None) -> None:
        """``ctx.cancel``: close the run with unsettled nodes CANCELLED (but the caller's)."""
        keep = -1
        if getattr(current, "run", None) is self:
            keep = current.idx
        self._close(_CANCELLED, reason or "cancelled", keep)

    def _close(self, state: ResultState, reason: str | None, keep: int = -1) -> None:
        plan = self.plan
        with self.lock:
            if self.finished or (self.closed and state is not _TIMEOUT):
                return
            now = _monotonic()
            if self.closed:
                keep = -1  # the budget ends the wait for the node that cancelled the run
            self.closed = True
            if state is _CANCELLED:
                self.cancel_reason = reason
            self.keep = keep
            fan_futs: list[Future[Any]] = []
            victims = []
            for i, wr in enumerate(self.results):
                if wr.state is _DEFAULT and i != keep:
                    if state is _TIMEOUT:
                        exc: BaseException = NodeTimeoutError(plan.names[i], self.budget, budget=True)
                    else:
                        exc = NodeCancelledError(plan.names[i], reason)
                    fan = self.fans.pop(i, None)
                    if fan is not None:
                        # the partial fan-in (in-flight items missing); its running items are
                        # reported abandoned with the run's own loops, after the lock
                        wr.result, fan_running = fan.abort()
                        fan_futs.extend(fan_running)
                    self._fail(i, exc, state, now)
                    self.code[i] = SETTLED
                    victims.append(i)
            self.ready.clear()
            futs = list(self.loop_futs.values())
            running = [self.loop_futs[t] for t, x in self.loop_node.items()
                       if x != keep and t in self.loop_futs]
            for x, f in self.remote_futs.items():
                if x != keep:
                    futs.append(f)
                    running.append(f)
            self.remote_futs.clear()
            timers = list(self.node_timers.values())
            self.node_timers.clear()
            wait_keep = keep >= 0 and self.code[keep] != SETTLED
            # hooks admitted before the close may not have begun yet: let them begin (and,
            # being quick, end) before we return, but never wait longer than HOOK_GRACE
            mine = 1 if getattr(current, "hooking", None) is self else 0
            if self.hooks_running > mine:
                self.hooks_idle.wait_for(lambda: self.hooks_running <= mine, HOOK_GRACE)
        for t in timers:
            t.cancel()
        self._mark_abandoned([f for f in running if not f.done()] + fan_futs)  # before cancel, for dask
        for f in futs:
            f.cancel()
        for i in victims:
            self._log_outcome(i)
            if plan.has_fail[i]:
                cur = current
                prev = cur.__dict__.get("run"), cur.__dict__.get("idx")
                cur.run, cur.idx = self, i
                try:
                    self.node(i).on_fail(TaskSupport(self, i, self.results[i].attempts))
                except BaseException:  # noqa: BLE001
                    self.log.bind(node=plan.names[i]).opt(exception=True).error(
                        "hook on_fail of node {} raised; ignored", plan.names[i])
                finally:
                    cur.run, cur.idx = prev
        if not wait_keep:
            self._finish()

    def _finish(self) -> None:
        with self.lock:
            if self.finished:
                return
            self.finished = True
            self.closed = True
        if self.run_timer is not None:
            self.run_timer.cancel()
        elapsed = _monotonic() - self.t0
        self.flow_result = FlowResult(self, elapsed)
        if self.debug:
            self.log.debug("flow finished in {:.6f}s", elapsed)
        self.done.set()
        if self.wakeup is not None:
            self.wakeup.set()
        if self.inbox is not None:
            self.inbox.put((None, None, None))
        fut = self.future
        if fut is not None:
            fut.set_result(self.flow_result)

    # -- the caller ---------------------------------------------------------------------------

    def wait(self) -> FlowResult:
        """``start``'s caller: wait for the run, closing it at the deadline."""
        if self.inline:
            return self._wait_inline()
        if self.remote:
            return self._wait_remote()
        if not self.done.wait(None if math.isinf(self.budget) else max(0.0, self.deadline - _monotonic())):
            self.expire()
            self.done.wait()
        assert self.flow_result is not None
        return self.flow_result

    def _wait_remote(self) -> FlowResult:
        """``start``'s caller coordinates a remote run: it processes outcomes as they arrive."""
        inbox = self.inbox
        assert inbox is not None
        while not self.done.is_set():
            if math.isinf(self.budget):
                item = inbox.get()
            else:
                left = self.deadline - _monotonic()
                try:
                    if left <= 0:
                        raise Empty
                    item = inbox.get(timeout=left)
                    if _monotonic() >= self.deadline:
                        raise Empty  # arrived too late: the budget is spent, it must not count
                except Empty:
                    self.expire()
                    break
            fn, a, b = item
            if fn is not None:
                fn(a, b)
        self.done.wait()
        assert self.flow_result is not None
        return self.flow_result

    # -- remote executors (process pools, loky, dask) ---------------------------------------------

    def _dispatch_remote(self) -> None:
        """Submit every queued node as its own task (outside the lock)."""
        with self.lock:
            batch = []
            code = self.code
            while self.ready:
                i = self.ready.popleft()
                if code[i] == QUEUED:
                    code[i] = RUNNING
                    batch.append(i)
        for i in batch:
            self._submit_remote(i)

    def _submit_remote(self, i: int) -> None:
        plan = self.plan
        if plan.fanout[i]:
            self._start_fanout(i, REMOTE, self.node(i))
            return
        wr = self.results[i]
        self._begin_attempt(i, wr, type(self.executor).__name__, self.node(i))
        now = _monotonic()
        defn = plan.nodes[i]
        results = self.results
        fathers = {plan.names[f]: results[f].result for f in plan.fathers[i]
                   if results[f].state is _SUCCESS}
        limit = self.deadline  # the task's own deadline: its node's timeout counts too
        t = plan.timeout[i]
        if t is not None:
            limit = min(limit, (wr.started_at or now) + t)
        args = (defn, defn.param, self.ctx.snapshot(), fathers, limit - now, self.flow_id)
        error = preflight_pickle(self.executor, plan.names[i], args)
        if error is None:
            try:
                fut = self.executor.submit(_remote_call, *args)
            except BaseException as exc:  # noqa: BLE001 - refused/unpicklable: the node's outcome
                error = exc
        if error is not None:
            self._complete(i, REMOTE, None, error)
            return
        with self.lock:
            self.remote_futs[i] = fut
        fut.add_done_callback(partial(self.post, self.process_remote, i))

    def post(self, fn: Callable[[Any, Any], None], a: Any, fut: Future[Any]) -> None:
        """Done-callback of remote work, on the executor's callback thread (dask: its I/O loop):
        only hand ``fn(a, fut)`` to the run's coordinator."""
        if self.future is None:
            assert self.inbox is not None
            self.inbox.put((fn, a, fut))
        else:
            _coordinator.put(partial(self.cv.copy().run, fn), a, fut)  # type: ignore[call-arg]

    def process_remote(self, i: int, fut: Future[Any]) -> None:
        """Coordinator thread: one remote attempt ended; retry it or complete the node."""
        try:
            self._process_remote(i, fut)
        except BaseException as exc:  # noqa: BLE001 - a bug here must end the node, not hang it
            self.log.opt(exception=True).error("taskflow failed processing node {}", self.plan.names[i])
            self._complete(i, REMOTE, None, exc)

    def _process_remote(self, i: int, fut: Future[Any]) -> None:
        with self.lock:
            if self.remote_futs.get(i) is fut:
                del self.remote_futs[i]
        if fut.cancelled():
            error: BaseException | None = NodeCancelledError(self.plan.names[i], "the executor cancelled it")
            value = None
        else:
            error = fut.exception()
            value = fut.result() if error is None else None
        if error is None and self.plan.routes[i]:
            try:
                self._route(i, self.plan.nodes[i], value)
            except BaseException as exc:  # noqa: BLE001
                error = exc
        if error is not None:
            wr = self.results[i]
            delay = self._retry_delay(i, wr, error)
            if delay >= 0.0:
                with self.lock:
                    if self.code[i] != RUNNING or wr.state is not _DEFAULT:
                        return
                    if delay == 0.0:
                        self.code[i] = QUEUED
                        self.ready.append(i)
                    else:
                        self.code[i] = BACKOFF
                        timer.schedule(_monotonic() + delay, self.cv.copy().run, self._requeue, i)
                if delay == 0.0:
                    self._dispatch_remote()
                return
        self._complete(i, REMOTE, value, error)

    def _wait_inline(self) -> FlowResult:
        """Nested ``start`` from a worker of the same pool: the caller runs the nodes itself."""
        wakeup = self.wakeup
        assert wakeup is not None
        token = -1
        cur = current
        prev = cur.__dict__.get("run"), cur.__dict__.get("idx")
        tname = _current_thread().name
        while not self.done.is_set():
            with self.lock:
                self.loops += 1
                i = self._next(token)
            cur.run = self
            try:
                while i >= 0:
                    i = self.cv.copy().run(self._execute, i, token, tname)
            finally:
                cur.run, cur.idx = prev
            if self.done.is_set():
                break
            left = None if math.isinf(self.budget) else self.deadline - _monotonic()
            if left is not None and left <= 0:
                self.expire()
                break
            wakeup.wait(left)
            wakeup.clear()
        self.done.wait()
        assert self.flow_result is not None
        return self.flow_result


def plan_pos(plan: Plan, node: SchedulingNode[Any, Any]) -> int:
    """Index of a definition node in ``plan`` (FlowDefinitionError if it is not a son there)."""
    i = plan.pos.get(id(node))
    if i is not None and plan.nodes[i] is node:
        return i
    raise FlowDefinitionError(f"switch chose {node!r}, which is not in this flow")




class _Coordinator:
    """The one shared thread, ``taskflow-coordinator``, that processes outcomes of remote runs
    started with ``submit`` (their callers do not wait). Started on first use."""

    def __init__(self) -> None:
        self._queue: SimpleQueue[tuple[Callable[[Any, Any], None], Any, Any]] = SimpleQueue()
        self._lock = threading.Lock()  # guards _thread
        self._thread: threading.Thread | None = None

    def put(self, fn: Callable[[Any, Any], None], a: Any, b: Any) -> None:
        self._queue.put((fn, a, b))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="taskflow-coordinator", daemon=True)
                    self._thread.start()

    def _serve(self) -> None:
        while True:
            fn, a, b = self._queue.get()
            try:
                fn(a, b)
            except BaseException:  # noqa: BLE001 - one run's bug must not stop the others
                logger.opt(exception=True).error("taskflow coordinator callback {!r} failed", fn)
            del fn, a, b


_coordinator = _Coordinator()


def is_remote(executor: Executor) -> bool:
    """Whether ``executor`` runs tasks in other processes (only the task may travel there).

    Recognised: ``ProcessPoolExecutor`` and subclasses (loky's), and dask's ``ClientExecutor``.
    Any other executor is taken to run tasks in this process."""
    if isinstance(executor, ProcessPoolExecutor):
        return True
    inner = _unwrap(executor)
    if inner is not executor:
        return is_remote(inner)
    return type(executor).__module__.startswith(("distributed", "loky"))


def _unwrap(executor: Executor) -> Executor:
    """The executor a wrapper (``MonitoredExecutor``: ``.executor``; others: ``.inner``) runs on."""
    for attr in ("inner", "executor"):
        inner = getattr(executor, attr, None)
        if isinstance(inner, Executor) and inner is not executor:
            return _unwrap(inner)
    return executor


def _pickler(executor: Executor) -> Any:
    mod = type(_unwrap(executor)).__module__
    if mod.startswith(("distributed", "loky")):
        try:
            import cloudpickle  # type: ignore[import-untyped]

            return cloudpickle
        except ImportError:  # pragma: no cover - both ship it
            pass
    import pickle

    return pickle


_FIELDS = ("node", "param", "context", "fathers' results")


def preflight_pickle(executor: Executor, name: str, args: tuple[Any, ...]) -> BaseException | None:
    """A TypeError naming the node and the field that cannot travel, or None."""
    pickler = _pickler(executor)
    # the param first: it also rides inside the node, and the message should name it
    checks = sorted(zip(_FIELDS, args), key=lambda fv: fv[0] != "param")
    for field, value in checks:
        try:
            pickler.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling raises many types
            err = TypeError(
                f"node {name!r}: its {field} cannot be pickled to run on "
                f"{type(executor).__name__}: {exc}"
            )
            err.__cause__ = exc
            return err
    return None


class _RemoteRun:
    """What a TaskContext sees of its run inside another process: a snapshot."""

    def __init__(self, flow_id: str, remaining: float, fathers: dict[str, Any], name: str) -> None:
        self.flow_id = flow_id
        self.deadline = _monotonic() + remaining
        self.fathers = fathers
        self.name = name
        self.cancel_reason: str | None = None
        self.finished = False

    def cancelled_for_caller(self) -> bool:
        return _monotonic() >= self.deadline

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


def _remote_call(node: SchedulingNode[Any, Any], param: Any, entries: dict[str, Any],
                 fathers: dict[str, Any], remaining: float, flow_id: str) -> Any:
    """Runs in the executor's process: the task on a snapshot of the context."""
    ctx = TaskContext(entries)
    ctx._run = _RemoteRun(flow_id, remaining, fathers, node.name)
    value = node.task(ctx, param)
    import pickle

    try:
        pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        try:
            import cloudpickle

            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001
            raise TypeError(
                f"node {node.name!r}: its result ({type(value).__name__}) cannot be pickled "
                f"to return it: {exc}"
            ) from None
    return value


def _remote_work(blob: bytes, item: Any, entries: dict[str, Any], fathers: dict[str, Any],
                 remaining: float, flow_id: str) -> Any:
    """Runs in the executor's process: one fan-out item (the node arrives pickled once, as
    ``blob``, without its param)."""
    import pickle

    node = pickle.loads(blob)  # noqa: S301 - our own bytes, from the flow's process
    ctx = TaskContext(entries)
    ctx._run = _RemoteRun(flow_id, remaining, fathers, node.name)
    return node.work(ctx, item)


RunView = Union[_Run, _RemoteRun]
"""What a ``TaskContext`` points at: the run (``_Run``) or, in other processes, a snapshot."""
