"""A plain def that returns a coroutine instead of awaiting it, wherever taskflow calls one
without awaiting: a fan-out's ``work``, a ``Batch``'s function, a task on an executor in other
processes. Each fails naming its node (or batch) and the coroutine's function, and the coroutine
is closed, so no "never awaited" warning follows."""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import fanout_tasks as ft
import pytest
import remote_tasks as rt
from conftest import LONG, NeverAwaited

from taskflow import Batch, FunctionNode, ResultState, TaskScheduling
from taskflow.engine import remote
from taskflow.errors import BatchCallError, FlowDefinitionError
from taskflow.kinds.fanout import FanInResult, FanOutNode, FanOutPolicyError

EXCEPTION, SUCCESS = ResultState.EXCEPTION, ResultState.SUCCESS


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="tfpool") as p:
        yield p


def _assert_item_errors(fan_in: Any, n: int) -> None:
    assert isinstance(fan_in, FanInResult)
    assert fan_in.succeeded == {}
    assert sorted(fan_in.failed) == list(range(n))
    for error in fan_in.failed.values():
        assert isinstance(error, TypeError), repr(error)
        message = str(error)
        assert "node 'fan'" in message and "work()" in message and "square()" in message


# -- a fan-out's work ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["all", "best_effort"])
def test_a_fan_out_whose_work_returns_a_coroutine_fails_its_items_naming_the_node(
        pool: ThreadPoolExecutor, policy: str) -> None:
    with NeverAwaited() as caught:
        result = TaskScheduling.start(ft.CoroutineItems(3, name="fan", policy=policy),
                                      executor=pool, timeout=LONG)
    wr = result["fan"].work_result
    if policy == "all":
        assert wr.state is EXCEPTION
        assert isinstance(wr.exception, FanOutPolicyError) and "'fan'" in str(wr.exception)
        _assert_item_errors(wr.exception.result, 3)
    else:
        assert wr.state is SUCCESS
        _assert_item_errors(wr.result, 3)
    assert caught.lines == []


class AsyncWork(FanOutNode[int]):
    def items(self, ctx: Any, param: int) -> Iterator[tuple[int, int]]:
        yield from ((i, i) for i in range(param))

    async def work(self, ctx: Any, item: int) -> int:  # type: ignore[override]
        return item


class AsyncItems(FanOutNode[int]):
    async def items(self, ctx: Any, param: int) -> Any:  # type: ignore[override]
        for i in range(param):
            yield i, i

    def work(self, ctx: Any, item: int) -> int:
        return item


@pytest.mark.parametrize(("cls", "method"), [(AsyncWork, "work"), (AsyncItems, "items")])
def test_a_fan_out_whose_work_or_items_is_async_def_is_refused_at_start(
        pool: ThreadPoolExecutor, cls: type[FanOutNode[int]], method: str) -> None:
    with pytest.raises(FlowDefinitionError,
                       match=rf"node 'fan': {cls.__name__}.{method} cannot be async def"):
        TaskScheduling.start(cls(3, name="fan"), executor=pool, timeout=LONG)


# -- a Batch's function -------------------------------------------------------------------------


async def fetch_all(keys: Any) -> dict[Any, Any]:
    return {k: k for k in keys}


def _check_batch_error(error: BaseException | None) -> None:
    assert isinstance(error, BatchCallError), repr(error)
    cause = error.__cause__
    assert isinstance(cause, TypeError)
    message = str(cause)
    assert "batch 'prices'" in message and "fetch_all()" in message
    assert "Batch(name, fetch_all)" in message  # pass the async function itself


def test_a_batch_function_returning_a_coroutine_fails_its_nodes(pool: ThreadPoolExecutor
                                                                 ) -> None:
    batch = Batch("prices", lambda keys: fetch_all(keys), max_size=10)
    nodes = [FunctionNode(lambda ctx, p: p, k, name=f"n{k}", batch=batch) for k in range(3)]
    with NeverAwaited() as caught:
        result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    for k in range(3):
        wr = result[f"n{k}"].work_result
        assert wr.state is EXCEPTION
        _check_batch_error(wr.exception)
    assert batch.metrics().failed >= 1
    assert caught.lines == []


def test_a_batch_function_returning_a_coroutine_fails_the_items_of_a_fan_out(
        pool: ThreadPoolExecutor) -> None:
    batch = Batch("prices", lambda keys: fetch_all(keys), max_size=10)
    with NeverAwaited() as caught:
        result = TaskScheduling.start(
            ft.Numbers(4, name="fan", batch=batch, policy="best_effort"), executor=pool,
            timeout=LONG)
    fan_in = result["fan"].work_result.result
    assert fan_in.succeeded == {} and sorted(fan_in.failed) == [0, 1, 2, 3]
    for error in fan_in.failed.values():
        _check_batch_error(error)
    assert caught.lines == []


# -- executors in other processes ---------------------------------------------------------------


def test_in_the_worker_a_task_returning_a_coroutine_fails_naming_its_node() -> None:
    # what a worker process runs, called here where the warnings can be seen
    node = FunctionNode(rt.returns_coroutine, 7, name="wrapped")
    with NeverAwaited() as caught, pytest.raises(TypeError) as raised:
        remote.remote_call(node, 7, {}, {}, LONG, "flow-1")
    message = str(raised.value)
    assert "node 'wrapped'" in message and "page()" in message
    assert "asyncio.run" in message  # what to do instead, there
    assert caught.lines == []


def test_in_the_worker_an_item_returning_a_coroutine_fails_naming_its_node() -> None:
    import pickle

    blob = pickle.dumps(ft.CoroutineItems(None, name="fan"))
    with NeverAwaited() as caught, pytest.raises(TypeError) as raised:
        remote.remote_work(blob, 3, {}, {}, LONG, "flow-1")
    message = str(raised.value)
    assert "node 'fan'" in message and "work()" in message and "square()" in message
    assert caught.lines == []


def _run_remote(pool: Executor) -> Any:
    nodes = [FunctionNode(rt.returns_coroutine, 7, name="wrapped"),
             ft.CoroutineItems(3, name="fan", policy="best_effort"),
             FunctionNode(rt.const, 1, name="fine")]
    return TaskScheduling.start(nodes, executor=pool, timeout=LONG * 3)


def _check_remote(result: Any, stderr: str) -> None:
    wr = result["wrapped"].work_result
    assert wr.state is EXCEPTION
    assert isinstance(wr.exception, TypeError), repr(wr.exception)
    assert "node 'wrapped'" in str(wr.exception) and "page()" in str(wr.exception)
    _assert_item_errors(result["fan"].work_result.result, 3)
    assert result["fine"].work_result.state is SUCCESS  # the pool still serves
    assert "never awaited" not in stderr  # the workers write their warnings there


def test_on_a_process_pool_a_task_returning_a_coroutine_fails_naming_its_node(
        capfd: pytest.CaptureFixture[str]) -> None:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as procs:
        result = _run_remote(procs)
    _check_remote(result, capfd.readouterr().err)


def test_on_loky_a_task_returning_a_coroutine_fails_naming_its_node(
        capfd: pytest.CaptureFixture[str]) -> None:
    loky = pytest.importorskip("loky")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
        procs = loky.get_reusable_executor(max_workers=1)
    try:
        result = _run_remote(procs)
    finally:
        procs.shutdown(wait=True)
    _check_remote(result, capfd.readouterr().err)
