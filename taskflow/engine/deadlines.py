"""A run's clocks: each node's own timeout, its deadline from the run's start, and what a node
that ends past the run's deadline does.

A node with ``timeout=`` has it armed at its first attempt (``arm_node_timeout``: a timer
entry in ``run.node_timers``, unless the run's deadline or the node's own deadline comes
first). A node with a deadline from the run's start (``deadline=``, a ``Section``) has its
entry armed when the run begins (``sections.arm``), and it fires the same way, for a node
still WAITING for its fathers too. When it fires,
``node_timeout`` runs on the timer thread: under the run's lock it ends the node TIMEOUT (or
DEGRADED with a fallback's stand-in, computed first on the owner's thread), takes the future of
the work it abandons and settles its sons; outside the lock it abandons the node's running
attempt (``attempts.abandon`` hands its ``ctx.on_cancel`` callbacks to a coordinator thread,
never running them here), then ``post``-s ``after_timeout`` to the owner, which
reports that work abandoned, gives back the node's resilience places, runs the hook and
finishes the run if it was the last node. A fan-out is sealed instead (its policy decides).

Whichever thread finishes a node compares the clock with the node's own deadline
(``own_timeout_passed``: the node is TIMEOUT and its value is dropped; its deadline from the
run's start counts the same) and with the run's
(``past_deadline``: the run closes, ``closing.expire``).

Invariants: the timer thread never calls user code or ``submit``; a node times out at most
once (only a node still WAITING, QUEUED, RUNNING, BACKOFF or PARKED in an open run moves: a
WAITING node only ever has a deadline's entry, a node's own timeout is armed when it starts;
a node holds at most one entry, the earliest of the two); the timer
entry holds the run strongly only until the node ends or the run finishes (both drop it).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import (
    attempts,
    closing,
    events,
    fallbacks,
    guards,
    inflight,
    sections,
    settling,
    timer,
)
from taskflow.engine.states import BACKOFF, PARKED, QUEUED, REMOTE, RUNNING, WAITING
from taskflow.errors import NodeTimeoutError
from taskflow.model.result import ResultState, WorkResult

__all__ = ["TimedRun", "after_timeout", "arm_node_timeout", "node_timeout",
           "own_timeout_passed", "past_deadline"]

_TIMEOUT = ResultState.TIMEOUT


class TimedRun(closing.ClosingRun, settling.SettlingRun, Protocol):
    """Exactly what the clocks use of a run (``run.Run`` satisfies it; ``run.py`` has mypy
    check that): what closing and settling need, and the late outcome."""

    def late(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Drop node ``i``'s outcome (it was settled without it); the loop's next node."""


def arm_node_timeout(run: TimedRun, i: int, started: float) -> None:
    """Schedule node ``i``'s own timeout (unless the budget or its deadline ends first: then
    the entry ``sections.arm`` made stays)."""
    plan = run.plan
    t = plan.timeout[i]
    assert t is not None
    when = started + t
    if when < sections.limit(plan, i, run.t0, run.deadline):
        entry = timer.schedule(when, node_timeout, run, i)
        with run.lock:
            old = run.node_timers.get(i)
            run.node_timers[i] = entry
        if old is not None:
            old.cancel()


def node_timeout(run: TimedRun, i: int, stand_in: Any = None) -> None:
    """Timer thread: node ``i``'s own timeout passed. Moves state only; the hook, the sons
    and the abandoned work are handed to the owner. (A node with a fallback: the owner
    computes its ``stand_in`` first and calls this again.)"""
    plan = run.plan
    if stand_in is None and plan.any_policy and plan.policy[i] is not None and (
            fallbacks.timeout_stand_in(run, i, node_timeout)):
        return
    fan = run.fans.get(i)
    if fan is not None:
        sealed = fan.seal(True)  # in-flight items are missing from now on
        if sealed is not None:
            run.post(fan.deliver, *sealed)
        return
    abandoned: Future[Any] | None = None
    with run.lock:
        if run.closed or run.code[i] not in (WAITING, QUEUED, RUNNING, BACKOFF, PARKED):
            return
        now = clock.now()
        running = run.code[i] == RUNNING
        if stand_in is not None:
            fallbacks.end_timed_out(run, i, stand_in, now)
        elif plan.any_deadline:
            run.fail(i, sections.timeout_error(plan, i, run.t0, now), _TIMEOUT, now)
        else:
            run.fail(i, NodeTimeoutError(plan.names[i], plan.timeout[i]), _TIMEOUT, now)
        run.node_timers.pop(i, None)
        if running and run.mode is REMOTE:
            abandoned = run.remote_futs.pop(i, None)
        elif running:
            token = run.economy.abandon_loop_of(i)
            if token is not None:
                abandoned = run.loop_futs.get(token)
        hooks = [i]
        if not plan.has_fail[i]:
            settling.settle_sons(run, i, hooks, now)  # else after its on_fail hook
        k = run.economy.reserve()
    if running:  # its thread, still in the task, is listed (taskflow.observe.abandoned)
        inflight.gave_up(run, (i,))
    if run.watch is not None:  # its running attempt is abandoned (callbacks: a coordinator)
        attempts.abandon(run, (i,))
    run.post(after_timeout, run, hooks, k, abandoned)


def after_timeout(run: TimedRun, hooks: list[int], k: int,
                  abandoned: Future[Any] | None) -> None:
    """Owner thread: finish what a node timeout started."""
    if abandoned is not None and not abandoned.done():
        run.mark_abandoned([abandoned])
    if run.guards:
        guards.release(run, hooks[:1])
    if settling.after_settle(run, hooks, k):
        closing.finish(run)


def past_deadline(run: TimedRun, i: int, token: int, value: Any,
                  error: BaseException | None) -> int:
    """The budget ran out while node ``i`` ran: its outcome does not count, and the run
    closes; returns the loop's next node."""
    closing.expire(run)
    if run.node_observers:
        events.attempt_ended(run.node_observers, i, run.results[i].attempts, error,
                             events.LATE)
    return run.late(i, token, value, error)


def own_timeout_passed(run: TimedRun, i: int, wr: WorkResult[Any], now: float,
                       error: BaseException | None) -> bool:
    """Whether node ``i``'s own deadline passed while it ran (and its error does not say so
    already; a fan-out's policy decides that itself)."""
    plan = run.plan
    t = plan.timeout[i]
    return ((t is not None and wr.started_at is not None and now >= wr.started_at + t
             or sections.passed(plan, i, run.t0, now))
            and not plan.fanout[i] and not isinstance(error, NodeTimeoutError))
