"""A remote worker checks a result or an exception with the pickler its executor's transport uses
before returning it: stdlib pickle for ``ProcessPoolExecutor``, cloudpickle for loky.

A value only cloudpickle can carry (here a local function) must fail its node on a stdlib process
pool with the documented ``TypeError`` naming the node (an exception: a ``RemoteTaskError`` naming
its type), not with whatever the pool's own pickling raises after the check let it through; on
loky the same value travels.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import cloud_values as cv
import pytest
from conftest import LONG

from taskflow import FunctionNode, ResultState, TaskScheduling
from taskflow.errors import RemoteTaskError
from taskflow.kinds.fanout import FanInResult

SUCCESS, EXCEPTION = ResultState.SUCCESS, ResultState.EXCEPTION


@pytest.fixture
def loky_pool() -> Iterator[Executor]:
    loky = pytest.importorskip("loky")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
        pool = loky.get_reusable_executor(max_workers=1)
    yield pool
    pool.shutdown(wait=True)


def run(pool: Executor, *nodes: Any) -> Any:
    return TaskScheduling.start(list(nodes), executor=pool, timeout=LONG * 3)


def test_on_a_process_pool_what_only_cloudpickle_carries_fails_its_node_naming_it():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = run(pool, FunctionNode(cv.returns_closure, 7, name="closure"),
                     FunctionNode(cv.raises_callback_error, 7, name="raiser"),
                     cv.ClosureItems(3, name="fan", policy="best_effort"))
        after = run(pool, FunctionNode(cv.identity, 3, name="after"))["after"].work_result

    wr = result["closure"].work_result
    assert wr.state is EXCEPTION
    assert isinstance(wr.exception, TypeError), repr(wr.exception)
    assert "node 'closure'" in str(wr.exception) and "result" in str(wr.exception)

    wr = result["raiser"].work_result
    assert wr.state is EXCEPTION
    assert isinstance(wr.exception, RemoteTaskError), repr(wr.exception)
    assert "CallbackError" in str(wr.exception)

    fan_in = result["fan"].work_result.result
    assert isinstance(fan_in, FanInResult)
    assert fan_in.succeeded == {0: 0, 2: 2}
    assert isinstance(fan_in.failed[1], TypeError), repr(fan_in.failed[1])
    assert "node 'fan'" in str(fan_in.failed[1])

    assert (after.state, after.result) == (SUCCESS, 3)  # the pool still serves the next run


def test_on_loky_the_same_result_exception_and_item_travel(loky_pool):
    closure = FunctionNode(cv.returns_closure, 7, name="closure")
    caller = FunctionNode(cv.call_result, "closure", name="caller").depends_on(closure)
    raiser = FunctionNode(cv.raises_callback_error, 7, name="raiser")
    fan = cv.ClosureItems(3, name="fan")

    result = run(loky_pool, closure, caller, raiser, fan)

    assert result["caller"].work_result.state is SUCCESS
    assert result["caller"].work_result.result == 7
    error = result["raiser"].work_result.exception
    assert type(error).__name__ == "CallbackError" and error.callback() == 7
    fan_in = result["fan"].work_result.result
    assert fan_in.complete and fan_in.succeeded[1]() == 1
