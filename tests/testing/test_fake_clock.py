"""``FakeClock``: virtual time for taskflow on the real engine, on real thread pools and on
``ManualExecutor``.

Each test checks what the virtual clock says happened (the budget that ran out, the back-off that
was waited, the age of a cache value) and, where the test's subject is "it did not wait in real
time", a wall-time bound far looser than the virtual times involved (a 30 s budget in under
10 s), which no busy machine misses.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest

from taskflow import (
    CircuitBreaker,
    CircuitOpenError,
    FunctionNode,
    RateLimit,
    ResultState,
    SchedulingNode,
    TaskScheduling,
    clock,
)
from taskflow.engine import timer
from taskflow.errors import InvalidArgumentValueError
from taskflow.testing import FakeClock, ManualExecutor

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as ex:
        yield ex


# -- the clock by hand -----------------------------------------------------------------------


def test_advance_fires_due_timers_in_order_each_at_its_own_time() -> None:
    fired: list[tuple[str, float]] = []
    with FakeClock(start=100.0) as fake:
        assert fake.now() == 100.0
        base = clock.now()  # taskflow's reading: continues from the real clock's
        for name, delay in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("late", 10.0)):
            timer.schedule(base + delay, lambda n=name: fired.append((n, fake.now())))
        cancelled = timer.schedule(base + 1.5, lambda: fired.append(("cancelled", fake.now())))
        cancelled.cancel()
        fake.advance(3.0)
        assert fired == [("a", 101.0), ("b", 102.0), ("c", 103.0)]
        assert fake.now() == 103.0 and clock.now() == base + 3.0 and fake.pending() == 1
    assert clock.installed() is None  # real time is back


def test_wall_time_moves_with_virtual_time() -> None:
    with FakeClock() as fake:
        w0 = clock.wall()
        fake.advance(3600.0)
        assert clock.wall() - w0 == pytest.approx(3600.0)
        assert abs(w0 - time.time()) < 60  # it started from the real Unix time


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1", True])
def test_advance_refuses_a_negative_or_non_finite_step(bad: Any) -> None:
    with FakeClock() as fake:
        with pytest.raises(InvalidArgumentValueError, match="never goes back"):
            fake.advance(bad)
        assert fake.now() == 0.0


def test_a_second_fake_clock_and_a_second_entry_are_refused() -> None:
    first = FakeClock()
    with first:
        with pytest.raises(RuntimeError, match="another fake clock is entered"):
            with FakeClock():
                pass
        assert clock.installed() is first
    with pytest.raises(RuntimeError, match="entered once"):
        with first:
            pass
    assert clock.installed() is None


def test_bad_constructor_arguments_name_the_culprit() -> None:
    with pytest.raises(InvalidArgumentValueError, match="autojump_threshold"):
        FakeClock(autojump_threshold=-0.1)
    with pytest.raises(InvalidArgumentValueError, match="start"):
        FakeClock(start=float("nan"))


def test_a_thread_left_in_sleep_is_released_when_the_clock_exits() -> None:
    out: list[float] = []
    asleep = threading.Event()
    with FakeClock() as fake:

        def nap() -> None:
            asleep.set()
            fake.sleep(1e9)
            out.append(1.0)

        t = threading.Thread(target=nap)
        t.start()
        assert asleep.wait(10)
    t.join(10)
    assert not t.is_alive() and out == [1.0]


def test_sleep_returns_after_advance_reaches_its_time() -> None:
    woke = threading.Event()
    with FakeClock() as fake:
        t = threading.Thread(target=lambda: (fake.sleep(5.0), woke.set()))
        t.start()
        while fake.next_due() is None:  # the sleeper registered
            time.sleep(0.001)
        fake.advance(4.999)
        assert not woke.wait(0.05)
        fake.advance(0.001)
        assert woke.wait(10)
        t.join(10)


def test_timed_waits_give_up_in_virtual_time_and_return_at_once_when_ready() -> None:
    with FakeClock(autojump=True) as fake:
        event = threading.Event()
        t0 = time.monotonic()
        assert clock.wait(event, 3600.0) is False  # autojump moved an hour, not the wall clock
        assert fake.now() == 3600.0 and time.monotonic() - t0 < 10
        event.set()
        assert clock.wait(event, 5.0) is True and fake.now() == 3600.0


def test_pending_timers_move_to_real_time_at_exit() -> None:
    fired = threading.Event()
    with FakeClock():
        timer.schedule(clock.now() + 0.01, fired.set)
    assert fired.wait(10)  # not lost: the real timer thread fired it


def test_time_never_goes_back_for_a_primitive_used_before_under_and_after_a_fake_clock(
        pool: Any) -> None:
    # a rate limit made at import: its refill stamp was read on the real clock
    limit = RateLimit("fake-clock-continuity", per_second=1.0, burst=1)
    node = FunctionNode(lambda c, p: "ok", name="limited", rate_limit=limit)
    assert TaskScheduling.start(node, executor=pool, timeout=5.0).ok  # takes the token
    before = clock.now()
    with FakeClock(autojump=True) as fake:
        assert clock.now() >= before
        result = TaskScheduling.start(node, executor=pool, timeout=5.0)  # waits 1 s for it
        assert result.ok and result.elapsed == pytest.approx(1.0, abs=0.05)
        fake.advance(3600.0)
        ahead = clock.now()
    after = clock.now()
    assert after >= ahead  # real time continues from the hour the fake moved
    late = timer.schedule(clock.now() + 0.01, threading.Event().set)
    assert late.when - clock.real_now() <= 0.02  # the timer thread keeps the same time
    assert TaskScheduling.start(node, executor=pool, timeout=5.0).ok  # refilled meanwhile


# -- runs on real thread pools ---------------------------------------------------------------


def test_the_page_degrades_when_inventory_takes_longer_than_the_budget(pool: Any) -> None:
    with FakeClock(autojump=True) as fake:

        def inventory(ctx: Any, sku: Any) -> int:
            fake.sleep(0.3)
            return 7

        page = [FunctionNode(inventory, name="inventory"),
                FunctionNode(lambda c, p: 9.99, name="price")]
        result = TaskScheduling.start(page, executor=pool, timeout=0.25)
        assert result["price"].work_result.state is ResultState.SUCCESS
        assert result["inventory"].work_result.state is ResultState.TIMEOUT
        assert result.elapsed == pytest.approx(0.25)
        assert fake.now() == pytest.approx(0.25)


def test_a_30_second_budget_runs_out_in_virtual_time(pool: Any) -> None:
    t0 = time.monotonic()
    with FakeClock(autojump=True) as fake:
        hung = FunctionNode(lambda c, p: fake.sleep(1e6), name="backend")
        result = TaskScheduling.start(hung, executor=pool, timeout=30.0)
        assert result["backend"].work_result.state is ResultState.TIMEOUT
        assert fake.now() == pytest.approx(30.0)
    assert time.monotonic() - t0 < 10  # 30 s of budget, not 30 s of the test's time


def test_a_retry_after_a_10_second_back_off_still_fits_the_budget(pool: Any) -> None:
    calls: list[float] = []
    with FakeClock(autojump=True) as fake:

        def flaky(ctx: Any, p: Any) -> str:
            calls.append(fake.now())
            if len(calls) < 3:
                raise ConnectionError("backend down")
            return "ok"

        node = FunctionNode(flaky, name="flaky", retries=2, retry_backoff=10.0)
        result = TaskScheduling.start(node, executor=pool, timeout=60.0)
        assert result["flaky"].work_result.state is ResultState.SUCCESS
        assert calls[0] == 0.0 and calls[1] - calls[0] >= 10.0  # the back-off was waited
        assert calls[2] - calls[1] >= calls[1] - calls[0]  # and grew (exponential)
        assert fake.now() < 60.0


def test_a_node_timeout_fires_in_virtual_time_and_the_rest_goes_on(pool: Any) -> None:
    with FakeClock(autojump=True) as fake:
        slow = FunctionNode(lambda c, p: fake.sleep(2.0), name="slow", timeout=0.5,
                            fallback="cached")
        after = FunctionNode(lambda c, p: c.result_of("slow") + "!", name="after")
        slow >> after
        result = TaskScheduling.start(slow, executor=pool, timeout=10.0)
        assert result["slow"].work_result.state is ResultState.DEGRADED
        assert result.outputs["after"] == "cached!"
        assert fake.now() == pytest.approx(0.5)


def test_time_stands_still_while_a_task_computes_without_the_clock(pool: Any) -> None:
    # the invariant of autojump: it never moves time while taskflow work can progress; a task
    # that works for 50 ms of real time without reading the clock keeps its 1 ms timeout
    def busy(ctx: Any, p: Any) -> int:
        end = time.perf_counter() + 0.05
        n = 0
        while time.perf_counter() < end:
            n += 1
        return n

    with FakeClock(autojump=True, autojump_threshold=0.001) as fake:
        result = TaskScheduling.start(FunctionNode(busy, name="busy", timeout=0.001),
                                      executor=pool, timeout=1.0)
        assert result["busy"].work_result.state is ResultState.SUCCESS
        assert fake.now() == 0.0


def test_a_cached_value_is_served_stale_after_its_ttl_then_expires(pool: Any) -> None:
    calls: list[float] = []
    with FakeClock(autojump=True) as fake:

        def price(ctx: Any, sku: Any) -> float:
            calls.append(fake.now())
            return 10.0 + len(calls)

        node = FunctionNode(price, param="sku-1", name="price", cache_ttl=30.0,
                            share_key=lambda c, p: ("price", p), stale_for=60.0)
        first = TaskScheduling.start(node, executor=pool, timeout=1.0)
        fake.advance(29.0)
        fresh = TaskScheduling.start(node, executor=pool, timeout=1.0)
        assert first.outputs["price"] == fresh.outputs["price"] == 11.0 and len(calls) == 1
        fake.advance(2.0)  # 31 s old: stale, served at once while one refresh runs
        stale = TaskScheduling.start(node, executor=pool, timeout=1.0)
        assert stale.outputs["price"] == 11.0
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert calls == [0.0, 31.0]  # the refresh ran at 31 s of virtual time
        fake.advance(91.0)  # 91 s past the refresh: beyond ttl + stale_for, a miss
        assert TaskScheduling.start(node, executor=pool, timeout=1.0).outputs["price"] == 13.0


def test_a_breaker_opens_and_half_opens_after_its_open_period(pool: Any) -> None:
    breaker = CircuitBreaker("fake-clock-breaker", failure_ratio=0.5, window=2, min_calls=2,
                             open_for=5.0)

    def failing(ctx: Any, p: Any) -> None:
        raise ConnectionError("down")

    with FakeClock(autojump=True) as fake:
        for _ in range(2):
            TaskScheduling.start(FunctionNode(failing, name="b", breaker=breaker),
                                 executor=pool, timeout=1.0)
        assert breaker.state.name == "OPEN"
        refused = TaskScheduling.start(FunctionNode(failing, name="b", breaker=breaker),
                                       executor=pool, timeout=1.0)
        assert isinstance(refused["b"].work_result.exception, CircuitOpenError)
        fake.advance(5.0)
        assert breaker.state.name == "HALF_OPEN"


def test_a_rate_limit_refills_in_virtual_time(pool: Any) -> None:
    limit = RateLimit("fake-clock-limit", per_second=1.0, burst=1)
    with FakeClock(autojump=True) as fake:
        starts: list[float] = []
        node = [FunctionNode(lambda c, p: starts.append(fake.now()), name=f"n{i}",
                             rate_limit=limit) for i in range(3)]
        result = TaskScheduling.start(node, executor=pool, timeout=10.0)
        assert result.ok, result.failed
        assert sorted(starts) == pytest.approx([0.0, 1.0, 2.0], abs=1e-6)


def test_entering_while_a_run_is_in_flight_is_refused(pool: Any) -> None:
    release = threading.Event()
    started = threading.Event()

    def held(ctx: Any, p: Any) -> None:
        started.set()
        release.wait(10)

    future = TaskScheduling.submit(FunctionNode(held, name="held"), executor=pool, timeout=20)
    try:
        assert started.wait(10)
        with pytest.raises(RuntimeError, match="in flight"):
            with FakeClock():
                pass
        assert clock.installed() is None
    finally:
        release.set()
        future.result(10)


def test_a_process_pool_is_refused_under_a_fake_clock() -> None:
    with ProcessPoolExecutor(1) as ex, FakeClock():
        with pytest.raises(InvalidArgumentValueError, match="ProcessPoolExecutor.*virtual time"):
            TaskScheduling.start(FunctionNode(lambda c, p: abs(p), param=-1, name="abs"), executor=ex,
                                 timeout=1.0)


# -- ManualExecutor: deterministic jumps -------------------------------------------------------


def _backoff_page(log: list[tuple[str, float]], fake: FakeClock) -> list[FunctionNode]:
    def flaky(ctx: Any, name: Any) -> str:
        log.append((name, fake.now()))
        if sum(1 for n, _ in log if n == name) < 2:
            raise ConnectionError(name)
        return name

    return [FunctionNode(flaky, param=n, name=n, retries=1, retry_backoff=b)
            for n, b in (("a", 1.0), ("b", 2.0), ("c", 0.5))]


def test_run_until_idle_jumps_to_each_back_off_and_a_seed_repeats_the_order() -> None:
    orders = []
    for _ in range(2):
        log: list[tuple[str, float]] = []
        with FakeClock(autojump=True) as fake:
            ex = ManualExecutor(seed=11)
            future = TaskScheduling.submit(_backoff_page(log, fake), executor=ex, timeout=30.0)
            ex.run_until_idle()
            result = future.result(timeout=0)
        assert result.outputs == {"a": "a", "b": "b", "c": "c"}
        retried = {n: t for n, t in log[3:]}
        assert retried == {"a": 1.0, "b": 2.0, "c": 0.5}
        orders.append(log)
    assert orders[0] == orders[1]


def test_without_autojump_run_until_idle_leaves_time_to_the_test() -> None:
    log: list[tuple[str, float]] = []
    with FakeClock() as fake:
        ex = ManualExecutor()
        future = TaskScheduling.submit(_backoff_page(log, fake), executor=ex, timeout=30.0)
        ex.run_until_idle()
        assert len(log) == 3 and not future.done()
        fake.advance(0.5)
        ex.run_until_idle()
        assert [n for n, _ in log[3:]] == ["c"]
        fake.advance(1.5)
        ex.run_until_idle()
        assert future.result(timeout=0).outputs == {"a": "a", "b": "b", "c": "c"}


def test_time_stands_still_while_the_start_caller_runs_the_hooks_at_the_deadline(
        pool: Any) -> None:
    # at the deadline the caller closes the run and runs on_fail itself: while it works for
    # 50 ms of real time, the sleeper due at 2 s must not pull time forward
    seen: list[float] = []
    with FakeClock(autojump=True, autojump_threshold=0.001) as fake:

        class Hung(SchedulingNode):
            def task(self, ctx: Any, param: Any) -> None:
                fake.sleep(param)

            def on_fail(self, support: Any) -> None:
                end = time.perf_counter() + 0.05
                while time.perf_counter() < end:
                    pass
                seen.append(fake.now())

        result = TaskScheduling.start([Hung(1e6, name="hung"), Hung(2.0, name="later")],
                                      executor=pool, timeout=1.0)
        assert seen and all(t == 1.0 for t in seen), seen
        assert result.elapsed == 1.0


# -- what autojump must not be stalled by ----------------------------------------------------


def test_a_fan_out_source_that_waits_in_the_clock_does_not_stall_autojump(pool: Any) -> None:
    # the source sleeps in virtual time between items while the other item loops wait for
    # their turn to pull: they wait for the source, so time must still move
    from taskflow import FanOutNode

    with FakeClock(autojump=True) as fake:

        class Paged(FanOutNode):
            def items(self, ctx: Any, param: Any) -> Iterator[tuple[int, int]]:
                for page in range(4):
                    fake.sleep(1.0)  # a page of the source takes a second to come
                    yield page, page

            def work(self, ctx: Any, item: int) -> int:
                return item * 10

        result = TaskScheduling.start(Paged(name="paged", max_concurrency=4), executor=pool,
                                      timeout=30.0)
        fan_in = result.outputs["paged"]
        assert fan_in.complete and fan_in.succeeded == {0: 0, 1: 10, 2: 20, 3: 30}
        assert fake.now() == pytest.approx(4.0)


def _leave_a_loop_running(old: ThreadPoolExecutor, in_the_clock: bool) -> threading.Event:
    """A worker loop of a run that ended under an earlier fake clock, its task still running on
    ``old``'s thread (waiting in that clock, or on a plain Event) until the event is set."""
    started, release = threading.Event(), threading.Event()

    def held(ctx: Any, p: Any) -> None:
        started.set()
        if in_the_clock:
            clock.wait(release, None)
        else:
            release.wait(10)

    with FakeClock() as first:
        future = TaskScheduling.submit(FunctionNode(held, name="held"), executor=old,
                                       timeout=1.0)
        assert started.wait(10)
        first.advance(1.0)
        assert future.result(10)["held"].work_result.state is ResultState.TIMEOUT
    return release


@pytest.mark.parametrize("in_the_clock", [True, False])
def test_a_loop_left_running_by_an_earlier_clock_does_not_stall_autojump(
        in_the_clock: bool) -> None:
    with ThreadPoolExecutor(1) as old:
        release = _leave_a_loop_running(old, in_the_clock)
        with FakeClock(autojump=True) as fake, ThreadPoolExecutor(4) as pool:
            release.set()
            old.submit(lambda: None).result(10)  # the old loop has returned
            hung = FunctionNode(lambda c, p: fake.sleep(1e6), name="backend")
            result = TaskScheduling.start(hung, executor=pool, timeout=30.0)
            assert result["backend"].work_result.state is ResultState.TIMEOUT
            assert fake.now() == pytest.approx(30.0)


def test_a_loop_left_running_by_an_earlier_clock_ending_does_not_hide_a_running_task() -> None:
    # the old loop's end must not take back the count of a task running under this clock:
    # autojump would then move time (to the task's timeout) while it works
    with ThreadPoolExecutor(1) as old:
        release = _leave_a_loop_running(old, in_the_clock=False)
        with FakeClock(autojump=True) as fake, ThreadPoolExecutor(4) as pool:
            running, go = threading.Event(), threading.Event()

            def works(ctx: Any, p: Any) -> str:
                running.set()
                go.wait(10)
                return "done"

            future = TaskScheduling.submit(FunctionNode(works, name="works", timeout=0.5),
                                           executor=pool, timeout=5.0)
            assert running.wait(10)
            release.set()
            old.submit(lambda: None).result(10)  # the old loop has returned
            assert clock.busy() >= 1  # the running task still counts
            go.set()
            result = future.result(10)
            assert result["works"].work_result.state is ResultState.SUCCESS
            assert fake.now() == 0.0


def test_after_a_clock_that_ran_ahead_stamps_are_on_taskflows_clock_not_time_monotonic(
        pool: Any) -> None:
    with FakeClock() as fake:
        fake.advance(10.0)
    assert clock.offset >= 10.0  # what the process's monotonic readings moved ahead, for good
    before = clock.now()
    result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="one"), executor=pool,
                                  timeout=5.0)
    wr = result.result_of("one")
    assert before <= result.started_at <= wr.started_at <= wr.finished_at <= clock.now()
    assert result.started_at - time.monotonic() > 9.0  # time.monotonic() is behind them


def test_now_reads_whole_virtual_seconds_when_a_jump_crosses_a_power_of_two_of_the_seam() -> None:
    # virtual time is kept on the seam's scale: from 1,000 s below a power of two, an hour's
    # jump crosses it, where the float sum loses a bit; now() still reads exactly 3600.0
    target = 2.0 ** math.ceil(math.log2(clock.now() + 4000.0)) - 1000.123
    with FakeClock() as ahead:
        ahead.advance(target - clock.now())  # leaves the seam there for good
    with FakeClock(autojump=True) as fake:
        assert clock.wait(threading.Event(), 3600.0) is False
        assert fake.now() == 3600.0
