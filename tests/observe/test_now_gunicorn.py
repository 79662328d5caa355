"""What is running now in a real gunicorn worker (gthread) on 127.0.0.1 whose pages call a
backend that hangs: under a bounded load, the dump from the documented signal, ``/now``,
``/now.json`` and the Prometheus text of that worker each name the hung node, its flow and the
frame it is stuck in, and the entries leave once the backend answers.

The backend is a socket server of this test: each call blocks in ``recv`` until the test
answers it (``hung_backend_app.py``), so the order is the test's, not the clock's."""

from __future__ import annotations

import html
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    LONG,
    free_port,
    http_get,
    parse_prometheus,
    poll,
    stop_process,
    wait_for_server,
)

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not hasattr(signal, "SIGPROF"), reason="needs SIGPROF")]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GUNICORN = shutil.which("gunicorn", path=str(Path(sys.executable).parent)) or shutil.which(
    "gunicorn")
PRODUCTS, CHECKOUTS = 4, 2
APP = HERE / "hung_backend_app.py"
# where a backend call is stuck: the line of the app that waits for the backend's answer
RECV_LINE = next(n for n, line in enumerate(APP.read_text().splitlines(), 1)
                 if "conn.recv(" in line)
STUCK_IN = f"_ask ({APP}:{RECV_LINE})"


class Backend:
    """A socket server on 127.0.0.1 that accepts calls and answers none until ``release``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.calls: list[socket.socket] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._accept, name="hung-backend")
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by release(): stop accepting
                return
            with self.cond:
                self.calls.append(conn)
                self.cond.notify_all()

    def wait_calls(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, LONG), len(self.calls)

    def release(self) -> None:
        """Answer every call, stop accepting."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
        except OSError:
            pass
        self.sock.close()
        self.thread.join(LONG)
        with self.cond:
            for conn in self.calls:
                try:
                    conn.sendall(b"ok")
                finally:
                    conn.close()


class Gunicorn:
    """One gunicorn with one gthread worker serving ``hung_backend_app:app``."""

    def __init__(self, backend_port: int, tmp: Path) -> None:
        self.port = free_port()
        self.dump = tmp / "dump.txt"
        self.errors = tmp / "gunicorn.log"
        env = {**os.environ, "TASKFLOW_BACKEND_PORT": str(backend_port),
               "TASKFLOW_DUMP_FILE": str(self.dump),
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
        assert GUNICORN is not None
        self.proc = subprocess.Popen(
            [GUNICORN, "--config", str(HERE / "hung_backend_conf.py"),
             "--bind", f"127.0.0.1:{self.port}", "--error-logfile", str(self.errors),
             "--log-level", "warning", "--graceful-timeout", "2", "hung_backend_app:app"],
            cwd=str(HERE), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for_server(self.proc, self.port, "/pid", self.log)

    def log(self) -> str:
        return self.errors.read_text() if self.errors.exists() else ""

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.port, path)

    def now(self) -> dict[str, Any]:
        status, body = self.get("/ops/taskflow/now.json")
        assert status == 200, body
        data: dict[str, Any] = json.loads(body)
        return data

    def gauges(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = self.get("/ops/taskflow/metrics")
        assert status == 200, body
        return parse_prometheus(body)[1]

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def backend() -> Iterator[Backend]:
    b = Backend()
    try:
        yield b
    finally:
        if b.thread.is_alive():
            b.release()


@pytest.fixture
def server(backend: Backend, tmp_path: Path) -> Iterator[Gunicorn]:
    if GUNICORN is None:
        pytest.skip("gunicorn is not installed (pip install 'taskflow-juc[dev]')")
    g = Gunicorn(backend.port, tmp_path)
    try:
        yield g
    finally:
        g.stop()


ABANDONED = ("taskflow_abandoned_attempts", (("node", "price"),))
INFLIGHT = ("taskflow_inflight_runs", ())


def test_a_hung_backend_is_named_by_the_dump_now_and_metrics_until_it_answers(
        backend: Backend, server: Gunicorn) -> None:
    with ThreadPoolExecutor(PRODUCTS + CHECKOUTS, thread_name_prefix="load") as load:
        pages: list[Future[tuple[int, str]]] = [
            load.submit(server.get, f"/products/sku-{i}") for i in range(PRODUCTS)]
        checkouts = [load.submit(server.get, f"/checkout/{i}") for i in range(CHECKOUTS)]
        try:
            backend.wait_calls(PRODUCTS + CHECKOUTS)
            # the product pages answer once price's timeout passed; price stays behind
            for f in pages:
                status, body = f.result(LONG)
                assert status == 200 and body.endswith(" price TIMEOUT\n"), body
            _while_hung(server)
        finally:
            backend.release()
        assert [f.result(LONG) for f in checkouts] == [(200, "COMPLETED charge SUCCESS\n")] * CHECKOUTS, \
            server.log()
    _after_release(server)


def _while_hung(server: Gunicorn) -> None:
    now = server.now()
    gone = [a for a in now["abandoned"] if a["node"] == "price"]
    assert len(gone) == PRODUCTS, now
    for a in gone:
        assert a["flow"] == "product_page" and a["thread"].startswith("page")
        assert a["where"] == STUCK_IN, a["where"]
        assert any("in fetch_price" in entry for entry in a["stack"])
        assert "in _ask" in a["stack"][-1] and "conn.recv(64)" in a["stack"][-1]
    runs = [r for r in now["runs"] if r["flow"] == "checkout"]
    assert len(runs) == CHECKOUTS, now
    for r in runs:
        [charge] = r["nodes"]
        assert charge["name"] == "charge" and charge["state"] == "RUNNING"
    status, page = server.get("/ops/taskflow/now")
    assert status == 200
    assert page.count("<td>price</td><td>product_page</td>") == PRODUCTS
    assert page.count(html.escape(STUCK_IN)) == PRODUCTS
    assert page.count('<span class="n RUNNING">charge') == CHECKOUTS

    gauges = poll(server.gauges, lambda g: g.get(ABANDONED) == PRODUCTS
                  and g.get(INFLIGHT) == CHECKOUTS, "the gauges never counted the hung calls")
    assert gauges[ABANDONED] == PRODUCTS

    _, pid = server.get("/pid")
    os.kill(int(pid), signal.SIGPROF)
    dump = poll(server.dump.read_text,
                lambda t: t.count("in fetch_price") >= PRODUCTS and t.endswith("\n"),
                f"the worker wrote no dump\n{server.log()}")
    assert f"taskflow: {CHECKOUTS} run(s) in progress in process {int(pid)}" in dump
    assert f"taskflow: {PRODUCTS} abandoned attempt(s) still running" in dump
    assert dump.count("node 'price' of flow 'product_page'") == PRODUCTS
    # each abandoned call's stack ends where it is stuck
    assert dump.count(f'hung_backend_app.py", line {RECV_LINE}, in _ask') == PRODUCTS
    assert dump.count("  charge: RUNNING for ") == CHECKOUTS
    assert dump.count("flow 'checkout'") == CHECKOUTS
    assert server.proc.poll() is None and server.get("/pid") == (200, pid)  # it lives on


def _after_release(server: Gunicorn) -> None:
    poll(server.now, lambda n: not [a for a in n["abandoned"] if a["node"] == "price"]
         and not n["runs"], "the entries did not leave once the backend answered")
    status, page = server.get("/ops/taskflow/now")
    assert status == 200 and "_ask (" not in page and "<b>0</b> run(s)" in page
    poll(server.gauges, lambda g: g.get(ABANDONED, 0) == 0 and g.get(INFLIGHT) == 0,
         "the gauges still count the released calls")
    _, pid = server.get("/pid")
    before = server.dump.read_text()
    os.kill(int(pid), signal.SIGPROF)
    after = poll(server.dump.read_text, lambda t: len(t) > len(before) and t.endswith("\n"),
                 "the worker wrote no second dump")[len(before):]
    assert "taskflow: 0 run(s) in progress" in after
    assert "taskflow: 0 abandoned attempt(s) still running" in after
