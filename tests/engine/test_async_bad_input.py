"""Bad input around async nodes: an async hook however it is written, a coroutine object where
a function or a node is expected, an event loop closed after it was given to
``set_event_loop``, and async functions where taskflow calls without awaiting (a ``Batch``'s
key, a fallback, a share key, ``ctx.on_cancel``) give a clear error naming the culprit before
anything runs (``ctx.on_cancel``: at the call). A ``Batch``'s function may be async: it is
awaited."""

from __future__ import annotations

import asyncio
import functools
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, PROMPT, NeverAwaited

import taskflow
from taskflow import Batch, FunctionNode, SchedulingNode, TaskContext, TaskScheduling
from taskflow.cache import LruCache
from taskflow.errors import (
    FlowDefinitionError,
    InvalidArgumentError,
    InvalidArgumentValueError,
    InvalidNodeError,
)

pytestmark = pytest.mark.filterwarnings("error")  # a coroutine never awaited fails the test


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="tfpool") as p:
        yield p


async def fetch(ctx: TaskContext, p: Any) -> str:
    return "fetched"


async def get_many(keys: Any) -> dict[Any, Any]:
    return {k: k for k in keys}


class AsyncCall:
    """An object whose ``__call__`` is ``async def``."""

    async def __call__(self, *args: Any) -> None:
        return None


# -- async hooks ---------------------------------------------------------------------------------


class Plain(SchedulingNode[Any, Any]):
    def task(self, ctx: TaskContext, param: Any) -> str:
        ran.set()
        return "ran"


ran = threading.Event()


@pytest.mark.parametrize("hook", ["on_begin", "on_success", "on_fail"])
@pytest.mark.parametrize("how", ["instance function", "callable object", "partial"])
def test_an_async_hook_set_on_the_node_is_refused_before_anything_runs(
        pool: ThreadPoolExecutor, hook: str, how: str) -> None:
    async def on_hook(support: Any) -> None:
        return None

    value = {"instance function": on_hook, "callable object": AsyncCall(),
             "partial": functools.partial(on_hook)}[how]
    node = Plain(name="plain")
    setattr(node, hook, value)
    ran.clear()
    with pytest.raises(FlowDefinitionError, match=rf"node 'plain': Plain\.{hook} is async"):
        TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert not ran.is_set()


def test_an_async_hook_of_an_async_node_is_refused(pool: ThreadPoolExecutor) -> None:
    class Fetch(SchedulingNode[Any, Any]):
        async def task(self, ctx: TaskContext, param: Any) -> str:  # type: ignore[override]
            return "fetched"

        async def on_success(self, support: Any) -> None:  # type: ignore[override]
            return None

    with pytest.raises(FlowDefinitionError, match=r"Fetch\.on_success is async.*plain def"):
        TaskScheduling.start(Fetch(name="fetch"), executor=pool, timeout=LONG)


# -- coroutine objects ---------------------------------------------------------------------------


def test_a_coroutine_object_given_as_the_nodes_to_start_is_refused_and_closed(
        pool: ThreadPoolExecutor) -> None:
    with pytest.raises(InvalidNodeError, match=r"coroutine object fetch\(\.\.\.\).*"
                                               r"FunctionNode\(fetch\)"):
        TaskScheduling.start(fetch(None, None), executor=pool,  # type: ignore[arg-type]
                             timeout=LONG)
    with pytest.raises(InvalidNodeError, match=r"nodes\[1\] is the coroutine object fetch"):
        TaskScheduling.start([FunctionNode(fetch), fetch(None, None)], executor=pool,
                             timeout=LONG)


def test_a_coroutine_object_wired_as_a_son_is_refused_and_closed() -> None:
    with pytest.raises(InvalidNodeError, match=r"coroutine object fetch\(\.\.\.\)"):
        FunctionNode(fetch) >> fetch(None, None)  # type: ignore[operator]


def test_a_coroutine_object_as_a_nodes_task_is_refused_before_anything_runs(
        pool: ThreadPoolExecutor) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the class body's coroutine: closed by the check
        coro = fetch(None, None)
    cls = type("Broken", (SchedulingNode,), {"task": coro})
    with pytest.raises(FlowDefinitionError, match=r"node 'broken': Broken\.task must be a "
                                                  r"method.*coroutine object fetch"):
        TaskScheduling.start(cls(name="broken"), executor=pool, timeout=LONG)


# -- the application's loop ----------------------------------------------------------------------


def test_a_loop_closed_after_set_event_loop_is_refused_at_start(
        pool: ThreadPoolExecutor) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="app-loop")
    thread.start()
    try:
        taskflow.set_event_loop(loop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(PROMPT)
        loop.close()
        with pytest.raises(FlowDefinitionError, match=r"'fetch' has an async def task, and "
                                                      r"the event loop given to taskflow\."
                                                      r"set_event_loop has been closed"):
            TaskScheduling.start(FunctionNode(fetch), executor=pool, timeout=LONG)
        with pytest.raises(FlowDefinitionError, match="has been closed"):
            TaskScheduling.submit(FunctionNode(fetch), executor=pool, timeout=LONG)
        # sync nodes do not need it, and run_async uses the loop that awaits it
        sync = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="sync"), executor=pool,
                                    timeout=LONG)
        assert sync.outputs == {"sync": 1}
        awaited = asyncio.run(taskflow.run_async(FunctionNode(fetch), executor=pool,
                                                 timeout=LONG))
        assert awaited.outputs == {"fetch": "fetched"}
    finally:
        taskflow.set_event_loop(None)
    result = TaskScheduling.start(FunctionNode(fetch), executor=pool, timeout=LONG)
    assert result.outputs == {"fetch": "fetched"}


# -- async functions where taskflow does not await ----------------------------------------------


@pytest.mark.parametrize("fn", [get_many, AsyncCall(), functools.partial(get_many)],
                         ids=["coroutine function", "callable object", "partial"])
def test_an_async_batch_function_is_taken_however_it_is_written(fn: Any) -> None:
    assert Batch("prices", fn).is_async  # awaited on the event loop, not refused


def test_an_async_batch_key_is_refused() -> None:
    with pytest.raises(FlowDefinitionError, match=r"batch 'prices': key .* is async"):
        Batch("prices", lambda keys: {k: k for k in keys}, key=fetch)


def test_an_async_fallback_is_refused_when_the_node_is_built() -> None:
    with pytest.raises(FlowDefinitionError, match=r"fallback .* is async.*does not await it"):
        FunctionNode(lambda c, p: 1 / 0, name="price", fallback=fetch)


def test_an_async_fallback_of_an_async_node_is_refused_too() -> None:
    # the stand-in is computed on the run's threads for an async node too: never awaited
    with pytest.raises(FlowDefinitionError, match=r"node 'price': fallback .* is async"):
        FunctionNode(fetch, name="price", fallback=AsyncCall())


@pytest.mark.parametrize("option", ["fallback", "share_key", "key", "fn"])
def test_a_coroutine_object_given_for_a_callable_option_is_refused_and_closed(
        option: str) -> None:
    with NeverAwaited() as caught:
        coro = fetch(None, None)
        with pytest.raises(FlowDefinitionError, match=r"coroutine object fetch\(\.\.\.\)"
                                                      r".*never await.*closed"):
            if option == "key":
                Batch("prices", get_many, key=coro)
            elif option == "fn":
                Batch("prices", coro)
            else:
                FunctionNode(lambda c, p: 1, name="price", **{option: coro})
    assert caught.lines == []


def test_an_async_share_key_is_refused_when_the_node_is_built() -> None:
    with pytest.raises(FlowDefinitionError, match=r"share_key .* is async"):
        FunctionNode(lambda c, p: 1, name="price", share_key=fetch)


def test_a_cache_with_async_methods_is_refused_when_the_node_is_built() -> None:
    class AsyncCache(LruCache):
        async def get(self, key: str) -> Any:  # type: ignore[override]
            return None  # pragma: no cover - never awaited: refused

    with pytest.raises(FlowDefinitionError, match=r"'price': cache .* has an async get\(\)"
                                                  r".*never awaits it"):
        FunctionNode(lambda c, p: 1, name="price", share_key=lambda c, p: p, cache_ttl=30,
                     cache=AsyncCache("prices"))


@pytest.mark.parametrize("where", ["sync", "async"])
def test_an_async_on_cancel_callback_is_refused_at_the_call(pool: ThreadPoolExecutor,
                                                            where: str) -> None:
    async def close() -> None:
        return None

    def sync_task(ctx: TaskContext, p: Any) -> str:
        ctx.on_cancel(close)
        return "registered"  # pragma: no cover - the defect: never called, never awaited

    async def async_task(ctx: TaskContext, p: Any) -> str:
        ctx.on_cancel(close)
        return "registered"  # pragma: no cover

    task = sync_task if where == "sync" else async_task
    result = TaskScheduling.start(FunctionNode(task, name="t"), executor=pool, timeout=LONG)
    error = result.result_of("t").exception
    assert isinstance(error, InvalidArgumentError)
    assert "on_cancel needs a plain function, got the async" in str(error)
    assert "close" in str(error) and "CancelledError" in str(error)


# -- generator functions as tasks ----------------------------------------------------------------


def numbers(ctx: TaskContext, p: Any) -> Iterator[int]:
    yield 1


async def async_numbers(ctx: TaskContext, p: Any) -> Any:
    yield 1


class Gen:
    def __call__(self, ctx: TaskContext, p: Any) -> Iterator[int]:
        yield 1


@pytest.mark.parametrize(("fn", "kind"), [
    (numbers, "a generator function"), (async_numbers, "an async generator function"),
    (functools.partial(numbers), "a generator function"), (Gen(), "a generator function")],
    ids=["generator", "async generator", "partial", "callable object"])
def test_a_generator_function_task_is_refused_when_the_node_is_built(fn: Any,
                                                                     kind: str) -> None:
    with pytest.raises(InvalidNodeError, match=rf"node 'items': its task .* is {kind}"):
        FunctionNode(fn, name="items")


class GenTask(SchedulingNode[Any, Any]):
    def task(self, ctx: TaskContext, param: Any) -> Any:
        ran.set()
        yield 1


class AsyncGenTask(SchedulingNode[Any, Any]):
    async def task(self, ctx: TaskContext, param: Any) -> Any:  # type: ignore[override]
        ran.set()
        yield 1


@pytest.mark.parametrize(("cls", "kind"), [(GenTask, "a generator function"),
                                           (AsyncGenTask, "an async generator function")])
def test_a_generator_task_method_is_refused_at_start(pool: ThreadPoolExecutor, cls: type,
                                                     kind: str) -> None:
    ran.clear()
    with pytest.raises(FlowDefinitionError,
                       match=rf"node 'items': its task {cls.__name__}\.task is {kind}"):
        TaskScheduling.start(cls(name="items"), executor=pool, timeout=LONG)
    assert not ran.is_set()


def test_a_generator_function_override_is_refused(pool: ThreadPoolExecutor) -> None:
    with pytest.raises(InvalidArgumentValueError,
                       match=r"override of node 'plain': its task numbers is a generator"):
        TaskScheduling.start(Plain(name="plain"), executor=pool, timeout=LONG,
                             overrides={"plain": numbers})


def test_a_wrapper_that_consumes_a_generator_is_a_plain_task(pool: ThreadPoolExecutor) -> None:
    @functools.wraps(numbers)
    def collected(ctx: TaskContext, p: Any) -> list[int]:
        return list(numbers(ctx, p))

    result = TaskScheduling.start(FunctionNode(collected, name="items"), executor=pool,
                                  timeout=LONG)
    assert result.outputs == {"items": [1]}
