"""Fallbacks, min_budget and circuit breakers in runs: how the engine applies them."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import LONG, SHORT

from taskflow import (
    CircuitBreaker,
    CircuitOpenError,
    FallbackError,
    FunctionNode,
    NodeTimeoutError,
    ResultState,
    SchedulingNode,
    TaskScheduling,
    UpstreamFailedError,
)
from taskflow.model.result import FlowStatus


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4, thread_name_prefix="res-test") as p:
        yield p


def boom(ctx, param):
    raise ValueError("backend down")


def page(ctx, param):
    return {"reco": ctx.result_of("reco")}


def test_fallback_degrades_and_sons_run_on_its_value(pool):
    seen = []
    reco = FunctionNode(boom, name="reco", fallback=lambda ctx, error: seen.append(error) or [])
    pg = FunctionNode(page, name="page")
    reco >> pg
    result = TaskScheduling.start(pg, executor=pool, timeout=LONG)
    assert result.ok and result.status is FlowStatus.COMPLETED_WITH_ERRORS
    assert result.outputs == {"reco": [], "page": {"reco": []}}
    wr = result.result_of("reco")
    assert wr.state is ResultState.DEGRADED and isinstance(wr.exception, ValueError)
    assert list(result.degraded) == ["reco"] and isinstance(seen[0], ValueError)
    assert not result.failed


def test_plain_value_fallback_none_is_a_value(pool):
    node = FunctionNode(boom, name="reco", fallback=None)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.result_of("reco").state is ResultState.DEGRADED
    assert result.outputs == {"reco": None}


def test_raising_fallback_leaves_exception_with_both_errors(pool):
    def fb(ctx, error):
        raise KeyError("no stand-in")

    node = FunctionNode(boom, name="reco", fallback=fb)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    wr = result.result_of("reco")
    assert wr.state is ResultState.EXCEPTION and result.status is FlowStatus.FAILED
    assert isinstance(wr.exception, FallbackError)
    assert isinstance(wr.exception.error, ValueError)
    assert isinstance(wr.exception.__cause__, KeyError)
    assert wr.exception.__cause__.__context__ is wr.exception.error


def test_son_of_failed_father_degrades_with_its_fallback(pool):
    ran = []
    father = FunctionNode(boom, name="father")
    son = FunctionNode(lambda ctx, p: ran.append(1), name="son", fallback="stand-in")
    grandson = FunctionNode(lambda ctx, p: ctx.result_of("son") + "!", name="grandson")
    father >> son >> grandson
    result = TaskScheduling.start(father, executor=pool, timeout=LONG)
    assert not ran
    wr = result.result_of("son")
    assert wr.state is ResultState.DEGRADED
    assert isinstance(wr.exception, UpstreamFailedError)
    assert isinstance(wr.exception.__cause__, ValueError)
    assert result.outputs["grandson"] == "stand-in!"


def test_node_timeout_degrades_and_runs_on_fail_not_on_success(pool):
    release = threading.Event()
    calls = []

    class Slow(SchedulingNode):
        def task(self, ctx, param):
            release.wait(LONG)
            return "late"

        def on_success(self, support):
            calls.append("success")

        def on_fail(self, support):
            calls.append(("fail", support.work_result.state))

    node = Slow(name="slow", timeout=SHORT, fallback=lambda ctx, error: type(error).__name__)
    try:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    finally:
        release.set()
    wr = result.result_of("slow")
    assert wr.state is ResultState.DEGRADED and wr.result == "NodeTimeoutError"
    assert isinstance(wr.exception, NodeTimeoutError)
    assert calls == [("fail", ResultState.DEGRADED)]


def test_run_deadline_records_the_fallback_value(pool):
    release = threading.Event()
    node = FunctionNode(lambda ctx, p: release.wait(LONG), name="slow",
                        fallback=lambda ctx, error: {"stock": None})
    plain = FunctionNode(lambda ctx, p: release.wait(LONG), name="plain")
    try:
        result = TaskScheduling.start([node, plain], executor=pool, timeout=SHORT)
    finally:
        release.set()
    assert result.status is FlowStatus.TIMED_OUT
    assert result.result_of("slow").state is ResultState.DEGRADED
    assert result.outputs["slow"] == {"stock": None}
    assert result.result_of("plain").state is ResultState.TIMEOUT


def test_min_budget_refuses_to_start(pool):
    ran = []
    node = FunctionNode(lambda ctx, p: ran.append(1), name="late", min_budget=LONG)
    result = TaskScheduling.start(node, executor=pool, timeout=1.0)
    wr = result.result_of("late")
    assert not ran and wr.state is ResultState.TIMEOUT and wr.attempts == 0
    assert "min_budget" in " ".join(getattr(wr.exception, "__notes__", ["min_budget"]))
    with_fallback = FunctionNode(lambda ctx, p: ran.append(1), name="late", min_budget=LONG,
                                 fallback=0)
    result = TaskScheduling.start(with_fallback, executor=pool, timeout=1.0)
    assert result.result_of("late").state is ResultState.DEGRADED and not ran
    enough = FunctionNode(lambda ctx, p: 1, name="ok", min_budget=0.01)
    assert TaskScheduling.start(enough, executor=pool, timeout=LONG).outputs == {"ok": 1}


def test_open_breaker_fails_at_once_without_running(pool):
    breaker = CircuitBreaker("inventory", failure_ratio=0.5, window=2, min_calls=2, open_for=60)
    ran = []

    def call(ctx, param):
        ran.append(1)
        raise ValueError("down")

    for _ in range(2):
        TaskScheduling.start(FunctionNode(call, name="stock", breaker=breaker), executor=pool,
                             timeout=LONG)
    assert breaker.state.value == "open" and len(ran) == 2
    result = TaskScheduling.start(FunctionNode(call, name="stock", breaker=breaker,
                                               fallback={"in_stock": None}),
                                  executor=pool, timeout=LONG)
    wr = result.result_of("stock")
    assert len(ran) == 2 and wr.state is ResultState.DEGRADED
    assert isinstance(wr.exception, CircuitOpenError)
    result = TaskScheduling.start(FunctionNode(call, name="stock", breaker=breaker),
                                  executor=pool, timeout=LONG)
    assert isinstance(result.result_of("stock").exception, CircuitOpenError)


def test_breaker_counts_successes_and_node_timeouts(pool):
    breaker = CircuitBreaker("b", failure_ratio=1.0, window=2, min_calls=2, open_for=60)
    release = threading.Event()
    ok = FunctionNode(lambda ctx, p: 1, name="ok", breaker=breaker)
    TaskScheduling.start(ok, executor=pool, timeout=LONG)
    assert breaker.metrics().successes == 1
    slow = FunctionNode(lambda ctx, p: release.wait(LONG), name="slow", breaker=breaker,
                        timeout=SHORT)
    try:
        TaskScheduling.start(slow, executor=pool, timeout=LONG)
    finally:
        release.set()
    assert breaker.metrics().failures == 1


def test_breaker_records_each_retry(pool):
    breaker = CircuitBreaker("r", failure_ratio=1.0, window=10, min_calls=10, open_for=60)
    node = FunctionNode(boom, name="flaky", breaker=breaker, retries=2)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.result_of("flaky").attempts == 3
    assert breaker.metrics().failures == 3
