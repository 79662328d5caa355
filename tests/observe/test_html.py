"""``FlowResult.to_html()`` / ``taskflow.observe.html.render_html``: one self-contained, safe page."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    parse,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import FunctionNode, Join, ResultState, TaskContext, TaskScheduling
from taskflow.cli import main
from taskflow.observe.html import render_html


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="html-test") as ex:
        yield ex


def test_markup_in_names_errors_and_results_is_shown_as_text(pool: ThreadPoolExecutor) -> None:
    result = hostile_run(pool)
    assert result.result_of(NAME_C).state is ResultState.EXCEPTION
    page = result.to_html()
    assert_safe_page(page, shown=[NAME_A, NAME_B, NAME_C, ERROR, repr({"mark": RESULT_MARK})])


def test_context_is_left_out_unless_asked(pool: ThreadPoolExecutor) -> None:
    result = hostile_run(pool)
    assert SECRET not in result.to_html()
    assert SECRET not in result.to_html(show_values=False)
    ctx = {"authorization": f"Bearer {SECRET}", "<k>": "<v>"}
    assert SECRET not in result.to_html(context=ctx)  # given but not asked for
    shown = result.to_html(show_context=True, context=ctx)
    assert_safe_page(shown, shown=[f"'Bearer {SECRET}'", "<k>", "'<v>'"])


def test_values_can_be_left_out(pool: ThreadPoolExecutor) -> None:
    result = hostile_run(pool)
    page = result.to_html(show_values=False)
    assert "alert('result')" not in page and "alert(&#x27;result&#x27;)" not in page
    assert_safe_page(page, shown=[ERROR])


def test_page_has_no_external_references_and_no_scripts(pool: ThreadPoolExecutor) -> None:
    page = hostile_run(pool).to_html()
    parsed = parse(page)
    assert {"link", "script", "img", "iframe", "object"}.isdisjoint(parsed.tags)
    # the only URL is the SVG namespace; url() only points inside the page
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    assert set(re.findall(r"url\(([^)]*)\)", page)) <= {"#arrow"}
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_page_shows_states_timings_and_hover_titles(pool: ThreadPoolExecutor) -> None:
    release = threading.Event()

    def slow(ctx: TaskContext, param: object) -> str:
        release.wait(10)
        return "done"

    def boom(ctx: TaskContext, param: object) -> None:
        release.set()
        raise RuntimeError("backend 503")

    root = FunctionNode(lambda ctx, p: 1, name="root")
    fast_fail = FunctionNode(boom, name="fails")
    slowpoke = FunctionNode(slow, name="slow")
    after = FunctionNode(lambda ctx, p: 2, name="after_fail")
    root >> [fast_fail, slowpoke]
    fast_fail >> after
    result = TaskScheduling.start(root, executor=pool, timeout=30)
    page = render_html(result, title="checkout", flow="product_detail")
    assert "<title>checkout</title>" in page and "product_detail" in page
    titles = re.findall(r"<title>(.*?)</title>", page, flags=re.DOTALL)
    # one tooltip per node in the graph and one in the timeline, plus the page title
    assert len(titles) == 1 + 2 * len(result)
    fail_tips = [t for t in titles if t.startswith("fails")]
    assert fail_tips and all("RuntimeError: backend 503" in t for t in fail_tips)
    assert any(t.startswith("after_fail") and "EXCEPTION" in t for t in titles)
    for state in ("SUCCESS", "EXCEPTION"):
        assert f">{state} " in page  # the counts chips


def test_graph_layers_put_every_father_left_of_its_sons(pool: ThreadPoolExecutor) -> None:
    a, b, c, d = (FunctionNode(lambda ctx, p: None, name=n) for n in "abcd")
    a >> b >> c
    [a, c] >> d  # d is in layer 3 (longest path), not 1
    result = TaskScheduling.start(a, executor=pool, timeout=30)
    xs = _graph_x(result.to_html(), list(result))
    assert xs["a"] < xs["b"] < xs["c"] < xs["d"]


def _graph_x(page: str, names: list[str]) -> dict[str, float]:
    graph = page.split('aria-label="graph of the run">', 1)[1].split("</svg>", 1)[0]
    found = re.findall(r'<a href="#node-(\d+)"><title>.*?</title><rect x="([\d.]+)"', graph,
                       flags=re.DOTALL)
    return {names[int(i)]: float(x) for i, x in found}


@st.composite
def dags(draw: st.DrawFn) -> list[list[int]]:
    n = draw(st.integers(1, 9))
    return [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
            for i in range(n)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dags())
def test_random_dags_draw_each_edge_forward(pool: ThreadPoolExecutor,
                                            fathers: list[list[int]]) -> None:
    nodes = [FunctionNode(lambda ctx, p: None, name=f"n{i}") for i in range(len(fathers))]
    for i, fs in enumerate(fathers):
        for f in fs:
            nodes[f] >> nodes[i]
    result = TaskScheduling.start(nodes, executor=pool, timeout=30)
    page = result.to_html()
    xs = _graph_x(page, list(result))
    assert set(xs) == {f"n{i}" for i in range(len(fathers))}
    for i, fs in enumerate(fathers):
        for f in fs:
            assert xs[f"n{f}"] < xs[f"n{i}"]
    assert_safe_page(page)


def test_nodes_that_never_ran_and_join_any_are_drawn(pool: ThreadPoolExecutor) -> None:
    gate = threading.Event()

    def fast(ctx: TaskContext, param: object) -> str:
        return "fast"

    def slow(ctx: TaskContext, param: object) -> str:
        gate.wait(10)
        return "slow"

    f1 = FunctionNode(fast, name="fast")
    f2 = FunctionNode(slow, name="slow")
    joined = FunctionNode(lambda ctx, p: gate.set(), name="any", join=Join.ANY)
    [f1, f2] >> joined
    result = TaskScheduling.start([f1, f2], executor=pool, timeout=30)
    gate.set()
    page = result.to_html()
    assert_safe_page(page, shown=["fast", "slow", "any"])


def test_charts_are_left_out_above_max_nodes(pool: ThreadPoolExecutor) -> None:
    nodes = [FunctionNode(lambda ctx, p: None, name=f"n{i}") for i in range(5)]
    result = TaskScheduling.start(nodes, executor=pool, timeout=30)
    page = result.to_html(max_nodes=3)
    assert "<svg" not in page and "charts left out" in page
    assert len(re.findall(r'<tr id="node-', page)) == 5


def test_demo_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "run.html"
    assert main(["demo", "--workers", "4", "--timeout", "5", "--html", str(target)]) == 0
    page = target.read_text(encoding="utf-8")
    assert_safe_page(page, shown=["product_info", "aggregate", "product_detail"])
    assert str(target) in capsys.readouterr().err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(min_size=1, max_size=30), min_size=2, max_size=4, unique=True),
       message=st.text(max_size=60), value=st.text(max_size=40))
def test_any_text_in_names_errors_and_results_stays_text(
    pool: ThreadPoolExecutor, names: list[str], message: str, value: str
) -> None:
    def ok(ctx: TaskContext, param: object) -> str:
        return value

    def bad(ctx: TaskContext, param: object) -> None:
        raise ValueError(message)

    first = FunctionNode(ok, name=names[0])
    others = [FunctionNode(ok if i % 2 else bad, name=n) for i, n in enumerate(names[1:])]
    first >> others
    result = TaskScheduling.start(first, executor=pool, timeout=30)
    page = result.to_html()
    # the parser folds \r\n and \r as a browser would; compare on that footing
    shown = [s.replace("\r\n", "\n").replace("\r", "\n") for s in (*names, message, repr(value))]
    text_page = page.replace("\r\n", "\n").replace("\r", "\n")
    assert_safe_page(text_page, shown=[s for s in shown if "\x00" not in s])


def _failed_chain(pool: ThreadPoolExecutor):
    def boom(ctx: TaskContext, param: object) -> None:
        raise ConnectionError("inventory refused")

    root = FunctionNode(lambda ctx, p: 1, name="root")
    stock = FunctionNode(boom, name="stock")
    page = FunctionNode(lambda ctx, p: 2, name="page")
    audit = FunctionNode(lambda ctx, p: 3, name="audit")
    root >> stock >> page >> audit
    return TaskScheduling.start(root, executor=pool, timeout=30)


def _table_row(page: str, name: str) -> str:
    return next(r for r in re.findall(r'<tr id="node-\d+">.*?</tr>', page, flags=re.DOTALL)
                if f"<td>{name}" in r)


def test_a_node_failed_fast_is_shown_as_not_run_beside_the_node_that_failed(
        pool: ThreadPoolExecutor) -> None:
    result = _failed_chain(pool)
    assert result.result_of("page").state is ResultState.EXCEPTION  # the state is unchanged
    page = result.to_html()

    assert ">not run: upstream failed</span>" in _table_row(page, "page")
    assert ">EXCEPTION</span>" not in _table_row(page, "page")
    assert ">EXCEPTION</span>" in _table_row(page, "stock")
    assert ">EXCEPTION 1</span>" in page and ">not run: upstream failed 2</span>" in page
    graph = page.split('aria-label="graph of the run">', 1)[1].split("</svg>", 1)[0]
    assert graph.count(">not run: upstream failed</text>") == 2


def test_what_failed_and_why_comes_first_with_the_error(pool: ThreadPoolExecutor) -> None:
    page = _failed_chain(pool).to_html()
    top = page.split("<h2>Graph</h2>", 1)[0]

    assert "What failed and why:" in top
    assert ("FAILED: &#x27;stock&#x27; raised ConnectionError: inventory refused; 2 nodes not "
            "run: upstream failed (&#x27;page&#x27;, &#x27;audit&#x27;)") in top
    failures = top.split("<th>failed node</th>", 1)[1]
    assert '<a href="#node-1">stock</a>' in failures and "inventory refused" in failures
    assert "page</a>" not in failures, "only the node that failed itself is listed"


def test_the_error_column_comes_right_after_the_state(pool: ThreadPoolExecutor) -> None:
    page = _failed_chain(pool).to_html()
    nodes = page.split("<h2>Nodes</h2>", 1)[1]
    heads = re.findall(r"<th>(.*?)</th>", nodes.split("</thead>", 1)[0])
    assert heads[:3] == ["node", "state", "error"]


def test_a_run_that_succeeded_has_no_failure_line(pool: ThreadPoolExecutor) -> None:
    result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="a"), executor=pool,
                                  timeout=30)
    page = result.to_html()
    assert "What failed and why" not in page and "failed node" not in page
