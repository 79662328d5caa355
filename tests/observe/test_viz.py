"""Flowcharts of a graph's wiring (taskflow.observe.viz.definition_to_mermaid / to_dot), plain and of a run."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from taskflow import FlowDefinitionError, FunctionNode, TaskContext, conductor
from taskflow.kinds.fanout import FanOutNode
from taskflow.kinds.forkjoin import JoinNode, fork_join
from taskflow.kinds.switch import SwitchNode
from taskflow.observe.viz import definition_to_mermaid, to_dot

ROOT = Path(__file__).resolve().parents[2]

# the notification workflow's flowchart, as shown in the README
NOTIFICATION_FLOWCHART = """\
---
title: notification_workflow
---
flowchart TD
    n0[/"my_fork_join_ref"\\]
    n1["process_notification_payload_email"]
    n2["process_notification_payload_sms"]
    n3["process_notification_payload_http"]
    n4["email_notification_ref"]
    n5["sms_notification_ref"]
    n6["http_notification_ref"]
    n7[\\"notification_join_ref"/]
    n8["record_notifications_ref"]
    n0 --> n1
    n0 --> n2
    n0 --> n3
    n1 --> n4
    n2 --> n5
    n3 --> n6
    n4 --> n7
    n5 --> n7
    n7 --> n8
"""



def node(name: str, fn: Any = None) -> FunctionNode:
    return FunctionNode(fn or (lambda ctx, param: name), name=name)


class Squares(FanOutNode[int]):
    def items(self, ctx: TaskContext, param: int) -> Iterator[tuple[int, int]]:
        return ((i, i) for i in range(param or 0))

    def work(self, ctx: TaskContext, item: int) -> int:
        return item * item


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="viz")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def edges(mermaid: str) -> list[str]:
    return [line.strip() for line in mermaid.splitlines() if re.match(r"\s+n\d+ [-.]", line)]


def test_flowchart_has_a_node_per_task_and_an_edge_per_wire() -> None:
    a, b, c, d = node("a"), node("b"), node("c"), node("d")
    a >> [b, c]
    [b, c] >> d
    chart = definition_to_mermaid(a)
    assert chart.startswith("flowchart TD\n")
    assert re.findall(r'n\d+\["(\w)"\]', chart) == ["a", "b", "c", "d"]
    assert edges(chart) == ["n0 --> n1", "n0 --> n2", "n1 --> n3", "n2 --> n3"]


def test_optional_edges_are_dotted() -> None:
    a, b = node("a"), node("b")
    b.depends_on(a, optional=True)
    assert edges(definition_to_mermaid(a)) == ["n0 -.-> n1"]
    assert "n0 -> n1 [style=dashed];" in to_dot(a)


def test_switch_case_edges_carry_the_case_value() -> None:
    yes, no, other, audit = node("yes"), node("no"), node("other"), node("audit")
    sw = SwitchNode.of(lambda ctx, p: True, name="sw", cases={True: yes, "no": no}, default=other)
    sw >> audit
    chart = definition_to_mermaid(sw)
    assert '{"sw"}' in chart
    assert set(edges(chart)) == {'n0 -->|"True"| n1', 'n0 -->|"no"| n2',
                                 'n0 -->|"default"| n3', "n0 --> n4"}
    assert 'n0 -> n2 [label="no"];' in to_dot(sw)


def test_forks_joins_and_fanouts_have_their_own_shapes() -> None:
    fork = fork_join([[node("a")], [node("b")]], JoinNode(name="j"), fork_name="f")
    fork.join_node >> Squares(3, name="fan")
    chart = definition_to_mermaid(fork)
    assert '[/"f"\\]' in chart and '[\\"j"/]' in chart and '{{"fan"}}' in chart
    dot = to_dot(fork)
    assert "shape=trapezium" in dot and "shape=invtrapezium" in dot and "shape=hexagon" in dot


def test_a_run_colours_each_node_by_its_state(pool: ThreadPoolExecutor) -> None:
    def boom(ctx: TaskContext, param: Any) -> Any:
        raise RuntimeError("boom")

    ok, skipped, bad = node("ok"), node("skipped"), node("bad", boom)
    sw = SwitchNode.of(lambda ctx, p: "go", name="sw", cases={"go": ok, "stop": skipped})
    ok >> bad
    from taskflow import TaskScheduling

    result = TaskScheduling.start(sw, executor=pool)
    chart = definition_to_mermaid(sw, result=result)
    assert '["skipped<br/>SKIPPED"]' in chart and '["bad<br/>EXCEPTION"]' in chart
    classes = dict(re.findall(r"class (\S+) (\w+)", chart))
    assert {v: set(k.split(",")) for k, v in classes.items()} == {
        "SUCCESS": {"n0", "n1"}, "SKIPPED": {"n2"}, "EXCEPTION": {"n3"}}
    assert "classDef SKIPPED" in chart and "stroke-dasharray" in chart
    dot = to_dot(sw, result=result)
    assert 'label="bad\\nEXCEPTION"' in dot and 'fillcolor="#f8d7da"' in dot


def test_labels_are_escaped() -> None:
    a = node('say "hi" <b> | x')
    assert 'n0["say #quot;hi#quot; #lt;b#gt; #124; x"]' in definition_to_mermaid(a)
    assert 'label="say \\"hi\\" <b> | x"' in to_dot(a)


def test_title_and_direction() -> None:
    chart = definition_to_mermaid(node("a"), title="my flow", direction="LR")
    assert chart.startswith("---\ntitle: my flow\n---\nflowchart LR\n")
    assert "rankdir=LR;" in to_dot(node("a"), direction="LR")
    with pytest.raises(ValueError, match="direction"):
        definition_to_mermaid(node("a"), direction="sideways")


def test_an_invalid_graph_is_not_drawn() -> None:
    a, b = node("a"), node("b")
    a >> b >> a
    with pytest.raises(FlowDefinitionError, match="cycle"):
        definition_to_mermaid(a)


def test_the_notification_workflow_flowchart_is_the_readme_picture() -> None:
    wf = conductor.load(ROOT / "examples" / "notification_workflow.json", None)
    assert wf.to_mermaid() == NOTIFICATION_FLOWCHART


def test_a_conductor_switch_is_drawn_with_its_case_labels() -> None:
    wf = conductor.load({"name": "ship", "tasks": [
        {"name": "switch", "taskReferenceName": "route", "type": "SWITCH",
         "evaluatorType": "value-param", "expression": "s",
         "inputParameters": {"s": "${workflow.input.service}"},
         "decisionCases": {"fedex": [{"name": "ship", "taskReferenceName": "fedex"}]},
         "defaultCase": [{"name": "ship", "taskReferenceName": "manual"}]},
        {"name": "done", "taskReferenceName": "done"},
    ]}, None)
    assert set(edges(wf.to_mermaid())) == {'n0 -->|"fedex"| n1', 'n0 -->|"default"| n2',
                                           "n1 --> n3", "n2 --> n3"}
    assert wf.to_dot().count("->") == 4
