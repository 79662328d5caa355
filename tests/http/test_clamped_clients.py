"""The clamped clients against a real HTTP server on 127.0.0.1: a node whose backend hangs gets
its worker back at its deadline (the next flow on a one-worker pool starts right after), the
backend receives the deadline headers, a caller's smaller timeout wins, and outside a node the
clients are the plain clients."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import requests
from conftest import EPS, LONG, MEDIUM, PROMPT, SHORT
from http_backend import DEADLINE_HEADERS, Backend, lower, running_backend

import taskflow
import taskflow.http
from taskflow import (
    BudgetExhaustedError,
    FlowStatus,
    FunctionNode,
    ResultState,
    TaskContext,
    TaskScheduling,
    budget_from_headers,
)

BUDGET = 0.3


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as b:
        yield b


@pytest.fixture
def one_worker() -> Iterator[ThreadPoolExecutor]:
    ex = ThreadPoolExecutor(1, thread_name_prefix="one-worker")
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


def requests_get(session: requests.Session) -> Callable[[str, Any], str]:
    return lambda url, timeout=None: session.get(url, timeout=timeout).text


def httpx_get(client: httpx.Client) -> Callable[[str, Any], str]:
    return lambda url, timeout=None: client.get(url, timeout=timeout, follow_redirects=True).text


@pytest.fixture(params=["requests", "httpx"])
def get(request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """A GET through one clamped client: ``get(url, timeout=None) -> body``."""
    if request.param == "requests":
        with taskflow.http.session() as session:
            yield requests_get(session)
    else:
        with taskflow.http.httpx_client() as client:
            yield httpx_get(client)



def test_a_hung_backend_gives_the_worker_back_at_the_deadline(backend, one_worker, get):
    node = FunctionNode(lambda ctx, p: get(backend.url + "/slow"), name="backend")
    result = TaskScheduling.start(node, executor=one_worker, timeout=BUDGET)
    returned = time.monotonic()
    assert result.status is FlowStatus.TIMED_OUT
    # the only worker is free again right away: the next flow's node starts within a generous
    # bound, while the backend still has not answered
    nxt = FunctionNode(lambda ctx, p: time.monotonic(), name="next")
    second = TaskScheduling.start(nxt, executor=one_worker, timeout=LONG)
    assert second.ok
    assert second.outputs["next"] - returned < BUDGET + EPS
    # the request did go out: on a loaded machine the server's thread may read it only after the
    # run ended at its budget, so wait for it (unless the call failed before it went out)
    assert backend.arrived.wait(LONG), result.result_of("backend")
    assert not backend.release.is_set()


def test_the_backend_receives_the_deadline_headers(backend, one_worker, get):
    sent = time.time()
    node = FunctionNode(lambda ctx, p: get(backend.url + "/slow"), name="backend")
    result = TaskScheduling.start(node, executor=one_worker, timeout=BUDGET)
    # the run may end at its budget before the server's thread read the request: wait for it
    # (a loaded machine), unless the call failed before it went out
    assert backend.arrived.wait(LONG), result.result_of("backend")
    [headers] = [lower(h) for h in backend.headers_of("/slow")]
    assert DEADLINE_HEADERS <= set(headers)
    assert headers["grpc-timeout"][-1] in "mun"
    assert 0 < int(headers["x-envoy-expected-rq-timeout-ms"]) <= BUDGET * 1000 + 1
    # the header is the wall clock when the request went out plus the time left then, read one
    # after the other: a thread switch between the two readings on a busy machine shifts it
    assert sent * 1000 < int(headers["x-request-deadline"]) <= (sent + BUDGET + SHORT) * 1000
    # what the backend would make of them with taskflow on its side too
    seen = budget_from_headers(headers, None)
    assert seen is not None and 0 <= seen <= BUDGET


def test_the_clamp_is_in_the_report_and_on_the_page(backend, one_worker, get):
    node = FunctionNode(lambda ctx, p: get(backend.url + "/slow"), name="backend")
    result = TaskScheduling.start(node, executor=one_worker, timeout=BUDGET)
    report = result.report().nodes[0]
    assert report.clamped == 1 and len(report.clamps) == 1
    assert report.clamps[0].attempt == 1 and 0 < report.clamps[0].timeout <= BUDGET
    assert "clamped" in result.to_html()


def test_a_callers_smaller_timeout_wins_and_is_what_the_headers_carry(backend, one_worker, get):
    node = FunctionNode(lambda ctx, p: get(backend.url + "/fast", timeout=SHORT), name="fast")
    result = TaskScheduling.start(node, executor=one_worker, timeout=LONG)
    assert result.outputs == {"fast": "ok"}
    [headers] = [lower(h) for h in backend.headers_of("/fast")]
    assert int(headers["x-envoy-expected-rq-timeout-ms"]) <= SHORT * 1000 + 1
    assert result.attempt_notes == {}  # the caller's timeout set it: not a clamp


def test_a_callers_longer_timeout_is_clamped(backend, one_worker, get):
    node = FunctionNode(lambda ctx, p: get(backend.url + "/slow", timeout=LONG * 10),
                        name="slow")
    started = time.monotonic()
    result = TaskScheduling.start(node, executor=one_worker, timeout=BUDGET)
    assert result.status is FlowStatus.TIMED_OUT
    assert result.attempt_notes["slow"].clamped == 1
    assert time.monotonic() - started < BUDGET + PROMPT


def test_every_redirect_hop_is_clamped_and_carries_the_headers(backend, one_worker, get):
    node = FunctionNode(lambda ctx, p: get(backend.url + "/hop"), name="hop")
    result = TaskScheduling.start(node, executor=one_worker, timeout=MEDIUM)
    assert result.outputs == {"hop": "ok"}
    assert backend.paths() == ["/hop", "/fast"]
    for headers in (lower(backend.headers_of("/hop")[0]), lower(backend.headers_of("/fast")[0])):
        assert DEADLINE_HEADERS <= set(headers)
    assert result.attempt_notes["hop"].clamped == 2


def test_outside_a_node_the_clients_are_plain(backend, get):
    assert get(backend.url + "/fast") == "ok"
    assert get(backend.url + "/fast", timeout=MEDIUM) == "ok"
    for headers in backend.headers_of("/fast"):
        assert not DEADLINE_HEADERS & set(lower(headers))


def test_the_clients_are_the_libraries_own_types():
    with taskflow.http.session() as session, taskflow.http.httpx_client(timeout=1.0) as client:
        assert isinstance(session, requests.Session)
        assert isinstance(client, httpx.Client)
        assert client.timeout.read == 1.0


def test_no_request_goes_out_once_the_attempt_has_no_time_left(backend, one_worker, get, gate):
    release = gate()
    errors: list[BaseException] = []
    done = threading.Event()

    def late(ctx: TaskContext, param: Any) -> None:
        release.wait(LONG)
        try:
            get(backend.url + "/fast")
        except BudgetExhaustedError as exc:
            errors.append(exc)
        done.set()

    result = TaskScheduling.start(FunctionNode(late, name="late"), executor=one_worker,
                                  timeout=SHORT * 2)
    assert result.status is FlowStatus.TIMED_OUT
    release.set()
    assert done.wait(PROMPT)
    assert len(errors) == 1 and backend.paths() == []


def test_on_cancel_shutting_the_socket_frees_a_node_a_join_no_longer_needs(backend):
    # the slow father's deadline is LONG away; an ANY join fires on the fast father, and the
    # slow one's on_cancel shuts the socket its thread is blocked on: the thread is back at
    # once, long before any deadline
    freed = threading.Event()
    got: list[bytes] = []

    def slow(ctx: TaskContext, param: Any) -> str:
        sock = socket.create_connection(("127.0.0.1", backend.server.server_address[1]))
        ctx.on_cancel(lambda: sock.shutdown(socket.SHUT_RDWR))
        try:
            sock.sendall(b"GET /slow HTTP/1.0\r\nHost: backend\r\n\r\n")
            got.append(sock.recv(1024))  # blocks: the backend answers only at teardown
            return "answered"
        finally:
            sock.close()
            freed.set()

    fast = FunctionNode(lambda c, p: backend.arrived.wait(LONG) and "fast", name="fast")
    waiting = FunctionNode(slow, name="slow")
    first = FunctionNode(lambda c, p: "first", name="first", join=taskflow.Join.ANY)
    fast >> first
    waiting >> first
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start([fast, waiting], executor=pool, timeout=LONG * 3)
        assert result.outputs["first"] == "first"
        assert result["slow"].work_result.state is ResultState.CANCELLED
        assert freed.wait(PROMPT)
    assert got == [b""] and not backend.release.is_set()
    for _ in range(int(PROMPT / 0.01)):  # counted once the callback has returned
        if result.attempt_notes["slow"].ran:
            break
        threading.Event().wait(0.01)
    assert result.attempt_notes["slow"].ran == 1


@pytest.mark.parametrize(("factory", "extra", "module"), [
    (lambda: taskflow.http.session(), "taskflow-juc[http]", "requests"),
    (lambda: taskflow.http.httpx_client(), "taskflow-juc[httpx]", "httpx"),
    (lambda: taskflow.http.async_httpx_client(), "taskflow-juc[httpx]", "httpx"),
])
def test_a_missing_extra_says_which_to_install(monkeypatch, factory, extra, module):
    monkeypatch.setitem(sys.modules, module, None)
    for name in ("taskflow.http.with_requests", "taskflow.http.with_httpx"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=extra.replace("[", r"\[").replace("]", r"\]")):
        factory()


def test_replacing_event_hooks_keeps_the_clamp_first(backend, one_worker):
    seen: list[str] = []
    with taskflow.http.httpx_client() as client:
        client.event_hooks = {"request": [lambda r: seen.append(r.headers.get("grpc-timeout", ""))]}
        node = FunctionNode(lambda ctx, p: client.get(backend.url + "/fast").text, name="n")
        result = TaskScheduling.start(node, executor=one_worker, timeout=MEDIUM)
    assert result.outputs == {"n": "ok"}
    assert seen and seen[0] != ""  # the user's hook saw the request already clamped
