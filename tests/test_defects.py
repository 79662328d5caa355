"""Regression tests for the twelve engine defects of issue 9 ("Why", items 1-12).

Each test reproduces one defect through the public API only (the engine's internals are being
moved into a package) and states the behaviour that API.md and issue 9 require. Every test is
``xfail(strict=True)`` while the defect is in the engine: it must fail on today's main for the
reason its ``reason`` names, and the engine rewrite removes the marker when it fixes the defect.

No test may hang on the buggy engine: a call that deadlocks there runs in a helper thread
(:class:`Call`) joined with a timeout, so the deadlock becomes an assertion; gates are released
and pools torn down in ``finally`` blocks.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import (
    Executor,
    ThreadPoolExecutor,
)
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

import pytest
from conftest import LONG, MEDIUM, SCALE, HookLog

from taskflow import (
    FanOutNode,
    FunctionNode,
    ItemTimeoutError,
    MonitoredExecutor,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    TaskSupport,
)

TERMINAL = {
    ResultState.SUCCESS,
    ResultState.EXCEPTION,
    ResultState.TIMEOUT,
    ResultState.CANCELLED,
    ResultState.SKIPPED,
} | {s for s in ResultState if s.name == "DEGRADED"}
# how long a call that must return promptly may take before the test calls it a deadlock
PROMPT = 3.0 * SCALE


def defect(n: int | str, why: str) -> pytest.MarkDecorator:
    """The xfail marker of a test pinning defect ``n`` of issue 9 (strict: it must fail today)."""
    return pytest.mark.xfail(strict=True, reason=f"defect {n}: {why}")


class Call:
    """Run ``fn(*args, **kwargs)`` in a named daemon thread, so a deadlock is an assertion."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "defect-call",
                 **kwargs: Any) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, args, kwargs), name=name,
                                       daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def finished(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def states(result: Any) -> dict[str, ResultState]:
    return {name: result[name].work_result.state for name in result}


def fn_node(fn: Callable[[TaskContext, Any], Any], name: str, **options: Any) -> FunctionNode:
    return FunctionNode(fn, name=name, **options)


class Recorder(SchedulingNode[Any, Any]):
    """A node whose task is ``fn(ctx, param)`` and whose hooks are recorded in ``log``."""

    def __init__(self, name: str, fn: Callable[[TaskContext, Any], Any], log: HookLog,
                 on_fail: Callable[[TaskSupport], None] | None = None, **options: Any) -> None:
        super().__init__(None, name=name, **options)
        self.__dict__["_fn"] = fn
        self.__dict__["_log"] = log
        self.__dict__["_fail_extra"] = on_fail

    def task(self, ctx: TaskContext, param: Any) -> Any:
        return self.__dict__["_fn"](ctx, param)

    def on_success(self, support: TaskSupport) -> None:
        self.__dict__["_log"].record(self.name, "on_success")

    def on_fail(self, support: TaskSupport) -> None:
        self.__dict__["_log"].record(self.name, "on_fail")
        extra = self.__dict__["_fail_extra"]
        if extra is not None:
            extra(support)


# --- 1: deadlock in executor.shutdown(cancel_futures=True) ---------------------------------------


def _undeadlock(pool: ThreadPoolExecutor, shutdown: Call) -> None:
    """Free a ``shutdown`` stuck in taskflow's done-callback (buggy engine only).

    The stdlib cancels queued futures while holding the pool's shutdown lock; the callback's
    ``submit`` then waits for that same lock in the same thread. A ``threading.Lock`` may be
    released by another thread: doing so lets the stuck ``submit`` fail ("cannot schedule new
    futures after shutdown") and ``shutdown`` finish, so the pool's threads can exit.
    """
    if shutdown.finished(0.0):
        return
    with contextlib.suppress(RuntimeError):
        pool._shutdown_lock.release()  # stdlib internals, only to tear a deadlock down
    shutdown.finished(LONG)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("monitored", [False, True], ids=["thread-pool", "monitored"])
@defect(1, "shutdown(cancel_futures=True) runs the engine's done-callback, which submits")
def test_1_shutdown_cancelling_queued_flow_work_neither_deadlocks_nor_blocks_later_runs(
    monitored: bool,
) -> None:
    pool = ThreadPoolExecutor(1, thread_name_prefix="d1-pool")
    executor: Executor = MonitoredExecutor(pool) if monitored else pool
    hold, holding = threading.Event(), threading.Event()

    def blocker() -> None:
        holding.set()
        hold.wait(LONG)

    pool.submit(blocker)
    assert holding.wait(LONG)
    ran: list[str] = []
    a = fn_node(lambda ctx, p: ran.append("a"), "a")
    b = fn_node(lambda ctx, p: ran.append("b"), "b").depends_on(a, optional=True)
    future = TaskScheduling.submit([a, b], executor=executor, timeout=LONG)  # work queued
    shutdown = Call(executor.shutdown, wait=False, cancel_futures=True, name="d1-shutdown")
    later: Call | None = None
    try:
        assert shutdown.finished(PROMPT), "shutdown(cancel_futures=True) deadlocked"
        assert shutdown.error is None, shutdown.error
        result = future.result(timeout=PROMPT)
        assert ran == []
        assert result["a"].work_result.state is ResultState.EXCEPTION
        assert result["b"].work_result.state in TERMINAL
        # a later run on the shut-down executor fails its nodes at once instead of blocking
        later = Call(TaskScheduling.start, fn_node(lambda ctx, p: 1, "c"), executor=executor,
                     timeout=LONG, name="d1-later")
        assert later.finished(PROMPT), "a later start() blocked in submit"
        assert later.value["c"].work_result.state is ResultState.EXCEPTION
    finally:
        hold.set()
        _undeadlock(pool, shutdown)
        if later is not None:
            later.finished(LONG)
        pool.shutdown(wait=True)


class OneItemFanOut(FanOutNode[Any]):
    def items(self, ctx: TaskContext, param: Any) -> Iterator[tuple[Hashable, Any]]:
        yield "only", 1

    def work(self, ctx: TaskContext, item: Any) -> Any:
        return item


@pytest.mark.timeout(60)
@defect(1, "the fan-out's done-callback completes the node and submits its son under the "
           "pool's shutdown lock")
def test_1_shutdown_cancelling_a_queued_fan_out_item_loop_does_not_deadlock() -> None:
    pool = ThreadPoolExecutor(2, thread_name_prefix="d1-fan")
    hold, holding, b_running = threading.Event(), threading.Event(), threading.Event()

    def blocker() -> None:
        holding.set()
        hold.wait(LONG)

    def b_task(ctx: TaskContext, p: Any) -> str:
        b_running.set()
        hold.wait(LONG)
        return "b"

    pool.submit(blocker)  # one worker busy: the flow gets the other one
    assert holding.wait(LONG)
    fan = OneItemFanOut(name="fan")
    b = fn_node(b_task, "b")
    son = fn_node(lambda ctx, p: "son", "son").depends_on(fan, optional=True)
    # the flow's only worker starts the fan-out (its item loop is queued), then runs b
    future = TaskScheduling.submit([fan, b, son], executor=pool, timeout=LONG)
    assert b_running.wait(LONG)
    shutdown = Call(pool.shutdown, wait=False, cancel_futures=True, name="d1-fan-shutdown")
    try:
        assert shutdown.finished(PROMPT), "shutdown(cancel_futures=True) deadlocked"
        hold.set()
        result = future.result(timeout=PROMPT)
        assert result["fan"].work_result.state is ResultState.EXCEPTION
        assert result["son"].work_result.state in TERMINAL
    finally:
        hold.set()
        _undeadlock(pool, shutdown)
        pool.shutdown(wait=True)


# --- 2: retries above 1024 kill the worker loop ---------------------------------------------------


@pytest.mark.timeout(30)
@defect(2, "2.0 ** 1024 overflows in the retry delay; the loop dies, the node stays RUNNING")
def test_2_more_than_1024_retries_without_backoff_end_the_node_with_its_error(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    attempts = []

    def flaky(ctx: TaskContext, p: Any) -> None:
        attempts.append(1)
        raise ValueError(f"attempt {len(attempts)} failed")

    node = fn_node(flaky, "flaky", retries=1100, retry_backoff=0.0)
    future = TaskScheduling.submit(node, executor=pool, timeout=None)
    try:
        result = future.result(timeout=PROMPT)
    except FutureTimeoutError:
        pytest.fail(f"the run never ended: the node is stuck after {len(attempts)} attempts")
    wr = result["flaky"].work_result
    assert wr.state is ResultState.EXCEPTION
    assert isinstance(wr.exception, ValueError)
    assert wr.attempts == 1101 == len(attempts)


@pytest.mark.timeout(30)
@defect(2, "the overflow is lost; the node ends TIMEOUT at the budget instead of EXCEPTION")
def test_2_with_a_budget_the_node_ends_exception_not_timeout(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)

    def always(ctx: TaskContext, p: Any) -> None:
        raise ValueError("backend down")

    node = fn_node(always, "always", retries=1100, retry_backoff=0.0)
    result = TaskScheduling.start(node, executor=pool, timeout=2 * MEDIUM)
    wr = result["always"].work_result
    assert wr.state is ResultState.EXCEPTION, (wr.state, wr.exception)
    assert isinstance(wr.exception, ValueError)


# --- 3: user hooks on the process-wide timer thread -----------------------------------------------


@pytest.mark.timeout(60)
@defect(3, "a node timeout runs on_fail on the taskflow-timer thread; a slow hook stalls every "
           "run's deadline")
def test_3_a_slow_on_fail_after_a_node_timeout_does_not_stall_other_runs_deadlines(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(4)
    release_task, release_hook = threading.Event(), threading.Event()
    in_hook = threading.Event()
    hook_threads: list[str] = []
    log = HookLog()

    def slow_hook(support: TaskSupport) -> None:
        hook_threads.append(threading.current_thread().name)
        in_hook.set()
        release_hook.wait(LONG)

    def stuck(ctx: TaskContext, p: Any) -> None:
        release_task.wait(LONG)

    first = Recorder("first", stuck, log, on_fail=slow_hook, timeout=0.02)
    run1 = TaskScheduling.submit(first, executor=pool, timeout=None)
    try:
        assert in_hook.wait(LONG)
        # another run, with a short budget, while that hook is still running
        other = fn_node(lambda ctx, p: release_task.wait(LONG), "other")
        run2 = TaskScheduling.submit(other, executor=pool, timeout=0.2)
        try:
            result2 = run2.result(timeout=PROMPT)
        except FutureTimeoutError:
            pytest.fail(f"a 0.2 s budget did not end its run: the deadline waits for a hook "
                        f"running on thread {hook_threads}")
        assert result2["other"].work_result.state is ResultState.TIMEOUT
        assert not hook_threads[0].startswith("taskflow-timer")
    finally:
        release_hook.set()
        release_task.set()
        result1 = run1.result(timeout=LONG)
    assert result1["first"].work_result.state is ResultState.TIMEOUT
    assert log.count("first", "on_fail") == 1


# --- 4: deadlines not checked when a node completes -----------------------------------------------


@contextlib.contextmanager
def lagging_timers() -> Iterator[None]:
    """Make every waiting thread (the timer, ``start``'s caller) wake late, as under load.

    With a long switch interval a thread that runs pure Python keeps the GIL for up to that
    long, so a thread whose wait timed out cannot run until the busy one blocks: the thread
    that finishes a node is the first to see that the node's deadline has passed.
    """
    saved = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        yield
    finally:
        sys.setswitchinterval(saved)


def busy(seconds: float) -> None:
    """Spin in pure Python (holds the GIL) for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.timeout(30)
@defect(4, "a node that overran its own timeout ends SUCCESS when the timer thread is late")
def test_4_a_node_finishing_after_its_own_timeout_is_timeout(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    node = fn_node(lambda ctx, p: busy(0.4) or "late", "slow", timeout=0.02)
    with lagging_timers():
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    wr = result["slow"].work_result
    assert wr.state is ResultState.TIMEOUT, f"ran {wr.duration}s against a 0.02 s timeout"
    assert "slow" not in result.outputs


@pytest.mark.timeout(30)
@defect(4, "a run that finished after its budget is reported as completed")
def test_4_a_node_finishing_after_the_run_deadline_is_timeout(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    node = fn_node(lambda ctx, p: busy(0.4) or "late", "slow")
    with lagging_timers():
        result = TaskScheduling.start(node, executor=pool, timeout=0.05)
    assert result.elapsed > 0.05
    assert result["slow"].work_result.state is ResultState.TIMEOUT
    assert result.outputs == {}
    assert not result.ok


class BusyItems(FanOutNode[Any]):
    def items(self, ctx: TaskContext, param: Any) -> Iterator[tuple[Hashable, Any]]:
        yield "slow", 0.4

    def work(self, ctx: TaskContext, item: Any) -> Any:
        busy(item)
        return "late"


@pytest.mark.timeout(30)
@defect(4, "an item that overran item_timeout is counted as succeeded when the timer is late")
def test_4_an_item_finishing_after_its_item_timeout_failed(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    fan = BusyItems(name="fan", item_timeout=0.02, policy="best_effort")
    with lagging_timers():
        result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    fanin = result["fan"].work_result.result
    assert fanin.succeeded == {}
    assert isinstance(fanin.failed.get("slow"), ItemTimeoutError)
