"""Bulkheads and rate limits in runs: waiting holds no worker, lasts at most the run's budget.

The tests about when a wait ends (a deadline, a refill, "at once") run on virtual time (the
``fake_clock`` fixture) and assert the exact times; the hog waits with ``clock.wait``, which is
the plain wait outside a fake clock. Where a hog holds a slot across runs, time moves by hand
(``advance``), so it never reaches the hog's own wait and frees the slot early."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import remote_tasks
from conftest import LONG, SHORT

from taskflow import (
    Bulkhead,
    BulkheadFullError,
    CircuitBreaker,
    FlowDefinitionError,
    FunctionNode,
    Hedge,
    NodeTimeoutError,
    RateLimit,
    ResultState,
    TaskScheduling,
    clock,
)


class Hog:
    """A task that holds its bulkhead slot until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, ctx, param):
        self.entered.set()
        clock.wait(self.release, LONG)
        return "hog"


def test_waiting_for_a_slot_holds_no_worker():
    bulkhead = Bulkhead("inventory", max_concurrent=1)
    hog = Hog()
    free_ran = threading.Event()
    running = []
    peak = []
    lock = threading.Lock()

    def stock(ctx, param):
        with lock:
            running.append(param)
            peak.append(len(running))
        with lock:
            running.remove(param)
        return param

    with ThreadPoolExecutor(2, thread_name_prefix="res-gate") as pool:
        first = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                      executor=pool, timeout=LONG)
        assert hog.entered.wait(LONG)
        waiters = [FunctionNode(stock, param=k, name=f"stock{k}", bulkhead=bulkhead)
                   for k in range(4)]
        free = FunctionNode(lambda ctx, p: free_ran.set(), name="free")
        second = TaskScheduling.submit([*waiters, free], executor=pool, timeout=LONG)
        # four nodes wait for the slot, yet the pool's one other worker still runs "free"
        assert free_ran.wait(LONG)
        assert bulkhead.metrics().waiting == 4
        hog.release.set()
        result = second.result(LONG)
        first.result(LONG)
    assert result.ok and result.outputs == {f"stock{k}": k for k in range(4)} | {"free": None}
    assert max(peak) == 1
    assert bulkhead.metrics().in_use == 0


@pytest.mark.fake_clock(autojump=False)
def test_waiting_for_a_slot_ends_timeout_at_the_deadline_never_run(fake_clock):
    bulkhead = Bulkhead("b", max_concurrent=1)
    hog = Hog()
    ran = []
    with ThreadPoolExecutor(2) as pool:
        first = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                      executor=pool, timeout=LONG)
        assert hog.entered.wait(LONG)
        waiting = TaskScheduling.submit(
            FunctionNode(lambda c, p: ran.append(1), name="wait", bulkhead=bulkhead),
            executor=pool, timeout=SHORT)
        assert fake_clock.wait_until_blocked()
        fake_clock.advance(SHORT)
        result = waiting.result(LONG)
        assert bulkhead.metrics().waiting == 0  # its ticket left the queue
        hog.release.set()
        first.result(LONG)
    wr = result.result_of("wait")
    assert wr.state is ResultState.TIMEOUT and wr.attempts == 0 and not ran
    assert result.elapsed == pytest.approx(SHORT)  # at its deadline, not later


@pytest.mark.fake_clock(autojump=False)
def test_bulkhead_full_fails_at_once(fake_clock):
    bulkhead = Bulkhead("b", max_concurrent=1, max_waiting=0)
    hog = Hog()
    with ThreadPoolExecutor(2) as pool:
        first = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                      executor=pool, timeout=LONG)
        assert hog.entered.wait(LONG)
        result = TaskScheduling.start(
            FunctionNode(lambda c, p: 1, name="refused", bulkhead=bulkhead,
                         breaker=CircuitBreaker("b2")),
            executor=pool, timeout=LONG)
        degraded = TaskScheduling.start(
            FunctionNode(lambda c, p: 1, name="refused", bulkhead=bulkhead, fallback="later"),
            executor=pool, timeout=LONG)
        hog.release.set()
        first.result(LONG)
    assert isinstance(result.result_of("refused").exception, BulkheadFullError)
    assert result.elapsed == 0 and degraded.elapsed == 0  # no time passed
    assert degraded.outputs == {"refused": "later"}
    assert bulkhead.metrics().rejected == 2


@pytest.mark.fake_clock(autojump=False)
def test_abandoned_attempt_keeps_its_slot_until_it_returns(fake_clock):
    bulkhead = Bulkhead("b", max_concurrent=1)
    hog = Hog()
    order = []
    with ThreadPoolExecutor(3) as pool:
        hogging = TaskScheduling.submit(
            FunctionNode(hog, name="hog", bulkhead=bulkhead, timeout=SHORT),
            executor=pool, timeout=LONG)
        assert fake_clock.wait_until_blocked()
        fake_clock.advance(SHORT)
        result = hogging.result(LONG)
        assert result.result_of("hog").state is ResultState.TIMEOUT
        assert result.elapsed == pytest.approx(SHORT)
        m = bulkhead.metrics()
        assert (m.in_use, m.abandoned) == (1, 1)
        later = TaskScheduling.submit(
            FunctionNode(lambda c, p: order.append("next"), name="next", bulkhead=bulkhead),
            executor=pool, timeout=LONG)
        order.append("release")
        hog.release.set()
        assert later.result(LONG).ok
    assert order == ["release", "next"]
    assert bulkhead.metrics().in_use == 0 and bulkhead.metrics().abandoned == 0


def test_rate_limit_spaces_attempts_without_holding_workers(fake_clock):
    limit = RateLimit("api", per_second=40, burst=1)
    starts = []
    nodes = [FunctionNode(lambda c, p: starts.append(fake_clock.now()), name=f"n{k}",
                          rate_limit=limit) for k in range(3)]
    free_ran = threading.Event()
    free = FunctionNode(lambda c, p: free_ran.set(), name="free")
    with ThreadPoolExecutor(1) as pool:
        result = TaskScheduling.start([*nodes, free], executor=pool, timeout=LONG)
    assert result.ok and free_ran.is_set()
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == [pytest.approx(0.025)] * 2, gaps  # one token every 25 ms, exactly
    assert limit.metrics().granted == 3


def test_rate_limit_without_a_token_in_the_budget_times_out_at_once(fake_clock):
    limit = RateLimit("slow", per_second=0.01, burst=1)
    with ThreadPoolExecutor(2) as pool:
        first = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="a", rate_limit=limit),
                                     executor=pool, timeout=LONG)
        second = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="b", rate_limit=limit),
                                      executor=pool, timeout=LONG)
    assert first.ok and second.elapsed == 0  # no waiting for a token that cannot come in time
    wr = second.result_of("b")
    assert wr.state is ResultState.TIMEOUT and isinstance(wr.exception, NodeTimeoutError)
    assert wr.attempts == 0 and limit.metrics().timed_out == 1


def test_bulkhead_breaker_fallback_work_on_a_process_pool():
    bulkhead = Bulkhead("remote", max_concurrent=1)
    breaker = CircuitBreaker("remote", window=2, min_calls=2)
    nodes = [FunctionNode(remote_tasks.sleep_for, param=0.01, name=f"s{k}", bulkhead=bulkhead,
                          breaker=breaker) for k in range(3)]
    failing = FunctionNode(remote_tasks.fail, param="down", name="f",
                           fallback=lambda ctx, error: "fallback")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        result = TaskScheduling.start([*nodes, failing], executor=pool, timeout=LONG)
    assert result.ok, result.failed
    assert result.outputs["f"] == "fallback"
    assert bulkhead.metrics().granted == 3 and bulkhead.metrics().in_use == 0
    assert breaker.metrics().successes == 3


def test_hedge_on_a_process_pool_is_refused_before_anything_runs():
    node = FunctionNode(remote_tasks.const, param=1, name="h", hedge=Hedge(after=0.01),
                        idempotent=True)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool, pytest.raises(
            FlowDefinitionError, match="'h': hedge is not supported on ProcessPoolExecutor"):
        TaskScheduling.start(node, executor=pool, timeout=LONG)


def test_a_parked_node_of_a_nested_inline_run_resumes():
    bulkhead = Bulkhead("nested", max_concurrent=1)
    hog = Hog()

    def outer(ctx, param):
        inner = FunctionNode(lambda c, p: "inner", name="inner", bulkhead=bulkhead)
        return TaskScheduling.start(inner, executor=pool, timeout=LONG).outputs

    with ThreadPoolExecutor(1) as other, ThreadPoolExecutor(1) as pool:
        first = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                      executor=other, timeout=LONG)
        assert hog.entered.wait(LONG)
        nested = TaskScheduling.submit(FunctionNode(outer, name="outer"), executor=pool,
                                       timeout=LONG)
        end = time.monotonic() + LONG
        while bulkhead.metrics().waiting == 0 and time.monotonic() < end:
            time.sleep(0.001)  # until the inner node is parked on the one-thread pool
        hog.release.set()
        assert nested.result(LONG).outputs == {"outer": {"inner": "inner"}}
        first.result(LONG)


def test_a_parked_node_cancelled_by_its_join_gives_its_place_back():
    from taskflow import Join

    bulkhead = Bulkhead("join", max_concurrent=1)
    hog = Hog()
    with ThreadPoolExecutor(3) as pool:
        first = TaskScheduling.submit(FunctionNode(hog, name="hog", bulkhead=bulkhead),
                                      executor=pool, timeout=LONG)
        assert hog.entered.wait(LONG)
        parked = FunctionNode(lambda c, p: "slow", name="parked", bulkhead=bulkhead)
        quick = FunctionNode(lambda c, p: "quick", name="quick")
        either = FunctionNode(lambda c, p: "done", name="either", join=Join.ANY)
        [parked, quick] >> either
        result = TaskScheduling.start(either, executor=pool, timeout=LONG)
        assert result.result_of("parked").state is ResultState.CANCELLED
        hog.release.set()
        first.result(LONG)
        later = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="later",
                                                  bulkhead=bulkhead), executor=pool,
                                     timeout=LONG)
    assert later.ok and bulkhead.metrics().in_use == 0
