"""Deadlines in and out: ``budget_from_headers`` reads what a gateway or a gRPC caller sends,
``ctx.deadline_headers()`` writes the same three headers, and the two agree."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import MEDIUM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loguru import logger

import taskflow
from taskflow import (
    BudgetExhaustedError,
    FlowDefinitionError,
    FunctionNode,
    TaskContext,
    TaskScheduling,
    budget_from_headers,
)
from taskflow.errors import InvalidArgumentError, TaskflowError
from taskflow.model import deadlines


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """taskflow's WARNING lines, with the once-per-process memory of malformed headers reset."""
    out: list[str] = []
    sink = logger.add(lambda m: out.append(m.record["message"]), level="WARNING",
                      format="{message}")
    logger.enable("taskflow")
    saved = set(deadlines._WARNED)
    deadlines._WARNED.clear()
    try:
        yield out
    finally:
        logger.disable("taskflow")
        logger.remove(sink)
        deadlines._WARNED.clear()
        deadlines._WARNED.update(saved)


def epoch_ms(seconds_from_now: float) -> str:
    return str(int((time.time() + seconds_from_now) * 1000))


@pytest.mark.parametrize(("value", "seconds"), [
    ("250m", 0.25), ("1S", 1.0), ("2M", 120.0), ("1H", 3600.0), ("300000u", 0.3),
    ("5000000n", 0.005), ("99999999m", 99999.999), (" 40m ", 0.04), ("0n", 0.0),
])
def test_grpc_timeout_is_read_in_every_unit(value: str, seconds: float) -> None:
    assert budget_from_headers({"grpc-timeout": value}, None) == pytest.approx(seconds)


def test_the_smaller_of_the_default_and_the_callers_deadline_wins() -> None:
    assert budget_from_headers({"grpc-timeout": "2S"}, 0.3) == pytest.approx(0.3)
    assert budget_from_headers({"grpc-timeout": "100m"}, 0.3) == pytest.approx(0.1)
    assert budget_from_headers({}, 0.3) == pytest.approx(0.3)
    assert budget_from_headers({}, None) is None


def test_the_smallest_of_several_headers_is_the_callers_deadline() -> None:
    headers = {"grpc-timeout": "900m", "x-envoy-expected-rq-timeout-ms": "150",
               "X-Request-Deadline": epoch_ms(0.6)}
    assert budget_from_headers(headers, 5.0) == pytest.approx(0.15)


def test_envoy_milliseconds_and_an_epoch_deadline_are_read() -> None:
    assert budget_from_headers({"x-envoy-expected-rq-timeout-ms": "250"}, 1.0) == 0.25
    got = budget_from_headers({"X-Request-Deadline": epoch_ms(0.5)}, 1.0)
    assert got is not None and 0.4 < got <= 0.5


def test_reserve_is_taken_off_and_the_budget_never_goes_negative() -> None:
    assert budget_from_headers({"grpc-timeout": "200m"}, 1.0, reserve=0.05) == pytest.approx(0.15)
    assert budget_from_headers({"grpc-timeout": "20m"}, 1.0, reserve=0.05) == 0.0
    assert budget_from_headers({}, 0.3, reserve=0.1) == pytest.approx(0.2)


def test_a_deadline_already_past_gives_zero_and_start_then_runs_nothing() -> None:
    budget = budget_from_headers({"X-Request-Deadline": epoch_ms(-5.0)}, 0.3)
    assert budget == 0.0
    calls: list[str] = []

    class Spy(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            calls.append("submit")
            return super().submit(*args, **kwargs)

    with Spy(1) as pool:
        result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="page"), executor=pool,
                                      timeout=budget)
    assert result.status is taskflow.FlowStatus.TIMED_OUT
    assert result["page"].work_result.state is taskflow.ResultState.TIMEOUT
    assert calls == []


def test_header_names_are_case_insensitive() -> None:
    for name in ("GRPC-TIMEOUT", "Grpc-Timeout", "grpc-timeout"):
        assert budget_from_headers({name: "100m"}, 1.0) == pytest.approx(0.1)
    assert budget_from_headers({"X-ENVOY-EXPECTED-RQ-TIMEOUT-MS": "70"}, 1.0) == 0.07
    assert budget_from_headers({"x-request-deadline": epoch_ms(0.2)}, 1.0) <= 0.2  # type: ignore[operator]


def test_flask_werkzeug_and_django_headers_and_a_wsgi_environ_are_read() -> None:
    from django.http.request import HttpHeaders
    from werkzeug.datastructures import EnvironHeaders, Headers

    werkzeug = Headers([("Grpc-Timeout", "120m")])
    assert budget_from_headers(werkzeug, 1.0) == pytest.approx(0.12)
    environ = {"REQUEST_METHOD": "GET", "wsgi.version": (1, 0),
               "HTTP_X_ENVOY_EXPECTED_RQ_TIMEOUT_MS": "90", "HTTP_GRPC_TIMEOUT": "1S"}
    assert budget_from_headers(EnvironHeaders(environ), 1.0) == pytest.approx(0.09)
    assert budget_from_headers(environ, 1.0) == pytest.approx(0.09)
    django = HttpHeaders({"HTTP_GRPC_TIMEOUT": "80m", "CONTENT_TYPE": "text/plain"})
    assert budget_from_headers(django, 1.0) == pytest.approx(0.08)


def test_a_plain_dict_with_environ_like_names_is_not_taken_for_an_environ() -> None:
    # without wsgi.version or REQUEST_METHOD, HTTP_GRPC_TIMEOUT is just an unknown header
    assert budget_from_headers({"HTTP_GRPC_TIMEOUT": "10m"}, 1.0) == 1.0


@pytest.mark.parametrize(("name", "value"), [
    ("grpc-timeout", "250"), ("grpc-timeout", "123456789m"), ("grpc-timeout", "1.5S"),
    ("grpc-timeout", "-1S"), ("grpc-timeout", "10s"), ("x-envoy-expected-rq-timeout-ms", "abc"),
    ("x-envoy-expected-rq-timeout-ms", "-5"), ("X-Request-Deadline", "1700000000"),
    ("X-Request-Deadline", "soon"),
])
def test_a_malformed_header_is_ignored_and_logged(warnings: list[str], name: str,
                                                  value: str) -> None:
    assert budget_from_headers({name: value}, 0.3) == pytest.approx(0.3)
    assert len(warnings) == 1 and name in warnings[0] and "malformed" in warnings[0]


def test_a_malformed_header_is_logged_once_per_name_in_the_process(warnings: list[str]) -> None:
    for _ in range(3):
        budget_from_headers({"grpc-timeout": "nope", "x-envoy-expected-rq-timeout-ms": "x"}, 0.3)
    assert len(warnings) == 2
    assert sum("grpc-timeout" in w for w in warnings) == 1


def test_a_good_header_still_counts_beside_a_malformed_one(warnings: list[str]) -> None:
    headers = {"grpc-timeout": "garbage", "x-envoy-expected-rq-timeout-ms": "40"}
    assert budget_from_headers(headers, 1.0) == pytest.approx(0.04)


def test_a_long_malformed_value_is_cut_in_the_log(warnings: list[str]) -> None:
    budget_from_headers({"grpc-timeout": "x" * 5000}, 0.3)
    assert len(warnings[0]) < 300


@pytest.mark.parametrize("bad", ["grpc-timeout: 1S", b"raw", [("grpc-timeout", "1S")], 42, None])
def test_a_non_mapping_is_refused_with_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="mapping of request headers") as info:
        budget_from_headers(bad, 0.3)
    assert isinstance(info.value, InvalidArgumentError) and isinstance(info.value, TaskflowError)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"default": -1.0}, "default must be non-negative"),
    ({"default": 0.3, "reserve": -0.1}, "reserve must be non-negative"),
    ({"default": float("nan")}, "default must be non-negative"),
])
def test_bad_numbers_are_refused_naming_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(FlowDefinitionError, match=match):
        budget_from_headers({}, **kwargs)
    with pytest.raises(TypeError, match="default must be a number"):
        budget_from_headers({}, "0.3")


def test_deadline_headers_are_empty_outside_a_node() -> None:
    ctx = TaskContext()
    assert ctx.deadline_headers() == {}
    assert ctx.timeout() is None and ctx.timeout(cap=0.2) == 0.2


def test_a_nodes_headers_carry_its_time_left_in_all_three_formats() -> None:
    seen: dict[str, Any] = {}

    def call(ctx: TaskContext, param: Any) -> None:
        seen["headers"] = ctx.deadline_headers()
        seen["timeout"] = ctx.timeout()

    with ThreadPoolExecutor(1) as pool:
        TaskScheduling.start(FunctionNode(call, name="call"), executor=pool, timeout=MEDIUM)
    headers = seen["headers"]
    assert set(headers) == {"grpc-timeout", "x-envoy-expected-rq-timeout-ms", "X-Request-Deadline"}
    back = budget_from_headers(headers, None)
    assert back is not None and 0 < back <= MEDIUM
    assert int(headers["x-envoy-expected-rq-timeout-ms"]) <= MEDIUM * 1000 + 1


def test_headers_in_a_node_with_no_deadline_are_empty() -> None:
    seen: dict[str, Any] = {}

    def call(ctx: TaskContext, param: Any) -> None:
        seen["headers"] = ctx.deadline_headers()
        seen["capped"] = ctx.deadline_headers(cap=0.5)

    with ThreadPoolExecutor(1) as pool:
        TaskScheduling.start(FunctionNode(call, name="call"), executor=pool, timeout=None)
    assert seen["headers"] == {}
    capped = seen["capped"]
    # The relative headers carry the cap exactly; the absolute deadline was 0.5 s ahead of the
    # moment it was written, so read back later it can only have shrunk.
    assert capped["x-envoy-expected-rq-timeout-ms"] == "500"
    assert capped["grpc-timeout"] == "500000u"
    back = budget_from_headers(capped, None)
    assert back is not None and 0 < back <= 0.5


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(min_value=1e-6, max_value=30 * 86400.0, allow_nan=False))
def test_headers_written_for_any_budget_read_back_within_rounding(seconds: float) -> None:
    headers = deadlines.deadline_headers_for(seconds)
    value, unit = headers["grpc-timeout"][:-1], headers["grpc-timeout"][-1]
    assert len(value) <= 8 and unit in "HMSmun"
    grpc = deadlines.parse_header("grpc-timeout", headers["grpc-timeout"])
    envoy = deadlines.parse_header("x-envoy-expected-rq-timeout-ms",
                                   headers["x-envoy-expected-rq-timeout-ms"])
    # each rounded up to its unit: never less than the budget, at most one unit more
    unit_size = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "S": 1.0, "M": 60.0, "H": 3600.0}[unit]
    assert seconds - 1e-9 <= grpc <= seconds + unit_size + 1e-9
    assert seconds - 1e-9 <= envoy <= seconds + 0.001 + 1e-9
    # the epoch deadline is rounded down, and read a little later on a wall clock
    read = budget_from_headers(headers, None)
    assert read is not None and seconds - 0.002 - MEDIUM <= read <= seconds + 0.002


def test_budget_exhausted_is_a_timeout_error_naming_the_node() -> None:
    err = BudgetExhaustedError("price", "ab12", "its deadline passed 0.010s ago")
    assert isinstance(err, TimeoutError) and isinstance(err, TaskflowError)
    assert "'price'" in str(err) and "ab12" in str(err)


def test_ctx_timeout_refuses_a_cap_that_is_not_positive() -> None:
    ctx = TaskContext()
    with pytest.raises(FlowDefinitionError, match="cap must be positive"):
        ctx.timeout(cap=0)
    with pytest.raises(TypeError, match="cap must be a number"):
        ctx.timeout(cap="1")  # type: ignore[arg-type]

