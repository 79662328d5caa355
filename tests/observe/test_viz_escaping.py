"""Hostile names, case values, titles, errors and results in Mermaid and DOT output.

Whatever a node is called or raises, each output keeps its structure: every line of a Mermaid
chart is one of the statements taskflow writes, every label decodes back to the text it shows,
and the DOT output parses (pydot) into exactly the nodes and edges of the graph, with the same
labels. A payload never breaks out of its label.
"""

from __future__ import annotations

import html
import itertools
import re
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskflow import FunctionNode, TaskContext, TaskScheduling
from taskflow.kinds.switch import SwitchNode
from taskflow.model.result import FlowResult
from taskflow.observe.viz import definition_to_mermaid, run_to_mermaid, to_dot

pydot = pytest.importorskip("pydot")

HOSTILE = [
    "<script>alert(1)</script>",
    '"quoted" and \'single\'',
    "line one\nline two\r\nthree",
    'x"]; evil["pwned',
    "a --> b",
    "c -.->|\"label\"| d",
    "%%{init: {'securityLevel': 'loose'}}%%",
    "%% a comment",
    "click n0 call alert()",
    "click n0 href \"javascript:alert(1)\"",
    "section evil",
    "title hijacked",
    "dateFormat YYYY",
    "2024-01-01 task",
    "pipe | bar",
    "back`tick`",
    "#lt;entity#gt; &amp; #35;",
    "semi; colon: hash#",
    "brackets [] {} () {{}} [/\\]",
    "back\\slash \\N \\G \\l",
    'dot"]; n99 [label="injected"]; n0 -> n99; x [label="',
    "}\ndigraph evil {",
    "tab\there",
    "nul\x00 bell\x07 esc\x1b",
    "商品 ✓ émoji 🎉",
    "   ",
]

# the only statements taskflow writes in a flowchart (labels: letters, digits, a few plain
# punctuation marks and entity codes; never a quote, bracket, pipe, colon or newline)
LABEL = r"(?:[^\W_]|[ _\-.,/()+=@!?'*]|#(?:quot|amp|lt|gt|\d+);)*"
FLOWCHART_LINE = re.compile(
    r"flowchart (?:TD|LR)"
    rf'|    n\d+(?:\["|\{{"|\{{\{{"|\[/"|\[\\"){LABEL}(?:<br/>[A-Z]+)?(?:"\]|"\}}|"\}}\}}|"\\\]|"/\])'
    rf'|    n\d+ (?:-->|-\.->)(?:\|"{LABEL}"\|)? n\d+'
    r"|    classDef [A-Z]+ fill:#[0-9a-f]{6},stroke:#[0-9a-f]{6},color:#[0-9a-f]{6}"
    r"(?:,stroke-dasharray: 4 4)?"
    r"|    class n\d+(?:,n\d+)* [A-Z]+"
)
GANTT_KEYWORDS = re.compile(r"(?i)\s*(acc|call|click|href|gantt|dateformat|inclusiveenddates|"
                            r"topaxis|axisformat|tickinterval|includes|excludes|todaymarker|"
                            r"title|section|weekday|weekend|\d{4}-)")
GANTT_TASK = re.compile(rf"    ({LABEL}) [A-Z]+ : (?:milestone, )?(?:done|crit|active), \d+, \d+ms")


def decode_mermaid(text: str) -> str:
    named = {"quot": '"', "amp": "&", "lt": "<", "gt": ">"}
    return re.sub(r"#(quot|amp|lt|gt|\d+);",
                  lambda m: named.get(m[1]) or chr(int(m[1])), text)


def check_flowchart(chart: str, names: list[str], title: str | None = None) -> None:
    lines = chart.splitlines()
    if title is not None:
        assert lines[0] == "---" and lines[2] == "---" and lines[1].startswith("title: ")
        assert "%" not in lines[1] and "<" not in lines[1] and "\n" not in lines[1]
        lines = lines[3:]
    for line in lines:
        assert FLOWCHART_LINE.fullmatch(line), line
    labels = re.findall(r'^    n\d+\W*"(.*?)(?:<br/>[A-Z]+)?"', chart, re.MULTILINE)
    assert [decode_mermaid(label) for label in labels] == names


def dot_unescape(quoted: str) -> str:
    assert quoted.startswith('"') and quoted.endswith('"')
    return re.sub(r'\\(["\\n])', lambda m: "\n" if m[1] == "n" else m[1], quoted[1:-1])


def dot_shown(text: str) -> str:
    """What taskflow's DOT label shows for ``text``: line breaks as breaks, other control
    characters as visible \\uXXXX text."""
    text = text.replace("\r\n", "\n\n").replace("\r", "\n")
    return "".join(ch if ch.isprintable() or ch in " \n" else f"\\u{ord(ch):04x}" for ch in text)


def parse_dot(dot: str) -> Any:
    with warnings.catch_warnings():  # pydot calls pyparsing's deprecated camelCase names
        warnings.simplefilter("ignore", DeprecationWarning)
        return pydot.graph_from_dot_data(dot)


def check_dot(dot: str, names: list[str], edges: int, title: str | None = None) -> None:
    graphs = parse_dot(dot)
    assert graphs is not None and len(graphs) == 1
    g = graphs[0]
    nodes = {n.get_name(): n for n in g.get_nodes() if n.get_name() not in ("node", "edge")}
    assert set(nodes) == {f"n{i}" for i in range(len(names))}
    assert len(g.get_edges()) == edges
    for i, name in enumerate(names):
        shown = dot_unescape(nodes[f"n{i}"].get("label")).split("\n")
        assert "\n".join(shown).startswith(dot_shown(name))
    if title is not None:
        assert dot_unescape(g.get("label")) == dot_shown(title)
    assert len(g.get_subgraphs()) == 0


def chain(names: list[str], fn: Any = None) -> list[FunctionNode]:
    nodes = [FunctionNode(fn or (lambda ctx, p: "ok"), name=n) for n in names]
    for a, b in itertools.pairwise(nodes):
        a >> b
    return nodes


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="viz-esc")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


# -- definitions -------------------------------------------------------------------------------


def test_hostile_node_names_and_title_keep_the_flowchart_structure() -> None:
    nodes = chain(HOSTILE)
    for title in HOSTILE:
        chart = definition_to_mermaid(nodes[0], title=title)
        check_flowchart(chart, HOSTILE, title)
        assert "<script" not in chart and "%%" not in chart


def test_hostile_names_and_title_keep_the_dot_structure() -> None:
    nodes = chain(HOSTILE)
    for title in ("plain", *HOSTILE):
        dot = to_dot(nodes[0], title=title)
        check_dot(dot, HOSTILE, len(HOSTILE) - 1, title)


def test_hostile_switch_case_values_stay_inside_their_edge_labels() -> None:
    targets = chain(["t0", "t1", "t2", "t3"])
    for t in targets[1:]:
        t.depends_on(targets[0], optional=True)  # keep them one connected graph
    cases = {'a"|b': targets[0], "x\n-->y": targets[1], 7: targets[2]}
    sw = SwitchNode.of(lambda ctx, p: 7, name="sw<script>", cases=cases, default=targets[3])
    chart = definition_to_mermaid(sw)
    for line in chart.splitlines():
        assert FLOWCHART_LINE.fullmatch(line), line
    edge_labels = {decode_mermaid(m) for m in re.findall(r'\|"(.*?)"\|', chart)}
    assert edge_labels == {'a"|b', "x\n-->y", "7", "default"}
    dot = to_dot(sw)
    graph = parse_dot(dot)[0]
    dot_labels = {dot_unescape(e.get("label")) for e in graph.get_edges() if e.get("label")}
    assert dot_labels == {'a"|b', "x\n-->y", "7", "default"}


# -- runs: errors and results carry user data ------------------------------------------------


PAYLOAD = '<script>alert("zq7")</script>\n%%{init: {}}%%\n"]; zq7["'


def fail_with_payload(ctx: TaskContext, param: Any) -> Any:
    raise RuntimeError(PAYLOAD)


def run_hostile(pool: ThreadPoolExecutor) -> tuple[FlowResult, list[FunctionNode]]:
    names = HOSTILE[:8]
    nodes = chain(names, lambda ctx, p: PAYLOAD)
    bad = FunctionNode(fail_with_payload, name="bad </script>")
    nodes[-1] >> bad
    result = TaskScheduling.start(nodes[0], executor=pool, timeout=10.0,
                                  context=TaskContext(note=PAYLOAD))
    assert result.outputs[names[0]] == PAYLOAD
    assert PAYLOAD in str(result.result_of("bad </script>").exception)
    return result, nodes


def test_a_run_with_hostile_names_errors_and_results_keeps_every_chart_intact(
        pool: ThreadPoolExecutor) -> None:
    result, nodes = run_hostile(pool)
    names = [*HOSTILE[:8], "bad </script>"]
    chart = definition_to_mermaid(nodes[0], result=result)
    check_flowchart(chart, names)
    dot = to_dot(nodes[0], result=result)
    check_dot(dot, names, len(names) - 1)
    gantt = run_to_mermaid(result)
    for text in (chart, dot, gantt):  # errors and results are not drawn at all
        assert "zq7" not in text


def test_the_run_gantt_has_one_task_line_per_node_and_no_statement_in_a_name(
        pool: ThreadPoolExecutor) -> None:
    result, _ = run_hostile(pool)
    lines = run_to_mermaid(result).splitlines()
    assert lines[:1] == ["gantt"] and lines[2:4] == ["    dateFormat x", "    axisFormat %S.%L s"]
    tasks = lines[4:]
    assert len(tasks) == len(result)
    shown = []
    for line in tasks:
        m = GANTT_TASK.fullmatch(line)
        assert m, line
        assert not GANTT_KEYWORDS.match(m[1]), line  # a name never becomes a statement
        shown.append(decode_mermaid(m[1]))
    assert sorted(shown) == sorted(result)


def test_the_gantt_title_escapes_a_user_flow_id(pool: ThreadPoolExecutor) -> None:
    result, _ = run_hostile(pool)
    result.flow_id = "x\nsection evil %%{init}%%"  # as if an application chose it
    title = run_to_mermaid(result).splitlines()[1]
    assert title.startswith("    title flow x#10;section evil #37;#37;#123;init#125;#37;#37; (")


# -- any text at all ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=3, unique=True),
       st.text(max_size=12))
def test_any_names_and_title_round_trip_through_mermaid_and_dot(names: list[str],
                                                                title: str) -> None:
    nodes = chain(names)
    check_flowchart(definition_to_mermaid(nodes[0], title=title or None), names,
                    title or None)
    check_dot(to_dot(nodes[0], title=title or None), names, len(names) - 1, title or None)


def test_html_of_a_decoded_label_is_what_a_browser_shows_as_text() -> None:
    # Mermaid turns #lt; into &lt; in the SVG: the browser shows "<script>", it does not run it
    label = re.search(r'n0\["(.*?)"\]', definition_to_mermaid(chain(["<b>x</b>"])[0]))
    assert label is not None
    as_html = re.sub(r"#(quot|amp|lt|gt);", r"&\1;", label[1])
    assert "<" not in as_html and html.unescape(as_html) == "<b>x</b>"
