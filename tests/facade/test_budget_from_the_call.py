"""The budget counts from the call: the time ``start`` (or ``submit``, ``run_async``) spends
checking its arguments and building the run comes out of the budget, as the caller's clock
sees it. Under CPU-bound load that time is not small: the caller may wait for the GIL in it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

import taskflow.scheduling as scheduling
from taskflow import FunctionNode, TaskScheduling, run_async

SLOW_SETUP = 0.2  # stands in for a caller that lost the GIL while the run was being built


@pytest.fixture
def slow_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    compile_plan = scheduling.compile_plan

    def slow_compile(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_SETUP)
        return compile_plan(*args, **kwargs)

    monkeypatch.setattr(scheduling, "compile_plan", slow_compile)


def _start(node: Any, pool: ThreadPoolExecutor) -> Any:
    return TaskScheduling.start(node, executor=pool, timeout=LONG)


def _submit(node: Any, pool: ThreadPoolExecutor) -> Any:
    return TaskScheduling.submit(node, executor=pool, timeout=LONG).result(timeout=LONG)


def _run_async(node: Any, pool: ThreadPoolExecutor) -> Any:
    return asyncio.run(run_async(node, executor=pool, timeout=LONG))


@pytest.mark.parametrize("call", [_start, _submit, _run_async], ids=["start", "submit", "run_async"])
def test_the_time_spent_building_the_run_counts_against_the_budget(
    slow_setup: None, call: Callable[[Any, ThreadPoolExecutor], Any],
) -> None:
    seen: list[float] = []

    def task(ctx: Any, _: Any) -> None:
        seen.append(ctx.remaining())

    with ThreadPoolExecutor(1) as pool:
        result = call(FunctionNode(task, name="only"), pool)
    assert result.ok
    assert result.elapsed >= SLOW_SETUP  # measured from the call, the slow setup included
    assert seen and seen[0] <= LONG - SLOW_SETUP
