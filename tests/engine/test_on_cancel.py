"""``ctx.on_cancel``: a callback runs exactly once when the run gives up on its attempt — by
each way a run abandons attempts — on a coordinator thread holding no lock, never on the timer
thread, and never for an attempt that ended by itself.

The tests where a timer abandons the attempt (the run's budget, a node's timeout, a hedge's
delay, an item timeout, a back-off) run on virtual time (the ``fake_clock`` fixture): a blocked
task waits with ``clock.wait``, the timer fires at its exact virtual time, and "no other
callback runs" is checked once every thread of taskflow's is quiet
(``FakeClock.wait_until_blocked``) rather than after a real pause. The deadline-boundary race
stays on the real clock: its subject is a real thread finishing around a real deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, PROMPT, SHORT
from loguru import logger

from taskflow import (
    FanOutNode,
    FlowStatus,
    FunctionNode,
    Hedge,
    Join,
    ResultState,
    TaskContext,
    TaskScheduling,
    clock,
)
from taskflow.errors import InvalidArgumentError
from taskflow.testing import FakeClock


class Calls:
    """Callback calls: which callback, on which thread, and whether it could take the run's
    locks (nobody holds them while it runs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str]] = []
        self.locks_free: list[bool] = []
        self.event = threading.Event()

    def callback(self, ctx: TaskContext, tag: str) -> Callable[[], None]:
        def fn() -> None:
            run = ctx._run() if ctx._run is not None else None
            free = True
            for lock in (getattr(run, "lock", None),
                         getattr(getattr(run, "watch", None), "lock", None)):
                if lock is not None:
                    got = lock.acquire(timeout=PROMPT)
                    free = free and got
                    if got:
                        lock.release()
            # the callback may use the context freely: no engine lock is held
            ctx["closed_" + tag] = ctx.remaining() >= 0.0 and ctx.cancelled in (True, False)
            with self.lock:
                self.seen.append((tag, threading.current_thread().name))
                self.locks_free.append(free)
            self.event.set()

        return fn

    def tags(self) -> list[str]:
        with self.lock:
            return [t for t, _ in self.seen]

    def wait_for(self, n: int) -> None:
        for _ in range(int(PROMPT / 0.01) + 1):
            with self.lock:
                if len(self.seen) >= n:
                    return
            pause(0.01)
        raise AssertionError(f"expected {n} callbacks, saw {self.seen}")

    def check_threads(self) -> None:
        with self.lock:
            for tag, name in self.seen:
                assert name.startswith("taskflow-coordinator"), (tag, name)
                assert not name.startswith("taskflow-timer")
            assert all(self.locks_free)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    ex = ThreadPoolExecutor(4, thread_name_prefix="oncancel")
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def release(gate: Callable[[], threading.Event]) -> threading.Event:
    return gate()


def blocked(calls: Calls, release: threading.Event, tag: str) -> Callable[[TaskContext, Any], Any]:
    def task(ctx: TaskContext, param: Any) -> str:
        ctx.on_cancel(calls.callback(ctx, tag))
        clock.wait(release, LONG)
        return tag

    return task


def pause(seconds: float) -> None:
    """Poll interval of a wait for another thread (never an ordering by itself)."""
    threading.Event().wait(seconds)


def quiet_settle(calls: Calls) -> None:
    """Give a stray callback (one that must not run) time to show: under a fake clock, until no
    taskflow work is queued or running (a callback is handed to a coordinator thread, counted
    until it returns); on the real clock, a moment."""
    fake = clock.installed()
    if isinstance(fake, FakeClock):
        assert fake.wait_until_blocked(PROMPT)
    else:
        pause(SHORT * 2)


def test_the_runs_deadline_runs_the_callback_once_on_a_coordinator(calls, pool, release, fake_clock):
    node = FunctionNode(blocked(calls, release, "slow"), name="slow")
    result = TaskScheduling.start(node, executor=pool, timeout=SHORT * 2)
    assert result.status is FlowStatus.TIMED_OUT
    assert result.elapsed == pytest.approx(SHORT * 2)
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["slow"]
    calls.check_threads()
    assert result.context["closed_slow"] is True


def test_a_nodes_own_timeout_runs_the_callback_once(calls, pool, release, fake_clock):
    node = FunctionNode(blocked(calls, release, "own"), name="own", timeout=SHORT * 2)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result["own"].work_result.state is ResultState.TIMEOUT
    assert result["own"].work_result.duration == pytest.approx(SHORT * 2)
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["own"]
    calls.check_threads()
    note = result.report().nodes[0].on_cancel
    assert note is not None and (note.registered, note.ran, note.raised) == (1, 1, 0)


def test_a_submitted_run_closed_by_the_timer_hands_the_callback_to_a_coordinator(
        calls, pool, release, fake_clock):
    node = FunctionNode(blocked(calls, release, "submitted"), name="submitted")
    result = TaskScheduling.submit(node, executor=pool, timeout=SHORT * 2).result(PROMPT + LONG)
    assert result.status is FlowStatus.TIMED_OUT
    assert result.elapsed == pytest.approx(SHORT * 2)
    calls.wait_for(1)
    release.set()
    assert calls.tags() == ["submitted"]
    calls.check_threads()


def test_the_attempt_that_lost_a_hedge_race_is_told_and_the_winner_is_not(calls, pool, release, fake_clock):
    def replica(ctx: TaskContext, param: Any) -> str:
        n = ctx.incr("attempts")
        ctx.on_cancel(calls.callback(ctx, f"attempt{n}"))
        if n == 1:
            clock.wait(release, LONG)  # the slow first attempt: a duplicate starts and wins
            return "slow"
        return "fast"

    node = FunctionNode(replica, name="price", hedge=Hedge(after=SHORT), idempotent=True)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.outputs == {"price": "fast"}
    assert result.elapsed == pytest.approx(SHORT)  # the duplicate started at the hedge's delay
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["attempt1"]
    calls.check_threads()


def test_ctx_cancel_abandons_the_others_but_not_the_node_that_cancelled(calls, pool, release):
    started = threading.Event()

    def slow(ctx: TaskContext, param: Any) -> str:
        ctx.on_cancel(calls.callback(ctx, "slow"))
        started.set()
        clock.wait(release, LONG)
        return "slow"

    def stopper(ctx: TaskContext, param: Any) -> str:
        ctx.on_cancel(calls.callback(ctx, "stopper"))
        assert started.wait(LONG)
        ctx.cancel("enough")
        return "stopped"

    result = TaskScheduling.start([FunctionNode(slow, name="slow"),
                                   FunctionNode(stopper, name="stopper")],
                                  executor=pool, timeout=LONG)
    assert result.status is FlowStatus.CANCELLED
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["slow"]
    calls.check_threads()


def test_a_join_that_no_longer_needs_a_father_abandons_its_attempt(calls, pool, release):
    started = threading.Event()

    def slow_task(ctx: TaskContext, param: Any) -> str:
        ctx.on_cancel(calls.callback(ctx, "slow"))
        started.set()
        clock.wait(release, LONG)
        return "slow"

    fast = FunctionNode(lambda c, p: started.wait(LONG) and "fast", name="fast")
    slow = FunctionNode(slow_task, name="slow")
    first = FunctionNode(lambda c, p: "done", name="first", join=Join.ANY)
    fast >> first
    slow >> first
    result = TaskScheduling.start([fast, slow], executor=pool, timeout=LONG)
    assert result["slow"].work_result.state is ResultState.CANCELLED
    assert result.outputs["first"] == "done"
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["slow"]
    calls.check_threads()


class _Items(FanOutNode[Any]):
    def __init__(self, calls: Calls, release: threading.Event, **options: Any) -> None:
        super().__init__(None, name="items", **options)
        self.calls = calls
        self.release = release

    def items(self, ctx: TaskContext, param: Any) -> Iterable[tuple[Any, Any]]:
        return [(i, i) for i in range(4)]

    def work(self, ctx: TaskContext, item: Any) -> Any:
        ctx.on_cancel(self.calls.callback(ctx, f"item{item}"))
        if item == 2:
            clock.wait(self.release, LONG)
        return item


def test_a_fan_out_item_past_its_item_timeout_is_abandoned_alone(calls, pool, release, fake_clock):
    fan = _Items(calls, release, max_concurrency=2, item_timeout=SHORT * 2, policy="best_effort")
    result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    fan_in = result["items"].work_result.result
    assert sorted(fan_in.succeeded) == [0, 1, 3] and list(fan_in.failed) == [2]
    assert result.elapsed == pytest.approx(SHORT * 2)  # item 2 was given up at its timeout
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["item2"]
    calls.check_threads()


def test_an_attempt_that_ends_by_itself_never_runs_its_callback(calls, pool):
    def ok(ctx: TaskContext, param: Any) -> int:
        ctx.on_cancel(calls.callback(ctx, "ok"))
        return 1

    def fails(ctx: TaskContext, param: Any) -> int:
        ctx.on_cancel(calls.callback(ctx, "fails"))
        raise ValueError("backend said no")

    a = FunctionNode(ok, name="ok")
    a >> FunctionNode(fails, name="fails")
    result = TaskScheduling.start(a, executor=pool, timeout=MEDIUM)
    assert result["ok"].work_result.state is ResultState.SUCCESS
    assert result["fails"].work_result.state is ResultState.EXCEPTION
    quiet_settle(calls)
    assert calls.tags() == []
    report = result.report()
    assert report.on_cancel is not None and report.on_cancel.registered == 2
    assert report.on_cancel.ran == 0


def test_a_retry_starts_with_no_callbacks(calls, pool, release, fake_clock):
    def flaky(ctx: TaskContext, param: Any) -> str:
        n = ctx.incr("attempts")
        ctx.on_cancel(calls.callback(ctx, f"attempt{n}"))
        if n == 1:
            raise ConnectionError("reset")
        clock.wait(release, LONG)
        return "late"

    node = FunctionNode(flaky, name="flaky", retries=1)
    result = TaskScheduling.start(node, executor=pool, timeout=SHORT * 3)
    assert result.status is FlowStatus.TIMED_OUT
    assert result.elapsed == pytest.approx(SHORT * 3)
    calls.wait_for(1)
    release.set()
    quiet_settle(calls)
    assert calls.tags() == ["attempt2"]


def test_registered_after_the_attempt_was_abandoned_it_runs_at_once_on_that_thread(
        pool, release, fake_clock):
    ran_on: list[str] = []
    done = threading.Event()

    def late(ctx: TaskContext, param: Any) -> None:
        clock.wait(release, LONG)
        ctx.on_cancel(lambda: ran_on.append(threading.current_thread().name))
        ran_on.append("after register")
        done.set()

    result = TaskScheduling.start(FunctionNode(late, name="late"), executor=pool,
                                  timeout=SHORT * 2)
    assert result.status is FlowStatus.TIMED_OUT
    release.set()
    assert done.wait(PROMPT)
    assert ran_on[0].startswith("oncancel") and ran_on[1] == "after register"
    # registered once the run had returned: the result it returned still counts it
    assert result.attempt_notes["late"].registered == 1


def test_a_callback_that_raises_is_logged_and_counted_never_raised(pool, release, fake_clock):
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="ERROR",
                      format="{message}")
    logger.enable("taskflow")
    raised = threading.Event()

    def task(ctx: TaskContext, param: Any) -> None:
        def boom() -> None:
            raised.set()
            raise OSError("socket already closed")

        ctx.on_cancel(boom)
        clock.wait(release, LONG)

    try:
        result = TaskScheduling.start(FunctionNode(task, name="task"), executor=pool,
                                      timeout=SHORT * 2)
        assert raised.wait(PROMPT)
        for _ in range(int(PROMPT / 0.01)):
            if lines:
                break
            pause(0.01)
        release.set()
    finally:
        logger.disable("taskflow")
        logger.remove(sink)
    assert result.status is FlowStatus.TIMED_OUT
    assert any("on_cancel callback boom of node task raised" in line
               and "socket already closed" in line for line in lines)
    note = result.attempt_notes["task"]
    assert (note.registered, note.ran, note.raised) == (1, 1, 1)


def test_outside_a_node_on_cancel_registers_nothing_and_refuses_a_non_callable():
    ctx = TaskContext()
    ran: list[int] = []
    ctx.on_cancel(lambda: ran.append(1))
    assert ran == []
    with pytest.raises(InvalidArgumentError, match="callable"):
        ctx.on_cancel("close")  # type: ignore[arg-type]


def test_a_hook_registering_a_callback_registers_nothing(calls, pool):
    class Hooked(FunctionNode):
        def on_success(self, support: Any) -> None:
            support.context.on_cancel(calls.callback(support.context, "hook"))

    result = TaskScheduling.start(Hooked(lambda c, p: 1, name="hooked"), executor=pool,
                                  timeout=MEDIUM)
    quiet_settle(calls)
    assert calls.tags() == [] and result.attempt_notes == {}


def test_nodes_that_register_nothing_leave_the_run_without_a_watch(pool):
    seen: list[Any] = []

    def task(ctx: TaskContext, param: Any) -> int:
        seen.append(ctx._run() if ctx._run is not None else None)
        return 1

    result = TaskScheduling.start(FunctionNode(task, name="plain"), executor=pool, timeout=MEDIUM)
    assert seen[0].watch is None
    assert result.attempt_notes == {} and result.report().on_cancel is None


@pytest.mark.parametrize("round_", range(30))
def test_at_the_deadline_boundary_a_callback_runs_exactly_when_the_node_lost_its_outcome(
        pool, round_):
    budget = SHORT
    ran: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def near_deadline(ctx: TaskContext, param: Any) -> int:
        def fn() -> None:
            with lock:
                ran.append(1)

        ctx.on_cancel(fn)
        threading.Event().wait(budget * (0.6 + round_ / 40))  # around the deadline: stands in for work
        done.set()
        return 1

    result = TaskScheduling.start(FunctionNode(near_deadline, name="n"), executor=pool,
                                  timeout=budget)
    assert done.wait(PROMPT)
    state = result["n"].work_result.state
    notes = result.attempt_notes.get("n")
    for _ in range(int(PROMPT / 0.01)):
        with lock:
            if state is ResultState.SUCCESS or ran:
                break
        pause(0.01)
    with lock:
        assert len(ran) == (0 if state is ResultState.SUCCESS else 1), (state, ran)
    assert notes is not None and notes.registered == 1


def test_an_attempt_running_a_nested_flow_on_its_own_thread_is_still_told(calls, pool, release, fake_clock):
    # a task that starts a flow on its own pool drains it on its own thread (an inline run):
    # while it does, the outer run's deadline passes, and the outer attempt is still running
    inner_started = threading.Event()

    def inner_task(ctx: TaskContext, param: Any) -> str:
        inner_started.set()
        clock.wait(release, LONG)
        return "inner"

    def outer_task(ctx: TaskContext, param: Any) -> Any:
        ctx.on_cancel(calls.callback(ctx, "outer"))
        ctx.on_cancel(release.set)  # what it is blocked on, through the nested flow
        nested = TaskScheduling.start(FunctionNode(inner_task, name="inner"), executor=pool,
                                      timeout=LONG)
        return nested.outputs

    result = TaskScheduling.start(FunctionNode(outer_task, name="outer"), executor=pool,
                                  timeout=SHORT * 3)
    assert result.status is FlowStatus.TIMED_OUT
    assert inner_started.wait(PROMPT)
    calls.wait_for(1)
    assert release.wait(PROMPT)  # the second callback freed the nested flow
    quiet_settle(calls)
    assert calls.tags() == ["outer"]
    calls.check_threads()


def test_an_attempt_that_failed_into_a_back_off_is_not_told_when_its_thread_moved_on(
        calls, release, fake_clock):
    # one worker: flaky's first attempt registers a callback and fails; while it waits out its
    # back-off, the same thread runs `other`, and the run's deadline passes with both unfinished.
    # Only `other` was abandoned mid-attempt: flaky's attempt had ended by itself
    threads: dict[str, str] = {}
    failed = threading.Event()

    def flaky(ctx: TaskContext, param: Any) -> None:
        threads["flaky"] = threading.current_thread().name
        ctx.on_cancel(calls.callback(ctx, "flaky"))
        failed.set()
        raise ConnectionError("reset")

    def other(ctx: TaskContext, param: Any) -> str:
        threads["other"] = threading.current_thread().name
        assert failed.wait(LONG)
        ctx.on_cancel(calls.callback(ctx, "other"))
        clock.wait(release, LONG)
        return "late"

    # its back-off fits the budget; its second attempt would wait for the busy worker
    a = FunctionNode(flaky, name="flaky", retries=1, retry_backoff=SHORT)
    b = FunctionNode(other, name="other")
    with ThreadPoolExecutor(1, thread_name_prefix="one") as one:
        result = TaskScheduling.start([a, b], executor=one, timeout=SHORT * 4)
        assert result.status is FlowStatus.TIMED_OUT
        assert result.elapsed == pytest.approx(SHORT * 4)
        calls.wait_for(1)
        release.set()
    quiet_settle(calls)
    assert threads["flaky"] == threads["other"]  # the same thread moved on
    assert result["flaky"].work_result.state is ResultState.TIMEOUT  # unfinished at the deadline
    assert result["flaky"].work_result.attempts == 1
    assert calls.tags() == ["other"]
