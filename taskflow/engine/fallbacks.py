"""Stand-ins: the value a node with ``fallback=`` (or ``stale_if_error=``) ends DEGRADED with.

A stand-in is user code (the fallback) or I/O (a cache read), so it is computed outside the
run's lock, by one of four threads, depending on who decides that the node failed:

- the node's own thread (``stand_in``, from ``Run.complete``): its attempt raised or timed out,
  or its gates decided a failure (``min_budget``, an open breaker, a father that failed:
  ``doom`` queues the son with that failure decided, and its worker computes the stand-in);
- the owner, for the node's own timeout, which the timer thread decides (``timeout_stand_in``);
- the closer, for the nodes the run's end finds unfinished (``defer_close`` under the lock,
  ``close_stand_ins`` outside it).

**Once per node.** Two of them may reach the same node: a worker computes the stand-in of a
node ``min_budget`` refused while the run's deadline passes, and the closer finds that node
still unfinished. Whoever reaches the node first *claims* its stand-in, under the run's lock,
in ``Guard.stand`` (a ``_Stand``), and is the only one to call the fallback. When the closer
finds it claimed, it does not compute another: ``close_stand_ins`` waits (on the run's lock,
released while waiting) until the claimer publishes its value, and writes that one. A claimer
that finds the run closed or the node settled before it claims drops its own (returns no
stand-in); the node's outcome is then the closer's. So the fallback runs at most once per node
and run, and a ``WorkResult`` never changes after the node settled.

Waiting never deadlocks: a claim is taken only by a thread that computes at once, so the
claimer is never queued behind the closer; and it holds no lock while it computes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from taskflow import clock
from taskflow.engine import sections
from taskflow.engine.guards import GuardedRun
from taskflow.engine.guards import guard_of as _guard
from taskflow.engine.guards import policy_of as _policy
from taskflow.engine.states import QUEUED, TERMINAL
from taskflow.errors import FallbackError, NodeTimeoutError, UpstreamFailedError
from taskflow.model.context import current
from taskflow.model.result import ResultState

__all__ = ["close_stand_ins", "defer_close", "doom", "end_timed_out", "stand_in",
           "timeout_stand_in"]

_DEFAULT = ResultState.DEFAULT
_DEGRADED = ResultState.DEGRADED
_EXCEPTION = ResultState.EXCEPTION


class _Stand:
    """One node's stand-in in one run: claimed once, then published once. Fields under the
    run's lock: ``got`` (``(error, (value, failed))`` once computed: ``failed`` is the
    FallbackError, or ``error`` itself when none was found), ``idle`` (a waiter's Condition)."""

    __slots__ = ("got", "idle")

    def __init__(self) -> None:
        self.got: Any = None
        self.idle: threading.Condition | None = None


def _claim(run: GuardedRun, i: int) -> tuple[_Stand | None, bool]:
    """Under the run's lock: ``(stand, True)`` when this thread has claimed node ``i``'s
    stand-in, ``(stand, False)`` when another thread did (wait for its value), ``(None,
    False)`` when the run closed or the node settled first."""
    if run.closed or run.results[i].state is not _DEFAULT:
        return None, False
    g = _guard(run, i)
    if g.stand is not None:
        return g.stand, False
    g.stand = stand = _Stand()
    return stand, True


def _publish(run: GuardedRun, stand: _Stand, got: Any) -> None:
    """The claimer computed its stand-in: a closer waiting for it may go on."""
    with run.lock:
        stand.got = got
        if stand.idle is not None:
            stand.idle.notify_all()


def stand_in(run: GuardedRun, i: int,
             error: BaseException) -> tuple[Any, BaseException | None, Any]:
    """``(value, error, degraded)`` for node ``i`` failing with ``error`` (its own thread, outside
    the lock): with a fallback, ``(its value, None, error)``, or ``(None, FallbackError, None)``
    when it raised; without one (or when another thread ends the node), ``(None, error, None)``."""
    pol = _policy(run, i)
    fallback = pol.fallback
    stale = pol.flight is not None and pol.flight.stale_if_error > 0
    if fallback is None and not stale:
        return None, error, None
    with run.lock:
        stand, mine = _claim(run, i)
        if stand is None:
            return None, error, None  # the run closed or the node settled: nobody reads it
        if not mine:  # the owner computes it (the node's own timeout): that one is the node's
            theirs, shared = _wait(run, stand)
            return _outcome(theirs, shared)
    got: tuple[Any, BaseException | None] = (None, error)
    try:
        if stale:  # ``stale_if_error``: a kept value comes before the fallback (as in RFC 5861)
            found, value = _stale_value(run, i, pol)
            if found:
                got = (value, None)
        if got[1] is not None and fallback is not None:
            try:
                got = (fallback.value(run.ctx, error), None)
            except FallbackError as exc:
                got = (None, exc)
    finally:
        _publish(run, stand, (error, got))
    return _outcome(error, got)


def _outcome(error: BaseException, got: tuple[Any, BaseException | None]
             ) -> tuple[Any, BaseException | None, Any]:
    """``stand_in``'s answer for a computed stand-in ``got``."""
    value, failed = got
    if failed is error:
        return None, error, None  # no stand-in found: the error stands
    if failed is not None:
        return None, failed, None
    return value, None, error


def _stale_value(run: GuardedRun, i: int, pol: Any) -> tuple[bool, Any]:
    """``(True, value)``: a value kept up to ``cache_ttl + stale_if_error`` for node ``i``'s
    key (outside the lock: the cache may do I/O)."""
    from taskflow.resilience.singleflight import share_key_of

    try:
        key = share_key_of(pol.share_key, run.ctx, run.plan.nodes[i].param, node=pol.name)
    except Exception:  # noqa: BLE001 - the key failed: no stale value, the error stands
        return False, None
    return pol.flight.stale_value(key)  # type: ignore[no-any-return]


def _compute(run: GuardedRun, i: int, error: BaseException) -> tuple[Any, BaseException | None]:
    """The fallback's ``(value, None)`` or ``(None, FallbackError)`` (a thread that may call
    user code, outside the lock)."""
    fallback = _policy(run, i).fallback
    cur = current
    prev = cur.__dict__.get("run"), cur.__dict__.get("idx")
    cur.run, cur.idx = run, i
    try:
        return run.cv.copy().run(fallback.value, run.ctx, error), None
    except FallbackError as exc:
        return None, exc
    finally:
        cur.run, cur.idx = prev


def _end(run: GuardedRun, i: int, error: BaseException, got: tuple[Any, BaseException | None],
         now: float) -> None:
    """Under the lock: node ``i`` ends DEGRADED with the stand-in, or EXCEPTION when the
    fallback raised."""
    value, failed = got
    if failed is not None:
        run.fail(i, failed, _EXCEPTION, now)
        return
    wr = run.results[i]
    wr.result = value
    wr.exception = error
    wr.finished_at = now
    wr.state = _DEGRADED
    run.move(i, TERMINAL)


_R = TypeVar("_R", bound=GuardedRun)


def timeout_stand_in(run: _R, i: int, timed_out: Callable[[_R, int, Any], None]) -> bool:
    """Timer thread, node ``i``'s own timeout passed: True when the owner takes over (it
    computes the fallback, then calls ``timed_out(run, i, stand_in)``: the engine's
    ``deadlines.node_timeout``)."""
    if _policy(run, i).fallback is None:
        return False
    run.post(_timeout_owner, run, i, timed_out)
    return True


def _timeout_owner(run: _R, i: int, timed_out: Callable[[_R, int, Any], None]) -> None:
    with run.lock:
        stand, mine = _claim(run, i)
    if not mine:  # the run closed, the node settled, or its own thread ends it with a stand-in
        return
    assert stand is not None
    plan = run.plan
    error = (sections.timeout_error(plan, i, run.t0, clock.now()) if plan.any_deadline
             else NodeTimeoutError(run.names[i], plan.timeout[i]))
    got: tuple[Any, BaseException | None] = (None, error)
    try:
        got = _compute(run, i, error)
    finally:
        _publish(run, stand, (error, got))
    timed_out(run, i, (error, got))


def end_timed_out(run: GuardedRun, i: int, stand: tuple[Any, Any], now: float) -> None:
    """Under the lock (``node_timeout``): end node ``i`` with the stand-in computed for it."""
    error, got = stand
    _end(run, i, error, got, now)


def defer_close(run: GuardedRun, i: int, state: ResultState, later: list[int]) -> bool:
    """Under the lock, the run closing: True when node ``i``'s TIMEOUT gets a stand-in instead
    (it leaves the live states now; ``close_stand_ins`` writes its outcome before any hook:
    the one another thread has claimed and computes, or one of its own)."""
    pol = run.plan.policy[i]
    if pol is None or pol.fallback is None or state is not ResultState.TIMEOUT:
        return False
    g = _guard(run, i)
    if g.stand is None:
        g.stand = _Stand()  # the closer's: nobody else computes it from now on
        later.append(i)
    else:
        later.append(~i)  # claimed by another thread: its value is the node's
    run.move(i, TERMINAL)
    return True


def close_stand_ins(run: GuardedRun, later: list[int]) -> None:
    """Outside the lock, on the closing thread: the stand-ins of ``defer_close``, computed here
    or, for a node whose stand-in another thread computes, waited for."""
    for j in later:
        if j >= 0:
            error: BaseException = NodeTimeoutError(run.names[j], run.budget, budget=True)
            got = _compute(run, j, error)
            i = j
        else:
            i = ~j
            with run.lock:
                error, got = _wait(run, _guard(run, i).stand)
        with run.lock:
            value, failed = got
            wr = run.results[i]
            wr.finished_at = clock.now()
            if failed is None:
                wr.result = value
                wr.exception = error
                wr.state = _DEGRADED
            elif failed is error:  # the claimer found no stand-in (no stale value): TIMEOUT
                wr.exception = error
                wr.state = (ResultState.TIMEOUT if isinstance(error, NodeTimeoutError)
                            else _EXCEPTION)
            else:
                wr.exception = failed
                wr.state = _EXCEPTION


def _wait(run: GuardedRun, stand: _Stand) -> tuple[BaseException, Any]:
    """Under the run's lock (released while waiting): ``stand``'s published value."""
    if stand.got is None:
        if stand.idle is None:
            stand.idle = threading.Condition(run.lock)
        idle = stand.idle
        idle.wait_for(lambda: stand.got is not None)
    return stand.got  # type: ignore[no-any-return]


def doom(run: GuardedRun, s: int, f: int, now: float) -> bool:
    """Under the lock, father ``f`` (the one to blame: ``settling.failed_father``) failed son
    ``s``: True when ``s`` has a fallback; it is queued with the failure decided, and its
    worker computes the stand-in."""
    pol = run.plan.policy[s]
    if pol is None or pol.fallback is None:
        return False
    err = UpstreamFailedError(run.names[s], run.names[f])
    err.__cause__ = run.results[f].exception
    g = _guard(run, s)
    g.outcome = (None, err)
    run.move(s, QUEUED)
    run.results[s].queued_at = now
    run.economy.enqueue(s)
    return True
