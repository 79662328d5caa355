"""``/now`` in a real headless Chromium under a load: runs held in their backends, a node queued
for a worker, attempts abandoned while their threads are still in the task. The page renders
(a screenshot, and its DOM) without a console message, and reloads itself under the web view's
Content-Security-Policy, which forbids every script.

Skipped only when no Chromium binary exists (Debian: ``apt-get install chromium``). With
``TASKFLOW_NOW_SCREENSHOT=path`` the screenshot is also copied to ``path`` (the guide's image
is made so)."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG, PROMPT, SHORT
from test_browser import BROWSER, _render, serve

from taskflow import FlowResult, FunctionNode, TaskScheduling
from taskflow.observe import nowpage
from taskflow.observe.stats import FlowStats
from taskflow.observe.web import make_app

pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no chromium binary on PATH (apt-get install chromium)"
)

WIDTH, HEIGHT = 1400, 1000


class Backends:
    """Backend calls that hang until ``release`` is set; ``wait_entered(n)`` waits until n of
    them are in."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.entered = 0
        self.cond = threading.Condition()

    def _enter(self) -> None:
        with self.cond:
            self.entered += 1
            self.cond.notify_all()

    # each waits itself, so that the frame it is stuck in is named after it
    def fetch_price(self, ctx: Any, param: Any) -> bool:
        self._enter()
        return self.release.wait(LONG)

    def fetch_stock(self, ctx: Any, param: Any) -> bool:
        self._enter()
        return self.release.wait(LONG)

    def charge_card(self, ctx: Any, param: Any) -> bool:
        self._enter()
        return self.release.wait(LONG)

    def wait_entered(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.entered >= n, PROMPT), self.entered


@pytest.fixture
def load(gate: Callable[[], threading.Event]) -> Iterator[list[Future[FlowResult]]]:
    """Eight workers, all busy: three product pages held in price and stock (page waits on
    them), two checkouts abandoned in charge_card (its 50 ms timeout passed), and a search page
    whose node is queued for a worker."""
    backends = Backends(gate())
    pool = ThreadPoolExecutor(8, thread_name_prefix="shop")
    futures: list[Future[FlowResult]] = []
    try:
        for _ in range(3):
            product = FunctionNode(lambda c, p: {"sku": 1}, name="product")
            price = FunctionNode(backends.fetch_price, name="price")
            stock = FunctionNode(backends.fetch_stock, name="stock")
            page = FunctionNode(lambda c, p: "page", name="page")
            product >> [price, stock] >> page
            futures.append(TaskScheduling.submit(product, executor=pool, timeout=LONG,
                                                 name="product_page"))
        backends.wait_entered(6)
        for _ in range(2):
            TaskScheduling.start(FunctionNode(backends.charge_card, name="payment",
                                              timeout=SHORT),
                                 executor=pool, timeout=LONG, name="checkout",
                                 priority="critical")
        backends.wait_entered(8)
        futures.append(TaskScheduling.submit(FunctionNode(lambda c, p: [], name="search"),
                                             executor=pool, timeout=LONG, name="search_page"))
        yield futures
    finally:
        backends.release.set()
        for f in futures:
            f.result(LONG)
        pool.shutdown(wait=True)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.timeout(240)
def test_now_under_load_renders_in_chromium_and_is_screenshotted(
        load: list[Future[FlowResult]], tmp_path: Path) -> None:
    with serve(make_app(FlowStats())) as url:
        dom, console = _render(f"{url}/now", tmp_path / "profile1")
        assert not console, console
        shot = tmp_path / "now.png"
        assert BROWSER is not None
        proc = subprocess.run(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", f"--user-data-dir={tmp_path / 'profile2'}",
             "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}",
             f"{url}/now"],
            capture_output=True, text=True, timeout=90, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert _png_size(data) == (WIDTH, HEIGHT)
    assert len(data) > 20_000, "the screenshot looks blank"  # a white page is a few kB
    # what the screenshot shows, read from the DOM the browser built
    assert "<b>4</b> run(s) in progress" in dom
    assert '<b class="bad">2</b> abandoned attempt(s)' in dom
    assert dom.count('<span class="n RUNNING">price') == 3
    assert dom.count('<span class="n RUNNING">stock') == 3
    assert dom.count("WAITING waits on fathers: price, stock") == 3
    assert '<span class="n QUEUED">search<span class="d">QUEUED' in dom
    assert "waits on a worker" in dom
    assert dom.count("called from charge_card") == 2
    assert "<script" not in dom.lower()
    target = os.environ.get("TASKFLOW_NOW_SCREENSHOT")
    if target:
        shutil.copyfile(shot, target)


@pytest.mark.timeout(240)
def test_now_reloads_itself_under_the_policy_that_forbids_scripts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With virtual time, Chromium follows the page's refresh at once: the page is asked for
    again (no script ran, none may)."""
    monkeypatch.setattr(nowpage, "REFRESH_S", 1)
    app = make_app(FlowStats())
    hits: list[str] = []
    asked_again = threading.Event()

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        hits.append(environ.get("PATH_INFO", ""))
        if hits.count("/now") >= 2:
            asked_again.set()
        return app(environ, start_response)

    assert BROWSER is not None
    with serve(counting) as url:
        proc = subprocess.Popen(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=5000", "--dump-dom", f"{url}/now"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            assert asked_again.wait(90), f"the page was not reloaded: {hits}"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert set(hits) == {"/now"}
