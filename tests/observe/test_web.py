"""``taskflow.observe.web.make_app``: a read-only WSGI view, through werkzeug's test client, wsgiref's
validator and Flask's ``DispatcherMiddleware`` (mounted under a prefix)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from wsgiref.validate import validator

import pytest
from hostile_flow import (
    ERROR,
    NAME_A,
    NAME_B,
    NAME_C,
    RESULT_MARK,
    SECRET,
    assert_safe_page,
    hostile_run,
)

from taskflow import PoolMonitor, ThreadPool
from taskflow.observe.stats import FlowStats
from taskflow.observe.web import make_app

werkzeug_test = pytest.importorskip("werkzeug.test")


class Client(werkzeug_test.Client):  # type: ignore[misc, name-defined]
    """werkzeug's test client, reading (and closing) each response at once: wsgiref's validator
    insists that the app's iterator is closed."""

    def open(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("buffered", True)
        return super().open(*args, **kwargs)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="web-test") as ex:
        yield ex


@pytest.fixture
def stats(pool: ThreadPoolExecutor) -> FlowStats:
    stats = FlowStats()
    for _ in range(3):
        stats.record_run(hostile_run(pool), flow="shop<script>")
    return stats


def _links(page: str) -> list[str]:
    return re.findall(r'href="([^"]*/runs/[^"]*)"', page)


def test_index_lists_runs_and_node_stats_safely(stats: FlowStats) -> None:
    client = Client(validator(make_app(stats)))
    resp = client.get("/")
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    page = resp.get_data(as_text=True)
    assert_safe_page(page, shown=["shop<script>", NAME_A, NAME_B, NAME_C])
    assert "Recent runs" in page and "Slowest runs" in page
    runs = stats.runs
    assert runs is not None
    ids = [k.flow_id for k in runs.recent()]
    assert len(_links(page)) == len(ids) + len(runs.slowest())
    for flow_id in ids:
        assert f'href="/runs/{flow_id}"' in page


def test_run_page_hides_values_and_context_by_default(stats: FlowStats) -> None:
    client = Client(validator(make_app(stats)))
    index = client.get("/").get_data(as_text=True)
    for link in _links(index):
        resp = client.get(link)
        assert resp.status_code == 200
        page = resp.get_data(as_text=True)
        assert_safe_page(page, shown=[NAME_A, NAME_B, NAME_C, ERROR])
        assert "alert('result')" not in page and "alert(&#x27;result&#x27;)" not in page
        assert SECRET not in page
    for path in ("/", "/metrics", "/stats.json"):
        assert SECRET not in client.get(path).get_data(as_text=True)


def test_values_only_when_asked(stats: FlowStats) -> None:
    client = Client(make_app(stats, show_values=True))
    link = _links(client.get("/").get_data(as_text=True))[0]
    page = client.get(link).get_data(as_text=True)
    assert_safe_page(page, shown=[repr({"mark": RESULT_MARK})])


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_only_get_and_head_are_answered(stats: FlowStats, method: str) -> None:
    client = Client(validator(make_app(stats)))
    runs = stats.runs
    assert runs is not None
    before = [k.flow_id for k in runs.recent()]
    for path in ("/", f"/runs/{before[0]}", "/metrics", "/nowhere"):
        resp = client.open(path, method=method, data=b"x=1")
        assert resp.status_code == 405
        assert resp.headers["Allow"] == "GET, HEAD"
    assert [k.flow_id for k in runs.recent()] == before


def test_head_sends_headers_without_a_body(stats: FlowStats) -> None:
    client = Client(validator(make_app(stats)))
    for path in ("/", "/metrics", "/stats.json"):
        get = client.get(path)
        head = client.head(path)
        assert head.status_code == get.status_code == 200
        assert head.get_data() == b""
        assert head.headers["Content-Type"] == get.headers["Content-Type"]
        assert int(head.headers["Content-Length"]) > 0
        if path == "/metrics":  # the others carry the time they were made
            assert head.headers["Content-Length"] == get.headers["Content-Length"]


def test_security_headers(stats: FlowStats) -> None:
    resp = Client(make_app(stats)).get("/")
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    assert "script-src" not in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_unknown_run_is_404_and_not_echoed(stats: FlowStats) -> None:
    client = Client(validator(make_app(stats)))
    resp = client.get("/runs/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert resp.status_code == 404
    assert b"script" not in resp.get_data()
    assert client.get("/elsewhere").status_code == 404


def test_metrics_and_json(stats: FlowStats) -> None:
    client = Client(validator(make_app(stats)))
    text = client.get("/metrics").get_data(as_text=True)
    assert text == stats.to_prometheus()  # no monitor: only the statistics
    data = json.loads(client.get("/stats.json").get_data())
    assert data["flows"][0]["flow"] == "shop<script>" and data["flows"][0]["runs"] == 3


def test_pool_metrics_from_a_monitor(stats: FlowStats) -> None:
    pool = ThreadPool(2, thread_name_prefix="web-pool")
    monitor = PoolMonitor(pool, name="checkout<pool>")
    try:
        pool.submit(lambda: None).result(10)
        monitor.sample()
        client = Client(validator(make_app(stats, monitor=monitor)))
        page = client.get("/").get_data(as_text=True)
        assert_safe_page(page, shown=["checkout<pool>", "core_size", "process rss_bytes"])
        metrics = client.get("/metrics").get_data(as_text=True)
        assert 'pool="checkout<pool>"' in metrics and "taskflow_node_duration_seconds" in metrics
    finally:
        monitor.stop()
        pool.shutdown(wait=True)


def test_the_pool_section_groups_the_figures_that_matter_first() -> None:
    pool = ThreadPool(2, 4, queue_capacity=8, thread_name_prefix="web-pool")
    monitor = PoolMonitor(pool, name="checkout")
    try:
        pool.submit(lambda: None).result(10)
        monitor.sample()
        page = Client(make_app(FlowStats(), monitor=monitor)).get("/").get_data(as_text=True)
    finally:
        monitor.stop()
        pool.shutdown(wait=True)
    section = page.split("<h3>checkout", 1)[1]
    grouped, every_field = section.split("<details>", 1)
    groups = re.findall(r"<tr><th>(.*?)</th>", grouped)
    assert groups == ["load", "queue", "refused and abandoned", "tasks", "configuration",
                      "process"]
    load = grouped.split("<tr><th>load</th>", 1)[1].split("</tr>", 1)[0]
    assert '<span class="note">busy threads</span> 0 of 4' in load
    queue = grouped.split("<tr><th>queue</th>", 1)[1].split("</tr>", 1)[0]
    assert '<span class="note">capacity</span> 8' in queue
    assert "ThreadPool, running" in section.split("</h3>", 1)[0]
    assert "core_size" not in grouped and "monotonic" not in grouped, "raw names stay folded"
    assert "<summary>all " in every_field and "core_size" in every_field


def test_no_runs_yet() -> None:
    stats = FlowStats()
    stats.enable()
    try:
        page = Client(make_app(stats)).get("/").get_data(as_text=True)
    finally:
        stats.disable()
    assert page.count("none yet: no run has ended since recording started") == 3
    assert "Recording is off" not in page
    page = Client(make_app(FlowStats(runs=None))).get("/").get_data(as_text=True)
    assert "Recent runs" not in page


def test_the_page_says_when_recording_is_off_and_how_to_turn_it_on() -> None:
    page = Client(make_app()).get("/").get_data(as_text=True)
    assert "Recording is off" in page and "<code>taskflow.stats.enable()</code>" in page
    assert "none: recording is off" in page

    page = Client(make_app(FlowStats())).get("/").get_data(as_text=True)
    assert "Recording is off" in page and "<code>enable()</code> on the <code>FlowStats" in page


def test_the_page_says_it_shows_this_process_only() -> None:
    page = Client(make_app(FlowStats())).get("/").get_data(as_text=True)
    assert f"Runs of this process only (pid {os.getpid()})" in page and "gunicorn" in page


def test_the_stats_module_is_refused_when_the_app_is_made() -> None:
    import taskflow
    from taskflow import stats as stats_module
    from taskflow.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as info:
        make_app(stats=stats_module)
    assert isinstance(info.value, TypeError)
    assert "the module taskflow.stats" in str(info.value)
    assert "stats=taskflow.stats.STATS" in str(info.value)
    assert make_app(stats=taskflow.stats.STATS) is not None


@pytest.mark.parametrize("bad", [3, "stats", object()], ids=["int", "str", "object"])
def test_a_wrong_stats_or_monitor_is_refused_when_the_app_is_made(bad: object) -> None:
    from taskflow.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="stats must be a"):
        make_app(stats=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="monitor must be a"):
        make_app(monitor=bad)  # type: ignore[arg-type]


def test_mounted_under_a_prefix_in_flask(stats: FlowStats) -> None:
    flask = pytest.importorskip("flask")
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    app = flask.Flask("shop")

    @app.get("/")
    def home() -> str:
        return "shop home"

    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/ops/taskflow": make_app(stats)}
    )
    client: Any = app.test_client()
    assert client.get("/").get_data(as_text=True) == "shop home"
    page = client.get("/ops/taskflow/").get_data(as_text=True)
    links = _links(page)
    assert links and all(link.startswith("/ops/taskflow/runs/") for link in links)
    assert 'href="/ops/taskflow/metrics"' in page
    run = client.get(links[0])
    assert run.status_code == 200
    assert_safe_page(run.get_data(as_text=True), shown=[NAME_C])
    assert client.post("/ops/taskflow/").status_code == 405


DJANGO_SITE = r'''
import sys
from concurrent.futures import ThreadPoolExecutor

import django
from django.conf import settings
from django.http import HttpResponse
from django.urls import path

settings.configure(DEBUG=False, ROOT_URLCONF=__name__, ALLOWED_HOSTS=["localhost"],
                   SECRET_KEY="test", MIDDLEWARE=[])
django.setup()
urlpatterns = [path("", lambda request: HttpResponse("shop home"))]

from django.core.wsgi import get_wsgi_application
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

sys.path.insert(0, sys.argv[1])
from hostile_flow import hostile_run
from taskflow.observe.stats import FlowStats
from taskflow.observe.web import make_app

stats = FlowStats()
with ThreadPoolExecutor(2) as pool:
    stats.record_run(hostile_run(pool), flow="shop")
site = DispatcherMiddleware(get_wsgi_application(), {"/ops/taskflow": make_app(stats)})
client = Client(site)
home = client.get("/")
index = client.get("/ops/taskflow/")
link = "/ops/taskflow/runs/" + stats.runs.recent()[0].flow_id
assert f'href="{link}"' in index.get_data(as_text=True), index.get_data(as_text=True)
run = client.get(link)
post = client.post("/ops/taskflow/")
print(home.status_code, home.get_data(as_text=True), index.status_code, run.status_code,
      post.status_code)
'''


def test_mounted_beside_django_through_its_wsgi_handler(tmp_path: Path) -> None:
    """Django's settings are process-wide, so the site runs in a subprocess of its own."""
    pytest.importorskip("django")
    tests_dir = Path(__file__).resolve().parents[1]
    script = tmp_path / "django_site.py"
    script.write_text(DJANGO_SITE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tests_dir.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script), str(tests_dir)], capture_output=True,
                          text=True, timeout=50, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["200", "shop", "home", "200", "200", "405"]
