"""One run of a compiled plan: its state, running nodes and recording their outcomes.

How a run works
===============
A run (``Run``) executes one compiled ``Plan`` (flat tuples indexed by
node number, shared read-only by every run of the graph). Its own state is flat lists indexed the
same way: ``code`` (where each node is in its lifecycle, moved along ``LEGAL_MOVES`` by
``Run.move``; the hot path writes the moves whose old state it has just tested, or
knows, directly, each marked so), the join counters (``left``, ``nsucc``, ``nskip``),
``results`` (one [`WorkResult`][taskflow.WorkResult] per node) and per-run node copies made on demand.

Nodes whose join fired are appended to the run's ``ready`` deque. How they run depends on the
executor (``executors.capabilities``):

* thread executors: up to ``max_loops`` worker *loops* (``loops.py``; how many: ``economy.py``) drain the deque. A loop pops
  a node, runs its attempts and hook, then (under the lock, in one critical section) records the
  outcome, updates the sons' join counters with ``joins.decide``, appends the sons that became
  ready and pops its next node. A chain runs in one worker with no executor round trip; no loop
  ever waits for another node, so any DAG finishes on a one-worker pool. A ready node expected
  to be slow (an I/O call; never measured) gets a loop of its own at once; fast ones share the
  loops there are (a thread wake-up costs more than they do), and a watchdog starts more loops
  if those make no progress.
* a nested ``start`` from a worker of the same pool (``inline.py``): the caller drains the deque
  itself, so a saturated pool cannot deadlock on it.
* executors in other processes (``remote.py``): each attempt is its own submission; its
  done-callback only hands the outcome to the run's *owner*.

How a terminal node settles its sons (joins, skips, failing fast, cancelling fathers nobody
needs any more) is ``settling.py``'s.

The owner and the threads that may do what
==========================================
Every run has an *owner*: ``start``'s caller, which waits in ``closing.wait`` on the run's
``inbox``, or, for ``submit``, the shared ``taskflow-coordinator`` threads (one when idle, more
while one is busy in a slow hook). ``post`` hands work to the owner. Three kinds of thread never call user code or ``executor.submit``; they move state
under the lock and ``post`` the rest:

* a future's done-callback (it may run under the executor's shutdown lock);
* the ``taskflow-timer`` thread (node timeouts, retry back-offs, ``submit`` budgets);
* anything holding the run's lock.

Whichever thread finishes a node compares the clock with the node's own deadline and the run's:
past either, the node is TIMEOUT and its value is dropped (past the run's, the run closes).

Time: the run has one deadline (``t0 + budget``, ``t0`` read when the caller called ``start``,
before the run was built); closing the run there, or at ``ctx.cancel``,
and finishing it are ``closing.py``'s (its docstring says how).

Fields of a run (``lock`` guards every mutable one unless said otherwise)
=======================================================================
``plan``, ``names``, ``executor``, ``caps``, ``budget``, ``t0``, ``deadline``, ``flow_id``,
``ctx``, ``cv`` (the caller's contextvars), ``mode`` (LOOPS, INLINE or REMOTE), ``debug``,
``flow_name``: fixed at creation, read without the lock.
``quiet``: no node observers and no DEBUG lines; with ``plan.plain[i]`` it sends node ``i``
  through the fast path (``plainloop``: a loop's step; ``execute`` and ``complete`` are the
  general path). Set by ``begin`` before any node is queued, read without the lock.
``observers``, ``node_observers``: who watches the run (``events.py``; all of them, and those
  told about every node): the listeners' are added by ``begin`` (to a stream's channel,
  ``streaming.py``) before any node is queued, read without the lock.
``code[i]``: node ``i``'s lifecycle code (WAITING, QUEUED, RUNNING, BACKOFF, TERMINAL, SETTLED).
``left[i]``, ``nsucc[i]``, ``nskip[i]``: fathers not terminal / succeeded / skipped.
``results[i]``: node ``i``'s WorkResult; ``result``/``exception`` written before ``state``.
``nodes[i]``: the run's copy of node ``i`` (None until needed; written once).
``ready``: QUEUED nodes not yet popped by a loop.
``pending``: nodes not yet SETTLED; the run finishes when it reaches 0.
``closed``: no new node is dispatched and no hook is admitted (but ``keep``'s and owed ones).
``finished``: the FlowResult exists; nothing runs any more.
``expired``: the budget closed the run. ``cancel_reason``: ``ctx.cancel``'s reason.
``keep``: the node that called ``ctx.cancel``; the run waits for it (-1: none).
``claimed[i]``: node ``i``'s outcome hook was taken by some thread (it runs at most once).
``hook_errors[i]``: the first error a hook of node ``i`` raised (none written once finished).
``owed``: outcome hooks claimed by a closer and not started yet; whichever thread finishes the
  run first runs those left, so none is dropped and none starts after ``start`` returns.
``hooks_running``: hooks admitted and not returned (``hooks_idle``, a Condition on ``lock`` made
  by the first thread that waits for hooks, is notified on change).
``chosen[i]``: the sons a switch chose. ``fans[i]``: node ``i``'s fan-out while it fans out.
``node_timers[i]``, ``run_timer``: timer entries to cancel.
``economy``: the loop economy (``economy.Economy``): how many worker loops the run has and
  should have, the slow-node count, the watchdog, which loop runs which node and the loops
  abandoned in a timed-out node. It shares ``ready`` and ``code`` (the same objects) and is
  guarded by ``lock``; its own docstring lists its fields and invariants.
``tokens``, ``unstarted``, ``live``, ``loop_futs``: the loops' submissions (see ``loops.py``):
  the last token, submitted and not started, not exited, and their futures.
``backlog`` (in the economy): a probe of how many tasks wait in the executor's queue
  (``executors.backlog``; None when unknown or not in LOOPS mode), fixed at creation.
``remote_futs[i]``: node ``i``'s attempt future on a remote executor.
``ranks``: with resilience options in the plan, each node's dispatch rank (priority, longest
  remaining path): a loop pops the highest-ranked ready node (``ranking.pop_best``, in
  ``Economy.next_node``), remote executors get a batch in rank order; None (FIFO) otherwise.
  Fixed at ``begin`` (the economy holds the same list).
``guards[i]``: node ``i``'s resilience bookkeeping (``guards.Guard``; only for nodes with a
  ``NodePolicy``; some of its fields are guarded by ``lock``, see ``guards.py``): what its gates
  hold, its seat in a batch's call (``batching.py``), its retry-budget token (``retrying.py``).
``inbox``: the owner's queue (``start`` runs); ``future``: the Future of a ``submit`` run.
``flow_result``: the result, between ``finish`` and the owner taking it (then cleared).
``record``: what remains of the run once finished (``closing.FinishedRun``, set by ``finish``
  under ``lock``): its result and context keep it, not the run; node copies made from then on
  hold it (weakly) instead of the run.
``watch``: the attempts that registered ``ctx.on_cancel`` callbacks and the calls clamped to
  their deadline (``attempts.Watch``, its own lock); None until a task of the run asks, and
  every path that abandons attempts tests it first (``attempts.py``).
``detached_work[i]``: the Future of detached node ``i``'s end, in a ``detached.Handle`` (None
  until the first, written under ``lock`` before the node settles, read once the run finished).
``threads``: thread ident -> that thread's ``current`` dict, for each thread that drained the
  run's nodes (written once per loop by the thread itself, no lock; ``inflight.py`` reads it).
``priority``: the priority ``start`` was given (fixed; read by ``inflight.py``).
``outer``: for an inline run, the ``current`` run and node of the thread that started it (how
  ``attempts`` sees an attempt that runs a nested flow still running); None otherwise.

The fields every run writes at creation are slots (``Run.__slots__``); the others live in the
instance dict, made by the first write of one. Fields most runs never change are class-level
defaults (a run writes its own on change). Those
only a mode or a plan writes are made by ``__init__`` for such runs alone: ``unstarted``,
``live``, ``loop_futs`` (LOOPS), ``remote_futs`` (REMOTE), ``node_timers`` (``plan.any_timeout``),
``guards`` (``plan.any_policy``); ``chosen`` and ``fans`` by the first switch or fan-out that
writes one (``dict.setdefault``, atomic); ``hook_errors`` by the first hook that raises
(under ``lock``). The others read an empty class-level default that
raises on a write (``_Unused``), so a field written where it was not made is a loud bug.

State table
===========
Each node's ``code`` moves along ``states.LEGAL_MOVES`` (``states.py`` has the table and what
each move means), applied by ``Run.move``; an illegal move is a bug in taskflow: it raises
``IllegalMoveError`` when the debug switch is on
(``set_strict(True)``; the test suite turns it on) and is logged otherwise.

Invariants
==========
* User code (tasks, hooks), ``executor.submit`` and future callbacks are never called while holding
  ``lock``.
* ``state`` of a WorkResult leaves ``DEFAULT`` exactly once; a late outcome (the node timed out,
  was cancelled, or the run closed) is dropped and never overwrites anything.
* ``pending >= 0``; ``finished`` is set exactly once, after every claimed hook started.
* No hook starts after ``finished``; every outcome hook of a terminal node runs exactly once
  (admission and claiming happen under the lock).
* A node's hook runs before its sons are made ready (happens-before).
* ``economy.loops`` counts loops submitted and not exited, but abandoned ones.
* A node's outcome is recorded once, under the lock, by whichever thread holds the node RUNNING
  with no outcome yet (``record_success`` or ``fail``); then, still under the lock and after its
  outcome hook returned, ``settle_and_next`` settles its sons, pops the loop's next node,
  reserves loops and marks it SETTLED (``mark_settled``). A plain node's step
  (``plainloop``) does the same steps inlined.
* Who owns what: the run's ``lock`` guards the node state (``code``, the join counters,
  ``ready``, ``pending``, ``closed``/``finished``/``keep``, the hook bookkeeping, timers,
  ``fans``, ``remote_futs``) and the economy's fields; a WorkResult's fields are written by the
  thread that ran its node before the state is published under the lock; ``plan.est`` is
  written without the lock (racy by design).
* Nodes without resilience options (``plan.policy[i] is None``) never reach ``guards``; the
  engine tests ``plan.any_policy`` first.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from itertools import repeat as _repeat
from itertools import starmap as _starmap
from queue import SimpleQueue
from types import CoroutineType as _Coroutine
from typing import TYPE_CHECKING, Any

from taskflow import clock, logs
from taskflow.engine import (
    aio,
    attempts,
    batching,
    closing,
    deadlines,
    detached,
    events,
    executors,
    fallbacks,
    guards,
    inflight,
    loops,
    plainloop,
    ranking,
    remote,
    retrying,
    sections,
    settling,
    timer,
)
from taskflow.engine import hooks as hooking
from taskflow.engine.closing import FinishedRun
from taskflow.engine.economy import Economy, learn_duration
from taskflow.engine.flowids import new_flow_id as _new_flow_id
from taskflow.engine.states import (
    INLINE,
    LEGAL_BITS,
    LOOPS,
    NO_LOOP,
    QUEUED,
    REMOTE,
    RUNNING,
    SETTLED,
    STATE_NAMES,
    TERMINAL,
    WAITING,
    IllegalMoveError,
)
from taskflow.engine.unused import Unused, UnusedSet
from taskflow.errors import (
    FlowDefinitionError,
    NodeCancelledError,
    NodeTimeoutError,
    TaskflowError,
)
from taskflow.logs import logger
from taskflow.model.context import TaskContext, current
from taskflow.model.graph import Plan, PlanView, copy_node
from taskflow.model.result import FlowResult, HookError, ResultState, WorkResult

__all__ = ["FinishedRun", "Run", "set_strict"]




_SUCCESS = ResultState.SUCCESS
_DEGRADED = ResultState.DEGRADED
_EXCEPTION = ResultState.EXCEPTION
_TIMEOUT = ResultState.TIMEOUT
_CANCELLED = ResultState.CANCELLED
_DEFAULT = ResultState.DEFAULT

_settle_sons = settling.settle_sons
_after_settle = settling.after_settle
_current_thread = threading.current_thread
_get_ident = threading.get_ident
_copy_context = contextvars.copy_context

_strict = False


def set_strict(on: bool) -> None:
    """The debug switch: an illegal state move raises (True) or is logged (False, default)."""
    global _strict
    _strict = on


def _debug_enabled() -> bool:
    """Whether per-node DEBUG lines are on (``taskflow.logs.log_nodes``) and would reach a
    loguru sink (checked once per run)."""
    real = logs.loguru_logger()
    if real is None or not logs.logging_nodes():
        return False
    try:
        core = real._core  # type: ignore[attr-defined]
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
    # an exception type that refuses attributes keeps its text
    with contextlib.suppress(Exception):
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:  # pragma: no cover - Python 3.10
            exc.__notes__ = [*(notes or ()), note]


def _start_loops(ref: weakref.ref[Run], k: int) -> None:
    """The economy's watchdog (timer thread): have the run's owner start ``k`` reserved loops."""
    run = ref()
    if run is not None:
        run.post(run.dispatch, k)


def _wake() -> None:
    """Posted to an inline run's inbox: nodes became ready."""


class Run(PlanView):
    """One execution of a plan. Created and started by ``TaskScheduling`` (see the module
    docstring for every field)."""

    # the fields every run writes at creation are slots (CPython keeps an instance dict of
    # more than 30 keys unshared: building one costs three resizes and a store per key costs
    # twice a slot's); the rest live in the instance dict, made by the first write of one, over
    # the class-level defaults below
    __slots__ = ("__dict__", "__weakref__", "budget", "caps", "claimed", "code", "ctx", "cv",
                 "data", "deadline", "economy", "executor", "flow_id", "flow_name", "future",
                 "inbox", "left", "lock", "mode", "names", "nodes", "nskip", "nsucc", "owed",
                 "pending", "plan", "ready", "ref", "results", "t0", "threads")

    detached_work: dict[int, detached.Handle] | None = None  # made by the first hand-off
    priority = "normal"  # the priority it was started with (set by the facade)
    aio_loop: Any = None  # run_async's loop for async nodes (aio.py; None: the process's)
    start_refresh = detached.refresh  # a ``stale_for`` refresh: detached work of its own
    # the fields every run starts with and most never write: class-level defaults (a run
    # writes its own when it changes one), so building a run does not store them
    # who watches this run (events.py): all observers, and those told about every node
    observers: tuple[events.RunObserver, ...] = ()
    node_observers: tuple[events.RunObserver, ...] = ()
    closed = False
    finished = False
    expired = False
    keep = -1
    cancel_reason: str | None = None
    hooks_running = 0
    hooks_idle: threading.Condition | None = None  # made on first wait (finish)
    run_timer: timer.Timer | None = None
    tokens = 0
    ranks: list[tuple[float, float]] | None = None  # dispatch order (ranking.rank)
    flow_result: FlowResult | None = None
    record: FinishedRun | None = None  # what its result and context keep (set by finish)
    watch: attempts.Watch | None = None
    outer: tuple[Any, Any] | None = None
    _log: Any = None
    debug = False  # per-node DEBUG lines (set at creation when ``logs.log_nodes`` is on)
    quiet = True  # not ``debug`` and no node observers (set at creation and by ``begin``)
    # fields only some modes or plans write: ``__init__`` makes them for those runs; the
    # others read these empty defaults (a write into one raises)
    unstarted: set[int] = UnusedSet()  # LOOPS
    live: set[int] = UnusedSet()  # LOOPS
    loop_futs: dict[int, Future[Any]] = Unused()  # LOOPS
    remote_futs: dict[int, Future[Any]] = Unused()  # REMOTE
    node_timers: dict[int, timer.Timer] = Unused()  # plan.any_timeout
    guards: dict[int, guards.Guard] = Unused()  # plan.any_policy
    # made by the first switch or fan-out that writes them (``dict.setdefault``: atomic)
    chosen: dict[int, frozenset[int]] = Unused()
    fans: dict[int, Any] = Unused()
    hook_errors: dict[int, HookError] = Unused()  # made by the first hook that raises (lock)

    def __init__(self, plan: Plan, executor: Executor, budget: float, ctx: TaskContext,
                 future: Future[FlowResult] | None, caps: executors.Capabilities,
                 inline: bool = False, name: str = "", t0: float | None = None) -> None:
        n = len(plan.nodes)
        self.plan = plan
        self.names = plan.names
        self.executor = executor
        self.caps = caps
        self.budget = budget
        self.ctx = ctx
        self.data: dict[str, Any] = {}
        self.flow_id = _new_flow_id()
        self.flow_name = name
        self.lock = threading.Lock()
        self.code = [WAITING] * n
        self.left = list(plan.nfathers)
        self.nsucc = [0] * n
        self.nskip = [0] * n
        # a C loop (a comprehension costs a function call of its own per run)
        self.results: list[WorkResult[Any]] = list(_starmap(WorkResult, _repeat((), n)))
        self.nodes: list[Any] = [None] * n
        self.ready: deque[int] = deque()
        self.pending = n
        self.claimed = bytearray(n)
        self.owed: list[int] = []  # a list: empty for nearly every run (a deque is 0.7 KiB)
        if plan.any_timeout:
            self.node_timers = {}
        if plan.any_policy:
            self.guards = {}
        self.mode = REMOTE if caps.remote else INLINE if inline else LOOPS
        self.ref = weakref.ref(self)
        pooled = self.mode is LOOPS
        if pooled:
            self.unstarted = set()
            self.live = set()
            self.loop_futs = {}
        elif caps.remote:
            self.remote_futs = {}
        # the economy calls back through a weak reference: no cycle between it and the run
        self.economy = Economy(plan.est, self.ready, self.code, pooled, caps.parallelism,
                               executors.backlog(executor) if pooled else None, self.lock,
                               partial(_start_loops, self.ref) if pooled else None)
        self.threads: dict[int, dict[str, Any]] = {}  # who drained it (inflight.py)
        self.future = future
        self.inbox: SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] | None = (
            SimpleQueue() if future is None else None)
        self.cv = _copy_context()
        if logs.logging_nodes() and _debug_enabled():  # off by default: one call
            self.debug = True
            self.quiet = False
        # when the caller called (its budget counts from then, building the run included)
        self.t0 = clock.now() if t0 is None else t0
        self.deadline = self.t0 + budget
        if inline:
            d = current.__dict__
            self.outer = (d.get("run"), d.get("idx"))

    # -- what other modules see (RunView, RunRecord, LoopOwner) ------------------------------------

    @property
    def log(self) -> Any:
        """The run's logger (bound to its flow id and name; ``node`` None: the whole run)."""
        if self._log is None:
            self._log = logger.bind(flow_id=self.flow_id, flow=self.flow_name, node=None)
        return self._log

    def node(self, i: int) -> Any:
        """This run's copy of node ``i`` (made on first use)."""
        n = self.nodes[i]
        if n is None:
            with self.lock:
                n = self.nodes[i]
                if n is None:
                    n = self.nodes[i] = self._clone(i)
        return n

    def _clone(self, i: int) -> Any:
        """Under lock: a new copy of node ``i``, held by the run (its record once finished)."""
        record = self.record
        return copy_node(self.plan.nodes[i],
                         self.ref if record is None else weakref.ref(record),
                         self.results[i], i)

    def describe(self) -> str:
        return f"flow {self.flow_id}"

    def cancelled_for_caller(self) -> bool:
        if self.closed:
            return True
        cur = current
        if cur.__dict__.get("run") is self:
            return self.results[cur.idx].state is not _DEFAULT
        return False

    def caller_name(self) -> str:
        cur = current
        return self.names[cur.idx] if cur.__dict__.get("run") is self else "?"

    def value_of(self, name: str) -> Any:
        return closing.value_of(self.results, self.plan.index, self.flow_id, name)

    def asking(self) -> attempts.Asking | None:
        d = current.__dict__  # this thread's: one look-up, then plain dict reads
        if d.get("run") is not self or d.get("hooking") is self:
            return None  # not an attempt of this run (a hook is none)
        return attempts.Asking(self, d["idx"], d.get("item"))

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for c in self.code:
            counts[STATE_NAMES[c]] = counts.get(STATE_NAMES[c], 0) + 1
        running = [self.names[i] for i, c in enumerate(self.code) if c == RUNNING][:5]
        left = self.deadline - clock.now()
        phase = ("finished" if self.finished else "closed" if self.closed else "open")
        return (f"<Run {self.flow_id} {phase} {self.mode} nodes={len(self.code)} "
                f"{' '.join(f'{k}={v}' for k, v in counts.items())} running={running} "
                f"pending={self.pending} loops={self.economy.loops} hooks={self.hooks_running} "
                f"budget={self.budget:g} left={left:.3f}s>")

    # -- the state table ----------------------------------------------------------------------------

    def move(self, i: int, new: int) -> None:
        """Under lock: move node ``i`` to ``new`` (see ``LEGAL_MOVES``)."""
        old = self.code[i]
        if not (LEGAL_BITS[old] >> new) & 1:
            msg = (f"illegal move of node {self.names[i]!r} in flow {self.flow_id}: "
                   f"{STATE_NAMES[old]} -> {STATE_NAMES[new]}")
            if _strict:
                raise IllegalMoveError(msg)
            self.log.error("taskflow bug: {}", msg)  # noqa: PLE1205 - loguru formats with {}
        self.code[i] = new

    # -- handing work over ------------------------------------------------------------------------

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread (never this one). Safe from any thread,
        done-callbacks and the timer included."""
        inbox = self.inbox
        if inbox is not None:
            inbox.put((fn, args))
        else:
            remote.coordinator.put(self.cv, fn, args)

    # -- starting ---------------------------------------------------------------------------------

    def begin(self, hand_off: bool = False) -> None:
        """Queue the roots and dispatch; settle everything at once if the budget is spent.
        ``hand_off``: a coordinator thread submits the first loops (this thread must not run
        a task, and the executor may run one in the submitting thread: ``run_async``)."""
        inflight.join(self)
        if events.LISTENERS:  # added to those already given (a stream's channel)
            seen, per_node = events.observe(self)
            self.observers += seen
            self.node_observers += per_node
            self.quiet = not self.debug and not self.node_observers
        plan = self.plan
        if not plan.nodes:
            closing.finish(self)
            return
        if self.budget <= 0.0:
            closing.expire(self)
            return
        now = self.t0
        results = self.results
        eco = self.economy
        if plan.any_policy:
            self.ranks = eco.ranks = ranking.rank(plan)
            if plan.batches is not None:
                eco.batch_of = plan.batches
                eco.joinable = partial(batching.joinable, plan.policy, self.guards, self.deadline)
        code = self.code
        with self.lock:
            for i in plan.roots:
                code[i] = QUEUED  # WAITING -> QUEUED: a new run's nodes are all WAITING
                results[i].queued_at = now
                eco.enqueue(i)
            # plain async roots of a quiet pooled run: started below, with no worker hop
            direct = eco.take(plan.aplain) if plan.any_async and self.quiet and eco.pooled else ()
            if plan.any_deadline:  # after the roots are queued: an entry may fire at once
                sections.arm(self, deadlines.node_timeout)
            # an inline run's caller drains the roots itself next (closing.wait): no wake-up
            k = eco.reserve() if self.mode is not INLINE else 0
        if self.future is not None and not math.isinf(self.budget):
            self.run_timer = timer.schedule(self.deadline, closing.expire_on_timer, self)
        if direct:
            aio.start_plain(self, list(direct))
        if not k:
            return  # nothing to start (an inline run: its caller drains the roots next)
        if hand_off:
            remote.coordinator.put(self.cv, self.dispatch, (k,))
            return
        self.dispatch(k)

    def dispatch(self, k: int) -> None:
        """Outside the lock, on a thread that may submit: start ``k`` reserved loops."""
        if not k:
            return
        mode = self.mode
        if mode is LOOPS:
            loops.spawn(self, k)
            return
        with self.lock:
            self.economy.dispatched(k)
        if mode is INLINE:
            assert self.inbox is not None
            self.inbox.put((_wake, ()))
        else:
            remote.dispatch(self)

    def loop_refused(self, exc: BaseException) -> None:
        """A loop was refused (owner thread): with no loop left to drain the queue, the queued
        nodes fail with the executor's error."""
        hooks: list[int] = []
        eco = self.economy
        with self.lock:
            if eco.refused() or self.closed:
                return
            now = clock.now()
            victims = [i for i in self.ready if self.code[i] == QUEUED]
            eco.clear_ready()
            for i in victims:
                self.fail(i, exc, _EXCEPTION, now)
                hooks.append(i)
                if not self.plan.has_fail[i]:
                    _settle_sons(self, i, hooks, now)
            k = eco.reserve()
        if self.debug:
            self.log.debug("executor refused work: {!r}", exc)  # noqa: PLE1205 - loguru formats with {}
        if _after_settle(self, hooks, k):
            closing.finish(self)

    # -- running nodes (loop and inline threads) ----------------------------------------------------

    def loop_body(self, token: int) -> None:
        """One worker loop (``loops.spawn``): run nodes until none is ready."""
        with self.lock:
            i = self.economy.first_node(token)
        if i < 0:
            return
        self.run_nodes(i, token)

    def run_nodes(self, i: int, token: int) -> None:
        """Run node ``i`` and the nodes this loop pops after it (plain ones of a quiet run in
        ``plainloop``'s steps)."""
        cv = self.cv
        cur = current
        d = cur.__dict__
        prev = d.get("run"), d.get("idx")
        cur.run = self
        self.threads[_get_ident()] = d  # once per loop: whose thread (inflight.py)
        tname = _current_thread().name
        plain = self.plan.plain if self.quiet else None
        execute = self.execute
        step = plainloop.stepper(self, token, tname) if plain is not None else None
        try:
            while i >= 0:
                try:
                    if step is not None and plain[i]:  # type: ignore[index]
                        i = cv.copy().run(step, i)
                    else:
                        i = cv.copy().run(execute, i, token, tname)
                except BaseException as exc:  # noqa: BLE001 - a bug must fail the node, not vanish
                    i = self.engine_error(i, token, exc)
        finally:
            cur.run, cur.idx = prev

    def engine_error(self, i: int, token: int, exc: BaseException) -> int:
        """An exception in taskflow's own code while running node ``i``: the node fails with it
        (and says so) instead of the loop dying; returns the loop's next node."""
        self.log.opt(exception=True).error(
            "taskflow failed running node {} (flow {})", self.names[i], self.flow_id)
        _note(exc, f"taskflow: internal error while running node {self.names[i]!r}")
        try:
            return self.complete(i, token, None, exc)
        except BaseException:  # noqa: BLE001
            self.log.opt(exception=True).error("taskflow could not fail node {}", self.names[i])
            return -1

    def execute(self, i: int, token: int, tname: str) -> int:
        """Run node ``i`` to its outcome, settle it, and return the loop's next node (or -1).

        Called in a fresh copy of the caller's contextvars, with ``current.run`` set to this run.
        """
        plan = self.plan
        wr = self.results[i]
        node: Any
        if plan.stateless[i]:
            node = plan.nodes[i]  # FunctionNode: its task reads nothing but fn, param
        else:
            node = self.nodes[i]
            if node is None:
                node = self.node(i)
        current.idx = i
        if plan.fanout[i]:
            return self.start_fanout(i, token, node, tname)
        guarded = plan.any_policy and plan.policy[i] is not None  # resilience options
        # guarded: it has a policy; a detached node is handed off, the run does not wait for it
        if guarded and plan.policy[i].detach:  # type: ignore[union-attr]
            return detached.hand_off(self, i, token)
        if plan.any_async and plan.asyncs[i]:  # an async def task: on an event loop (aio.py)
            return aio.start_node(self, i, token, node)
        while True:
            if wr.state is not _DEFAULT:
                # settled while queued or between attempts (a join cancelled it, the run
                # closed): never start an attempt for it
                return self.late(i, token, None, None)
            if guarded:
                gate = guards.admit(self, i)
                if gate == guards.PARKED:  # it holds no worker while it waits
                    return self.move_on(token)
                if gate == guards.DONE:
                    return self.complete(i, token, *guards.take_outcome(self, i))
            self.begin_attempt(i, wr, tname, node)
            try:
                value = node.task(self.ctx, node.param)
                if type(value) is _Coroutine:  # a sync task returned a coroutine: never awaited
                    aio.returned_coroutine(self.names[i], value)
                error: BaseException | None = None
                if plan.routes[i]:
                    self.route(i, node, value)
            except BaseException as exc:  # noqa: BLE001 - a task's failure is its node's outcome
                error = exc
                value = None
            if guarded and not guards.attempt_done(self, i, error is None):
                return self.move_on(token)  # a duplicate attempt decides
            if error is not None:
                delay = retrying.next_attempt(self, i, wr, error)
                if delay == 0.0:
                    continue
                if delay > 0.0:
                    return retrying.back_off(self, i, wr, token, delay)
            return self.complete(i, token, value, error)

    def begin_attempt(self, i: int, wr: WorkResult[Any], thread: str, node: Any) -> None:
        """Stamp an attempt of node ``i`` (arming its own timeout at the first) and run
        ``on_begin``."""
        plan = self.plan
        if plan.any_policy:
            pol = plan.policy[i]
            if pol is not None and pol.retry_budget is not None:
                retrying.attempt_begins(self, i, pol, wr.attempts == 0)
        if wr.started_at is None:
            now = clock.now()
            wr.started_at = now
            if plan.timeout[i] is not None:
                deadlines.arm_node_timeout(self, i, now)
        wr.attempts += 1
        wr.thread = thread
        if self.node_observers:
            events.attempt_started(self.node_observers, i, wr.attempts)
        if self.debug:
            name = self.names[i]
            self.log.bind(node=name).debug("node {} attempt {} started", name, wr.attempts)
        if plan.has_begin[i] and not self.closed:
            hooking.hook(self, node.on_begin, i, wr.attempts, False)

    def route(self, i: int, node: Any, value: Any) -> None:
        """A switch returned ``value``: record which of its sons it chose (or raise)."""
        chosen = self.plan.nodes[i].choose_sons(value)
        if chosen is not None:
            pruned = self.plan.pruned  # sons left out by start(..., targets=...) do not run
            self.__dict__.setdefault("chosen", {})[i] = frozenset(
                plan_pos(self.plan, c) for c in chosen if id(c) not in pruned)

    def start_fanout(self, i: int, token: int, node: Any, tname: str) -> int:
        """Start node ``i``'s fan-out (``taskflow.kinds.fanout``) and give the loop its next node."""
        self.begin_attempt(i, self.results[i], tname, node)
        fan = node.open_fan_out(self, i)
        with self.lock:
            self.__dict__.setdefault("fans", {})[i] = fan
        fan.start()
        if token == NO_LOOP:
            return -1
        with self.lock:
            return self.economy.next_unless_abandoned(token)

    def complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Record node ``i``'s outcome, run its hook, settle its sons; return the next node. For
        any node (``plainloop`` does a plain node's success): the budget, the node's own timeout
        and its policy decide the outcome; it is recorded, observed, logged and hooked, then
        settled."""
        plan = self.plan
        wr = self.results[i]
        guarded = plan.any_policy and plan.policy[i] is not None
        if guarded:
            guards.finish(self, i, value, error)
        now = clock.now()
        if now >= self.deadline:
            return deadlines.past_deadline(self, i, token, value, error)
        raised = error  # if the outcome is late, the log names what the task did
        if deadlines.own_timeout_passed(self, i, wr, now, error):
            value, error = None, sections.timeout_error(plan, i, self.t0, now)
        degraded = None
        if error is not None and guarded:
            value, error, degraded = fallbacks.stand_in(self, i, error)
        if error is None and not plan.asyncs[i]:  # an async node stays fast (Plan.est)
            learn_duration(plan.est, i, wr.started_at, now)
        ok = error is None and degraded is None
        has_hook = plan.has_success[i] if ok else plan.has_fail[i]
        # observers and the log hear of the node before its settlement can let another thread
        # end the run (start returns after its lines and calls)
        watching = self.node_observers
        loud = self.debug or not ok
        told = has_hook or bool(watching) or loud
        hooks: list[int] = []
        with self.lock:
            timer_entry = self.drop_node_watch(i)
            late = self.code[i] != RUNNING or wr.state is not _DEFAULT
            if not late:
                self.economy.progress += 1
                if error is None:
                    self.record_success(i, wr, value, degraded, now)
                else:
                    wr.result = value  # a fan-out's partial FanInResult; None otherwise
                    self.fail(i, error,
                              _TIMEOUT if isinstance(error, NodeTimeoutError) else _EXCEPTION, now)
                if not told:
                    nxt, k, fin = self.settle_and_next(i, token, hooks, now)
        if late:
            if watching:
                events.attempt_ended(watching, i, wr.attempts, error, events.LATE)
            return self.late(i, token, value, raised)
        if timer_entry is not None:
            timer_entry.cancel()
        if self.watch is not None:  # other attempts of it still running: a hedge, fan-out items
            attempts.abandon(self, (i,), spare=current.__dict__)
        if told:
            self.tell_outcome(i, ok, has_hook, loud)
            with self.lock:
                nxt, k, fin = self.settle_and_next(i, token, hooks, now)
        return self.carry_on(nxt, k, fin, hooks)

    def record_success(self, i: int, wr: WorkResult[Any], value: Any,
                       degraded: BaseException | None, now: float) -> None:
        """Under lock, node ``i`` RUNNING with no outcome yet: it succeeded with ``value`` (or
        ends DEGRADED: a fallback's ``value`` stands in for ``degraded``). A plain node's step
        (``plainloop``) inlines it."""
        wr.result = value
        wr.finished_at = now
        if degraded is not None:
            wr.exception = degraded
            wr.state = _DEGRADED
        else:
            wr.state = _SUCCESS
        self.code[i] = TERMINAL  # RUNNING -> TERMINAL, checked by the caller

    def drop_node_watch(self, i: int) -> timer.Timer | None:
        """Under lock: node ``i`` has an outcome: forget its fan-out and take its timeout entry
        (the caller cancels it outside the lock)."""
        plan = self.plan
        if plan.fanout[i]:
            self.fans.pop(i, None)
        return self.node_timers.pop(i, None) if plan.any_timeout else None

    def tell_outcome(self, i: int, ok: bool, has_hook: bool, loud: bool) -> None:
        """Outside the lock: observers and the log hear how node ``i`` ended, then its outcome
        hook runs (before its sons can move)."""
        wr = self.results[i]
        if self.node_observers:
            events.completed(self.node_observers, i, wr.attempts, wr.exception)
        if loud:
            hooking.log_outcome(self, i)
        if has_hook:
            node = self.node(i)
            hooking.hook(self, node.on_success if ok else node.on_fail, i, wr.attempts, True)

    def settle_and_next(self, i: int, token: int, hooks: list[int],
                        now: float) -> tuple[int, int, bool]:
        """Under lock, node ``i`` terminal and its hook done: settle its sons, pop loop
        ``token``'s next node (-1: none, or the loop was abandoned), reserve loops for the ready
        nodes and settle ``i``. Returns (next node, loops reserved, whether to finish). A
        plain node's step (``plainloop``) inlines it."""
        _settle_sons(self, i, hooks, now)
        eco = self.economy
        nxt = eco.next_node(token, True) if token >= -1 and token not in eco.abandoned else -1
        k = eco.reserve(nxt)
        return nxt, k, self.mark_settled(i)

    def carry_on(self, nxt: int, k: int, fin: bool, hooks: list[int]) -> int:
        """Outside the lock, after ``settle_and_next``: settle the sons that ended without
        running, start the ``k`` loops reserved, finish the run if ``fin``; returns ``nxt``."""
        if hooks:
            fin = _after_settle(self, hooks, k) or fin
        elif k:
            self.dispatch(k)
        if fin:
            closing.finish(self)
        return nxt

    def fan_in(self, i: int, value: Any, error: BaseException | None) -> None:
        """A fan-out node's fan-in is complete (any thread but the timer's)."""
        self.complete(i, NO_LOOP, value, error)

    def late(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """The node was settled without us (timeout, cancel, closed run): drop the outcome."""
        name = self.names[i]
        if error is not None and not isinstance(error, NodeCancelledError):
            self.log.bind(node=name).warning(
                "late exception from abandoned node {} dropped: {!r}", name, error
            )
        elif self.debug:
            self.log.bind(node=name).debug("late result from node {} dropped", name)
        return self.move_on(token)

    def move_on(self, token: int) -> int:
        """Loop ``token`` is done with its node without recording an outcome (a late one, a
        parked node, a hedge race lost): its next node, or -1 when the loop exits."""
        if token == NO_LOOP:
            return -1
        eco = self.economy
        with self.lock:
            if eco.forget_abandoned(token):
                return -1
            if self.closed:
                eco.loop_exits(token)
                return -1
            return eco.next_node(token)

    # -- settling (all under lock) ----------------------------------------------------------------

    def fail(self, i: int, exc: BaseException, state: ResultState, now: float) -> None:
        """Under lock: node ``i`` ends ``state`` with ``exc``."""
        wr = self.results[i]
        if state is _EXCEPTION and not isinstance(exc, TaskflowError):
            _note(exc, f"taskflow: raised by node {self.names[i]!r} of flow {self.flow_id}")
        wr.exception = exc
        wr.finished_at = now
        wr.state = state
        self.move(i, TERMINAL)
        if self.economy.gathered:  # a batched node ended before its gate took its batch along
            self.economy.regather(i)

    def mark_settled(self, i: int) -> bool:
        """Under lock: move node ``i`` to SETTLED (its hook returned, its sons were updated) and
        count it off ``pending``. Returns True when the run must finish now."""
        code = self.code
        if code[i] == TERMINAL:
            code[i] = SETTLED  # TERMINAL -> SETTLED; any other move is checked by move()
        else:
            self.move(i, SETTLED)
        if self.closed:
            return i == self.keep and not self.finished
        self.pending -= 1
        return self.pending == 0

    def mark_abandoned(self, futs: list[Future[Any]]) -> None:
        """Report futures whose work taskflow no longer waits for (outside the lock)."""
        executors.mark_abandoned(self.executor, futs)

    def cancel(self, reason: str | None) -> None:
        """``ctx.cancel``: close the run with unsettled nodes CANCELLED (but the caller's)."""
        if self.plan.any_async and aio.cancel_from_loop(self, reason):
            return  # asked by an async task: its owner closes the run, off the loop thread
        keep = -1
        if current.__dict__.get("run") is self:
            keep = current.idx
        if self.observers and not self.closed:
            events.event(self.observers, -1, "cancelled", {
                "reason": reason or "cancelled", "by": self.names[keep] if keep >= 0 else None})
        closing.close(self, _CANCELLED, reason or "cancelled", keep)


if TYPE_CHECKING:
    # mypy checks that a run is what the gates of guards.py, remote.py and the collaborators
    # of the other engine modules take
    _guarded: type[guards.GuardedRun] = Run
    _remote: type[remote.RemoteHost] = Run
    _hooked: type[hooking.HookedRun] = Run
    _closing: type[closing.ClosingRun] = Run
    _settling: type[settling.SettlingRun] = Run
    _timed: type[deadlines.TimedRun] = Run
    _budgeted: type[retrying.BudgetedRun] = Run
    _watched: type[attempts.WatchedRun] = Run
    _detaching: type[detached.DetachingRun] = Run
    _viewed: type[inflight.ViewedRun] = Run
    _async: type[aio.AsyncRun] = Run
    _plain: type[plainloop.PlainLoopRun] = Run


def plan_pos(plan: Plan, node: Any) -> int:
    """Index of a definition node in ``plan`` (FlowDefinitionError if it is not a son there)."""
    i = plan.pos.get(id(node))
    if i is not None and plan.nodes[i] is node:
        return i
    raise FlowDefinitionError(f"switch chose {node!r}, which is not in this flow")
