"""``taskflow.otel``: the spans of runs and attempts, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

import remote_tasks
from conftest import LONG, SHORT, Flaky
from fanout_tasks import Numbers, RemoteSquares
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import taskflow.observe.otel
from taskflow import FunctionNode, TaskContext, TaskScheduling
from taskflow.engine import events


class Traces:
    def __init__(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        self.provider = provider
        self.exporter = exporter
        self.tracer = provider.get_tracer("test")

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def nodes(self, flow_id: str) -> dict[tuple[str, int], ReadableSpan]:
        """``taskflow.node`` spans of one run by (node, attempt)."""
        return {(s.attributes["taskflow.node"], s.attributes["taskflow.attempt"]): s
                for s in self.named("taskflow.node")
                if s.attributes["taskflow.flow_id"] == flow_id}

    def run(self, flow_id: str) -> ReadableSpan:
        (span,) = [s for s in self.named("taskflow.run")
                   if s.attributes["taskflow.flow_id"] == flow_id]
        return span


@pytest.fixture
def traces() -> Iterator[Traces]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    taskflow.otel.instrument(tracer_provider=provider)
    try:
        yield Traces(provider, exporter)
    finally:
        taskflow.otel.uninstrument()
        provider.shutdown()
    assert events.LISTENERS == ()


def const(ctx: Any, param: Any) -> Any:
    return param


def boom(ctx: Any, param: Any) -> None:
    raise ValueError("backend said no")


def test_nothing_is_traced_until_instrumented() -> None:
    assert not taskflow.otel.instrumented()
    assert events.LISTENERS == ()


def test_a_run_is_a_child_of_the_callers_span_with_a_span_per_node(traces: Traces) -> None:
    a = FunctionNode(const, 1, name="product")
    b = FunctionNode(const, 2, name="price")
    c = FunctionNode(boom, name="stock")
    a >> [b, c]
    with ThreadPoolExecutor(2) as pool, traces.tracer.start_as_current_span("GET /product") as req:
        result = TaskScheduling.start(a, executor=pool, timeout=LONG, name="product_detail")
    run = traces.run(result.flow_id)
    assert run.parent is not None and run.parent.span_id == req.get_span_context().span_id
    assert run.context.trace_id == req.get_span_context().trace_id
    assert run.attributes["taskflow.flow"] == "product_detail"
    assert run.attributes["taskflow.status"] == "FAILED"
    assert run.attributes["taskflow.timeout"] == LONG
    assert run.status.status_code is StatusCode.ERROR
    nodes = traces.nodes(result.flow_id)
    assert set(nodes) == {("product", 1), ("price", 1), ("stock", 1)}
    for (name, _), span in nodes.items():
        assert span.parent is not None and span.parent.span_id == run.context.span_id
        attrs = span.attributes
        assert attrs["taskflow.flow_id"] == result.flow_id
        assert attrs["taskflow.flow"] == "product_detail"
        assert attrs["taskflow.state"] == result.result_of(name).state.name
        assert attrs["taskflow.abandoned"] is False
        assert 0.0 <= attrs["taskflow.queue_wait"] < LONG
        assert run.start_time <= span.start_time <= span.end_time <= run.end_time
    stock = nodes[("stock", 1)]
    assert stock.status.status_code is StatusCode.ERROR
    (exc,) = [e for e in stock.events if e.name == "exception"]
    assert exc.attributes["exception.type"] == "ValueError"
    assert exc.attributes["exception.message"] == "backend said no"
    assert nodes[("price", 1)].status.status_code is StatusCode.UNSET


def test_spans_made_inside_a_task_are_children_of_its_node_span(traces: Traces) -> None:
    def call_backend(ctx: Any, param: Any) -> None:
        with traces.tracer.start_as_current_span("GET inventory"):
            pass

    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(FunctionNode(call_backend, name="stock"), executor=pool,
                                      timeout=LONG)
    node = traces.nodes(result.flow_id)[("stock", 1)]
    (inner,) = traces.named("GET inventory")
    assert inner.parent is not None and inner.parent.span_id == node.context.span_id


def test_each_attempt_is_a_span_and_a_retry_an_event(traces: Traces) -> None:
    node = FunctionNode(Flaky(2), name="flaky", retries=2, retry_backoff=0.01)
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok
    nodes = traces.nodes(result.flow_id)
    assert sorted(nodes) == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    first, second, third = nodes[("flaky", 1)], nodes[("flaky", 2)], nodes[("flaky", 3)]
    assert first.attributes["taskflow.state"] == "EXCEPTION"
    assert first.status.status_code is StatusCode.ERROR
    (retry,) = [e for e in first.events if e.name == "taskflow.retry"]
    assert retry.attributes["taskflow.attempt"] == 1
    assert retry.attributes["taskflow.delay"] == pytest.approx(0.01)
    assert retry.attributes["exception.message"] == "attempt 1 refused"
    assert second.attributes["taskflow.queue_wait"] >= 0.0
    assert third.attributes["taskflow.state"] == "SUCCESS"
    assert third.status.status_code is StatusCode.UNSET
    assert first.end_time <= second.start_time <= second.end_time <= third.start_time


def test_a_timed_out_attempt_ends_its_span_abandoned_at_the_timeout(traces: Traces) -> None:
    release = threading.Event()

    def stuck(ctx: Any, param: Any) -> None:
        release.wait(LONG)

    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(FunctionNode(stuck, name="stuck", timeout=SHORT),
                                      executor=pool, timeout=LONG)
        # the span ended before the thread came back, as the caller saw it
        span = traces.nodes(result.flow_id)[("stuck", 1)]
        release.set()
    assert span.attributes["taskflow.state"] == "TIMEOUT"
    assert span.attributes["taskflow.abandoned"] is True
    assert span.status.status_code is StatusCode.ERROR
    assert traces.run(result.flow_id).attributes["taskflow.status"] == "FAILED"
    assert len(traces.nodes(result.flow_id)) == 1  # the late return made no other span


def test_the_budget_ends_the_run_span_and_marks_the_nodes_it_ended(traces: Traces) -> None:
    release = threading.Event()

    def slow(ctx: Any, param: Any) -> None:
        release.wait(LONG)

    a = FunctionNode(slow, name="slow")
    a >> FunctionNode(const, name="after")
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=SHORT)
        release.set()
    run = traces.run(result.flow_id)
    assert run.attributes["taskflow.status"] == "TIMED_OUT"
    assert run.status.status_code is StatusCode.ERROR
    slow_span = traces.nodes(result.flow_id)[("slow", 1)]
    assert (slow_span.attributes["taskflow.state"], slow_span.attributes["taskflow.abandoned"]) \
        == ("TIMEOUT", True)
    ended = [e for e in run.events if e.name == "taskflow.node_ended"]
    assert [(e.attributes["taskflow.node"], e.attributes["taskflow.state"]) for e in ended] == [
        ("after", "TIMEOUT")]


def test_ctx_cancel_is_an_event_of_the_run_span(traces: Traces) -> None:
    def cancel(ctx: Any, param: Any) -> None:
        ctx.cancel("the user left")

    a = FunctionNode(cancel, name="a")
    a >> FunctionNode(const, name="b")
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=LONG)
    run = traces.run(result.flow_id)
    (cancelled,) = [e for e in run.events if e.name == "taskflow.cancelled"]
    assert cancelled.attributes == {"taskflow.reason": "the user left", "taskflow.by": "a"}
    assert run.attributes["taskflow.status"] == "CANCELLED"


def test_a_nested_run_is_a_child_of_the_node_that_started_it(traces: Traces) -> None:
    with ThreadPoolExecutor(1) as pool:
        def outer(ctx: Any, param: Any) -> Any:
            inner = FunctionNode(const, 5, name="inner")
            return TaskScheduling.start(inner, executor=pool, timeout=LONG,
                                        name="inner_flow").flow_id

        result = TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool,
                                      timeout=LONG)
    outer_span = traces.nodes(result.flow_id)[("outer", 1)]
    inner_run = traces.run(result.outputs["outer"])
    assert inner_run.parent is not None
    assert inner_run.parent.span_id == outer_span.context.span_id
    assert inner_run.context.trace_id == outer_span.context.trace_id
    assert traces.nodes(result.outputs["outer"])[("inner", 1)].parent.span_id == (
        inner_run.context.span_id)



def test_fan_out_items_run_under_their_node_span(traces: Traces) -> None:
    seen: list[int] = []

    class Traced(Numbers):
        def work(self, ctx: Any, item: int) -> int:
            seen.append(trace.get_current_span().get_span_context().span_id)
            return super().work(ctx, item)

    with ThreadPoolExecutor(3) as pool:
        result = TaskScheduling.start(Traced(4, name="fan", policy="best_effort"),
                                      executor=pool, timeout=LONG)
    span = traces.nodes(result.flow_id)[("fan", 1)]
    assert set(seen) == {span.context.span_id}
    (failed,) = [e for e in span.events if e.name == "taskflow.item_failed"]
    assert failed.attributes["taskflow.item"] == 2
    assert failed.attributes["exception.message"] == "item 2 is corrupt"


def test_submit_ends_every_span_before_the_future_resolves(traces: Traces) -> None:
    with ThreadPoolExecutor(2) as pool:
        ctx = TaskContext()
        with traces.tracer.start_as_current_span("job") as job:
            future = TaskScheduling.submit(FunctionNode(const, 1, name="a"), executor=pool,
                                           timeout=LONG, context=ctx)
        result = future.result(LONG)
    run = traces.run(result.flow_id)
    assert run.parent is not None and run.parent.span_id == job.get_span_context().span_id
    assert set(traces.nodes(result.flow_id)) == {("a", 1)}



def test_remote_attempts_are_spans_seen_from_the_caller(traces: Traces, tmp_path: Any,
                                                        spawn_pool: ProcessPoolExecutor) -> None:
    flaky = FunctionNode(remote_tasks.fail_first_attempts, (str(tmp_path / "n"), 1),
                         name="flaky", retries=1)
    bad = FunctionNode(remote_tasks.fail, "remote no", name="bad")
    fan = RemoteSquares(8, name="squares", policy="best_effort")
    flaky >> [fan, bad]
    with traces.tracer.start_as_current_span("caller") as caller:
        result = TaskScheduling.start(flaky, executor=spawn_pool, timeout=LONG)
        # the caller's own context was not changed by the spans of remote attempts
        assert trace.get_current_span() is caller
    nodes = traces.nodes(result.flow_id)
    assert set(nodes) == {("flaky", 1), ("flaky", 2), ("squares", 1), ("bad", 1)}
    assert nodes[("flaky", 1)].attributes["taskflow.state"] == "EXCEPTION"
    assert nodes[("flaky", 2)].attributes["taskflow.state"] == "SUCCESS"
    assert nodes[("bad", 1)].status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in nodes[("bad", 1)].events
            if e.name == "exception"] == ["ValueError"]
    failed = [e.attributes["taskflow.item"] for e in nodes[("squares", 1)].events
              if e.name == "taskflow.item_failed"]
    assert failed == ["item-007"]
    run = traces.run(result.flow_id)
    assert run.parent is not None and run.parent.span_id == caller.get_span_context().span_id


def test_uninstrument_stops_tracing(traces: Traces) -> None:
    taskflow.otel.uninstrument()
    assert not taskflow.otel.instrumented()
    with ThreadPoolExecutor(2) as pool:
        TaskScheduling.start(FunctionNode(const, 1, name="a"), executor=pool, timeout=LONG)
    assert traces.spans() == []


def test_a_hedge_told_by_the_engine_is_an_event_of_the_node_span(traces: Traces) -> None:
    # how the resilience code tells observers that it started a duplicate attempt
    from taskflow.model.context import current

    def hedged(ctx: Any, param: Any) -> str:
        run = current.run
        events.event(run.observers, current.idx, "hedge", {"attempt": 2, "after": 0.05})
        return "ok"

    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(FunctionNode(hedged, name="stock"), executor=pool,
                                      timeout=LONG)
    span = traces.nodes(result.flow_id)[("stock", 1)]
    (hedge,) = [e for e in span.events if e.name == "taskflow.hedge"]
    assert dict(hedge.attributes) == {"taskflow.attempt": 2, "taskflow.after": 0.05}


def test_a_hedged_node_has_a_hedge_event_on_its_span(traces: Traces) -> None:
    from taskflow import Hedge

    second = threading.Event()
    calls: list[int] = []
    lock = threading.Lock()

    def slow_then_fast(ctx: Any, param: Any) -> str:
        with lock:
            calls.append(1)
            n = len(calls)
        if n == 1:
            second.wait(LONG)  # the first attempt is slow until its hedge came
            return "first"
        second.set()
        return "hedge"

    node = FunctionNode(slow_then_fast, name="stock", hedge=Hedge(after=SHORT / 5),
                        idempotent=True)
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok
    span = traces.nodes(result.flow_id)[("stock", 1)]
    (hedge,) = [e for e in span.events if e.name == "taskflow.hedge"]
    assert hedge.attributes["taskflow.attempt"] == 1  # the first duplicate
    assert span.attributes["taskflow.state"] == "SUCCESS"
