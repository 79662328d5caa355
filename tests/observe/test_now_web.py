"""The web view's ``/now`` and ``/now.json``: a run held on a node shows with that node RUNNING,
an abandoned attempt shows with where it is stuck until its thread returns, names are escaped,
and the routes answer as the other routes do."""

from __future__ import annotations

import json
import re
import threading
from typing import Any
from wsgiref.validate import validator

import pytest
from conftest import LONG, PROMPT, Call
from hostile_flow import PAGE_TAGS, assert_safe_page, parse
from test_now import Backend, Gate, MakeExecutor, drained, held_page, stuck_run

from taskflow import FunctionNode, TaskScheduling
from taskflow.observe import nowpage
from taskflow.observe.stats import FlowStats
from taskflow.observe.web import make_app

werkzeug_test = pytest.importorskip("werkzeug.test")

# a flow, node and thread name that would break out of a tag, an attribute or the page
HOSTILE_FLOW = 'shop<script>alert(1)</script>"q\''
HOSTILE_NODE = 'price<img src=x onerror="alert(2)">\'"'
HOSTILE_THREAD = 'pool<b onmouseover="alert(3)">'


class Client(werkzeug_test.Client):  # type: ignore[misc, name-defined]
    def open(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("buffered", True)
        return super().open(*args, **kwargs)


def client() -> Client:
    return Client(validator(make_app(FlowStats())))


def now_json() -> dict[str, Any]:
    resp = client().get("/now.json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    data: dict[str, Any] = json.loads(resp.get_data(as_text=True))
    return data


def now_page() -> str:
    resp = client().get("/now")
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    page: str = resp.get_data(as_text=True)
    return page


def rows_of(page: str, run_id: str) -> list[str]:
    """The table rows of ``page`` that name ``run_id`` (an abandoned attempt's with the row of
    its frames)."""
    return [row for row in re.split(r'<tr(?! class="frames")', page) if run_id in row]


def test_a_run_held_on_a_node_shows_that_node_running_in_now_and_now_json(
        make_executor: MakeExecutor, gate: Gate) -> None:
    backend = Backend(gate)
    future = held_page(make_executor(2, prefix="nowweb"), backend)
    data = now_json()
    [run] = [r for r in data["runs"] if r["flow"] == "product_page"]
    assert run["priority"] == "critical" and run["closed"] is False
    assert 0 < run["budget_left_s"] <= LONG and run["age_s"] >= 0
    nodes = {n["name"]: n for n in run["nodes"]}
    assert nodes["price"]["state"] == "RUNNING" and nodes["price"]["thread"] == backend.thread
    assert nodes["page"]["state"] == "WAITING"
    assert nodes["page"]["waits_on"] == "fathers: price"
    html = now_page()
    [row] = rows_of(html, run["run_id"])
    assert "product_page" in row and "critical" in row
    assert '<span class="n RUNNING">price<span class="d">RUNNING' in row
    assert f"on thread {backend.thread}" in row
    assert '<span class="n WAITING">page<span class="d">WAITING waits on fathers: price</span>' in row
    backend.release.set()
    result = future.result(PROMPT)
    assert not [r for r in now_json()["runs"] if r["run_id"] == result.flow_id]
    assert rows_of(now_page(), result.flow_id) == []


def test_an_abandoned_attempt_shows_where_it_is_stuck_until_its_thread_returns(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(1, prefix="nowweb")
    backend = Backend(gate)
    run_id = stuck_run(pool, backend, flow="checkout")
    [attempt] = [a for a in now_json()["abandoned"] if a["run_id"] == run_id]
    assert (attempt["node"], attempt["flow"], attempt["attempt"]) == ("price", "checkout", 1)
    assert attempt["thread"] == backend.thread and attempt["past_deadline_s"] >= 0
    assert "called from stuck_in_backend" in attempt["where"]
    assert any("in stuck_in_backend" in entry for entry in attempt["stack"])
    html = now_page()
    [row] = rows_of(html, run_id)
    assert "<td>price</td><td>checkout</td>" in row and backend.thread in row
    assert "called from stuck_in_backend" in row  # the "stuck in" cell
    assert "in stuck_in_backend" in row  # the innermost frames
    assert 'class="glance"' in html
    backend.release.set()
    drained(pool)
    assert not [a for a in now_json()["abandoned"] if a["run_id"] == run_id]
    assert rows_of(now_page(), run_id) == []


def test_flow_node_and_thread_names_are_escaped(make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(2, prefix=HOSTILE_THREAD)
    held, stuck = Backend(gate), Backend(gate)
    future = TaskScheduling.submit(FunctionNode(held.stuck_in_backend, name=HOSTILE_NODE),
                                   executor=pool, timeout=LONG, name=HOSTILE_FLOW)
    assert held.entered.wait(PROMPT)
    node = FunctionNode(stuck.stuck_in_backend, name=HOSTILE_NODE, timeout=0.05)
    gone = TaskScheduling.start(node, executor=pool, timeout=LONG, name=HOSTILE_FLOW)
    page = now_page()
    assert_safe_page(page, shown=[HOSTILE_FLOW, HOSTILE_NODE, held.thread, stuck.thread])
    assert HOSTILE_THREAD in held.thread
    assert set(parse(page).tags) <= PAGE_TAGS
    data = now_json()
    assert any(r["flow"] == HOSTILE_FLOW for r in data["runs"])
    assert any(a["node"] == HOSTILE_NODE and a["run_id"] == gone.flow_id
               for a in data["abandoned"])
    held.release.set()
    stuck.release.set()
    future.result(PROMPT)
    drained(pool)


def test_the_page_reloads_itself_without_a_script_under_the_policy() -> None:
    resp = client().get("/now")
    policy = resp.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src" not in policy
    page = resp.get_data(as_text=True)
    assert f'<meta http-equiv="refresh" content="{nowpage.REFRESH_S}">' in page
    assert "<script" not in page.lower()
    assert_safe_page(page)


def test_the_index_links_to_now_and_now_links_back() -> None:
    c = client()
    assert 'href="/now"' in c.get("/").get_data(as_text=True)
    page = c.get("/now").get_data(as_text=True)
    assert 'href="/"' in page and 'href="/now.json"' in page and 'href="/metrics"' in page


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_now_answers_only_get_and_head(method: str) -> None:
    for path in ("/now", "/now.json"):
        resp = client().open(path, method=method, data=b"x=1")
        assert resp.status_code == 405
        assert resp.headers["Allow"] == "GET, HEAD"


def test_head_of_now_sends_headers_without_a_body() -> None:
    for path in ("/now", "/now.json"):
        get, head = client().get(path), client().head(path)
        assert head.status_code == get.status_code == 200
        assert head.get_data() == b"" and int(head.headers["Content-Length"]) > 0
        assert head.headers["Content-Type"] == get.headers["Content-Type"]


@pytest.mark.parametrize("path", ["/now/", "/now.json/x", "/now.html", "/NOW"])
def test_other_paths_near_now_are_404(path: str) -> None:
    assert client().get(path).status_code == 404


def test_now_is_served_under_a_prefix() -> None:
    resp = client().get("/now", environ_overrides={"SCRIPT_NAME": "/ops/taskflow"})
    assert resp.status_code == 200
    assert 'href="/ops/taskflow/now.json"' in resp.get_data(as_text=True)


def test_a_run_without_a_budget_has_a_null_budget_in_json(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(1, prefix="nowweb")
    backend = Backend(gate)
    future = TaskScheduling.submit(FunctionNode(backend.stuck_in_backend, name="open_ended"),
                                   executor=pool, timeout=None, name="no_budget")
    assert backend.entered.wait(PROMPT)
    [run] = [r for r in now_json()["runs"] if r["flow"] == "no_budget"]
    assert run["budget_left_s"] is None
    [row] = rows_of(now_page(), run["run_id"])
    assert "<td class=num>none</td>" in row
    backend.release.set()
    future.result(PROMPT)


def test_reading_now_takes_no_lock_a_run_holds(make_executor: MakeExecutor, gate: Gate) -> None:
    """The page is built while the run's own lock is held by another thread."""
    pool = make_executor(1, prefix="nowweb")
    backend = Backend(gate)
    future = TaskScheduling.submit(FunctionNode(backend.stuck_in_backend, name="locked"),
                                   executor=pool, timeout=LONG, name="locked_run")
    assert backend.entered.wait(PROMPT)
    from taskflow.engine import inflight

    [run] = [r for r in inflight.runs() if r.flow_name == "locked_run"]
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with run.lock:
            held.set()
            done.wait(LONG)

    holder = threading.Thread(target=hold, name="nowweb-lock-holder")
    holder.start()
    try:
        assert held.wait(PROMPT)
        reader = Call(now_page, name="nowweb-reader")
        assert reader.finished(PROMPT), "reading /now waited for the run's lock"
        assert reader.error is None and "locked_run" in reader.value
    finally:
        done.set()
        holder.join(PROMPT)
    backend.release.set()
    future.result(PROMPT)
