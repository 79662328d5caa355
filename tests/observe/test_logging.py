"""taskflow's log lines as loguru asks of a library: off until enabled, per-node DEBUG lines opt-in,
``flow_id``/``flow``/``node`` on every line of a run, the caller's ``contextualize()`` values on
lines written on worker threads, tracebacks as text."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG
from loguru import logger

from taskflow import FunctionNode, TaskScheduling, logs


def ok(ctx: Any, param: Any) -> int:
    return 1


def failing(ctx: Any, param: Any) -> None:
    password = "hunter2-in-a-local"
    raise ValueError(f"backend refused ({len(password)} chars)")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="log-test") as ex:
        yield ex


@pytest.fixture
def lines() -> Iterator[list[dict[str, Any]]]:
    """taskflow enabled, a DEBUG sink (loguru's default level) collecting records."""
    out: list[dict[str, Any]] = []
    sink = logger.add(lambda m: out.append(m.record), level="DEBUG", format="{message}")
    logger.enable("taskflow")
    try:
        yield out
    finally:
        logger.disable("taskflow")
        logger.remove(sink)


def flow(pool: ThreadPoolExecutor) -> Any:
    a = FunctionNode(ok, name="product")
    a >> [FunctionNode(ok, name="price"), FunctionNode(failing, name="stock")]
    return TaskScheduling.start(a, executor=pool, timeout=LONG, name="product_detail")


def test_nothing_is_written_until_taskflow_is_enabled(pool: ThreadPoolExecutor) -> None:
    out: list[Any] = []
    sink = logger.add(lambda m: out.append(m.record), level="DEBUG", format="{message}")
    try:
        flow(pool)
    finally:
        logger.remove(sink)
    assert [r for r in out if r["name"].startswith("taskflow")] == []


def test_enabled_a_run_writes_only_its_failures_unless_node_lines_are_asked_for(
        pool: ThreadPoolExecutor, lines: list[dict[str, Any]]) -> None:
    assert not logs.logging_nodes()
    result = flow(pool)
    mine = [r for r in lines if r["extra"].get("flow_id") == result.flow_id]
    assert [(r["level"].name, r["extra"]["node"]) for r in mine] == [("WARNING", "stock")]
    logs.log_nodes()
    try:
        assert logs.logging_nodes()
        result = flow(pool)
    finally:
        logs.log_nodes(False)
    mine = [r for r in lines if r["extra"].get("flow_id") == result.flow_id]
    debug = [r for r in mine if r["level"].name == "DEBUG"]
    assert {r["extra"]["node"] for r in debug} == {"product", "price", "stock", None}
    assert any(r["message"] == "node price attempt 1 started" for r in debug)


def test_every_line_of_a_run_carries_flow_id_flow_and_node(
        pool: ThreadPoolExecutor, lines: list[dict[str, Any]], node_lines: None) -> None:
    result = flow(pool)
    mine = [r for r in lines if r["extra"].get("flow_id") == result.flow_id]
    assert len(mine) > 6
    for r in mine:
        assert r["extra"]["flow"] == "product_detail"
        assert "node" in r["extra"]
    finished = [r for r in mine if r["message"].startswith("flow finished")]
    assert [r["extra"]["node"] for r in finished] == [None]


def test_the_callers_contextualized_values_reach_lines_written_on_worker_threads(
        pool: ThreadPoolExecutor, lines: list[dict[str, Any]], node_lines: None) -> None:
    with logger.contextualize(trace_id="4bf92f3577b34da6"):
        result = flow(pool)
    mine = [r for r in lines if r["extra"].get("flow_id") == result.flow_id]
    on_workers = [r for r in mine if r["thread"].name.startswith("log-test")]
    assert on_workers, "no line was written on a worker thread"
    assert {r["extra"].get("trace_id") for r in mine} == {"4bf92f3577b34da6"}
    (warning,) = [r for r in mine if r["level"].name == "WARNING"]
    assert warning["thread"].name.startswith("log-test")


def test_a_failure_is_logged_with_its_traceback_as_text_and_no_variables(
        pool: ThreadPoolExecutor) -> None:
    buf = io.StringIO()
    # loguru's defaults for a sink: backtrace and diagnose on
    sink = logger.add(buf, level="DEBUG", format="{message}\n{exception}", backtrace=True,
                      diagnose=True)
    records: list[Any] = []
    probe = logger.add(lambda m: records.append(m.record), level="WARNING")
    logger.enable("taskflow")
    try:
        flow(pool)
    finally:
        logger.disable("taskflow")
        logger.remove(sink)
        logger.remove(probe)
    text = buf.getvalue()
    assert "node stock ended EXCEPTION: ValueError('backend refused (18 chars)')" in text
    assert "Traceback (most recent call last)" in text
    assert 'raise ValueError(f"backend refused ({len(password)} chars)")' in text
    assert "hunter2" not in text
    assert all(r["exception"] is None for r in records)


def test_the_production_setting_writes_one_json_object_per_line(pool: ThreadPoolExecutor) -> None:
    buf = io.StringIO()
    sink = logger.add(buf, level="INFO", serialize=True)
    logger.enable("taskflow")
    try:
        with logger.contextualize(trace_id="t-1"):
            result = flow(pool)
    finally:
        logger.disable("taskflow")
        logger.remove(sink)
    (line,) = [json.loads(x) for x in buf.getvalue().splitlines()]
    extra = line["record"]["extra"]
    assert extra == {"flow_id": result.flow_id, "flow": "product_detail", "node": "stock",
                     "trace_id": "t-1"}
    assert line["record"]["level"]["name"] == "WARNING"


def test_a_node_that_overran_its_timeout_and_then_returned_logs_no_late_exception(
        lines: list[dict[str, Any]]) -> None:
    # regression: the late return of a node cut by its own timeout was logged as
    # "late exception from abandoned node ... dropped: NodeTimeoutError" (the task raised nothing)
    import threading

    release = threading.Event()

    def slow(ctx: Any, param: Any) -> str:
        release.wait(LONG)
        return "late value"

    def boom(ctx: Any, param: Any) -> None:
        release.wait(LONG)
        raise ValueError("raised after the timeout")

    with ThreadPoolExecutor(2, thread_name_prefix="log-late") as ex:
        quiet = FunctionNode(slow, name="quiet", timeout=0.05)
        loud = FunctionNode(boom, name="loud", timeout=0.05)
        result = TaskScheduling.start([quiet, loud], executor=ex, timeout=LONG)
        release.set()
        assert {n: w.state.name for n, w in result.failed.items()} == {
            "quiet": "TIMEOUT", "loud": "TIMEOUT"}
    # the pool has shut down: both late outcomes have been handled
    late = [r["message"] for r in lines if "late" in r["message"]]
    assert not any("quiet" in m for m in late if "exception" in m)
    assert any("loud" in m and "ValueError" in m for m in late)


def _fresh(code: str) -> str:
    import subprocess
    import sys
    import textwrap

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_loguru_imported_after_taskflow_finds_it_disabled_until_enabled() -> None:
    # import taskflow leaves loguru unimported; whenever the program imports it, taskflow is
    # disabled in it at once, and logger.enable("taskflow") turns its lines on as before
    out = _fresh("""
        import sys
        from concurrent.futures import ThreadPoolExecutor
        import taskflow
        assert "loguru" not in sys.modules
        def boom(ctx, p):
            raise ValueError("boom")
        node = taskflow.FunctionNode(boom, name="b")
        with ThreadPoolExecutor(1) as pool:
            taskflow.TaskScheduling.start(node, executor=pool)  # nothing can listen yet
            import loguru
            from loguru import logger
            assert type(loguru.__spec__.loader).__module__ != "taskflow.logs"  # its own loader
            records = []
            logger.remove()
            logger.add(records.append, level="TRACE")
            taskflow.TaskScheduling.start(node, executor=pool)
            assert records == [], records
            logger.enable("taskflow")
            taskflow.TaskScheduling.start(node, executor=pool)
            assert any("boom" in str(r) for r in records), records
        print("OK")
        """)
    assert out == "OK"


def test_taskflows_logger_is_silent_before_loguru_and_loguru_after() -> None:
    out = _fresh("""
        import sys
        from taskflow import logs
        assert logs.loguru_logger() is None
        logs.logger.opt(exception=True).bind(node="x").warning("nobody listens {}", 1)
        with logs.logger.contextualize(a=1):
            pass
        from loguru import logger
        assert logs.loguru_logger() is logger
        assert logs.logger.bind.__self__ is logger
        print("OK")
        """)
    assert out == "OK"
