"""A run awaited with ``run_async`` and cancelled while its async attempts await: by
``ctx.cancel`` from a coroutine on the awaiting loop or from another thread, or by cancelling
the awaiting task. The await ends at once; every async task is cancelled for real
(``CancelledError`` inside it), each attempt's ``ctx.on_cancel`` callbacks run once, off the
loop thread, as do the ``on_fail`` hooks; the observers see every node settle and the run end
``CANCELLED``; nothing is left on the loop, also for attempts cancelled before they began."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, PROMPT

import taskflow
from taskflow import Batch, Bulkhead, FlowStatus, FunctionNode, ResultState, TaskSupport
from taskflow.engine import events

CANCELLED = ResultState.CANCELLED


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="tfpool") as p:
        yield p


class Seen:
    """What the run's tasks, callbacks, hooks and observers did, by thread; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.began: list[str] = []
        self.inner: list[str] = []  # CancelledError raised inside the task
        self.on_cancel: list[tuple[str, str]] = []
        self.on_fail: list[tuple[str, ResultState, str]] = []
        self.settled: list[int] = []
        self.ended: list[FlowStatus] = []
        self.all_began = threading.Event()
        self.expected = 0

    def add(self, where: list[Any], item: Any) -> None:
        with self.lock:
            where.append(item)
            if where is self.began and len(self.began) == self.expected:
                self.all_began.set()


class Watched(FunctionNode):
    """Records its ``on_fail`` in ``seen`` (shared by the run's copy of the node)."""

    def __init__(self, fn: Any, seen: Seen, name: str, **options: Any) -> None:
        super().__init__(fn, name=name, **options)
        self.seen = seen

    def on_fail(self, support: TaskSupport) -> None:
        self.seen.add(self.seen.on_fail, (support.node.name, support.work_result.state,
                                          threading.current_thread().name))


def hanging(seen: Seen) -> Any:
    async def hang(ctx: Any, name: str) -> None:
        ctx.on_cancel(lambda: seen.add(seen.on_cancel,
                                       (name, threading.current_thread().name)))
        seen.add(seen.began, name)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.add(seen.inner, name)
            raise
    return hang


class _Observer(events.RunObserver):
    per_node = True

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def node_settled(self, i: int) -> None:
        self.seen.add(self.seen.settled, i)

    def run_ended(self, result: Any) -> None:
        self.seen.add(self.seen.ended, result.status)


class _Listener:
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def run_started(self, run: Any) -> events.RunObserver:
        return _Observer(self.seen)


@pytest.fixture
def seen() -> Iterator[Seen]:
    s = Seen()
    listener = _Listener(s)
    events.add_listener(listener)
    try:
        yield s
    finally:
        events.remove_listener(listener)


def _flow(seen: Seen) -> FunctionNode:
    """Three async nodes that never answer, and a sync son of theirs."""
    hang = hanging(seen)
    sources = [Watched(hang, seen, f"a{k}") for k in range(3)]
    for node, k in zip(sources, range(3), strict=True):
        node.param = f"a{k}"
    son = Watched(lambda ctx, _: 1, seen, "son")
    for node in sources:
        node >> son
    seen.expected = 3
    return son


def _loop_is_empty() -> bool:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def _cancel_while_awaiting(flow: FunctionNode, pool: ThreadPoolExecutor, seen: Seen,
                                 how: str) -> tuple[Any, float, str]:
    ctx = taskflow.TaskContext()
    awaiting = asyncio.ensure_future(
        taskflow.run_async(flow, executor=pool, timeout=LONG, context=ctx))
    while not seen.all_began.is_set():
        await asyncio.sleep(0.001)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    result: Any = None
    if how == "a coroutine on the loop":
        ctx.cancel("the client went away")
        result = await asyncio.wait_for(awaiting, PROMPT)
    elif how == "another thread":
        threading.Thread(target=ctx.cancel, args=("the client went away",)).start()
        result = await asyncio.wait_for(awaiting, PROMPT)
    else:
        awaiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await awaiting
    waited = loop.time() - t0
    for _ in range(int(PROMPT / 0.01)):  # the tasks' ends and the hooks, handed elsewhere
        if (len(seen.on_fail) == 4 and len(seen.inner) == 3 and len(seen.on_cancel) == 3
                and _loop_is_empty()):
            break
        await asyncio.sleep(0.01)
    assert _loop_is_empty()
    return result, waited, threading.current_thread().name


@pytest.mark.parametrize("how", ["a coroutine on the loop", "another thread",
                                 "the awaiting task cancelled"])
def test_a_cancel_under_run_async_ends_the_await_and_cancels_every_async_task(
        pool: ThreadPoolExecutor, seen: Seen, how: str) -> None:
    result, waited, loop_thread = asyncio.run(
        _cancel_while_awaiting(_flow(seen), pool, seen, how))
    assert waited < PROMPT
    if result is not None:
        assert result.status is FlowStatus.CANCELLED
        assert {name: result[name].work_result.state for name in result} == {
            "a0": CANCELLED, "a1": CANCELLED, "a2": CANCELLED, "son": CANCELLED}
    assert sorted(seen.inner) == ["a0", "a1", "a2"]
    assert sorted(name for name, _ in seen.on_cancel) == ["a0", "a1", "a2"]  # once each
    assert all(thread != loop_thread for _, thread in seen.on_cancel)
    assert sorted((name, state) for name, state, _ in seen.on_fail) == [
        ("a0", CANCELLED), ("a1", CANCELLED), ("a2", CANCELLED), ("son", CANCELLED)]
    assert all(thread != loop_thread for _, _, thread in seen.on_fail)
    assert sorted(seen.settled) == [0, 1, 2, 3] and seen.ended == [FlowStatus.CANCELLED]


def test_cancels_racing_the_start_of_async_attempts_leave_nothing_behind(
        pool: ThreadPoolExecutor) -> None:
    # cancelled as the attempts are handed to the loop, begin or await: a coroutine that never
    # began is closed (no "never awaited" warning), one that began gets its on_cancel once
    began: list[int] = []
    called: list[int] = []

    async def hang(ctx: Any, k: int) -> None:
        ctx.on_cancel(lambda: called.append(k))
        began.append(k)
        await asyncio.Event().wait()

    async def main() -> list[FlowStatus]:
        statuses = []
        for k in range(40):
            ctx = taskflow.TaskContext()
            nodes = [FunctionNode(hang, 5 * k + j, name=f"n{j}") for j in range(5)]
            awaiting = asyncio.ensure_future(
                taskflow.run_async(nodes, executor=pool, timeout=LONG, context=ctx))
            for _ in range(1 + k % 4):  # the run has begun: its context is attached
                await asyncio.sleep(0)
            if k % 8 >= 4:
                threading.Thread(target=ctx.cancel).start()
            else:
                ctx.cancel()
            statuses.append((await asyncio.wait_for(awaiting, PROMPT)).status)
        for _ in range(int(PROMPT / 0.01)):
            if _loop_is_empty() and len(called) == len(began):
                break
            await asyncio.sleep(0.01)
        assert _loop_is_empty()
        return statuses

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        statuses = asyncio.run(main())
        gc.collect()
    assert set(statuses) == {FlowStatus.CANCELLED}
    assert sorted(called) == sorted(began)
    assert not [w for w in caught if "never awaited" in str(w.message)]


@pytest.mark.parametrize("waits", ["in back-off", "for a bulkhead slot", "for an async batch"])
def test_a_cancel_under_run_async_ends_nodes_that_wait_without_a_task(
        pool: ThreadPoolExecutor, waits: str) -> None:
    attempts: list[int] = []
    inner: list[int] = []
    started = threading.Event()

    async def failing(ctx: Any, _: Any) -> None:
        attempts.append(1)
        started.set()
        raise ValueError("try again later")

    async def hang(ctx: Any, k: int) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            inner.append(k)
            raise

    async def fetch_all(keys: Any) -> dict[Any, Any]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            inner.append(-1)
            raise
        return {}  # pragma: no cover

    bulkhead = Bulkhead("cancel-under-run-async", max_concurrent=1)
    batch = Batch("cancel-under-run-async", fetch_all, max_size=10)
    if waits == "in back-off":
        nodes = [FunctionNode(failing, name="n0", retries=3, retry_backoff=LONG / 4)]
    elif waits == "for a bulkhead slot":
        nodes = [FunctionNode(hang, k, name=f"n{k}", bulkhead=bulkhead) for k in range(3)]
    else:
        nodes = [FunctionNode(hang, k, name=f"n{k}", batch=batch) for k in range(3)]

    async def main() -> tuple[Any, float]:
        ctx = taskflow.TaskContext()
        awaiting = asyncio.ensure_future(
            taskflow.run_async(nodes, executor=pool, timeout=LONG, context=ctx))
        while not started.is_set():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)  # the failed attempt backs off; the others queue
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ctx.cancel()
        result = await asyncio.wait_for(awaiting, PROMPT)
        waited = loop.time() - t0
        for _ in range(int(PROMPT / 0.01)):  # a slot, a call's end: given back off the loop
            if _loop_is_empty() and bulkhead.in_use == 0 and (
                    waits != "for an async batch" or batch.metrics().cancelled == 1):
                break
            await asyncio.sleep(0.01)
        assert _loop_is_empty()
        return result, waited

    result, waited = asyncio.run(main())
    assert waited < PROMPT
    assert result.status is FlowStatus.CANCELLED
    assert {result[n].work_result.state for n in result} == {CANCELLED}
    if waits == "in back-off":
        assert attempts == [1]  # no attempt after the cancel
    elif waits == "for a bulkhead slot":
        assert len(inner) == 1 and bulkhead.in_use == 0
    else:
        assert inner == [-1] and batch.metrics().cancelled == 1
