"""Batched nodes at run time: taking seats in a ``Batch``'s calls, running them, answering.

A node with ``batch=`` makes no attempt of its own. It takes a *seat* in a *call* of its batch:

1. popped: a loop pops a batched node from the run's ready queue (``Economy.next_node``) and,
   in the same critical section, every ready node of the same batch that may join it
   (``joinable``: no outcome decided yet, ``min_budget`` lets it start) goes along, QUEUED ->
   PARKED, kept in ``economy.gathered``. No other loop can take one of them for a call of its
   own: the nodes of a batch that are ready together make one call (or several of
   ``max_size`` keys). If the popped node ends before its gate (``Run.fail``), or takes no
   seat (``min_budget``, its key failed), they are ready again (``regather``).
2. its gate (``gate``, the first of ``guards.admit``'s, on the thread about to start its
   attempt, outside the run's lock): its key (``batch.key_of``; an error is its outcome);
   under the lock it takes the nodes it was popped with (each waits for an answer,
   ``Guard.wait == WAIT_BATCH``); outside it each attempt is stamped (``begin_attempt``: a
   node's own timeout starts), their keys are read, and all take seats (``Batch.join``) in
   calls of the run (``across_runs=False``) or of every run;
3. under the lock each seat is handed to its node's Guard (``Guard.seat``) if the node is still
   alive, else it leaves; the node itself parks (PARKED) unless it holds the duty to run its
   call now;
4. the duty: a call that ``join`` closed (full, or ``window == 0``) belongs to the joiner. It runs
   the call holding its own seat at once, on its own worker (``Batch.execute``), and ends DONE
   with its answer; any other call it closed is handed off (``_hand_off``). A call still open
   gets a timer entry at the end of its window (``_window_passed``, on the timer thread), which
   closes it and hands it off.

Handing a call off: under the lock of a run that has a seat in it and is still open, ``post``
``_serve`` to that run's owner (posted before the run finishes, so the owner runs it). The
owner submits ``_run_submitted`` to the run's executor (an inline run's caller, itself a worker
of the pool, runs the call there); a refused or dropped submission fails the call's seats. If
no run with a seat is open, the call fails unseen (nobody waits for it).

A batch whose function is ``async def`` (``Batch.is_async``) never runs its call on a worker:
whoever holds the duty to run it (the joiner, the timer, a fan-out's item loop) starts it on
the event loop of a run with a seat in it that is still open (``start_on_loop``:
``aio.start_batch_call``) and goes on; the joiner parks like any other seat, and the answer
reaches every seat through its party. Once every seat has left (their runs gave up) the
task is cancelled (``Batch.leave``).

Answers reach each run in one delivery (``_Party``, on the thread that resolved the call,
outside every lock but the run's): each node still waiting gets its outcome in its Guard
(``outcome``) and the call's label in its result (``WorkResult.batch``), and moves PARKED ->
QUEUED; the owner starts loops for them. Back in ``guards.admit`` the outcome is DONE: the
node completes with it (``fallback`` applies). A node whose run ended leaves its seat
(``release``, from ``guards.release``) and never sees a value.

The one owner rule holds for seats and for the duty to run a call: a seat is the joiner's until
handed to the Guard under the run's lock (or given back at once), then the Guard's until
answered or released; a call is the batch's while open, then the closer's (the joiner, or the
timer), then the owner's it was posted to, then the executor task's, which runs or fails it.

Fan-out items (``taskflow.kinds.fanout``) take seats too (``seat_items``): the item loop is the
joiner, and its fan-out's own party settles the items.

Never under a lock: ``fn``, key functions, ``begin_attempt`` (it may run observers), ``submit``.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import events, sections, timer
from taskflow.engine.states import ADMIT_DONE, ADMIT_GO, ADMIT_PARKED, INLINE, PARKED, QUEUED
from taskflow.errors import NodeCancelledError, RejectedExecutionError
from taskflow.model.context import TaskContext, current
from taskflow.model.graph import Plan
from taskflow.model.result import ResultState, WorkResult

__all__ = ["WAIT_BATCH", "BatchedRun", "ItemHost", "Seated", "gate", "joinable", "release",
           "seat_items"]

# what a node parked for its batch waits for (``Guard.wait``; guards.py uses 1 to 3)
WAIT_BATCH = 4

_DEFAULT = ResultState.DEFAULT

start_on_loop: Callable[[Any, Any, Any], None] | None = None
"""``start_on_loop(run, batch, call)``: closed ``call`` of an async batch function starts on
``run``'s event loop (``aio.start_batch_call``, set when ``aio`` loads: batching cannot import
the module whose gates import it)."""


class Seated(Protocol):
    """What batching reads and writes of a node's ``guards.Guard`` (under the run's lock)."""

    wait: int
    outcome: tuple[Any, BaseException | None] | None
    seat: Any


class GatheringEconomy(Protocol):
    """What batching needs of the run's loop economy (``economy.Economy``), under the lock."""

    gathered: dict[int, list[int]]

    def regather(self, i: int) -> None:
        """The nodes node ``i`` was popped with are ready again."""

    def enqueue(self, i: int) -> None:
        """Append QUEUED node ``i`` to the ready nodes."""

    def reserve(self, nxt: int = -1) -> int:
        """How many new loops to start for the ready nodes (counted)."""


class BatchedRun(Protocol):
    """Exactly what batching uses of a run (``run.Run`` satisfies it, through the gates'
    ``guards.GuardedRun``). Fixed at creation: ``plan``, ``names``, ``flow_id``, ``deadline``,
    ``ctx``, ``cv``, ``mode``, ``executor``, ``lock``, ``observers``. Under ``lock``:
    ``closed``, ``code``, ``guards``, the results' states."""

    plan: Plan
    names: tuple[str, ...]
    flow_id: str
    deadline: float
    t0: float
    ctx: TaskContext
    cv: contextvars.Context
    mode: str
    executor: Executor
    lock: threading.Lock
    closed: bool
    code: list[int]
    results: list[WorkResult[Any]]
    observers: tuple[events.RunObserver, ...]

    @property
    def guards(self) -> Any:
        """Node -> its Guard (``Seated``)."""

    @property
    def economy(self) -> GatheringEconomy:
        """The run's loop economy."""

    def move(self, i: int, new: int) -> None:
        """Under lock: move node ``i`` to state ``new``."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread."""

    def dispatch(self, k: int) -> None:
        """Outside the lock: start ``k`` reserved loops."""

    def begin_attempt(self, i: int, wr: WorkResult[Any], thread: str, node: Any) -> None:
        """Stamp an attempt of node ``i`` (arming its own timeout at the first)."""


def _alive(run: BatchedRun, i: int) -> bool:
    """Under the run's lock: node ``i`` still wants an answer (its run is open, it has no
    outcome)."""
    return not run.closed and run.results[i].state is _DEFAULT


def _deadline(run: BatchedRun, i: int) -> float:
    """When node ``i`` stops wanting an answer: its run's deadline, its own timeout's or its
    deadline from the run's start."""
    plan = run.plan
    t = plan.timeout[i]
    began = run.results[i].started_at
    end = run.deadline
    if t is not None and began is not None:
        end = min(end, began + t)
    return sections.limit(plan, i, run.t0, end) if plan.any_deadline else end


class _Party:
    """The nodes of one run that took seats in one ``join``: answers reach them here."""

    __slots__ = ("run",)

    def __init__(self, run: BatchedRun) -> None:
        self.run = run

    def __call__(self, answers: list[Any]) -> None:
        """The resolving thread, outside the batch's lock: store each waiting node's outcome
        and queue it again; the owner starts the loops."""
        run = self.run
        k = 0
        with run.lock:
            queued = False
            for seat, value, error in answers:
                i = seat.tag
                g = run.guards.get(i)
                if g is None or g.wait != WAIT_BATCH or not _alive(run, i):
                    continue  # it ended meanwhile: its answer is dropped unseen
                g.wait = 0
                g.outcome = (value, error)
                run.results[i].batch = seat.label
                if run.code[i] == PARKED:
                    run.move(i, QUEUED)
                    run.economy.enqueue(i)
                    queued = True
            if queued:
                k = run.economy.reserve()
        if k:
            run.post(run.dispatch, k)


def joinable(policy: Sequence[Any], guards: Any, deadline: float, j: int) -> bool:
    """Under the run's lock (``Economy.next_node``): whether ready batched node ``j`` may take
    a seat now: no outcome decided for it yet, and ``min_budget`` lets it start."""
    g = guards.get(j)
    if g is not None and g.outcome is not None:
        return False
    pol = policy[j]
    return pol.min_budget is None or deadline - clock.now() >= pol.min_budget


def gate(run: BatchedRun, i: int, g: Seated, pol: Any, now: float,
         guard_of: Callable[[Any, int], Seated]) -> int:
    """Node ``i`` (RUNNING, on its own thread, outside the lock) takes a seat in a call of
    ``pol.batch`` with the nodes of that batch it was popped with (see the module): PARKED,
    or DONE with ``g.outcome`` set; GO (and the nodes it took go back to the ready queue)
    when ``min_budget`` refuses it: the next gate says so. ``guard_of(run, j)`` makes node
    ``j``'s Guard."""
    batch = pol.batch
    if pol.min_budget is not None and run.deadline - now < pol.min_budget:
        _let_go(run, i)
        return ADMIT_GO
    try:
        key = batch.key_of(run.ctx, run.plan.nodes[i].param, owner=f"node {run.names[i]!r}")
    except Exception as exc:  # noqa: BLE001 - the key function's error is the node's
        _let_go(run, i)
        g.outcome = (None, exc)
        return ADMIT_DONE
    others = _take_along(run, i, g, guard_of)
    if others is None:
        g.outcome = (None, NodeCancelledError(run.names[i], "it ended while joining a batch"))
        return ADMIT_DONE
    tname = threading.current_thread().name
    for j in [i, *others]:
        run.begin_attempt(j, run.results[j], tname, run.plan.nodes[j])
    entries = [(key, i), *_keys_of(run, batch, others)]
    seats, closed, opened = batch.join(
        None if batch.across_runs else run.flow_id,
        [(k, _deadline(run, j), j) for k, j in entries], _Party(run))
    own = seats[0]
    mine = (own.call if not batch.is_async and any(own.call is c for c in closed)
            else None)  # an async batch's call runs on a loop: the joiner parks
    parked = _hand_over(run, i, g, batch, seats, mine is None)
    for call in closed:
        if call is not mine:
            _hand_off(batch, call)
    for call in opened:
        timer.schedule(clock.now() + batch.window, _window_passed, batch, call)
    if parked:
        return ADMIT_PARKED
    if mine is not None:
        _run_own(run, i, g, batch, mine, own)
    with run.lock:
        if g.outcome is None:  # it ended while waiting: an outcome nobody records
            g.outcome = (None, NodeCancelledError(run.names[i], "its run ended"))
        g.wait = 0
    return ADMIT_DONE


def _take_along(run: BatchedRun, i: int, g: Seated,
                guard_of: Callable[[Any, int], Seated]) -> list[int] | None:
    """Under the lock: node ``i`` and the nodes it was popped with that still wait now wait
    for an answer; those nodes (None: ``i`` itself ended)."""
    with run.lock:
        if not _alive(run, i):
            return None
        g.wait = WAIT_BATCH
        # those taken along and still waiting (one may have been cancelled meanwhile)
        others = [j for j in run.economy.gathered.pop(i, ())
                  if run.code[j] == PARKED and _alive(run, j)]
        for j in others:
            guard_of(run, j).wait = WAIT_BATCH
    return others


def _hand_over(run: BatchedRun, i: int, g: Seated, batch: Any, seats: list[Any],
               may_park: bool) -> bool:
    """Each seat goes to its node's Guard if the node is still alive, else it leaves; node
    ``i`` parks (True) if ``may_park`` (it does not run its call) and no answer came yet."""
    gone = []
    with run.lock:
        for seat in seats:
            j = seat.tag
            if _alive(run, j):
                run.guards[j].seat = seat
            else:
                gone.append(seat)
        parked = may_park and g.wait == WAIT_BATCH and _alive(run, i)
        if parked:
            run.move(i, PARKED)
    for seat in gone:
        batch.leave(seat)
    return parked


def _let_go(run: BatchedRun, i: int) -> None:
    """Node ``i`` takes no seat: the nodes it was popped with are ready again."""
    k = 0
    with run.lock:
        if i in run.economy.gathered:
            run.economy.regather(i)
            k = run.economy.reserve()
    if k:
        run.post(run.dispatch, k)


def _keys_of(run: BatchedRun, batch: Any, others: list[int]) -> list[tuple[Hashable, int]]:
    """The keys of the nodes taken along (on the joiner's thread, as each node's own code:
    ``current.idx`` is the node's). A node whose key function fails gets that as its outcome
    and is queued again at once."""
    out: list[tuple[Hashable, int]] = []
    failed: list[tuple[Any, Any, BaseException]] = []
    if not others:
        return out
    cur = current
    prev = cur.__dict__.get("idx")
    try:
        for j in others:
            cur.idx = j
            try:
                out.append((batch.key_of(run.ctx, run.plan.nodes[j].param,
                                         owner=f"node {run.names[j]!r}"), j))
            except Exception as exc:  # noqa: BLE001 - a key function's error is its node's
                failed.append((_Unseated(j), None, exc))
    finally:
        cur.idx = prev
    if failed:
        _Party(run)(failed)
    return out


class _Unseated:
    """A node taken along whose key could not be read: answered without a seat."""

    __slots__ = ("tag",)
    label = None

    def __init__(self, tag: int) -> None:
        self.tag = tag


def _run_own(run: BatchedRun, i: int, g: Seated, batch: Any, call: Any, own: Any) -> None:
    """Run ``call`` (which this node closed) on this worker; its own answer goes in
    ``g.outcome``."""
    out = batch.execute(call, own)
    with run.lock:
        if out is not None and g.wait == WAIT_BATCH and _alive(run, i):
            g.outcome = out
            run.results[i].batch = call.label


def release(batch: Any, seat: Any) -> None:
    """A node ended without its answer (``guards.release``, outside the run's lock): it
    leaves its seat and never sees a value."""
    batch.leave(seat)


# -- handing a call off -----------------------------------------------------------------------------

def _window_passed(batch: Any, call: Any) -> None:
    """Timer thread: ``call``'s window has passed; close it and hand it off."""
    if batch.close(call):
        _hand_off(batch, call)


def _hand_off(batch: Any, call: Any) -> None:
    """``call`` is closed and ours to run, but not on this thread: post it to the owner of a
    run that has a seat in it and is still open (under its lock, so the owner runs it), or,
    for an async batch function, start it on that run's event loop; with none, it fails
    unseen."""
    seen: set[int] = set()
    for seat in list(call.seats):  # closed: no seat is added any more
        party = seat.party  # None once the seat left
        if party is None:
            continue
        run = party.run
        if id(run) in seen:
            continue
        seen.add(id(run))
        with run.lock:
            if run.closed:
                continue
            if not batch.is_async:
                run.post(_serve, run, batch, call)
                return
        assert start_on_loop is not None  # aio is loaded with the engine
        start_on_loop(run, batch, call)
        return
    batch.fail(call, RejectedExecutionError(f"batch {batch.name!r}: every run of the call "
                                            "ended before it could run"))


def _serve(run: BatchedRun, batch: Any, call: Any) -> None:
    """The run's owner: have a worker of its executor run ``call`` (an inline run's caller
    runs it itself while its run is open: it is the pool's worker)."""
    if run.mode is INLINE and not run.closed:
        _run_submitted(run, batch, call)
        return
    try:
        fut: Any = run.executor.submit(_run_submitted, run, batch, call)
        if not isinstance(fut, Future):
            raise TypeError(f"{type(run.executor).__name__}.submit returned "
                            f"{type(fut).__name__}, not a concurrent.futures.Future")
    except BaseException as exc:  # noqa: BLE001 - a refused call fails its seats
        batch.fail(call, exc)
        return
    fut.add_done_callback(partial(_dropped, batch, call))


def _run_submitted(run: BatchedRun, batch: Any, call: Any) -> None:
    """A worker: run ``call`` in the contextvars of the run that handed it over."""
    run.cv.copy().run(batch.execute, call)


def _dropped(batch: Any, call: Any, fut: Future[Any]) -> None:
    """Done-callback of a submitted call (any thread): one the executor never ran fails its
    seats (``fail`` does nothing to a call that ran)."""
    if fut.cancelled():
        batch.fail(call, RejectedExecutionError(
            f"batch {batch.name!r}: the executor dropped the call"))


# -- fan-out items --------------------------------------------------------------------------------

class ItemHost(Protocol):
    """What a fan-out whose items are batched gives ``seat_items`` (``kinds.fanout.FanOut``)."""

    run: Any
    name: str

    def items_answered(self, answers: list[Any]) -> None:
        """The resolving thread: settle the answered items (quick; hands the rest over)."""


class _ItemParty:
    """The items of one fan-out that took seats in one ``join``."""

    __slots__ = ("host", "run")

    def __init__(self, host: ItemHost) -> None:
        self.host = host
        self.run = host.run

    def __call__(self, answers: list[Any]) -> None:
        self.host.items_answered(answers)


def seat_items(host: ItemHost, batch: Any, entries: list[tuple[Hashable, Any]]
               ) -> tuple[list[Any], Any]:
    """Fan-out items (``(key, tag)`` each) take seats in calls of ``batch``, on the item loop's
    thread (the joiner). Returns the seats, and the call this thread must run now (or None):
    the first one ``join`` closed; the others it closed are handed off, the open ones get
    their window's timer entry. Answers reach ``host.items_answered``."""
    run = host.run
    deadline = run.deadline
    seats, closed, opened = batch.join(
        None if batch.across_runs else run.flow_id,
        [(k, deadline, tag) for k, tag in entries], _ItemParty(host))
    mine = closed[0] if closed and not batch.is_async else None
    for call in closed:
        if call is not mine:
            _hand_off(batch, call)
    for call in opened:
        timer.schedule(clock.now() + batch.window, _window_passed, batch, call)
    return seats, mine

