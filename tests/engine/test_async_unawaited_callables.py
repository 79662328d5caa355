"""The user callables taskflow calls on its own threads and never awaits, written as a plain def
that returns a coroutine: a ``fallback=``, a ``share_key=``, a ``Batch``'s ``key=``, a hook,
a ``ctx.on_cancel`` callback. Each fails what it is part of naming the node (the node, with a
fallback or a key; the hook or the callback, logged and counted, with a hook or a callback),
and the coroutine is closed, so no "never awaited" warning follows."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, SHORT, NeverAwaited, poll

from taskflow import (
    Batch,
    FlowStatus,
    FunctionNode,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    clock,
)
from taskflow.errors import FallbackError
from taskflow.testing import FakeClock

EXCEPTION, SUCCESS = ResultState.EXCEPTION, ResultState.SUCCESS


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="tfpool") as p:
        yield p


async def stand_in(ctx: TaskContext, error: BaseException) -> str:
    return "stand-in"  # pragma: no cover - never awaited: closed


async def key_for(ctx: TaskContext, param: Any) -> str:
    return "key"  # pragma: no cover - never awaited: closed


async def close_socket() -> None:
    return None  # pragma: no cover - never awaited: closed


def boom(ctx: TaskContext, param: Any) -> Any:
    raise ValueError("backend down")


async def async_boom(ctx: TaskContext, param: Any) -> Any:
    raise ValueError("backend down")


def _assert_names(error: BaseException | None, *parts: str) -> None:
    assert isinstance(error, TypeError), repr(error)
    message = str(error)
    assert "returned a coroutine" in message and "was closed" in message, message
    for part in parts:
        assert part in message, message


# -- fallback= ----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sync node", "async node", "failed father"])
def test_a_fallback_returning_a_coroutine_fails_the_node_naming_it(
        pool: ThreadPoolExecutor, how: str) -> None:
    fallback = lambda ctx, error: stand_in(ctx, error)  # noqa: E731 - a plain def
    if how == "failed father":
        father = FunctionNode(boom, name="father")
        node = FunctionNode(lambda ctx, p: "never", name="price", fallback=fallback)
        father >> node
    else:
        node = FunctionNode(boom if how == "sync node" else async_boom, name="price",
                            fallback=fallback)
    with NeverAwaited() as caught:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    wr = result["price"].work_result
    assert wr.state is EXCEPTION  # not DEGRADED with a coroutine for a value
    assert isinstance(wr.exception, FallbackError) and "node 'price'" in str(wr.exception)
    _assert_names(wr.exception.__cause__, "node 'price'", "its fallback", "stand_in()")
    assert caught.lines == []


def test_a_nodes_own_timeout_with_a_fallback_returning_a_coroutine_fails_the_node(
        pool: ThreadPoolExecutor, fake_clock: FakeClock) -> None:
    release = threading.Event()

    def slow(ctx: TaskContext, param: Any) -> str:
        clock.wait(release, LONG)
        return "late"

    node = FunctionNode(slow, name="price", timeout=SHORT,
                        fallback=lambda ctx, error: stand_in(ctx, error))
    try:
        with NeverAwaited() as caught:
            result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    finally:
        release.set()
    wr = result["price"].work_result
    assert wr.state is EXCEPTION and isinstance(wr.exception, FallbackError)
    _assert_names(wr.exception.__cause__, "node 'price'", "its fallback")
    assert caught.lines == []


# -- share_key= and a batch's key= --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_share_key_returning_a_coroutine_fails_the_node_without_a_call(
        pool: ThreadPoolExecutor, kind: str) -> None:
    calls: list[str] = []

    def price(ctx: TaskContext, param: Any) -> str:
        calls.append("sync")
        return "price"

    async def async_price(ctx: TaskContext, param: Any) -> str:
        calls.append("async")
        return "price"

    nodes = [FunctionNode(price if kind == "sync" else async_price, k, name=f"price{k}",
                          share_key=lambda ctx, p: key_for(ctx, p), cache_ttl=30)
             for k in range(2)]
    with NeverAwaited() as caught:
        result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    for k in range(2):
        wr = result[f"price{k}"].work_result
        assert wr.state is EXCEPTION
        _assert_names(wr.exception, f"node 'price{k}'", "its share_key", "key_for()")
    assert calls == []  # no key, no call (each coroutine would have been a key of its own)
    assert caught.lines == []


def test_a_batch_key_returning_a_coroutine_fails_its_node(pool: ThreadPoolExecutor) -> None:
    asked: list[Any] = []
    batch = Batch("prices", lambda keys: asked.extend(keys) or {k: k for k in keys},
                  key=lambda ctx, p: key_for(ctx, p))
    with NeverAwaited() as caught:
        result = TaskScheduling.start(
            [FunctionNode(lambda ctx, p: p, k, name=f"n{k}", batch=batch) for k in range(3)],
            executor=pool, timeout=LONG)
    assert [result[f"n{k}"].work_result.state for k in range(3)] == [EXCEPTION] * 3
    for k in range(3):
        _assert_names(result[f"n{k}"].work_result.exception, f"node 'n{k}' (batch 'prices')",
                      "its batch's key")
    assert asked == []  # no key, no call
    assert caught.lines == []


# -- hooks --------------------------------------------------------------------------------------


class Hooked(SchedulingNode[Any, Any]):
    """A node whose hooks are plain defs returning a coroutine (an async helper called, not
    awaited)."""

    def __init__(self, *, fail: bool, name: str, **options: Any) -> None:
        super().__init__(None, name=name, **options)
        self.fail = fail

    def task(self, ctx: TaskContext, param: Any) -> str:
        if self.fail:
            raise ValueError("backend down")
        return "ok"

    def on_begin(self, support: Any) -> Any:
        return close_socket()

    def on_success(self, support: Any) -> Any:
        return close_socket()

    def on_fail(self, support: Any) -> Any:
        return close_socket()


class AsyncHooked(Hooked):
    async def task(self, ctx: TaskContext, param: Any) -> str:  # type: ignore[override]
        return Hooked.task(self, ctx, param)


@pytest.mark.parametrize("cls", [Hooked, AsyncHooked], ids=["sync", "async"])
@pytest.mark.parametrize("fail", [False, True], ids=["on_success", "on_fail"])
def test_a_hook_returning_a_coroutine_is_a_hook_error_naming_the_node(
        pool: ThreadPoolExecutor, cls: type[Hooked], fail: bool) -> None:
    with NeverAwaited() as caught:
        result = TaskScheduling.start(cls(fail=fail, name="page"), executor=pool,
                                      timeout=LONG)
    wr = result["page"].work_result
    assert wr.state is (EXCEPTION if fail else SUCCESS)  # a hook never changes the outcome
    hook = result.hook_errors["page"]
    # on_begin's error comes first; the outcome hook's is logged the same way
    assert hook.hook == "on_begin"
    _assert_names(hook.exception, "node 'page'", "its hook on_begin", "close_socket()")
    assert caught.lines == []


def test_an_outcome_hook_returning_a_coroutine_is_the_nodes_hook_error(
        pool: ThreadPoolExecutor, taskflow_logs: list[dict[str, Any]]) -> None:
    class OnSuccess(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> str:
            return "ok"

        def on_success(self, support: Any) -> Any:
            return close_socket()

    with NeverAwaited() as caught:
        result = TaskScheduling.start(OnSuccess(name="page"), executor=pool, timeout=LONG)
    assert result["page"].work_result.state is SUCCESS
    hook = result.hook_errors["page"]
    assert hook.hook == "on_success"
    _assert_names(hook.exception, "node 'page'", "its hook on_success", "never awaited")
    assert any("hook on_success of node page raised" in str(r["message"])
               for r in taskflow_logs)
    assert caught.lines == []


def test_a_detached_nodes_hook_returning_a_coroutine_is_closed(
        pool: ThreadPoolExecutor, taskflow_logs: list[dict[str, Any]]) -> None:
    with NeverAwaited() as caught:
        result = TaskScheduling.start(Hooked(fail=False, name="audit", detach=True, timeout=LONG),
                                      executor=pool, timeout=LONG)
        assert result.detached("audit").result(LONG).state is SUCCESS
        poll(lambda: [str(r["message"]) for r in taskflow_logs
                      if "of detached node audit raised" in str(r["message"])],
             lambda lines: len(lines) >= 2, "the detached node's hook errors logged")
    assert caught.lines == []


# -- ctx.on_cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_on_cancel_callback_returning_a_coroutine_is_counted_as_raised(
        pool: ThreadPoolExecutor, fake_clock: FakeClock,
        taskflow_logs: list[dict[str, Any]], kind: str) -> None:
    release = threading.Event()

    def sync_task(ctx: TaskContext, param: Any) -> str:
        ctx.on_cancel(lambda: close_socket())
        clock.wait(release, LONG)
        return "late"

    async def async_task(ctx: TaskContext, param: Any) -> str:
        ctx.on_cancel(lambda: close_socket())
        await asyncio.sleep(LONG)
        return "late"  # pragma: no cover - cancelled

    node = FunctionNode(sync_task if kind == "sync" else async_task, name="fetch")
    try:
        with NeverAwaited() as caught:
            result = TaskScheduling.start(node, executor=pool, timeout=SHORT * 2)
            assert result.status is FlowStatus.TIMED_OUT
            note = poll(lambda: result.attempt_notes["fetch"], lambda n: n.ran == 1,
                        "the callback ran")
    finally:
        release.set()
    assert (note.registered, note.ran, note.raised) == (1, 1, 1)
    lines = [str(r["message"]) for r in taskflow_logs
             if "on_cancel callback <lambda> of node fetch raised" in str(r["message"])]
    assert len(lines) == 1
    assert "its on_cancel callback <lambda> is a plain def that returned a coroutine of " \
           "close_socket()" in lines[0] and "CancelledError" in lines[0]
    assert caught.lines == []
