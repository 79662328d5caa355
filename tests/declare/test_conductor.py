"""Conductor workflow definitions run in-process (taskflow.declare.conductor) and their CLI."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import LONG, SHORT

from taskflow import (
    FlowDefinitionError,
    ResultState,
    TaskContext,
    TaskScheduling,
    conductor,
)
from taskflow.cli import main as cli_main
from taskflow.declare.conductor import INPUT_KEY, SUPPORTED_TYPES, TaskFailedError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "notification_workflow.json"


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conductor")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


@cache
def notifications() -> ModuleType:
    path = ROOT / "examples" / "conductor_notifications.py"
    spec = importlib.util.spec_from_file_location("examples_conductor_notifications", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def simple(ref: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"name": name or ref, "taskReferenceName": ref, "type": "SIMPLE", **fields}


def echo(task_input: dict[str, Any]) -> dict[str, Any]:
    return dict(task_input)


def fail_with_output(task_input: dict[str, Any]) -> dict[str, Any]:
    raise TaskFailedError("declined", output={"tried": task_input.get("who")})


def states(result: Any) -> dict[str, str]:
    return {name: state.name for name, state in result.states().items()}


def switch(ref: str, value: str, cases: dict[str, list[Any]], default: list[Any] | None = None,
           **fields: Any) -> dict[str, Any]:
    task = {"name": "switch", "taskReferenceName": ref, "type": "SWITCH",
            "evaluatorType": "value-param", "expression": "v",
            "inputParameters": {"v": value}, "decisionCases": cases, **fields}
    if default is not None:
        task["defaultCase"] = default
    return task


def fork(ref: str, branches: list[list[dict[str, Any]]]) -> dict[str, Any]:
    return {"name": "fork", "taskReferenceName": ref, "type": "FORK_JOIN", "forkTasks": branches}


def join(ref: str, *on: str) -> dict[str, Any]:
    return {"name": "join", "taskReferenceName": ref, "type": "JOIN", "joinOn": list(on)}


# -- loading ------------------------------------------------------------------------------------


def test_load_accepts_a_dict_json_text_and_a_path(tmp_path: Path) -> None:
    definition = {"name": "wf", "tasks": [simple("a", "echo"), simple("b", "echo")]}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(definition))
    registry = {"echo": echo}
    loaded = [conductor.load(definition, registry), conductor.load(json.dumps(definition), registry),
              conductor.load(str(path), registry), conductor.load(path, registry)]
    assert [[n.name for n in wf.nodes] for wf in loaded] == [["a", "b"]] * 4
    assert all(wf.name == "wf" for wf in loaded)


def test_a_str_that_does_not_start_with_a_brace_is_a_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(FlowDefinitionError, match="cannot read workflow definition") as info:
        conductor.load(str(missing), {})
    assert "nope.json" in str(info.value)


def test_invalid_json_text_names_line_and_column() -> None:
    with pytest.raises(FlowDefinitionError, match=r"not valid JSON: .* line 2 column"):
        conductor.load('{"tasks": [\n  oops]}', {})


def test_nodes_are_named_by_reference_and_run_with_task_scheduling(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [simple("first_ref", "echo",
                                          inputParameters={"x": "${workflow.input.x}"})]},
                        {"echo": echo})
    ctx = TaskContext({INPUT_KEY: {"x": 7}})
    result = TaskScheduling.start(wf.nodes, executor=pool, context=ctx)
    assert result.ok
    assert result.outputs == {"first_ref": {"x": 7}}
    assert wf["first_ref"] is wf.nodes[0]


def test_tasks_run_in_sequence_each_reading_the_previous_output(pool: ThreadPoolExecutor) -> None:
    seen: list[str] = []

    def step(task_input: dict[str, Any]) -> dict[str, Any]:
        seen.append(task_input["me"])
        return {"trail": task_input.get("trail", "") + task_input["me"]}

    tasks = [simple("a", "step", inputParameters={"me": "a"})]
    for prev, ref in zip("abc", "bcd", strict=True):
        tasks.append(simple(ref, "step", inputParameters={"me": ref,
                                                           "trail": f"${{{prev}.output.trail}}"}))
    result = conductor.load({"tasks": tasks}, {"step": step}).start(executor=pool)
    assert seen == ["a", "b", "c", "d"]
    assert result.outputs["d"] == {"trail": "abcd"}


# -- inputs and outputs -------------------------------------------------------------------------


def test_input_parameters_resolve_workflow_input_and_nested_task_outputs(
    pool: ThreadPoolExecutor,
) -> None:
    def source(task_input: dict[str, Any]) -> dict[str, Any]:
        return {"user": {"name": "ann", "tags": ["a", "b"]}, "n": 3, "flag": True}

    params = {
        "whole": "${src.output.user}",
        "nested": "${src.output.user.tags[1]}",
        "number": "${src.output.n}",
        "text": "user ${src.output.user.name} has ${src.output.n} (${src.output.flag})",
        "missing": "${src.output.user.age}",
        "missing_in_text": "age=${src.output.nothing}",
        "literal": "$${not.an.expression}",
        "from_input": "${workflow.input.order.id}",
        "list": ["${workflow.input.order.id}", {"deep": "${src.output.user.name}"}],
        "source_input": "${src.input.k}",
        "flow": "${workflow.workflowId}",
        "plain": 5,
    }
    wf = conductor.load({"tasks": [simple("src", "source", inputParameters={"k": "v"}),
                                   simple("use", "echo", inputParameters=params)]},
                        {"source": source, "echo": echo})
    result = wf.start({"order": {"id": "o-1"}}, executor=pool)
    got = result.outputs["use"]
    assert got == {
        "whole": {"name": "ann", "tags": ["a", "b"]},
        "nested": "b",
        "number": 3,
        "text": "user ann has 3 (true)",
        "missing": None,
        "missing_in_text": "age=null",
        "literal": "${not.an.expression}",
        "from_input": "o-1",
        "list": ["o-1", {"deep": "ann"}],
        "source_input": "v",
        "flow": result.flow_id,
        "plain": 5,
    }
    assert result["use"].input == got  # the resolved input is kept on the run's node


def test_a_callable_mutating_its_input_does_not_change_another_tasks_output(
    pool: ThreadPoolExecutor,
) -> None:
    def mutate(task_input: dict[str, Any]) -> dict[str, Any]:
        task_input["data"]["items"].append("mutated")
        return {}

    wf = conductor.load({"tasks": [simple("src", "src"),
                                   simple("bad", "mutate", inputParameters={"data": "${src.output}"})]},
                        {"src": lambda i: {"items": [1]}, "mutate": mutate})
    result = wf.start(executor=pool)
    assert result.outputs["src"] == {"items": [1]}


def test_outputs_are_dicts_none_is_empty_and_other_values_are_wrapped(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [simple("none", "none"), simple("value", "value")]},
                        {"none": lambda i: None, "value": lambda i: 42})
    assert wf.start(executor=pool).outputs == {"none": {}, "value": {"result": 42}}


def test_workflow_output_uses_output_parameters_or_the_last_task(pool: ThreadPoolExecutor) -> None:
    tasks = [simple("a", "echo", inputParameters={"x": "${workflow.input.x}"}), simple("b", "echo")]
    plain = conductor.load({"tasks": tasks}, {"echo": echo})
    result = plain.start({"x": 1}, executor=pool)
    assert plain.output(result) == {}  # b's output: its (empty) input echoed
    shaped = conductor.load({"tasks": tasks, "outputParameters": {"x": "${a.output.x}",
                                                                  "given": "${workflow.input.x}"}},
                            {"echo": echo})
    result = shaped.start({"x": 1}, executor=pool)
    assert shaped.output(result, {"x": 1}) == {"x": 1, "given": 1}


# -- fork / join --------------------------------------------------------------------------------


def test_join_output_is_keyed_by_the_joined_reference_names(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[simple("a1", "echo", inputParameters={"v": 1}),
                        simple("a2", "echo", inputParameters={"v": "${a1.output.v}"})],
                       [simple("b1", "echo", inputParameters={"v": 2})]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": ["a2", "b1"]},
        simple("after", "echo", inputParameters={"joined": "${join.output}"}),
    ]}, {"echo": echo})
    result = wf.start(executor=pool)
    assert result.outputs["join"] == {"a2": {"v": 1}, "b1": {"v": 2}}
    assert result.outputs["after"] == {"joined": {"a2": {"v": 1}, "b1": {"v": 2}}}


def test_notification_example_goes_on_without_waiting_for_the_http_branch(
    pool: ThreadPoolExecutor, capsys: pytest.CaptureFixture[str]
) -> None:
    """The seed's example: joinOn excludes http_notification_ref, so the join and the task after
    it finish while the HTTP callback is still blocked (it waits for the recording task)."""
    module = notifications()
    recorded = threading.Event()
    http_started = threading.Event()

    def http_notification(task_input: dict[str, Any]) -> dict[str, Any]:
        http_started.set()
        assert recorded.wait(LONG), "the join waited for the HTTP branch"
        return {"status": 200}

    def record(task_input: dict[str, Any]) -> dict[str, Any]:
        out = module.record_notifications(task_input)
        recorded.set()
        return out

    registry = dict(module.REGISTRY, http_notification=http_notification,
                    record_notifications=record)
    result = module.main(executor=pool, registry=registry)
    assert result.ok
    assert http_started.is_set()
    join = result.outputs["notification_join_ref"]
    assert sorted(join) == ["email_notification_ref", "sms_notification_ref"]
    assert join["email_notification_ref"]["email_sent_to"] == "ann@example.com"
    assert result.outputs["record_notifications_ref"]["recorded"] == sorted(join)
    assert result.outputs["http_notification_ref"] == {"status": 200}  # it still ran to the end
    assert "COMPLETED" in capsys.readouterr().out


def test_notification_example_runs_as_shipped(capsys: pytest.CaptureFixture[str]) -> None:
    result = notifications().main()
    out = capsys.readouterr().out
    assert result.ok
    assert "workflow 'notification_workflow': COMPLETED" in out
    assert "flowchart TD" in out


def test_join_with_empty_join_on_waits_for_the_fork_alone(pool: ThreadPoolExecutor) -> None:
    release = threading.Event()

    def slow(task_input: dict[str, Any]) -> dict[str, Any]:
        assert release.wait(LONG)
        return {}

    def after(task_input: dict[str, Any]) -> dict[str, Any]:
        release.set()  # runs only if the join did not wait for the slow branch
        return {}

    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[simple("slow", "slow")]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN"},
        simple("after", "after"),
    ]}, {"slow": slow, "after": after})
    result = wf.start(executor=pool, timeout=LONG)
    assert result.ok
    assert result.outputs["join"] == {}


def test_join_on_a_task_in_an_unchosen_switch_case_leaves_it_out(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[switch("sw", "${workflow.input.pick}",
                               {"a": [simple("in_a", "echo", inputParameters={"v": "a"})],
                                "b": [simple("in_b", "echo", inputParameters={"v": "b"})]})],
                       [simple("other", "echo", inputParameters={"v": "o"})]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN",
         "joinOn": ["in_a", "in_b", "other"]},
    ]}, {"echo": echo})
    result = wf.start({"pick": "a"}, executor=pool)
    assert result.ok
    assert result.outputs["join"] == {"in_a": {"v": "a"}, "other": {"v": "o"}}
    assert result.result_of("in_b").state is ResultState.SKIPPED


def test_failed_optional_task_appears_in_the_join_output_and_the_workflow_completes(
    pool: ThreadPoolExecutor,
) -> None:
    def partial(task_input: dict[str, Any]) -> dict[str, Any]:
        raise TaskFailedError("smtp down", output={"attempted": "ann@example.com"})

    def broken(task_input: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[simple("email", "partial", optional=True)],
                       [simple("sms", "broken", optional=True)],
                       [simple("push", "echo", inputParameters={"ok": True})]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN",
         "joinOn": ["email", "sms", "push"]},
        simple("after", "echo", inputParameters={"email": "${email.output.attempted}"}),
    ]}, {"partial": partial, "broken": broken, "echo": echo})
    result = wf.start(executor=pool)
    # as in Conductor, a joined task with an empty output ("sms") is left out
    assert result.outputs["join"] == {"email": {"attempted": "ann@example.com"},
                                     "push": {"ok": True}}
    assert result.outputs["after"] == {"email": "ann@example.com"}
    assert sorted(result.failed) == ["email", "sms"]  # failures are still reported
    assert result.ok  # every failure was tolerated: COMPLETED_WITH_ERRORS
    assert wf.status(result) == "COMPLETED"
    assert wf.to_mermaid().count("-.->") == 2  # optional edges are dotted


def test_failed_required_task_fails_the_join_and_what_follows(pool: ThreadPoolExecutor) -> None:
    def broken(task_input: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[simple("bad", "broken")], [simple("good", "echo")]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": ["bad", "good"]},
        simple("after", "echo"),
    ]}, {"broken": broken, "echo": echo})
    result = wf.start(executor=pool)
    # the failure fails the workflow: the join and what follows never run
    assert states(result)["join"] in ("EXCEPTION", "CANCELLED")
    assert states(result)["after"] in ("EXCEPTION", "CANCELLED")
    assert "after" not in result.outputs
    assert wf.status(result) == "FAILED"


def test_optional_task_failure_lets_the_next_task_run(pool: ThreadPoolExecutor) -> None:
    def broken(task_input: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    wf = conductor.load({"tasks": [simple("opt", "broken", optional=True),
                                   simple("next", "echo", inputParameters={"o": "${opt.output}"})]},
                        {"broken": broken, "echo": echo})
    result = wf.start(executor=pool)
    assert result.outputs["next"] == {"o": {}}
    assert wf.status(result) == "COMPLETED"


# -- switch -------------------------------------------------------------------------------------


def switch_workflow(default: bool) -> conductor.Workflow:
    cases = {"fedex": [simple("ship_fedex", "ship", inputParameters={"via": "fedex"}),
                       simple("track_fedex", "ship", inputParameters={"via": "fedex-tracking"})],
             "ups": [simple("ship_ups", "ship", inputParameters={"via": "ups"})]}
    dflt = [simple("ship_manual", "ship", inputParameters={"via": "manual"})] if default else None
    return conductor.load({"tasks": [
        switch("route", "${workflow.input.service}", cases, dflt),
        simple("done", "echo", inputParameters={"route": "${route.output.selectedCase}"}),
    ]}, {"ship": echo, "echo": echo})


def test_switch_runs_the_matching_case_and_skips_the_others(pool: ThreadPoolExecutor) -> None:
    result = switch_workflow(default=True).start({"service": "fedex"}, executor=pool)
    assert states(result) == {"route": "SUCCESS", "ship_fedex": "SUCCESS", "track_fedex": "SUCCESS",
                              "ship_ups": "SKIPPED", "ship_manual": "SKIPPED", "done": "SUCCESS"}
    assert result.outputs["route"] == {"evaluationResult": ["fedex"], "selectedCase": "fedex"}
    assert result.ok


def test_switch_runs_the_default_case_for_an_unknown_value(pool: ThreadPoolExecutor) -> None:
    result = switch_workflow(default=True).start({"service": "dhl"}, executor=pool)
    assert states(result)["ship_manual"] == "SUCCESS"
    assert {states(result)[n] for n in ("ship_fedex", "track_fedex", "ship_ups")} == {"SKIPPED"}
    assert result.outputs["done"] == {"route": "dhl"}


def test_switch_without_a_matching_case_or_default_runs_no_branch_and_goes_on(
    pool: ThreadPoolExecutor,
) -> None:
    wf = switch_workflow(default=False)
    result = wf.start({"service": "dhl"}, executor=pool)
    assert result.ok, result.failed
    assert {states(result)[n] for n in ("ship_fedex", "track_fedex", "ship_ups")} == {"SKIPPED"}
    assert result.outputs["done"] == {"route": "dhl"}
    assert wf.status(result) == "COMPLETED"


def test_task_after_a_switch_runs_after_the_chosen_branch(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        switch("route", "${workflow.input.kind}",
               {"long": [simple("s1", "echo", inputParameters={"n": 1}),
                         simple("s2", "echo", inputParameters={"n": "${s1.output.n}"})]}),
        simple("after", "echo", inputParameters={"last": "${s2.output.n}"}),
    ]}, {"echo": echo})
    assert wf.start({"kind": "long"}, executor=pool).outputs["after"] == {"last": 1}
    assert wf.start({"kind": "short"}, executor=pool).outputs["after"] == {"last": None}


@pytest.mark.parametrize(("value", "case"), [(True, "true"), (False, "false"), (None, "null"),
                                              (7, "7"), ("7", "7")])
def test_switch_compares_values_as_conductor_text(pool: ThreadPoolExecutor, value: Any,
                                                  case: str) -> None:
    wf = conductor.load({"tasks": [switch("sw", "${workflow.input.v}", {
        case: [simple("hit", "echo")]}, [simple("miss", "echo")])]}, {"echo": echo})
    result = wf.start({"v": value}, executor=pool)
    assert states(result)["hit"] == "SUCCESS"
    assert result.outputs["sw"]["selectedCase"] == case


def test_switch_case_with_an_empty_task_list_falls_back_to_the_default(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [switch("sw", "${workflow.input.v}", {"x": []},
                                          [simple("dflt", "echo")])]}, {"echo": echo})
    assert states(wf.start({"v": "x"}, executor=pool))["dflt"] == "SUCCESS"


# -- dynamic fork -------------------------------------------------------------------------------


def dynamic_workflow(plan: dict[str, Any], **fork_fields: Any) -> list[dict[str, Any]]:
    return [
        simple("plan", "plan", inputParameters={"plan": plan}),
        {"name": "dyn", "taskReferenceName": "dyn", "type": "FORK_JOIN_DYNAMIC",
         "dynamicForkTasksParam": "dynamicTasks", "dynamicForkTasksInputParamName": "dynamicTasksInput",
         "inputParameters": {"dynamicTasks": "${plan.output.tasks}",
                             "dynamicTasksInput": "${plan.output.inputs}"}, **fork_fields},
        {"name": "join", "taskReferenceName": "dyn_join", "type": "JOIN"},
    ]


def test_dynamic_fork_runs_the_listed_tasks_and_the_join_outputs_them(pool: ThreadPoolExecutor) -> None:
    plan = {"tasks": [{"name": "resize", "taskReferenceName": "small", "type": "SIMPLE"},
                      {"name": "resize", "taskReferenceName": "large"},
                      {"name": "watermark", "taskReferenceName": "mark"}],
            "inputs": {"small": {"w": 100}, "large": {"w": 900}}}
    registry = {"plan": lambda i: i["plan"], "resize": lambda i: {"width": i["w"]},
                "watermark": lambda i: {"marked": True, "input": i}}
    result = conductor.load({"tasks": dynamic_workflow(plan)}, registry).start(executor=pool)
    assert result.ok
    join = result.outputs["dyn_join"]
    assert list(join) == ["small", "large", "mark"]
    assert join == {"small": {"width": 100}, "large": {"width": 900},
                    "mark": {"marked": True, "input": {}}}


def test_dynamic_fork_with_fork_task_inputs_names_forks_as_conductor_does(
    pool: ThreadPoolExecutor,
) -> None:
    wf = conductor.load({"tasks": [
        {"name": "dyn", "taskReferenceName": "dyn", "type": "FORK_JOIN_DYNAMIC",
         "inputParameters": {"forkTaskName": "resize",
                             "forkTaskInputs": [{"w": 1}, {"w": 2}, "raw"]}},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN"},
    ]}, {"resize": echo})
    result = wf.start(executor=pool)
    assert result.outputs["join"] == {"_resize_0": {"w": 1, "__index": 0},
                                     "_resize_1": {"w": 2, "__index": 1},
                                     "_resize_2": {"input": "raw", "__index": 2}}


def test_dynamic_fork_of_an_unknown_task_name_fails_the_fork(pool: ThreadPoolExecutor) -> None:
    plan = {"tasks": [{"name": "nope", "taskReferenceName": "x"}], "inputs": {}}
    result = conductor.load({"tasks": dynamic_workflow(plan)},
                            {"plan": lambda i: i["plan"]}).start(executor=pool)
    assert states(result)["dyn"] == "EXCEPTION"
    assert "not in the registry" in str(result.result_of("dyn").exception)
    assert states(result)["dyn_join"] in ("EXCEPTION", "CANCELLED")


def test_dynamic_fork_tolerates_failed_optional_tasks(pool: ThreadPoolExecutor) -> None:
    def flaky(task_input: dict[str, Any]) -> dict[str, Any]:
        raise TaskFailedError("flaky", {"tried": task_input["n"]})

    plan = {"tasks": [{"name": "flaky", "taskReferenceName": "f", "optional": True},
                      {"name": "ok", "taskReferenceName": "g"}],
            "inputs": {"f": {"n": 1}}}
    result = conductor.load({"tasks": dynamic_workflow(plan)},
                            {"plan": lambda i: i["plan"], "flaky": flaky, "ok": echo}
                            ).start(executor=pool)
    assert result.ok
    assert result.outputs["dyn_join"] == {"f": {"tried": 1}}  # "g"'s output is empty


def test_dynamic_fork_failure_of_a_required_task_fails_the_join(pool: ThreadPoolExecutor) -> None:
    def broken(task_input: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")

    plan = {"tasks": [{"name": "broken", "taskReferenceName": "b"}], "inputs": {}}
    result = conductor.load({"tasks": dynamic_workflow(plan)},
                            {"plan": lambda i: i["plan"], "broken": broken}).start(executor=pool)
    assert states(result)["dyn"] == "EXCEPTION"
    assert states(result)["dyn_join"] in ("EXCEPTION", "CANCELLED")


# -- runs ---------------------------------------------------------------------------------------


def test_timeout_seconds_is_the_default_budget(make_executor: Any, gate: Any) -> None:
    release = gate()
    wf = conductor.load({"tasks": [simple("stuck", "stuck")], "timeoutSeconds": SHORT},
                        {"stuck": lambda i: release.wait(LONG)})
    assert wf.timeout == SHORT
    result = wf.start(executor=make_executor(2))
    assert states(result) == {"stuck": "TIMEOUT"}
    assert wf.status(result) == "TIMED_OUT"


def test_retry_count_from_the_task_definition_retries_the_task(pool: ThreadPoolExecutor) -> None:
    calls: list[int] = []

    def flaky(task_input: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("not yet")
        return {"calls": len(calls)}

    wf = conductor.load({"tasks": [simple("f", "flaky", taskDefinition={"retryCount": 2,
                                                                         "retryLogic": "FIXED"})]},
                        {"flaky": flaky})
    result = wf.start(executor=pool)
    assert result.outputs["f"] == {"calls": 3}
    assert result.result_of("f").attempts == 3


def test_one_workflow_serves_concurrent_runs_with_their_own_inputs(pool: ThreadPoolExecutor) -> None:
    both = threading.Barrier(2, timeout=LONG)

    def meet(task_input: dict[str, Any]) -> dict[str, Any]:
        both.wait()  # both runs are inside the same task at once
        return {"who": task_input["who"]}

    wf = conductor.load({"tasks": [simple("meet", "meet", inputParameters={"who": "${workflow.input.who}"}),
                                   simple("after", "echo", inputParameters={"who": "${meet.output.who}"})]},
                        {"meet": meet, "echo": echo})
    results: dict[str, Any] = {}

    def run(who: str) -> None:
        results[who] = wf.start({"who": who}, executor=pool, timeout=LONG)

    threads = [threading.Thread(target=run, args=(w,)) for w in ("ann", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG)
    assert {w: r.outputs["after"]["who"] for w, r in results.items()} == {"ann": "ann", "bob": "bob"}


def test_a_workflow_runs_on_a_process_pool_reading_any_earlier_task() -> None:
    """In other processes a task only gets its fathers' results; inputs are resolved and outputs
    recorded in the caller (hooks), so expressions still read any earlier task."""
    wf = conductor.load({"tasks": [
        simple("a", "echo", inputParameters={"who": "${workflow.input.who}"}),
        fork("f", [[simple("b", "echo", inputParameters={"out": "${a.output.who}",
                                                          "in": "${a.input.who}"})],
                   [simple("c", "fail", optional=True, inputParameters={"who": "${a.output.who}"})]]),
        join("j", "b", "c"),
        switch("sw", "${workflow.input.who}", {"ann": [simple("hit", "echo", inputParameters={
            "joined": "${j.output}", "c_tried": "${c.output.tried}"})]}),
    ]}, {"echo": echo, "fail": fail_with_output})
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as executor:
        result = wf.start({"who": "ann"}, executor=executor, timeout=LONG * 3)
    assert wf.status(result) == "COMPLETED", result.failed
    assert result.outputs["b"] == {"out": "ann", "in": "ann"}
    assert result.outputs["hit"] == {"joined": {"b": {"out": "ann", "in": "ann"},
                                               "c": {"tried": "ann"}},
                                    "c_tried": "ann"}


def test_a_workflow_loaded_without_a_registry_draws_but_does_not_run(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load(EXAMPLE, None)
    assert "flowchart TD" in wf.to_mermaid()
    with pytest.raises(FlowDefinitionError, match="without a registry"):
        wf.start(executor=pool)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("after", [None, simple("x", "echo")])
def test_a_fork_not_followed_by_a_join_is_rejected_naming_it(after: dict[str, Any] | None) -> None:
    tasks = [fork("my_fork", [[simple("a", "echo")]])] + ([after] if after else [])
    with pytest.raises(FlowDefinitionError,
                       match=r"fork task 'my_fork' \(tasks\[0\]\) is not followed by a join task"):
        conductor.load({"tasks": tasks}, {"echo": echo})


def test_a_dynamic_fork_not_followed_by_a_join_is_rejected_naming_it() -> None:
    with pytest.raises(FlowDefinitionError, match="dynamic fork task 'dyn'.*not followed by a join"):
        conductor.load({"tasks": dynamic_workflow({})[:2]}, {"plan": echo})


def test_a_join_on_reference_that_does_not_exist_is_rejected_naming_it() -> None:
    with pytest.raises(FlowDefinitionError,
                       match=r"join task 'j' \(tasks\[1\]\) joins on 'ghost_ref', which does not exist"):
        conductor.load({"tasks": [fork("f", [[simple("a", "echo")]]), join("j", "a", "ghost_ref")]},
                       {"echo": echo})


def test_a_join_on_a_task_outside_the_fork_is_rejected() -> None:
    with pytest.raises(FlowDefinitionError, match="joins on 'before', which is not a task of fork 'f'"):
        conductor.load({"tasks": [simple("before", "echo"), fork("f", [[simple("a", "echo")]]),
                                  join("j", "before")]}, {"echo": echo})


def test_a_join_without_a_fork_is_rejected() -> None:
    with pytest.raises(FlowDefinitionError, match=r"join task 'j' \(tasks\[1\]\) does not follow"):
        conductor.load({"tasks": [simple("a", "echo"), join("j", "a")]}, {"echo": echo})


def test_a_task_name_missing_from_the_registry_is_rejected_naming_task_and_name() -> None:
    with pytest.raises(FlowDefinitionError) as info:
        conductor.load({"tasks": [fork("f", [[simple("mail_ref", "send_mail")]]), join("j")]},
                       {"echo": echo})
    message = str(info.value)
    assert "task 'mail_ref' (tasks[0].forkTasks[0][0]) uses name 'send_mail'" in message
    assert "not in the registry" in message and "'echo'" in message


def test_a_registry_entry_that_is_not_callable_is_rejected() -> None:
    with pytest.raises(FlowDefinitionError, match="registry entry 'echo'.*is not callable"):
        conductor.load({"tasks": [simple("a", "echo")]}, {"echo": 42})


def test_duplicate_reference_names_are_rejected_naming_both_places() -> None:
    with pytest.raises(FlowDefinitionError,
                       match=r"duplicate taskReferenceName 'a': tasks\[0\] and tasks\[1\]\.forkTasks\[0\]\[0\]"):
        conductor.load({"tasks": [simple("a", "echo"), fork("f", [[simple("a", "echo")]]),
                                  join("j")]}, {"echo": echo})


def test_an_unsupported_task_type_is_named_with_the_supported_ones() -> None:
    with pytest.raises(FlowDefinitionError) as info:
        conductor.load({"tasks": [{"name": "call", "taskReferenceName": "call_ref",
                                   "type": "TELEPORT"}]}, {})
    message = str(info.value)
    assert "task 'call_ref' (tasks[0]) has unsupported type 'TELEPORT'" in message
    assert all(t in message for t in SUPPORTED_TYPES)


@pytest.mark.parametrize(("expression", "reason"), [
    ("${workflow.input.x", "unclosed"),
    ("${}", "empty expression"),
    ("${a.${b}}", "nested"),
    ("${workflow.secrets.key}", "workflow.secrets is not supported"),
    ("${a.colour}", "a.colour is not supported"),
    ("${a.output[*]}", "cannot read the path"),
    ("${workflow}", "must be followed by a field"),
])
def test_a_malformed_expression_is_rejected_naming_the_task(expression: str, reason: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        conductor.load({"tasks": [simple("a", "echo"),
                                  simple("b_ref", "echo", inputParameters={"p": {"q": expression}})]},
                       {"echo": echo})
    message = str(info.value)
    assert "task 'b_ref' (tasks[1])" in message and "inputParameters.p.q" in message
    assert "malformed expression" in message and reason in message


def test_an_expression_naming_an_unknown_task_is_rejected() -> None:
    with pytest.raises(FlowDefinitionError,
                       match=r"task 'a' \(tasks\[0\]\): expression '\$\{ghost\.output\.x\}'.*names task 'ghost'"):
        conductor.load({"tasks": [simple("a", "echo", inputParameters={"v": "${ghost.output.x}"})]},
                       {"echo": echo})


@pytest.mark.parametrize(("fields", "message"), [
    ({"evaluatorType": "python"}, "evaluatorType 'python', which is not supported"),
    ({"evaluatorType": None}, "has no evaluatorType"),
    ({"expression": "other"}, "malformed expression 'other'"),
])
def test_a_switch_needs_a_value_param_expression_naming_an_input(fields: dict[str, Any],
                                                                 message: str) -> None:
    task = switch("sw", "${workflow.input.v}", {"a": [simple("a", "echo")]})
    task.update(fields)
    with pytest.raises(FlowDefinitionError, match=message):
        conductor.load({"tasks": [task]}, {"echo": echo})


def test_unsupported_fields_are_reported_not_ignored(taskflow_logs: list[dict[str, Any]]) -> None:
    wf = conductor.load({"name": "wf", "failureWorkflow": "cleanup", "tasks": [
        simple("a", "echo", startDelay=5, asyncComplete=False, joinOn=[]),
        simple("b", "echo", rateLimited=True),
    ]}, {"echo": echo})
    assert len(wf.warnings) == 3
    assert any("workflow field 'failureWorkflow'" in w for w in wf.warnings)
    assert any("task 'a' (tasks[0]): field 'startDelay'" in w for w in wf.warnings)
    assert any("task 'b' (tasks[1]): field 'rateLimited'" in w for w in wf.warnings)
    logged = [r["message"] for r in taskflow_logs if r["level"].name == "WARNING"]
    assert len(logged) == 3 and all("is not supported in-process" in m for m in logged)


def test_the_example_definition_loads_without_warnings() -> None:
    assert conductor.load(EXAMPLE, notifications().REGISTRY).warnings == []


# -- command line -------------------------------------------------------------------------------


def test_cli_graph_prints_the_mermaid_flowchart(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["graph", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("---\ntitle: notification_workflow\n---\nflowchart TD\n")
    assert '[\\"notification_join_ref"/]' in out


def test_cli_graph_prints_dot_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["graph", str(EXAMPLE), "--format", "dot"]) == 0
    assert capsys.readouterr().out.startswith("digraph taskflow {")


def test_cli_run_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    notifications()  # importable as a module from the examples folder (the file's directory)
    status = cli_main(["run", str(EXAMPLE), "--registry", "conductor_notifications",
                       "--import-file-dir", "--input", '{"user": "bob", "message": "hi"}'])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    report = json.loads(captured.out)
    assert report["ok"] is True
    assert {n["name"] for n in report["nodes"]} >= {"notification_join_ref", "http_notification_ref"}
    assert "notification_workflow: COMPLETED" in captured.err


def test_cli_run_of_a_conductor_workflow_needs_a_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["run", str(EXAMPLE)]) == 2
    assert "needs --registry" in capsys.readouterr().err


def test_cli_reports_an_invalid_definition_with_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tasks": [fork("f", [[simple("a", "echo")]])]}))
    assert cli_main(["graph", str(bad)]) == 2
    assert "fork task 'f' (tasks[0]) is not followed by a join task" in capsys.readouterr().err


def test_python_m_taskflow_has_the_graph_and_run_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from taskflow import cli

    parser = cli.build_parser()
    choices = next(a.choices for a in parser._actions if getattr(a, "choices", None))
    assert {"demo", "graph", "run"} <= set(choices)
    assert cli.main(["graph", str(EXAMPLE)]) == 0
    assert "flowchart TD" in capsys.readouterr().out
