"""Executor edge cases (docs/concepts/failures.md).

An executor already shut down is refused before anything is submitted; a rejected submission,
or an executor shut down during the run, becomes that node's EXCEPTION, never a hang; no
worker ever waits for another node, so any DAG completes on a 1-worker pool; only the public
``Executor.submit``/``Future`` API is used.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from concurrent.futures import (
    BrokenExecutor,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
)

import pytest
from conftest import EPS, LONG, MEDIUM, SHORT

from taskflow import (
    FunctionNode,
    MonitoredExecutor,
    RejectedExecutionError,
    ResultState,
    TaskContext,
    TaskScheduling,
    ThreadPool,
    UpstreamFailedError,
    run_async,
)


def run_timed(nodes, **kwargs):
    t0 = time.monotonic()
    result = TaskScheduling.start(nodes, **kwargs)
    return result, time.monotonic() - t0


def states(result):
    return {name: result[name].work_result.state for name in result}


# a budget that a prompt failure must beat by far; kept short so an engine that waits it out
# costs this suite little
SPARE = 2 * MEDIUM


def chain_step(ctx, previous):
    return (ctx.result_of(previous) if previous else 0) + 1


# --- X1: already shut down -------------------------------------------------------------------


def _shut_thread_pool():
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    return pool


def _shut_taskflow_pool():
    pool = ThreadPool(1)
    pool.shutdown()
    return pool


def _shut_monitored_pool():
    pool = MonitoredExecutor(ThreadPoolExecutor(1))
    pool.shutdown()
    return pool


def _inner_shut_under_a_monitor():
    inner = ThreadPoolExecutor(1)
    inner.shutdown()
    return MonitoredExecutor(inner)


def _shut_process_pool():
    pool = ProcessPoolExecutor(1)
    pool.shutdown()
    return pool


@pytest.mark.parametrize("make", [_shut_thread_pool, _shut_taskflow_pool, _shut_monitored_pool,
                                  _inner_shut_under_a_monitor, _shut_process_pool],
                         ids=["ThreadPoolExecutor", "ThreadPool", "MonitoredExecutor",
                              "inner-shut-down", "ProcessPoolExecutor"])
@pytest.mark.parametrize("call", ["start", "submit", "run_async"])
def test_shut_down_executor_is_refused_before_anything_runs(make, call):
    pool = make()
    ran = []
    a = FunctionNode(lambda c, p: ran.append("a"), name="a")
    son = FunctionNode(lambda c, p: ran.append("son"), name="son")
    a >> son

    with pytest.raises(RejectedExecutionError) as info:
        if call == "start":
            TaskScheduling.start(a, executor=pool, timeout=SPARE)
        elif call == "submit":
            TaskScheduling.submit(a, executor=pool, timeout=SPARE)
        else:
            asyncio.run(run_async(a, executor=pool, timeout=SPARE))

    assert "is shut down" in str(info.value) and type(pool).__name__ in str(info.value)
    if make is _inner_shut_under_a_monitor:
        assert "(its ThreadPoolExecutor)" in str(info.value)
    assert "nothing was submitted" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert ran == []


def test_a_context_refused_with_a_shut_down_executor_stays_free_for_the_next_run(make_executor):
    ctx = TaskContext()
    a = FunctionNode(lambda c, p: "a", name="a")
    with pytest.raises(RejectedExecutionError):
        TaskScheduling.start(a, executor=_shut_thread_pool(), context=ctx)

    result = TaskScheduling.start(a, executor=make_executor(1), timeout=LONG, context=ctx)

    assert result.outputs == {"a": "a"}


# --- X2: shut down mid-flow ---------------------------------------------------------------------


def test_shutdown_between_two_waves_ends_the_run_promptly(make_executor, gate):
    pool = make_executor(2)
    release, started = gate(), threading.Event()

    def first(ctx, p):
        started.set()
        release.wait(LONG)
        return "first"

    a = FunctionNode(first, name="first")
    sons = [FunctionNode(lambda c, p: p, param=i, name=f"s{i}") for i in range(4)]
    a >> sons

    future = TaskScheduling.submit(a, executor=pool, timeout=SPARE)
    try:
        assert started.wait(LONG)
        pool.shutdown(wait=False)
    finally:
        release.set()
    t0 = time.monotonic()
    result = future.result(timeout=LONG)

    assert time.monotonic() - t0 < EPS
    assert result["first"].work_result.state is ResultState.SUCCESS
    # a son may run in a worker the run already holds; one that needed a new submission fails
    for son in sons:
        wr = result[son.name].work_result
        assert wr.state in (ResultState.SUCCESS, ResultState.EXCEPTION), (son.name, wr.state)
        if wr.state is ResultState.EXCEPTION:
            assert isinstance(wr.exception, RuntimeError)


def test_shutdown_with_cancel_futures_fails_the_queued_run_promptly(make_executor, gate):
    pool = make_executor(1)
    release, occupied = gate(), threading.Event()
    ran = []

    def blocker():
        occupied.set()
        release.wait(LONG)

    pool.submit(blocker)
    assert occupied.wait(LONG)
    a = FunctionNode(lambda c, p: ran.append("a"), name="a")
    b = FunctionNode(lambda c, p: ran.append("b"), name="b")
    a >> b

    future = TaskScheduling.submit(a, executor=pool, timeout=SPARE)  # its work waits in the queue
    try:
        pool.shutdown(wait=False, cancel_futures=True)
        t0 = time.monotonic()
        result = future.result(timeout=LONG)
        elapsed = time.monotonic() - t0
    finally:
        release.set()

    assert elapsed < EPS
    assert ran == []
    assert states(result) == {"a": ResultState.EXCEPTION, "b": ResultState.EXCEPTION}
    assert not result.ok, "work lost to the executor's shutdown is a failure"


def test_broken_executor_fails_the_run_promptly_and_later_runs_at_submit(make_executor):
    def broken_initializer():
        raise OSError("worker cannot start")

    pool = ThreadPoolExecutor(1, initializer=broken_initializer, thread_name_prefix="broken")
    try:
        a = FunctionNode(lambda c, p: "a", name="a")
        b = FunctionNode(lambda c, p: "b", name="b")
        a >> b
        for attempt in range(2):  # the first run breaks the pool, the second meets a broken pool
            result, elapsed = run_timed(a, executor=pool, timeout=SPARE)
            assert elapsed < EPS, attempt
            assert states(result) == {"a": ResultState.EXCEPTION, "b": ResultState.EXCEPTION}
            exc = result["a"].work_result.exception
            assert isinstance(exc, BrokenExecutor) or isinstance(exc.__cause__, BrokenExecutor), exc
    finally:
        pool.shutdown(wait=True)


# --- X3: single worker, wide and deep --------------------------------------------------------


def test_single_worker_pool_runs_a_200_wide_fan_in(make_executor):
    pool = make_executor(1, prefix="solo")
    leaves = [FunctionNode(lambda c, p: p, param=i, name=f"leaf{i}") for i in range(200)]
    join = FunctionNode(lambda c, p: sum(c.result_of(f"leaf{i}") for i in range(200)), name="join")
    leaves >> join
    root = FunctionNode(lambda c, p: "root", name="root")
    root >> leaves

    result, elapsed = run_timed(root, executor=pool, timeout=LONG)

    assert result.ok, result.failed
    assert elapsed < LONG
    assert result.outputs["join"] == sum(range(200))
    assert {result[n].work_result.thread for n in result} == {"solo_0"}, (
        "every node runs on the pool"
    )


def test_single_worker_pool_runs_a_10000_node_chain_without_recursion_error(make_executor):
    nodes = [FunctionNode(chain_step, param=None, name="n0")]
    for i in range(1, 10_000):
        node = FunctionNode(chain_step, param=f"n{i - 1}", name=f"n{i}")
        nodes[-1] >> node
        nodes.append(node)
    assert sys.getrecursionlimit() < 10_000

    result, elapsed = run_timed(nodes[0], executor=make_executor(1), timeout=LONG)

    assert result.ok, list(result.failed.items())[:3]
    assert elapsed < LONG
    assert result.outputs["n9999"] == 10_000


def test_single_worker_pool_runs_a_50_by_20_diamond_lattice(make_executor):
    width, depth = 50, 20

    def cell(ctx, fathers):
        return 1 + sum(ctx.result_of(f) for f in fathers) % 1_000_003

    layers = []
    for d in range(depth):
        fathers = [f"c{d - 1}_{j}" for j in range(width)] if d else []
        layer = [FunctionNode(cell, param=fathers, name=f"c{d}_{j}") for j in range(width)]
        if layers:
            for father in layers[-1]:
                father.set_son_handler(layer)
        layers.append(layer)

    result, elapsed = run_timed(layers[0], executor=make_executor(1), timeout=LONG)

    assert result.ok, list(result.failed.items())[:3]
    assert elapsed < LONG
    expected = 1
    for _ in range(1, depth):
        expected = 1 + (width * expected) % 1_000_003
    assert {result.outputs[f"c{depth - 1}_{j}"] for j in range(width)} == {expected}


# --- X4: nested start on the same single-worker pool -------------------------------------------


def test_nested_start_on_the_same_single_worker_pool_does_not_hang(make_executor):
    pool = make_executor(1)
    inner_budget = MEDIUM

    def outer(ctx, p):
        inner = FunctionNode(lambda c, q: "inner", name="inner")
        inner_result = TaskScheduling.start(inner, executor=pool, timeout=inner_budget)
        return inner_result["inner"].work_result.state

    result, elapsed = run_timed(FunctionNode(outer, name="outer"), executor=pool, timeout=LONG)

    assert elapsed < inner_budget + EPS
    assert result["outer"].work_result.state in (ResultState.SUCCESS, ResultState.EXCEPTION)
    assert pool.submit(lambda: "pool still works").result(timeout=LONG) == "pool still works"


# --- X5-like: executors that refuse --------------------------------------------------------------


class RefusingExecutor(Executor):
    """submit always raises the given exception."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        raise self.exc


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("cannot schedule new futures after shutdown"),
        RejectedExecutionError("queue full"),
    ],
    ids=["runtime-error", "rejected"],
)
def test_executor_whose_submit_raises_fails_nodes_promptly(exc):
    executor = RefusingExecutor(exc)
    a = FunctionNode(lambda c, p: "a", name="a")
    b = FunctionNode(lambda c, p: "b", name="b")
    a >> b

    result, elapsed = run_timed(a, executor=executor, timeout=SPARE)

    assert elapsed < EPS
    assert executor.calls >= 1
    assert states(result) == {"a": ResultState.EXCEPTION, "b": ResultState.EXCEPTION}
    wr = result["a"].work_result
    assert wr.exception is exc or wr.exception.__cause__ is exc
    assert isinstance(result["b"].work_result.exception, UpstreamFailedError)
    assert not result.ok


def test_executor_that_starts_rejecting_mid_flow_ends_promptly(make_executor):
    inner = make_executor(2)
    saturated = threading.Event()

    class Saturating(Executor):
        def submit(self, fn, /, *args, **kwargs):
            if saturated.is_set():
                raise RejectedExecutionError("saturated")
            return inner.submit(fn, *args, **kwargs)

    def first(ctx, p):
        saturated.set()  # from now on the executor refuses everything
        return "first"

    a = FunctionNode(first, name="a")
    sons = [FunctionNode(lambda c, p: p, param=i, name=f"s{i}") for i in range(6)]
    a >> sons

    result, elapsed = run_timed(a, executor=Saturating(), timeout=SPARE)

    assert elapsed < EPS
    assert result["a"].work_result.state is ResultState.SUCCESS
    # the engine may run ready sons in a worker it already holds; any son it had to submit fails
    for son in sons:
        wr = result[son.name].work_result
        assert wr.state in (ResultState.SUCCESS, ResultState.EXCEPTION), (son.name, wr.state)
        if wr.state is ResultState.EXCEPTION:
            assert isinstance(wr.exception, RejectedExecutionError)


def test_cancelled_future_from_a_discarding_executor_does_not_make_the_flow_wait():
    class Discarding(Executor):
        def submit(self, fn, /, *args, **kwargs):
            future = Future()
            future.cancel()  # DISCARD: the task is dropped and its Future cancelled
            return future

    a = FunctionNode(lambda c, p: "a", name="a")

    result, elapsed = run_timed(a, executor=Discarding(), timeout=SPARE)

    assert elapsed < EPS
    assert result["a"].work_result.state is not ResultState.SUCCESS
    assert not result.ok


def test_future_that_never_completes_times_out_by_the_deadline():
    class BlackHole(Executor):
        def submit(self, fn, /, *args, **kwargs):
            return Future()  # never run, never completed

    a = FunctionNode(lambda c, p: "a", name="a")
    budget = 4 * SHORT

    result, elapsed = run_timed(a, executor=BlackHole(), timeout=budget)

    assert budget - 0.01 <= elapsed < budget + EPS
    assert result["a"].work_result.state is ResultState.TIMEOUT


# --- X6: a submit that blocks ----------------------------------------------------------------
# The chosen bound (engine.py docstring): ``start``'s caller makes the first submissions itself,
# so a blocking first ``submit`` delays ``start`` by that long; every later submission is made
# by workers and cannot delay ``start`` past its budget.


def test_blocking_first_submit_delays_start_by_at_most_that_submit(make_executor, gate):
    inner = make_executor(2)
    unblock = gate()
    block_for = 2 * MEDIUM

    class Blocking(Executor):
        def submit(self, fn, /, *args, **kwargs):
            unblock.wait(block_for)  # a bounded queue with a blocking put, full
            return inner.submit(fn, *args, **kwargs)

    a = FunctionNode(lambda c, p: "a", name="a")
    budget = 4 * SHORT
    try:
        result, elapsed = run_timed(a, executor=Blocking(), timeout=budget)
    finally:
        unblock.set()

    assert elapsed < block_for + budget + EPS
    assert result["a"].work_result.state in (ResultState.SUCCESS, ResultState.TIMEOUT)


def test_blocking_later_submit_does_not_delay_start_past_its_budget(make_executor, gate):
    inner = make_executor(2)
    unblock = gate()
    calls = []

    class BlocksAfterFirst(Executor):
        def submit(self, fn, /, *args, **kwargs):
            calls.append(threading.current_thread().name)
            if len(calls) > 1:
                unblock.wait(2 * MEDIUM)  # saturated from now on
            return inner.submit(fn, *args, **kwargs)

    def first(ctx, p):
        time.sleep(SHORT)  # work
        return "a"

    a = FunctionNode(first, name="a")
    sons = [FunctionNode(lambda c, p: time.sleep(SHORT), name=f"s{i}") for i in range(4)]
    a >> sons
    budget = 4 * SHORT
    try:
        result, elapsed = run_timed(a, executor=BlocksAfterFirst(), timeout=budget)
    finally:
        unblock.set()

    assert elapsed < budget + EPS
    assert result["a"].work_result.state is ResultState.SUCCESS
    assert len(calls) >= 2, "the fan-out needed more than the caller's submission"
    assert calls[0] == threading.current_thread().name
    assert threading.current_thread().name not in calls[1:], "later submissions come from workers"


# --- minimal executors -------------------------------------------------------------------------


class SubmitOnly(Executor):
    """The smallest conforming executor: only ``submit`` is implemented (X9)."""

    def __init__(self, inner: ThreadPoolExecutor) -> None:
        self.inner = inner

    def submit(self, fn, /, *args, **kwargs):
        return self.inner.submit(fn, *args, **kwargs)


def test_minimal_executor_implementing_only_submit_runs_the_flow(make_executor):
    executor = SubmitOnly(make_executor(2))
    a = FunctionNode(lambda c, p: 1, name="a")
    b = FunctionNode(lambda c, p: c.result_of("a") + 1, name="b")
    c = FunctionNode(lambda c, p: c.result_of("a") + 2, name="c")
    d = FunctionNode(lambda c, p: c.result_of("b") * c.result_of("c"), name="d")
    a >> [b, c] >> d

    result = TaskScheduling.start(a, executor=executor, timeout=LONG)

    assert result.outputs == {"a": 1, "b": 2, "c": 3, "d": 6}


class InlineExecutor(Executor):
    """Runs every task in the submitting thread (a CALLER_RUNS pool at saturation)."""

    def submit(self, fn, /, *args, **kwargs):
        future = Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - a Future carries any exception
            future.set_exception(exc)
        return future


def test_inline_executor_runs_a_diamond_with_a_failure():
    a = FunctionNode(lambda c, p: 1, name="a")
    bad = FunctionNode(lambda c, p: 1 / 0, name="bad")
    ok = FunctionNode(lambda c, p: c.result_of("a") + 1, name="ok")
    d = FunctionNode(lambda c, p: "never", name="d")
    a >> [bad, ok] >> d

    result, elapsed = run_timed(a, executor=InlineExecutor(), timeout=SPARE)

    assert elapsed < EPS
    assert states(result) == {
        "a": ResultState.SUCCESS,
        "bad": ResultState.EXCEPTION,
        "ok": ResultState.SUCCESS,
        "d": ResultState.EXCEPTION,
    }
    assert isinstance(result["bad"].work_result.exception, ZeroDivisionError)


def test_inline_executor_runs_a_deep_chain_without_recursion_error():
    nodes = [FunctionNode(chain_step, param=None, name="n0")]
    for i in range(1, 3_000):
        node = FunctionNode(chain_step, param=f"n{i - 1}", name=f"n{i}")
        nodes[-1] >> node
        nodes.append(node)

    result, _elapsed = run_timed(nodes[0], executor=InlineExecutor(), timeout=LONG)

    assert result.ok, list(result.failed.items())[:3]
    assert result.outputs["n2999"] == 3_000
