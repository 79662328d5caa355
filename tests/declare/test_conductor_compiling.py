"""The Conductor compiler's dispatch: one table from a task ``type`` to its compile function.

Pinned here: every supported type maps to one compile function living in the module of the task
class it builds; every Conductor type taskflow refuses (the loader's ``SERVER_ONLY`` list, and
types it does not know) is refused at load naming the type and the task's position; and a
dynamic fork compiles the tasks it forks through the ``compile_forked`` its compile context
hands it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from taskflow import FlowDefinitionError, conductor
from taskflow.declare.conductor import loader
from taskflow.declare.conductor.boundaries import Limits
from taskflow.declare.conductor.compiling import TYPE_FIELDS, CompileContext, Library
from taskflow.declare.conductor.tasks.flow import JoinTask
from taskflow.declare.conductor.workflow import Workflow


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="conductor-compiling")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def echo(task_input: dict[str, Any]) -> dict[str, Any]:
    return dict(task_input)


def noop(ref: str) -> dict[str, Any]:
    return {"name": ref, "taskReferenceName": ref, "type": "NOOP"}


def fork_then_join(fork: dict[str, Any]) -> list[dict[str, Any]]:
    return [fork, {"name": "j", "taskReferenceName": "j", "type": "JOIN",
                   **({"joinOn": ["b"]} if fork["type"] == "FORK_JOIN" else {})}]


# the smallest valid task of each supported type, as reference "x" (and what it needs before)
ONE_TASK: dict[str, list[dict[str, Any]]] = {
    "SIMPLE": [{"name": "echo", "taskReferenceName": "x"}],
    "NOOP": [noop("x")],
    "DYNAMIC": [{"name": "d", "taskReferenceName": "x", "type": "DYNAMIC",
                 "inputParameters": {"taskToExecute": "echo"}}],
    "FORK_JOIN": fork_then_join({"name": "f", "taskReferenceName": "x", "type": "FORK_JOIN",
                                 "forkTasks": [[noop("b")]]}),
    "FORK_JOIN_DYNAMIC": fork_then_join({
        "name": "f", "taskReferenceName": "x", "type": "FORK_JOIN_DYNAMIC",
        "dynamicForkTasksParam": "tasks", "dynamicForkTasksInputParamName": "inputs",
        "inputParameters": {"tasks": [], "inputs": {}}}),
    "EXCLUSIVE_JOIN": [noop("a"), {"name": "e", "taskReferenceName": "x",
                                   "type": "EXCLUSIVE_JOIN", "joinOn": ["a"]}],
    "SWITCH": [{"name": "s", "taskReferenceName": "x", "type": "SWITCH",
                "evaluatorType": "value-param", "expression": "v",
                "inputParameters": {"v": "a"}, "decisionCases": {"a": [noop("b")]}}],
    "DECISION": [{"name": "s", "taskReferenceName": "x", "type": "DECISION",
                  "caseValueParam": "v", "inputParameters": {"v": "a"},
                  "decisionCases": {"a": [noop("b")]}}],
    "INLINE": [{"name": "i", "taskReferenceName": "x", "type": "INLINE",
                "inputParameters": {"evaluatorType": "javascript", "expression": "1"}}],
    "LAMBDA": [{"name": "l", "taskReferenceName": "x", "type": "LAMBDA",
                "inputParameters": {"scriptExpression": "return 1"}}],
    "JSON_JQ_TRANSFORM": [{"name": "q", "taskReferenceName": "x", "type": "JSON_JQ_TRANSFORM",
                           "inputParameters": {"queryExpression": "."}}],
    "HTTP": [{"name": "h", "taskReferenceName": "x", "type": "HTTP",
              "inputParameters": {"http_request": {"uri": "http://example.invalid/"}}}],
    "WAIT": [{"name": "w", "taskReferenceName": "x", "type": "WAIT",
              "inputParameters": {"duration": "1s"}}],
    "SET_VARIABLE": [{"name": "v", "taskReferenceName": "x", "type": "SET_VARIABLE",
                      "inputParameters": {"v": 1}}],
    "TERMINATE": [{"name": "t", "taskReferenceName": "x", "type": "TERMINATE",
                   "inputParameters": {"terminationStatus": "COMPLETED"}}],
    "EVENT": [{"name": "e", "taskReferenceName": "x", "type": "EVENT", "sink": "conductor:q"}],
    "DO_WHILE": [{"name": "l", "taskReferenceName": "x", "type": "DO_WHILE",
                  "loopCondition": "false", "loopOver": [noop("b")]}],
    "SUB_WORKFLOW": [{"name": "s", "taskReferenceName": "x", "type": "SUB_WORKFLOW",
                      "subWorkflowParam": {"workflowDefinition": {"name": "child",
                                                                  "tasks": [noop("b")]}}}],
}


def test_the_table_covers_every_supported_type_and_nothing_else() -> None:
    assert tuple(sorted(loader.COMPILERS)) == conductor.SUPPORTED_TYPES
    assert set(loader.COMPILERS) == set(TYPE_FIELDS) == set(ONE_TASK) | {"JOIN"}
    assert not set(loader.COMPILERS) & set(loader.SERVER_ONLY)
    for kind, compile_fn in loader.COMPILERS.items():
        assert inspect.isfunction(compile_fn), kind
        assert compile_fn.__name__.startswith("compile_"), kind
        assert compile_fn.__module__.startswith("taskflow.declare.conductor.tasks."), kind


@pytest.mark.parametrize("kind", sorted(ONE_TASK))
def test_each_type_compiles_through_the_module_of_the_task_class_it_builds(kind: str) -> None:
    wf = conductor.load({"name": "one", "tasks": ONE_TASK[kind]}, {"echo": echo},
                        event_sink=lambda sink, payload: None)
    built = type(wf["x"])
    assert built.__module__ == loader.COMPILERS[kind].__module__
    assert wf["x"].task_type == kind  # type: ignore[attr-defined]


def test_a_join_is_compiled_by_its_fork_and_refused_alone() -> None:
    assert loader.COMPILERS["JOIN"].__module__ == JoinTask.__module__
    wf = conductor.load({"name": "one", "tasks": ONE_TASK["FORK_JOIN"]}, {})
    assert isinstance(wf["j"], JoinTask)
    with pytest.raises(FlowDefinitionError,
                       match=r"join task 'j' \(tasks\[1\]\) does not follow a FORK_JOIN"):
        conductor.load({"name": "one", "tasks": [noop("a"), {
            "name": "j", "taskReferenceName": "j", "type": "JOIN"}]}, {})


@pytest.mark.parametrize("kind", sorted(loader.SERVER_ONLY))
def test_a_server_only_type_is_refused_naming_the_type_and_the_position(kind: str) -> None:
    nested = {"name": "f", "taskReferenceName": "f", "type": "FORK_JOIN",
              "forkTasks": [[noop("a")], [{"name": "s", "taskReferenceName": "deep",
                                           "type": kind}]]}
    definition = {"name": "refused", "tasks": [
        noop("n"), {"name": "s", "taskReferenceName": "top", "type": kind},
        nested, {"name": "j", "taskReferenceName": "j", "type": "JOIN"}]}
    with pytest.raises(FlowDefinitionError) as caught:
        conductor.load(definition, {})
    message = str(caught.value)
    assert "uses 2 task(s) that cannot run in-process" in message
    assert f"task 'top' (tasks[1]) has type {kind!r}, which {loader.SERVER_ONLY[kind]}" in message
    assert f"task 'deep' (tasks[2].forkTasks[1][0]) has type {kind!r}" in message


def test_an_unknown_type_is_refused_naming_it_and_its_position() -> None:
    definition = {"name": "refused", "tasks": [noop("n"), {
        "name": "d", "taskReferenceName": "loop", "type": "DO_WHILE", "loopCondition": "false",
        "loopOver": [{"name": "m", "taskReferenceName": "m", "type": "MYSTERY"}]}]}
    with pytest.raises(FlowDefinitionError,
                       match=r"task 'm' \(tasks\[1\]\.loopOver\[0\]\) has unsupported type "
                             r"'MYSTERY'"):
        conductor.load(definition, {})


def test_a_dynamic_fork_compiles_its_forked_tasks_through_compile_forked(
    pool: ThreadPoolExecutor,
) -> None:
    library = Library({"echo": echo}, Limits(), 2, [], {})
    compiled: list[Mapping[str, Any]] = []

    def spy(task: Mapping[str, Any]) -> Workflow:
        compiled.append(task)
        return loader.compile_forked(task, library, ("spied",))

    def no_nested(data: Any, chain: tuple[str, ...]) -> Workflow:
        raise AssertionError("a dynamic fork compiles nothing through compile_workflow")

    ctx = CompileContext(library, "spied", None, ("spied",), loader.COMPILERS,
                         compile_workflow=no_nested, compile_forked=spy)
    tasks = [noop("forked"), {"name": "echo", "taskReferenceName": "plain"}]
    _, tail = ctx.sequence(fork_then_join({
        "name": "f", "taskReferenceName": "fan", "type": "FORK_JOIN_DYNAMIC",
        "dynamicForkTasksParam": "tasks", "dynamicForkTasksInputParamName": "inputs",
        "inputParameters": {"tasks": tasks, "inputs": {"plain": {"v": 1}}}}), "tasks", [])
    assert ctx.nodes["fan"].compile_task is spy  # type: ignore[attr-defined]
    assert compiled == []  # nothing is forked before the fork runs

    wf = Workflow("spied", None, {}, ctx.nodes, ctx.warnings, None, [n for n, _ in tail], None,
                  frozenset(), True)
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED"
    # the system task, checked before any forked task runs and compiled again to run it; the
    # SIMPLE task is a registry call, compiled by nothing
    assert {t["taskReferenceName"] for t in compiled} == {"forked"}
    assert run.result.outputs["j"] == {"plain": {"v": 1}}
