"""The async page under real servers on 127.0.0.1: the sync Flask view under gunicorn (gthread
worker, ``examples/async_page_flask.py``) and the Starlette route under uvicorn
(``examples/async_page_starlette.py``), each under a bounded load (200 pages, 8 clients at
once) against a backend this test runs, that answers or hangs.

Answered, every page is complete; hung, every page comes back degraded within its budget, every
hung call's socket is closed by the server (its asyncio task was cancelled), and afterwards the
server has no backend call pending, no attempt abandoned on a thread and no more threads than
before the load (``GET /debug/inflight``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG, MEDIUM, free_port, http_get, poll, stop_process, wait_for_server

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GUNICORN = shutil.which("gunicorn", path=str(BIN)) or shutil.which("gunicorn")
UVICORN = shutil.which("uvicorn", path=str(BIN)) or shutil.which("uvicorn")
BUDGET = 0.5  # examples/async_page.py's
PARTS = ["price", "stock", "reviews"]
PAGES, CLIENTS = 200, 8
WARM_UP = 5 * CLIENTS
MARGIN = 2 * MEDIUM  # what a busy 2-core machine may add to a page's budget
POOL_SIZE = 16  # the examples' ThreadPoolExecutor


class Backend:
    """The page's backend: an asyncio server on its own thread that answers every call, or,
    while ``hang`` is set, reads the call and never answers; it counts the connections it
    holds open."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.open = 0
        self.hung = 0  # calls it held without answering
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="async-page-backend")
        self.thread.start()
        assert self.ready.wait(LONG)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._call, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.loop.call_soon(self.ready.set)
        self.loop.run_forever()
        self.server.close()
        self.loop.run_until_complete(self.server.wait_closed())
        self.loop.close()

    async def _call(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            if self.hang.is_set():
                self.hung += 1
                await reader.read()  # until the caller closes its end
                return
            part = request.split(b" ")[1].split(b"/")[1].decode()
            answer = {"price": {"amount": 79.0}, "stock": {"units": 42},
                      "reviews": {"rating": 4.7, "count": 1284}}[part]
            body = json.dumps(answer).encode()
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        finally:
            self.open -= 1
            writer.close()

    def counts(self) -> tuple[int, int]:
        """(connections open now, calls held unanswered so far), read on the loop."""
        async def read() -> tuple[int, int]:
            return self.open, self.hung
        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(LONG)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(LONG)


class Server:
    """One real server on a free port of 127.0.0.1 serving one of the examples."""

    def __init__(self, kind: str, backend_port: int, tmp: Path) -> None:
        self.kind = kind
        self.port = free_port()
        bind = f"127.0.0.1:{self.port}"
        if kind == "flask":
            assert GUNICORN is not None
            command = [GUNICORN, "--worker-class", "gthread", "--threads", str(CLIENTS),
                       "--workers", "1", "--bind", bind, "--log-level", "warning",
                       "--graceful-timeout", "2", "examples.async_page_flask:app"]
        else:
            assert UVICORN is not None
            command = [UVICORN, "--host", "127.0.0.1", "--port", str(self.port),
                       "--log-level", "warning", "--no-access-log",
                       "examples.async_page_starlette:app"]
        self.logfile = tmp / "server.log"
        env = {**os.environ, "ASYNC_PAGE_BACKEND": f"127.0.0.1:{backend_port}",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        with self.logfile.open("w") as log:
            self.proc = subprocess.Popen(command, cwd=str(ROOT), env=env, stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for_server(self.proc, self.port, "/debug/inflight", self.log)

    def log(self) -> str:
        return self.logfile.read_text()

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        status, body = http_get(self.port, path)
        return status, json.loads(body)

    def debug(self) -> dict[str, Any]:
        status, body = self.get("/debug/inflight")
        assert status == 200, body
        return body

    def load(self, pages: int = PAGES) -> list[tuple[float, int, dict[str, Any]]]:
        """``pages`` product pages, ``CLIENTS`` at a time: (seconds, status, body) each."""
        def one(k: int) -> tuple[float, int, dict[str, Any]]:
            t0 = time.monotonic()
            status, body = self.get(f"/products/sku-{k}")
            return time.monotonic() - t0, status, body

        t0 = time.monotonic()
        with ThreadPoolExecutor(CLIENTS, thread_name_prefix="load") as clients:
            done = list(clients.map(one, range(pages)))
        took = sorted(seconds for seconds, _, _ in done)
        # the figures of the guide's "Under a real server" (pytest -s shows them)
        print(f"\n{self.kind}: {pages} pages, {CLIENTS} clients, {time.monotonic() - t0:.1f} s: "
              f"p50 {took[len(took) // 2] * 1000:.0f} ms, "
              f"p99 {took[int(len(took) * 0.99) - 1] * 1000:.0f} ms, "
              f"max {took[-1] * 1000:.0f} ms")
        return done


@pytest.fixture
def backend() -> Iterator[Backend]:
    b = Backend()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(params=["flask", "starlette"])
def server(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[Server]:
    pytest.importorskip(request.param)
    if (GUNICORN if request.param == "flask" else UVICORN) is None:
        pytest.skip("gunicorn or uvicorn is not installed (pip install 'taskflow-juc[dev]')")
    s = Server(request.param, backend.port, tmp_path)
    try:
        yield s
    finally:
        stop_process(s.proc)


def _settled(server: Server) -> dict[str, Any]:
    """The server's figures once no backend call is pending and none is abandoned."""
    return poll(server.debug, lambda d: d["pending_calls"] == 0 and d["abandoned"] == 0,
                "backend calls were left pending or abandoned")


def _others(figures: dict[str, Any]) -> int:
    return int(figures["threads"] - figures["pool_threads"])


def test_every_page_is_complete_while_the_backend_answers(
        server: Server, backend: Backend) -> None:
    server.load(WARM_UP)  # a new worker's first pages start its threads, its connections
    before = _settled(server)
    pages = server.load()
    assert [status for _, status, _ in pages] == [200] * PAGES, server.log()
    for seconds, _, body in pages:
        assert body["complete"] and body["missing"] == [], body
        assert body["price"] == 79.0 and body["stock"] == 42 and body["reviews"]["count"] == 1284
        assert body["shipping"]["days"] == 2 and body["product"]["sku"].startswith("sku-")
        assert seconds <= BUDGET + MARGIN, (seconds, body)
    assert _settled(server)["cancelled_calls"] == before["cancelled_calls"]  # none cancelled
    assert backend.counts() == (0, 0)


def test_a_hung_backend_degrades_every_page_in_budget_and_leaves_nothing_behind(
        server: Server, backend: Backend) -> None:
    server.load(WARM_UP)  # the server's threads exist now: the gthread worker's, the loop's
    before = _settled(server)

    backend.hang.set()
    pages = server.load()
    assert [status for _, status, _ in pages] == [200] * PAGES, server.log()
    for seconds, _, body in pages:
        assert not body["complete"] and body["missing"] == PARTS, body
        assert body["price"] is None and body["stock"] is None and body["reviews"] is None
        assert body["product"]["sku"].startswith("sku-") and body["shipping"]["days"] == 2
        assert seconds <= BUDGET + MARGIN, (seconds, body)

    after = _settled(server)
    open_now, hung = poll(backend.counts, lambda c: c[0] == 0,
                          "the server kept hung backend connections open")
    assert hung >= PAGES  # most calls reached the backend before the section's deadline
    assert after["cancelled_calls"] >= hung  # and each of those was cancelled
    # the threads are back to what they were: taskflow's coordinator threads, more while runs
    # close at once, retire after a second idle; the pool's stay, at most its size
    after = poll(server.debug, lambda d: _others(d) <= _others(before) + 1,
                 f"more threads than before the load: {before['thread_names']}")
    assert after["pool_threads"] <= POOL_SIZE, after

    backend.hang.clear()  # the next page is whole again: nothing was left holding the server
    status, body = server.get("/products/sku-1")
    assert status == 200 and body["complete"], body
