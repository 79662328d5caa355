"""Under ``run_async`` no hook runs on the awaiting event loop's thread, also when the run is
closed on that thread: the awaiting task cancelled, or a budget already spent when the run
begins."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import remote_tasks as rt
from conftest import LONG, PROMPT

import taskflow
from taskflow import FunctionNode, ResultState, TaskSupport


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="tfpool") as p:
        yield p


class Watched(FunctionNode):
    """A node whose ``on_fail`` records the threads it ran on (in ``threads``, shared by the
    run's copy of the node)."""

    def __init__(self, fn: Any, name: str) -> None:
        super().__init__(fn, name=name)
        self.failed = threading.Event()
        self.threads: list[threading.Thread] = []

    def on_fail(self, support: TaskSupport) -> None:
        self.threads.append(threading.current_thread())
        self.failed.set()


def _blocking(release: threading.Event, started: threading.Event) -> Any:
    def slow(ctx: Any, _: Any) -> None:
        started.set()
        release.wait(LONG)
    return slow


def _waiting(started: threading.Event) -> Any:
    async def slow(ctx: Any, _: Any) -> None:
        started.set()
        await asyncio.sleep(LONG)
    return slow


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cancelling_the_await_runs_the_on_fail_hooks_off_the_loop_thread(
        pool: ThreadPoolExecutor, kind: str) -> None:
    release, started = threading.Event(), threading.Event()
    task = _blocking(release, started) if kind == "sync" else _waiting(started)
    node = Watched(task, "slow")
    ctx = taskflow.TaskContext()

    async def main() -> threading.Thread:
        awaiting = asyncio.ensure_future(taskflow.run_async(node, executor=pool, timeout=LONG,
                                                            context=ctx))
        while not started.is_set():
            await asyncio.sleep(0.001)
        awaiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await awaiting
        assert ctx.cancelled  # closed at once, though its hooks run elsewhere
        return threading.current_thread()

    try:
        loop_thread = asyncio.run(main())
    finally:
        release.set()
    assert node.failed.wait(PROMPT)
    assert len(node.threads) == 1
    assert node.threads[0] is not loop_thread


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_spent_budget_under_run_async_runs_the_on_fail_hooks_off_the_loop_thread(
        pool: ThreadPoolExecutor, kind: str) -> None:
    release, started = threading.Event(), threading.Event()
    task = _blocking(release, started) if kind == "sync" else _waiting(started)
    node = Watched(task, "slow")

    async def main() -> tuple[Any, threading.Thread]:
        result = await taskflow.run_async(node, executor=pool, timeout=0)
        return result, threading.current_thread()

    try:
        result, loop_thread = asyncio.run(main())
    finally:
        release.set()
    assert result.result_of("slow").state is ResultState.TIMEOUT
    assert not started.is_set()
    assert node.failed.wait(PROMPT)
    assert len(node.threads) == 1
    assert node.threads[0] is not loop_thread


def test_on_begin_of_a_remote_node_under_run_async_runs_off_the_loop_thread(
        spawn_pool: Any) -> None:
    ctx = taskflow.TaskContext()

    async def main() -> tuple[Any, str]:
        node = rt.BeginRecorder(rt.const, 2, name="n")
        result = await taskflow.run_async(node, executor=spawn_pool, timeout=LONG, context=ctx)
        return result, threading.current_thread().name

    result, loop_thread = asyncio.run(main())
    assert result.ok, result.summary
    hooks = [(hook, thread) for _, hook, _, thread in ctx["hooks"]]
    assert [hook for hook, _ in hooks] == ["on_begin", "on_success"]
    assert all(thread != loop_thread for _, thread in hooks), hooks
