"""Executors that run a task inside ``submit`` (a saturated pool's caller-runs policy, a direct
executor): the engine's worker loops must not pile up on the submitting thread's stack.

A fan-out's item loop starts the next item loop before it runs its item, and a run's loop starts
loops for the ready nodes it leaves behind; when ``submit`` runs those loops right there, each one
would sit on top of the one that asked for it. ``taskflow/engine/loops.py`` queues a loop of the
same owner behind the one already on the thread instead. Pinned here: thousands of items or
nodes finish, and the stack depth a task sees does not grow with their number.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any

import pytest
from conftest import LONG

from taskflow import (
    FunctionNode,
    RejectionPolicy,
    ResultState,
    TaskContext,
    TaskScheduling,
    ThreadPool,
)
from taskflow.engine import executors
from taskflow.kinds.fanout import FanInResult, FanOutNode

SUCCESS = ResultState.SUCCESS


def stack_depth() -> int:
    """Frames on the calling thread's stack."""
    frame = sys._getframe(1)
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


class DeepestStack:
    """The deepest stack any task reported (tasks call ``note``)."""

    def __init__(self) -> None:
        self.depth = 0
        self._lock = threading.Lock()

    def note(self) -> None:
        d = stack_depth()
        with self._lock:
            self.depth = max(self.depth, d)


class DirectExecutor(Executor):
    """Runs every task in the thread that submits it, as a pool that is saturated under a
    caller-runs policy does, while declaring ``parallelism`` threads (so the engine asks for
    that many loops)."""

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism

    def taskflow_capabilities(self) -> executors.Capabilities:
        return executors.Capabilities(self.parallelism, False)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_running_or_notify_cancel()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the task's outcome, as a pool reports it
            fut.set_exception(exc)
        return fut


class CountingPool(ThreadPool):
    """A ThreadPool that counts ``submit`` calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submits = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._count_lock:
            self.submits += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def caller_runs_pool() -> Iterator[CountingPool]:
    """One thread, no queue: while it is busy every submission runs in the submitting thread."""
    pool = CountingPool(1, 1, queue_capacity=0, rejection=RejectionPolicy.CALLER_RUNS,
                        thread_name_prefix="tfcaller")
    yield pool
    pool.shutdown(wait=True)


class Numbers(FanOutNode[int]):
    """Items ``(i, i)`` for i < param; ``work`` notes its stack depth and returns ``2 * i``."""

    deepest: DeepestStack

    def items(self, ctx: TaskContext, param: int) -> Iterator[tuple[int, int]]:
        return ((i, i) for i in range(param))

    def work(self, ctx: TaskContext, item: int) -> int:
        self.deepest.note()
        return 2 * item


def fan_out_depth(pool: Executor, n: int) -> int:
    """Run an ``n``-item fan-out whose concurrency bound is above ``n``, followed by three sons;
    check every item and son succeeded; the deepest stack an item saw."""
    deepest = DeepestStack()
    fan = Numbers(n, name="fan", max_concurrency=n + 10)
    fan.deepest = deepest
    sons = [FunctionNode(lambda ctx, p: ctx.result_of("fan").total, name=f"son{k}")
            for k in range(3)]
    fan >> sons
    result = TaskScheduling.start(fan, executor=pool, timeout=LONG * 3)

    wr = result["fan"].work_result
    assert wr.state is SUCCESS, wr.exception
    assert isinstance(wr.result, FanInResult)
    assert wr.result.succeeded == {i: 2 * i for i in range(n)}
    assert [result[f"son{k}"].work_result.result for k in range(3)] == [n] * 3
    return deepest.depth


def test_a_fan_out_on_a_caller_runs_pool_finishes_thousands_of_items_on_a_flat_stack(
        caller_runs_pool):
    shallow = fan_out_depth(caller_runs_pool, 20)
    deep = fan_out_depth(caller_runs_pool, 3000)

    assert deep <= shallow + 2, (shallow, deep)


def test_a_fan_out_on_a_caller_runs_pool_submits_a_few_item_loops_not_one_per_item(
        caller_runs_pool):
    # while a loop queued behind this thread's loop has not run, another would only queue too
    fan_out_depth(caller_runs_pool, 20)
    few = caller_runs_pool.submits
    fan_out_depth(caller_runs_pool, 3000)
    many = caller_runs_pool.submits - few

    assert many <= few + 2, (few, many)


def test_a_fan_out_on_a_direct_executor_keeps_a_flat_stack():
    pool = DirectExecutor(parallelism=10_000)
    shallow = fan_out_depth(pool, 20)
    deep = fan_out_depth(pool, 3000)

    assert deep <= shallow + 2, (shallow, deep)


def ladder(rungs: int, deepest: DeepestStack) -> FunctionNode[Any, Any]:
    """``a0 -> a1 -> ...`` with a leaf ``b_i`` under each ``a_i``, declared first: the loop that
    finishes ``a_i`` goes on with ``b_i`` and starts a loop for ``a_{i+1}`` (never measured, so
    expected slow), which does the same one rung down. Returns the top."""

    def task(ctx: TaskContext, p: int) -> int:
        deepest.note()
        return p

    a = [FunctionNode(task, i, name=f"a{i}") for i in range(rungs)]
    for i in range(rungs - 1):
        a[i] >> FunctionNode(task, i, name=f"b{i}")
        a[i] >> a[i + 1]
    return a[0]


def ladder_depth(pool: Executor, rungs: int) -> int:
    deepest = DeepestStack()
    result = TaskScheduling.start(ladder(rungs, deepest), executor=pool, timeout=LONG * 3)

    states = {name: result[name].work_result.state for name in result}
    assert len(states) == 2 * rungs - 1
    assert set(states.values()) == {SUCCESS}, {n: s for n, s in states.items() if s is not SUCCESS}
    return deepest.depth


def test_a_wide_dag_on_an_executor_that_runs_tasks_in_submit_keeps_a_flat_stack():
    pool = DirectExecutor(parallelism=10_000)
    shallow = ladder_depth(pool, 10)
    deep = ladder_depth(pool, 1500)

    assert deep <= shallow + 2, (shallow, deep)


def test_a_nested_flow_in_a_task_on_a_caller_runs_pool_still_runs_inside_it(caller_runs_pool):
    # a loop of another owner (the inner run) is not queued behind the outer run's loop: the
    # task waits for the inner flow, so the inner loops must run while it waits
    def inner(ctx: TaskContext, n: int) -> int:
        nodes = [FunctionNode(lambda c, p: p, k, name=f"in{k}") for k in range(n)]
        res = TaskScheduling.start(nodes, executor=caller_runs_pool, timeout=LONG)
        return sum(res[f"in{k}"].work_result.result for k in range(n))

    outer = [FunctionNode(inner, 5, name=f"out{j}") for j in range(4)]
    result = TaskScheduling.start(outer, executor=caller_runs_pool, timeout=LONG * 2)

    assert [result[f"out{j}"].work_result.result for j in range(4)] == [10] * 4
