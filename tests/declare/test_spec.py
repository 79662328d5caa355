"""taskflow's declarative flow format: taskflow.declare.spec.FlowSpec (JSON and YAML)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG

from taskflow import FlowDefinitionError, Join, ResultState, TaskContext
from taskflow.cli import main as cli_main
from taskflow.declare.spec import Flow, FlowSpec, SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]
needs_yaml = pytest.mark.skipif(importlib.util.find_spec("yaml") is None,
                                reason="PyYAML is not installed (the [yaml] extra)")
EXAMPLE = ROOT / "examples" / "flow_spec.yaml"
HERE = "test_spec"  # callables below are named "test_spec:<function>"

# -- callables the specs below name ------------------------------------------------------------

CALLS: list[str] = []


def const(ctx: TaskContext, param: Any) -> Any:
    return param


def add_fathers(ctx: TaskContext, param: Any) -> Any:
    return sum(ctx.result_of(name) for name in param)


def boom(ctx: TaskContext, param: Any) -> Any:
    raise RuntimeError(f"boom {param}")


def decide(ctx: TaskContext, param: Any) -> Any:
    return ctx.get("route", param)


def flaky(ctx: TaskContext, param: Any) -> Any:
    if ctx.incr("flaky") < 3:
        raise RuntimeError("not yet")
    return "third time"


def numbers(ctx: TaskContext, param: Any) -> Iterator[tuple[int, int]]:
    for i in range(param):
        yield i, i


def square(ctx: TaskContext, item: int) -> int:
    return item * item


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="spec")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def task(name: str, fn: str = "const", **fields: Any) -> dict[str, Any]:
    return {"name": name, "callable": f"{HERE}:{fn}", **fields}


def states(result: Any) -> dict[str, str]:
    return {name: state.name for name, state in result.states().items()}


# -- reading and running ------------------------------------------------------------------------


@needs_yaml
def test_the_yaml_example_builds_and_runs(pool: ThreadPoolExecutor) -> None:
    flow = load_spec(EXAMPLE, import_spec_dir=True)  # flow_spec_tasks.py is beside it
    assert isinstance(flow, Flow) and flow.name == "checkout" and flow.timeout == 2.0
    result = flow.start(executor=pool)
    assert result.ok, result.failed
    assert result.outputs["gold_price"] == 106.2
    assert result.result_of("list_price").state is ResultState.SKIPPED
    assert result.outputs["notified"].results == {"email": "email sent to Ann"}
    assert result.outputs["reserve_stock"].succeeded == {
        "kbd-k8": {"sku": "kbd-k8", "reserved": 1}, "mouse-m2": {"sku": "mouse-m2", "reserved": 2}}
    assert flow["user"].retries == 2 and flow["cart"].timeout == 0.5


def test_a_spec_may_be_a_dict_json_text_or_a_json_file(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    doc = {"name": "tiny", "tasks": [task("a", param=1), task("b", "add_fathers", param=["a"],
                                                               fathers=["a"])]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doc))
    for source in (doc, json.dumps(doc), path, str(path)):
        result = load_spec(source).start(executor=pool)
        assert result.outputs == {"a": 1, "b": 1}


def test_fathers_join_policy_and_options_become_node_options() -> None:
    flow = load_spec({"tasks": [
        task("a", param=1), task("b", param=2), task("c", param=3),
        task("any", fathers=["a", "b"], join="any"),
        task("two", fathers=["a", "b", "c"], join={"quorum": 2}, timeout=0.5, retries=2,
             retry_backoff=0.01),
        task("all", fathers=["a", {"name": "b", "optional": True}], join="best_effort"),
    ]})
    assert flow["any"].join == Join.ANY
    assert flow["two"].join == Join.quorum(2)
    assert (flow["two"].timeout, flow["two"].retries, flow["two"].retry_backoff) == (0.5, 2, 0.01)
    assert flow["all"].join == Join.BEST_EFFORT
    assert [f.name for f in flow["two"].father_handler] == ["a", "b", "c"]
    assert "-.->" in flow.to_mermaid()  # the optional edge b -> all


def test_retries_rerun_a_failing_task(pool: ThreadPoolExecutor) -> None:
    result = load_spec({"tasks": [task("f", "flaky", retries=2)]}).start(executor=pool)
    assert result.outputs == {"f": "third time"}
    assert result.result_of("f").attempts == 3


def test_an_optional_task_does_not_fail_its_sons(pool: ThreadPoolExecutor) -> None:
    flow = load_spec({"tasks": [task("bad", "boom", optional=True),
                                task("next", param="ran", fathers=["bad"])]})
    result = flow.start(executor=pool)
    assert states(result) == {"bad": "EXCEPTION", "next": "SUCCESS"}


def test_a_switch_block_runs_the_chosen_case(pool: ThreadPoolExecutor) -> None:
    flow = load_spec({"tasks": [
        task("route", "decide", param="b", switch={"cases": {"a": ["on_a"], "b": ["on_b"]},
                                                   "default": ["other"]}),
        task("on_a", param="A"), task("on_b", param="B"), task("other", param="?"),
        task("merge", "const", param="merged", fathers=["on_a", "on_b", "other"]),
    ]})
    result = flow.start(executor=pool)
    assert states(result) == {"route": "SUCCESS", "on_a": "SKIPPED", "on_b": "SUCCESS",
                              "other": "SKIPPED", "merge": "SUCCESS"}
    result = flow.start(executor=pool, context=TaskContext(route="zzz"))
    assert states(result)["other"] == "SUCCESS"
    mermaid = flow.to_mermaid()
    assert '-->|"a"|' in mermaid and '-->|"default"|' in mermaid


def test_a_fork_block_wires_branches_and_a_join_node(pool: ThreadPoolExecutor) -> None:
    flow = load_spec({"tasks": [
        task("start", param=0),
        {"name": "fan", "fathers": ["start"],
         "fork": {"branches": [["a1", "a2"], ["b"]], "join": {"name": "joined", "join_on": ["a2"]}}},
        task("a1", param=1), task("a2", param=2), task("b", param=3),
        task("after", param="after", fathers=["joined"]),
    ]})
    result = flow.start(executor=pool)
    assert result.ok
    assert result.outputs["joined"].results == {"a2": 2}
    assert [f.name for f in flow["joined"].father_handler] == ["a2"]
    assert [f.name for f in flow["a2"].father_handler] == ["a1"]
    assert '[/"fan"\\]' in flow.to_mermaid()


def test_a_fanout_block_runs_every_item(pool: ThreadPoolExecutor) -> None:
    flow = load_spec({"tasks": [{"name": "squares", "param": 5,
                                 "fanout": {"items": f"{HERE}:numbers", "work": f"{HERE}:square",
                                            "max_concurrency": 2, "policy": 0.5}}]})
    result = flow.start(executor=pool, timeout=LONG)
    assert result.outputs["squares"].succeeded == {0: 0, 1: 1, 2: 4, 3: 9, 4: 16}
    assert flow["squares"].max_concurrency == 2 and flow["squares"].policy == 0.5


def test_resolve_false_builds_without_importing_the_callables(pool: ThreadPoolExecutor) -> None:
    flow = load_spec({"tasks": [{"name": "a", "callable": "no_such_module_anywhere:fn"}]},
                     resolve=False)
    assert "flowchart TD" in flow.to_mermaid()
    result = flow.start(executor=pool)
    assert "was not resolved" in str(result.result_of("a").exception)


def test_load_spec_can_return_the_validated_model() -> None:
    spec = load_spec({"name": "m", "tasks": [task("a")]}, build=False)
    assert isinstance(spec, FlowSpec) and spec.tasks[0].callable == f"{HERE}:const"


# -- errors point at the exact place ------------------------------------------------------------


@pytest.mark.parametrize(("doc", "place", "text"), [
    ({"tasks": [task("a"), task("b", join="some")]}, "tasks[1].join",
     "join must be 'all', 'any', 'best_effort' or {quorum: k}, got 'some'"),
    ({"tasks": [task("a", join={"quorum": 0})]}, "tasks[0].join", "quorum must be a positive"),
    ({"tasks": [task("a", colour="red")]}, "tasks[0].colour", "extra inputs are not permitted"),
    ({"tasks": [task("a", timeout=-1)]}, "tasks[0].timeout", "greater than or equal to 0"),
    ({"tasks": [{"name": "a", "callable": "no_colon"}]}, "tasks[0].callable",
     "callable must be 'package.module:function'"),
    ({"tasks": [{"name": "a"}]}, "tasks[0]", "callable is required"),
    ({"tasks": [task("a", fathers=["x", 3])]}, "tasks[0].fathers[1]", "valid dictionary"),
    ({"tasks": [{"name": "f", "fanout": {"items": f"{HERE}:numbers", "work": f"{HERE}:square",
                                         "policy": 2}}]},
     "tasks[0].fanout.policy", "quorum fraction in (0, 1]"),
    ({"tasks": [task("s", "decide", switch={"cases": {"x": ["a"]}}, fork={"branches": [["a"]],
                                                                 "join": {"name": "j"}})]},
     "tasks[0]", "a task is one of switch, fork or fanout, not switch and fork"),
    ({"tasks": []}, "tasks", "at least 1 item"),
])
def test_schema_errors_name_the_place_in_the_document(doc: dict[str, Any], place: str,
                                                      text: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(doc)
    assert [p for p, _ in info.value.errors] == [place]
    assert text in str(info.value)
    assert isinstance(info.value, FlowDefinitionError)


@pytest.mark.parametrize(("doc", "place", "text"), [
    ({"tasks": [task("a"), task("b", fathers=["a", "ghost"])]}, "tasks[1].fathers[1]",
     "unknown task 'ghost'"),
    ({"tasks": [task("a"), task("a")]}, "tasks[1].name", "task name 'a' is already used by tasks[0]"),
    ({"tasks": [{"name": "a", "callable": "no_such_module_anywhere:fn"}]}, "tasks[0].callable",
     "cannot import module 'no_such_module_anywhere'"),
    ({"tasks": [{"name": "a", "callable": f"{HERE}:missing"}]}, "tasks[0].callable",
     "has no attribute 'missing'"),
    ({"tasks": [{"name": "a", "callable": f"{HERE}:HERE"}]}, "tasks[0].callable", "is not callable"),
    ({"tasks": [task("s", "decide", switch={"cases": {"x": ["nowhere"]}})]},
     "tasks[0].switch.cases['x'][0]", "unknown task 'nowhere'"),
    ({"tasks": [{"name": "f", "fork": {"branches": [["a"]], "join": {"name": "j", "join_on": ["b"]}}},
                task("a"), task("b")]},
     "tasks[0].fork.join.join_on[0]", "'b' is not a task of the fork's branches"),
    ({"tasks": [task("a", fathers=["b"]), task("b", fathers=["a"])]}, "tasks[0]", "cycle between"),
    ({"tasks": [task("s", "decide", switch={"cases": {"x": ["s"]}})]},
     "tasks[0].switch.cases['x'][0]", "part of its own switch case"),
])
def test_graph_errors_name_the_place_in_the_document(doc: dict[str, Any], place: str,
                                                     text: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(doc)
    assert [p for p, _ in info.value.errors] == [place]
    assert text in str(info.value)


def test_a_mistyped_task_reference_asks_did_you_mean() -> None:
    with pytest.raises(SpecError) as info:
        load_spec({"tasks": [task("product"), task("price", fathers=["prodcut"])]})
    assert "unknown task 'prodcut' (did you mean 'product'?) (tasks: 'product', 'price')" in str(
        info.value)


@needs_yaml
def test_yaml_errors_carry_the_line(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: lines
        tasks:
          - name: a
            callable: {HERE}:const
          - name: b
            callable: {HERE}:const
            join: sometimes
          - name: c
            callable: {HERE}:const
            fathers: [ghost]
        """))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.errors[0][0] == "tasks[1].join (line 7)"
    assert str(path) in str(info.value)
    path.write_text(path.read_text().replace("join: sometimes", "join: any"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.errors[0][0] == "tasks[2].fathers[0] (line 10)"


def test_several_errors_are_listed_together() -> None:
    with pytest.raises(SpecError) as info:
        load_spec({"tasks": [task("a", join="x"), task("b", retries=-1)]})
    assert [p for p, _ in info.value.errors] == ["tasks[0].join", "tasks[1].retries"]
    assert str(info.value).startswith("2 errors\n  tasks[0].join: ")


@needs_yaml
def test_invalid_yaml_and_json_syntax_report_the_line(tmp_path: Path) -> None:
    yaml_path = tmp_path / "bad.yaml"
    yaml_path.write_text("name: x\ntasks:\n  - name: [unclosed\n")
    with pytest.raises(SpecError, match=r"line \d+ column \d+: invalid YAML"):
        load_spec(yaml_path)
    with pytest.raises(SpecError, match=r"line 2 column \d+: invalid JSON"):
        load_spec('{"tasks":\n oops}')


def test_yaml_without_pyyaml_says_how_to_get_it(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "flow.yml"
    path.write_text("tasks: []\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    with pytest.raises(SpecError, match=r"pip install 'taskflow-juc\[yaml\]'"):
        load_spec(path)


# -- command line -------------------------------------------------------------------------------


def test_cli_graph_of_a_spec_imports_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps({"name": "g", "tasks": [{"name": "a", "callable": "nowhere_xyz:f"}]}))
    assert cli_main(["graph", str(path)]) == 0
    assert '["a"]' in capsys.readouterr().out


@needs_yaml
def test_cli_run_of_the_yaml_example_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["run", str(EXAMPLE), "--import-file-dir", "--mermaid"]) == 0
    captured = capsys.readouterr()
    report_text, _, chart = captured.out.partition("\n---\n")
    assert json.loads(report_text)["ok"] is True
    assert "flowchart TD" in chart and "SKIPPED" in chart
    assert "checkout: ok" in captured.err


def test_cli_run_of_a_failing_spec_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fail.json"
    path.write_text(json.dumps({"tasks": [task("bad", "boom")]}))
    assert cli_main(["run", str(path)]) == 1
    assert "FAILED" in capsys.readouterr().err
