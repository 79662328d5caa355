"""A secret in the run's context is absent from every page, report and log line by default
(secrets are redacted at every exit), and shown where it is asked for.

The runs: one that fails (an exception, a node failed fast after it, a retried node, a node
timed out, a hook that raises) and one that succeeds, both with ``Bearer <secret>`` in their
``TaskContext`` and tasks that read it. What is checked: ``report()`` and its JSON,
``to_html()``, ``to_mermaid()``, the web app's pages (index, run pages, ``/metrics``,
``/stats.json``), and every log record of the ``taskflow`` logger at DEBUG (message, ``extra``
and exception), collected by a sink.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from loguru import logger

from taskflow import (
    FlowResult,
    FunctionNode,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    TaskSupport,
    logs,
)
from taskflow.observe.stats import FlowStats
from taskflow.observe.web import make_app

SECRET = "s3cr3t-bearer-9f2e"
KEY = "authorization"

werkzeug_test = pytest.importorskip("werkzeug.test")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="trust-secrets") as ex:
        yield ex


def _collect(diagnose: bool) -> Iterator[list[str]]:
    seen: list[str] = []

    def sink(message: Any) -> None:
        record = message.record
        exc = record["exception"]
        seen.append(" | ".join([record["message"], repr(record["extra"]), str(message),
                                repr(exc.value) if exc is not None else ""]))

    sink_id = logger.add(sink, level="DEBUG", format="{message} {extra} {exception}",
                         diagnose=diagnose)
    logger.enable("taskflow")
    logs.log_nodes()  # every line taskflow can write, per-node DEBUG lines included
    try:
        yield seen
    finally:
        logs.log_nodes(False)
        logger.disable("taskflow")
        logger.remove(sink_id)


@pytest.fixture
def records() -> Iterator[list[str]]:
    """Every record the ``taskflow`` logger emits at DEBUG, as text: message, extra, exception
    with its traceback, from a sink set up as loguru advises for production (``diagnose=False``:
    no variable values in tracebacks)."""
    yield from _collect(diagnose=False)


def _read(ctx: TaskContext, param: object) -> int:
    return len(ctx[KEY])  # the task uses the secret; its result does not carry it


def _fail(ctx: TaskContext, param: object) -> None:
    assert ctx[KEY].startswith("Bearer ")
    raise ValueError("upstream answered 502")


class _Flaky(SchedulingNode[None, str]):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls = 0

    def task(self, ctx: TaskContext, param: None) -> str:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("reset by peer")
        return "second time lucky"


class _LoudHook(SchedulingNode[None, None]):
    def task(self, ctx: TaskContext, param: None) -> None:
        raise RuntimeError("hook test")

    def on_fail(self, support: TaskSupport) -> None:
        token = support.context[KEY]
        raise KeyError("the hook fails too" if token else "no token")  # a line naming the secret


def _failing_run(pool: ThreadPoolExecutor, release: threading.Event) -> tuple[FlowResult,
                                                                              TaskContext]:
    def _slow(ctx: TaskContext, param: object) -> str:
        release.wait(30)
        return "late"

    read = FunctionNode(_read, name="read")
    fail = FunctionNode(_fail, name="fail")
    after = FunctionNode(_read, name="after")
    flaky = _Flaky(name="flaky", retries=1)
    loud = _LoudHook(name="loud")
    slow = FunctionNode(_slow, name="slow", timeout=0.05)
    read >> [fail, flaky, loud, slow]
    fail >> after
    ctx = TaskContext()
    ctx[KEY] = f"Bearer {SECRET}"
    result = TaskScheduling.start(read, executor=pool, timeout=30, context=ctx)
    return result, ctx


def _succeeding_run(pool: ThreadPoolExecutor) -> tuple[FlowResult, TaskContext]:
    a = FunctionNode(_read, name="a")
    b = FunctionNode(_read, name="b")
    a >> b
    ctx = TaskContext()
    ctx[KEY] = f"Bearer {SECRET}"
    return TaskScheduling.start(a, executor=pool, timeout=30, context=ctx), ctx


@pytest.fixture
def runs(pool: ThreadPoolExecutor, records: list[str]) -> Iterator[list[tuple[FlowResult,
                                                                                TaskContext]]]:
    release = threading.Event()
    try:
        failing = _failing_run(pool, release)
    finally:
        release.set()
    succeeding = _succeeding_run(pool)
    assert not failing[0].ok and succeeding[0].ok
    states = failing[0].states()
    assert {states[n].name for n in ("fail", "after", "loud")} == {"EXCEPTION"}
    assert states["slow"].name == "TIMEOUT" and states["flaky"].name == "SUCCESS"
    yield [failing, succeeding]


def test_reports_pictures_and_logs_leave_the_context_out(
        runs: list[tuple[FlowResult, TaskContext]], records: list[str]) -> None:
    for result, ctx in runs:
        assert SECRET in ctx[KEY]
        report = result.report()
        assert SECRET not in repr(report) and SECRET not in report.model_dump_json()
        assert SECRET not in result.to_html()
        assert SECRET not in result.to_html(show_values=True, context=dict(ctx))  # not asked
        assert SECRET not in result.to_mermaid()
        assert SECRET not in repr(result) and SECRET not in repr(ctx)
    assert records, "the taskflow logger said nothing: the check would be empty"
    assert any("fail" in r for r in records)  # the failure was logged ...
    leaked = [r for r in records if SECRET in r]
    assert leaked == []  # ... without the context


def test_the_web_app_leaves_the_context_out(runs: list[tuple[FlowResult, TaskContext]]) -> None:
    stats = FlowStats()
    for result, _ in runs:
        stats.record_run(result)
    for show_values in (False, True):
        client = werkzeug_test.Client(make_app(stats, show_values=show_values))
        pages = ["/", "/metrics", "/stats.json",
                 *(f"/runs/{result.flow_id}" for result, _ in runs)]
        for url in pages:
            resp = client.get(url, buffered=True)
            assert resp.status_code == 200, url
            assert SECRET not in resp.get_data(as_text=True), url


def test_to_html_shows_the_context_when_asked_and_given(
        runs: list[tuple[FlowResult, TaskContext]]) -> None:
    for result, ctx in runs:
        page = result.to_html(show_context=True, context=dict(ctx))
        assert f"Bearer {SECRET}" in page


def test_hook_failures_leave_the_context_out_of_a_diagnosing_sink(
        pool: ThreadPoolExecutor) -> None:
    gen = _collect(diagnose=True)
    seen = next(gen)
    try:
        release = threading.Event()
        release.set()
        _failing_run(pool, release)
    finally:
        next(gen, None)
    assert any("hook on_fail of node loud raised" in r for r in seen)
    assert [r for r in seen if SECRET in r] == []


def test_report_shows_the_context_when_asked(
        runs: list[tuple[FlowResult, TaskContext]]) -> None:
    for result, _ in runs:
        report = result.report(show_context=True)
        assert SECRET in report.model_dump_json()


def test_to_html_and_the_web_app_show_the_runs_own_context_when_asked(
        runs: list[tuple[FlowResult, TaskContext]]) -> None:
    stats = FlowStats()
    for result, _ in runs:
        stats.record_run(result)
    client = werkzeug_test.Client(make_app(stats, show_context=True))
    for result, _ in runs:
        assert SECRET in result.to_html(show_context=True)
        page = client.get(f"/runs/{result.flow_id}", buffered=True).get_data(as_text=True)
        assert SECRET in page
