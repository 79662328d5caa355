"""Request-path resilience at run time: what a run does for a node with a ``NodePolicy``.

Nodes without resilience options never get here: the plan says ``policy[i] is None`` and the
engine tests ``plan.any_policy`` first. For the others, ``run.py`` and ``remote.py`` call:

``admit(run, i)`` (the thread about to start an attempt: a worker loop, the inline caller, or
  the owner for remote executors; the node is RUNNING, the run's lock is not held). It passes
  the attempt through the gates, in this order, and answers at once:

  1. an outcome already decided (``DONE``): a failed father for a node with a fallback
     (``doom``), a shared call that resolved, a cached value, a batch call's answer;
  1b. ``batch`` (``batching.gate``, first: it takes the nodes its node was popped with): a
     seat in a call of the batch -> ``PARKED`` until the answer, or ``DONE`` with it (a
     batched node never goes on to an attempt of its own);
  2. ``min_budget``: too little budget left -> ``DONE`` with a TIMEOUT error;
  3. ``share_key`` (single flight): the first run of a key leads; another waits for the
     leader's outcome (``PARKED``) or takes a cached value (``DONE``; a stale one within
     ``stale_for`` also starts one detached refresh, which the run never waits for);
  4. ``breaker.allow()``: open -> ``DONE`` with ``CircuitOpenError``;
  5. ``rate_limit.reserve(deadline)``: no token before the run's deadline -> ``DONE`` (TIMEOUT);
     a token later -> ``PARKED`` until then (a timer entry);
  6. ``bulkhead.acquire(on_grant, deadline)``: a slot -> go on; a ticket -> ``PARKED``; full ->
     ``DONE`` with ``BulkheadFullError``;
  7. ``GO``: the breaker permit is checked again (``breaker.renew``: a node that waited may
     hold a permit from before the breaker moved; open now -> ``DONE``), then the attempt
     starts (with ``hedge``, a race whose timer may start duplicates).

  A PARKED node holds no worker: the loop goes on with its next node. Whatever it waits for
  arrives on some other thread (a slot released by another run's worker, the timer, the
  thread that resolved a shared call); that callback only stores what arrived and, under the
  run's lock, moves the node PARKED -> QUEUED and hands ``dispatch`` to the run's owner with
  ``run.post``. It never calls user code or ``submit``. The node then comes back to ``admit``,
  which goes on from the gate where it stopped; the gates it passed before (``min_budget``
  included) are asked again, those holding something for the attempt answer GO at once.

An async node (``aio.py``) passes the same gates; its attempt is an asyncio task, its
duplicates too (``Guard.launch``), and whatever its attempts hold is given back on a
coordinator thread, never on the event loop's.

``attempt_done(run, i, ok)`` after each attempt: gives back its slot, counts its outcome in the
  breaker, records its duration (for ``Hedge(after="p95")``) and settles the hedge race (False:
  this attempt lost the race, drop its outcome).

``finish(run, i, value, error)`` when the node's outcome is final (``complete``, before the
  run's deadline is checked): a single-flight leader resolves its shared call, even when its
  own run has given up, so the runs still waiting get the value.

Stand-ins (a fallback's value, or a stale one, for a node that failed) are ``fallbacks.py``'s:
  computed once per node end, by whoever settles the node first.

``release(run, nodes)`` (outside the lock) when nodes ended without their attempt returning (node
  timeout, the run's deadline, a join that no longer needs them): everything they hold is given
  back; a running attempt's slot stays held until it returns (``permit.abandon()``), and a
  timed-out one counts as failed in the breaker at once.

The one rule: every resource has exactly one owner
==================================================
What a gate takes — a bulkhead slot (``Permit``) or place in its queue (``Ticket``), a
rate-limit ``Reservation``, a ``BreakerPermit``, a place in a single flight (``Member``; a
leader's is the duty to resolve the call), a seat in a batch's call (``Guard.seat``,
``batching.py``), a retry-budget token (``Guard.retry``, ``retrying.py``) — has exactly one owner at any time, and its owner
gives it back on every way the node ends: success, failure, timeout, ``min_budget``, cancel,
the run closed before, during or after admission, a hedge that lost. The owners, in order:

1. **the thread that took it** (a gate, a hedge launch, the callback that got a granted slot),
   from the primitive's answer until it hands it to the node's ``Guard`` *under the run's
   lock, after checking that the node is still alive* (``_alive``: the run is open and the
   node has no outcome). A refused handover leaves it with that thread, which gives it back at
   once; the admission then ends ``DONE`` with an outcome nobody records (``_ended``: the
   node already settled without it), and never moves a settled node to PARKED;
2. **the node's Guard**, holding what the next attempt needs (``ticket``, ``reservation``,
   ``bpermit``, ``permit``) and the node's ``member``, until one of three takes it back, each
   under the run's lock: ``_go`` (the attempt starts: the slot and the breaker permit move to
   its ``Attempt``, the reservation and the ticket are used up), ``_drop_next`` (every
   ``DONE`` of ``admit``: the attempt will not happen) or ``release`` (the node ended);
3. **the Attempt** (one per started attempt: the first, a retry, each hedge), holding its slot
   and its breaker permit until it returns (``attempt_done``, ``_hedge_returned``), where
   ``_give_back_attempt`` is the one place both are given back. A node that times out while
   attempts run takes their breaker permits from them (``release``) and counts them failed
   at once: a hanging backend opens the breaker, and its trial permit is not held for ever.

The lead of a shared call stays with the Guard while an attempt may still resolve it: the
node's final outcome resolves it (``finish``, also when an abandoned attempt returns late); a
node that ends with no attempt in flight withdraws (``member.withdraw()``: a leader resigns so
a waiting run may lead, a waiter leaves). ``min_budget`` refusing an attempt after a wait
withdraws too: the waiters' budgets are their own. Other refusals (breaker open, bulkhead
full, no token in the budget) are the shared call's outcome and reach every waiter.

Giving back always happens outside the run's lock: releasing a slot runs the next waiter's
grant callback on this thread, and that callback takes *its* run's lock.

Per node the run keeps a ``Guard`` in ``run.guards`` (created on first use, by the node's
own thread). Under the run's lock: ``wait``, ``outcome``, the resources it holds (``ticket``,
``reservation``, ``bpermit``, ``permit``, ``member``, ``token_timer``), ``current`` and
``hedges`` and the fields of their Attempts. ``shared``, ``race`` and ``hedge_timer`` are
written by the thread that runs the node's gates or attempt (``hedge_timer`` also by the
owner's hedge launches).
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from functools import partial
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import batching, events, timer
from taskflow.engine.states import (
    ADMIT_DONE,
    ADMIT_GO,
    ADMIT_PARKED,
    NO_LOOP,
    QUEUED,
    RUNNING,
)
from taskflow.engine.states import PARKED as PARKED_STATE
from taskflow.errors import (
    BulkheadFullError,
    CircuitOpenError,
    NodeCancelledError,
    NodeTimeoutError,
)
from taskflow.model.context import TaskContext, current
from taskflow.model.graph import Plan
from taskflow.model.result import ResultState, WorkResult

__all__ = [
    "DONE",
    "GO",
    "PARKED",
    "Attempt",
    "Guard",
    "GuardedRun",
    "ReadyCounter",
    "admit",
    "attempt_done",
    "finish",
    "guard_of",
    "hedge_returned",
    "policy_of",
    "release",
    "take_outcome",
]

GO, PARKED, DONE = ADMIT_GO, ADMIT_PARKED, ADMIT_DONE
# inside admit only: DONE, and the node also withdraws from its single flight
_QUIT = 3
# what a parked node waits for (``Guard.wait``)
_SHARE, _TOKEN, _SLOT = 1, 2, 3

_DEFAULT = ResultState.DEFAULT
_DEGRADED = ResultState.DEGRADED
_EXCEPTION = ResultState.EXCEPTION


class Attempt:
    """One started attempt of a node (the first, a retry or a hedge): from ``_go`` (or a hedge's
    launch) until it returns it owns its bulkhead slot and its breaker permit. Its fields are
    guarded by the run's lock."""

    __slots__ = ("bpermit", "n", "permit", "started")

    def __init__(self, permit: Any, bpermit: Any, started: float, n: int = 0) -> None:
        self.permit = permit  # its bulkhead slot (None: no bulkhead)
        self.bpermit = bpermit  # its breaker permit (None: no breaker, or already counted)
        self.started = started
        self.n = n  # its number in the hedge race


class Guard:
    """One node's resilience bookkeeping in one run (see the module: who owns what)."""

    __slots__ = ("bpermit", "current", "hedge_timer", "hedges", "launch", "member", "outcome",
                 "permit", "race", "reservation", "retry", "seat", "shared", "stand", "ticket",
                 "token_timer", "wait")

    def __init__(self) -> None:
        self.wait = 0  # what the node is parked for (0: nothing)
        self.outcome: tuple[Any, BaseException | None] | None = None  # decided
        self.member: Any = None  # its place in the single flight
        self.shared = False  # its value came from another run's call or the cache
        # what the next attempt holds before it starts:
        self.bpermit: Any = None  # breaker permit
        self.reservation: Any = None  # rate-limit token
        self.ticket: Any = None  # place in the bulkhead's queue
        self.permit: Any = None  # bulkhead slot
        self.token_timer: timer.Timer | None = None
        self.current: Attempt | None = None  # the loop's attempt in flight
        self.hedges: list[Attempt] = []  # duplicates in flight
        self.race: Any = None  # HedgeRace of the current attempt
        self.hedge_timer: timer.Timer | None = None
        self.seat: Any = None  # its seat in a batch's call (``batching``)
        self.retry: Any = None  # a retry-budget token for its next attempt (``retrying``)
        self.stand: Any = None  # who computes its stand-in, and its value (``fallbacks``)
        # how a hedged duplicate starts, ``launch(run, i, race, attempt)`` (None: submitted to
        # the executor; an async node's is a task on its event loop, ``aio.py``)
        self.launch: Callable[[Any, int, Any, Attempt], None] | None = None


class ReadyCounter(batching.GatheringEconomy, Protocol):
    """What the gates need of the run's loop economy (``economy.Economy``): a node that comes
    back from PARKED is queued and counted, and loops are reserved for it; a batched node
    takes the ready nodes of its batch along."""

    def enqueue(self, i: int) -> None:
        """Under lock: append QUEUED node ``i`` to the ready nodes."""

    def reserve(self, nxt: int = -1) -> int:
        """Under lock: how many new loops to start for the ready nodes (counted)."""


class GuardedRun(batching.BatchedRun, Protocol):
    """Exactly what the gates, races, stand-ins and releases of this module use of a run
    (``run.Run`` satisfies it; ``run.py`` has mypy check that). Fixed at creation and read
    without the lock: ``plan``, ``names``, ``executor``, ``budget``, ``deadline``, ``ctx``,
    ``cv``, ``observers``, ``lock``, ``economy``. Under ``lock``: ``closed``, ``code``,
    ``guards`` (an entry is added by the node's own thread), the results' states."""

    plan: Plan
    names: tuple[str, ...]
    executor: Executor
    budget: float
    deadline: float
    ctx: TaskContext
    cv: contextvars.Context
    observers: tuple[events.RunObserver, ...]
    lock: threading.Lock
    closed: bool
    code: list[int]
    results: list[WorkResult[Any]]
    guards: dict[int, Guard]

    @property
    def economy(self) -> ReadyCounter:
        """The run's loop economy (read only here)."""

    def move(self, i: int, new: int) -> None:
        """Under lock: move node ``i`` to state ``new`` (checked against ``LEGAL_MOVES``)."""

    def fail(self, i: int, exc: BaseException, state: ResultState, now: float) -> None:
        """Under lock: node ``i`` ends ``state`` with ``exc``."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread."""

    def dispatch(self, k: int) -> None:
        """Outside the lock, on a thread that may submit: start ``k`` reserved loops."""

    def node(self, i: int) -> Any:
        """The run's copy of node ``i``."""

    def start_refresh(self, i: int, limit: float, finish: Callable[[Any, Any], None]) -> None:
        """Refresh node ``i``'s cached value as detached work (``detached.refresh``)."""

    def route(self, i: int, node: Any, value: Any) -> None:
        """A switch returned ``value``: record the sons it chose."""

    def complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Record node ``i``'s outcome and settle it; the loop's next node."""

def _policy(run: GuardedRun, i: int) -> Any:
    """Node ``i``'s ``NodePolicy`` (never None here: the engine calls this module only for
    nodes that have one)."""
    pol = run.plan.policy[i]
    assert pol is not None
    return pol


def _guard(run: GuardedRun, i: int) -> Guard:
    g: Guard | None = run.guards.get(i)
    if g is None:
        g = run.guards.setdefault(i, Guard())
    return g


policy_of, guard_of = _policy, _guard  # for the stand-ins (``fallbacks``)


def _alive(run: GuardedRun, i: int) -> bool:
    """Under the run's lock: node ``i`` may still use what it takes (the run is open and the
    node has no outcome). Whoever ends a node flips this under the lock first, then calls
    ``release``: a handover that sees it True is taken back by ``release``, one that sees it
    False is refused."""
    return not run.closed and run.results[i].state is _DEFAULT


def _budget_error(run: GuardedRun, i: int, why: str) -> NodeTimeoutError:
    err = NodeTimeoutError(run.names[i], None if math.isinf(run.budget) else run.budget,
                           budget=True)
    if hasattr(err, "add_note"):  # Python 3.10 has no notes: the message stands alone
        err.add_note(f"taskflow: {why}")
    return err


def _ended(run: GuardedRun, i: int, g: Guard) -> int:
    """A handover was refused: the node settled (or its run closed) while its gates ran. The
    outcome is one nobody records (``complete`` finds the node settled and drops it)."""
    g.outcome = (None, NodeCancelledError(run.names[i], "it ended while passing its gates"))
    return _QUIT


# -- before an attempt ---------------------------------------------------------------------------

def admit(run: GuardedRun, i: int) -> int:
    """Pass node ``i``'s next attempt through its gates: GO, PARKED or DONE (see the module).
    Each gate answers GO to let the attempt on to the next; a gate that has already let this
    attempt through (its permit, place or token is held) answers GO at once. Every DONE gives
    back what the guard holds for the attempt, in one place (``_drop_next``)."""
    pol = _policy(run, i)
    g = _guard(run, i)
    verdict = DONE
    if g.outcome is None:
        now = clock.now()
        for gate in _GATES:
            verdict = gate(run, i, g, pol, now)
            if verdict != GO:
                break
        else:
            verdict = _go(run, i, g, pol, now)
    if verdict >= DONE:
        _drop_next(run, i, g, pol, verdict == _QUIT)
        return DONE
    return verdict


def _min_budget_gate(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """``min_budget``: too little of the run's budget left -> DONE with a TIMEOUT error (and the
    node withdraws from its single flight: another run may have the budget)."""
    left = run.deadline - now
    if pol.min_budget is not None and left < pol.min_budget:
        g.outcome = (None, _budget_error(
            run, i, f"{max(0.0, left):.3f}s of the budget left; the node needs "
                    f"min_budget={pol.min_budget:g}s"))
        return _QUIT
    return GO


def _share_gate(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """``share_key``: the first run of a key leads (GO); another waits for the leader's outcome
    (PARKED) or takes a cached value (DONE)."""
    flight = pol.flight
    if flight is None or g.member is not None:
        return GO
    from taskflow.resilience.singleflight import share_key_of

    try:
        key = share_key_of(pol.share_key, run.ctx, run.plan.nodes[i].param, node=pol.name)
    except Exception as exc:  # noqa: BLE001 - the key function's error is the node's
        g.outcome = (None, exc)
        return DONE
    with run.lock:
        if not _alive(run, i):
            return _ended(run, i, g)
        g.wait = _SHARE  # from here an outcome delivered by the flight is kept (``_shared``)
    member = flight.join(key, partial(_shared, run, i))
    with run.lock:
        alive = _alive(run, i)
        if alive:
            g.member = member
            if g.wait == _SHARE:  # nothing delivered yet
                if member.cached or member.leader:
                    g.wait = 0
                else:
                    run.move(i, PARKED_STATE)
                    return PARKED
    if not alive:
        member.withdraw()
        return _ended(run, i, g)
    if member.cached:
        g.shared = True
        run.results[i].shared = True
        g.outcome = (member.call.result(), None)
        if member.stale:  # ``stale_for``: served now, one refresh runs as detached work
            flight.refresh(key, partial(run.start_refresh, i), timeout=run.plan.timeout[i])
        return DONE
    # the leader, or an outcome or the lead arrived between join and here
    return DONE if g.outcome is not None else GO


def _breaker_gate(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """``breaker.allow()``: open -> DONE with ``CircuitOpenError``."""
    breaker = pol.breaker
    if breaker is None or g.bpermit is not None:
        return GO
    try:
        bp = breaker.allow()
    except CircuitOpenError as exc:
        g.outcome = (None, exc)
        return DONE
    with run.lock:
        alive = _alive(run, i)
        if alive:
            g.bpermit = bp
    if not alive:
        breaker.discard(bp)
        return _ended(run, i, g)
    return GO


def _rate_gate(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """``rate_limit.reserve(deadline)``: no token before the run's deadline -> DONE (TIMEOUT);
    a token later -> PARKED until then (a timer entry)."""
    limit = pol.rate_limit
    if limit is None or g.reservation is not None:
        return GO
    deadline = run.deadline
    r = limit.reserve(deadline=None if math.isinf(deadline) else deadline)
    if r is None:
        g.outcome = (None, _budget_error(
            run, i, f"rate limit {limit.name!r} has no token before the run's deadline"))
        return DONE
    with run.lock:
        alive = _alive(run, i)
        if alive:
            g.reservation = r
            if r.ready_at > now:
                g.wait = _TOKEN
                run.move(i, PARKED_STATE)
                g.token_timer = timer.schedule(r.ready_at, _token_ready, run, i)
                return PARKED
    if not alive:
        r.cancel()
        return _ended(run, i, g)
    return GO


def _bulkhead_gate(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """``bulkhead.acquire(on_grant, deadline)``: a slot -> GO; a ticket -> PARKED; full ->
    DONE with ``BulkheadFullError``."""
    bulkhead = pol.bulkhead
    if bulkhead is None or g.permit is not None:
        return GO
    deadline = run.deadline
    with run.lock:
        if not _alive(run, i):
            return _ended(run, i, g)
        g.wait = _SLOT  # from here a slot granted to the ticket is kept (``_granted``)
    try:
        got = bulkhead.acquire(partial(_granted, run, i),
                               deadline=None if math.isinf(deadline) else deadline)
    except BulkheadFullError as exc:
        g.outcome = (None, exc)
        return DONE
    from taskflow.resilience.bulkhead import Permit

    slot = isinstance(got, Permit)
    with run.lock:
        alive = _alive(run, i)
        if alive:
            if slot:
                g.wait = 0
                g.permit = got
            elif g.wait == _SLOT:  # not granted meanwhile
                g.ticket = got
                run.move(i, PARKED_STATE)
                return PARKED
    if not alive:
        if slot:
            got.release()
        else:
            got.cancel()  # False: granted meanwhile, and ``_granted`` gave the slot back
        return _ended(run, i, g)
    return GO


def _batch_gate(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """``batch``: a seat in a call of the batch -> PARKED until answered, or DONE (first: it
    takes along the nodes its node was popped with, whatever the other gates say)."""
    return GO if pol.batch is None else batching.gate(run, i, g, pol, now, _guard)


# the gates in the order an attempt passes them (see the module)
_GATES: tuple[Callable[[GuardedRun, int, Guard, Any, float], int], ...] = (
    _batch_gate, _min_budget_gate, _share_gate, _breaker_gate, _rate_gate, _bulkhead_gate)


def _go(run: GuardedRun, i: int, g: Guard, pol: Any, now: float) -> int:
    """Every gate let the attempt through: check its breaker permit again, then hand the slot
    and the permit to a new ``Attempt`` (the reservation, the ticket and the token's timer
    are used up)."""
    bp = g.bpermit
    if bp is not None:
        try:
            bp = pol.breaker.renew(bp)  # the breaker may have moved while the node waited
        except CircuitOpenError as exc:
            g.outcome = (None, exc)
            return DONE
    with run.lock:
        alive = _alive(run, i)
        if alive:
            g.current = a = Attempt(g.permit, bp, now)
            g.permit = g.bpermit = g.reservation = g.ticket = g.token_timer = None
            g.wait = 0
    if not alive:
        if bp is not None:
            pol.breaker.discard(bp)  # (a permit discarded twice counts once)
        return _ended(run, i, g)
    if pol.hedge is not None:
        _start_race(run, i, g, pol, a, now)
    return GO


def _drop_next(run: GuardedRun, i: int, g: Guard, pol: Any, withdraw: bool) -> None:
    """``admit`` answers DONE: the attempt will not happen; what the guard holds for it is
    given back (and, with ``withdraw``, the node's place in its single flight)."""
    with run.lock:
        g.wait = 0
        held = _take_next(g, withdraw)
    _give_back(pol, held)


def take_outcome(run: GuardedRun, i: int) -> tuple[Any, BaseException | None]:
    """The outcome ``admit`` decided (DONE), taken once."""
    g: Guard = run.guards[i]
    outcome = g.outcome
    assert outcome is not None
    g.outcome = None
    return outcome


def _requeue(run: GuardedRun, i: int) -> int:
    """Under the run's lock: a parked node may go on; queue it; loops to start."""
    if run.code[i] != PARKED_STATE:
        return 0  # still in admit on its own thread: it sees what arrived
    run.move(i, QUEUED)
    run.economy.enqueue(i)
    return run.economy.reserve()


def _resume(run: GuardedRun, i: int, kind: int, take: Callable[[Guard], None] | None = None) -> bool:
    """Node ``i``'s wait of ``kind`` (``_SHARE``, ``_TOKEN``, ``_SLOT``) ended: under the run's
    lock, ``take`` records what arrived and a parked node is queued again (the owner starts its
    loop). False, with nothing done, when the node no longer waits for it (the run closed, the
    node settled, or it waits for something else): what arrived stays with the caller."""
    k = 0
    with run.lock:
        g = run.guards.get(i)
        if g is None or g.wait != kind or not _alive(run, i):
            return False
        g.wait = 0
        if take is not None:
            take(g)
        k = _requeue(run, i)
    if k:
        run.post(run.dispatch, k)
    return True


def _shared(run: GuardedRun, i: int, outcome: Any) -> None:
    """A shared call resolved, or promoted this run to leader (the resolving thread). When the
    node no longer waits, a promotion is given back by whoever holds the member (the gate that
    joined, or ``release``: ``member.withdraw()`` passes the lead on)."""

    def take(g: Guard) -> None:
        if not outcome.promoted:
            g.shared = True
            run.results[i].shared = True
            g.outcome = (outcome.value, outcome.error)

    _resume(run, i, _SHARE, take)


def _token_ready(run: GuardedRun, i: int) -> None:
    """Timer thread: node ``i``'s rate-limit token is due."""
    _resume(run, i, _TOKEN)


def _granted(run: GuardedRun, i: int, permit: Any) -> None:
    """A bulkhead slot for node ``i`` (the thread that released it, outside its lock)."""

    def take(g: Guard) -> None:
        g.permit = permit
        g.ticket = None  # used up

    if not _resume(run, i, _SLOT, take):
        permit.release()  # the node gave up meanwhile: the next waiter gets it


# -- giving back -----------------------------------------------------------------------------------

_Held = tuple[Any, Any, Any, Any, Any, Any]


def _take_next(g: Guard, withdraw: bool) -> _Held:
    """Under the run's lock: take from the guard what it holds for the next attempt (with
    ``withdraw``, its single-flight place too), for ``_give_back``."""
    held = (g.token_timer, g.ticket, g.reservation, g.bpermit, g.permit,
            g.member if withdraw else None)
    g.token_timer = g.ticket = g.reservation = g.bpermit = g.permit = None
    if withdraw:
        g.member = None
    return held


def _give_back(pol: Any, held: _Held) -> None:
    """Outside the run's lock: give back what ``_take_next`` took (none of it was used)."""
    t, ticket, reservation, bpermit, permit, member = held
    if t is not None:
        t.cancel()
    if ticket is not None:
        ticket.cancel()  # False: granted meanwhile; ``_granted`` gave the slot to the guard
    if reservation is not None:
        reservation.cancel()
    if bpermit is not None:
        pol.breaker.discard(bpermit)  # the call did not happen
    if permit is not None:
        permit.release()
    if member is not None:
        member.withdraw()


def _give_back_attempt(pol: Any, permit: Any, bpermit: Any, ok: bool | None,
                       counts: bool = True) -> None:
    """Outside the run's lock: an attempt returned (``ok``) or never ran (None): its slot goes
    back and its breaker permit is counted — or discarded when the call did not happen, or
    when it failed after losing its hedge race (``counts`` False: its failure may be the
    cancellation)."""
    if permit is not None:
        permit.release()
    if bpermit is not None:
        if ok is None or not (counts or ok):
            pol.breaker.discard(bpermit)
        else:
            pol.breaker.record(bpermit, ok)


def release(run: GuardedRun, nodes: Iterable[int], failed: bool = True) -> None:
    """Outside the lock: nodes ended without their attempt returning (see the module).
    ``failed``: they timed out (a running attempt counts as failed in the breaker now); False:
    cancelled (a running attempt counts when it returns)."""
    guards = run.guards
    for i in nodes:
        g: Guard | None = guards.get(i)
        if g is None:
            continue
        pol = _policy(run, i)
        with run.lock:
            g.wait = 0
            live = [*g.hedges, g.current] if g.current is not None else list(g.hedges)
            # a leader with an attempt in flight keeps the lead: that attempt resolves the call
            held = _take_next(g, withdraw=not live)
            seat, g.seat, token, g.retry = g.seat, None, g.retry, None
            hedge_timer, g.hedge_timer = g.hedge_timer, None
            slots = [a.permit for a in live if a.permit is not None]
            timed_out = []
            if failed:
                for a in live:
                    if a.bpermit is not None:
                        timed_out.append(a.bpermit)
                        a.bpermit = None
        if hedge_timer is not None:
            hedge_timer.cancel()
        if seat is not None:
            batching.release(pol.batch, seat)
        if token is not None:
            token.give_back()  # the retry it was for will not be made
        _give_back(pol, held)
        for permit in slots:
            permit.abandon()  # held until the attempt returns (its owner releases it)
        for bp in timed_out:
            pol.breaker.record(bp, False)  # a TIMEOUT counts as a failure


# -- hedging ---------------------------------------------------------------------------------------

def _start_race(run: GuardedRun, i: int, g: Guard, pol: Any, a: Attempt, now: float) -> None:
    from taskflow.resilience.hedge import HedgeRace
    from taskflow.resilience.latency import latencies

    race = g.race = HedgeRace(pol.hedge.max_extra)
    a.n = race.launch() or 0
    delay = pol.hedge.delay(latencies.get(pol))
    if delay is not None and now + delay < run.deadline:
        g.hedge_timer = timer.schedule(now + delay, _hedge_due, run, i, race, delay)


def _hedge_due(run: GuardedRun, i: int, race: Any, delay: float) -> None:
    """Timer thread: an attempt has run ``delay`` seconds; the owner may start a duplicate."""
    run.post(_hedge_launch, run, i, race, delay)


def _racing(run: GuardedRun, i: int, g: Guard | None, race: Any) -> bool:
    """Under the run's lock: ``race`` is node ``i``'s and still open to duplicates."""
    return (g is not None and g.race is race and _alive(run, i) and run.code[i] == RUNNING
            and race.winner is None)


def _hedge_take(pol: Any) -> tuple[Attempt, Any] | None:
    """A duplicate's slot, breaker permit and token, each taken now or not at all: the Attempt
    holding the first two, and the reservation; or None with everything given back."""
    permit = bp = r = None
    ok = True
    if pol.bulkhead is not None:
        permit = pol.bulkhead.try_acquire()
        ok = permit is not None
    if ok and pol.breaker is not None:
        try:
            bp = pol.breaker.allow()  # a duplicate is a call like any other: it needs leave
        except CircuitOpenError:
            ok = False
    if ok and pol.rate_limit is not None:
        r = pol.rate_limit.reserve_now()
        ok = r is not None
    if ok:
        return Attempt(permit, bp, clock.now()), r
    _give_back_attempt(pol, permit, bp, None)
    return None


def _hedge_launch(run: GuardedRun, i: int, race: Any, delay: float) -> None:
    """The owner's thread: start one more attempt of node ``i`` if the race is still open.

    A hedge never queues: without a free bulkhead slot, a breaker permit or a rate-limit token
    now, it is skipped (and tried again after ``delay``)."""
    pol = _policy(run, i)
    g = run.guards.get(i)
    with run.lock:
        if not _racing(run, i, g, race):
            return
    assert g is not None
    took = _hedge_take(pol)
    if took is not None:
        a, r = took
        with run.lock:
            n = race.launch() if _racing(run, i, g, race) else None
            if n is not None:
                a.n = n
                g.hedges.append(a)
        if n is not None:
            run.results[i].hedges = race.hedges
            if run.observers:
                events.event(run.observers, i, "hedge", {"attempt": n})
            try:
                if g.launch is None:
                    # in a copy of the caller's contextvars, as a loop runs a node: the task
                    # and, if the duplicate wins, its outcome (log lines, hooks) see them
                    run.executor.submit(run.cv.copy().run, _hedge_attempt, run, i, race, a)
                else:
                    g.launch(run, i, race, a)
                r = None  # its token is used
            except BaseException as exc:  # noqa: BLE001 - a refused hedge is a failed attempt
                _hedge_returned(run, i, race, a, None, exc, ran=False)
        else:
            _give_back_attempt(pol, a.permit, a.bpermit, None)
        if r is not None:
            r.cancel()
    if race.winner is None and race.hedges < race.max_extra and (
            clock.now() + delay < run.deadline):
        g.hedge_timer = timer.schedule(clock.now() + delay, _hedge_due, run, i, race, delay)


def _hedge_attempt(run: GuardedRun, i: int, race: Any, a: Attempt) -> None:
    """An executor thread, in a copy of the caller's contextvars: a duplicate attempt of node
    ``i``."""
    from taskflow.resilience.latency import latencies

    plan = run.plan
    node = plan.nodes[i] if plan.stateless[i] else run.node(i)
    cur = current
    prev = cur.__dict__.get("run"), cur.__dict__.get("idx")
    cur.run, cur.idx = run, i
    error: BaseException | None = None
    try:
        value = node.task(run.ctx, node.param)
        if plan.routes[i]:
            run.route(i, node, value)
    except BaseException as exc:  # noqa: BLE001 - the attempt's failure is its outcome
        value, error = None, exc
    finally:
        cur.run, cur.idx = prev
    if error is None:
        latencies.record(plan.policy[i], clock.now() - a.started)
    _hedge_returned(run, i, race, a, value, error)


def _hedge_returned(run: GuardedRun, i: int, race: Any, a: Attempt, value: Any,
                    error: BaseException | None, ran: bool = True) -> None:
    """A duplicate returned (or was refused by the executor, or, async, cancelled: ``ran``
    False): its slot and breaker permit go back, the race says whether its outcome is the
    node's."""
    from taskflow.resilience.hedge import Verdict

    g: Guard = run.guards[i]
    with run.lock:
        if a in g.hedges:
            g.hedges.remove(a)
        permit, bp = a.permit, a.bpermit
        a.permit = a.bpermit = None
    ok = error is None
    verdict = race.settle(a.n, ok)
    _give_back_attempt(_policy(run, i), permit, bp, ok if ran else None,
                       counts=verdict is not Verdict.LOST)
    if verdict is Verdict.WON or verdict is Verdict.FAILED:
        run.complete(i, NO_LOOP, value, error)


hedge_returned = _hedge_returned  # for an async duplicate's end (``aio.py``)


# -- after an attempt ----------------------------------------------------------------------------

def attempt_done(run: GuardedRun, i: int, ok: bool | None) -> bool:
    """An attempt of node ``i`` returned (its own thread), or, ``ok`` None, ended without a
    word on the backend (an async attempt cancelled, or never started): its breaker permit is
    discarded. False: it lost a hedge race (or failed while a duplicate still runs): drop its
    outcome."""
    pol = _policy(run, i)
    g: Guard | None = run.guards.get(i)
    if g is None:
        return True
    with run.lock:
        a, g.current = g.current, None
        if a is None:
            return True
        permit, bp = a.permit, a.bpermit
        a.permit = a.bpermit = None
    race = g.race
    if race is None:
        _give_back_attempt(pol, permit, bp, ok)
        return True
    from taskflow.resilience.hedge import Verdict
    from taskflow.resilience.latency import latencies

    if ok:
        latencies.record(pol, clock.now() - a.started)
    verdict = race.settle(a.n, bool(ok))
    _give_back_attempt(pol, permit, bp, ok, counts=verdict is not Verdict.LOST)
    if verdict is Verdict.WON or verdict is Verdict.FAILED:
        t, g.hedge_timer = g.hedge_timer, None
        if t is not None:
            t.cancel()
        g.race = None  # a retry starts a new race
        return True
    return False


def finish(run: GuardedRun, i: int, value: Any, error: BaseException | None) -> None:
    """Node ``i``'s outcome is final (whatever its run makes of it): a single-flight leader
    resolves its shared call; hedges stop."""
    g: Guard | None = run.guards.get(i)
    if g is None:
        return
    t, g.hedge_timer = g.hedge_timer, None
    if t is not None:
        t.cancel()
    member = g.member
    if member is not None and member.leader and not g.shared:
        call = member.call
        if error is None:
            call.set_result(value)
        else:
            call.set_exception(error)
