"""Trust boundaries of Conductor definitions run in-process: tests that try to
break them. JavaScript gets no host access, a time limit and a memory limit; jq a time limit
(in a worker process, since the jq binding holds the GIL) and a memory limit; a sub-workflow
that reaches itself is refused at load."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from taskflow import FlowDefinitionError, conductor
from taskflow.declare.conductor import JqError, ScriptError, TaskFailedError
from taskflow.declare.conductor.boundaries import Limits
from taskflow.declare.conductor.tasks.javascript import evaluate
from taskflow.declare.conductor.tasks.jq import run_jq


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conductor-trust")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def inline(ref: str, expression: str, **params: Any) -> dict[str, Any]:
    return {"name": ref, "taskReferenceName": ref, "type": "INLINE",
            "inputParameters": {"evaluatorType": "javascript", "expression": expression,
                                **params}}


# -- JavaScript ---------------------------------------------------------------------------------


def test_an_endless_script_is_stopped_at_its_time_limit(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [inline("spin", "while(true){}")]}, {}, js_time_limit=0.2)
    started = time.monotonic()
    run = wf.run(executor=pool, timeout=30)
    assert time.monotonic() - started < 10  # stopped by the limit, not by the budget
    assert run.status == "FAILED"
    error = run.result.result_of("spin").exception
    assert isinstance(error, ScriptError) and error.kind == "timeout"
    assert "time limit of 0.2 s" in str(error)


def test_the_time_limit_never_exceeds_the_remaining_budget(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [inline("spin", "while(true){}")]}, {}, js_time_limit=60)
    run = wf.run(executor=pool, timeout=0.3)
    assert run.status == "TIMED_OUT"
    # the isolate stopped within the budget: the worker is free again at once
    assert pool.submit(lambda: "free").result(timeout=10) == "free"


def test_a_huge_allocation_is_stopped_at_the_memory_limit(pool: ThreadPoolExecutor) -> None:
    script = "var a = []; while (true) { a.push(new Array(1e6).fill(1.5)); } a.length"
    wf = conductor.load({"tasks": [inline("hog", script)]}, {}, js_memory_limit=32 * 2**20,
                        js_time_limit=30)
    run = wf.run(executor=pool, timeout=60)
    error = run.result.result_of("hog").exception
    assert isinstance(error, ScriptError) and error.kind == "memory"
    # the process is fine, and the next script gets a fresh isolate
    wf2 = conductor.load({"tasks": [inline("ok", "[1, 2].length")]}, {})
    assert wf2.run(executor=pool).result.outputs["ok"] == {"result": 2}


@pytest.mark.parametrize("probe", [
    "typeof require", "typeof process", "typeof fetch", "typeof XMLHttpRequest",
    "typeof WebSocket", "typeof importScripts", "typeof Deno", "typeof Bun",
])
def test_scripts_have_no_host_access(probe: str) -> None:
    assert evaluate("probe", probe, {}, Limits()) == "undefined"


def test_scripts_do_not_share_state_between_evaluations() -> None:
    limits = Limits()
    evaluate("a", "globalThis.leak = 42; leak", {}, limits)
    assert evaluate("b", "typeof leak", {}, limits) == "undefined"


def test_input_is_data_not_code() -> None:
    hostile = {"x": "'); while(true){} ('", "y": "</script>\u2028${workflow.input}"}
    assert evaluate("d", "$.x + $.y", hostile, Limits(js_time_limit=2.0)) == \
        hostile["x"] + hostile["y"]


def test_a_javascript_switch_and_loop_condition_are_limited_too(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "sw", "taskReferenceName": "sw", "type": "SWITCH", "evaluatorType": "javascript",
         "expression": "while(true){}", "decisionCases": {}},
    ]}, {}, js_time_limit=0.2)
    error = wf.run(executor=pool, timeout=30).result.result_of("sw").exception
    assert isinstance(error, ScriptError) and error.kind == "timeout"
    loop = conductor.load({"tasks": [
        {"name": "l", "taskReferenceName": "l", "type": "DO_WHILE",
         "loopCondition": "for(;;){}", "loopOver": [{"name": "n", "taskReferenceName": "n",
                                                     "type": "NOOP"}]},
    ]}, {}, js_time_limit=0.2)
    error = loop.run(executor=pool, timeout=30).result.result_of("l").exception
    assert isinstance(error, ScriptError) and error.kind == "timeout"


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True])
def test_limits_must_be_positive(bad: Any) -> None:
    with pytest.raises(ValueError):
        conductor.load({"tasks": [inline("i", "1")]}, {}, js_time_limit=bad)


# -- jq -----------------------------------------------------------------------------------------


def test_an_endless_jq_program_is_killed_and_other_threads_keep_running(
    pool: ThreadPoolExecutor,
) -> None:
    ticks = 0
    stop = threading.Event()

    def ticker() -> None:
        nonlocal ticks
        while not stop.wait(0.01):
            ticks += 1

    t = threading.Thread(target=ticker, name="conductor-ticker")
    t.start()
    try:
        wf = conductor.load({"tasks": [{
            "name": "j", "taskReferenceName": "j", "type": "JSON_JQ_TRANSFORM",
            "inputParameters": {"queryExpression": "[range(1e12)] | length"}}]}, {},
            jq_time_limit=0.5)
        run = wf.run(executor=pool, timeout=30)
    finally:
        stop.set()
        t.join()
    error = run.result.result_of("j").exception
    assert isinstance(error, TaskFailedError) and "time limit of 0.5 s" in str(error)
    assert ticks > 5  # the GIL was never held by jq in this process


def test_jq_works_again_after_a_killed_worker() -> None:
    limits = Limits(jq_time_limit=0.3)
    with pytest.raises(JqError, match="time limit"):
        run_jq("j", "def f: f; f", None, limits, 10)
    assert run_jq("j", ".a + 1", {"a": 1}, limits, 10) == [2]


def test_a_jq_memory_hog_is_stopped(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [{
        "name": "j", "taskReferenceName": "j", "type": "JSON_JQ_TRANSFORM",
        "inputParameters": {"queryExpression": "[range(1e9) | tostring] | length"}}]}, {},
        jq_time_limit=20, jq_memory_limit=256 * 2**20)
    error = wf.run(executor=pool, timeout=60).result.result_of("j").exception
    assert isinstance(error, TaskFailedError) and "jq program of task 'j'" in str(error)
    assert run_jq("j", "1", None, Limits(jq_memory_limit=256 * 2**20), 10) == [1]


# -- sub-workflows ------------------------------------------------------------------------------


def sub(ref: str, name: str) -> dict[str, Any]:
    return {"name": ref, "taskReferenceName": ref, "type": "SUB_WORKFLOW",
            "subWorkflowParam": {"name": name}}


def test_a_workflow_that_runs_itself_is_refused_at_load() -> None:
    me = {"name": "me", "tasks": [sub("again", "me")]}
    with pytest.raises(FlowDefinitionError, match=r"reaches workflow 'me' again \('me' -> 'me'\)"):
        conductor.load(me, {}, workflows=[me])


def test_a_cycle_through_other_workflows_is_refused_at_load() -> None:
    a = {"name": "a", "tasks": [sub("to_b", "b")]}
    b = {"name": "b", "tasks": [{"name": "x", "taskReferenceName": "x", "type": "NOOP"},
                                sub("to_c", "c")]}
    c = {"name": "c", "tasks": [sub("to_a", "a")]}
    with pytest.raises(FlowDefinitionError) as info:
        conductor.load(a, {}, workflows=[a, b, c])
    assert "'a' -> 'b' -> 'c' -> 'a'" in str(info.value)


def test_an_inline_definition_naming_its_parent_is_refused() -> None:
    a = {"name": "a", "tasks": [{
        "name": "s", "taskReferenceName": "s", "type": "SUB_WORKFLOW",
        "subWorkflowParam": {"name": "inner", "workflowDefinition": {
            "name": "inner", "tasks": [sub("back", "a")]}}}]}
    with pytest.raises(FlowDefinitionError, match="reaches workflow 'a' again"):
        conductor.load(a, {}, workflows=[a])


def test_the_same_sub_workflow_twice_is_not_a_cycle(pool: ThreadPoolExecutor) -> None:
    leaf = {"name": "leaf", "tasks": [{"name": "n", "taskReferenceName": "n", "type": "NOOP"}]}
    top = {"name": "top", "tasks": [sub("one", "leaf"), sub("two", "leaf")]}
    run = conductor.load(top, {}, workflows=[leaf]).run(executor=pool)
    assert run.status == "COMPLETED"
