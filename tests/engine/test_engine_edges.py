"""Engine edge cases, each through the public API: shutdown while work is queued, retries by the
thousand, hooks that are slow or cancel the run, deadlines met at completion, contextvars in
fan-out items, a TaskContext reused after a timeout, huge timeouts, nodes passed back to start,
names changed after construction, nested starts on one thread, and cancellation reasons.

No test may hang when the engine regresses: a call that could deadlock runs in a helper thread
(:class:`conftest.Call`) joined with a timeout, so the deadlock becomes an assertion; gates are
released and pools torn down in ``finally`` blocks.
"""

from __future__ import annotations

import contextlib
import contextvars
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
from conftest import LONG, MEDIUM, PROMPT, Call, HookLog

from taskflow import (
    DuplicateNameError,
    FanOutNode,
    FlowDefinitionError,
    FlowStatus,
    FunctionNode,
    Hedge,
    ItemTimeoutError,
    MonitoredExecutor,
    NodeCancelledError,
    RejectedExecutionError,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    TaskSupport,
    ThreadPool,
)

TERMINAL = set(ResultState) - {ResultState.DEFAULT}  # every final state


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


# --- executor.shutdown(cancel_futures=True) while a run's work is queued -------------------------


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
def test_shutdown_cancelling_queued_flow_work_neither_deadlocks_nor_blocks_later_runs(
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
        # a later run on the shut-down executor is refused at once instead of blocking
        later = Call(TaskScheduling.start, fn_node(lambda ctx, p: 1, "c"), executor=executor,
                     timeout=LONG, name="d1-later")
        assert later.finished(PROMPT), "a later start() blocked in submit"
        assert isinstance(later.error, RejectedExecutionError), later.error
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
def test_shutdown_cancelling_a_queued_fan_out_item_loop_does_not_deadlock() -> None:
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


# --- many retries without backoff: the worker loop survives them ---------------------------------


@pytest.mark.timeout(30)
def test_more_than_1024_retries_without_backoff_end_the_node_with_its_error(
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
def test_with_a_budget_the_node_ends_exception_not_timeout(
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


# --- user hooks stay off the process-wide timer thread -------------------------------------------


@pytest.mark.timeout(60)
def test_a_slow_on_fail_after_a_node_timeout_does_not_stall_other_runs_deadlines(
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


# --- deadlines are checked when a node completes -------------------------------------------------


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
def test_a_node_finishing_after_its_own_timeout_is_timeout(
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
def test_a_node_finishing_after_the_run_deadline_is_timeout(
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
def test_an_item_finishing_after_its_item_timeout_failed(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    fan = BusyItems(name="fan", item_timeout=0.02, policy="best_effort")
    with lagging_timers():
        result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    fanin = result["fan"].work_result.result
    assert fanin.succeeded == {}
    assert isinstance(fanin.failed.get("slow"), ItemTimeoutError)


# --- every node terminal before the run closed gets its hook -------------------------------------


def cancel_run(support: TaskSupport) -> None:
    """An ``on_fail`` hook that ends the run (``ctx.cancel``)."""
    support.context.cancel("a hook ended the run")


def always_fail(ctx: TaskContext, p: Any) -> None:
    raise ValueError("boom")


@pytest.mark.timeout(30)
def test_failed_fast_sons_each_get_on_fail_even_when_a_hook_cancels_the_run(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    log = HookLog()
    father = Recorder("father", always_fail, log)
    # both sons fail fast in one step; whichever on_fail runs first ends the run
    sons = [Recorder(name, lambda ctx, p: "never", log, on_fail=cancel_run) for name in ("s1", "s2")]
    father >> sons

    result = TaskScheduling.start(father, executor=pool, timeout=LONG)
    log.returned = True

    assert result["s1"].work_result.state is ResultState.EXCEPTION
    assert result["s2"].work_result.state is ResultState.EXCEPTION
    assert log.count("father", "on_fail") == 1
    assert log.count("s1", "on_fail") == 1
    assert log.count("s2", "on_fail") == 1
    assert log.late == []


@pytest.mark.timeout(30)
def test_fathers_cancelled_by_a_join_each_get_on_fail_even_when_a_hook_cancels_the_run(
    make_executor: Callable[..., ThreadPoolExecutor], gate: Callable[[], threading.Event],
) -> None:
    pool = make_executor(4)
    release, running = gate(), [gate(), gate()]
    log = HookLog()

    def slow(k: int) -> Callable[[TaskContext, Any], Any]:
        def task(ctx: TaskContext, p: Any) -> None:
            running[k].set()
            release.wait(LONG)
        return task

    def quick(ctx: TaskContext, p: Any) -> str:
        assert all(r.wait(LONG) for r in running)  # both slow fathers are running
        return "quick"

    from taskflow import Join

    fast = fn_node(quick, "fast")
    slow1 = Recorder("slow1", slow(0), log, on_fail=cancel_run)
    slow2 = Recorder("slow2", slow(1), log, on_fail=cancel_run)
    first = fn_node(lambda ctx, p: "first", "first", join=Join.ANY)
    [fast, slow1, slow2] >> first

    # a bounded budget: an engine may wait for the slow fathers (they hold their workers)
    result = TaskScheduling.start([fast, slow1, slow2], executor=pool, timeout=2 * MEDIUM)
    log.returned = True
    release.set()

    assert result["slow1"].work_result.state is ResultState.CANCELLED
    assert result["slow2"].work_result.state is ResultState.CANCELLED
    assert log.count("slow1", "on_fail") == 1
    assert log.count("slow2", "on_fail") == 1
    assert log.late == []


# --- a fan-out's items() and hooks see the caller's contextvars ----------------------------------

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")


class SeesRequest(FanOutNode[Any]):
    """Records ``REQUEST_ID`` in ``items()`` (the generator's body), ``work`` and its hooks."""

    def __init__(self, seen: dict[str, list[str | None]], fail: bool = False, **kw: Any) -> None:
        super().__init__(None, **kw)
        self.__dict__["_seen"] = seen
        self.__dict__["_fail"] = fail

    def _saw(self, where: str) -> None:
        self.__dict__["_seen"].setdefault(where, []).append(REQUEST_ID.get(None))

    def items(self, ctx: TaskContext, param: Any) -> Iterator[tuple[Hashable, Any]]:
        for i in range(3):
            self._saw("items")
            yield i, i

    def work(self, ctx: TaskContext, item: Any) -> Any:
        self._saw("work")
        if self.__dict__["_fail"]:
            raise ValueError(f"item {item} failed")
        return item

    def on_begin(self, support: TaskSupport) -> None:
        self._saw("on_begin")

    def on_success(self, support: TaskSupport) -> None:
        self._saw("on_success")

    def on_fail(self, support: TaskSupport) -> None:
        self._saw("on_fail")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_fan_out_items_and_hooks_see_the_callers_contextvars(
    make_executor: Callable[..., ThreadPoolExecutor], fail: bool,
) -> None:
    pool = make_executor(2)
    seen: dict[str, list[str | None]] = {}
    fan = SeesRequest(seen, fail=fail, name="fan", max_concurrency=2)
    token = REQUEST_ID.set("req-42")
    try:
        result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    finally:
        REQUEST_ID.reset(token)

    expected = ResultState.EXCEPTION if fail else ResultState.SUCCESS
    assert result["fan"].work_result.state is expected
    hook = "on_fail" if fail else "on_success"
    assert set(seen) == {"items", "work", "on_begin", hook}
    assert {where: set(values) for where, values in seen.items()} == {
        where: {"req-42"} for where in seen
    }


# --- a TaskContext reused after a timed-out run --------------------------------------------------


class Reuse:
    """Run 1 times out while its task ``t1`` is blocked; run 2 then reuses the context.

    ``t1`` is released while run 2 is running and calls ``action(ctx)``; run 2's node ``r2``
    waits until it has, then returns what run 2 sees.
    """

    def __init__(self, pool: Executor, action: Callable[[TaskContext], Any]) -> None:
        self.ctx = TaskContext()
        self.release, self.acted = threading.Event(), threading.Event()
        self.seen: Any = None

        def t1(ctx: TaskContext, p: Any) -> None:
            self.release.wait(LONG)
            try:
                self.seen = action(ctx)
            finally:
                self.acted.set()

        def r2(ctx: TaskContext, p: Any) -> dict[str, Any]:
            self.release.set()
            assert self.acted.wait(LONG)
            return {"leak": ctx.get("leak"), "cancelled": ctx.cancelled}

        self.result1 = TaskScheduling.start(fn_node(t1, "t1"), executor=pool, timeout=0.1,
                                            context=self.ctx)
        assert self.result1["t1"].work_result.state is ResultState.TIMEOUT
        self.result2 = TaskScheduling.start(fn_node(r2, "r2"), executor=pool, timeout=LONG,
                                            context=self.ctx)


@pytest.mark.timeout(30)
def test_an_abandoned_task_still_sees_its_own_run_after_the_context_is_reused(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    reuse = Reuse(make_executor(2), lambda ctx: (ctx.flow_id, ctx.cancelled))

    flow_id, cancelled = reuse.seen
    assert reuse.result2.ok
    assert flow_id == reuse.result1.flow_id != reuse.result2.flow_id
    assert cancelled is True  # its run timed out


@pytest.mark.timeout(30)
def test_an_abandoned_task_cannot_cancel_the_next_run_of_its_context(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    reuse = Reuse(make_executor(2), lambda ctx: ctx.cancel("stale task"))

    assert reuse.result2["r2"].work_result.state is ResultState.SUCCESS
    assert reuse.result2.ok
    assert reuse.result2.outputs["r2"]["cancelled"] is False


@pytest.mark.timeout(30)
def test_an_abandoned_tasks_writes_do_not_reach_the_next_run_of_its_context(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    def write(ctx: TaskContext) -> None:
        ctx["leak"] = "from run 1"

    reuse = Reuse(make_executor(2), write)

    assert reuse.result2.ok
    assert reuse.result2.outputs["r2"]["leak"] is None


# --- no on_fail hook starts after start() returned -----------------------------------------------


@pytest.mark.timeout(30)
def test_no_hook_starts_after_start_returned_when_cancel_races_the_deadline(
    make_executor: Callable[..., ThreadPoolExecutor], gate: Callable[[], threading.Event],
) -> None:
    pool = make_executor(2)
    log = HookLog()
    returned, release, k_done = gate(), gate(), gate()

    def hold_first_hook(support: TaskSupport) -> None:
        # the first cancelled node's hook lasts until start() has returned
        if len(log.calls) == 1:
            returned.wait(PROMPT)

    def canceller(ctx: TaskContext, p: Any) -> str:
        try:
            ctx.cancel("enough")  # the run now waits for this node, which overruns the budget
            release.wait(LONG)
        finally:
            k_done.set()
        return "k"

    k = fn_node(canceller, "k")
    victims = [Recorder(name, lambda ctx, p: "never", log, on_fail=hold_first_hook)
               for name in ("v1", "v2")]
    k >> victims

    result = TaskScheduling.start(k, executor=pool, timeout=0.3)
    with log._lock:
        log.returned = True
    returned.set()
    release.set()
    assert k_done.wait(LONG)  # today the victims' hooks run in k's ctx.cancel() call

    assert not result.ok
    assert log.late == []
    assert log.count("v1", "on_fail") == 1
    assert log.count("v2", "on_fail") == 1


# --- finite timeouts too large for the platform's waits ------------------------------------------

HUGE = [pytest.param(sys.maxsize, id="maxsize"), pytest.param(1e10, id="1e10"),
        pytest.param(10**400, id="10**400")]


@pytest.fixture
def thread_deaths(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Event]:
    """Exceptions that kill a thread during this test, asserted on by the test itself."""
    deaths: list[str] = []
    died = threading.Event()

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread else "?"
        deaths.append(f"{name}: {args.exc_type.__name__}: {args.exc_value}")
        died.set()

    monkeypatch.setattr(threading, "excepthook", hook)
    return deaths, died


def lingering(ran: list[str], until: threading.Event) -> Callable[[TaskContext, Any], str]:
    """A task that records it ran and lasts until ``until`` is set or MEDIUM has passed: long
    enough for ``start``'s caller to wait, and for the timer thread to trip over a deadline."""

    def task(ctx: TaskContext, p: Any) -> str:
        ran.append("a")
        until.wait(MEDIUM)
        return "done"

    return task


def run_or_refuse(attempt: Callable[[], Any], ran: list[str]) -> Any:
    """``attempt()``'s FlowResult, or None when it refused a huge timeout before anything ran
    (with a ValueError or TypeError naming the timeout, as for any bad option)."""
    try:
        return attempt()
    except (ValueError, TypeError) as exc:
        assert "timeout" in str(exc)
        assert ran == []
        return None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("budget", HUGE)
def test_a_huge_budget_is_no_limit_or_refused_up_front_in_start(
    make_executor: Callable[..., ThreadPoolExecutor], budget: float,
) -> None:
    pool = make_executor(2)
    ran: list[str] = []
    task = lingering(ran, threading.Event())
    result = run_or_refuse(
        lambda: TaskScheduling.start(fn_node(task, "a"), executor=pool, timeout=budget), ran)
    if result is not None:
        assert result.ok and result.outputs == {"a": "done"}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("budget", HUGE)
def test_a_huge_budget_is_no_limit_or_refused_up_front_in_submit(
    make_executor: Callable[..., ThreadPoolExecutor], budget: float,
    thread_deaths: tuple[list[str], threading.Event],
) -> None:
    pool = make_executor(2)
    deaths, died = thread_deaths
    ran: list[str] = []
    task = lingering(ran, died)
    future = run_or_refuse(
        lambda: TaskScheduling.submit(fn_node(task, "a"), executor=pool, timeout=budget), ran)
    if future is not None:
        result = future.result(timeout=PROMPT)
        assert result.ok and result.outputs == {"a": "done"}
    assert deaths == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", HUGE)
def test_a_huge_node_timeout_is_no_limit_or_refused_up_front(
    make_executor: Callable[..., ThreadPoolExecutor], timeout: float,
    thread_deaths: tuple[list[str], threading.Event],
) -> None:
    pool = make_executor(2)
    deaths, died = thread_deaths
    ran: list[str] = []
    task = lingering(ran, died)
    # no budget: a node timeout beyond the run's deadline would not be armed at all
    result = run_or_refuse(lambda: TaskScheduling.start(
        fn_node(task, "a", timeout=timeout), executor=pool, timeout=None), ran)
    if result is not None:
        assert result.ok and result.outputs == {"a": "done"}
    assert deaths == []


# --- a run's node passed back to start -----------------------------------------------------------


def one_node() -> list[SchedulingNode[Any, Any]]:
    return [fn_node(lambda ctx, p: 1, "a")]


def chain() -> list[SchedulingNode[Any, Any]]:
    a, b = fn_node(lambda ctx, p: 1, "a"), fn_node(lambda ctx, p: 2, "b")
    a >> b
    return [a, b]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("graph", "pick"), [(one_node, "a"), (chain, "a"), (chain, "b")],
                         ids=["single-node", "chain-root", "chain-sink"])
def test_a_runs_node_passed_back_to_start_runs_or_is_refused_clearly(
    make_executor: Callable[..., ThreadPoolExecutor],
    graph: Callable[[], list[SchedulingNode[Any, Any]]], pick: str,
) -> None:
    pool = make_executor(2)
    first = TaskScheduling.start(graph(), executor=pool, timeout=LONG)
    assert first.ok

    try:
        again = TaskScheduling.start(first[pick], executor=pool, timeout=LONG)
    except FlowDefinitionError as exc:
        # refused: a clear error that names the node and says what is wrong with it
        assert not isinstance(exc, DuplicateNameError), exc
        assert repr(pick) in str(exc)
        return
    # or accepted as the graph it was copied from
    assert again.ok and again.outputs == first.outputs


# --- names, nesting and cancellation -------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_non_string_name_set_after_construction_is_refused_before_anything_runs(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    pool = make_executor(2)
    ran: list[str] = []
    node = fn_node(lambda ctx, p: ran.append("a"), "a")

    def rename_and_run() -> None:
        node.name = 12345  # type: ignore[assignment]
        TaskScheduling.start(node, executor=pool, timeout=LONG)

    with pytest.raises((TypeError, ValueError), match="12345"):
        rename_and_run()
    assert ran == []


def _nested_on(outer_of: Callable[[ThreadPoolExecutor], Executor],
               inner_of: Callable[[ThreadPoolExecutor], Executor]) -> dict[str, Any]:
    """Start a flow on ``outer`` whose task starts another flow on ``inner`` (both built on one
    1-thread pool) and return what the nested run reported."""
    with ThreadPoolExecutor(1, thread_name_prefix="nested-one") as pool:
        outer, inner = outer_of(pool), inner_of(pool)

        def nested(ctx: TaskContext, p: Any) -> dict[str, Any]:
            res = TaskScheduling.start(fn_node(lambda c, q: "inner", "inner"), executor=inner,
                                       timeout=2 * MEDIUM)
            return {"ok": res.ok, "state": res["inner"].work_result.state}

        result = TaskScheduling.start(fn_node(nested, "outer"), executor=outer, timeout=LONG)
        assert result.ok, result["outer"].work_result.exception
        return dict(result.outputs["outer"])


def _same(pool: ThreadPoolExecutor) -> Executor:
    return pool


def _wrapped(pool: ThreadPoolExecutor) -> Executor:
    return MonitoredExecutor(pool)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("outer_of", "inner_of"), [
    pytest.param(_same, _same, id="pool-in-pool"),  # the case that already works: the control
    pytest.param(_same, _wrapped, id="monitored-in-pool"),
    pytest.param(_wrapped, _same, id="pool-in-monitored"),
    pytest.param(_wrapped, _wrapped, id="monitored-in-other-monitored"),
])
def test_a_nested_start_on_the_same_one_thread_pool_completes_through_wrappers(
    outer_of: Callable[[ThreadPoolExecutor], Executor],
    inner_of: Callable[[ThreadPoolExecutor], Executor],
) -> None:
    nested = _nested_on(outer_of, inner_of)
    assert nested == {"ok": True, "state": ResultState.SUCCESS}


def _fan_of(width: int) -> list[Any]:
    sink = fn_node(lambda ctx, p: "page", "page")
    tops = [fn_node(lambda ctx, p, k=k: k, f"b{k}") for k in range(width)]
    for top in tops:
        top >> sink
    return tops


@pytest.mark.timeout(30)
@pytest.mark.parametrize("pool_of", [
    pytest.param(lambda: ThreadPoolExecutor(1), id="stdlib"),
    pytest.param(lambda: MonitoredExecutor(ThreadPoolExecutor(1)), id="monitored"),
    pytest.param(lambda: ThreadPool.fixed(1), id="taskflow-pool"),
])
@pytest.mark.parametrize("call", ["start", "stream"])
def test_a_start_from_a_plain_task_of_the_same_one_thread_pool_runs_inline(
    pool_of: Callable[[], Executor], call: str,
) -> None:
    # no run is in progress on the calling thread (the task was submitted by hand), yet the
    # thread is the pool's only worker: the run's nodes must run on it, not wait for it (the
    # very first task of a fresh stdlib thread runs before the pool records the thread)
    pool = pool_of()
    try:
        def caller() -> tuple[Any, ...]:
            tops = _fan_of(3)
            if call == "start":
                res = TaskScheduling.start(tops, executor=pool, timeout=LONG)
            else:
                with TaskScheduling.stream(tops, executor=pool, timeout=LONG) as parts:
                    for _ in parts:
                        pass
                res = parts.result
            return res.status, res.outputs["page"]

        assert pool.submit(caller).result(timeout=LONG + 5) == (FlowStatus.COMPLETED, "page")
        # and again, now that the thread is recorded
        assert pool.submit(caller).result(timeout=LONG + 5) == (FlowStatus.COMPLETED, "page")
    finally:
        pool.shutdown(wait=True)


@pytest.mark.timeout(30)
def test_raise_for_failure_after_ctx_cancel_names_a_node_of_the_run(
    make_executor: Callable[..., ThreadPoolExecutor], gate: Callable[[], threading.Event],
) -> None:
    pool = make_executor(2)
    release = gate()

    def stop(ctx: TaskContext, p: Any) -> str:
        ctx.cancel("x")
        return "stopped"

    stopper = fn_node(stop, "stopper")
    later = fn_node(lambda ctx, p: "never", "later")
    stopper >> later
    result = TaskScheduling.start(stopper, executor=pool, timeout=LONG)
    release.set()
    assert result["later"].work_result.state is ResultState.CANCELLED

    with pytest.raises(NodeCancelledError) as info:
        result.raise_for_failure()
    err = info.value
    assert err.node in set(result), f"names {err.node!r}, not a node of the run"
    assert err.reason == "x"
    assert repr(result.flow_id) not in str(err)


# --- a winning hedged duplicate's outcome is told in the caller's contextvars ------------------


class HedgedSeesRequest(SchedulingNode[Any, str]):
    """The first attempt waits until the duplicate returned; the duplicate wins at once. The
    outcome hook records ``REQUEST_ID`` (a trace id a log line carries the same way)."""

    def __init__(self, seen: list[str | None], **kw: Any) -> None:
        super().__init__(**kw)
        self.__dict__["_seen"] = seen
        self.__dict__["_calls"] = 0
        self.__dict__["_lock"] = threading.Lock()
        self.__dict__["_dup_done"] = threading.Event()

    def task(self, ctx: TaskContext, param: Any) -> str:
        with self.__dict__["_lock"]:
            self.__dict__["_calls"] += 1
            first = self.__dict__["_calls"] == 1
        if first:
            self.__dict__["_dup_done"].wait(LONG)
            return "first"
        self.__dict__["_dup_done"].set()
        return "duplicate"

    def on_success(self, support: TaskSupport) -> None:
        self.__dict__["_seen"].append(REQUEST_ID.get(None))


@pytest.mark.timeout(30)
def test_a_winning_hedged_duplicate_is_told_in_the_callers_contextvars(
    make_executor: Callable[..., ThreadPoolExecutor],
) -> None:
    seen: list[str | None] = []
    node = HedgedSeesRequest(seen, name="price", hedge=Hedge(after=0.001), idempotent=True)
    token = REQUEST_ID.set("req-7")
    try:
        result = TaskScheduling.start(node, executor=make_executor(3), timeout=LONG)
    finally:
        REQUEST_ID.reset(token)
    assert result.outputs == {"price": "duplicate"}
    assert seen == ["req-7"]
