"""``FakeClock`` and async nodes: virtual time drives the timers of the event loop they run on.

Each test checks what the virtual clock says happened (the sleep that was awaited, the timeout
that fired, the order of timers) and, where the subject is "it did not wait in real time", a
wall-time bound far looser than the virtual times involved, which no busy machine misses.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import taskflow
from taskflow import FlowStatus, FunctionNode, ResultState, TaskScheduling, clock
from taskflow.engine import aio
from taskflow.testing import FakeClock

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as ex:
        yield ex


def _loop_now() -> float:
    return asyncio.get_running_loop().time()


def test_an_async_node_sleeping_10_s_in_a_30_s_budget_ends_in_milliseconds(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    async def backend(ctx: Any, sku: str) -> str:
        await asyncio.sleep(10.0)
        return sku

    t0 = time.monotonic()
    result = TaskScheduling.start(FunctionNode(backend, "sku-1", name="backend"),
                                  executor=pool, timeout=30.0)
    assert result.status is FlowStatus.COMPLETED
    assert result.result_of("backend").result == "sku-1"
    assert fake_clock.now() == pytest.approx(10.0)
    assert result.elapsed == pytest.approx(10.0)
    assert time.monotonic() - t0 < 5  # 10 s of sleep, not 10 s of the test's time


def test_an_async_node_timeout_cancels_its_sleep_at_exactly_the_virtual_second(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    seen: list[str] = []

    async def hung(ctx: Any, p: Any) -> str:
        try:
            await asyncio.sleep(5.0)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "late"

    result = TaskScheduling.start(FunctionNode(hung, name="hung", timeout=1.0),
                                  executor=pool, timeout=30.0)
    assert result.result_of("hung").state is ResultState.TIMEOUT
    assert fake_clock.now() == pytest.approx(1.0)
    assert result.elapsed == pytest.approx(1.0)
    assert fake_clock.wait_until_blocked()
    assert seen == ["cancelled"]  # cancelled for real, at 1 s: its 5 s never came


def test_wait_for_and_timeout_inside_an_async_node_fire_in_virtual_time(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    async def guarded(ctx: Any, p: Any) -> list[float]:
        times = []
        try:
            await asyncio.wait_for(asyncio.sleep(100.0), 2.0)
        except asyncio.TimeoutError:
            times.append(fake_clock.now())
        try:
            async with asyncio.timeout(3.0):  # type: ignore[attr-defined,unused-ignore]
                await asyncio.sleep(100.0)
        except TimeoutError:
            times.append(fake_clock.now())
        return times

    result = TaskScheduling.start(FunctionNode(guarded, name="guarded"), executor=pool,
                                  timeout=60.0)
    assert result.result_of("guarded").result == pytest.approx([2.0, 5.0])


def test_a_task_waiting_on_a_silent_socket_lets_virtual_time_reach_its_timeout(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    left, right = socket.socketpair()

    left.setblocking(False)

    async def reader(ctx: Any, p: Any) -> float:
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_recv(left, 1), 5.0)
        except asyncio.TimeoutError:  # nobody wrote
            return fake_clock.now()
        return -1.0

    t0 = time.monotonic()
    try:
        result = TaskScheduling.start(FunctionNode(reader, name="reader"), executor=pool,
                                      timeout=30.0)
    finally:
        left.close()
        right.close()
    assert result.result_of("reader").result == pytest.approx(5.0)
    assert time.monotonic() - t0 < 10


def test_sync_and_async_nodes_sleeping_in_virtual_time_end_in_the_order_of_their_times(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    ended: list[tuple[str, float]] = []
    lock = threading.Lock()

    def note(name: str) -> None:
        with lock:
            ended.append((name, fake_clock.now()))

    def sync_sleep(seconds: float) -> Any:
        def task(ctx: Any, p: Any) -> None:
            fake_clock.sleep(seconds)
            note(f"sync {seconds:g}")
        return task

    def async_sleep(seconds: float) -> Any:
        async def task(ctx: Any, p: Any) -> None:
            await asyncio.sleep(seconds)
            note(f"async {seconds:g}")
        return task

    nodes = [FunctionNode(sync_sleep(3.0), name="s3"), FunctionNode(async_sleep(1.0), name="a1"),
             FunctionNode(sync_sleep(2.0), name="s2"), FunctionNode(async_sleep(4.0), name="a4")]
    father = FunctionNode(async_sleep(0.5), name="father")  # async >> sync >> async
    son = FunctionNode(sync_sleep(1.0), name="son")
    grandson = FunctionNode(async_sleep(1.0), name="grandson")
    father >> son >> grandson
    result = TaskScheduling.start([*nodes, father], executor=pool, timeout=30.0)
    assert result.status is FlowStatus.COMPLETED
    assert ended == [("async 0.5", pytest.approx(0.5)), ("async 1", pytest.approx(1.0)),
                     ("sync 1", pytest.approx(1.5)), ("sync 2", pytest.approx(2.0)),
                     ("async 1", pytest.approx(2.5)), ("sync 3", pytest.approx(3.0)),
                     ("async 4", pytest.approx(4.0))]
    assert fake_clock.now() == pytest.approx(4.0)


def test_a_back_off_between_async_attempts_is_waited_in_virtual_time(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    calls: list[float] = []

    async def flaky(ctx: Any, p: Any) -> str:
        calls.append(fake_clock.now())
        await asyncio.sleep(1.0)
        if len(calls) < 2:
            raise ConnectionError("backend down")
        return "ok"

    t0 = time.monotonic()
    node = FunctionNode(flaky, name="flaky", retries=1, retry_backoff=10.0)
    result = TaskScheduling.start(node, executor=pool, timeout=60.0)
    assert result.result_of("flaky").result == "ok"
    assert calls[0] == 0.0 and calls[1] >= 11.0  # a 1 s attempt, then the 10 s back-off
    assert time.monotonic() - t0 < 10


@pytest.mark.fake_clock(autojump=False)
def test_advance_by_hand_fires_the_loops_timers_in_order_each_at_its_time(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    fired: list[tuple[float, float]] = []

    def sleeper(seconds: float) -> Any:
        async def task(ctx: Any, p: Any) -> float:
            t0 = _loop_now()
            await asyncio.sleep(seconds)
            fired.append((seconds, _loop_now() - t0))
            return seconds
        return task

    nodes = [FunctionNode(sleeper(s), name=f"n{s:g}") for s in (3.0, 1.0, 2.0)]
    handle = TaskScheduling.submit(nodes, executor=pool, timeout=60.0)
    assert fake_clock.wait_until_blocked()
    fake_clock.advance(0.5)
    assert fake_clock.wait_until_blocked()
    assert fired == []  # nothing due yet
    assert fake_clock.next_due() == pytest.approx(clock.now() + 0.5)  # the loop's earliest timer
    fake_clock.advance(5.0)
    result = handle.result()
    assert result.status is FlowStatus.COMPLETED
    assert fired == [(1.0, pytest.approx(1.0)), (2.0, pytest.approx(2.0)),
                     (3.0, pytest.approx(3.0))]


@pytest.mark.fake_clock(autojump=False)
def test_advance_by_hand_fires_a_node_timeout_before_a_later_loop_timer(
        fake_clock: FakeClock, pool: ThreadPoolExecutor) -> None:
    async def slow(ctx: Any, p: Any) -> str:
        await asyncio.sleep(5.0)
        return "late"

    handle = TaskScheduling.submit(FunctionNode(slow, name="slow", timeout=1.0), executor=pool,
                                   timeout=60.0)
    assert fake_clock.wait_until_blocked()
    fake_clock.advance(10.0)  # the timeout (1 s) comes before the sleep's end (5 s)
    result = handle.result()
    assert result.result_of("slow").state is ResultState.TIMEOUT


def test_run_async_drives_the_awaiting_loops_timers_in_virtual_time(
        pool: ThreadPoolExecutor) -> None:
    async def backend(ctx: Any, p: Any) -> float:
        await asyncio.sleep(20.0)
        return _loop_now()

    async def main() -> tuple[Any, float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await taskflow.run_async(FunctionNode(backend, name="backend"),
                                          executor=pool, timeout=30.0)
        await asyncio.sleep(1.0)  # the test's own coroutine on the same loop: virtual too
        return result, t0, loop.time()

    t0 = time.monotonic()
    with FakeClock(autojump=True) as fake:
        result, start, end = asyncio.run(main())
        assert result.status is FlowStatus.COMPLETED
        assert result.result_of("backend").result - start == pytest.approx(20.0, abs=0.05)
        assert end - start == pytest.approx(21.0, abs=0.05)
        assert fake.now() == pytest.approx(21.0, abs=0.05)
    assert time.monotonic() - t0 < 10


def test_the_loops_own_time_and_select_are_back_after_the_fake_clock(
        pool: ThreadPoolExecutor) -> None:
    async def nap(ctx: Any, p: Any) -> float:
        t0 = _loop_now()
        await asyncio.sleep(10.0)
        return _loop_now() - t0

    with FakeClock(autojump=True) as fake:
        result = TaskScheduling.start(FunctionNode(nap, name="nap"), executor=pool,
                                      timeout=30.0)
        assert result.result_of("nap").result == pytest.approx(10.0)  # the loop's own clock
        assert fake.now() == pytest.approx(10.0)
        loop = aio.loop_thread.get()
        virtual = loop.time()
    assert "select" not in vars(loop._selector)  # type: ignore[attr-defined]
    assert loop.time() >= virtual  # time never goes back for the loop

    async def real_pause() -> float:
        t = time.monotonic()
        await asyncio.sleep(0.05)
        return time.monotonic() - t

    assert asyncio.run_coroutine_threadsafe(real_pause(), loop).result(10) >= 0.04  # real time


def test_a_loop_virtual_time_did_not_pass_gets_its_own_time_method_back() -> None:
    loop = asyncio.new_event_loop()
    try:
        with FakeClock() as fake:
            assert aio.on_loop is not None
            aio.on_loop(loop)
            t0 = loop.time()
            assert loop.time() == t0  # still: virtual time did not move
            fake.advance(0.0)
            assert loop.time() == t0  # and real time went on: the loop's own time is ahead
        assert aio.on_loop is None
        assert "time" not in vars(loop)
        assert "select" not in vars(loop._selector)  # type: ignore[attr-defined]
    finally:
        loop.close()
