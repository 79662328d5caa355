"""Every slot, token, breaker permit and shared call a node's gates take is given back, whichever
way the node ends: ``min_budget`` refusing it after a wait, its run closing while the gates run,
a hedge that needs the breaker's leave like any other call."""

from __future__ import annotations

import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, SHORT
from resilience_helpers import FakeClock, logged_errors, wait_until

from taskflow import (
    Bulkhead,
    CircuitBreaker,
    FunctionNode,
    Hedge,
    NodeTimeoutError,
    RateLimit,
    ResultState,
    TaskContext,
    TaskScheduling,
)
from taskflow.resilience import BreakerState
from taskflow.testing import FakeClock as VirtualClock


class Hog:
    """A task that holds its bulkhead slot until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, ctx: TaskContext, param: Any) -> str:
        self.entered.set()
        self.release.wait(LONG)
        return "hog"


def half_open(name: str) -> CircuitBreaker:
    """A breaker (on a fake clock) that is HALF_OPEN with its one trial call free."""
    clock = FakeClock()
    breaker = CircuitBreaker(name, window=1, min_calls=1, open_for=1.0, half_open_calls=1,
                             clock=clock)
    breaker.record(breaker.allow(), False)
    clock.advance(1.0)
    assert breaker.state is BreakerState.HALF_OPEN
    return breaker


def trial_is_free(breaker: CircuitBreaker) -> bool:
    """The breaker's trial permit is not held by anybody (taking it here gives it back)."""
    try:
        permit = breaker.allow()
    except Exception:  # noqa: BLE001 - CircuitOpenError: the trial is held
        return False
    breaker.discard(permit)
    return True


def budget_note(wr: Any) -> str:
    return " ".join(getattr(wr.exception, "__notes__", ()))


def test_min_budget_refusing_after_a_slot_wait_gives_back_slot_trial_and_token() -> None:
    bulkhead = Bulkhead("one-slot", max_concurrent=1)
    breaker = half_open("after-slot")
    limit = RateLimit("after-slot", per_second=1000, burst=1)
    hog = Hog()
    budget = 4 * MEDIUM
    node = FunctionNode(lambda c, p: "ran", name="page", bulkhead=bulkhead, breaker=breaker,
                        rate_limit=limit, min_budget=budget / 2)
    with ThreadPoolExecutor(3, thread_name_prefix="give-back") as pool, \
            VirtualClock() as fake:
        first = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                      executor=pool, timeout=LONG)
        assert hog.entered.wait(LONG)
        waiter = TaskScheduling.submit(node, executor=pool, timeout=budget)
        wait_until(lambda: bulkhead.metrics().waiting == 1)  # it holds the trial and a token
        # the slot comes when less than min_budget is left: the node must not start
        fake.advance(0.6 * budget)
        hog.release.set()
        result = waiter.result(LONG)
        first.result(LONG)
        m = bulkhead.metrics()
        assert (m.in_use, m.waiting) == (0, 0)
        assert trial_is_free(breaker)
        assert limit.metrics().cancelled == 1
        again = TaskScheduling.start(FunctionNode(lambda c, p: "next", name="next",
                                                  bulkhead=bulkhead), executor=pool,
                                     timeout=LONG)
    wr = result.result_of("page")
    assert wr.state is ResultState.TIMEOUT and wr.attempts == 0
    assert isinstance(wr.exception, NodeTimeoutError) and "min_budget" in budget_note(wr)
    assert again.ok


def test_min_budget_refusing_after_a_token_wait_gives_back_the_token_and_the_trial() -> None:
    budget = 4 * MEDIUM
    limit = RateLimit("after-token", per_second=1 / (0.6 * budget), burst=1)
    assert limit.reserve() is not None  # the bucket is empty: the next token is 0.6 budget away
    breaker = half_open("after-token")
    node = FunctionNode(lambda c, p: "ran", name="page", breaker=breaker, rate_limit=limit,
                        min_budget=budget / 2)
    with ThreadPoolExecutor(2) as pool, VirtualClock(autojump=True):
        result = TaskScheduling.start(node, executor=pool, timeout=budget)
    wr = result.result_of("page")
    assert wr.state is ResultState.TIMEOUT and wr.attempts == 0
    assert "min_budget" in budget_note(wr)
    assert limit.metrics().cancelled == 1
    assert trial_is_free(breaker)


def test_a_leader_refused_by_min_budget_after_a_wait_hands_the_lead_to_a_waiting_run() -> None:
    bulkhead = Bulkhead("lead", max_concurrent=1)
    hog = Hog()
    budget = 4 * MEDIUM
    calls: list[str] = []

    def backend(ctx: TaskContext, param: Any) -> str:
        calls.append(ctx["run"])
        return str(ctx["run"])

    node = FunctionNode(backend, name="stock", bulkhead=bulkhead, min_budget=budget / 2,
                        share_key=lambda ctx, p: "sku")
    flight = node._policy.flight
    with ThreadPoolExecutor(3, thread_name_prefix="lead") as pool, VirtualClock() as fake:
        held = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                     executor=pool, timeout=LONG)
        assert hog.entered.wait(LONG)
        hurried = TaskScheduling.submit(node, executor=pool, timeout=budget,
                                        context=TaskContext(run="hurried"))
        wait_until(lambda: bulkhead.metrics().waiting == 1)  # it leads, and waits for the slot
        patient = TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                        context=TaskContext(run="patient"))
        wait_until(lambda: flight.metrics().waiting == 1)  # it waits for the leader's call
        fake.advance(0.6 * budget)
        hog.release.set()
        refused, served = hurried.result(LONG), patient.result(LONG)
        held.result(LONG)
    assert refused.result_of("stock").state is ResultState.TIMEOUT
    assert "min_budget" in budget_note(refused.result_of("stock"))
    # the hurried run's budget was its own: the patient run led the call itself
    assert served.ok and served.outputs == {"stock": "patient"} and calls == ["patient"]
    assert not served.result_of("stock").shared


def test_a_run_closing_while_its_node_passes_the_gates_orphans_nothing() -> None:
    bulkhead = Bulkhead("closing", max_concurrent=1)
    breaker = half_open("closing")
    hog = Hog()
    keyed = threading.Event()
    go_on = threading.Event()
    calls: list[str] = []

    def key(ctx: TaskContext, param: Any) -> str:
        if not ctx.get("later"):
            keyed.set()
            go_on.wait(LONG)  # the run's budget passes while its node is being admitted
        return "sku-1"

    node = FunctionNode(lambda c, p: calls.append("call") or "stock", name="stock",
                        bulkhead=bulkhead, breaker=breaker, share_key=key)
    flight = node._policy.flight
    with logged_errors() as errors, ThreadPoolExecutor(
            1, thread_name_prefix="hog") as other, ThreadPoolExecutor(
            1, thread_name_prefix="admit") as pool:
        held = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                     executor=other, timeout=LONG)
        assert hog.entered.wait(LONG)
        closed = TaskScheduling.start(node, executor=pool, timeout=SHORT)
        assert keyed.is_set() and closed.result_of("stock").state is ResultState.TIMEOUT
        go_on.set()
        pool.submit(lambda: None).result(LONG)  # the one worker has finished the admission
        assert flight.metrics().in_flight == 0  # no shared call left without a leader
        assert trial_is_free(breaker)
        assert bulkhead.metrics().waiting == 0
        hog.release.set()
        held.result(LONG)
        later = TaskScheduling.start(node, executor=pool, timeout=LONG,
                                     context=TaskContext(later=True))
    assert later.ok and later.outputs == {"stock": "stock"} and calls == ["call"]
    assert not later.result_of("stock").shared
    assert breaker.state is BreakerState.CLOSED  # its trial call succeeded
    assert errors == []


@pytest.mark.timeout(120)
def test_runs_closed_at_random_moments_leave_no_slot_trial_or_shared_call_behind() -> None:
    bulkhead = Bulkhead("random-close", max_concurrent=2, max_waiting=64)
    clock = FakeClock()
    breaker = CircuitBreaker("random-close", window=4, min_calls=2, failure_ratio=0.5,
                             open_for=1.0, half_open_calls=1, clock=clock)
    limit = RateLimit("random-close", per_second=5000, burst=8)
    rnd = random.Random(25)
    lock = threading.Lock()

    def backend(ctx: TaskContext, param: Any) -> int:
        with lock:
            r = rnd.random()
        if r < 0.3:
            raise ValueError("backend refused")
        time.sleep(r * 0.002)
        return 1

    nodes = [FunctionNode(backend, name="stock", bulkhead=bulkhead, breaker=breaker,
                          rate_limit=limit, share_key=lambda ctx, p: ("stock", ctx["sku"]))]
    nodes += [FunctionNode(backend, name=f"price{k}", bulkhead=bulkhead, breaker=breaker,
                           share_key=lambda ctx, p: ("price", ctx["sku"]), min_budget=0.001)
              for k in range(2)]
    flights = {n._policy.flight for n in nodes}

    def caller(k: int, pool: ThreadPoolExecutor) -> None:
        mine = random.Random(k)
        for _ in range(40):
            ctx = TaskContext(sku=mine.randint(0, 2))
            future = TaskScheduling.submit(nodes, executor=pool, timeout=mine.choice(
                (0.002, 0.01, 0.05)), context=ctx)
            pause = mine.random() * 0.003
            if pause > 0.001:
                time.sleep(pause)  # stands in for the request's other work
                ctx.cancel("client went away")
            future.result(LONG)
            if mine.random() < 0.2:
                clock.advance(1.0)  # an open breaker lets a trial through

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: admissions and closes interleave
    try:
        with logged_errors() as errors, ThreadPoolExecutor(
                4, thread_name_prefix="random-close") as pool:
            callers = [threading.Thread(target=caller, args=(k, pool), name=f"caller-{k}")
                       for k in range(8)]
            for t in callers:
                t.start()
            for t in callers:
                t.join(LONG * 6)
            assert not any(t.is_alive() for t in callers)
    finally:
        sys.setswitchinterval(interval)
    # the pool has drained: every attempt returned, every callback ran
    m = bulkhead.metrics()
    assert (m.in_use, m.waiting, m.abandoned) == (0, 0, 0)
    assert all(f.metrics().in_flight == 0 and f.metrics().waiting == 0 for f in flights)
    clock.advance(1.0)
    assert breaker.state is not BreakerState.HALF_OPEN or trial_is_free(breaker)
    assert limit.metrics().waiting == 0
    assert errors == []


def test_a_hedge_takes_the_breakers_leave_so_a_half_open_breaker_sees_one_call() -> None:
    breaker = half_open("hedged")
    calls = []
    release = threading.Event()

    def backend(ctx: TaskContext, param: Any) -> str:
        calls.append(1)
        release.wait(LONG)
        return "price"

    node = FunctionNode(backend, name="price", breaker=breaker, idempotent=True,
                        hedge=Hedge(after=SHORT / 5, max_extra=2))
    with ThreadPoolExecutor(4, thread_name_prefix="hedged") as pool:
        future = TaskScheduling.submit(node, executor=pool, timeout=LONG)
        # the trial call runs; each hedge the timer tries is refused by the breaker
        wait_until(lambda: breaker.metrics().rejected >= 2 or len(calls) > 1)
        release.set()
        result = future.result(LONG)
    assert len(calls) == 1
    assert result.ok and result.result_of("price").hedges == 0
    assert breaker.state is BreakerState.CLOSED


def test_every_call_a_hedged_node_makes_is_counted_by_its_breaker() -> None:
    breaker = CircuitBreaker("counted", window=20, min_calls=20)
    lock = threading.Lock()
    calls = []

    def backend(ctx: TaskContext, param: Any) -> str:
        with lock:
            n = len(calls)
            calls.append(n)
        if n == 0:  # the first attempt is slow; it stops when its node is decided
            end = time.monotonic() + LONG
            while not ctx.cancelled and time.monotonic() < end:
                time.sleep(0.001)
            return "slow"
        return "hedge"

    node = FunctionNode(backend, name="price", breaker=breaker, idempotent=True,
                        hedge=Hedge(after=SHORT / 5, max_extra=1))
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
        wait_until(lambda: breaker.metrics().successes + breaker.metrics().failures >= 2)
    assert result.outputs == {"price": "hedge"} and result.result_of("price").hedges == 1
    m = breaker.metrics()
    assert len(calls) == 2 and (m.successes, m.failures) == (2, 0)
