"""No worker idles while a task waits: ThreadPool's wake-ups, at every pool size.

A lost wake-up does not make anything fail; it makes a burst of k tasks run k/2 wide and a quick
task wait behind a long one while other threads sleep. These tests turn that into a failure:
tasks that can only finish together (a Barrier of k) must all start, and a quick task submitted
behind a blocked one must run while the blocked one still blocks. Threads are ordered with
Barriers and Events only; the timeouts are generous bounds that a correct pool never reaches.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
import test_pool_flows
from conftest import LONG

from taskflow import FunctionNode, ResultState, TaskContext, TaskScheduling
from taskflow.pools.monitored import MonitoredExecutor
from taskflow.pools.threadpool import ThreadPool

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 16]

# the same fixtures: a gate opened at teardown, pools shut down and required to terminate
gate = test_pool_flows.gate
make_pool = test_pool_flows.make_pool


def run_together(pool: ThreadPool, k: int) -> None:
    """Submit k tasks that can only return once all k run at the same time; all must return."""
    barrier = threading.Barrier(k, timeout=LONG)
    futures = [pool.submit(barrier.wait) for _ in range(k)]
    for f in futures:
        f.result(timeout=2 * LONG)  # BrokenBarrierError if one never started


def warm(pool: ThreadPool, size: int) -> None:
    """Start every core thread (each with a first task) and wait until all are idle."""
    run_together(pool, size)
    settle_idle(pool, size)


def settle_idle(pool: ThreadPool, size: int) -> None:
    """Wait until ``size`` threads are idle, waiting for a wake-up (by polling the metrics)."""
    deadline = threading.Event()
    timer = threading.Timer(LONG, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            m = pool.metrics()
            if m.pool_size == size and m.active_count == 0:
                return
            deadline.wait(0.001)
        raise AssertionError(f"pool never went idle: {pool!r}")
    finally:
        timer.cancel()


@pytest.mark.parametrize("size", SIZES)
def test_a_burst_on_a_warmed_pool_runs_as_wide_as_the_pool(
    make_pool: Callable[..., ThreadPool], size: int
) -> None:
    pool = make_pool(size)
    warm(pool, size)
    for _ in range(5):  # each round is a fresh chance to lose a wake-up
        run_together(pool, size)
        settle_idle(pool, size)
    m = pool.metrics()
    assert (m.pool_size, m.largest_pool_size, m.completed_task_count) == (size, size, 6 * size)


@pytest.mark.parametrize("size", SIZES)
def test_a_burst_through_a_monitored_pool_runs_as_wide_as_the_pool(
    make_pool: Callable[..., ThreadPool], size: int
) -> None:
    pool = make_pool(size)
    mon = MonitoredExecutor(pool)
    warm(pool, size)
    for _ in range(3):
        barrier = threading.Barrier(size, timeout=LONG)
        futures = [mon.submit(barrier.wait) for _ in range(size)]
        for f in futures:
            f.result(timeout=2 * LONG)
        settle_idle(pool, size)


@pytest.mark.parametrize("size", [s for s in SIZES if s > 1])
def test_a_quick_task_behind_a_long_one_starts_while_the_long_one_runs(
    make_pool: Callable[..., ThreadPool], gate: threading.Event, size: int
) -> None:
    pool = make_pool(size)
    warm(pool, size)

    def long_task(started: threading.Event) -> None:
        started.set()
        assert gate.wait(LONG)

    for _ in range(5):
        long_started, quick_ran = threading.Event(), threading.Event()
        long_f = pool.submit(long_task, long_started)
        quick_f = pool.submit(quick_ran.set)
        assert quick_ran.wait(LONG), "the quick task waited for the long one"
        assert long_started.wait(LONG) and not long_f.done()
        quick_f.result(timeout=LONG)
        gate.set()
        long_f.result(timeout=LONG)
        gate.clear()
        settle_idle(pool, size)


@pytest.mark.parametrize("size", [s for s in SIZES if s > 1])
def test_every_queued_task_starts_while_earlier_ones_block(
    make_pool: Callable[..., ThreadPool], gate: threading.Event, size: int
) -> None:
    """size - 1 blockers, then one more task: it runs on the last idle thread at once."""
    pool = make_pool(size)
    warm(pool, size)
    started = threading.Semaphore(0)

    def blocker() -> None:
        started.release()
        assert gate.wait(LONG)

    blocked = [pool.submit(blocker) for _ in range(size - 1)]
    last = threading.Event()
    pool.submit(last.set)
    assert last.wait(LONG), "a task waited while a thread was idle"
    for _ in blocked:
        assert started.acquire(timeout=LONG)
    gate.set()
    for f in blocked:
        f.result(timeout=LONG)


def test_an_independent_quick_node_succeeds_beside_a_hanging_one(
    make_pool: Callable[..., ThreadPool], gate: threading.Event
) -> None:
    """The issue's flow: ``start([hang, quick], timeout=0.5)`` on a warmed ThreadPool(8)."""
    pool = make_pool(8)
    warm(pool, 8)

    def hang(ctx: TaskContext, _: object) -> str:
        assert gate.wait(LONG)
        return "late"

    def quick(ctx: TaskContext, _: object) -> str:
        return "quick"

    for _ in range(3):
        result = TaskScheduling.start(
            [FunctionNode(hang, name="hang"), FunctionNode(quick, name="quick")],
            executor=pool, timeout=0.5,
        )
        assert result["quick"].work_result.state is ResultState.SUCCESS, result.report()
        assert result["hang"].work_result.state is ResultState.TIMEOUT
        gate.set()
        settle_idle(pool, 8)
        gate.clear()


# ---------------------------------------------------------------------- releasing finished work
class Payload:
    """A result big enough to matter, that a weak reference can watch."""


@pytest.mark.parametrize("warmed", [False, True], ids=["first-task", "later-task"])
@pytest.mark.parametrize("kind", ["result", "exception", "cancelled"])
def test_an_idle_worker_holds_no_reference_to_its_last_task(
    make_pool: Callable[..., ThreadPool], gate: threading.Event, kind: str, warmed: bool
) -> None:
    pool = make_pool(1)
    if warmed:
        warm(pool, 1)
    payload = Payload()
    ref = weakref.ref(payload)
    arg_ref: weakref.ref[Payload] | None = None

    def task(p: Payload) -> Payload:
        if kind == "exception":
            raise ValueError(p)
        return p

    if kind == "cancelled":  # queued behind a blocker, cancelled, then the worker skips it
        f0 = pool.submit(gate.wait, LONG)
        f = pool.submit(task, payload)
        assert f.cancel()
        gate.set()
        f0.result(timeout=LONG)
    else:
        f = pool.submit(task, payload)
        f.exception(timeout=LONG)
    arg_ref = weakref.ref(f)
    del payload, f
    settle_idle(pool, 1)
    gc.collect()
    assert ref() is None, gc.get_referrers(ref()) if ref() is not None else None
    assert arg_ref() is None


def test_a_done_future_keeps_no_reference_to_its_pool_or_callable(
    make_pool: Callable[..., ThreadPool],
) -> None:
    pool = make_pool(1)
    payload = Payload()
    ref = weakref.ref(payload)
    f: Future[Any] = pool.submit(lambda p: None, payload)
    f.result(timeout=LONG)
    del payload
    gc.collect()
    assert ref() is None  # the future itself (kept here) dropped the arguments
