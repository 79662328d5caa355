"""Conductor HTTP tasks against a local server on 127.0.0.1, and their trust boundaries.

Disallowed hosts are names under the reserved ``.invalid`` domain: a test that reached the
network would fail to resolve them, and every test also records each connection attempt to
prove that none was made.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import LONG

from taskflow import FlowDefinitionError, conductor
from taskflow.declare.conductor import HostNotAllowedError, TaskFailedError

BIG = 64 * 1024


class _Handler(BaseHTTPRequestHandler):
    release: threading.Event

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json",
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _echo(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else None
        self._send(200, json.dumps({"method": self.command, "path": self.path, "body": body,
                                    "ctype": self.headers.get("Content-Type"),
                                    "accept": self.headers.get_all("Accept"),
                                    "ctypes": self.headers.get_all("Content-Type"),
                                    "token": self.headers.get("X-Token")}).encode())

    def do_GET(self) -> None:
        if self.path.startswith("/json"):
            self._echo()
        elif self.path == "/no-content":
            self.send_response(204)
            self.end_headers()
        elif self.path == "/empty":
            self._send(200, b"")
        elif self.path == "/text":
            self._send(200, b"plain words", "text/plain; charset=utf-8")
        elif self.path == "/redirect-out":
            self._send(302, b"", extra={"Location": "http://evil.invalid/steal"})
        elif self.path == "/redirect-in":
            self._send(302, b"", extra={"Location": "/json?redirected=1"})
        elif self.path == "/big":
            self._send(200, b"x" * BIG, "application/octet-stream")
        elif self.path == "/fail":
            self._send(503, b'{"error": "maintenance"}')
        elif self.path == "/slow":
            self.release.wait(10)
            self._send(200, b"{}")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        self._echo()


@pytest.fixture
def server() -> Iterator[tuple[str, threading.Event]]:
    release = threading.Event()
    handler = type("Handler", (_Handler,), {"release": release})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
    thread = threading.Thread(target=httpd.serve_forever, name="conductor-http-server")
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}", release
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conductor-http")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address a socket connection or name lookup was attempted for."""
    seen: list[Any] = []
    real_connect, real_lookup = socket.create_connection, socket.getaddrinfo

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(address)
        return real_connect(address, *args, **kwargs)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(host)
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return seen


def http_task(ref: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"name": ref, "taskReferenceName": ref, "type": "HTTP",
            "inputParameters": {"http_request": request}}


def test_get_returns_conductors_response_shape(server: Any, pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task(
        "get", {"uri": f"http://{host}/json/${{workflow.input.id}}", "method": "GET",
                "headers": {"X-Token": "t-1"}})]}, {})
    run = wf.run({"id": 7}, executor=pool)
    assert run.status == "COMPLETED"
    response = run.result.outputs["get"]["response"]
    assert response["statusCode"] == 200 and response["reasonPhrase"] == "OK"
    assert response["body"]["path"] == "/json/7" and response["body"]["token"] == "t-1"
    assert response["headers"]["Content-Type"] == ["application/json"]


def test_post_sends_an_object_body_as_json(server: Any, pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task(
        "post", {"uri": f"http://{host}/json", "method": "POST",
                 "body": {"sku": "${workflow.input.sku}"}})]}, {})
    body = wf.run({"sku": "a1"}, executor=pool).result.outputs["post"]["response"]["body"]
    assert body["method"] == "POST" and json.loads(body["body"]) == {"sku": "a1"}
    assert body["ctype"] == "application/json"


def test_a_request_carries_conductors_default_accept_and_content_type(
        server: Any, pool: ThreadPoolExecutor) -> None:
    # Conductor's HttpTask.Input: accept and contentType default to application/json
    host, _ = server
    wf = conductor.load({"tasks": [http_task("get", {"uri": f"http://{host}/json"})]}, {})
    body = wf.run(executor=pool).result.outputs["get"]["response"]["body"]
    assert body["accept"] == ["application/json"] and body["ctypes"] == ["application/json"]


def test_accept_and_content_type_come_from_the_definition(server: Any,
                                                          pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task(
        "post", {"uri": f"http://{host}/json", "method": "POST", "body": "a,b",
                 "accept": "text/plain", "contentType": "text/csv"})]}, {})
    body = wf.run(executor=pool).result.outputs["post"]["response"]["body"]
    assert body["accept"] == ["text/plain"] and body["ctypes"] == ["text/csv"]
    assert body["body"] == "a,b"


def test_headers_naming_accept_or_content_type_in_any_case_are_sent_alone(
        server: Any, pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task(
        "post", {"uri": f"http://{host}/json", "method": "POST", "body": "x",
                 "headers": {"accept": "text/html", "content-type": "text/plain"}})]}, {})
    body = wf.run(executor=pool).result.outputs["post"]["response"]["body"]
    assert body["accept"] == ["text/html"] and body["ctypes"] == ["text/plain"]


@pytest.mark.parametrize("path", ["/no-content", "/empty"])
def test_an_empty_response_body_is_none_as_conductors_null(
        server: Any, pool: ThreadPoolExecutor, path: str) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task("h", {"uri": f"http://{host}{path}"})]}, {})
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED"
    response = run.result.outputs["h"]["response"]
    assert response["statusCode"] in (200, 204) and response["body"] is None


def test_a_text_body_stays_text_and_top_level_fields_work(server: Any,
                                                          pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [{"name": "t", "taskReferenceName": "t", "type": "HTTP",
                                    "inputParameters": {"uri": f"http://{host}/text"}}]}, {})
    assert wf.run(executor=pool).result.outputs["t"]["response"]["body"] == "plain words"


def test_a_status_outside_2xx_fails_the_task_with_the_response(server: Any,
                                                               pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task("f", {"uri": f"http://{host}/fail"})]}, {})
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    error = run.result.result_of("f").exception
    assert isinstance(error, TaskFailedError) and "503" in str(error)
    assert error.output["response"]["body"] == {"error": "maintenance"}


def test_a_host_outside_allow_hosts_fails_without_connecting(
    server: Any, pool: ThreadPoolExecutor, connections: list[Any],
) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task("steal", {"uri": "http://metadata.invalid/creds"})]},
                        {}, allow_hosts=[host])
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    error = run.result.result_of("steal").exception
    assert isinstance(error, HostNotAllowedError)
    assert "'metadata.invalid:80'" in str(error) and error.host == "metadata.invalid:80"
    assert connections == []  # no lookup, no connection


def test_a_redirect_to_a_disallowed_host_is_refused(server: Any, pool: ThreadPoolExecutor,
                                                    connections: list[Any]) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task("r", {"uri": f"http://{host}/redirect-out"})]}, {},
                        allow_hosts=["127.0.0.1"])
    run = wf.run(executor=pool)
    error = run.result.result_of("r").exception
    assert isinstance(error, HostNotAllowedError) and "redirect to host 'evil.invalid:80'" in str(
        error)
    assert not any("invalid" in str(c) for c in connections)
    assert any("127.0.0.1" in str(c) for c in connections)  # the allowed server was reached


def test_a_redirect_within_allowed_hosts_is_followed(server: Any,
                                                     pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task("r", {"uri": f"http://{host}/redirect-in"})]}, {},
                        allow_hosts=[host])
    body = wf.run(executor=pool).result.outputs["r"]["response"]["body"]
    assert body["path"] == "/json?redirected=1"


def test_allow_hosts_with_a_port_refuses_other_ports(pool: ThreadPoolExecutor,
                                                     connections: list[Any]) -> None:
    wf = conductor.load({"tasks": [http_task("p", {"uri": "http://127.0.0.1:1/x"})]}, {},
                        allow_hosts=["127.0.0.1:8080"])
    error = wf.run(executor=pool).result.result_of("p").exception
    assert isinstance(error, HostNotAllowedError) and connections == []


def test_a_response_larger_than_the_cap_fails_the_task(server: Any,
                                                       pool: ThreadPoolExecutor) -> None:
    host, _ = server
    wf = conductor.load({"tasks": [http_task("b", {"uri": f"http://{host}/big"})]}, {},
                        max_response_bytes=BIG - 1)
    error = wf.run(executor=pool).result.result_of("b").exception
    assert isinstance(error, TaskFailedError) and f"max_response_bytes={BIG - 1}" in str(error)
    ok = conductor.load({"tasks": [http_task("b", {"uri": f"http://{host}/big"})]}, {},
                        max_response_bytes=BIG)
    assert len(ok.run(executor=pool).result.outputs["b"]["response"]["body"]) == BIG


def test_a_slow_server_cannot_outlast_the_budget(server: Any, pool: ThreadPoolExecutor) -> None:
    host, release = server
    wf = conductor.load({"tasks": [http_task("s", {"uri": f"http://{host}/slow",
                                                   "readTimeOut": 60000})]}, {})
    run = wf.run(executor=pool, timeout=0.3)
    release.set()
    # the budget ends the run, or the read timeout (capped by the budget) fails the task first
    assert run.result.elapsed < 5
    if run.status != "TIMED_OUT":
        assert run.status == "FAILED"
        error = run.result.result_of("s").exception
        assert isinstance(error, (TimeoutError, OSError)) and "timed out" in str(error)


def test_the_read_timeout_of_the_definition_applies(server: Any,
                                                     pool: ThreadPoolExecutor) -> None:
    host, release = server
    wf = conductor.load({"tasks": [http_task("s", {"uri": f"http://{host}/slow",
                                                   "readTimeOut": 100})]}, {})
    run = wf.run(executor=pool, timeout=LONG)
    release.set()
    assert run.status == "FAILED" and run.result.elapsed < LONG / 2
    assert isinstance(run.result.result_of("s").exception, TimeoutError)


@pytest.mark.parametrize("uri", ["file:///etc/passwd", "ftp://127.0.0.1/x"])
def test_only_http_and_https_urls_are_requested(uri: str, pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [http_task("u", {"uri": uri})]}, {})
    error = wf.run(executor=pool).result.result_of("u").exception
    assert isinstance(error, ValueError) and "not an http or https URL" in str(error)


def test_an_http_task_without_a_uri_is_refused_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match=r"http task 'h' \(tasks\[0\]\) has no"):
        conductor.load({"tasks": [http_task("h", {"method": "GET"})]}, {})


@pytest.mark.parametrize("hosts", ["127.0.0.1", ["http://x/"], [""]])
def test_bad_allow_hosts_are_refused(hosts: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        conductor.load({"tasks": [http_task("h", {"uri": "http://x"})]}, {}, allow_hosts=hosts)
