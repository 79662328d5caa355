"""Conductor's system tasks run in-process, from definitions shaped as Conductor documents them.

The fixtures in ``tests/conductor_fixtures`` follow the examples of Conductor's documentation of
each task type (INLINE, LAMBDA, DO_WHILE, DECISION + EXCLUSIVE_JOIN, JSON_JQ_TRANSFORM,
SET_VARIABLE, SWITCH with javascript, TERMINATE, DYNAMIC, SUB_WORKFLOW).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG

from taskflow import FlowDefinitionError, ResultState, TaskContext, conductor
from taskflow.declare.conductor import TaskFailedError

FIXTURES = Path(__file__).resolve().parents[1] / "conductor_fixtures"


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conductor-sys")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def echo(task_input: dict[str, Any]) -> dict[str, Any]:
    return dict(task_input)


def simple(ref: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"name": name or ref, "taskReferenceName": ref, "type": "SIMPLE", **fields}


def states(result: Any) -> dict[str, str]:
    return {name: state.name for name, state in result.states().items()}


# -- INLINE, LAMBDA -----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(1, True), (2, False)])
def test_inline_and_lambda_run_the_documented_scripts(pool: ThreadPoolExecutor, value: int,
                                                      expected: bool) -> None:
    wf = conductor.load(FIXTURES / "inline_lambda.json", {})
    run = wf.run({"value": value}, executor=pool)
    assert run.status == "COMPLETED"
    assert run.result.outputs["inline_task_example"] == {"result": {"result": expected}}
    assert run.result.outputs["lambda_test"] == {"result": {"testvalue": expected}}
    assert run.output == {"inline": expected, "lambda": expected}


def test_inline_value_is_the_completion_value_of_the_script(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "calc", "taskReferenceName": "calc", "type": "INLINE",
        "inputParameters": {"a": "${workflow.input.a}", "evaluatorType": "javascript",
                            "expression": "var x = $.a * 2; [x, x + 1, {k: null}]"}}]}, {})
    run = wf.run({"a": 20}, executor=pool)
    assert run.result.outputs["calc"] == {"result": [40, 41, {"k": None}]}


def test_inline_value_param_evaluator_reads_an_input(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "pick", "taskReferenceName": "pick", "type": "INLINE",
        "inputParameters": {"v": [1, 2], "evaluatorType": "value-param", "expression": "v"}}]}, {})
    assert wf.run(executor=pool).result.outputs["pick"] == {"result": [1, 2]}


def test_a_script_that_throws_fails_its_task_with_the_message(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "bad", "taskReferenceName": "bad", "type": "INLINE",
        "inputParameters": {"evaluatorType": "javascript",
                            "expression": "throw new Error('no stock')"}}]}, {})
    run = wf.run(executor=pool)
    assert run.status == "FAILED" and run.failed_task == "bad"
    error = run.result.result_of("bad").exception
    assert isinstance(error, conductor.ScriptError) and "no stock" in str(error)


def test_inline_without_an_expression_is_refused_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match=r"inline task 'i' \(tasks\[0\]\) has no"):
        conductor.load({"tasks": [{"name": "i", "taskReferenceName": "i", "type": "INLINE",
                                   "inputParameters": {"evaluatorType": "javascript"}}]}, {})


# -- SWITCH (javascript), DECISION, EXCLUSIVE_JOIN ----------------------------------------------


@pytest.mark.parametrize(("carrier", "ran", "skipped"), [("fedex", "terminate0", "ship_ups"),
                                                          ("dhl", "ship_ups", "terminate0")])
def test_switch_with_a_javascript_expression_chooses_its_case(
    pool: ThreadPoolExecutor, carrier: str, ran: str, skipped: str,
) -> None:
    wf = conductor.load(FIXTURES / "jq_variables_terminate.json", {"ship": echo})
    run = wf.run({"carrier": carrier}, executor=pool)
    assert run.result.result_of(ran).state is ResultState.SUCCESS
    assert run.result.result_of(skipped).state is ResultState.SKIPPED
    expected = "fedex" if carrier == "fedex" else "ups"
    assert run.result.outputs["switch_task"] == {"evaluationResult": [expected],
                                                 "selectedCase": expected}


def test_graaljs_is_the_same_evaluator(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "sw", "taskReferenceName": "sw", "type": "SWITCH", "evaluatorType": "graaljs",
        "expression": "$.n > 10 ? 'big' : 'small'", "inputParameters": {"n": 42},
        "decisionCases": {"big": [simple("big", "echo")]}}]}, {"echo": echo})
    assert states(wf.run(executor=pool).result)["big"] == "SUCCESS"


@pytest.mark.parametrize(("movie_type", "ran", "join_output"), [
    ("Show", "task2", {"kind": "show"}),
    ("Movie", "task3", {"kind": "movie"}),
    ("Documentary", None, {"payload": 7}),  # no case: the default join task's output
])
def test_decision_with_case_value_param_and_exclusive_join(
    pool: ThreadPoolExecutor, movie_type: str, ran: str | None, join_output: dict[str, Any],
) -> None:
    registry = {"task1": echo, "setup_episodes": echo, "setup_movie": echo}
    wf = conductor.load(FIXTURES / "decision_exclusive_join.json", registry)
    run = wf.run({"movieType": movie_type, "payload": 7}, executor=pool)
    assert run.status == "COMPLETED"
    assert run.result.outputs["decide1"] == {"caseOutput": [movie_type]}
    assert run.result.outputs["exclusiveJoin"] == join_output
    for ref in ("task2", "task3"):
        expected = ResultState.SUCCESS if ref == ran else ResultState.SKIPPED
        assert run.result.result_of(ref).state is expected


def test_decision_with_a_case_expression(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "d", "taskReferenceName": "d", "type": "DECISION",
        "caseExpression": "$.amount > 100 ? 'review' : 'auto'",
        "inputParameters": {"amount": "${workflow.input.amount}"},
        "decisionCases": {"review": [simple("review", "echo")],
                          "auto": [simple("auto", "echo")]}}]}, {"echo": echo})
    assert states(wf.run({"amount": 500}, executor=pool).result)["review"] == "SUCCESS"
    assert states(wf.run({"amount": 5}, executor=pool).result)["auto"] == "SUCCESS"


def _decision(case_expression: str) -> dict[str, Any]:
    return {"tasks": [{
        "name": "d", "taskReferenceName": "d", "type": "DECISION",
        "caseValueParam": "kind", "caseExpression": case_expression,
        "inputParameters": {"kind": "${workflow.input.kind}",
                            "amount": "${workflow.input.amount}"},
        "decisionCases": {"review": [simple("review", "echo")],
                          "auto": [simple("auto", "echo")]}}]}


def test_a_decision_with_both_evaluates_its_case_expression_as_conductor_does(
        pool: ThreadPoolExecutor) -> None:
    # Conductor's DecisionTaskMapper evaluates caseExpression whenever it is not blank
    wf = conductor.load(_decision("$.amount > 100 ? 'review' : 'auto'"), {"echo": echo})
    run = wf.run({"kind": "auto", "amount": 500}, executor=pool)
    assert run.result.outputs["d"] == {"caseOutput": ["review"]}
    assert states(run.result)["review"] == "SUCCESS"
    assert states(run.result)["auto"] == "SKIPPED"
    blank = conductor.load(_decision("  "), {"echo": echo})
    run = blank.run({"kind": "auto", "amount": 500}, executor=pool)
    assert run.result.outputs["d"] == {"caseOutput": ["auto"]}


def test_javascript_of_a_decision_or_switch_that_does_not_parse_is_refused_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match=r"decision task 'd' \(tasks\[0\]\): "
                                                  "caseExpression is not valid JavaScript: "
                                                  "SyntaxError"):
        conductor.load(_decision("$.amount > "), {"echo": echo})
    switch = {"tasks": [{
        "name": "s", "taskReferenceName": "s", "type": "SWITCH", "evaluatorType": "javascript",
        "expression": "$.kind == 'a' ? 'a' :", "inputParameters": {"kind": "a"},
        "decisionCases": {"a": [simple("a", "echo")]}}]}
    with pytest.raises(FlowDefinitionError, match=r"switch task 's' \(tasks\[0\]\): "
                                                  "expression is not valid JavaScript"):
        conductor.load(switch, {"echo": echo})
    # parsed, never run: a script that would loop forever loads
    switch["tasks"][0]["expression"] = "while (true) {}"
    conductor.load(switch, {"echo": echo})


def test_a_case_expression_that_throws_fails_the_workflow(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load(_decision("(function () { throw new Error('no case'); })()"),
                        {"echo": echo})
    run = wf.run({"kind": "auto", "amount": 5}, executor=pool)
    assert run.status == "FAILED"
    assert "no case" in str(run.result.result_of("d").exception)
    assert states(run.result)["auto"] != "SUCCESS" and states(run.result)["review"] != "SUCCESS"


def test_exclusive_join_naming_an_unknown_task_is_refused() -> None:
    with pytest.raises(FlowDefinitionError, match=r"joinOn names 'ghost'"):
        conductor.load({"tasks": [simple("a", "echo"), {
            "name": "x", "taskReferenceName": "x", "type": "EXCLUSIVE_JOIN",
            "joinOn": ["ghost"]}]}, {"echo": echo})


# -- DYNAMIC, NOOP ------------------------------------------------------------------------------


def test_dynamic_runs_the_task_named_in_its_input(pool: ThreadPoolExecutor) -> None:
    calls: list[str] = []

    def resize(task_input: dict[str, Any]) -> dict[str, Any]:
        calls.append("resize")
        return {"resized": task_input["files"]}

    wf = conductor.load(FIXTURES / "dynamic.json", {"resize": resize, "crop": echo})
    run = wf.run({"files": ["a.png"], "user_supplied_task": "resize"}, executor=pool)
    assert run.result.outputs["t1"] == {"resized": ["a.png"]} and calls == ["resize"]
    run = wf.run({"files": [], "user_supplied_task": "nope"}, executor=pool)
    assert run.status == "FAILED"
    assert "task name 'nope' is not in the registry" in str(run.result.result_of("t1").exception)


def test_noop_completes_with_an_empty_output(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{"name": "n", "taskReferenceName": "n", "type": "NOOP"}]}, {})
    assert wf.run(executor=pool).result.outputs == {"n": {}}


# -- JSON_JQ_TRANSFORM, SET_VARIABLE, TERMINATE -------------------------------------------------


def test_jq_transform_outputs_result_and_result_list(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load(FIXTURES / "jq_variables_terminate.json", {"ship": echo})
    run = wf.run({"carrier": "ups"}, executor=pool)
    assert run.result.outputs["my_jq_example_task"] == {
        "result": {"key3": ["a", "b", "c", "d"]}, "resultList": [{"key3": ["a", "b", "c", "d"]}]}


def test_jq_program_with_several_outputs_and_a_failing_program(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "many", "taskReferenceName": "many", "type": "JSON_JQ_TRANSFORM",
         "inputParameters": {"xs": [1, 2, 3], "queryExpression": ".xs[] | . * 10"}},
        {"name": "bad", "taskReferenceName": "bad", "type": "JSON_JQ_TRANSFORM",
         "inputParameters": {"queryExpression": ".a | error(\"nope\")"}},
    ]}, {})
    run = wf.run(executor=pool)
    assert run.result.outputs["many"] == {"result": 10, "resultList": [10, 20, 30]}
    error = run.result.result_of("bad").exception
    assert isinstance(error, TaskFailedError) and "nope" in str(error)
    assert "nope" in error.output["error"]


def test_set_variable_is_read_by_later_tasks_and_the_workflow_output(
    pool: ThreadPoolExecutor,
) -> None:
    wf = conductor.load(FIXTURES / "jq_variables_terminate.json", {"ship": echo})
    run = wf.run({"carrier": "ups"}, executor=pool)
    assert run.variables == {"name": "Orkes", "letters": ["a", "b", "c", "d"]}
    assert run.result.outputs["ship_ups"] == {"letters": ["a", "b", "c", "d"]}
    assert run.output == {"letters": ["a", "b", "c", "d"], "by": "ups"}
    assert run.status == "COMPLETED"


def test_terminate_ends_the_workflow_with_its_status_and_output(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load(FIXTURES / "jq_variables_terminate.json", {"ship": echo})
    run = wf.run({"carrier": "fedex"}, executor=pool)
    assert run.status == "COMPLETED"
    assert run.output == {"who": "Orkes", "by": "fedex"}
    assert run.reason == "fedex orders stop here"
    assert "never_after_terminate" not in run.result.outputs  # nothing runs after it
    assert run.result.outputs["terminate0"] == {"output": {"who": "Orkes", "by": "fedex"}}
    assert wf.status(run.result) == "COMPLETED"
    assert wf.output(run.result) == {"who": "Orkes", "by": "fedex"}


def test_terminate_with_failed_status_fails_the_workflow(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "t", "taskReferenceName": "t", "type": "TERMINATE",
         "inputParameters": {"terminationStatus": "FAILED", "terminationReason": "bad order"}},
        simple("after", "echo"),
    ]}, {"echo": echo})
    run = wf.run(executor=pool)
    assert run.status == "FAILED" and run.reason == "bad order"
    assert states(run.result)["after"] == "CANCELLED"


def test_terminate_with_an_unknown_status_is_refused_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match="terminationStatus 'DONE'"):
        conductor.load({"tasks": [{"name": "t", "taskReferenceName": "t", "type": "TERMINATE",
                                   "inputParameters": {"terminationStatus": "DONE"}}]}, {})


# -- WAIT, EVENT --------------------------------------------------------------------------------


def test_wait_with_a_duration_waits_then_goes_on(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "w", "taskReferenceName": "w", "type": "WAIT",
         "inputParameters": {"duration": "0.05s"}},
        simple("after", "echo"),
    ]}, {"echo": echo})
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED"
    assert run.result.result_of("w").duration >= 0.05  # type: ignore[operator]


def test_a_wait_longer_than_the_budget_times_out_with_the_run(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "w", "taskReferenceName": "w", "type": "WAIT",
         "inputParameters": {"duration": "2 days"}}]}, {})
    run = wf.run(executor=pool, timeout=0.1)
    assert run.status == "TIMED_OUT"


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("10m20s", 620), ("1h 30m", 5400),
                                               ("2 days 3 hours", 183600), ("250ms", 0.25)])
def test_wait_durations_are_read_as_conductor_writes_them(text: str, seconds: float) -> None:
    from taskflow.declare.conductor.tasks.control import parse_duration

    assert parse_duration(text) == pytest.approx(seconds)


NOW = datetime(2024, 4, 30, 10, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(("text", "seconds"), [
    ("2024-04-30 15:20 GMT+04:00", 80 * 60),  # Conductor's documentation example
    ("2024-04-30 15:20", (5 * 60 + 20) * 60),  # no zone: UTC
    ("2024-04-30 15:20 UTC", (5 * 60 + 20) * 60),
    ("2024-04-30 15:20 GMT", (5 * 60 + 20) * 60),
    ("2024-04-30 15:20 +0400", 80 * 60),
    ("2024-04-30 15:20 GMT-4", (9 * 60 + 20) * 60),
    ("2024-04-30 15:20 Europe/Paris", (3 * 60 + 20) * 60),  # CEST, +02:00
    ("2024-05-01", 14 * 3600),
    ("2022-12-31 11:59", 0.0),  # already past: no wait
])
def test_wait_until_reads_conductors_patterns_and_time_zones(text: str, seconds: float) -> None:
    from taskflow.declare.conductor.tasks.control import until_seconds

    assert until_seconds(text, NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["30/04/2024", "2024-04-30 15:20 Mars/Olympus", "tomorrow",
                                  "2024-04-30 15:20 GMT+25:00"])
def test_a_literal_until_that_is_no_time_is_refused_at_load(text: str) -> None:
    with pytest.raises(FlowDefinitionError, match="wait task 'w'.*is not a time such as"):
        conductor.load({"tasks": [{"name": "w", "taskReferenceName": "w", "type": "WAIT",
                                   "inputParameters": {"until": text}}]}, {})


def test_a_wait_until_a_past_time_goes_on_at_once(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "wait", "taskReferenceName": "wait_till_jan_end_ref", "type": "WAIT",
         "inputParameters": {"until": "2024-04-30 15:20 GMT+04:00"}},
        simple("after", "echo"),
    ]}, {"echo": echo})
    run = wf.run(executor=pool, timeout=LONG)
    assert run.status == "COMPLETED"
    assert run.result.result_of("after").state is ResultState.SUCCESS


def test_a_wait_with_both_duration_and_until_is_refused_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match="wait task 'w'.*has both duration and until"):
        conductor.load({"tasks": [{"name": "w", "taskReferenceName": "w", "type": "WAIT",
                                   "inputParameters": {"duration": "1s",
                                                       "until": "2024-04-30 15:20"}}]}, {})


def test_a_wait_for_a_signal_and_an_event_without_a_sink_are_refused_together() -> None:
    with pytest.raises(FlowDefinitionError) as info:
        conductor.load({"tasks": [
            {"name": "w", "taskReferenceName": "signal", "type": "WAIT"},
            {"name": "e", "taskReferenceName": "notify", "type": "EVENT", "sink": "sqs:q"},
        ]}, {})
    message = str(info.value)
    assert "task 'signal' (tasks[0]) has type 'WAIT' without a duration" in message
    assert "task 'notify' (tasks[1]) has type 'EVENT', which needs an event_sink" in message


def test_event_publishes_to_the_sink_given_to_load(pool: ThreadPoolExecutor) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    def sink(name: str, payload: dict[str, Any]) -> dict[str, Any]:
        sent.append((name, payload))
        return {"messageId": "m-1"}

    wf = conductor.load({"name": "orders", "tasks": [
        {"name": "e", "taskReferenceName": "notify", "type": "EVENT", "sink": "conductor:orders",
         "inputParameters": {"order": "${workflow.input.order}"}}]}, {}, event_sink=sink)
    run = wf.run({"order": 9}, executor=pool)
    assert sent == [("conductor:orders", {"order": 9})]
    out = run.result.outputs["notify"]
    assert out["sink"] == "conductor:orders" and out["messageId"] == "m-1"
    assert out["workflowType"] == "orders"


# -- DO_WHILE -----------------------------------------------------------------------------------


def test_a_do_while_without_a_loop_condition_is_refused_unless_it_iterates_items(
        pool: ThreadPoolExecutor) -> None:
    body = [simple("step", "echo")]
    with pytest.raises(FlowDefinitionError, match=r"do_while task 'loop' \(tasks\[0\]\) has no "
                                                  r"loopCondition \(and no items to iterate\)"):
        conductor.load({"tasks": [{"name": "loop", "taskReferenceName": "loop",
                                   "type": "DO_WHILE", "loopOver": body}]}, {"echo": echo})
    wf = conductor.load({"tasks": [{"name": "loop", "taskReferenceName": "loop",
                                    "type": "DO_WHILE", "items": "${workflow.input.skus}",
                                    "loopOver": body}]}, {"echo": echo})
    run = wf.run({"skus": ["a", "b"]}, executor=pool)
    assert run.status == "COMPLETED" and set(run.result.outputs["loop"]) >= {"1", "2"}


def test_an_empty_loop_condition_is_a_condition_that_is_false(pool: ThreadPoolExecutor) -> None:
    # Conductor refuses only a missing (null) loopCondition; "" evaluates to false, so the
    # loop runs once (Conductor's own terminate_task_terminated_status_in_do_while_test has it)
    wf = conductor.load({"tasks": [{"name": "loop", "taskReferenceName": "loop",
                                    "type": "DO_WHILE", "loopCondition": "",
                                    "loopOver": [simple("step", "echo")]}]}, {"echo": echo})
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED" and run.result.outputs["loop"]["iteration"] == 1


def test_an_optional_terminate_is_refused_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match=r"terminate task 'stop' \(tasks\[0\]\) is "
                                                  "optional; a TERMINATE task cannot be"):
        conductor.load({"tasks": [{"name": "stop", "taskReferenceName": "stop",
                                   "type": "TERMINATE", "optional": True,
                                   "inputParameters": {"terminationStatus": "COMPLETED"}}]}, {})


def loop_registry(log: list[Any]) -> dict[str, Any]:
    def first(task_input: dict[str, Any]) -> dict[str, Any]:
        log.append(task_input["iteration"])
        return {"response": {"body": task_input["iteration"] * 2}}

    return {"first": first, "second": lambda i: {"seen": i["seen"]}, "after": echo}


def test_do_while_keys_each_iteration_as_conductor_does(pool: ThreadPoolExecutor) -> None:
    log: list[Any] = []
    wf = conductor.load(FIXTURES / "do_while.json", loop_registry(log))
    run = wf.run({"value": 3}, executor=pool)
    assert run.status == "COMPLETED"
    assert log == [1, 2, 3]  # ${LoopTask.output.iteration} inside the loop
    assert run.result.outputs["LoopTask"] == {
        "iteration": 3,
        "1": {"first_task": {"response": {"body": 2}}, "second_task": {"seen": 2}},
        "2": {"first_task": {"response": {"body": 4}}, "second_task": {"seen": 4}},
        "3": {"first_task": {"response": {"body": 6}}, "second_task": {"seen": 6}},
    }
    # after the loop, a loop task's expression reads its last iteration
    assert run.result.outputs["after_loop"] == {"last": 6, "loops": 3}


def test_do_while_runs_once_before_checking_its_condition(pool: ThreadPoolExecutor) -> None:
    log: list[Any] = []
    wf = conductor.load(FIXTURES / "do_while.json", loop_registry(log))
    run = wf.run({"value": 0}, executor=pool)
    assert log == [1] and run.result.outputs["LoopTask"]["iteration"] == 1


def test_do_while_is_bounded(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
        "loopCondition": "true", "loopOver": [simple("step", "echo")]}]},
        {"echo": echo}, max_loop_iterations=5)
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    error = run.result.result_of("loop").exception
    assert isinstance(error, TaskFailedError) and "max_loop_iterations=5" in str(error)
    assert error.output["iteration"] == 5 and "5" in error.output and "6" not in error.output


def test_a_failed_loop_task_fails_the_loop_with_its_output_so_far(
    pool: ThreadPoolExecutor,
) -> None:
    def second(task_input: dict[str, Any]) -> dict[str, Any]:
        if task_input["seen"] == 4:
            raise RuntimeError("disk full")
        return {"seen": task_input["seen"]}

    registry = loop_registry([]) | {"second": second}
    run = conductor.load(FIXTURES / "do_while.json", registry).run({"value": 5}, executor=pool)
    assert run.status == "FAILED" and run.failed_task == "LoopTask"
    error = run.result.result_of("LoopTask").exception
    assert isinstance(error, TaskFailedError)
    assert "iteration 2 failed: task 'second_task'" in str(error) and "disk full" in str(error)
    assert error.output["1"]["second_task"] == {"seen": 2}
    assert states(run.result)["after_loop"] in ("EXCEPTION", "CANCELLED")


def test_do_while_on_a_one_worker_pool_does_not_deadlock() -> None:
    log: list[Any] = []
    with ThreadPoolExecutor(1, thread_name_prefix="conductor-one") as one:
        wf = conductor.load(FIXTURES / "do_while.json", loop_registry(log))
        run = wf.run({"value": 2}, executor=one, timeout=30)
    assert run.status == "COMPLETED" and log == [1, 2]


def test_do_while_body_with_a_fork_and_a_switch(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
        "loopCondition": "$.loop.iteration < 2",
        "loopOver": [
            {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
             "forkTasks": [[simple("a", "echo", inputParameters={"i": "${loop.output.iteration}"})],
                           [simple("b", "echo", inputParameters={"k": 1})]]},
            {"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": ["a", "b"]},
            {"name": "sw", "taskReferenceName": "sw", "type": "SWITCH",
             "evaluatorType": "value-param", "expression": "i",
             "inputParameters": {"i": "${a.output.i}"},
             "decisionCases": {"2": [simple("second", "echo")]}},
        ]}]}, {"echo": echo})
    run = wf.run(executor=pool)
    out = run.result.outputs["loop"]
    assert out["iteration"] == 2
    assert out["1"]["join"] == {"a": {"i": 1}, "b": {"k": 1}}
    assert "second" not in out["1"] and out["2"]["second"] == {}


def test_a_loop_condition_that_throws_fails_the_loop(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
        "loopCondition": "$.nothing.here > 1", "loopOver": [simple("s", "echo")]}]},
        {"echo": echo})
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    assert isinstance(run.result.result_of("loop").exception, conductor.ScriptError)



def test_do_while_over_items_exposes_loop_item_and_index(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "each", "taskReferenceName": "each", "type": "DO_WHILE",
        "items": "${workflow.input.skus}",
        "loopOver": [simple("check", "echo", inputParameters={
            "sku": "${each.output.loopItem}", "i": "${each.output.loopIndex}"})]}]},
        {"echo": echo})
    out = wf.run({"skus": ["a", "b", "c"]}, executor=pool).result.outputs["each"]
    assert out["iteration"] == 3
    assert [out[str(n)]["check"] for n in (1, 2, 3)] == [
        {"sku": "a", "i": 0}, {"sku": "b", "i": 1}, {"sku": "c", "i": 2}]
    empty = wf.run({"skus": []}, executor=pool)
    assert empty.status == "COMPLETED" and empty.result.outputs["each"] == {}
    bad = wf.run({"skus": "abc"}, executor=pool)
    assert bad.status == "FAILED" and "items must give a list" in (bad.reason or "")


def test_do_while_keep_last_n_keeps_only_the_last_iterations(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
        "inputParameters": {"keepLastN": 2},
        "loopCondition": "$.loop.iteration < 5", "loopOver": [simple("s", "echo")]}]},
        {"echo": echo})
    out = wf.run(executor=pool).result.outputs["loop"]
    assert out["iteration"] == 5 and sorted(k for k in out if k != "iteration") == ["4", "5"]


def test_an_optional_loop_task_failure_does_not_fail_the_loop(pool: ThreadPoolExecutor) -> None:
    def broken(task_input: dict[str, Any]) -> dict[str, Any]:
        raise TaskFailedError("flaky", {"tried": True})

    wf = conductor.load({"tasks": [{
        "name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
        "loopCondition": "$.loop.iteration < 2",
        "loopOver": [simple("maybe", "broken", optional=True)]}]}, {"broken": broken})
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED"
    assert run.result.outputs["loop"]["2"] == {"maybe": {"tried": True}}

# -- SUB_WORKFLOW -------------------------------------------------------------------------------


def test_sub_workflow_by_name_and_version(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load(FIXTURES / "sub_workflow_parent.json", {"report": echo},
                        workflows=[FIXTURES / "sub_workflow_child.json"])
    run = wf.run({"mod": 3, "oddEven": "guess"}, executor=pool)
    assert run.status == "COMPLETED"
    out = run.result.outputs["subworkflow_task"]
    assert out["parity"] == "odd" and out["asked"] == "guess" and out["subWorkflowId"]
    assert run.result.outputs["report"] == {"parity": "odd"}


def test_workflows_given_as_a_mapping_of_name_to_definition(pool: ThreadPoolExecutor) -> None:
    child = json.loads((FIXTURES / "sub_workflow_child.json").read_text())
    unnamed = {k: v for k, v in child.items() if k != "name"}
    for given in ({"sub_flow": FIXTURES / "sub_workflow_child.json"}, {"sub_flow": unnamed}):
        wf = conductor.load(FIXTURES / "sub_workflow_parent.json", {"report": echo},
                            workflows=given)
        run = wf.run({"mod": 3, "oddEven": "guess"}, executor=pool)
        assert run.status == "COMPLETED", given
        assert run.result.outputs["report"] == {"parity": "odd"}


def test_workflows_keyed_by_another_name_or_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(FlowDefinitionError, match=r"workflows\['other'\] is the definition of 'sub_flow'"):
        conductor.load(FIXTURES / "sub_workflow_parent.json", {"report": echo},
                       workflows={"other": FIXTURES / "sub_workflow_child.json"})
    for wrong in (str(FIXTURES / "sub_workflow_child.json"), 42):
        with pytest.raises(TypeError, match="workflows must be an iterable of workflow "
                                            "definitions or a mapping name -> definition"):
            conductor.load(FIXTURES / "sub_workflow_parent.json", {"report": echo},
                           workflows=wrong)  # type: ignore[arg-type]


def test_sub_workflow_with_an_inline_definition_and_its_failure(pool: ThreadPoolExecutor) -> None:
    def broken(task_input: dict[str, Any]) -> dict[str, Any]:
        raise TaskFailedError("card declined", {"code": 51})

    definition = {"name": "pay", "tasks": [simple("charge", "charge")],
                  "outputParameters": {"code": "${charge.output.code}"}}
    wf = conductor.load({"tasks": [{
        "name": "sub", "taskReferenceName": "sub", "type": "SUB_WORKFLOW",
        "inputParameters": {"amount": 5},
        "subWorkflowParam": {"name": "pay", "workflowDefinition": definition}}]},
        {"charge": broken})
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    error = run.result.result_of("sub").exception
    assert isinstance(error, TaskFailedError)
    assert "workflow 'pay' ended FAILED" in str(error) and error.output["code"] == 51


def test_sub_workflow_naming_an_unknown_definition_is_refused() -> None:
    with pytest.raises(FlowDefinitionError, match=r"no definition of workflow 'ghost'"):
        conductor.load({"tasks": [{"name": "s", "taskReferenceName": "s", "type": "SUB_WORKFLOW",
                                   "subWorkflowParam": {"name": "ghost"}}]}, {})


def test_sub_workflow_picks_the_highest_version_without_one(pool: ThreadPoolExecutor) -> None:
    def version(n: int) -> dict[str, Any]:
        return {"name": "child", "version": n, "tasks": [{
            "name": "v", "taskReferenceName": "v", "type": "INLINE",
            "inputParameters": {"evaluatorType": "javascript", "expression": str(n)}}]}

    wf = conductor.load({"tasks": [{"name": "s", "taskReferenceName": "s", "type": "SUB_WORKFLOW",
                                    "subWorkflowParam": {"name": "child"}}]}, {},
                        workflows=[version(1), version(3), version(2)])
    assert wf.run(executor=pool).result.outputs["s"]["result"] == 3



OWN = FIXTURES / "conductor-oss" / "test-harness"


def own(name: str) -> dict[str, Any]:
    """One of Conductor's own definitions (see conductor-oss/SOURCE.md)."""
    return json.loads((OWN / f"{name}.json").read_text(encoding="utf-8"))


def op(name: str) -> Any:
    return lambda task_input: {"op": name, **task_input}


OPS = {n: op(n) for n in ("integration_task_1", "integration_task_2", "simple_task_in_sub_wf")}


def test_a_sub_workflow_named_by_an_expression_is_chosen_when_it_runs(
    pool: ThreadPoolExecutor,
) -> None:
    # Conductor's own: the root runs itself (with other input), which runs integration_test_wf
    wf = conductor.load(own("workflow_with_sub_workflow_1_integration_test"), OPS,
                        workflows=[own("simple_workflow_1_integration_test")])
    run = wf.run({"param1": "p1", "param2": "p2", "subwf": "integration_test_wf_with_sub_wf",
                  "nextSubwf": "integration_test_wf"}, executor=pool, timeout=LONG)
    assert run.status == "COMPLETED", run.reason
    assert run.result.outputs["t2"]["o3"] == "integration_task_1"
    direct = wf.run({"param1": "p1", "param2": "p2", "subwf": "integration_test_wf"},
                    executor=pool, timeout=LONG)
    assert direct.status == "COMPLETED"
    assert direct.result.outputs["t2"]["o1"] == "p1"  # integration_test_wf's own output


def test_a_sub_workflow_name_that_matches_no_definition_fails_the_task_naming_it(
    pool: ThreadPoolExecutor,
) -> None:
    wf = conductor.load(own("workflow_with_sub_workflow_1_integration_test"), OPS,
                        workflows=[own("simple_workflow_1_integration_test")])
    run = wf.run({"subwf": "ghost_wf"}, executor=pool, timeout=LONG)
    assert run.status == "FAILED" and run.failed_task == "t2"
    assert "no workflow 'ghost_wf' version 1 was passed to load(workflows=...)" in run.reason
    assert "'integration_test_wf'" in run.reason  # what it could have named


def test_a_sub_workflow_chosen_by_expression_needs_candidates_at_load() -> None:
    with pytest.raises(FlowDefinitionError, match=r"sub_workflow task 't2' \(tasks\[1\]\) "
                       r"chooses its workflow when it runs \(name '\$\{workflow.input.subwf\}'"
                       r"\) among the definitions passed to load\(workflows=...\), and none "
                       r"was passed"):
        conductor.load(own("workflow_with_sub_workflow_1_integration_test"), OPS)


def test_a_candidate_that_cannot_run_in_process_fails_the_task_only_when_chosen(
    pool: ThreadPoolExecutor,
) -> None:
    waits = {"name": "waits", "version": 1, "tasks": [
        {"name": "w", "taskReferenceName": "w", "type": "WAIT"}]}
    wf = conductor.load(own("workflow_with_sub_workflow_1_integration_test"), OPS,
                        workflows=[own("simple_workflow_1_integration_test"), waits])
    assert any("may choose workflow 'waits' version 1" in w for w in wf.warnings)
    run = wf.run({"subwf": "waits"}, executor=pool, timeout=LONG)
    assert run.status == "FAILED"
    assert "workflow 'waits' version 1 cannot run in-process" in run.reason
    assert "waits for a signal" in run.reason
    ok = wf.run({"subwf": "integration_test_wf"}, executor=pool, timeout=LONG)
    assert ok.status == "COMPLETED"


def test_a_workflow_that_would_run_itself_with_the_same_input_fails_when_it_would(
    pool: ThreadPoolExecutor,
) -> None:
    looping = own("workflow_with_sub_workflow_1_integration_test")
    looping["tasks"][1]["inputParameters"]["subwf"] = "${workflow.input.subwf}"  # the same
    wf = conductor.load(looping, OPS, workflows=[own("simple_workflow_1_integration_test")])
    run = wf.run({"param1": "p1", "param2": "p2", "subwf": "integration_test_wf_with_sub_wf"},
                 executor=pool, timeout=LONG)
    assert run.status == "FAILED"
    assert ("workflow 'integration_test_wf_with_sub_wf' would run again with the input it "
            "already runs with ('integration_test_wf_with_sub_wf' -> "
            "'integration_test_wf_with_sub_wf'), nesting for ever") in run.reason
    assert run.result.elapsed < LONG


def test_sub_workflows_nest_at_most_max_workflow_depth(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load(own("workflow_with_sub_workflow_1_integration_test"), OPS,
                        workflows=[own("simple_workflow_1_integration_test")],
                        max_workflow_depth=2)
    run = wf.run({"param1": "p1", "param2": "p2", "subwf": "integration_test_wf_with_sub_wf",
                  "nextSubwf": "integration_test_wf"}, executor=pool, timeout=LONG)
    assert run.status == "FAILED"
    assert "would nest 3 workflows deep" in run.reason and "max_workflow_depth=2" in run.reason
    with pytest.raises(ValueError, match="max_workflow_depth must be a positive integer"):
        conductor.load(own("simple_workflow_1_integration_test"), OPS, max_workflow_depth=0)



# -- dynamic forks of system tasks --------------------------------------------------------------


def dynamic_fork(tasks: list[dict[str, Any]], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "fan", "tasks": [
        {"name": "dyn", "taskReferenceName": "dyn", "type": "FORK_JOIN_DYNAMIC",
         "dynamicForkTasksParam": "tasks", "dynamicForkTasksInputParamName": "inputs",
         "inputParameters": {"tasks": tasks, "inputs": inputs}},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN"},
    ]}


def test_a_dynamic_fork_runs_sub_workflows_and_system_tasks(pool: ThreadPoolExecutor) -> None:
    child = {"name": "double", "version": 1, "tasks": [{
        "name": "d", "taskReferenceName": "d", "type": "INLINE",
        "inputParameters": {"n": "${workflow.input.n}", "evaluatorType": "javascript",
                            "expression": "$.n * 2"}}],
        "outputParameters": {"doubled": "${d.output.result}"}}
    tasks = [
        {"name": "sub", "taskReferenceName": "s1", "type": "SUB_WORKFLOW",
         "subWorkflowParam": {"name": "double", "version": 1}},
        {"name": "sub", "taskReferenceName": "s2", "type": "SUB_WORKFLOW",
         "subWorkflowParam": {"name": "double"}},
        {"name": "js", "taskReferenceName": "j1", "type": "INLINE",
         "inputParameters": {"evaluatorType": "javascript", "expression": "$.text.length"}},
        {"name": "echo", "taskReferenceName": "e1"},
    ]
    inputs = {"s1": {"n": 2}, "s2": {"n": 5}, "j1": {"text": "$${not an expression}"},
              "e1": {"plain": True}}
    wf = conductor.load(dynamic_fork(tasks, inputs), {"echo": echo}, workflows=[child])
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED"
    join = run.result.outputs["join"]
    assert join["s1"]["doubled"] == 4 and join["s2"]["doubled"] == 10
    assert join["j1"] == {"result": len("${not an expression}")}  # input is data, not code
    assert join["e1"] == {"plain": True}


def test_a_dynamically_forked_task_keeps_the_boundaries_of_load(
    pool: ThreadPoolExecutor,
) -> None:
    tasks = [{"name": "call", "taskReferenceName": "h1", "type": "HTTP"}]
    inputs = {"h1": {"http_request": {"uri": "http://metadata.invalid/x"}}}
    wf = conductor.load(dynamic_fork(tasks, inputs), {}, allow_hosts=["127.0.0.1"])
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    error = run.result.result_of("dyn").result.failed["h1"]
    assert isinstance(error, TaskFailedError) and "metadata.invalid" in str(error)


def test_a_bad_dynamically_forked_system_task_fails_the_fork_before_any_runs(
    pool: ThreadPoolExecutor,
) -> None:
    calls: list[Any] = []
    tasks = [{"name": "echo", "taskReferenceName": "ok"},
             {"name": "js", "taskReferenceName": "bad", "type": "INLINE"}]
    wf = conductor.load(dynamic_fork(tasks, {}), {"echo": lambda i: calls.append(i)})
    run = wf.run(executor=pool)
    error = run.result.result_of("dyn").exception
    assert isinstance(error, FlowDefinitionError)
    assert "dynamic fork 'dyn': task 'bad'" in str(error) and calls == []

# -- system parameters --------------------------------------------------------------------------


def test_system_parameters_resolve(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "v", "taskReferenceName": "v", "type": "SET_VARIABLE",
         "inputParameters": {"colour": "red"}},
        simple("t", "echo", inputParameters={
            "task_id": "${CPEWF_TASK_ID}", "wid": "${workflow.workflowId}",
            "cid": "${workflow.correlationId}", "colour": "${workflow.variables.colour}",
            "v_input": "${v.input.colour}", "v_status": "${v.status}", "v_id": "${v.taskId}",
            "env": "${NETFLIX_ENV}", "text": "id=${CPEWF_TASK_ID}"}),
    ]}, {"echo": echo})
    ctx = TaskContext()
    run = wf.run(executor=pool, context=ctx, correlation_id="order-42")
    out = run.result.outputs["t"]
    assert out["wid"] == run.result.flow_id and out["cid"] == "order-42"
    assert out["task_id"].endswith("/t") and out["text"] == f"id={out['task_id']}"
    assert out["v_id"].endswith("/v") and out["v_id"] != out["task_id"]
    assert out["colour"] == "red" and out["v_input"] == "red" and out["v_status"] == "COMPLETED"
    assert out["env"] is None  # the process environment is never read


def test_a_workflow_run_from_many_threads_keeps_variables_apart(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "v", "taskReferenceName": "v", "type": "SET_VARIABLE",
         "inputParameters": {"who": "${workflow.input.who}"}},
        simple("t", "echo", inputParameters={"who": "${workflow.variables.who}"}),
    ]}, {"echo": echo})
    barrier = threading.Barrier(4)
    seen: dict[int, Any] = {}

    def one(i: int) -> None:
        barrier.wait()
        with ThreadPoolExecutor(2, thread_name_prefix=f"conductor-run{i}") as own:
            seen[i] = wf.run({"who": i}, executor=own).result.outputs["t"]["who"]

    threads = [threading.Thread(target=one, args=(i,), name=f"conductor-caller-{i}")
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {i: i for i in range(4)}


# -- the example --------------------------------------------------------------------------------


def test_the_orders_example_runs_its_three_orders(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "conductor_orders.py"
    spec = importlib.util.spec_from_file_location("examples_conductor_orders", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = module.main()
    assert {k: r.status for k, r in runs.items()} == {"small": "COMPLETED", "large": "COMPLETED",
                                                      "backorder": "COMPLETED"}
    assert runs["small"].output == {"state": "packed", "total": 7.5, "polls": 3}
    assert "reviewed" in str(runs["large"].result.outputs["review"])
    assert runs["small"].result.result_of("review").state is ResultState.SKIPPED
    assert runs["backorder"].output == {"state": "backorder", "missing": ["ink"]}
    assert "pack_loop" not in runs["backorder"].result.outputs  # terminated before the loop
    assert "backorder COMPLETED" in capsys.readouterr().out


def test_system_tasks_run_on_a_process_pool() -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    wf = conductor.load({"tasks": [
        {"name": "i", "taskReferenceName": "i", "type": "INLINE",
         "inputParameters": {"x": "${workflow.input.x}", "evaluatorType": "javascript",
                             "expression": "$.x * 2"}},
        {"name": "v", "taskReferenceName": "v", "type": "SET_VARIABLE",
         "inputParameters": {"k": "${i.output.result}"}},
        {"name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
         "loopCondition": "$.loop.iteration < 2",
         "loopOver": [simple("e", "echo", inputParameters={"k": "${workflow.variables.k}"})]},
        {"name": "j", "taskReferenceName": "j", "type": "JSON_JQ_TRANSFORM",
         "inputParameters": {"a": "${e.output.k}", "queryExpression": ".a + 1"}},
        {"name": "t", "taskReferenceName": "t", "type": "TERMINATE",
         "inputParameters": {"terminationStatus": "COMPLETED",
                             "workflowOutput": {"j": "${j.output.result}"}}},
        simple("never", "echo"),
    ]}, {"echo": echo})
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as executor:
        run = wf.run({"x": 21}, executor=executor, timeout=LONG * 6)
    assert run.status == "COMPLETED" and run.output == {"j": 43}
    assert run.variables == {"k": 42}
    assert run.result.outputs["loop"]["2"] == {"e": {"k": 42}}
    assert "never" not in run.result.outputs


def test_a_deep_scan_collects_a_field_at_any_depth(pool: ThreadPoolExecutor) -> None:
    # the kitchensink example of Conductor's documentation reads ${get_es_1.output..status}
    hits = {"hits": {"hits": [{"_source": {"status": "RUNNING", "workflowId": "w1"}},
                              {"_source": {"status": "FAILED", "workflowId": "w2"}}]}}
    wf = conductor.load({"tasks": [
        simple("search", "search"),
        simple("report", "echo", inputParameters={"statuses": "${search.output..status}",
                                                  "ids": "${search.output..hits[0]}"}),
    ], "outputParameters": {"workflowIds": "${search.output..workflowId}"}},
        {"search": lambda i: hits, "echo": echo})
    run = wf.run(executor=pool)
    assert run.result.outputs["report"]["statuses"] == ["RUNNING", "FAILED"]
    # [0] applies to each match; the match that is not a list is left out
    assert run.result.outputs["report"]["ids"] == [hits["hits"]["hits"][0]]
    assert run.output == {"workflowIds": ["w1", "w2"]}
