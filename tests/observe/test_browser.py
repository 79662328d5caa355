"""The run page and the web app's pages in a real headless Chromium: they render, and the
browser logs nothing to its console (no script error, no blocked load, no CSP violation).

Skipped only when no Chromium binary exists (Debian: ``apt-get install chromium``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from hostile_flow import NAME_C, hostile_run

from taskflow.observe.stats import FlowStats
from taskflow.observe.web import make_app

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
    None,
)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no chromium binary on PATH (apt-get install chromium)"
)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stats() -> FlowStats:
    stats = FlowStats()
    with ThreadPoolExecutor(2, thread_name_prefix="browser-test") as pool:
        for _ in range(2):
            stats.record_run(hostile_run(pool), flow="shop")
    return stats


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """The WSGI ``app`` on 127.0.0.1 (an ephemeral port), served from a named thread."""
    httpd: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              name="browser-test-wsgi")
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


@pytest.fixture
def server(stats: FlowStats) -> Iterator[str]:
    """The web app on 127.0.0.1."""
    with serve(make_app(stats)) as url:
        yield url


def _render(url: str, profile: Path) -> tuple[str, list[str]]:
    """(the DOM after load, console lines) of ``url`` in headless Chromium."""
    assert BROWSER is not None
    proc = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr",
         "--v=0", "--dump-dom", url],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


@pytest.mark.timeout(240)
def test_pages_render_in_chromium_without_console_errors(
    stats: FlowStats, server: str, tmp_path: Path
) -> None:
    runs = stats.runs
    assert runs is not None
    page = tmp_path / "run.html"
    page.write_text(runs.recent()[0].result.to_html(), encoding="utf-8")
    index_dom, console = _render(f"{server}/", tmp_path / "profile1")
    assert not console, console
    assert "Recent runs" in index_dom and "&lt;script&gt;" in index_dom
    link = re.search(r'href="(/runs/[^"]+)"', index_dom)
    assert link is not None
    for url in (page.as_uri(), server + link.group(1)):
        dom, console = _render(url, tmp_path / "profile2")
        assert not console, (url, console)
        assert dom.count("<svg") == 2 and "<rect" in dom
        assert "<script" not in dom.lower()
        # the hostile name arrived as text: the browser re-serialises it escaped
        assert NAME_C.replace("<", "&lt;").replace(">", "&gt;") in dom
