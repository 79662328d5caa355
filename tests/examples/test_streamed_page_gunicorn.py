"""The examples' streamed product page under a real gunicorn (gthread worker) on 127.0.0.1:
the top of the page reaches the client while the slow part is still running, and a client
that goes away cancels the run on the server.

The server's slow backend calls wait for files this test creates (``gated_page_server.py``),
so the order is the test's, not the clock's."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LONG, free_port, stop_process

pytestmark = [pytest.mark.timeout(120)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GUNICORN = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or shutil.which(
    "gunicorn")


class Server:
    """One gunicorn serving ``gated_page_server:app`` with the given gates."""

    def __init__(self, kind: str, gates: Path, gated: str) -> None:
        self.gates = gates
        self.port = free_port()
        env = {**os.environ, "TASKFLOW_PAGE_APP": kind, "TASKFLOW_PAGE_GATES": str(gates),
               "TASKFLOW_PAGE_GATED": gated,
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
        assert GUNICORN is not None
        self.log = (gates / "gunicorn.log").open("w")
        self.proc = subprocess.Popen(
            [GUNICORN, "--worker-class", "gthread", "--threads", "4", "--workers", "1",
             "--bind", f"127.0.0.1:{self.port}", "--log-level", "warning",
             "--graceful-timeout", "2", "gated_page_server:app"],
            cwd=str(HERE), env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + LONG
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not start\n" + self.output()
                time.sleep(0.05)

    def output(self) -> str:
        self.log.flush()
        return (self.gates / "gunicorn.log").read_text()

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()

    def wait_for(self, name: str) -> None:
        deadline = time.monotonic() + LONG
        while not (self.gates / name).exists():
            assert time.monotonic() < deadline, f"the server never wrote {name}\n{self.output()}"
            time.sleep(0.01)


@pytest.fixture(params=["flask", "django"])
def kind(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(request.param)
    if GUNICORN is None:
        pytest.skip("gunicorn is not installed (pip install 'taskflow-juc[dev]')")
    return str(request.param)


@pytest.fixture
def server_of(kind: str, tmp_path: Path) -> Iterator[object]:
    servers: list[Server] = []

    def start(gated: str) -> Server:
        server = Server(kind, tmp_path, gated)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _open_page(server: Server, sku: str) -> tuple[http.client.HTTPConnection,
                                                   http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=LONG)
    conn.request("GET", f"/products/{sku}/page")
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Transfer-Encoding") == "chunked"
    return conn, response


def _read_until(response: http.client.HTTPResponse, parts: tuple[str, ...]) -> str:
    """Read lines (each part of the page is one) until every part of ``parts`` is there."""
    got = ""
    while not all(f'id="{part}"' in got for part in parts):
        line = response.readline().decode()
        assert line, f"the page ended before {parts}: {got}"
        got += line
    return got


def test_the_top_of_the_page_arrives_while_the_slow_part_still_runs(server_of) -> None:
    server = server_of("reviews")
    conn, response = _open_page(server, "sku-5")
    try:
        top = _read_until(response, ("product_info", "price", "stock"))
        assert top.startswith("<!doctype html>")
        assert not (server.gates / "reviews").exists()  # reviews cannot have finished yet
        assert 'id="reviews"' not in top
        (server.gates / "reviews").touch()
        rest = response.read().decode()
    finally:
        conn.close()
    assert 'id="reviews" data-state="SUCCESS"' in rest
    assert rest.endswith("</main></body></html>\n")


def test_a_client_that_goes_away_cancels_the_run_on_the_server(server_of) -> None:
    # stock is held too: once the client is gone, letting it go makes the server write a
    # part, which fails on the closed connection and closes the response
    server = server_of("reviews,stock")
    conn, response = _open_page(server, "sku-6")
    _read_until(response, ("product_info", "price"))
    server.wait_for("reviews.entered")
    sock = conn.sock
    assert sock is not None
    # a reset, not a polite close: the server's next write fails at once
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    response.close()
    conn.close()
    sock.close()
    (server.gates / "stock").touch()
    server.wait_for("reviews.cancelled")  # the run was cancelled: reviews was abandoned
    assert not (server.gates / "reviews").exists()
