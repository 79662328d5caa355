"""A detached node's outcome in every view of a run: the report, the HTML page, statistics,
spans, the logs, and the detached slots in PoolMonitor and Prometheus."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, SHORT, parse_prometheus

import taskflow
from taskflow import FunctionNode, ResultState, TaskContext, TaskScheduling
from taskflow.observe.monitor import PoolMonitor
from taskflow.observe.stats import FlowStats
from taskflow.pools.threadpool import ThreadPool
from taskflow.resilience import detached
from taskflow.resilience.detached import DetachedMetrics

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="views") as p:
        yield p


def _page(release: threading.Event | None = None, fail: bool = False,
          timeout: float = LONG) -> FunctionNode:
    def audit(ctx: TaskContext, param: Any) -> str:
        if release is not None:
            assert release.wait(LONG)
        if fail:
            raise OSError("audit store down")
        return "audited"

    page = FunctionNode(lambda ctx, p: "html", name="page")
    page >> FunctionNode(audit, name="audit", detach=True, timeout=timeout)
    return page


def test_the_report_says_which_node_was_detached_and_how_it_ended(pool) -> None:
    release = threading.Event()
    result = TaskScheduling.start(_page(release), executor=pool, timeout=LONG)
    before = result.report()
    node = {n.name: n for n in before.nodes}["audit"]
    assert node.state == "DETACHED" and node.node_state == "WORKING"
    assert node.detached is not None and not node.detached.ended
    assert before.counts == {"SUCCESS": 1, "DETACHED": 1}
    assert before.ok and before.status == "COMPLETED"
    release.set()
    result.detached("audit").result(LONG)
    after = {n.name: n for n in result.report().nodes}["audit"]
    assert after.detached is not None and after.detached.ended
    assert after.detached.state == "SUCCESS" and after.detached.attempts == 1
    assert after.detached.duration is not None and after.detached.finished_at is not None
    assert result.report().model_dump_json()


def test_the_report_carries_the_error_of_a_failed_detached_node(pool) -> None:
    result = TaskScheduling.start(_page(fail=True), executor=pool, timeout=LONG)
    result.detached("audit").result(LONG)
    report = {n.name: n for n in result.report().nodes}["audit"].detached
    assert report is not None
    assert (report.state, report.error_type, report.error) == (
        "EXCEPTION", "OSError", "audit store down")


def test_the_html_page_shows_the_detached_node_running_then_ended(pool) -> None:
    release = threading.Event()
    result = TaskScheduling.start(_page(release), executor=pool, timeout=LONG)
    page = result.to_html()
    assert "DETACHED" in page and "detached: still running" in page
    release.set()
    result.detached("audit").result(LONG)
    assert "detached: ended SUCCESS in" in result.to_html()


def test_the_html_page_shows_how_a_detached_node_failed(pool) -> None:
    result = TaskScheduling.start(_page(fail=True), executor=pool, timeout=LONG)
    result.detached("audit").result(LONG)
    assert "detached: ended EXCEPTION: OSError: audit store down" in result.to_html()


def test_stats_count_the_hand_off_and_then_the_final_state(pool) -> None:
    stats = FlowStats()
    release = threading.Event()
    result = TaskScheduling.start(_page(release), executor=pool, timeout=LONG)
    stats.record_run(result, flow="page")
    nodes = {n.node: n for n in stats.snapshot().flows[0].nodes}
    assert nodes["audit"].counts == {"DETACHED": 1}
    release.set()
    result.detached("audit").result(LONG)
    nodes = {n.node: n for n in stats.snapshot().flows[0].nodes}
    assert nodes["audit"].counts == {"DETACHED": 1, "SUCCESS": 1} and nodes["audit"].runs == 1
    assert nodes["audit"].duration is not None and nodes["audit"].duration.count == 1
    assert 'state="SUCCESS"' in stats.to_prometheus()


def test_stats_enabled_record_a_detached_node_that_timed_out(pool) -> None:
    from taskflow.observe import stats as global_stats

    release = threading.Event()
    global_stats.STATS.reset()
    global_stats.enable()
    try:
        result = TaskScheduling.start(_page(release, timeout=SHORT * 2), executor=pool,
                                      timeout=LONG, name="stats-detached")
        assert result.detached("audit").result(LONG).state is ResultState.TIMEOUT
    finally:
        global_stats.disable()
        release.set()
    flows = {f.flow: f for f in global_stats.snapshot().flows}
    audit = {n.node: n for n in flows["stats-detached"].nodes}["audit"]
    assert audit.counts == {"DETACHED": 1, "TIMEOUT": 1}
    global_stats.STATS.reset()


def test_a_detached_node_logs_how_it_ended(pool, taskflow_logs) -> None:
    result = TaskScheduling.start(_page(fail=True), executor=pool, timeout=LONG)
    result.detached("audit").result(LONG)
    lines = [r for r in taskflow_logs if "detached node audit ended" in str(r["message"])]
    assert len(lines) == 1
    (line,) = lines
    assert line["level"].name == "WARNING"  # type: ignore[attr-defined]
    assert line["extra"]["flow_id"] == result.flow_id  # type: ignore[index]
    assert line["extra"]["detached"] is True  # type: ignore[index]
    assert "EXCEPTION" in str(line["message"]) and "audit store down" in str(line["message"])


def test_pool_monitor_shows_the_detached_slots_by_default() -> None:
    bound = detached.max_detached()
    taskflow.set_max_detached(1)
    release = threading.Event()
    try:
        with ThreadPool(2, name="detached-monitor") as pool:
            monitor = PoolMonitor(pool)
            first = TaskScheduling.start(_page(release), executor=pool, timeout=LONG)
            second = TaskScheduling.start(_page(release), executor=pool, timeout=LONG)
            assert second.result_of("audit").state is ResultState.EXCEPTION  # refused
            (slots,) = [m for m in monitor.sample().resilience
                        if isinstance(m, DetachedMetrics)]
            assert slots.limit == 1 and slots.running == 1 and slots.refused >= 1
            _, series = parse_prometheus(monitor.to_prometheus())
            label = (("detached", "detached"),)
            assert series[("taskflow_detached_running", label)] == 1
            assert series[("taskflow_detached_refused_total", label)] >= 1
            release.set()
            first.detached("audit").result(LONG)
            (slots,) = [m for m in monitor.sample().resilience
                        if isinstance(m, DetachedMetrics)]
            assert slots.running == 0
    finally:
        release.set()
        taskflow.set_max_detached(bound)


def test_spans_show_the_detached_node_after_the_run_span(pool) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    import taskflow.observe.otel as otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    release = threading.Event()
    try:
        result = TaskScheduling.start(_page(release), executor=pool, timeout=LONG)
        failed = TaskScheduling.start(_page(fail=True), executor=pool, timeout=LONG)
        failed.detached("audit").result(LONG)
        ended = {s.attributes["taskflow.node"] for s in exporter.get_finished_spans()
                 if s.name == "taskflow.node"
                 and s.attributes["taskflow.flow_id"] == result.flow_id}
        assert ended == {"page"}  # the run span has ended, the detached node's has not
        release.set()
        result.detached("audit").result(LONG)
    finally:
        otel.uninstrument()
        release.set()
    spans = exporter.get_finished_spans()
    runs = {s.attributes["taskflow.flow_id"]: s for s in spans if s.name == "taskflow.run"}
    audits = {s.attributes["taskflow.flow_id"]: s for s in spans
              if s.name == "taskflow.node" and s.attributes["taskflow.node"] == "audit"}
    ok, bad = audits[result.flow_id], audits[failed.flow_id]
    assert ok.attributes["taskflow.detached"] is True
    assert ok.attributes["taskflow.state"] == "SUCCESS"
    assert ok.parent is not None and ok.parent.span_id == runs[result.flow_id].context.span_id
    assert ok.end_time > runs[result.flow_id].end_time
    assert bad.attributes["taskflow.state"] == "EXCEPTION"
    assert bad.status.status_code is StatusCode.ERROR
    provider.shutdown()


def test_the_mermaid_chart_draws_a_detached_node(pool) -> None:
    result = TaskScheduling.start(_page(), executor=pool, timeout=LONG)
    result.detached("audit").result(LONG)
    assert "audit DETACHED : active" in result.to_mermaid()
