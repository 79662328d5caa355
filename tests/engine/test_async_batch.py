"""A ``Batch`` whose batch function is ``async def``: its call is an asyncio task on the event
loop async nodes use (taskflow's loop thread, or the loop awaiting ``run_async``), holding no
worker; its answer reaches every seat, sync and async nodes alike, as a plain call's does; a
failing call fails (or degrades) its seats as a plain one does; a call whose runs all gave up
is cancelled for real; windows and ``max_size`` behave as for a plain function, and under a
``FakeClock`` the window and the call's awaits follow virtual time. Hooks and user callbacks of
the seats never run on the loop thread."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, SHORT
from resilience_helpers import wait_until

import taskflow
from taskflow import (
    Batch,
    BatchCallError,
    BatchKeyError,
    BatchResultError,
    FanOutNode,
    FunctionNode,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
)
from taskflow.engine import aio
from taskflow.testing import FakeClock

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("error::RuntimeWarning")]  # a coroutine never awaited

KINDS = ["sync", "async"]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="abatch") as p:
        yield p


class Backend:
    """A batch function of either kind: records each call's keys and thread, answers with
    ``answer(keys)`` (default ``{key: f"v-{key}"}``)."""

    def __init__(self, kind: str,
                 answer: Callable[[list[Any]], Any] | None = None) -> None:
        self.kind = kind
        self.answer = answer or (lambda keys: {k: f"v-{k}" for k in keys})
        self.calls: list[list[Any]] = []
        self.threads: list[str] = []
        self.lock = threading.Lock()

    def _record(self, keys: Any) -> Any:
        with self.lock:
            self.calls.append(list(keys))
            self.threads.append(threading.current_thread().name)
        return self.answer(list(keys))

    def sync_fn(self, keys: Any) -> Any:
        return self._record(keys)

    async def async_fn(self, keys: Any) -> Any:
        await asyncio.sleep(0)
        return self._record(keys)

    @property
    def fn(self) -> Any:
        return self.sync_fn if self.kind == "sync" else self.async_fn


class AsyncGetMany:
    """A batch function written as an object with ``async def __call__``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def __call__(self, keys: Any) -> Any:
        return await self.backend.async_fn(keys)


def unused(ctx: Any, param: Any) -> Any:
    raise AssertionError("a batched node's own task is never called")


async def unused_async(ctx: Any, param: Any) -> Any:
    raise AssertionError("a batched node's own task is never called")


def fan_of(batch: Batch, keys: list[Any], seats: str = "mixed",
           **options: Any) -> FunctionNode:
    """A root and one batched node per key below it (ready together): sync nodes, async nodes,
    or both in turn (``mixed``)."""
    root = FunctionNode(lambda ctx, p: "page", name="page")
    for n, key in enumerate(keys):
        is_async = seats == "async" or (seats == "mixed" and n % 2 == 1)
        root >> FunctionNode(unused_async if is_async else unused, param=key, name=f"n-{key}",
                             batch=batch, **options)
    return root


# -- answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["coroutine function", "callable object", "partial"])
def test_an_async_batch_function_answers_sync_and_async_seats_with_one_call_on_the_loop(
        form: str, pool: ThreadPoolExecutor) -> None:
    backend = Backend("async")
    fn = {"coroutine function": backend.async_fn, "callable object": AsyncGetMany(backend),
          "partial": functools.partial(backend.async_fn)}[form]
    batch = Batch(f"abatch-answers-{form}", fn)
    keys = ["a", "b", "c", "d"]
    for _ in range(5):
        result = TaskScheduling.start(fan_of(batch, keys), executor=pool, timeout=LONG)
        assert result.ok, result.summary
        assert {k: result.outputs[f"n-{k}"] for k in keys} == {k: f"v-{k}" for k in keys}
    assert [sorted(c) for c in backend.calls] == [keys] * 5
    assert set(backend.threads) == {aio.LOOP_THREAD}  # on the loop, never on a worker
    labels = {result[f"n-{k}"].work_result.batch for k in keys}
    assert len(labels) == 1 and labels.pop().startswith(f"abatch-answers-{form}#")
    m = batch.metrics()
    assert (m.calls, m.keys, m.waiting, m.failed, m.cancelled) == (5, 20, 0, 0, 0)


def test_under_run_async_the_call_runs_on_the_awaiting_loop(pool: ThreadPoolExecutor) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def get_many(keys: Any) -> dict[Any, Any]:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return {k: k * 2 for k in keys}

    batch = Batch("abatch-run-async", get_many)

    async def page() -> tuple[Any, asyncio.AbstractEventLoop]:
        result = await taskflow.run_async(fan_of(batch, [1, 2, 3]), executor=pool,
                                          timeout=LONG)
        return result, asyncio.get_running_loop()

    result, awaiting = asyncio.run(page())
    assert result.ok, result.summary
    assert [result.outputs[f"n-{k}"] for k in (1, 2, 3)] == [2, 4, 6]
    assert loops == [awaiting]


def test_fan_out_items_are_answered_by_an_async_batch_function(pool: ThreadPoolExecutor) -> None:
    class SkuFan(FanOutNode[list[str]]):
        def items(self, ctx: TaskContext, param: list[str]) -> Iterator[tuple[str, str]]:
            for sku in param:
                yield sku, sku

    backend = Backend("async")
    batch = Batch("abatch-fan", backend.fn, max_size=20)
    skus = [f"sku-{n}" for n in range(50)]
    result = TaskScheduling.start(SkuFan(skus, name="prices", batch=batch, max_concurrency=2),
                                  executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert result.outputs["prices"].succeeded == {s: f"v-{s}" for s in skus}
    assert sorted(map(len, backend.calls)) == [10, 20, 20]
    assert set(backend.threads) == {aio.LOOP_THREAD}


# -- failures, as for a plain function ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_batch_function_fails_every_seat_with_the_cause_and_fallback_applies(
        kind: str, pool: ThreadPoolExecutor) -> None:
    boom = ConnectionError("price backend down")
    seen: list[tuple[BaseException, str]] = []

    def down(keys: list[Any]) -> Any:
        raise boom

    def stand_in(ctx: Any, error: BaseException) -> str:
        seen.append((error, threading.current_thread().name))
        return "cached"

    batch = Batch(f"abatch-fail-{kind}", Backend(kind, down).fn)
    root = FunctionNode(lambda ctx, p: None, name="page")
    plain = FunctionNode(unused, param="a", name="plain", batch=batch)
    kept = FunctionNode(unused_async, param="b", name="kept", batch=batch, fallback=stand_in)
    after = FunctionNode(lambda ctx, p: ctx.result_of("kept") + "!", name="after")
    root >> [plain, kept]
    kept >> after
    result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    error = result["plain"].work_result.exception
    assert isinstance(error, BatchCallError) and error.__cause__ is boom and error.key == "a"
    assert result["plain"].work_result.state is ResultState.EXCEPTION
    assert result["kept"].work_result.state is ResultState.DEGRADED
    assert result.outputs["after"] == "cached!"
    assert len(seen) == 1 and seen[0][0].__cause__ is boom
    assert seen[0][1] != aio.LOOP_THREAD  # a user callback, never on the loop thread
    m = batch.metrics()
    assert (m.calls, m.failed, m.cancelled) == (1, 1, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_key_or_an_answer_that_is_no_mapping_fails_seats_as_for_a_sync_function(
        kind: str, pool: ThreadPoolExecutor) -> None:
    partial_answer = Batch(f"abatch-key-{kind}",
                           Backend(kind, lambda keys: {"a": 1}).fn)
    result = TaskScheduling.start(fan_of(partial_answer, ["a", "b"]), executor=pool,
                                  timeout=LONG)
    assert result.outputs["n-a"] == 1
    assert isinstance(result["n-b"].work_result.exception, BatchKeyError)
    listed = Batch(f"abatch-list-{kind}", Backend(kind, lambda keys: [1 for _ in keys]).fn)
    result = TaskScheduling.start(fan_of(listed, ["a", "b"]), executor=pool, timeout=LONG)
    for name in ("n-a", "n-b"):
        error = result[name].work_result.exception
        assert isinstance(error, BatchResultError) and "returned list" in str(error)


def test_a_call_that_makes_no_coroutine_fails_its_seats(pool: ThreadPoolExecutor) -> None:
    class Odd:
        async def __call__(self, keys: Any) -> Any:  # pragma: no cover - replaced below
            return {}

    odd = Odd()
    batch = Batch("abatch-odd", odd)
    batch.fn = lambda keys: "not a coroutine"  # what create_task refuses
    result = TaskScheduling.start(fan_of(batch, ["a"]), executor=pool, timeout=LONG)
    error = result["n-a"].work_result.exception
    assert isinstance(error, BatchCallError) and isinstance(error.__cause__, TypeError)


# -- giving up: the task is cancelled ------------------------------------------------------------


class Hung:
    """An async batch function that never answers; ``cancelled`` is set when the
    ``CancelledError`` reaches it, ``entered`` when it started."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.cancelled = threading.Event()

    async def __call__(self, keys: Any) -> Any:
        self.entered.set()
        try:
            await asyncio.sleep(LONG * 10)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return {}


@pytest.mark.parametrize("seats", ["sync", "async"])
def test_a_call_whose_run_ran_out_of_budget_is_cancelled_inside(
        seats: str, pool: ThreadPoolExecutor) -> None:
    hung = Hung()
    batch = Batch(f"abatch-budget-{seats}", hung)
    t0 = time.monotonic()
    result = TaskScheduling.start(fan_of(batch, ["a", "b", "c"], seats), executor=pool,
                                  timeout=MEDIUM)
    assert time.monotonic() - t0 < LONG
    assert {result[f"n-{k}"].work_result.state for k in "abc"} == {ResultState.TIMEOUT}
    assert hung.cancelled.wait(LONG)  # CancelledError inside the call: cancelled for real
    wait_until(lambda: batch.metrics().cancelled == 1)
    m = batch.metrics()
    assert (m.calls, m.waiting, m.left, m.failed) == (1, 0, 3, 0)


def test_a_call_whose_nodes_all_timed_out_is_cancelled_while_the_run_goes_on(
        pool: ThreadPoolExecutor) -> None:
    hung = Hung()
    batch = Batch("abatch-node-timeouts", hung)
    root = fan_of(batch, ["a", "b"], timeout=SHORT)
    result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert {result[f"n-{k}"].work_result.state for k in "ab"} == {ResultState.TIMEOUT}
    assert result.outputs["page"] == "page"
    assert hung.cancelled.wait(LONG)
    wait_until(lambda: batch.metrics().cancelled == 1)


def test_a_seat_that_gives_up_leaves_the_call_running_for_the_others(
        pool: ThreadPoolExecutor) -> None:
    entered, cancelled = threading.Event(), threading.Event()
    holder: dict[str, Any] = {}

    async def get_many(keys: Any) -> dict[Any, Any]:
        go = asyncio.Event()
        holder["loop"], holder["go"] = asyncio.get_running_loop(), go
        entered.set()
        try:
            await go.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {k: f"v-{k}" for k in keys}

    batch = Batch("abatch-one-leaves", get_many)
    root = FunctionNode(lambda ctx, p: None, name="page")
    quick = FunctionNode(unused_async, param="quick", name="quick", batch=batch, timeout=SHORT)
    patient = FunctionNode(unused, param="patient", name="patient", batch=batch)
    root >> [quick, patient]
    with ThreadPoolExecutor(1, thread_name_prefix="abatch-caller") as caller:
        running = caller.submit(TaskScheduling.start, root, executor=pool, timeout=LONG)
        assert entered.wait(LONG)
        wait_until(lambda: batch.metrics().left == 1)  # quick timed out and left
        holder["loop"].call_soon_threadsafe(holder["go"].set)
        result = running.result(LONG)
    assert result["quick"].work_result.state is ResultState.TIMEOUT
    assert result.outputs["patient"] == "v-patient"
    assert not cancelled.is_set()
    m = batch.metrics()
    assert (m.calls, m.cancelled, m.failed) == (1, 0, 0)


# -- no worker held -------------------------------------------------------------------------------


@pytest.mark.parametrize("seats", ["sync", "async", "mixed"])
def test_no_worker_is_held_while_the_call_awaits(seats: str) -> None:
    entered = threading.Event()
    holder: dict[str, Any] = {}

    async def get_many(keys: Any) -> dict[Any, Any]:
        go = asyncio.Event()
        holder["loop"], holder["go"] = asyncio.get_running_loop(), go
        entered.set()
        await go.wait()
        return {k: f"v-{k}" for k in keys}

    batch = Batch(f"abatch-no-worker-{seats}", get_many)
    with ThreadPoolExecutor(1, thread_name_prefix="abatch-one") as one, \
            ThreadPoolExecutor(1, thread_name_prefix="abatch-caller") as caller:
        running = caller.submit(TaskScheduling.start, fan_of(batch, ["a", "b"], seats),
                                executor=one, timeout=LONG)
        assert entered.wait(LONG)
        # the only worker is free while the call awaits: it runs other work meanwhile
        assert one.submit(lambda: "other work").result(LONG) == "other work"
        other = TaskScheduling.start(FunctionNode(lambda ctx, p: "other run", name="other"),
                                     executor=one, timeout=LONG)
        assert other.outputs == {"other": "other run"}
        holder["loop"].call_soon_threadsafe(holder["go"].set)
        result = running.result(LONG)
    assert result.ok, result.summary
    assert result.outputs["n-a"] == "v-a" and result.outputs["n-b"] == "v-b"


# -- hooks ----------------------------------------------------------------------------------------


def test_the_hooks_of_seats_never_run_on_the_loop_thread(pool: ThreadPoolExecutor) -> None:
    threads: list[str] = []

    class Priced(SchedulingNode[str, str]):
        def task(self, ctx: TaskContext, param: str) -> str:
            raise AssertionError("never called")

        def on_success(self, support: Any) -> None:
            threads.append(threading.current_thread().name)

    batch = Batch("abatch-hooks", Backend("async").fn)
    root = FunctionNode(lambda ctx, p: None, name="page")
    root >> [Priced(k, name=f"n-{k}", batch=batch) for k in "abc"]
    result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert len(threads) == 3 and aio.LOOP_THREAD not in threads


# -- window and max_size, as for a plain function -----------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_more_ready_nodes_than_max_size_make_several_calls_as_for_a_sync_function(
        kind: str) -> None:
    backend = Backend(kind)
    batch = Batch(f"abatch-split-{kind}", backend.fn, max_size=10)
    keys = [f"k{n}" for n in range(25)]
    with ThreadPoolExecutor(1, thread_name_prefix="abatch-split") as one:
        result = TaskScheduling.start(fan_of(batch, keys), executor=one, timeout=LONG)
    assert result.ok, result.summary
    assert sorted(map(len, backend.calls)) == [5, 10, 10]
    assert sorted(k for call in backend.calls for k in call) == sorted(keys)
    assert len({result[f"n-{k}"].work_result.batch for k in keys}) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_runs_share_one_windowed_call_closed_by_max_size_as_for_a_sync_function(
        kind: str) -> None:
    backend = Backend(kind)
    runs = 6
    batch = Batch(f"abatch-across-{kind}", backend.fn, window=LONG, max_size=runs,
                  across_runs=True)
    node = FunctionNode(unused_async if kind == "async" else unused, param=None, name="price",
                        batch=batch)
    with ThreadPoolExecutor(2, thread_name_prefix="abatch-across") as p:
        futures = []
        for n in range(runs):
            node.param = f"sku-{n}"
            futures.append(TaskScheduling.submit(node, executor=p, timeout=LONG))
            wait_until(lambda n=n: batch.metrics().waiting == n + 1 or backend.calls != [])
        results = [f.result(LONG) for f in futures]
    assert backend.calls == [[f"sku-{n}" for n in range(runs)]]  # the last one filled it
    assert [r.outputs["price"] for r in results] == [f"v-sku-{n}" for n in range(runs)]
    assert len({r["price"].work_result.batch for r in results}) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_whose_window_passes_is_made_as_for_a_sync_function(kind: str) -> None:
    backend = Backend(kind)
    batch = Batch(f"abatch-window-{kind}", backend.fn, window=SHORT, across_runs=True)
    node = FunctionNode(unused, param="a", name="price", batch=batch)
    with ThreadPoolExecutor(1, thread_name_prefix="abatch-window") as one:
        first = TaskScheduling.submit(node, executor=one, timeout=LONG)
        wait_until(lambda: batch.metrics().waiting == 1 or backend.calls != [])
        assert first.result(LONG).outputs == {"price": "v-a"}
    assert backend.calls == [["a"]]
    assert backend.threads[0] == (aio.LOOP_THREAD if kind == "async" else "abatch-window_0")


# -- virtual time ---------------------------------------------------------------------------------


def test_under_a_fake_clock_the_window_and_the_calls_awaits_follow_virtual_time(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    stamps: list[tuple[float, float]] = []

    async def get_many(keys: Any) -> dict[Any, Any]:
        began = taskflow.clock.now()
        await asyncio.sleep(3.0)
        stamps.append((began, taskflow.clock.now()))
        assert keys.timeout is not None and keys.timeout == pytest.approx(30.0 - 5.0)
        return {k: f"v-{k}" for k in keys}

    batch = Batch("abatch-virtual", get_many, window=5.0)
    t0 = time.monotonic()
    result = TaskScheduling.start(fan_of(batch, ["a", "b"]), executor=pool, timeout=30.0)
    assert result.ok, result.summary
    assert result.outputs["n-a"] == "v-a"
    (began, ended), = stamps
    assert began - result.started_at == pytest.approx(5.0)  # the window, in virtual time
    assert ended - began == pytest.approx(3.0)  # the call's await, in virtual time
    assert result.elapsed == pytest.approx(8.0)
    assert time.monotonic() - t0 < 8.0  # 8 virtual seconds, not the test's


def test_under_a_fake_clock_a_call_nobody_waits_for_is_cancelled_at_the_virtual_budget(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    hung = Hung()
    batch = Batch("abatch-virtual-cancel", hung)
    result = TaskScheduling.start(fan_of(batch, ["a"]), executor=pool, timeout=7.0)
    assert result["n-a"].work_result.state is ResultState.TIMEOUT
    assert result.elapsed == pytest.approx(7.0)
    assert hung.cancelled.wait(LONG)
    wait_until(lambda: batch.metrics().cancelled == 1)
