"""The gates' one rule, checked by a hypothesis state machine: every bulkhead slot and queue
place, rate-limit token, breaker permit and single-flight place a node takes has exactly one
owner, and is given back on every way the node ends.

The machine drives ``taskflow.engine.guards`` the way the engine does — admission, a parked node
resumed by a slot or a token, attempts returning, hedges launched and returning, a single-flight
leader resolving — for several runs that share two bulkheads, a breaker, a rate limit and a
single flight, on a fake clock and a fake timer. Between those steps a node ends every way it can
(success, failure, its timeout, ``min_budget``, cancelled by its join, its run closed) and a run
can close *during* an admission, right after any primitive answered a gate. After every step
each counter of each primitive equals what the guards and attempts alive hold; when everything
has ended, each is back to zero.
"""

from __future__ import annotations

import contextvars
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from resilience_helpers import FakeClock

from taskflow import TaskContext, clock
from taskflow.engine import guards
from taskflow.engine.states import (
    LEGAL_BITS,
    PARKED,
    QUEUED,
    RUNNING,
    SETTLED,
    STATE_NAMES,
    TERMINAL,
    IllegalMoveError,
)
from taskflow.errors import NodeCancelledError, NodeTimeoutError
from taskflow.model.result import ResultState, WorkResult
from taskflow.resilience import Bulkhead, CircuitBreaker, Hedge, RateLimit, SingleFlight
from taskflow.resilience.policy import NodePolicy

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)

BUDGET = 10.0
STOCK, PRICE = 0, 1  # stock: single flight, min_budget; price: hedged; both the rest
POINTS = ("key", "join", "allow", "reserve", "acquire", "renew")  # where a run may close
ENDINGS = ("close", "timeout", "cancel")


class Trap:
    """Ends a node (or its run) right after a chosen primitive answered one of its gates, and
    checks that no run's lock is held whenever a primitive is called."""

    def __init__(self) -> None:
        self.armed: tuple[str, Any] | None = None
        self.runs: list[FakeRun] = []

    def unlocked(self) -> None:
        assert not any(r.lock.held for r in self.runs), "a primitive called under a run's lock"

    def spring(self, point: str) -> None:
        self.unlocked()
        if self.armed is not None and self.armed[0] == point:
            _, end = self.armed
            self.armed = None
            end()


TRAP = Trap()


class TrapBreaker(CircuitBreaker):
    def allow(self) -> Any:
        permit = super().allow()
        TRAP.spring("allow")
        return permit

    def renew(self, permit: Any) -> Any:
        permit = super().renew(permit)
        TRAP.spring("renew")
        return permit

    def record(self, permit: Any, success: bool) -> bool:
        TRAP.unlocked()
        return super().record(permit, success)

    def discard(self, permit: Any) -> None:
        TRAP.unlocked()
        super().discard(permit)


class TrapLimit(RateLimit):
    def reserve(self, *, deadline: float | None = None) -> Any:
        r = super().reserve(deadline=deadline)
        TRAP.spring("reserve")
        return r

    def _cancel(self, reservation: Any) -> bool:
        TRAP.unlocked()
        return super()._cancel(reservation)


class TrapBulkhead(Bulkhead):
    def acquire(self, on_grant: Any, *, deadline: float | None = None) -> Any:
        got = super().acquire(on_grant, deadline=deadline)
        TRAP.spring("acquire")
        return got

    def _release(self, permit: Any) -> bool:
        TRAP.unlocked()  # the next waiter's grant runs here and takes its run's lock
        return super()._release(permit)

    def _cancel(self, ticket: Any) -> bool:
        TRAP.unlocked()
        return super()._cancel(ticket)


class TrapFlight(SingleFlight):
    def join(self, key: Any, on_done: Any) -> Any:
        member = super().join(key, on_done)
        TRAP.spring("join")
        return member

    def _withdraw(self, member: Any) -> None:
        TRAP.unlocked()  # a promotion runs here and takes the heir's run's lock
        super()._withdraw(member)


def share_key(ctx: TaskContext, param: Any) -> str:
    TRAP.spring("key")
    return "sku"


class FakeTimer:
    """``taskflow.engine.timer`` on the machine's clock: entries fire when ``fire_due`` says."""

    class Entry:
        def __init__(self, when: float, fn: Any, args: tuple[Any, ...]) -> None:
            self.when, self.fn, self.args = when, fn, args

        def cancel(self) -> None:
            self.fn = None

    def __init__(self) -> None:
        self.entries: list[FakeTimer.Entry] = []

    def schedule(self, when: float, fn: Any, *args: Any) -> FakeTimer.Entry:
        entry = FakeTimer.Entry(when, fn, args)
        self.entries.append(entry)
        return entry

    def fire_due(self, now: float) -> None:
        while True:
            due = [e for e in self.entries if e.fn is not None and e.when <= now]
            if not due:
                self.entries = [e for e in self.entries if e.fn is not None]
                return
            entry = min(due, key=lambda e: e.when)
            fn, entry.fn = entry.fn, None
            fn(*entry.args)


class FakeExecutor:
    """Holds submitted hedge attempts until the machine runs one."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, args))


class Economy:
    def __init__(self) -> None:
        self.ready: list[int] = []

    def enqueue(self, i: int) -> None:
        self.ready.append(i)

    def reserve(self, nxt: int = -1) -> int:
        return 0


class Lock:
    """The run's lock: a plain lock that also says whether it is held (nothing may be given
    back under it)."""

    def __init__(self) -> None:
        self.held = False

    def __enter__(self) -> None:
        assert not self.held, "the run's lock taken twice"
        self.held = True

    def __exit__(self, *exc: object) -> None:
        self.held = False


class FakeRun:
    """What ``guards.GuardedRun`` asks of a run, with the engine's moves checked strictly."""

    def __init__(self, plan: Any, clock: FakeClock, executor: FakeExecutor,
                 machine: GuardsMachine) -> None:
        self.plan = plan
        self.names = plan.names
        self.executor = executor
        self.budget = BUDGET
        self.deadline = clock.now + BUDGET
        self.ctx = TaskContext()
        self.cv = contextvars.copy_context()
        self.observers = ()
        self.lock = Lock()
        self.closed = False
        n = len(plan.names)
        self.code = [QUEUED] * n
        self.results: list[WorkResult[Any]] = [WorkResult() for _ in range(n)]
        self.guards: dict[int, guards.Guard] = {}
        self.economy = Economy()
        self.inbox: list[tuple[Any, tuple[Any, ...]]] = []
        self.machine = machine
        self.attempts = [0] * n
        self.number = len(machine.runs)
        self.unreleased: set[int] = set()  # ended, their release posted and not run yet

    def __repr__(self) -> str:
        return f"run{self.number}"

    def move(self, i: int, new: int) -> None:
        old = self.code[i]
        if not (LEGAL_BITS[old] >> new) & 1:
            raise IllegalMoveError(f"{STATE_NAMES[old]} -> {STATE_NAMES[new]}")
        self.code[i] = new

    def fail(self, i: int, exc: BaseException, state: ResultState, now: float) -> None:
        wr = self.results[i]
        wr.exception = exc
        wr.state = state
        self.move(i, TERMINAL)

    def post(self, fn: Any, *args: Any) -> None:
        self.inbox.append((fn, args))

    def dispatch(self, k: int) -> None:
        pass

    def node(self, i: int) -> Any:
        return self.plan.nodes[i]

    def route(self, i: int, node: Any, value: Any) -> None:
        pass

    def complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """As ``Run.complete``: the leader resolves its call, then the outcome is
        recorded unless the node settled without it."""
        assert not self.lock.held
        guards.finish(self, i, value, error)
        with self.lock:
            if self.code[i] == RUNNING and self.results[i].state is ResultState.DEFAULT:
                wr = self.results[i]
                wr.result = value
                wr.exception = error
                wr.state = ResultState.SUCCESS if error is None else ResultState.EXCEPTION
                self.move(i, TERMINAL)
                self.move(i, SETTLED)
        return -1

    def alive(self, i: int) -> bool:
        return not self.closed and self.results[i].state is ResultState.DEFAULT

    # -- the ways a node ends without its attempt returning (the engine's enders) -----------

    def close(self) -> None:
        """The run's deadline or ``ctx.cancel``: every node without an outcome ends."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            victims = [i for i, wr in enumerate(self.results) if wr.state is ResultState.DEFAULT]
            for i in victims:
                self.fail(i, NodeTimeoutError(self.names[i], BUDGET, budget=True),
                          ResultState.TIMEOUT, 0.0)
                self.move(i, SETTLED)
            self.economy.ready.clear()
        guards.release(self, victims)

    def end(self, i: int, how: str, posted: bool = False) -> None:
        """Node ``i``'s own timeout, or its join no longer needing it; with ``posted``, what it
        holds is given back later, on the owner's thread (as the engine's timer and settling
        do), so grants and tokens may arrive for it in between."""
        with self.lock:
            if not self.alive(i) or self.code[i] not in (QUEUED, RUNNING, PARKED):
                return
            if how == "timeout":
                self.fail(i, NodeTimeoutError(self.names[i], 1.0), ResultState.TIMEOUT, 0.0)
            else:
                self.fail(i, NodeCancelledError(self.names[i], "not needed"),
                          ResultState.CANCELLED, 0.0)
            if i in self.economy.ready:
                self.economy.ready.remove(i)
        if posted:
            self.unreleased.add(i)
            self.post(self.release, i, how == "timeout")
        else:
            guards.release(self, [i], how == "timeout")

    def release(self, i: int, failed: bool) -> None:
        self.unreleased.discard(i)
        guards.release(self, [i], failed)


class GuardsMachine(RuleBasedStateMachine):
    """Runs sharing bulkheads, a breaker, a rate limit and a single flight (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.timer = FakeTimer()
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(clock, "now", self.clock)
        self.patch.setattr(guards, "timer", self.timer)
        # the shared node's bulkhead is tight (its nodes park); the hedged one's has room
        self.bulkhead = TrapBulkhead("machine", max_concurrent=1, max_waiting=2, clock=self.clock)
        self.roomy = TrapBulkhead("roomy", max_concurrent=3, clock=self.clock)
        self.breaker = TrapBreaker("machine", window=4, min_calls=2, failure_ratio=0.5,
                                   open_for=1.0, half_open_calls=1, clock=self.clock)
        self.limit = TrapLimit("machine", per_second=3.0, burst=2, clock=self.clock)
        common = {"fanout": False, "breaker": self.breaker, "rate_limit": self.limit,
                  "fallback": None, "idempotent": True, "cache_ttl": None, "cache_size": 8,
                  "priority": 0.0}
        stock = NodePolicy("stock", bulkhead=self.bulkhead, hedge=None, share_key=share_key,
                           min_budget=4.0, **common)
        stock.flight = self.flight = TrapFlight("stock", clock=self.clock)
        price = NodePolicy("price", bulkhead=self.roomy, hedge=Hedge(after=0.25, max_extra=2),
                           share_key=None, min_budget=None, **common)
        self.outcome_ok = True
        task = SimpleNamespace(param=None, task=self.task)
        self.plan = SimpleNamespace(names=("stock", "price"), policy=(stock, price),
                                    nodes=(task, task), stateless=(True, True),
                                    routes=(False, False))
        self.executor = FakeExecutor()
        self.runs: list[FakeRun] = []
        TRAP.runs = self.runs
        self.hogs: list[Any] = []
        self.used_tokens = 0  # attempts started with a token (every node uses the limit)

    def task(self, ctx: TaskContext, param: Any) -> str:
        if not self.outcome_ok:
            raise ValueError("backend refused")
        return "value"

    def teardown(self) -> None:
        try:
            self.quiesce()
        finally:
            self.patch.undo()
            TRAP.armed = None
            TRAP.runs = []

    # -- steps ----------------------------------------------------------------------------------

    @precondition(lambda self: sum(not r.closed for r in self.runs) < 3)
    @rule()
    def start_run(self) -> None:
        run = FakeRun(self.plan, self.clock, self.executor, self)
        run.economy.ready = [STOCK, PRICE]
        self.runs.append(run)

    def admit(self, run: FakeRun, i: int) -> None:
        """``Run.execute`` from the pop to the attempt: admission, then GO, PARKED or DONE."""
        verdict = guards.admit(run, i)
        if verdict == guards.GO:
            run.attempts[i] += 1
            self.used_tokens += 1
        elif verdict == guards.DONE:
            run.complete(i, 0, *guards.take_outcome(run, i))

    @rule(data=st.data(), point=st.sampled_from((None, None, None, *POINTS)),
          how=st.sampled_from(ENDINGS))
    def pop_and_admit(self, data: st.DataObject, point: str | None, how: str) -> None:
        ready = [(r, i) for r in self.runs if not r.closed for i in r.economy.ready]
        if not ready:
            return
        run, i = data.draw(st.sampled_from(ready))
        run.economy.ready.remove(i)
        with run.lock:
            if not run.alive(i):
                return
            run.move(i, RUNNING)
        if point is not None:  # the node, or its run, ends right after that primitive answers
            TRAP.armed = (point, run.close if how == "close" else lambda: run.end(i, how))
        try:
            self.admit(run, i)
        finally:
            TRAP.armed = None

    @rule(data=st.data(), ok=st.booleans(), retry=st.booleans())
    def attempt_returns(self, data: st.DataObject, ok: bool, retry: bool) -> None:
        running = [(r, i) for r in self.runs for i, g in r.guards.items()
                   if g.current is not None]
        if not running:
            return
        run, i = data.draw(st.sampled_from(running))
        if not guards.attempt_done(run, i, ok):
            return  # a duplicate decides
        if not ok and retry and run.alive(i) and run.attempts[i] < 3:
            self.admit(run, i)  # an immediate retry: back through the gates
            return
        run.complete(i, 0, "value" if ok else None, None if ok else ValueError("refused"))

    @rule(data=st.data(), ok=st.booleans())
    def hedge_returns(self, data: st.DataObject, ok: bool) -> None:
        if not self.executor.calls:
            return
        k = data.draw(st.integers(0, len(self.executor.calls) - 1))
        fn, args = self.executor.calls.pop(k)
        self.outcome_ok = ok
        fn(*args)
        self.outcome_ok = True

    @rule(data=st.data())
    def owner_runs_posted_work(self, data: st.DataObject) -> None:
        busy = [r for r in self.runs if r.inbox]
        if not busy:
            return
        self.run_posted(data.draw(st.sampled_from(busy)))

    @rule(dt=st.sampled_from((0.25, 0.5, 1.0, 3.0, 6.0)), prompt=st.booleans())
    def time_passes(self, dt: float, prompt: bool) -> None:
        self.clock.advance(dt)
        self.timer.fire_due(self.clock.now)
        while prompt and any(r.inbox for r in self.runs):  # the owners were not busy
            for run in self.runs:
                self.run_posted(run)

    @rule()
    def a_moment_passes(self) -> None:
        """(Time passing while attempts run is what starts hedges: a second, likelier rule.)"""
        self.time_passes(0.25, True)

    def run_posted(self, run: FakeRun) -> None:
        if run.inbox:
            fn, args = run.inbox.pop(0)
            before = len(self.executor.calls)
            fn(*args)
            self.used_tokens += len(self.executor.calls) - before  # a hedge took a token

    @precondition(lambda self: len(self.hogs) < 2)
    @rule()
    def another_caller_takes_a_slot(self) -> None:
        permit = self.bulkhead.try_acquire()
        if permit is not None:
            self.hogs.append(permit)

    @precondition(lambda self: bool(self.hogs))
    @rule()
    def another_caller_frees_its_slot(self) -> None:
        self.hogs.pop(0).release()  # the oldest waiter's grant runs here

    @rule(data=st.data(), how=st.sampled_from(ENDINGS), posted=st.booleans())
    def a_node_ends(self, data: st.DataObject, how: str, posted: bool) -> None:
        live = [(r, i) for r in self.runs for i in (STOCK, PRICE) if r.alive(i)]
        if not live:
            return
        run, i = data.draw(st.sampled_from(live))
        if how == "close":
            run.close()
        else:
            run.end(i, how, posted)

    @precondition(lambda self: bool(self.hogs))
    @rule(data=st.data(), how=st.sampled_from(ENDINGS[1:]))
    def a_parked_node_ends_as_its_slot_comes(self, data: st.DataObject, how: str) -> None:
        """The window between a node ending and its release running, with a grant in it."""
        parked = [(r, i) for r in self.runs for i, g in r.guards.items()
                  if g.ticket is not None and r.alive(i)]
        if not parked:
            return
        run, i = data.draw(st.sampled_from(parked))
        run.end(i, how, posted=True)
        self.hogs.pop(0).release()

    @rule(data=st.data())
    def a_leader_times_out_while_its_call_runs(self, data: st.DataObject) -> None:
        leading = [r for r in self.runs if r.alive(STOCK) and STOCK in r.guards
                   and r.guards[STOCK].current is not None]
        if leading:
            data.draw(st.sampled_from(leading)).end(STOCK, "timeout")

    # -- the rule, after every step -------------------------------------------------------------

    def holdings(self) -> tuple[list[guards.Guard], list[guards.Attempt]]:
        gs = [g for r in self.runs for g in r.guards.values()]
        return gs, [a for g in gs for a in ([g.current] if g.current else []) + g.hedges]

    @invariant()
    def each_resource_is_held_once(self) -> None:
        gs, attempts = self.holdings()
        # a node that ended holds nothing for an attempt that will never start
        for r in self.runs:
            for i, g in r.guards.items():
                if not r.alive(i) and i not in r.unreleased:
                    held = (g.ticket, g.reservation, g.bpermit, g.permit, g.token_timer)
                    assert held == (None,) * 5, (r.names[i], held)
                    assert g.wait == 0 or r.code[i] != PARKED
        # a bulkhead's slots are exactly those guards, attempts and other callers hold
        for i, bulkhead in ((STOCK, self.bulkhead), (PRICE, self.roomy)):
            mine = [g for r in self.runs for j, g in r.guards.items() if j == i]
            slots = sum(g.permit is not None for g in mine) + sum(
                a.permit is not None for g in mine for a in ([g.current] if g.current else [])
                + g.hedges)
            m = bulkhead.metrics()
            assert m.in_use == slots + (len(self.hogs) if i == STOCK else 0), (m, slots)
            assert m.waiting == sum(g.ticket is not None and not g.ticket.done() for g in mine)
        # the breaker's trial calls out are exactly the trial permits held
        gen = self.breaker._generation
        trials = [p for p in [g.bpermit for g in gs] + [a.bpermit for a in attempts]
                  if p is not None and p.trial and not p.done and p.generation == gen]
        assert self.breaker.metrics().trials_running == len(trials)
        # every token taken was used by an attempt, is held for one, or was given back
        lm = self.limit.metrics()
        held_tokens = sum(g.reservation is not None for g in gs)
        assert lm.granted - lm.cancelled == self.used_tokens + held_tokens
        # an attempt holds its slot until it returns, and its breaker permit while its node
        # lives (a timeout counts it at once); the shared node runs one attempt at a time
        for r in self.runs:
            for i, g in r.guards.items():
                for a in ([g.current] if g.current else []) + g.hedges:
                    assert a.permit is not None and not a.permit.released
                    assert a.bpermit is not None or not r.alive(i)
        assert sum(g.current is not None for r in self.runs
                   for i, g in r.guards.items() if i == STOCK) <= 1
        # every shared call in flight has a leader that will resolve it or pass it on
        for call in list(self.flight._calls.values()):
            leader = call.leader
            assert leader is not None
            owners = [(r, i, g) for r in self.runs for i, g in r.guards.items()
                      if g.member is leader]
            assert len(owners) == 1, "a shared call's lead has no owner"
            r, i, g = owners[0]
            assert r.alive(i) or i in r.unreleased or g.current is not None or g.hedges

    # -- the end: everything returns, every counter is zero --------------------------------------

    def quiesce(self) -> None:
        for run in self.runs:
            run.close()
        for _ in range(50):
            progressed = False
            for run in self.runs:
                for i, g in list(run.guards.items()):
                    if g.current is not None:
                        if guards.attempt_done(run, i, True):
                            run.complete(i, 0, "value", None)
                        progressed = True
                while run.inbox:
                    self.run_posted(run)
                    progressed = True
            while self.executor.calls:
                fn, args = self.executor.calls.pop(0)
                fn(*args)
                progressed = True
            while self.hogs:
                self.hogs.pop().release()
                progressed = True
            self.clock.advance(5.0)
            self.timer.fire_due(self.clock.now)
            if not progressed:
                break
        for bulkhead in (self.bulkhead, self.roomy):
            m = bulkhead.metrics()
            assert (m.in_use, m.waiting, m.abandoned) == (0, 0, 0), m
        assert self.breaker.metrics().trials_running == 0
        f = self.flight.metrics()
        assert (f.in_flight, f.waiting) == (0, 0), f
        lm = self.limit.metrics()
        assert lm.granted - lm.cancelled == self.used_tokens


TestGuardsMachine = GuardsMachine.TestCase
# a failure is reported as found: shrinking 50 steps of several runs takes minutes
TestGuardsMachine.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, derandomize=True, database=None,
    phases=(Phase.explicit, Phase.generate), print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
