"""Flows on a saturated ThreadPool under each rejection policy, and the
engine's ``mark_abandoned`` contract with ThreadPool and MonitoredExecutor.

Whatever the policy, ``start`` returns by its deadline, never hangs, and the pool counts the
rejections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import EPS, LONG, MEDIUM, SHORT

from taskflow import FunctionNode, ResultState, SchedulingNode, TaskContext, TaskScheduling
from taskflow.errors import RejectedExecutionError
from taskflow.pools.monitored import MonitoredExecutor
from taskflow.pools.threadpool import RejectionPolicy, ThreadPool


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()


@pytest.fixture
def make_pool(gate: threading.Event) -> Iterator[Callable[..., ThreadPool]]:
    pools: list[ThreadPool] = []

    def make(*args: Any, **kwargs: Any) -> ThreadPool:
        pools.append(ThreadPool(*args, **kwargs))
        return pools[-1]

    yield make
    gate.set()
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    for pool in pools:
        assert pool.await_termination(LONG)


def saturate(pool: ThreadPool, gate: threading.Event) -> list[Future[Any]]:
    """Occupy a 1-thread pool with a queue of 1: one gated task running, one queued."""
    started = threading.Event()

    def blocker() -> str:
        started.set()
        assert gate.wait(LONG)
        return "outside"

    futures = [pool.submit(blocker)]
    assert started.wait(LONG)
    futures.append(pool.submit(blocker))
    return futures


class Counted(SchedulingNode[int, int]):
    """A node that doubles its param and counts its hooks."""

    calls: dict[str, int]

    def task(self, ctx: TaskContext, param: int) -> int:
        return param * 2

    def on_success(self, support: Any) -> None:
        self.calls["success"] = self.calls.get("success", 0) + 1

    def on_fail(self, support: Any) -> None:
        self.calls["fail"] = self.calls.get("fail", 0) + 1


def fan_out(calls: dict[str, int]) -> tuple[list[SchedulingNode[Any, Any]], list[str]]:
    """Three parallel nodes feeding a join; returns (the roots, every name)."""
    Counted.calls = calls
    roots: list[SchedulingNode[Any, Any]] = [Counted(param=i, name=f"n{i}") for i in range(3)]
    join = FunctionNode(lambda ctx, _: sum(ctx.result_of(f"n{i}") for i in range(3)), name="join")
    roots >> join  # type: ignore[operator]
    return roots, [f"n{i}" for i in range(3)] + ["join"]


@pytest.mark.parametrize("policy", list(RejectionPolicy))
def test_flow_on_a_saturated_pool_ends_by_its_deadline(
    make_pool: Callable[..., ThreadPool], gate: threading.Event, policy: RejectionPolicy
) -> None:
    pool = make_pool(1, 1, queue_capacity=1, rejection=policy)
    outside = saturate(pool, gate)
    calls: dict[str, int] = {}
    roots, names = fan_out(calls)
    timeout = MEDIUM

    t0 = time.monotonic()
    result = TaskScheduling.start(roots, executor=pool, timeout=timeout)
    elapsed = time.monotonic() - t0

    assert elapsed <= timeout + EPS, f"{policy}: start took {elapsed:.3f}s"
    assert pool.metrics().rejected_count >= 1
    states = {name: result[name].work_result.state for name in names}

    if policy is RejectionPolicy.CALLER_RUNS:
        # the flow runs in this (the submitting) thread and is still correct; hooks fire once
        assert result.ok, states
        assert result.outputs["join"] == 6
        me = threading.current_thread().name
        assert {result[n].work_result.thread for n in names} == {me}
        assert calls == {"success": 3}
    elif policy is RejectionPolicy.DISCARD_OLDEST:
        # the flow's work took the place of the oldest queued task, behind the gated one:
        # it cannot run before the deadline, and the engine cancels it then
        assert outside[1].cancelled()
        assert set(states.values()) == {ResultState.TIMEOUT}
        assert elapsed >= timeout - EPS
        assert calls == {"fail": 3}
        m = pool.metrics()
        assert (m.queue_size, m.cancelled_task_count) == (0, 1)
    else:
        # ABORT raises, DISCARD cancels the future: either way a refused submission, at once
        assert not result.ok
        assert set(states.values()) == {ResultState.EXCEPTION}, states
        for name in names[:3]:
            assert isinstance(result[name].work_result.exception, RejectedExecutionError)
        assert elapsed < timeout
        assert calls == {"fail": 3}
    gate.set()
    assert outside[0].result(timeout=LONG) == "outside"


def test_rejections_are_counted_per_refused_submission(
    make_pool: Callable[..., ThreadPool], gate: threading.Event
) -> None:
    pool = make_pool(1, 1, queue_capacity=1)
    saturate(pool, gate)
    for _ in range(3):
        roots, _ = fan_out({})
        assert not TaskScheduling.start(roots, executor=pool, timeout=MEDIUM).ok
    m = pool.metrics()
    assert m.rejected_count >= 3
    assert m.task_count == m.completed_task_count + m.cancelled_task_count + m.rejected_count + (
        (m.active_count or 0) + (m.queue_size or 0)
    )


def test_timed_out_running_node_is_counted_abandoned_until_it_returns(
    make_pool: Callable[..., ThreadPool], gate: threading.Event
) -> None:
    pool = make_pool(2)
    started = threading.Event()

    def stuck(ctx: TaskContext, _: Any) -> str:
        started.set()
        assert gate.wait(LONG)
        return "late"

    result = TaskScheduling.start(FunctionNode(stuck, name="stuck"), executor=pool, timeout=SHORT)
    assert started.is_set()
    assert result["stuck"].work_result.state is ResultState.TIMEOUT
    m = pool.metrics()
    assert (m.abandoned_running, m.abandoned_total, m.active_count) == (1, 1, 1)
    gate.set()
    deadline = time.monotonic() + LONG
    while pool.metrics().abandoned_running:  # the abandoned thread returns on its own
        assert time.monotonic() < deadline
        time.sleep(0.005)
    m = pool.metrics()
    assert (m.abandoned_running, m.abandoned_total, m.active_count) == (0, 1, 0)


def test_flows_on_a_monitored_executor_are_counted(gate: threading.Event) -> None:
    started = threading.Event()

    def stuck(ctx: TaskContext, _: Any) -> None:
        started.set()
        assert gate.wait(LONG)

    with ThreadPoolExecutor(2, thread_name_prefix="taskflow-flows") as inner:
        mon = MonitoredExecutor(inner)
        roots, _ = fan_out({})
        result = TaskScheduling.start(roots, executor=mon, timeout=LONG)
        assert result.ok and result.outputs["join"] == 6
        m = mon.metrics()
        # a drain loop may still be on its way out when start returns: not counted done yet
        assert m.task_count >= 1 and m.run_time_s is not None

        timed_out = TaskScheduling.start(FunctionNode(stuck), executor=mon, timeout=SHORT)
        assert started.is_set() and not timed_out.ok
        assert mon.metrics().abandoned_running == 1
        gate.set()
    m = mon.metrics()
    assert (m.abandoned_running, m.abandoned_total, m.active_count, m.queue_size) == (0, 1, 0, 0)
    assert m.task_count == m.completed_task_count + m.cancelled_task_count
