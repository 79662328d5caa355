"""Thirty of Conductor's own workflow definitions, run in-process as a Conductor server runs them.

The definitions are in ``tests/conductor_fixtures/conductor-oss`` (copied unchanged; their
source and commit are in ``SOURCE.md`` there): 28 that Conductor's integration tests register
and two examples of its documentation. Each runs with

* a stub registry: the worker of a SIMPLE task named ``n`` answers ``{"op": n, **its input}``
  (as the integration tests' workers complete tasks), except where a case gives its own;
* a stub HTTP server on 127.0.0.1: every ``uri`` of an HTTP task, which names a public host in
  the definitions, is pointed at it (path and query kept) and ``allow_hosts`` admits only it;
* an EVENT sink that records what is published;

within a budget, and must come to what Conductor gives for the same input (status, and the
output or the tasks that ran where that is what the integration test checks). The two whose
WAIT waits for a signal sent to a Conductor server are refused at load, naming the task.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from conftest import LONG

from taskflow import FlowDefinitionError, ResultState
from taskflow.declare import conductor

ROOT = Path(__file__).resolve().parents[1] / "conductor_fixtures" / "conductor-oss"
SUPPORT = ("simple_workflow_1_integration_test", "simple_one_task_sub_workflow_integration_test")
BUDGET = LONG  # seconds each run may take (scaled on slow machines)


def worker(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(task_input: dict[str, Any]) -> dict[str, Any]:
        return {"op": name, **task_input}

    return run


class Workers(Mapping[str, Callable[[dict[str, Any]], Any]]):
    """A worker for every task name (``overrides`` first)."""

    def __init__(self, overrides: Mapping[str, Callable[[dict[str, Any]], Any]]) -> None:
        self.overrides = overrides

    def __getitem__(self, name: str) -> Callable[[dict[str, Any]], Any]:
        if not isinstance(name, str):
            raise KeyError(name)
        return self.overrides.get(name) or worker(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(self.overrides)

    def __len__(self) -> int:
        return len(self.overrides)


def dynamic_tasks(task_input: dict[str, Any]) -> dict[str, Any]:
    """The dynamic fork's worker, answering as Conductor's dynamic fork integration test does."""
    tasks = [{"name": "integration_task_2", "taskReferenceName": "xdt1", "type": "SIMPLE"},
             {"name": "integration_task_3", "taskReferenceName": "xdt2", "type": "SIMPLE"}]
    return {"dynamicTasks": tasks,
            "dynamicTasksInput": {"xdt1": {"k1": "v1"}, "xdt2": {"k2": "v2"}}}


def ran(run: conductor.WorkflowRun) -> set[str]:
    return {n for n, st in run.result.states().items() if st is ResultState.SUCCESS}


@dataclass
class Case:
    """A definition, what it is given, and what it must come to."""

    file: str
    input: dict[str, Any] = field(default_factory=dict)
    status: str = "COMPLETED"
    check: Callable[[conductor.WorkflowRun, Any], None] | None = None
    workers: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)
    refused: str | None = None  # the message load must refuse it with


def _nested_one(run: conductor.WorkflowRun, _: Any) -> None:
    assert {"t1", "integration_task_4"} <= ran(run) and not {"t2", "t3", "t10"} & ran(run)


def _terminated_by_decision(run: conductor.WorkflowRun, _: Any) -> None:
    assert run.output == {"output": "integration_task_1"}  # workflowOutput: ${t1.output.op}
    assert "t3" not in ran(run)


def _loops(count: int, ref: str = "loopTask") -> Callable[[conductor.WorkflowRun, Any], None]:
    def check(run: conductor.WorkflowRun, _: Any) -> None:
        assert run.result.outputs[ref]["iteration"] == count

    return check


def _iteration_read_with_brackets(run: conductor.WorkflowRun, _: Any) -> None:
    out = run.result.outputs["loopTask"]
    assert out["iteration"] == 3
    assert [out[str(i)]["form_uri"]["result"] for i in (1, 2, 3)] == [0, 1, 2]


def _forked(run: conductor.WorkflowRun, _: Any) -> None:
    assert {"xdt1", "xdt2"} <= set(run.result.outputs["dynamicfanouttask_join"])
    assert "task4" in ran(run)


def _published(run: conductor.WorkflowRun, sink: list[tuple[str, Any]]) -> None:
    assert [s for s, _ in sink] == ["conductor"] and "t1" in ran(run)


def _exclusive(run: conductor.WorkflowRun, _: Any) -> None:
    assert {"task1", "task2", "task3"} <= ran(run) and "task4" not in ran(run)


def _three_levels(run: conductor.WorkflowRun, _: Any) -> None:
    # root -> itself (other input) -> integration_test_wf, as the sub-workflow tests start it
    mid = run.result.outputs["t2"]
    assert mid["o3"] == "integration_task_1" and mid["subWorkflowId"]


def _fetched(run: conductor.WorkflowRun, _: Any) -> None:
    body = run.result.outputs["get_population_data"]["response"]["body"]
    assert body["path"] == "/api/data?drilldowns=Nation&measures=Population"


def _variables(run: conductor.WorkflowRun, _: Any) -> None:
    assert run.variables == {"var": "var_test_value"}
    assert run.output == {"variables": {"var": "var_test_value"}}


def _lambda(run: conductor.WorkflowRun, _: Any) -> None:
    assert run.result.outputs["lambda0"] == {"result": {"testvalue": True}}


def _default_transform(run: conductor.WorkflowRun, _: Any) -> None:
    assert run.result.outputs["request_transform"]["result"] == {"x": 1}


def _published_report(run: conductor.WorkflowRun, _: Any) -> None:
    body = run.result.outputs["publish"]["response"]["body"]
    assert body["method"] == "POST" and body["json"] == {"reportId": None}


CASES = [
    Case("conditional_switch_task_workflow_integration_test",
         {"param1": "nested", "param2": "one", "finalCase": "notify"}, check=_nested_one),
    Case("conditional_task_workflow_integration_test",
         {"param1": "nested", "param2": "one", "finalCase": "notify"}, check=_nested_one),
    Case("decision_and_fork_join_integration_test", {"param1": "p1", "param2": "p2", "case": "c"}),
    Case("decision_and_terminate_integration_test",
         {"param1": "p1", "param2": "p2", "case": "two"}, "FAILED", _terminated_by_decision),
    Case("do_while_as_subtask_integration_test", {"loop": 2}, check=_loops(2)),
    Case("do_while_five_loop_over_integration_test", {"loop": 3}, check=_loops(3)),
    Case("do_while_integration_test", {"loop": 1}, check=_loops(1)),
    Case("do_while_iteration_fix_test", {"loop": 3}, check=_iteration_read_with_brackets),
    Case("do_while_multiple_integration_test", {"loop": 2, "loop2": 1}, check=_loops(2)),
    Case("do_while_set_variable_fix", {}, check=_loops(1)),
    Case("do_while_sub_workflow_integration_test", {"loop": 2}, check=_loops(2)),
    Case("do_while_system_tasks", {"loop": 2}, check=_loops(2)),
    Case("dynamic_fork_join_integration_test", {"param1": "p1", "param2": "p2"}, check=_forked,
         workers={"integration_task_1": dynamic_tasks}),
    Case("event_workflow_integration_test", {}, check=_published),
    Case("exclusive_join_integration_test",
         {"payload": {"k": 1}, "decision_1": "true", "decision_2": "true"}, check=_exclusive),
    Case("fork_join_integration_test", {}),
    Case("fork_join_sub_workflow", {"param1": "p1", "param2": "p2"}),
    Case("hierarchical_fork_join_swf",
         {"param1": "p1", "param2": "p2", "subwf": "integration_test_wf_with_sub_wf",
          "nextSubwf": "integration_test_wf"}),
    Case("json_jq_transform_result_integration_test", {"requestedAction": "refund"},
         check=_fetched),
    Case("nested_fork_join_integration_test", {"param1": "p1", "param2": "p2", "case": "a"}),
    Case("nested_fork_join_with_sub_workflow_integration_test",
         {"param1": "p1", "param2": "p2", "case": "a"}),
    Case("sequential_json_jq_transform_integration_test", {"body": {"x": 1}},
         check=_default_transform),
    Case("simple_lambda_workflow_integration_test", {"a": 1}, check=_lambda),
    Case("simple_set_variable_workflow_integration_test", {"var": "var_test_value"},
         check=_variables),
    Case("switch_with_no_default_case_integration_test", {"param1": "p1", "param2": "p2",
                                                           "case": "nothing"}),
    Case("terminate_task_terminated_status_in_do_while_test", {}, "TERMINATED"),
    Case("workflow_with_sub_workflow_1_integration_test",
         {"param1": "p1", "param2": "p2", "subwf": "integration_test_wf_with_sub_wf",
          "nextSubwf": "integration_test_wf"}, check=_three_levels),
    Case("simple_wait_task_workflow_integration_test",
         refused="task 'wait0' (tasks[0]) has type 'WAIT' without a duration or until, which "
                 "waits for a signal sent to a Conductor server"),
    Case("docs/wait-and-timers_scheduled_report", {"reportDate": "2025-06-15 09:00 GMT+00:00"},
         check=_published_report),
    Case("docs/wait-and-timers_order_with_manual_approval",
         refused="task 'approval' (tasks[1]) has type 'WAIT' without a duration or until, which "
                 "waits for a signal sent to a Conductor server"),
]


def path_of(case: Case) -> Path:
    name = case.file if "/" in case.file else f"test-harness/{case.file}"
    return ROOT / f"{name}.json"


class Echo(BaseHTTPRequestHandler):
    """Answers every request with JSON describing it."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.dumps({"method": self.command, "path": self.path,
                           "json": json.loads(raw) if raw else None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def stub_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, name="conductor-stub-http",
                              daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def pointed_at(value: Any, host: str) -> Any:
    """``value`` with every ``uri`` pointed at ``host`` (scheme http, path and query kept)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "uri" and isinstance(v, str) and "://" in v:
                parts = urlsplit(v)
                v = urlunsplit(("http", host, parts.path, parts.query, parts.fragment))
            out[k] = pointed_at(v, host)
        return out
    if isinstance(value, list):
        return [pointed_at(v, host) for v in value]
    return value


def definition(path: Path, host: str) -> Any:
    return pointed_at(json.loads(path.read_text(encoding="utf-8")), host)


def run_case(case: Case, host: str) -> tuple[conductor.WorkflowRun, list[tuple[str, Any]]]:
    sink: list[tuple[str, Any]] = []
    support = [json.loads((ROOT / "test-harness" / f"{s}.json").read_text()) for s in SUPPORT]
    others = [definition(path_of(c), host) for c in CASES
              if c.refused is None and c is not case]
    wf = conductor.load(definition(path_of(case), host), Workers(case.workers),
                        workflows=support + others, allow_hosts=(host,),
                        event_sink=lambda s, payload: sink.append((s, payload)))
    with ThreadPoolExecutor(8, thread_name_prefix="conductor-own") as pool:
        run = wf.run(case.input, executor=pool, timeout=BUDGET)
    return run, sink


@pytest.mark.parametrize("case", CASES, ids=[c.file.split("/")[-1] for c in CASES])
def test_conductors_own_definition_runs_as_conductor_runs_it(case: Case, stub_server: str
                                                              ) -> None:
    if case.refused is not None:
        with pytest.raises(FlowDefinitionError) as info:
            run_case(case, stub_server)
        assert case.refused in str(info.value)
        return
    run, sink = run_case(case, stub_server)
    assert run.status == case.status, (run.reason, run.result.states())
    assert run.result.elapsed < BUDGET
    if case.check is not None:
        case.check(run, sink)


def test_at_least_28_of_the_30_run_to_their_result_within_budget(stub_server: str) -> None:
    assert len(CASES) == 30
    done = 0
    for case in CASES:
        if case.refused is not None:
            continue
        run, _ = run_case(case, stub_server)
        done += run.status == case.status and run.result.elapsed < BUDGET
    assert done >= 28


def test_every_fixture_is_recorded_with_its_source() -> None:
    source = (ROOT / "SOURCE.md").read_text(encoding="utf-8")
    assert "b54f0d4ee546c1053367e1c14405c5396c17bfb1" in source and "Apache" in source
    files = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.json")}
    expected = {path_of(c).relative_to(ROOT).as_posix() for c in CASES}
    expected |= {f"test-harness/{s}.json" for s in SUPPORT}
    assert files == expected
    for name in files:
        if name.startswith("docs/"):
            assert name.split("/")[-1] in source
