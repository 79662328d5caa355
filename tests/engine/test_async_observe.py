"""Async nodes, observed: a step that blocks the event loop is reported once per node naming
the node, the flow and the lag; the loop's lag and attempts in flight show in ``PoolMonitor``
and Prometheus; running async attempts show in ``inflight()`` and ``/now.json``; a cancelled one
is not abandoned, one whose step still blocks the loop is until the step returns; sync tasks
never run on the loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, PROMPT
from loguru import logger

import taskflow
import taskflow.observe as observe
from taskflow import FlowStatus, FunctionNode, PoolMonitor, ResultState, TaskScheduling, run_async
from taskflow.engine import aio, looplag
from taskflow.errors import InvalidArgumentError, InvalidArgumentValueError
from taskflow.metrics import LoopMetrics
from taskflow.observe.now import loops

LOOP = aio.LOOP_THREAD


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="obspool") as p:
        yield p


class Warnings:
    """taskflow's WARNING lines about blocked loops, with an Event per line seen."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.seen = threading.Event()

    def __call__(self, message: Any) -> None:
        text = str(message)
        if "blocks its event loop" in text:
            self.lines.append(text)
            self.seen.set()


@pytest.fixture
def warnings() -> Iterator[Warnings]:
    sink = Warnings()
    logger.enable("taskflow")
    handler = logger.add(sink, level="WARNING", format="{message}")
    try:
        yield sink
    finally:
        logger.remove(handler)
        logger.disable("taskflow")


def unique(prefix: str) -> str:
    """A node name no other test used: blocking nodes are reported once per process."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def loop_figures() -> LoopMetrics:
    return loops.metrics()


# -- a step that blocks the loop -----------------------------------------------------------------


def test_a_step_that_blocks_the_loop_is_reported_once_per_node_with_its_lag(
        pool: ThreadPoolExecutor, warnings: Warnings) -> None:
    name, flow = unique("blocker"), unique("page")

    async def blocker(ctx: Any, _: Any) -> str:
        threading.Event().wait(0.15)  # a sync call inside async def: holds the loop
        await asyncio.sleep(0)
        return "done"

    node = FunctionNode(blocker, name=name)
    for _ in range(2):
        result = TaskScheduling.start(node, executor=pool, timeout=LONG, name=flow)
        assert result.status is FlowStatus.COMPLETED
    assert warnings.seen.wait(PROMPT)
    assert looplag.blocked_steps()[name] == 2  # every blocked step counts
    [line] = warnings.lines  # the second run's step is not logged again
    assert name in line and flow in line and "held the event loop" in line
    lag = float(line.split("held the event loop ")[1].split("s")[0])
    assert lag >= 0.15
    text = PoolMonitor(pool).to_prometheus()
    assert f'taskflow_loop_blocked_steps_total{{node="{name}"}} 2' in text


def test_a_step_still_blocking_is_reported_while_it_blocks(
        pool: ThreadPoolExecutor, warnings: Warnings) -> None:
    name = unique("stuck")
    started, release = threading.Event(), threading.Event()

    async def stuck(ctx: Any, _: Any) -> None:
        started.set()
        release.wait(LONG)  # blocks the loop until the test lets it go

    future = TaskScheduling.submit(FunctionNode(stuck, name=name), executor=pool, timeout=LONG)
    try:
        assert started.wait(PROMPT)
        assert warnings.seen.wait(PROMPT)  # seen by the watcher, the step still running
        [line] = warnings.lines
        assert name in line and "so far" in line
        assert not release.is_set()
    finally:
        release.set()
    assert future.result(LONG).status is FlowStatus.COMPLETED
    assert looplag.blocked_steps()[name] == 1
    assert len(warnings.lines) == 1  # its end is counted, not logged again


def test_awaiting_tasks_are_not_reported(pool: ThreadPoolExecutor, warnings: Warnings) -> None:
    name = unique("patient")

    async def patient(ctx: Any, _: Any) -> int:
        for _ in range(5):
            await asyncio.sleep(0.03)
        return 1

    result = TaskScheduling.start(FunctionNode(patient, name=name), executor=pool, timeout=LONG)
    assert result.status is FlowStatus.COMPLETED
    assert name not in looplag.blocked_steps()
    assert warnings.lines == []


@pytest.fixture
def threshold() -> Iterator[None]:
    """The default block threshold (0.1 s) is set back after the test."""
    try:
        yield
    finally:
        taskflow.set_loop_block_threshold(0.1)


@pytest.mark.parametrize("bad", ["0.1", None, True, [0.1]])
def test_the_block_threshold_refuses_what_is_not_a_number(bad: Any, threshold: None) -> None:
    with pytest.raises(InvalidArgumentError, match="set_loop_block_threshold: seconds") as e:
        taskflow.set_loop_block_threshold(bad)
    assert e.value.argument == "seconds"
    assert looplag.threshold() == 0.1


@pytest.mark.parametrize("bad", [0, -0.5, float("nan"), -float("inf")])
def test_the_block_threshold_refuses_what_is_not_above_zero(bad: float, threshold: None
                                                            ) -> None:
    with pytest.raises(InvalidArgumentValueError, match="seconds must be > 0") as e:
        taskflow.set_loop_block_threshold(bad)
    assert e.value.argument == "seconds"
    assert looplag.threshold() == 0.1


def _blocking_steps(pool: ThreadPoolExecutor, name: str, seconds: float) -> int:
    """The blocked steps counted for a run of node ``name`` whose one step holds its loop
    ``seconds``."""
    async def blocker(ctx: Any, _: Any) -> None:
        threading.Event().wait(seconds)  # a sync call inside async def: holds the loop
        await asyncio.sleep(0)

    result = TaskScheduling.start(FunctionNode(blocker, name=name), executor=pool, timeout=LONG)
    assert result.status is FlowStatus.COMPLETED
    return looplag.blocked_steps().get(name, 0)


def test_the_block_threshold_set_from_the_public_api_decides_what_counts(
        pool: ThreadPoolExecutor, warnings: Warnings, threshold: None) -> None:
    taskflow.set_loop_block_threshold(LONG)  # a 0.15 s step no longer counts
    assert looplag.threshold() == LONG
    assert _blocking_steps(pool, unique("tolerated"), 0.15) == 0
    taskflow.set_loop_block_threshold(0.02)  # a 0.05 s step does, and is reported
    name = unique("lowered")
    assert _blocking_steps(pool, name, 0.05) == 1
    assert warnings.seen.wait(PROMPT)
    [line] = warnings.lines
    assert name in line
    taskflow.set_loop_block_threshold(float("inf"))  # counts no step
    assert _blocking_steps(pool, unique("never"), 0.15) == 0


# -- sync tasks stay off the loop ----------------------------------------------------------------


def test_sync_tasks_never_run_on_the_loop_thread(pool: ThreadPoolExecutor) -> None:
    seen: list[str] = []
    lock = threading.Lock()
    tries = {"n": 0}

    def sync(ctx: Any, _: Any) -> str:
        with lock:
            seen.append(threading.current_thread().name)
            tries["n"] += 1
            if tries["n"] == 1:
                raise RuntimeError("retried once")
        return "s"

    async def fetch(ctx: Any, _: Any) -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    def graph() -> list[Any]:
        top, a, son, b = (FunctionNode(sync, name="top", retries=1), FunctionNode(fetch, name="a"),
                          FunctionNode(sync, name="son"), FunctionNode(fetch, name="b"))
        top >> a
        a >> son
        son >> b
        return [top]

    result = TaskScheduling.start(graph(), executor=pool, timeout=LONG)
    assert result.status is FlowStatus.COMPLETED
    assert result.result_of("a").result == LOOP
    assert seen and LOOP not in seen

    async def awaiting() -> tuple[Any, str]:
        return await run_async(graph(), executor=pool, timeout=LONG), threading.current_thread().name

    seen.clear()
    tries["n"] = 0
    result, loop_thread = asyncio.run(awaiting())
    assert result.status is FlowStatus.COMPLETED
    assert result.result_of("a").result == loop_thread
    assert seen and loop_thread not in seen and LOOP not in seen


# -- the monitor ---------------------------------------------------------------------------------


def test_the_monitor_shows_async_attempts_in_flight_on_the_loop(
        pool: ThreadPoolExecutor) -> None:
    gate: Future[None] = Future()
    waiting = threading.Semaphore(0)

    async def waits(ctx: Any, _: Any) -> None:
        waiting.release()
        await asyncio.wrap_future(gate)

    nodes = [FunctionNode(waits, name=f"w{k}") for k in range(3)]
    monitor = PoolMonitor(pool)
    before = loop_figures().attempts.get(LOOP, 0)
    future = TaskScheduling.submit(nodes, executor=pool, timeout=LONG)
    try:
        for _ in nodes:
            assert waiting.acquire(timeout=PROMPT)
        [figures] = [m for m in monitor.sample().resilience if isinstance(m, LoopMetrics)]
        assert figures.attempts[LOOP] == before + 3
        assert LOOP in figures.lag_s
        text = monitor.to_prometheus()
        assert f'taskflow_loop_async_attempts{{loop="{LOOP}"}} {before + 3}' in text
        assert f'taskflow_loop_lag_seconds{{loop="{LOOP}"}} ' in text
    finally:
        gate.set_result(None)
    assert future.result(LONG).status is FlowStatus.COMPLETED


def test_the_loops_lag_grows_while_a_step_blocks_it(pool: ThreadPoolExecutor) -> None:
    name = unique("hog")
    started, release = threading.Event(), threading.Event()

    async def hog(ctx: Any, _: Any) -> None:
        started.set()
        release.wait(LONG)

    future = TaskScheduling.submit(FunctionNode(hog, name=name), executor=pool, timeout=LONG)
    try:
        assert started.wait(PROMPT)
        loop_figures()  # posts a probe, which cannot run while the step blocks
        after_probe = time.monotonic()
        assert release.wait(0.05) is False  # some real time passes, the loop still held
        before_reading = time.monotonic()
        lag = loop_figures().lag_s[LOOP]
        assert lag >= before_reading - after_probe
    finally:
        release.set()
    assert future.result(LONG).status is FlowStatus.COMPLETED


# -- what is running now -------------------------------------------------------------------------


def test_a_running_async_attempt_is_listed_in_inflight_and_now_json(
        pool: ThreadPoolExecutor) -> None:
    gate: Future[None] = Future()
    started = threading.Event()
    flow = unique("asyncpage")

    async def fetch(ctx: Any, _: Any) -> None:
        started.set()
        await asyncio.wrap_future(gate)

    future = TaskScheduling.submit(FunctionNode(fetch, name="fetch"), executor=pool,
                                   timeout=LONG, name=flow)
    try:
        assert started.wait(PROMPT)
        [run] = [r for r in observe.inflight() if r.flow == flow]
        [node] = run.running()
        assert node.name == "fetch" and node.thread == LOOP and node.for_s is not None
        werkzeug_test = pytest.importorskip("werkzeug.test")
        from taskflow.observe.stats import FlowStats
        from taskflow.observe.web import make_app

        resp = werkzeug_test.Client(make_app(FlowStats())).get("/now.json")
        data = json.loads(resp.get_data(as_text=True))
        [row] = [r for r in data["runs"] if r["flow"] == flow]
        assert row["run_id"] == run.run_id
        [listed] = [n for n in row["nodes"] if n["name"] == "fetch"]
        assert listed["state"] == "RUNNING" and listed["thread"] == LOOP
    finally:
        gate.set_result(None)
    assert future.result(LONG).status is FlowStatus.COMPLETED


def test_an_async_attempt_on_the_applications_loop_shows_that_loops_thread(
        pool: ThreadPoolExecutor) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="app-loop-observed")
    thread.start()
    gate: Future[None] = Future()
    started = threading.Event()
    flow = unique("apploop")

    async def fetch(ctx: Any, _: Any) -> None:
        started.set()
        await asyncio.wrap_future(gate)

    try:
        taskflow.set_event_loop(loop)
        future = TaskScheduling.submit(FunctionNode(fetch, name="fetch"), executor=pool,
                                       timeout=LONG, name=flow)
        try:
            assert started.wait(PROMPT)
            [run] = [r for r in observe.inflight() if r.flow == flow]
            [node] = run.running()
            assert node.name == "fetch" and node.thread == "app-loop-observed"
        finally:
            gate.set_result(None)
        result = future.result(LONG)
        assert result.result_of("fetch").thread == "app-loop-observed"
    finally:
        taskflow.set_event_loop(None)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(PROMPT)
        loop.close()


def test_an_async_attempt_under_run_async_shows_the_awaiting_thread(
        pool: ThreadPoolExecutor) -> None:
    async def fetch(ctx: Any, _: Any) -> int:
        await asyncio.sleep(0)
        return 1

    seen: list[Any] = []

    def awaiting() -> None:
        seen.append(asyncio.run(run_async(FunctionNode(fetch, name="fetch"), executor=pool,
                                          timeout=LONG)))

    thread = threading.Thread(target=awaiting, name="awaiting-caller")
    thread.start()
    thread.join(LONG)
    [result] = seen
    assert result.result_of("fetch").thread == "awaiting-caller"


def test_a_cancelled_async_attempt_is_not_listed_as_abandoned(pool: ThreadPoolExecutor) -> None:
    cancelled = threading.Event()
    name = unique("hung")

    async def hung(ctx: Any, _: Any) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    result = TaskScheduling.start(FunctionNode(hung, name=name), executor=pool, timeout=0.05)
    assert result.result_of(name).state is ResultState.TIMEOUT
    assert cancelled.wait(PROMPT)
    assert [g for g in observe.abandoned() if g.node == name] == []


def test_an_async_attempt_given_up_while_its_step_blocks_is_abandoned_until_it_returns(
        pool: ThreadPoolExecutor) -> None:
    name = unique("blocking")
    started, release = threading.Event(), threading.Event()

    async def blocking(ctx: Any, _: Any) -> None:
        started.set()
        release.wait(LONG)  # cannot be cancelled: no await to raise CancelledError at

    future = TaskScheduling.submit(FunctionNode(blocking, name=name), executor=pool,
                                   timeout=0.05)
    try:
        assert started.wait(PROMPT)
        assert future.result(LONG).result_of(name).state is ResultState.TIMEOUT
        [gone] = [g for g in observe.abandoned(with_stacks=True) if g.node == name]
        assert gone.thread == LOOP and gone.stack is not None
        assert any("release.wait" in entry for entry in gone.stack)
    finally:
        release.set()
    deadline = time.monotonic() + PROMPT
    while [g for g in observe.abandoned() if g.node == name]:
        assert time.monotonic() < deadline, "still listed after its step returned"
        threading.Event().wait(0.005)
