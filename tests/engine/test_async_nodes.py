"""Async nodes: an ``async def`` task runs on an event loop, holds no worker while it awaits,
mixes with sync nodes in one DAG, and is cancelled for real when the run gives up on it."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, PROMPT, SHORT

import taskflow
import taskflow.observe as observe
from taskflow import (
    FlowStatus,
    FunctionNode,
    Join,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    TaskSupport,
)
from taskflow.engine import aio, looplag
from taskflow.errors import (
    FlowDefinitionError,
    InvalidArgumentError,
    InvalidArgumentValueError,
    InvalidNodeError,
    UpstreamFailedError,
)

LOOP = aio.LOOP_THREAD


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="tfpool") as p:
        yield p


def _loop_tasks() -> set[asyncio.Task[Any]]:
    """The tasks on taskflow's own loop, read on the loop thread."""
    loop = aio.loop_thread.get()
    return asyncio.run_coroutine_threadsafe(_tasks_but_this(), loop).result(PROMPT)


async def _tasks_but_this() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]


def _threads() -> int:
    """Live threads but the loop's watcher (one per process, while attempts are in flight)."""
    return sum(1 for t in threading.enumerate() if t.name != looplag.WATCH_THREAD)


def _wait_until(pred: Any, limit: float = PROMPT) -> bool:
    end = time.monotonic() + limit
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


# -- where it runs ------------------------------------------------------------------------------


def test_an_async_function_node_runs_on_taskflows_loop_thread(pool: ThreadPoolExecutor) -> None:
    async def fetch(ctx: TaskContext, sku: str) -> tuple[str, str]:
        await asyncio.sleep(0)
        return sku, threading.current_thread().name

    result = TaskScheduling.start(FunctionNode(fetch, "sku-1"), executor=pool, timeout=LONG)
    assert result.status is FlowStatus.COMPLETED
    assert result.result_of("fetch").result == ("sku-1", LOOP)
    assert result.result_of("fetch").thread == LOOP


def test_an_async_task_method_on_a_scheduling_node_runs_on_the_loop(
        pool: ThreadPoolExecutor) -> None:
    class Reviews(SchedulingNode[str, str]):
        async def task(self, ctx: TaskContext, param: str | None) -> str:
            await asyncio.sleep(0)
            return f"{param}@{threading.current_thread().name}"

    result = TaskScheduling.start(Reviews("sku", name="reviews"), executor=pool, timeout=LONG)
    assert result.result_of("reviews").result == f"sku@{LOOP}"


def test_waiting_async_nodes_hold_no_worker(pool: ThreadPoolExecutor) -> None:
    # 30 nodes wait for each other on a pool of 4 workers: only possible if none holds one
    started = [0]
    everyone: list[asyncio.Event] = []

    async def call(ctx: TaskContext, k: int) -> int:
        if not everyone:
            everyone.append(asyncio.Event())
        started[0] += 1  # the loop thread only: no lock needed
        if started[0] == 30:
            everyone[0].set()
        await everyone[0].wait()
        return k

    nodes = [FunctionNode(call, k, name=f"call{k}") for k in range(30)]
    result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    assert result.status is FlowStatus.COMPLETED
    assert [result.result_of(f"call{k}").result for k in range(30)] == list(range(30))


def test_submit_and_stream_run_async_nodes(pool: ThreadPoolExecutor) -> None:
    async def part(ctx: TaskContext, p: str) -> str:
        await asyncio.sleep(0)
        return p

    a, b = FunctionNode(part, "a", name="a"), FunctionNode(part, "b", name="b")
    a >> b
    fut = TaskScheduling.submit(b, executor=pool, timeout=LONG)
    assert fut.result(PROMPT).result_of("b").result == "b"
    with TaskScheduling.stream(b, executor=pool, timeout=LONG) as parts:
        assert [(name, wr.result) for name, wr in parts] == [("a", "a"), ("b", "b")]


def test_run_async_runs_async_nodes_on_the_awaiting_loop(pool: ThreadPoolExecutor) -> None:
    async def where(ctx: TaskContext, p: Any) -> int:
        await asyncio.sleep(0)
        return threading.get_ident()

    async def main() -> Any:
        return await taskflow.run_async(FunctionNode(where), executor=pool, timeout=LONG)

    result = asyncio.run(main())
    assert result.result_of("where").result == threading.get_ident()


def test_set_event_loop_runs_async_nodes_on_the_applications_loop(
        pool: ThreadPoolExecutor) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="app-loop")
    thread.start()

    async def where(ctx: TaskContext, p: Any) -> str:
        return threading.current_thread().name

    try:
        taskflow.set_event_loop(loop)
        result = TaskScheduling.start(FunctionNode(where), executor=pool, timeout=LONG)
        assert result.result_of("where").result == "app-loop"
    finally:
        taskflow.set_event_loop(None)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(PROMPT)
        loop.close()
    result = TaskScheduling.start(FunctionNode(where), executor=pool, timeout=LONG)
    assert result.result_of("where").result == LOOP


class _CountingPool(ThreadPoolExecutor):
    """A thread pool counting what is submitted to it."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="counted")
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_a_page_of_async_roots_is_handed_to_the_loop_without_a_worker() -> None:
    async def call(ctx: TaskContext, k: int) -> int:
        await asyncio.sleep(0.01)
        return k

    nodes = [FunctionNode(call, k, name=f"call-{k}") for k in range(40)]
    with _CountingPool(8) as counted:
        assert TaskScheduling.start(nodes, executor=counted, timeout=LONG).ok
        counted.submitted = 0
        result = TaskScheduling.start(nodes, executor=counted, timeout=LONG)
        assert result.ok
        # the run's owner hands its plain async roots to the loop itself: no worker loop
        assert counted.submitted == 0
    assert sorted(result.result_of(f"call-{k}").result for k in range(40)) == list(range(40))
    assert {result.result_of(f"call-{k}").thread for k in range(40)} == {LOOP}


def test_an_async_root_starts_while_every_worker_is_held_by_a_blocked_sync_node() -> None:
    held = threading.Event()
    release = threading.Event()
    entered = threading.Barrier(3)

    def blocked(ctx: TaskContext, _: Any) -> str:
        entered.wait(LONG)
        release.wait(LONG)
        return "done"

    async def call(ctx: TaskContext, _: Any) -> str:
        held.set()  # it ran on the loop while both workers were blocked
        await asyncio.sleep(0)
        return "called"

    async def then(ctx: TaskContext, _: Any) -> str:  # a son of an async father
        await asyncio.sleep(0)
        return ctx.result_of("call") + " then"

    with ThreadPoolExecutor(2, thread_name_prefix="tfheld") as pool:
        sync_nodes = [FunctionNode(blocked, name=f"blocked-{k}") for k in range(2)]
        busy = TaskScheduling.submit(sync_nodes, executor=pool, timeout=LONG)
        try:
            entered.wait(LONG)  # both workers are inside a blocked sync node
            root, son = FunctionNode(call, name="call"), FunctionNode(then, name="then")
            root >> son
            result = TaskScheduling.start(son, executor=pool, timeout=LONG)
            assert held.is_set() and not release.is_set()
            assert result.ok and result.result_of("then").result == "called then"
        finally:
            release.set()
        assert busy.result(LONG).ok


def test_a_chain_of_async_nodes_runs_without_a_worker() -> None:
    async def step(ctx: TaskContext, k: int) -> int:
        await asyncio.sleep(0)
        return k if k == 0 else ctx.result_of(f"step-{k - 1}") + k

    nodes = [FunctionNode(step, k, name=f"step-{k}") for k in range(5)]
    for father, son in itertools.pairwise(nodes):
        father >> son
    with _CountingPool(4) as counted:
        result = TaskScheduling.start(nodes[-1], executor=counted, timeout=LONG)
        assert result.ok and result.result_of("step-4").result == 0 + 1 + 2 + 3 + 4
        assert counted.submitted == 0  # each son is started by the owner that recorded its father


# -- mixed graphs ------------------------------------------------------------------------------


def test_sync_and_async_nodes_feed_each_other_in_one_graph(pool: ThreadPoolExecutor) -> None:
    def price(ctx: TaskContext, sku: str) -> int:
        return 10

    async def reviews(ctx: TaskContext, sku: str) -> int:
        await asyncio.sleep(0)
        return ctx.result_of("price") + 1

    def page(ctx: TaskContext, p: Any) -> tuple[int, int, str]:
        return ctx.result_of("price"), ctx.result_of("reviews"), threading.current_thread().name

    async def footer(ctx: TaskContext, p: Any) -> int:
        return ctx.result_of("page")[1] * 2

    p, r, g, f = (FunctionNode(price, "sku"), FunctionNode(reviews, "sku"), FunctionNode(page),
                  FunctionNode(footer))
    p >> r
    p >> g
    r >> g
    g >> f
    result = TaskScheduling.start(f, executor=pool, timeout=LONG)
    assert result.status is FlowStatus.COMPLETED
    value, reviews_value, thread = result.result_of("page").result
    assert (value, reviews_value) == (10, 11)
    assert thread.startswith("tfpool")  # a sync node never runs on the loop
    assert result.result_of("footer").result == 22


def test_an_async_failure_fails_fast_like_a_sync_one(pool: ThreadPoolExecutor) -> None:
    async def broken(ctx: TaskContext, p: Any) -> None:
        await asyncio.sleep(0)
        raise ValueError("backend said no")

    ran = threading.Event()

    def after(ctx: TaskContext, p: Any) -> None:
        ran.set()

    b, a = FunctionNode(broken), FunctionNode(after)
    b >> a
    result = TaskScheduling.start(a, executor=pool, timeout=LONG)
    assert result.status is FlowStatus.FAILED
    wr = result.result_of("broken")
    assert wr.state is ResultState.EXCEPTION
    assert isinstance(wr.exception, ValueError)
    assert str(wr.exception) == "backend said no"
    son = result.result_of("after")
    assert isinstance(son.exception, UpstreamFailedError)  # as under a sync father
    assert son.attempts == 0
    assert not ran.is_set()


def test_hooks_of_async_nodes_run_once_off_the_loop_thread(pool: ThreadPoolExecutor) -> None:
    seen: list[tuple[str, str]] = []

    class Fetch(SchedulingNode[Any, int]):
        async def task(self, ctx: TaskContext, param: Any) -> int:
            if param == "bad":
                raise RuntimeError("no")
            return 1

        def on_begin(self, support: TaskSupport) -> None:
            seen.append(("begin", threading.current_thread().name))

        def on_success(self, support: TaskSupport) -> None:
            seen.append(("success", threading.current_thread().name))

        def on_fail(self, support: TaskSupport) -> None:
            seen.append(("fail", threading.current_thread().name))

    result = TaskScheduling.start([Fetch("good", name="good"), Fetch("bad", name="bad")],
                                  executor=pool, timeout=LONG)
    assert result.result_of("good").state is ResultState.SUCCESS
    assert sorted(kind for kind, _ in seen) == ["begin", "begin", "fail", "success"]
    assert all(thread != LOOP for _, thread in seen)


# -- real cancellation -------------------------------------------------------------------------


class Hang:
    """An async backend that never answers: it awaits a future nobody sets."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.callbacks = threading.Event()
        self.started = threading.Event()
        self.starts = self.cancels = 0  # written on the loop thread only

    async def __call__(self, ctx: TaskContext, p: Any) -> None:
        ctx.on_cancel(self.callbacks.set)
        self.started.set()
        self.starts += 1
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancels += 1
            self.cancelled.set()
            raise


def test_the_run_budget_cancels_the_asyncio_task(pool: ThreadPoolExecutor) -> None:
    hang = Hang()
    result = TaskScheduling.start(FunctionNode(hang, name="hang"), executor=pool, timeout=SHORT)
    assert result.status is FlowStatus.TIMED_OUT
    assert result.result_of("hang").state is ResultState.TIMEOUT
    assert hang.cancelled.wait(PROMPT)
    assert hang.callbacks.wait(PROMPT)


def test_a_node_timeout_cancels_the_task_and_the_run_goes_on(pool: ThreadPoolExecutor) -> None:
    hang = Hang()

    def other(ctx: TaskContext, p: Any) -> str:
        return "done"

    result = TaskScheduling.start(
        [FunctionNode(hang, name="hang", timeout=SHORT), FunctionNode(other)],
        executor=pool, timeout=LONG)
    assert result.result_of("hang").state is ResultState.TIMEOUT
    assert result.result_of("other").result == "done"
    assert hang.cancelled.wait(PROMPT)
    assert hang.callbacks.wait(PROMPT)


def test_a_deadline_from_the_runs_start_cancels_the_task(pool: ThreadPoolExecutor) -> None:
    hang = Hang()
    result = TaskScheduling.start(FunctionNode(hang, name="hang", deadline=SHORT),
                                  executor=pool, timeout=LONG)
    assert result.result_of("hang").state is ResultState.TIMEOUT
    assert hang.cancelled.wait(PROMPT)


def test_ctx_cancel_from_a_sync_node_cancels_a_waiting_async_node(
        pool: ThreadPoolExecutor) -> None:
    hang = Hang()

    def canceller(ctx: TaskContext, p: Any) -> None:
        assert hang.started.wait(PROMPT)
        ctx.cancel("enough")

    result = TaskScheduling.start([FunctionNode(hang, name="hang"), FunctionNode(canceller)],
                                  executor=pool, timeout=LONG)
    assert result.result_of("hang").state is ResultState.CANCELLED
    assert hang.cancelled.wait(PROMPT)
    assert hang.callbacks.wait(PROMPT)


def test_ctx_cancel_from_an_async_node_closes_the_run_off_the_loop(
        pool: ThreadPoolExecutor) -> None:
    hang = Hang()
    fail_threads: list[str] = []

    class Waiting(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> None:
            threading.Event().wait()  # pragma: no cover - never started: its father never ends

        def on_fail(self, support: TaskSupport) -> None:
            fail_threads.append(threading.current_thread().name)

    async def stop(ctx: TaskContext, p: Any) -> str:
        assert await asyncio.get_running_loop().run_in_executor(None, hang.started.wait, PROMPT)
        ctx.cancel("async says stop")
        return "stopped"

    h = FunctionNode(hang, name="hang")
    w = Waiting(name="waiting")
    h >> w
    result = TaskScheduling.start([w, FunctionNode(stop)], executor=pool, timeout=LONG)
    assert result.status is FlowStatus.CANCELLED
    assert result.result_of("stop").result == "stopped"  # the node that cancelled ends itself
    assert result.result_of("hang").state is ResultState.CANCELLED
    assert result.result_of("waiting").state is ResultState.CANCELLED
    assert fail_threads and LOOP not in fail_threads
    assert hang.cancelled.wait(PROMPT)


def test_a_join_that_no_longer_needs_an_async_father_cancels_it(
        pool: ThreadPoolExecutor) -> None:
    hang = Hang()

    async def quick(ctx: TaskContext, p: Any) -> str:
        assert await asyncio.get_running_loop().run_in_executor(None, hang.started.wait, PROMPT)
        return "quick"

    def first(ctx: TaskContext, p: Any) -> str:
        return "joined"

    h, q = FunctionNode(hang, name="hang"), FunctionNode(quick)
    j = FunctionNode(first, join=Join.ANY)
    h >> j
    q >> j
    result = TaskScheduling.start(j, executor=pool, timeout=LONG)
    assert result.result_of("first").result == "joined"
    assert result.result_of("hang").state is ResultState.CANCELLED
    assert hang.cancelled.wait(PROMPT)


def test_two_hundred_runs_against_a_hung_backend_leave_no_task_and_no_thread(
        pool: ThreadPoolExecutor) -> None:
    hang = Hang()
    node = FunctionNode(hang, name="hang")
    TaskScheduling.start(node, executor=pool, timeout=0.001)  # the loop thread exists now
    assert _wait_until(lambda: not _loop_tasks())
    threads = _threads()
    for _ in range(200):
        result = TaskScheduling.start(node, executor=pool, timeout=0.02)
        assert result.result_of("hang").state is ResultState.TIMEOUT
    assert _wait_until(lambda: not _loop_tasks()), _loop_tasks()
    assert hang.starts > 100  # most calls reached the backend before their budget ran out
    assert hang.cancels == hang.starts  # and every one that did was cancelled
    # no worker is kept by the 200 abandoned calls: the coordinator threads may come and go
    assert _threads() <= threads + 1
    assert observe.abandoned() == []


# -- retries -------------------------------------------------------------------------------------


def test_retries_of_an_async_node_wait_their_back_off_on_the_timer(
        pool: ThreadPoolExecutor) -> None:
    calls: list[float] = []

    async def flaky(ctx: TaskContext, p: Any) -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "ok"

    result = TaskScheduling.start(FunctionNode(flaky, retries=3, retry_backoff=SHORT),
                                  executor=pool, timeout=LONG)
    wr = result.result_of("flaky")
    assert (wr.state, wr.result, wr.attempts) == (ResultState.SUCCESS, "ok", 3)
    assert calls[1] - calls[0] >= SHORT * 0.9  # the back-offs were waited
    assert calls[2] - calls[1] >= SHORT * 0.9 * 2


def test_the_budget_ends_an_async_node_waiting_in_its_back_off(
        pool: ThreadPoolExecutor) -> None:
    async def down(ctx: TaskContext, p: Any) -> None:
        raise ConnectionError("down")

    result = TaskScheduling.start(FunctionNode(down, retries=5, retry_backoff=MEDIUM / 2),
                                  executor=pool, timeout=MEDIUM)
    wr = result.result_of("down")
    assert wr.state in (ResultState.TIMEOUT, ResultState.EXCEPTION)
    assert wr.attempts <= 2


# -- bad input -----------------------------------------------------------------------------------


def test_a_coroutine_object_instead_of_a_function_is_refused_by_name() -> None:
    async def fetch(ctx: TaskContext, p: Any) -> None:
        return None

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the coroutine is closed: no "never awaited" later
        with pytest.raises(InvalidNodeError, match=r"coroutine object .*fetch\(\.\.\.\).*"
                                                   r"FunctionNode\(.*fetch\)"):
            FunctionNode(fetch(None, None))  # type: ignore[arg-type]


@pytest.mark.parametrize("hook", ["on_begin", "on_success", "on_fail"])
def test_an_async_hook_is_refused_before_anything_runs(pool: ThreadPoolExecutor,
                                                       hook: str) -> None:
    async def bad_hook(self: Any, support: TaskSupport) -> None:
        return None

    ran = threading.Event()
    cls = type("Hooked", (SchedulingNode,), {
        "task": lambda self, ctx, p: ran.set(), hook: bad_hook})
    with pytest.raises(FlowDefinitionError, match=rf"Hooked\.{hook} is async"):
        TaskScheduling.start(cls(name="hooked"), executor=pool, timeout=LONG)
    assert not ran.is_set()


def test_set_event_loop_refuses_a_closed_loop_and_what_is_not_a_loop() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(InvalidArgumentValueError, match="closed event loop"):
        taskflow.set_event_loop(loop)
    with pytest.raises(InvalidArgumentError, match="got str"):
        taskflow.set_event_loop("loop")


def test_an_async_node_on_a_process_pool_is_refused_at_start() -> None:
    async def fetch(ctx: TaskContext, p: Any) -> None:
        return None

    with ProcessPoolExecutor(1) as procs:
        with pytest.raises(FlowDefinitionError, match=r"'fetch' has an async def task.*"
                                                      r"ProcessPoolExecutor"):
            TaskScheduling.start(FunctionNode(fetch), executor=procs, timeout=LONG)


def test_start_on_the_loop_async_nodes_use_is_refused(pool: ThreadPoolExecutor) -> None:
    async def leaf(ctx: TaskContext, p: Any) -> None:
        return None

    async def nested(ctx: TaskContext, p: Any) -> str:
        try:
            TaskScheduling.start(FunctionNode(leaf), executor=pool, timeout=LONG)
        except FlowDefinitionError as exc:
            return str(exc)
        return "ran"  # pragma: no cover - the defect: the loop blocked on itself

    result = TaskScheduling.start(FunctionNode(nested), executor=pool, timeout=LONG)
    assert "await taskflow.run_async" in result.result_of("nested").result


# -- the loop thread's life ----------------------------------------------------------------------


def _child_script(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=LONG * 3,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_interpreter_exit_cancels_what_is_left_on_the_loop_and_exits_cleanly() -> None:
    out = _child_script("""
        import asyncio, threading
        from concurrent.futures import ThreadPoolExecutor
        from taskflow import FunctionNode, TaskScheduling
        started = threading.Event()
        async def hang(ctx, p):
            started.set()
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                print("cancelled at exit", flush=True)
                raise
        pool = ThreadPoolExecutor(1)
        TaskScheduling.submit(FunctionNode(hang), executor=pool)
        assert started.wait(5)
        pool.shutdown()
        print("leaving", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["leaving", "cancelled", "at", "exit"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_gets_a_loop_thread_of_its_own() -> None:
    out = _child_script("""
        import asyncio, os, threading
        from concurrent.futures import ThreadPoolExecutor
        from taskflow import FunctionNode, TaskScheduling
        async def where(ctx, p):
            return (os.getpid(), threading.get_ident())
        with ThreadPoolExecutor(1) as pool:
            parent = TaskScheduling.start(FunctionNode(where), executor=pool, timeout=5)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            with ThreadPoolExecutor(1) as pool:
                child = TaskScheduling.start(FunctionNode(where), executor=pool, timeout=5)
            ok = child.result_of("where").result[0] == os.getpid()
            os.write(w, b"ok" if ok else b"no")
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(r, 2).decode(), parent.result_of("where").result[0] == os.getpid())
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "True"]
