"""Settling a run's sons: joins, skips, failing fast, cancelling fathers nobody needs.

When node ``i`` is terminal (its outcome recorded and its outcome hook returned), the thread
that holds the run's lock calls ``settle_sons(run, i, hooks, now)``: each waiting son's join
counters move and ``joins.decide`` says whether it fires (QUEUED, appended to ``ready``), waits,
is skipped or fails fast. Failure of a node settles its waiting sons at once (fail fast, cause
chained, the father's kind of failure); skipped fathers are ignored by joins; a son whose fathers
all skipped is skipped. All that settles without running is handled in the same critical section
with an explicit work list, and appended to ``hooks``: outside the lock ``after_settle`` logs
those nodes, runs their on_fail hooks, then settles their sons and marks them SETTLED.

A father cancelled because nobody needs it any more has its running attempt abandoned
(``attempts.abandon``, under the lock: it only hands that attempt's ``ctx.on_cancel`` callbacks
to a coordinator thread).

Invariants: everything here but ``after_settle`` runs under the run's lock and never calls user
code or ``submit`` (what must happen outside it is ``post``-ed to the owner); a son's join is
decided once (only WAITING sons move); a node's on_fail hook runs before its sons move.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import attempts, events, fallbacks, guards, inflight, timer
from taskflow.engine import hooks as hooking
from taskflow.engine.economy import FAST_TASK, Economy
from taskflow.engine.states import QUEUED, SETTLED, TERMINAL, WAITING
from taskflow.errors import NodeCancelledError, UpstreamFailedError
from taskflow.model import joins
from taskflow.model.result import ResultState, WorkResult

__all__ = ["SettlingRun", "after_settle", "failed_father", "other_join", "settle_sons",
           "succeeded"]

_SUCCESS = ResultState.SUCCESS
_DEGRADED = ResultState.DEGRADED
_EXCEPTION = ResultState.EXCEPTION
_TIMEOUT = ResultState.TIMEOUT
_CANCELLED = ResultState.CANCELLED
_SKIPPED = ResultState.SKIPPED
_FAILED_STATES = (ResultState.EXCEPTION, ResultState.TIMEOUT, ResultState.CANCELLED)
_ALL = joins.ALL
_WAIT, _FIRE, _SKIP = joins.WAIT, joins.FIRE, joins.SKIP
_decide = joins.decide


class SettlingRun(guards.GuardedRun, attempts.WatchedRun, Protocol):
    """Exactly what settling uses of a run (``run.Run`` satisfies it; ``run.py`` has mypy
    check that): what the gates and the hooks need, and the join state. Every field here is
    guarded by ``lock`` but ``debug`` and ``node_observers`` (fixed before any node is
    queued)."""

    debug: bool
    node_observers: tuple[events.RunObserver, ...]
    left: list[int]
    nsucc: list[int]
    nskip: list[int]
    ready: deque[int]
    chosen: dict[int, frozenset[int]]
    fans: dict[int, Any]
    node_timers: dict[int, timer.Timer]

    @property
    def economy(self) -> Economy:
        """The run's loop economy."""

    def mark_abandoned(self, futs: list[Future[Any]]) -> None:
        """Report futures whose work taskflow no longer waits for (outside the lock)."""

    def mark_settled(self, i: int) -> bool:
        """Under lock: node ``i`` is SETTLED; True when the run must finish now."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread."""


def settle_sons(run: SettlingRun, i: int, hooks: list[int], now: float) -> None:
    """Under lock: node ``i`` is terminal; update its sons' joins, transitively.

    Sons that fire go to ``ready``; sons that fail fast or are skipped become terminal here
    and are appended to ``hooks`` (their on_fail hook and settlement happen after the lock).
    """
    plan = run.plan
    if run.results[i].state is _SUCCESS and not plan.routes[i]:
        # the common case, without the work list: a success can only fire sons or leave
        # them waiting (the same decide() rule as below)
        succeeded(run, plan.sons[i], hooks, now, run.code, run.left, run.nsucc, plan.join_kind,
                  plan.est, run.results, run.ready, run.economy)
        return
    _settle_through(run, i, hooks, now)


def succeeded(run: SettlingRun, sons: tuple[int, ...], hooks: list[int], now: float,
              code: list[int], left: list[int], nsucc: list[int], kinds: Sequence[int],
              est: list[float], results: list[WorkResult[Any]], ready: deque[int],
              eco: Economy) -> None:
    """Under lock: a father of ``sons`` succeeded (its state written, no switch): each WAITING
    son counts it and is queued when its join fires (``other_join`` for a join not ALL). The
    run's and plan's fields come as arguments: a loop's step (``plainloop``) has them bound."""
    for s in sons:
        if code[s] != WAITING:
            continue
        n = left[s] - 1
        left[s] = n
        nsucc[s] += 1
        if kinds[s] != _ALL:
            other_join(run, s, n, hooks, now)
            continue
        # decide() for ALL with no failure: WAIT while fathers are left, else FIRE
        # (not SKIP: this father succeeded, so not every father was skipped)
        if n:
            continue
        code[s] = QUEUED  # WAITING -> QUEUED, checked at the top of the loop
        results[s].queued_at = now
        e = est[s]  # eco.enqueue(s), inlined on the hot path
        if e < 0.0 or e >= FAST_TASK:
            eco.nslow += 1
            eco.slowq[s] = 1
        ready.append(s)
        eco.dirty = True


def other_join(run: SettlingRun, s: int, n: int, hooks: list[int], now: float) -> None:
    """Under lock: a father of WAITING son ``s``, whose join is not ALL, succeeded (``left[s]``
    is ``n`` and ``nsucc[s]`` counts it already): ``s`` is queued if its join fires, and its
    fathers nobody needs any more are cancelled if it fired early (``plainloop`` inlines the
    ALL joins of ``settle_sons`` and calls this for the others)."""
    plan = run.plan
    if _decide(plan.join_kind[s], plan.join_k[s], plan.nfathers[s], n, run.nsucc[s],
               run.nskip[s], 0) != _FIRE:
        return
    run.code[s] = QUEUED  # WAITING -> QUEUED: the caller tested it
    run.results[s].queued_at = now
    run.economy.enqueue(s)
    if n:
        _cancel_unneeded(run, s, hooks, now)


def _settle_through(run: SettlingRun, i: int, hooks: list[int], now: float) -> None:
    """Under lock: ``settle_sons`` for any outcome of node ``i`` (a switch's choice, a
    skip, a failure, a stand-in), with an explicit work list: a son that ends without
    running (skipped, failed fast) settles its own sons in turn, unless its on_fail hook
    must run first (then ``after_settle`` does)."""
    plan = run.plan
    code, left, nsucc, nskip = run.code, run.left, run.nsucc, run.nskip
    results = run.results
    kinds, join_k, nfathers = plan.join_kind, plan.join_k, plan.nfathers
    sons_of = plan.sons
    work = [i]
    while work:
        f = work.pop()
        st = results[f].state
        succeeded = st is _SUCCESS or st is _DEGRADED
        route = run.chosen.get(f) if succeeded and plan.routes[f] else None
        for s in sons_of[f]:
            if code[s] != WAITING:
                continue
            left[s] -= 1
            nfail = 0
            if succeeded:
                if route is not None and s not in route:
                    # a case the switch did not choose: skipped, whatever else feeds it
                    _skip(run, s, now)
                    hooks.append(s)
                    work.append(s)
                    continue
                nsucc[s] += 1
                if left[s] and kinds[s] == _ALL:
                    continue  # decide() answers WAIT: skip the call on the hot path
            elif st is _SKIPPED:
                nskip[s] += 1
            elif not (kinds[s] == _ALL and f in plan.optional[s]):
                nfail = 1
            decision = _decide(kinds[s], join_k[s], nfathers[s], left[s], nsucc[s],
                               nskip[s], nfail)
            if decision != _WAIT:
                _apply_join(run, s, f, decision, hooks, work, now)


def _apply_join(run: SettlingRun, s: int, f: int, decision: int, hooks: list[int],
                work: list[int], now: float) -> None:
    """Under lock: son ``s``'s join decided (FIRE, SKIP or FAIL) when father ``f`` ended.
    A fired son is queued (its unneeded fathers cancelled if it fired early); a skipped or
    failed one is terminal, appended to ``hooks``, and to ``work`` when its own sons may
    settle now."""
    if decision == _FIRE:
        run.move(s, QUEUED)
        run.results[s].queued_at = now
        run.economy.enqueue(s)
        if run.left[s]:
            _cancel_unneeded(run, s, hooks, now)
    elif decision == _SKIP:
        _skip(run, s, now)
        hooks.append(s)
        work.append(s)
    else:
        blamed = failed_father(run, s, f)
        if run.plan.any_policy and fallbacks.doom(run, s, blamed, now):
            return  # it has a fallback: queued to end DEGRADED
        _fail_fast(run, s, blamed, now)
        hooks.append(s)
        if not run.plan.has_fail[s]:
            work.append(s)  # else its sons are settled after its on_fail hook


def _skip(run: SettlingRun, s: int, now: float) -> None:
    """Under lock: node ``s`` is SKIPPED."""
    wr = run.results[s]
    wr.state = _SKIPPED
    wr.finished_at = now
    run.move(s, TERMINAL)


def failed_father(run: SettlingRun, s: int, f: int) -> int:
    """Under lock: the father to blame for ``s`` failing: ``f`` if it failed, else the
    first father of ``s`` that did (``f`` may be a skipped father that ended the wait)."""
    results = run.results
    if results[f].state in _FAILED_STATES:
        return f
    for x in run.plan.fathers[s]:
        if results[x].state in _FAILED_STATES:
            return x
    return f


def _fail_fast(run: SettlingRun, s: int, f: int, now: float) -> None:
    """Under lock: son ``s`` fails without running because of father ``f``."""
    fwr = run.results[f]
    err = UpstreamFailedError(run.names[s], run.names[f])
    err.__cause__ = fwr.exception
    st = fwr.state
    kind = st if st in (_TIMEOUT, _CANCELLED) else _EXCEPTION
    run.fail(s, err, kind, now)


def _cancel_unneeded(run: SettlingRun, s: int, hooks: list[int], now: float) -> None:
    """Under lock: ``s`` fired early; cancel its unfinished fathers nobody else waits for."""
    plan = run.plan
    code = run.code
    work = [s]
    while work:
        x = work.pop()
        for p in plan.fathers[x]:
            if code[p] == TERMINAL or code[p] == SETTLED:  # (PARKED sorts above them)
                continue
            if any(code[q] == WAITING for q in plan.sons[p]):
                continue
            fan = run.fans.pop(p, None)
            if fan is not None:
                run.results[p].result, running = fan.abort()  # stop pulling; keep its items
                if running:
                    run.post(run.mark_abandoned, running)
            run.fail(p, NodeCancelledError(
                plan.names[p], f"join of {plan.names[s]!r} no longer needs it"), _CANCELLED,
                now)
            hooks.append(p)
            t = run.node_timers.pop(p, None)
            if t is not None:
                t.cancel()
            if p in run.guards:  # its slot, token or shared-call place goes back
                run.post(guards.release, run, (p,), False)
            inflight.gave_up(run, (p,))  # its thread, if still in the task, is listed
            if run.watch is not None:  # its running attempt is abandoned (lock order: run's
                attempts.abandon(run, (p,))  # then the watch's; callbacks: a coordinator)
            work.append(p)  # its own fathers may be unneeded now


def after_settle(run: SettlingRun, hooks: list[int], k: int) -> bool:
    """Outside the lock: run on_fail hooks of nodes settled without running, settle them,
    start loops. Returns True if the run is finished."""
    plan = run.plan
    fin = False
    j = 0
    while j < len(hooks):  # grows: settling a node after its hook may settle more
        s = hooks[j]
        j += 1
        wr = run.results[s]
        deferred = plan.has_fail[s] and wr.state is not _SKIPPED
        if run.debug or wr.state is not _SKIPPED:
            hooking.log_outcome(run, s)
        if run.node_observers:
            events.node_settled(run.node_observers, s)
        if deferred:
            hooking.hook(run, run.node(s).on_fail, s, wr.attempts, True)
        with run.lock:
            if deferred:  # its hook has returned: now its sons may move
                settle_sons(run, s, hooks, clock.now())
            if run.code[s] == TERMINAL:
                fin = run.mark_settled(s) or fin
            k += run.economy.reserve()
    if k:
        run.dispatch(k)
    return fin
