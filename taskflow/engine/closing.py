"""Closing and finishing a run, and the owner's wait.

Time: the run has one deadline (``t0 + budget``). ``start``'s caller waits until then
(``wait``) and closes the run: every unsettled node becomes TIMEOUT, queued futures are
cancelled, running ones are reported abandoned (``mark_abandoned``), the hooks owed run in the
caller, and it returns.

At the deadline (``expire``: the owner's wait timing out, the ``submit`` timer, or the thread
that finishes a node past it) or at ``ctx.cancel`` the run closes under its lock (``close``):
``claim_terminal_hooks``, ``end_unsettled`` (every node without an outcome TIMEOUT or CANCELLED,
and SETTLED), the ready queue emptied, ``take_work_futures``; outside the lock the running
attempts of those nodes are abandoned (``attempts.abandon``: their ``ctx.on_cancel`` callbacks
go to a coordinator thread, also when the timer closes the run), and ``close_rest`` cancels
and abandons that work, runs the owed hooks and ``finish`` makes the FlowResult. The timer
does not run hooks: it closes the run's state and posts ``close_rest`` to the owner; so does a
closer on the event loop thread that awaits a ``run_async`` run (the awaiting task cancelled,
a budget spent as the run begins: ``_on_its_loop``), whose owner is a coordinator thread: hooks
never run on that loop, and the run is closed (``ctx.cancelled``) when ``close`` returns.

Invariants: ``finished`` is set exactly once, after every claimed hook started (``finish``
runs the owed hooks and waits ``HOOK_GRACE`` for those running; it may skip ``run_owed`` on an
unlocked read of an empty ``owed``, as it tests ``owed`` again under the lock before it sets
``finished``); no hook starts after it; user
code, ``cancel`` and ``mark_abandoned`` are never called while holding the run's lock; a run
closed by a cancel can still be closed by the deadline (then the wait for ``keep`` ends);
one closer per end, decided under the lock: at the deadline the first of the caller, the timer,
a stream's consumer and a worker past it closes, the others return (``expired``); a stand-in
is computed once per node (``fallbacks.py``: the closer waits for one a worker computes).
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from queue import Empty, SimpleQueue
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import attempts, events, fallbacks, guards, inflight, inline, timer
from taskflow.engine import hooks as hooking
from taskflow.engine.economy import Economy
from taskflow.engine.states import INLINE, SETTLED, TERMINAL
from taskflow.errors import (
    NodeCancelledError,
    NodeTimeoutError,
    ResultNotAvailableError,
    UnknownNodeError,
)
from taskflow.model.context import current, detach_run
from taskflow.model.graph import PlanView, copy_node
from taskflow.model.result import FlowResult, ResultState, WorkResult

__all__ = ["HOOK_GRACE", "ClosingRun", "FinishedRun", "close", "expire", "expire_on_timer",
           "finish", "value_of", "wait"]

# how long finishing a run waits for hooks already started (they are meant to be quick); real
# time even under a fake clock (``clock.real_wait_for``): it only bounds a wait for threads
HOOK_GRACE = 0.05

_SUCCESS = ResultState.SUCCESS
_DEGRADED = ResultState.DEGRADED
_TIMEOUT = ResultState.TIMEOUT
_SKIPPED = ResultState.SKIPPED
_DEFAULT = ResultState.DEFAULT


class ClosingRun(guards.GuardedRun, attempts.WatchedRun, Protocol):
    """Exactly what closing, finishing and waiting use of a run (``run.Run`` satisfies it;
    ``run.py`` has mypy check that): what the gates and the hooks need, and more. Fixed at
    creation: ``mode``, ``debug``, ``t0``, ``inbox``. Under ``lock``: ``expired``, ``fans``,
    ``loop_futs``, ``remote_futs``, ``node_timers`` and the economy's fields; ``future``,
    ``run_timer`` and ``flow_result`` are written by the one thread that finishes the run."""

    mode: str
    debug: bool
    expired: bool
    aio_loop: Any
    fans: dict[int, Any]
    loop_futs: dict[int, Future[Any]]
    remote_futs: dict[int, Future[Any]]
    node_timers: dict[int, timer.Timer]
    run_timer: timer.Timer | None
    node_observers: tuple[events.RunObserver, ...]
    future: Future[FlowResult] | None
    inbox: SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] | None
    flow_result: FlowResult | None
    record: FinishedRun | None
    nodes: list[Any]

    @property
    def economy(self) -> Economy:
        """The run's loop economy."""

    def mark_abandoned(self, futs: list[Future[Any]]) -> None:
        """Report futures whose work taskflow no longer waits for (outside the lock)."""

    def run_nodes(self, i: int, token: int) -> None:
        """Run node ``i`` and the nodes popped after it (an inline drain)."""


def expire(run: ClosingRun) -> None:
    """The budget is spent: close the run with every unsettled node TIMEOUT."""
    close(run, _TIMEOUT, None)


def expire_on_timer(run: ClosingRun) -> None:
    """Timer thread (``submit`` runs): close the run's state, hand the rest to the owner."""
    close(run, _TIMEOUT, None, on_timer=True)


def close(run: ClosingRun, state: ResultState, reason: str | None, keep: int = -1,
          on_timer: bool = False) -> None:
    """Close the run: every node not terminal ends ``state``, outcome hooks not started yet
    are claimed (``owed``), queued work is cancelled and running work abandoned. The timer
    (``on_timer``) and ``run_async``'s loop thread hand the rest (the hooks, ``finish``) to
    the owner."""
    with run.lock:
        # one closer per way to end: the first at the deadline (the caller, the timer, a
        # stream's consumer, a worker past it) closes; a cancel may be followed by the
        # deadline, which ends only what the cancel left running (the node that cancelled)
        if run.finished or run.expired or (run.closed and state is not _TIMEOUT):
            return
        now = clock.now()
        if run.closed:
            keep = -1  # the budget ends the wait for the node that cancelled the run
        run.closed = run.economy.closed = True
        if state is _TIMEOUT:
            run.expired = True
        else:
            run.cancel_reason = reason
        run.keep = keep
        _claim_terminal_hooks(run)
        later: list[int] = []  # TIMEOUT nodes whose fallback stands in (close_rest)
        victims, fan_futs = _end_unsettled(run, state, reason, keep, now, later)
        run.economy.clear_ready()
        futs, running = _take_work_futures(run, keep)
        timers = list(run.node_timers.values())
        run.node_timers.clear()
        wait_keep = keep >= 0 and run.code[keep] != SETTLED
    if victims:  # their threads still in a task are listed (taskflow.observe.abandoned)
        inflight.gave_up(run, victims)
    if run.watch is not None:  # the victims' running attempts are abandoned
        attempts.abandon(run, victims)
    if on_timer or (run.aio_loop is not None and _on_its_loop(run)):
        run.post(close_rest, run, timers, running + fan_futs, futs, victims, wait_keep, later)
    else:
        close_rest(run, timers, running + fan_futs, futs, victims, wait_keep, later)


def _on_its_loop(run: ClosingRun) -> bool:
    """Whether this thread runs the event loop that awaits ``run`` (``run_async``), where no
    hook runs (asyncio is loaded: that loop exists)."""
    return bool(sys.modules["asyncio"]._get_running_loop() is run.aio_loop)


def _claim_terminal_hooks(run: ClosingRun) -> None:
    """Under lock, closing: nodes that ended before the close but whose outcome hook has not
    started are claimed (``owed``): the closer's side runs them."""
    plan, results, claimed = run.plan, run.results, run.claimed
    for i, c in enumerate(run.code):
        if c == TERMINAL and not claimed[i]:
            st = results[i].state
            if (plan.has_success[i] if st is _SUCCESS
                    else plan.has_fail[i] and st is not _SKIPPED):
                claimed[i] = 1
                run.owed.append(i)


def _end_unsettled(run: ClosingRun, state: ResultState, reason: str | None, keep: int,
                   now: float, later: list[int]) -> tuple[list[int], list[Future[Any]]]:
    """Under lock, closing: every node without an outcome but ``keep`` ends ``state`` and is
    SETTLED (a TIMEOUT with a fallback goes to ``later``: its stand-in is written outside
    the lock); their on_fail hooks are owed. Returns the nodes ended and the futures of the
    running items of the fan-outs among them (to report abandoned)."""
    plan, claimed = run.plan, run.claimed
    fan_futs: list[Future[Any]] = []
    victims = []
    for i, wr in enumerate(run.results):
        if wr.state is not _DEFAULT or i == keep:
            continue
        if state is _TIMEOUT:
            exc: BaseException = NodeTimeoutError(plan.names[i], run.budget, budget=True)
        else:
            exc = NodeCancelledError(plan.names[i], reason)
        fan = run.fans.pop(i, None)
        if fan is not None:
            # the partial fan-in (in-flight items missing); its running items are reported
            # abandoned with the run's own loops, after the lock
            wr.result, fan_running = fan.abort()
            fan_futs.extend(fan_running)
        if not (plan.any_policy and fallbacks.defer_close(run, i, state, later)):
            run.fail(i, exc, state, now)
        run.move(i, SETTLED)
        victims.append(i)
        if plan.has_fail[i] and not claimed[i]:
            claimed[i] = 1
            run.owed.append(i)
    return victims, fan_futs


def _take_work_futures(run: ClosingRun,
                       keep: int) -> tuple[list[Future[Any]], list[Future[Any]]]:
    """Under lock, closing: the futures to cancel (every loop's and remote attempt's) and
    those running a node other than ``keep`` (to report abandoned); remote attempts are
    forgotten."""
    futs = list(run.loop_futs.values())
    running = [run.loop_futs[t] for t, x in run.economy.loop_node.items()
               if x != keep and t in run.loop_futs]
    for x, f in run.remote_futs.items():
        if x != keep:
            futs.append(f)
            running.append(f)
    run.remote_futs.clear()
    return futs, running


def close_rest(run: ClosingRun, timers: list[timer.Timer], running: list[Future[Any]],
               futs: list[Future[Any]], victims: list[int], wait_keep: bool,
               later: list[int] | None = None) -> None:
    """Outside the lock: cancel and abandon work, run owed hooks, finish."""
    for t in timers:
        t.cancel()
    run.mark_abandoned([f for f in running if not f.done()])  # before cancel, for dask
    for f in futs:
        f.cancel()
    if run.guards:
        guards.release(run, victims)
    if later:
        fallbacks.close_stand_ins(run, later)
    for i in victims:
        hooking.log_outcome(run, i)
        if run.node_observers:
            events.node_settled(run.node_observers, i)
    hooking.run_owed(run)
    if not wait_keep:
        finish(run)


def finish(run: ClosingRun) -> None:
    """Make the FlowResult once, after every owed hook started, and hand it over."""
    mine = -1  # 1 if a hook of the run finishes it (read once, when hooks are running)
    eco = run.economy
    while True:
        if run.owed:  # read without the lock: the check under it below catches a late claim
            hooking.run_owed(run)
        with run.lock:
            if run.finished:
                return
            run.closed = eco.closed = True
            if run.hooks_running:  # hooks started: wait for them (but the one finishing it)
                if mine < 0:
                    mine = 1 if current.__dict__.get("hooking") is run else 0
                if run.hooks_running > mine:
                    idle = run.hooks_idle
                    if idle is None:
                        idle = run.hooks_idle = threading.Condition(run.lock)
                    clock.real_wait_for(idle, lambda: run.hooks_running <= mine,  # noqa: B023 - waited for here
                                        HOOK_GRACE)
            if run.owed:
                continue  # a closer claimed more while we waited: run them first
            run.finished = True
            inflight.leave(run)
            timers: list[timer.Timer] | None = None  # none armed: no bookkeeping
            if run.node_timers:
                timers = list(run.node_timers.values())
                run.node_timers.clear()
            watch = eco.stop() if eco.watch is not None else None  # an armed watchdog
            if watch is not None:
                timers = [*(timers or ()), watch]
            if run.fans:
                run.fans.clear()
            record = run.record = FinishedRun(run)
            nodes = run.nodes
            if nodes.count(None) != len(nodes):  # copies made: they now hold the record
                ref = weakref.ref(record)
                for n in nodes:
                    if n is not None:
                        n.__dict__["_run"] = ref
            break
    if run.run_timer is not None:
        run.run_timer.cancel()
        run.run_timer = None
    if timers:
        for t in timers:
            t.cancel()
    detach_run(run.ctx, run, record)
    _hand_over(run, FlowResult(record, clock.now() - run.t0))


def _hand_over(run: ClosingRun, result: FlowResult) -> None:
    """The run has finished: log it, tell the observers and give ``result`` to the owner's
    wait or to the ``submit`` Future (set once: the Future is forgotten first)."""
    if run.debug:
        run.log.debug("flow finished in {:.6f}s", result.elapsed)  # noqa: PLE1205 - loguru formats with {}
    if run.observers:
        events.run_ended(run.observers, result)
    inbox = run.inbox
    if inbox is not None:
        run.flow_result = result
        inbox.put(None)
    fut = run.future
    if fut is not None:
        run.future = None
        fut.set_result(result)


def wait(run: ClosingRun) -> FlowResult:
    """``start``'s caller: do the work handed over until the run finishes, closing it at the
    deadline. Under a fake clock the caller counts as taskflow work while it does so (it is idle
    only while it waits in the clock), so autojump never moves time under the caller's feet."""
    if clock.counting:
        clock.work_began()
        try:
            return _serve(run)
        finally:
            clock.work_ended()
    return _serve(run)


def _serve(run: ClosingRun) -> FlowResult:
    """The caller's loop of ``wait``."""
    inbox = run.inbox
    assert inbox is not None
    drains = run.mode is INLINE
    infinite = math.isinf(run.budget)
    while True:
        if drains:
            inline.drain(run)  # the caller runs the ready nodes itself
            if run.flow_result is not None:
                break  # finished while it drained: the wake-up it posted is not waited for
        if infinite:
            item = clock.get(inbox, None)
        else:
            left = run.deadline - clock.now()
            try:
                if left <= 0:
                    raise Empty
                item = clock.get(inbox, min(left, threading.TIMEOUT_MAX))
            except Empty:
                expire(run)
                infinite = True  # the result follows promptly
                continue
        if item is None:
            break
        fn, args = item
        fn(*args)
    result = run.flow_result
    assert result is not None
    run.flow_result = None
    return result


class FinishedRun(PlanView):
    """What remains of a finished run: what its ``FlowResult`` reads (``RunRecord``) and what
    its context answers (``ContextView``), with no reference back to the run. The result and
    the context keep this, not the run: its scheduling state (the loop economy, the join
    counters, the inbox, the lock's waiters, the per-node lists) is freed once no thread runs
    in it any more. Calling it returns itself (how a context holds it: ``TaskContext._run``).

    The run's node copies are this record's once it exists (their weak reference to their run
    is moved here under the run's lock, and copies made later are made so), so a kept result's
    nodes still walk their graph; ``lock`` is the run's, so the run and this record never make
    two copies of one node."""

    __slots__ = ("__weakref__", "budget", "cancel_reason", "data", "deadline", "detached_work",
                 "expired", "flow_id", "flow_name", "hook_errors", "lock", "names", "nodes",
                 "plan", "results", "t0", "watch")

    finished = True

    def __init__(self, run: ClosingRun) -> None:
        self.flow_id, self.flow_name, self.names = run.flow_id, run.flow_name, run.names
        self.t0, self.budget, self.deadline = run.t0, run.budget, run.deadline
        self.cancel_reason, self.expired = run.cancel_reason, run.expired
        self.plan, self.results, self.nodes = run.plan, run.results, run.nodes
        self.data, self.lock = run.data, run.lock
        self.hook_errors = run.hook_errors  # none is written once the run finished
        self.watch = run.watch  # a watch made later is set here too (``attempts.watch_of``)
        self.detached_work = run.detached_work  # made before the node settles: before now

    def __call__(self) -> FinishedRun:
        return self

    # -- RunRecord (what the FlowResult reads) ---------------------------------------------------

    def node(self, i: int) -> Any:
        """The run's copy of node ``i`` (made on first use); the graph questions are
        ``PlanView``'s."""
        n = self.nodes[i]
        if n is None:
            with self.lock:
                n = self.nodes[i]
                if n is None:
                    n = self.nodes[i] = copy_node(self.plan.nodes[i], weakref.ref(self),
                                                  self.results[i], i)
        return n

    # -- ContextView (what a context of the run answers) -----------------------------------------

    def cancelled_for_caller(self) -> bool:
        return True

    def caller_name(self) -> str:
        return "?"

    def value_of(self, name: str) -> Any:
        return value_of(self.results, self.plan.index, self.flow_id, name)

    def cancel(self, reason: str | None) -> None:
        """The run is over: nothing to cancel."""

    def asking(self) -> None:
        """Nobody asking through a finished run's record is one of its attempts (an attempt
        it abandoned still sees the run itself)."""
        return None


def value_of(results: list[WorkResult[Any]], index: dict[str, int], flow_id: str,
             name: str) -> Any:
    """``ctx.result_of(name)``: the value of node ``name`` if it succeeded."""
    try:
        wr = results[index[name]]
    except KeyError:
        raise UnknownNodeError(name, index, f"no node named {name!r} in flow {flow_id}") from None
    st = wr.state
    if st is not _SUCCESS and st is not _DEGRADED:
        raise ResultNotAvailableError(name, st.name)
    return wr.result
