"""Conductor's run semantics that the loader keeps: a failed workflow stops its other branches,
dynamic-fork inputs, JOIN's handling of empty outputs, unsupported tasks named with type and
position, and task/workflow timeouts and retryLogic inside the run's budget."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow import FlowDefinitionError, conductor


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conductor-fix")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


def simple(ref: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"name": name or ref, "taskReferenceName": ref, "type": "SIMPLE", **fields}


def echo(task_input: dict[str, Any]) -> dict[str, Any]:
    return dict(task_input)


def broken(task_input: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("boom")


# -- a failed workflow stops other branches -----------------------------------------------------


def test_a_failure_stops_the_other_branches_from_starting_anything() -> None:
    gate = threading.Event()
    ran: list[str] = []

    def slow(task_input: dict[str, Any]) -> dict[str, Any]:
        gate.wait(LONG)  # still running when the other branch fails
        return {}

    def after(task_input: dict[str, Any]) -> dict[str, Any]:
        ran.append("next")
        return {}

    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[simple("slow"), simple("next", "after")], [simple("raises", "broken")]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN",
         "joinOn": ["next", "raises"]},
    ]}, {"slow": slow, "after": after, "broken": broken})
    pool = ThreadPoolExecutor(4, thread_name_prefix="conductor-fix1")
    try:
        run = wf.run(executor=pool)  # returns at the failure, without waiting for "slow"
        assert run.status == "FAILED" and run.failed_task == "raises"
        assert "boom" in (run.reason or "")
    finally:
        gate.set()
        pool.shutdown(wait=True)
    assert ran == []  # "next" never started, even after "slow" returned


def test_an_optional_failure_does_not_stop_the_workflow(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [simple("maybe", "broken", optional=True),
                                   simple("then", "echo")]}, {"broken": broken, "echo": echo})
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED" and run.result.outputs["then"] == {}


# -- dynamic fork inputs ---------------------------------------------------------------------


def dynamic(tasks: list[dict[str, Any]], inputs: Any) -> dict[str, Any]:
    return {"tasks": [
        {"name": "dyn", "taskReferenceName": "dyn", "type": "FORK_JOIN_DYNAMIC",
         "dynamicForkTasksParam": "dynamicTasks",
         "dynamicForkTasksInputParamName": "dynamicTasksInput",
         "inputParameters": {"dynamicTasks": tasks, "dynamicTasksInput": inputs}},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN"},
    ]}


@pytest.mark.parametrize("entry", ["v1", ["kv"], 3])
def test_a_dynamic_task_input_that_is_not_an_object_fails_naming_fork_and_task(
    pool: ThreadPoolExecutor, entry: Any,
) -> None:
    wf = conductor.load(dynamic([{"name": "echo", "taskReferenceName": "w1"}], {"w1": entry}),
                        {"echo": echo})
    run = wf.run(executor=pool)
    assert run.status == "FAILED"
    error = run.result.result_of("dyn").exception
    assert isinstance(error, TypeError)
    assert "dynamic fork 'dyn'" in str(error) and "task 'w1'" in str(error)
    assert "must be an object" in str(error)


def test_a_dynamic_tasks_own_input_parameters_merge_with_its_entry(
    pool: ThreadPoolExecutor,
) -> None:
    wf = conductor.load(dynamic(
        [{"name": "echo", "taskReferenceName": "w1",
          "inputParameters": {"region": "${workflow.input.region}", "size": 1, "keep": "own"}}],
        {"w1": {"size": 2, "extra": True}}), {"echo": echo})
    run = wf.run({"region": "eu"}, executor=pool)
    # the entry wins over the task's own inputParameters, which are resolved as expressions
    assert run.result.outputs["join"] == {"w1": {"region": "eu", "size": 2, "keep": "own",
                                                 "extra": True}}


# -- JOIN leaves out empty outputs --------------------------------------------------------------


def test_join_leaves_out_tasks_whose_output_is_empty(pool: ThreadPoolExecutor) -> None:
    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN",
         "forkTasks": [[simple("w1", "nothing")], [simple("w2", "echo",
                                                          inputParameters={"a": 1})]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": ["w1", "w2"]},
    ]}, {"nothing": lambda i: None, "echo": echo})
    assert wf.run(executor=pool).result.outputs["join"] == {"w2": {"a": 1}}


# -- every unsupported task is named ------------------------------------------------------------


def test_every_task_that_cannot_run_in_process_is_named_with_type_and_position() -> None:
    with pytest.raises(FlowDefinitionError) as info:
        conductor.load({"name": "kitchen", "tasks": [
            {"name": "approve", "taskReferenceName": "approve", "type": "HUMAN"},
            {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN", "forkTasks": [
                [{"name": "k", "taskReferenceName": "kafka", "type": "KAFKA_PUBLISH"}],
                [{"name": "x", "taskReferenceName": "odd", "type": "MYSTERY"}]]},
            {"name": "join", "taskReferenceName": "join", "type": "JOIN"},
            {"name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
             "loopCondition": "false",
             "loopOver": [{"name": "w", "taskReferenceName": "signal", "type": "WAIT"}]},
        ]}, {})
    message = str(info.value)
    assert "workflow 'kitchen' uses 4 task(s) that cannot run in-process" in message
    for part in ("task 'approve' (tasks[0]) has type 'HUMAN'",
                 "task 'kafka' (tasks[1].forkTasks[0][0]) has type 'KAFKA_PUBLISH'",
                 "task 'odd' (tasks[1].forkTasks[1][0]) has unsupported type 'MYSTERY'",
                 "task 'signal' (tasks[3].loopOver[0]) has type 'WAIT' without a duration"):
        assert part in message


# -- timeouts and retryLogic --------------------------------------------------------------------


def attempts_of(log: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(log)]


def flaky(log: list[float], succeed_on: int,
          now: Callable[[], float] = time.monotonic) -> Any:
    def fn(task_input: dict[str, Any]) -> dict[str, Any]:
        log.append(now())
        if len(log) < succeed_on:
            raise RuntimeError(f"attempt {len(log)}")
        return {"attempts": len(log)}
    return fn


@pytest.mark.parametrize(("logic", "expected_gaps"), [
    ("FIXED", [0.1, 0.1]),
    ("LINEAR_BACKOFF", [0.1 * 2, 0.1 * 2 * 2]),  # delay x backoffScaleFactor x attempt
    ("EXPONENTIAL_BACKOFF", [0.1, 0.2]),  # delay x 2**retry
])
def test_retry_logic_waits_as_conductor_defines_it(pool: ThreadPoolExecutor, fake_clock: Any,
                                                   logic: str,
                                                   expected_gaps: list[float]) -> None:
    log: list[float] = []
    wf = conductor.load({"tasks": [simple("t", "flaky", taskDefinition={
        "retryCount": 3, "retryLogic": logic, "retryDelaySeconds": 0.1,
        "backoffScaleFactor": 2})]}, {"flaky": flaky(log, succeed_on=3, now=fake_clock.now)})
    run = wf.run(executor=pool, timeout=LONG)
    assert run.status == "COMPLETED" and run.result.outputs["t"] == {"attempts": 3}
    # exactly the documented delays, in virtual time
    assert attempts_of(log) == pytest.approx(expected_gaps)


@pytest.mark.parametrize("logic", ["FIXED", "LINEAR_BACKOFF", "EXPONENTIAL_BACKOFF"])
@pytest.mark.parametrize("delay", [0, 0.01])
def test_every_retry_is_a_new_task_with_its_input_resolved_again(
    pool: ThreadPoolExecutor, logic: str, delay: float,
) -> None:
    # Conductor's retry is a task of its own: a new task id, inputParameters resolved anew
    # with it, and retryCount counting the retries (in-task and engine retries alike)
    seen: list[dict[str, Any]] = []

    def fn(task_input: dict[str, Any]) -> dict[str, Any]:
        seen.append(task_input)
        if len(seen) < 3:
            raise RuntimeError(f"attempt {len(seen)}")
        return {"done": len(seen)}

    wf = conductor.load({"tasks": [simple("t", "flaky", inputParameters={
        "id": "${CPEWF_TASK_ID}", "own": "${t.taskId}", "retry": "${t.retryCount}",
        "text": "try-${CPEWF_TASK_ID}"}, taskDefinition={
        "retryCount": 2, "retryLogic": logic, "retryDelaySeconds": delay})]}, {"flaky": fn})
    run = wf.run(executor=pool, timeout=LONG)
    assert run.status == "COMPLETED"
    ids = [i["id"] for i in seen]
    assert len(set(ids)) == 3 and ids[0].endswith("/t")
    assert [i["text"] for i in seen] == [f"try-{i}" for i in ids]
    assert [i["retry"] for i in seen[1:]] == [0, 1]  # what the previous attempt recorded
    record = wf._record(run.result)["tasks"]["t"]
    assert record["taskId"] == ids[-1] and record["retryCount"] == 2
    assert run.result["t"].input["id"] == ids[-1]


def test_retries_stop_when_the_next_delay_does_not_fit_the_budget(
    pool: ThreadPoolExecutor,
) -> None:
    log: list[float] = []
    wf = conductor.load({"tasks": [simple("t", "flaky", taskDefinition={
        "retryCount": 5, "retryLogic": "FIXED", "retryDelaySeconds": 30})]},
        {"flaky": flaky(log, succeed_on=99)})
    run = wf.run(executor=pool, timeout=5)
    assert run.status == "FAILED" and len(log) == 1
    assert run.result.elapsed < 5


def test_task_definitions_passed_to_load_apply_by_name(pool: ThreadPoolExecutor) -> None:
    log: list[float] = []
    wf = conductor.load({"tasks": [simple("t", "flaky")]}, {"flaky": flaky(log, succeed_on=2)},
                        task_definitions=[{"name": "flaky", "retryCount": 1}])
    assert wf.run(executor=pool).status == "COMPLETED" and len(log) == 2


def test_workflow_task_retry_count_overrides_the_definition(pool: ThreadPoolExecutor) -> None:
    log: list[float] = []
    wf = conductor.load({"tasks": [simple("t", "flaky", retryCount=0)]},
                        {"flaky": flaky(log, succeed_on=2)},
                        task_definitions=[{"name": "flaky", "retryCount": 3}])
    assert wf.run(executor=pool).status == "FAILED" and len(log) == 1


def test_task_timeout_with_time_out_wf_times_the_workflow_out(pool: ThreadPoolExecutor,
                                                               fake_clock: Any) -> None:
    def stuck(task_input: dict[str, Any]) -> dict[str, Any]:
        fake_clock.sleep(LONG)  # released when the clock is left
        return {}

    wf = conductor.load({"tasks": [simple("s", "stuck", taskDefinition={
        "timeoutSeconds": 0.2, "timeoutPolicy": "TIME_OUT_WF"}), simple("after", "echo")]},
        {"stuck": stuck, "echo": echo})
    run = wf.run(executor=pool, timeout=LONG)
    assert run.status == "TIMED_OUT" and run.failed_task == "s"
    assert "after" not in run.result.outputs
    assert fake_clock.now() == pytest.approx(0.2)  # at the task's timeout, not the budget


def test_task_timeout_alert_only_lets_the_task_finish_and_logs(
    pool: ThreadPoolExecutor, fake_clock: Any, taskflow_logs: list[dict[str, Any]],
) -> None:
    def slowish(task_input: dict[str, Any]) -> dict[str, Any]:
        fake_clock.sleep(0.1)
        return {"done": True}

    wf = conductor.load({"tasks": [simple("s", "slowish", taskDefinition={
        "timeoutSeconds": 0.01, "timeoutPolicy": "ALERT_ONLY"})]}, {"slowish": slowish})
    run = wf.run(executor=pool)
    assert run.status == "COMPLETED" and run.result.outputs["s"] == {"done": True}
    assert any("ALERT_ONLY" in str(r["message"]) and "'s'" in str(r["message"])
               for r in taskflow_logs)


def test_workflow_alert_only_runs_without_a_budget_and_logs(
    pool: ThreadPoolExecutor, fake_clock: Any, taskflow_logs: list[dict[str, Any]],
) -> None:
    def slowish(task_input: dict[str, Any]) -> dict[str, Any]:
        fake_clock.sleep(0.1)
        return {}

    wf = conductor.load({"name": "w", "timeoutSeconds": 0.01, "timeoutPolicy": "ALERT_ONLY",
                         "tasks": [simple("s", "slowish")]}, {"slowish": slowish})
    assert wf.timeout is None and wf.alert_after == 0.01
    assert wf.run(executor=pool).status == "COMPLETED"
    assert any("ALERT_ONLY" in str(r["message"]) for r in taskflow_logs)


@pytest.mark.parametrize(("field", "value"), [("retryLogic", "RANDOM"),
                                              ("timeoutPolicy", "NEVER")])
def test_unknown_retry_logic_or_timeout_policy_is_refused(field: str, value: str) -> None:
    with pytest.raises(FlowDefinitionError, match=f"{field} {value!r}"):
        conductor.load({"tasks": [simple("t", "echo", taskDefinition={"retryCount": 1,
                                                                       field: value})]},
                       {"echo": echo})


def test_a_loop_stops_iterating_once_another_branch_failed_the_workflow() -> None:
    ticks: list[int] = []
    second = threading.Event()

    def tick(task_input: dict[str, Any]) -> dict[str, Any]:
        ticks.append(1)
        if len(ticks) == 2:
            second.set()
        return {}

    def fail_after_two(task_input: dict[str, Any]) -> dict[str, Any]:
        second.wait(LONG)
        raise RuntimeError("boom")

    wf = conductor.load({"tasks": [
        {"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN", "forkTasks": [
            [{"name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
              "loopCondition": "true", "loopOver": [simple("tick")]}],
            [simple("fail", "fail_after_two")]]},
        {"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": ["loop", "fail"]},
    ]}, {"tick": tick, "fail_after_two": fail_after_two}, max_loop_iterations=1000)
    pool = ThreadPoolExecutor(4, thread_name_prefix="conductor-fix-loop")
    try:
        run = wf.run(executor=pool, timeout=LONG * 6)
    finally:
        pool.shutdown(wait=True)  # the loop's thread ends once it sees the cancellation
    assert run.status == "FAILED" and run.failed_task == "fail"
    assert len(ticks) < 1000
