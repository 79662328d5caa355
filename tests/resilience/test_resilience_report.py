"""Degraded, hedged and shared nodes in reports, the HTML page and the Gantt chart."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import LONG, SHORT

from taskflow import FunctionNode, Hedge, TaskContext, TaskScheduling


def hedged_price(release: threading.Event) -> FunctionNode:
    """A hedged ``price`` node whose first attempt waits for ``release``: the duplicate wins."""
    calls = []

    def replica(ctx, param):
        calls.append(1)
        if len(calls) == 1:
            release.wait(LONG)
        return "price"

    return FunctionNode(replica, name="price", hedge=Hedge(after=SHORT / 5), idempotent=True)


def test_report_html_and_gantt_mark_resilience_outcomes():
    release = threading.Event()

    def boom(ctx, param):
        raise ValueError("down")

    reco = FunctionNode(boom, name="reco", fallback=[])
    price = hedged_price(release)
    stock = FunctionNode(lambda c, p: 7, name="stock", share_key=lambda c, p: "k",
                         cache_ttl=LONG)
    with ThreadPoolExecutor(4) as pool:
        TaskScheduling.start(stock, executor=pool, timeout=LONG)  # fills the cache
        try:
            result = TaskScheduling.start([reco, price, stock], executor=pool, timeout=LONG,
                                          context=TaskContext())
        finally:
            release.set()
    assert result.result_of("reco").marks == ("fallback",)
    assert result.result_of("price").marks == ("hedged 1",)
    assert result.result_of("stock").marks == ("shared",)
    report = result.report()
    assert report.degraded == ["reco"]
    nodes = {n.name: n for n in report.nodes}
    assert nodes["price"].hedges == 1 and nodes["stock"].shared
    gantt = result.to_mermaid()
    assert "reco DEGRADED - fallback" in gantt
    assert "price SUCCESS - hedged 1" in gantt
    assert "stock SUCCESS - shared" in gantt
    html = result.to_html()
    assert "hedged 1" in html and "shared" in html and "fallback" in html


def svg_texts(html: str, label: str) -> list[str]:
    """The ``<text>`` contents of the page's SVG whose aria-label starts with ``label``."""
    svg = re.search(rf'<svg [^>]*aria-label="{label}[^"]*">(.*?)</svg>', html, re.DOTALL)
    assert svg is not None, label
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg.group(1))


def test_graph_and_timeline_of_the_html_page_show_the_marks():
    """Regression: the marks were only in the table and tooltips; the graph said ``SUCCESS · 29.4
    ms`` for a hedged node and the timeline nothing."""
    release = threading.Event()
    reco = FunctionNode(lambda c, p: 1 / 0, name="reco", fallback=[])
    price = hedged_price(release)
    plain = FunctionNode(lambda c, p: 1, name="plain")
    with ThreadPoolExecutor(4) as pool:
        try:
            result = TaskScheduling.start([reco, price, plain], executor=pool, timeout=LONG)
        finally:
            release.set()
    html = result.to_html()
    graph = svg_texts(html, "graph")
    assert "DEGRADED \u00b7 fallback" in graph and "SUCCESS \u00b7 hedged 1" in graph
    assert any(t.startswith("SUCCESS \u00b7 ") and t.endswith(" ms") for t in graph)  # plain
    timeline = svg_texts(html, "Gantt")
    assert "fallback" in timeline and "hedged 1" in timeline
    assert len([t for t in timeline if t in ("fallback", "hedged 1")]) == 2  # plain has none
