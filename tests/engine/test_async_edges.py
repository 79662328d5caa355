"""Edges of async nodes: no sync task on the event loop whatever the executor, a sync task
that returns a coroutine, a blocking start on the loop of an async batch function, and
``ManualExecutor`` driving a mixed flow."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, PROMPT

import taskflow
from taskflow import Batch, FunctionNode, ResultState, SchedulingNode, TaskScheduling, TaskSupport
from taskflow.errors import FlowDefinitionError
from taskflow.pools.threadpool import RejectionPolicy, ThreadPool
from taskflow.testing import FakeClock, ManualExecutor


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="tfpool") as p:
        yield p


class InlineExecutor(Executor):
    """Runs each task in the submitting thread, before ``submit`` returns."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        f.set_running_or_notify_cancel()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the future carries it
            f.set_exception(exc)
        return f


def _threads_flow(seen: dict[str, str]) -> FunctionNode:
    """Two sync roots, an async son, a sync grandson: each records its thread."""
    def record(ctx: Any, name: str) -> str:
        seen[name] = threading.current_thread().name
        return name

    async def middle(ctx: Any, name: str) -> str:
        await asyncio.sleep(0)
        seen[name] = threading.current_thread().name
        return name

    a, b = FunctionNode(record, "a", name="a"), FunctionNode(record, "b", name="b")
    m, z = FunctionNode(middle, "m", name="m"), FunctionNode(record, "z", name="z")
    a >> m
    b >> m
    m >> z
    return a


async def _await_flow(node: FunctionNode, executor: Executor) -> tuple[Any, str]:
    result = await taskflow.run_async(node, executor=executor, timeout=LONG)
    return result, threading.current_thread().name


# -- a sync task never runs on the awaiting loop --------------------------------------------------


def test_run_async_on_an_inline_executor_runs_no_sync_node_on_the_awaiting_loop() -> None:
    seen: dict[str, str] = {}
    result, loop_thread = asyncio.run(_await_flow(_threads_flow(seen), InlineExecutor()))
    assert result.ok, result.summary
    assert set(seen) == {"a", "b", "m", "z"}
    assert seen["m"] == loop_thread  # the async node runs on the awaiting loop
    assert {seen["a"], seen["b"], seen["z"]}.isdisjoint({loop_thread})


def test_run_async_on_a_full_caller_runs_pool_runs_no_sync_node_on_the_awaiting_loop() -> None:
    release = threading.Event()
    busy = threading.Event()

    def occupy() -> None:
        busy.set()
        release.wait(LONG)

    pool = ThreadPool(1, 1, queue_capacity=0, rejection=RejectionPolicy.CALLER_RUNS,
                      name="caller-runs")
    try:
        pool.submit(occupy)
        assert busy.wait(PROMPT)
        seen: dict[str, str] = {}
        result, loop_thread = asyncio.run(_await_flow(_threads_flow(seen), pool))
        assert result.ok, result.summary
        assert seen["m"] == loop_thread
        assert loop_thread not in {seen["a"], seen["b"], seen["z"]}
    finally:
        release.set()
        pool.shutdown()


def test_cancelling_the_await_at_once_on_an_inline_executor_cancels_the_run() -> None:
    started = threading.Event()

    def slow(ctx: Any, _: Any) -> None:
        started.set()
        ctx.on_cancel(lambda: None)
        while not ctx.cancelled:
            started.wait(0.001)

    async def main() -> Any:
        node = FunctionNode(slow, name="slow")
        ctx = taskflow.TaskContext()
        task = asyncio.ensure_future(taskflow.run_async(node, executor=InlineExecutor(),
                                                        timeout=LONG, context=ctx))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return ctx

    ctx = asyncio.run(main())
    assert ctx.cancelled


def test_run_async_on_a_thread_pool_still_returns_its_result(pool: ThreadPoolExecutor) -> None:
    seen: dict[str, str] = {}
    result, loop_thread = asyncio.run(_await_flow(_threads_flow(seen), pool))
    assert result.ok, result.summary
    assert seen["a"].startswith("tfpool") and seen["m"] == loop_thread


# -- a sync task that returns a coroutine ---------------------------------------------------------


async def fetch(ctx: Any, sku: Any) -> str:
    await asyncio.sleep(0)
    return f"page-{sku}"


@pytest.mark.parametrize("kind", ["plain", "with hooks", "with options"])
def test_a_sync_task_returning_a_coroutine_fails_naming_its_node(
        kind: str, pool: ThreadPoolExecutor) -> None:
    class Wrapped(SchedulingNode[Any, Any]):
        def task(self, ctx: Any, param: Any) -> Any:
            return fetch(ctx, param)

        def on_fail(self, support: TaskSupport) -> None:
            failed.append(support.attempt)

    failed: list[Any] = []
    node: SchedulingNode[Any, Any]
    if kind == "with hooks":
        node = Wrapped("sku-1", name="wrapped")
    else:
        options: dict[str, Any] = {"retries": 2, "timeout": LONG} if kind == "with options" else {}
        node = FunctionNode(lambda ctx, p: fetch(ctx, p), "sku-1", name="wrapped", **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
        gc.collect()
    wr = result["wrapped"].work_result
    assert wr.state is ResultState.EXCEPTION
    assert isinstance(wr.exception, TypeError)
    message = str(wr.exception)
    assert "'wrapped'" in message and "coroutine" in message
    assert "FunctionNode(fetch)" in message  # pass the async function itself
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert failed == ([1] if kind == "with hooks" else [])


def test_a_sync_task_returning_a_coroutine_fails_under_run_async(
        pool: ThreadPoolExecutor) -> None:
    node = FunctionNode(lambda ctx, p: fetch(ctx, p), "sku-1", name="wrapped")
    result, _ = asyncio.run(_await_flow(node, pool))
    assert isinstance(result["wrapped"].work_result.exception, TypeError)


def test_an_async_task_returning_a_plain_value_still_succeeds(pool: ThreadPoolExecutor) -> None:
    result = TaskScheduling.start(FunctionNode(fetch, "x", name="f"), executor=pool,
                                  timeout=LONG)
    assert result.outputs["f"] == "page-x"


# -- a blocking start on the loop of an async batch function --------------------------------------


def test_start_on_the_loop_of_an_async_batch_function_is_refused(
        pool: ThreadPoolExecutor) -> None:
    async def get_many(keys: Any) -> dict[Any, Any]:
        return {k: k for k in keys}

    batch = Batch("edges-batch-on-loop", get_many)
    root = FunctionNode(lambda ctx, p: "page", name="root")
    root >> FunctionNode(lambda ctx, k: None, param="k", name="seat", batch=batch)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        taskflow.set_event_loop(loop)

        async def blocking_start() -> Any:
            return TaskScheduling.start(root, executor=pool, timeout=LONG)

        fut = asyncio.run_coroutine_threadsafe(blocking_start(), loop)
        with pytest.raises(FlowDefinitionError, match="batch function") as info:
            fut.result(LONG)
        assert "edges-batch-on-loop" in str(info.value)
        assert "run_async" in str(info.value)
        # off the loop the same flow runs, its call on that loop
        assert TaskScheduling.start(root, executor=pool, timeout=LONG).ok
    finally:
        taskflow.set_event_loop(None)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(PROMPT)
        loop.close()


# -- ManualExecutor ------------------------------------------------------------------------------


def _mixed_flow(sleep: float) -> tuple[FunctionNode, list[str]]:
    order: list[str] = []

    def sync(ctx: Any, name: str) -> str:
        order.append(name)
        return name

    async def slow(ctx: Any, name: str) -> str:
        await asyncio.sleep(sleep)
        order.append(name)
        return name

    a = FunctionNode(sync, "a", name="a")
    m1, m2 = FunctionNode(slow, "m1", name="m1"), FunctionNode(slow, "m2", name="m2")
    z = FunctionNode(sync, "z", name="z")
    b = FunctionNode(sync, "b", name="b")
    a >> m1 >> z
    a >> m2 >> z
    z >> b
    return a, order


@pytest.mark.parametrize("seed", [None, 3])
def test_run_until_idle_drives_a_mixed_flow_to_the_end(seed: int | None) -> None:
    ex = ManualExecutor(seed=seed)
    root, order = _mixed_flow(0.01)
    future = TaskScheduling.submit(root, executor=ex, timeout=LONG)
    ex.run_until_idle()
    result = future.result(timeout=0)
    assert result.ok, result.summary
    assert order[0] == "a" and order[-2:] == ["z", "b"] and sorted(order[1:3]) == ["m1", "m2"]


def test_run_until_idle_under_autojump_drives_a_mixed_flow_in_virtual_time() -> None:
    ex = ManualExecutor(seed=1)
    with FakeClock(autojump=True) as fake:
        root, order = _mixed_flow(30.0)
        t0 = fake.now()
        future = TaskScheduling.submit(root, executor=ex, timeout=100.0)
        ex.run_until_idle()
        result = future.result(timeout=0)
        assert result.ok, result.summary
        assert fake.now() - t0 == pytest.approx(30.0)
    assert order[-2:] == ["z", "b"]
