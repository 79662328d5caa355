"""CI-sized soaks of the resilience options in the engine, after ``tests/engine/test_soak.py``.

Sixteen caller threads start one shared graph whose nodes use every option at once (a bulkhead
shared by two nodes, a breaker with a fallback and a node timeout, a rate limit with a hedge,
single flight across runs, priority and ``min_budget``) on one small shared pool, with random
faults (raises, slow calls past the node timeout) and random budgets. Invariants:

* ``start`` returns by its budget plus a generous slack;
* every node is terminal when the run returns, and the status agrees with ``failed``/``degraded``;
* a son whose father ended EXCEPTION/TIMEOUT without a fallback never runs;
* when everything has returned, every bulkhead slot and rate-limit waiter is given back
  (``in_use == 0``, ``waiting == 0``) and no thread is left behind.

The phased soak (marked ``slow``) runs a product page against backends that go healthy -> slow
-> down -> recovering, some calls hanging far past every budget, clients going away at random
moments, every option at once. Besides the above it checks: both bulkheads back to 0 in use
and waiting, no pool worker ever seen waiting inside a gate, the rate limit's bound over every
interval (and a token for every call), only legal breaker moves, no call entering while the
breaker is open beyond those already past their gates, one call per shared key at a time, no
cached value served past its TTL, each outcome hook exactly once and none after its run
returned, and no ERROR logged (an illegal state move is one).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import EPS, LONG, SCALE
from resilience_helpers import logged_errors

from taskflow import (
    Bulkhead,
    CircuitBreaker,
    FlowStatus,
    FunctionNode,
    Hedge,
    RateLimit,
    ResultState,
    TaskContext,
    TaskScheduling,
)
from taskflow.resilience import BreakerState, SingleFlight

FAILED = (ResultState.EXCEPTION, ResultState.TIMEOUT)



def _graph(seed: int) -> tuple[tuple[FunctionNode, ...], Bulkhead, RateLimit]:
    rnd = random.Random(seed)
    lock = threading.Lock()

    def work(ctx: TaskContext, param: Any) -> int:
        with lock:
            r = rnd.random()
            pause = rnd.random() * 0.004
        if r < 0.15:
            raise ValueError("backend refused")
        time.sleep(0.08 if r < 0.25 else pause)
        return 1

    bulkhead = Bulkhead("soak-bulkhead", max_concurrent=3, max_waiting=4)
    breaker = CircuitBreaker("soak-breaker", failure_ratio=0.5, window=10, min_calls=5,
                             open_for=0.05, half_open_calls=1)
    limit = RateLimit("soak-limit", per_second=2000, burst=5)
    a = FunctionNode(work, name="a", bulkhead=bulkhead, fallback=0)
    b = FunctionNode(work, name="b", breaker=breaker, timeout=0.05,
                     fallback=lambda ctx, error: -1)
    c = FunctionNode(work, name="c", rate_limit=limit, hedge=Hedge(after=0.01), idempotent=True)
    d = FunctionNode(work, name="d", bulkhead=bulkhead,
                     share_key=lambda ctx, param: ("sku", ctx["sku"]))
    e = FunctionNode(work, name="e", priority=5, min_budget=0.01)
    sink = FunctionNode(lambda ctx, param: 0, name="sink")
    a >> [b, c]
    b >> d
    c >> d
    [d, e] >> sink
    return (a, e), bulkhead, limit


@pytest.mark.timeout(120)
def test_sixteen_callers_with_every_option_and_random_faults() -> None:
    tops, bulkhead, limit = _graph(seed=12)
    problems: list[Any] = []
    runs = [0]
    lock = threading.Lock()
    before = set(threading.enumerate())

    def caller(k: int, pool: ThreadPoolExecutor) -> None:
        rnd = random.Random(k)
        for _ in range(25):
            budget = rnd.choice((0.03, 0.1, 0.3))
            began = time.monotonic()
            result = TaskScheduling.start(tops, executor=pool, timeout=budget,
                                          context=TaskContext({"sku": rnd.randint(0, 3)}))
            took = time.monotonic() - began
            states = result.states()
            with lock:
                runs[0] += 1
                if took > budget + 4 * EPS:
                    problems.append(("late", took, budget))
                if len(states) != 6 or ResultState.DEFAULT in states.values():
                    problems.append(("not terminal", states))
                if result.status is FlowStatus.COMPLETED and (result.failed or result.degraded):
                    problems.append(("status", result.status, states))
                if states["sink"] is ResultState.SUCCESS and (
                        states["d"] in FAILED or states["e"] in FAILED):
                    problems.append(("a son ran on a failed father", states))
                result.report()  # renders whatever the run holds

    with ThreadPoolExecutor(8, thread_name_prefix="soak-pool") as pool:
        callers = [threading.Thread(target=caller, args=(k, pool)) for k in range(16)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
    # the pool has drained: every abandoned attempt has returned
    assert problems == []
    assert runs[0] == 16 * 25
    held = bulkhead.metrics()
    assert (held.in_use, held.waiting) == (0, 0)
    assert held.granted > 0
    assert limit.metrics().waiting == 0
    left = [t.name for t in set(threading.enumerate()) - before
            if t.is_alive() and not t.name.startswith("taskflow-")]
    assert left == []


# -- the phased soak: a backend that goes healthy -> slow -> down -> recovering --------------------

PHASES = ("healthy", "slow", "down", "recovering")
PHASE_SECONDS = 0.8 * SCALE
HANG = 0.6 * SCALE  # far past every budget below
BUDGETS = (0.1, 0.2, 0.3)
CACHE_TTL = 0.05
SLOTS = 3  # the inventory bulkhead: both inventory nodes and their hedges hold its slots


class Phased:
    """The backends of one product page, following the phase of the clock: fast, then slow
    (some calls hang), then down (failing at once, some hanging), then recovering (flaky)."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.t0 = time.monotonic()
        self.breaker = breaker
        self.stop = threading.Event()  # releases every hung call at the end
        self.lock = threading.Lock()
        self.rnd = random.Random(25)
        self.in_flight: dict[Any, int] = {}  # share key -> calls running
        self.most_in_flight = 0
        self.calls = {"stock": 0, "price": 0, "reviews": 0}
        self.open_calls: dict[int, int] = {}  # breaker OPEN period -> calls that entered in it

    def phase(self) -> str | None:
        k = int((time.monotonic() - self.t0) / PHASE_SECONDS)
        return PHASES[k] if k < len(PHASES) else None

    def call(self, name: str, key: Any = None) -> float:
        m = self.breaker.metrics()
        with self.lock:
            self.calls[name] += 1
            if name != "reviews" and m.state is BreakerState.OPEN:
                period = sum(m.transitions.values())
                self.open_calls[period] = self.open_calls.get(period, 0) + 1
            if key is not None:
                n = self.in_flight[key] = self.in_flight.get(key, 0) + 1
                self.most_in_flight = max(self.most_in_flight, n)
            r = self.rnd.random()
        try:
            self._behave(self.phase() or "healthy", r)
            return time.monotonic()
        finally:
            if key is not None:
                with self.lock:
                    self.in_flight[key] -= 1

    def _behave(self, phase: str, r: float) -> None:
        if phase == "slow":
            if r < 0.1:
                self.stop.wait(HANG)
            else:
                time.sleep(0.01 + r * 0.05)
        elif phase == "down":
            if r < 0.1:
                self.stop.wait(HANG)
            raise ConnectionError("backend down")
        elif phase == "recovering" and r < 0.4:
            raise ConnectionError("backend flaky")
        else:
            time.sleep(r * 0.002)


class HookCount:
    """Outcome hooks per (request, node), and those that started after their request returned."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[tuple[int, str], list[str]] = {}
        self.returned: set[int] = set()
        self.late: list[tuple[int, str]] = []

    def record(self, support: Any, kind: str) -> None:
        rid = support.context["rid"]
        with self.lock:
            self.seen.setdefault((rid, support.node.name), []).append(kind)
            if rid in self.returned:
                self.late.append((rid, support.node.name))


class Hooked(FunctionNode):
    hooks: HookCount

    def on_success(self, support: Any) -> None:
        self.hooks.record(support, "success")

    def on_fail(self, support: Any) -> None:
        self.hooks.record(support, "fail")


class CountingLimit(RateLimit):
    """A rate limit that keeps the time of every token it hands out (and the ones given back)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready: list[float] = []
        self.returned: list[float] = []
        super().__init__(*args, **kwargs)

    def _take(self, now: float, ready: float) -> Any:
        self.ready.append(ready)  # under the limit's lock
        return super()._take(now, ready)

    def _cancel(self, reservation: Any) -> bool:
        back = super()._cancel(reservation)
        if back:
            with self._lock:
                self.returned.append(reservation.ready_at)
        return back


class MovesBreaker(CircuitBreaker):
    """A breaker that keeps every move it makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.moves: list[tuple[BreakerState, BreakerState]] = []
        super().__init__(*args, **kwargs)

    def _move(self, to: BreakerState, why: str) -> None:
        self.moves.append((self._state, to))  # under the breaker's lock
        super()._move(to, why)


class ResolvedAt(SingleFlight):
    """A single flight that keeps when each shared value was resolved (and could be cached)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.resolved: dict[float, float] = {}
        super().__init__(*args, **kwargs)

    def _resolve(self, call: Any, state: int, value: Any, error: BaseException | None) -> bool:
        done = super()._resolve(call, state, value, error)
        if done and error is None:
            self.resolved[value["made"]] = time.monotonic()  # at or after the cache's entry
        return done


def _parked_workers(prefix: str) -> list[str]:
    """Pool threads seen blocked in a wait that the gates or the resilience primitives called
    (a task waiting in its own code is not one)."""
    frames = sys._current_frames()
    out = []
    for t in threading.enumerate():
        frame = frames.get(t.ident or -1)
        if not t.name.startswith(prefix) or frame is None:
            continue
        if not (frame.f_code.co_filename.endswith("threading.py")
                and frame.f_code.co_name in ("wait", "wait_for")):
            continue
        while frame is not None and frame.f_code.co_filename.endswith("threading.py"):
            frame = frame.f_back
        caller = "" if frame is None else frame.f_code.co_filename
        if caller.endswith(os.path.join("engine", "guards.py")) or (
                os.path.join("taskflow", "resilience") in caller):
            out.append(t.name)
    return out


def _page(backend: Phased, bulkhead: Bulkhead, limit: RateLimit, hooks: HookCount,
          flight: SingleFlight, small: Bulkhead) -> tuple[Hooked, ...]:
    Hooked.hooks = hooks

    def stock(ctx: TaskContext, param: Any) -> dict[str, Any]:
        return {"sku": ctx["sku"], "made": backend.call("stock", ctx["sku"])}

    def price(ctx: TaskContext, param: Any) -> float:
        return backend.call("price")

    def reviews(ctx: TaskContext, param: Any) -> float:
        return backend.call("reviews")

    breaker = backend.breaker
    a = Hooked(stock, name="stock", bulkhead=bulkhead, breaker=breaker, timeout=0.08,
               share_key=lambda ctx, p: ctx["sku"], cache_ttl=CACHE_TTL,
               fallback={"sku": None, "made": None})
    a._policy.flight = flight  # the same options; it also says when each value was resolved
    b = Hooked(price, name="price", bulkhead=bulkhead, breaker=breaker, rate_limit=limit,
               hedge=Hedge(after=0.02, max_extra=1), idempotent=True, fallback=-1.0)
    c = Hooked(reviews, name="reviews", bulkhead=small,
               priority=5, min_budget=0.05, retries=1, timeout=0.1)
    render = Hooked(lambda ctx, p: "page", name="render")
    [a, b, c] >> render
    return a, b, c


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_backend_going_slow_down_and_back_leaks_nothing_with_every_option_at_once() -> None:
    breaker = MovesBreaker("soak-inventory", failure_ratio=0.5, window=10, min_calls=5,
                           open_for=0.1, half_open_calls=1)
    backend = Phased(breaker)
    bulkhead = Bulkhead("soak-inventory", max_concurrent=SLOTS, max_waiting=8)
    limit = CountingLimit("soak-price", per_second=300, burst=10)
    flight = ResolvedAt("stock", cache_ttl=CACHE_TTL)
    small = Bulkhead("soak-reviews", max_concurrent=2)
    hooks = HookCount()
    tops = _page(backend, bulkhead, limit, hooks, flight, small)
    problems: list[Any] = []
    served: list[tuple[float, float]] = []  # (run started, the shared value it got was made)
    runs = [0]
    lock = threading.Lock()
    parked: list[str] = []
    samples = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.003):
            parked.extend(_parked_workers("soak-phased"))
            samples[0] += 1

    def caller(k: int, pool: ThreadPoolExecutor) -> None:
        rnd = random.Random(k)
        while backend.phase() is not None:
            rid = k * 100_000 + runs[0]
            budget = rnd.choice(BUDGETS)
            ctx = TaskContext({"sku": rnd.randint(0, 3), "rid": rid})
            began = time.monotonic()
            if rnd.random() < 0.15:  # the client goes away at a random moment
                future = TaskScheduling.submit(tops, executor=pool, timeout=budget, context=ctx)
                time.sleep(rnd.random() * budget)  # stands in for the client's patience
                ctx.cancel("client went away")
                result = future.result(LONG)
            else:
                result = TaskScheduling.start(tops, executor=pool, timeout=budget, context=ctx)
            took = time.monotonic() - began
            with hooks.lock:
                hooks.returned.add(rid)
            states = result.states()
            wr = result.result_of("stock")
            with lock:
                runs[0] += 1
                if took > budget + 4 * EPS:
                    problems.append(("late", took, budget))
                if ResultState.DEFAULT in states.values():
                    problems.append(("not terminal", states))
                if wr.shared and wr.state is ResultState.SUCCESS:
                    served.append((began, wr.result["made"]))
                per_node = {name: states[name] for name in ("stock", "price", "reviews", "render")}
            for name, state in per_node.items():
                expect = [] if state is ResultState.SKIPPED else (
                    ["success"] if state is ResultState.SUCCESS else ["fail"])
                with hooks.lock:
                    got = hooks.seen.get((rid, name), [])
                if got != expect:
                    with lock:
                        problems.append(("hooks", name, state, got))

    sampler = threading.Thread(target=sample, name="soak-sampler")
    sampler.start()
    try:
        with logged_errors() as errors, ThreadPoolExecutor(
                8, thread_name_prefix="soak-phased") as pool:
            callers = [threading.Thread(target=caller, args=(k, pool), name=f"soak-caller-{k}")
                       for k in range(12)]
            for t in callers:
                t.start()
            for t in callers:
                t.join(LONG * 6)
            backend.stop.set()  # hung calls return: the pool drains
    finally:
        backend.stop.set()
        sampling.set()
        sampler.join(LONG)
    assert problems == [] and hooks.late == []
    assert runs[0] > 100
    assert errors == []  # no illegal state move, no internal error
    # every slot and queue place came back; no worker ever waited in a gate
    for bh in (bulkhead, small):
        m = bh.metrics()
        assert (m.in_use, m.waiting, m.abandoned) == (0, 0, 0), m
    assert parked == [] and samples[0] > 10
    # the rate limit's bound held over every interval, and every price call had a token
    used = sorted(limit.ready)
    for t in limit.returned:
        used.remove(t)
    for lo, start in enumerate(used):
        for hi in range(lo, len(used)):
            assert hi - lo + 1 <= limit.burst + limit.per_second * (used[hi] - start) + 1e-6
    assert backend.calls["price"] <= len(used)
    # the breaker moved only along its table; it opened and recovered; no call ran while it
    # was open but those already past their gates (each holds an inventory slot)
    legal = {(BreakerState.CLOSED, BreakerState.OPEN), (BreakerState.OPEN, BreakerState.HALF_OPEN),
             (BreakerState.HALF_OPEN, BreakerState.CLOSED),
             (BreakerState.HALF_OPEN, BreakerState.OPEN)}
    assert breaker.moves and breaker.moves[0][0] is BreakerState.CLOSED
    assert all(move in legal for move in breaker.moves)
    assert all(a[1] is b[0] for a, b in itertools.pairwise(breaker.moves))
    assert (BreakerState.HALF_OPEN, BreakerState.CLOSED) in breaker.moves
    assert all(n <= SLOTS for n in backend.open_calls.values()), backend.open_calls
    assert breaker.metrics().trials_running == 0
    # one call per key at a time, and a cached value never served past its TTL
    assert backend.most_in_flight == 1
    fm = flight.metrics()
    assert (fm.in_flight, fm.waiting) == (0, 0) and fm.cache_hits > 0 and served
    assert all(began < flight.resolved[made] + CACHE_TTL for began, made in served)
