"""``ctx.timeout()``: the time an attempt may still take — the nearer of its node's deadline and
the run's, at most ``cap`` — and ``BudgetExhaustedError`` once none is left."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import EPS, LONG, MEDIUM, PROMPT, SHORT

from taskflow import (
    BudgetExhaustedError,
    FanOutNode,
    FlowStatus,
    FunctionNode,
    ResultState,
    TaskContext,
    TaskScheduling,
)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    ex = ThreadPoolExecutor(2, thread_name_prefix="attempt-timeout")
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


def seen_in(node_options: dict[str, Any], budget: float | None, pool: ThreadPoolExecutor,
            cap: float | None = None) -> float | None:
    seen: list[float | None] = []
    node = FunctionNode(lambda ctx, p: seen.append(ctx.timeout(cap)), name="n", **node_options)
    TaskScheduling.start(node, executor=pool, timeout=budget)
    return seen[0]


def test_the_runs_budget_bounds_an_attempt(pool):
    left = seen_in({}, MEDIUM, pool)
    assert left is not None and MEDIUM - EPS < left <= MEDIUM


def test_the_nodes_own_timeout_bounds_it_when_nearer(pool):
    left = seen_in({"timeout": SHORT * 4}, LONG, pool)
    assert left is not None and 0 < left <= SHORT * 4


def test_cap_bounds_it_and_no_deadline_gives_the_cap(pool):
    assert seen_in({}, LONG, pool, cap=SHORT) == SHORT
    assert seen_in({}, None, pool) is None
    assert seen_in({}, None, pool, cap=0.7) == 0.7


def test_a_nodes_timeout_covers_all_its_attempts(pool):
    seen: list[float] = []

    def flaky(ctx: TaskContext, param: Any) -> str:
        seen.append(ctx.timeout())
        if len(seen) < 3:
            threading.Event().wait(SHORT)  # stands in for a slow failing call
            raise ConnectionError("reset")
        return "ok"

    node = FunctionNode(flaky, name="flaky", retries=2, timeout=MEDIUM)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.outputs == {"flaky": "ok"}
    assert seen[0] > seen[1] > seen[2]  # counted from the first start, not each attempt's


def test_no_time_left_raises_budget_exhausted_and_the_node_times_out(pool, gate):
    release = gate()
    errors: list[BaseException] = []
    done = threading.Event()

    def late(ctx: TaskContext, param: Any) -> None:
        release.wait(LONG)
        try:
            ctx.timeout()
        except BudgetExhaustedError as exc:
            errors.append(exc)
        done.set()

    result = TaskScheduling.start(FunctionNode(late, name="late"), executor=pool,
                                  timeout=SHORT * 2)
    assert result.status is FlowStatus.TIMED_OUT
    release.set()
    assert done.wait(PROMPT)
    assert len(errors) == 1 and "'late'" in str(errors[0])
    assert "gave up on this attempt" in str(errors[0])


def test_a_task_letting_budget_exhausted_propagate_ends_timeout_not_exception(pool, gate):
    # the node's own timeout passed while the task ran; its call raises; the outcome is TIMEOUT
    release = gate()

    def task(ctx: TaskContext, param: Any) -> None:
        release.wait(SHORT * 3)
        ctx.timeout()

    node = FunctionNode(task, name="t", timeout=SHORT)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result["t"].work_result.state is ResultState.TIMEOUT


def test_outside_an_attempt_it_is_the_cap(pool):
    ctx = TaskContext()
    assert ctx.timeout() is None and ctx.timeout(cap=0.25) == 0.25
    seen: list[Any] = []

    class Hooked(FunctionNode):
        def on_success(self, support: Any) -> None:
            seen.append(support.context.timeout())
            seen.append(support.context.deadline_headers())

    TaskScheduling.start(Hooked(lambda c, p: 1, name="h"), executor=pool, timeout=MEDIUM,
                         context=ctx)
    assert seen == [None, {}]
    assert ctx.timeout() is None  # after the run, from the caller


class _Slow(FanOutNode[Any]):
    def items(self, ctx: TaskContext, param: Any) -> Iterable[tuple[Any, Any]]:
        return [(0, 0), (1, 1)]

    def work(self, ctx: TaskContext, item: Any) -> Any:
        return ctx.timeout()


def test_a_fan_out_item_is_bounded_by_its_item_timeout(pool):
    fan = _Slow(None, name="fan", item_timeout=SHORT * 4)
    result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    values = result.outputs["fan"].succeeded
    assert all(0 < v <= SHORT * 4 for v in values.values())
