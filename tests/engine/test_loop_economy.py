"""How many worker loops (executor submissions) a run of fast nodes costs.

Each loop is a thread wake-up; under many concurrent requests, loops that find nothing to do cost
CPU and GIL hand-offs for every run (``benchmarks/concurrency.py``). No timing assertions: the
nodes' typical durations are set before each run, the watchdog is either kept out of the way or
observed through its calls.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow import FunctionNode, SchedulingNode, TaskScheduling
from taskflow.engine import economy as economy_mod
from taskflow.model.graph import compile_plan


class CountingPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor that counts its submissions."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="tfcount")
        self.count = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._count_lock:
            self.count += 1
        return super().submit(fn, *args, **kwargs)


def noop(ctx: Any, param: Any) -> None:
    return None


def layered(width: int, depth: int) -> list[SchedulingNode[Any, Any]]:
    """``depth`` layers of ``width`` no-op nodes, each fed by every node of the layer above."""
    layers = [[FunctionNode(noop, name=f"n{d}_{w}") for w in range(width)] for d in range(depth)]
    for upper, lower in itertools.pairwise(layers):
        for node in upper:
            node >> lower
    return layers[0]


def known_fast(tops: list[SchedulingNode[Any, Any]]) -> None:
    """Make every node of the graph 'typically 1 us' (what a no-op measures on a quiet machine)."""
    plan = compile_plan(tuple(tops))
    for i in range(len(plan.est)):
        plan.est[i] = 1e-6


def test_a_few_fast_ready_nodes_share_one_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 fast roots: one loop runs them all (before: one loop per 4 fast nodes, i.e. 2, the second
    # woken for nothing once the first had drained them)
    monkeypatch.setattr(economy_mod, "WATCH", LONG)  # no watchdog loops in this test
    tops = layered(5, 4)
    pool = CountingPool(8)
    try:
        for _ in range(3):  # compile and warm up
            assert TaskScheduling.start(tops, executor=pool, timeout=LONG).ok
        for _ in range(20):
            known_fast(tops)
            before = pool.count
            result = TaskScheduling.start(tops, executor=pool, timeout=LONG)
            assert result.ok and len(result) == 20
            assert pool.count - before == 1
    finally:
        pool.shutdown(wait=True)


def test_fast_nodes_with_enough_expected_work_still_spread() -> None:
    # 6 ready nodes each expected to take most of FAST_TASK: more than one loop for them
    tops = layered(6, 1)
    pool = CountingPool(8)
    try:
        assert TaskScheduling.start(tops, executor=pool, timeout=LONG).ok
        plan = compile_plan(tuple(tops))
        for i in range(len(plan.est)):
            plan.est[i] = economy_mod.FAST_TASK * 0.9
        before = pool.count
        assert TaskScheduling.start(tops, executor=pool, timeout=LONG).ok
        assert pool.count - before == 6  # ceil(6 * 0.9) loops
    finally:
        pool.shutdown(wait=True)


def test_watchdog_adds_no_loop_while_one_is_on_its_way(monkeypatch: pytest.MonkeyPatch,
                                                        gate: Any) -> None:
    # every worker is busy, so the run's loop waits in the executor's queue: the watchdog sees no
    # progress, but another loop would only queue behind it (before: one loop per ready node at
    # every look, all of them finding nothing to do once the first ran)
    tops = layered(5, 2)
    pool = CountingPool(4)
    looks = threading.Event()
    calls = [0]
    watchdog = economy_mod.Economy.watchdog

    def counted(self: Any, progress: int, *args: Any) -> None:
        watchdog(self, progress, *args)
        calls[0] += 1
        if calls[0] >= 3:
            looks.set()

    try:
        assert TaskScheduling.start(tops, executor=pool, timeout=LONG).ok
        known_fast(tops)
        monkeypatch.setattr(economy_mod.Economy, "watchdog", counted)
        release = gate()
        started = [threading.Event() for _ in range(4)]

        def block(ev: threading.Event) -> None:
            ev.set()
            release.wait(LONG)

        for ev in started:
            pool.submit(block, ev)
        for ev in started:
            assert ev.wait(LONG)
        before = pool.count
        fut = TaskScheduling.submit(tops, executor=pool, timeout=LONG)
        assert looks.wait(LONG), "the watchdog never looked"
        assert pool.count - before == 1
        release.set()
        result = fut.result(LONG)
        assert result.ok and len(result) == 10
    finally:
        pool.shutdown(wait=True)


def _order_with_queued_work(markers: int, son_est: float) -> list[str]:
    """On a one-worker pool, ``a1`` queues ``markers`` tasks on the pool and returns; in what
    order do the markers and its son ``a2`` run?"""
    order: list[str] = []
    pool = ThreadPoolExecutor(1, thread_name_prefix="tfyield")

    def a1(ctx: Any, param: Any) -> None:
        order.append("a1")
        for k in range(markers):
            pool.submit(order.append, f"m{k + 1}")

    def a2(ctx: Any, param: Any) -> None:
        order.append("a2")

    first = FunctionNode(a1, name="a1")
    first >> FunctionNode(a2, name="a2")
    try:
        assert TaskScheduling.start(first, executor=pool, timeout=LONG).ok  # compile, warm up
        plan = compile_plan((first,))
        plan.est[plan.index["a1"]] = 0.05
        plan.est[plan.index["a2"]] = son_est
        order.clear()
        assert TaskScheduling.start(first, executor=pool, timeout=LONG).ok
    finally:
        pool.shutdown(wait=True)
    return order


def test_a_loop_leaves_its_thread_to_work_queued_before_its_slow_son() -> None:
    # the pool is behind (3 tasks wait): the son, expected slow, queues behind them instead of
    # overtaking them in the loop that ran its father (cross-run fairness on a shared pool)
    assert _order_with_queued_work(3, 0.05) == ["a1", "m1", "m2", "m3", "a2"]


def test_a_loop_keeps_a_fast_son_and_ignores_a_short_queue() -> None:
    # a fast son is not worth an executor round trip; a couple of queued tasks are usually
    # ones just submitted, their workers waking up (BACKLOG)
    assert _order_with_queued_work(3, 1e-6) == ["a1", "a2", "m1", "m2", "m3"]
    assert economy_mod.BACKLOG == 2
    assert _order_with_queued_work(2, 0.05) == ["a1", "a2", "m1", "m2"]


def test_watchdog_looks_share_timer_wake_ups_across_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run of fast nodes left to one loop arms a watchdog; the timer thread wakes for the
    earliest entry even when it was cancelled (its run finished). The looks fall on multiples of
    WATCH, so the entries of many runs share a few wake-up times, bounded by the time the runs
    took, not by their number (before: one distinct time, so one wake-up, per run)."""
    from taskflow.engine import timer as timer_mod

    whens: list[float] = []
    schedule = timer_mod.timer_thread.schedule

    def recorded(when: float, fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "watchdog":
            whens.append(when)
        return schedule(when, fn, *args)

    monkeypatch.setattr(timer_mod.timer_thread, "schedule", recorded)
    tops = layered(5, 4)
    pool = ThreadPoolExecutor(4)
    try:
        assert TaskScheduling.start(tops, executor=pool, timeout=LONG).ok
        known_fast(tops)
        whens.clear()
        t0 = time.monotonic()
        for _ in range(200):
            assert TaskScheduling.start(tops, executor=pool, timeout=LONG).ok
        elapsed = time.monotonic() - t0
    finally:
        pool.shutdown(wait=True)
    assert len(whens) >= 200  # every run armed one (5 fast roots, one loop)
    assert len(set(whens)) <= elapsed / economy_mod.WATCH + 2


@pytest.mark.parametrize("now", [0.0, 1e-9, 0.0019999, 0.002, 1234.5678901, 98765.4321])
def test_a_watchdog_looks_between_one_and_two_watch_periods_later(now: float) -> None:
    when = economy_mod._watch_time(now)
    assert now + economy_mod.WATCH <= when + 1e-12
    assert when <= now + 2 * economy_mod.WATCH + 1e-12
    assert economy_mod._watch_time(now + 1e-7) in (when, when + economy_mod.WATCH)
