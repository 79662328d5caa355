"""A second hypothesis fuzz of Conductor definitions: *near-valid*
definitions and values of any JSON type in any field.

``tests/declare/test_conductor_fuzz.py`` builds definitions from a vocabulary of task types and keys.
This one starts from the real definitions (the fixtures from Conductor's documentation and the
repository's examples) and mutates them a few times each: any value anywhere replaced by a value
of another JSON type (huge or negative numbers, NaN and infinities, long or odd text, lists for
objects and back), keys deleted or added, tasks duplicated or moved into another place, a
subtree copied elsewhere (duplicate references, a loop naming itself); and JSON text cut or
spliced. Whatever the document, ``conductor.load`` ends in ``FlowDefinitionError`` (a
``TaskflowError``), never a bare KeyError/TypeError/ValueError/AttributeError/RecursionError
from inside, and a workflow that loads runs to an end within its budget, reaching no host.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from taskflow import FlowDefinitionError, TaskflowError, conductor

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "tests" / "conductor_fixtures" / "conductor-oss" / "test-harness"
SOURCES = sorted((ROOT / "tests" / "conductor_fixtures").glob("*.json")) + sorted(
    (ROOT / "examples").glob("*_workflow.json")) + [
    OWN / "workflow_with_sub_workflow_1_integration_test.json",  # a name chosen at run time
    OWN / "do_while_iteration_fix_test.json"]
BASES = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in SOURCES}
CHILD = BASES["sub_workflow_child"]

KEYS = ["name", "taskReferenceName", "type", "inputParameters", "forkTasks", "joinOn",
        "decisionCases", "defaultCase", "loopOver", "loopCondition", "evaluatorType",
        "expression", "caseValueParam", "caseExpression", "optional", "subWorkflowParam",
        "dynamicTaskNameParam", "dynamicForkTasksParam", "dynamicForkTasksInputParamName",
        "taskDefinition", "timeoutSeconds", "timeoutPolicy", "retryCount", "queryExpression",
        "http_request", "uri", "method", "body", "terminationStatus", "workflowOutput",
        "outputParameters", "version", "schemaVersion", "tasks", "startDelay", "asyncComplete",
        "defaultExclusiveJoinTask", "sink", "duration", "until", "value"]

# any JSON value, weighted towards what trips parsers: wrong types, odd numbers, expressions
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 2**31, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -0.0]),
    st.text(max_size=12),
    st.sampled_from(["", "SIMPLE", "FORK_JOIN", "JOIN", "SWITCH", "DO_WHILE", "SUB_WORKFLOW",
                     "INLINE", "HTTP", "JSON_JQ_TRANSFORM", "TERMINATE", "DYNAMIC", "javascript",
                     "value-param", "graaljs", "${workflow.input}", "${workflow.input.x.y[0]}",
                     "${a.output}", "${", "}", "$.x", "while(true){}", "def f: f; f", ".[",
                     "http://h.invalid/", "file:///etc/passwd", "COMPLETED", "FAILED", "1s",
                     "x" * 300, "\x00", "\ud7ff\U0010ffff"]),
)
anything = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4)),
    max_leaves=10)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``doc`` (dict keys and list indexes), the document's root first."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


@st.composite
def near_valid(draw: Any) -> tuple[str, Any]:
    """(which base, a copy of it mutated one to four times)."""
    base = draw(st.sampled_from(sorted(BASES)))
    doc: Any = copy.deepcopy(BASES[base])
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "duplicate", "graft",
                                   "retype"]))
        if not path:
            if op in ("replace", "retype"):
                doc = draw(anything)
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[last] = draw(anything)
        elif op == "retype":  # the same content in the other container type
            value = parent[last]
            if isinstance(value, dict):
                parent[last] = list(value.values())
            elif isinstance(value, list):
                parent[last] = {str(i): v for i, v in enumerate(value)}
            else:
                parent[last] = [value]
        elif op == "delete":
            del parent[last]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS))] = draw(anything)
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        elif op == "graft":  # a subtree from elsewhere in the document (may hold this place)
            other = _get(doc, draw(st.sampled_from(paths)))
            parent[last] = copy.deepcopy(other)
    return base, doc


def _echo(task_input: Any) -> Any:
    return {"echo": task_input}


class _AnyName(Mapping[str, Any]):
    """A registry with a task for every name, so definitions fail on their shape, not on names."""

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise KeyError(key)
        return _echo

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _load(definition: Any) -> conductor.Workflow | None:
    """The workflow, or None when ``load`` refused the definition with the library's error."""
    try:
        return conductor.load(definition, _AnyName(), workflows=[CHILD], allow_hosts=(),
                              js_time_limit=0.5, jq_time_limit=1.0, max_loop_iterations=3)
    except FlowDefinitionError as exc:
        assert isinstance(exc, TaskflowError)
        assert str(exc)  # a message, naming something
        event("refused")
        return None
    except TypeError as exc:
        # the documented one: the definition itself is not a dict, a list, text or a path
        assert "definition must be a dict" in str(exc), repr(exc)
        return None


def _run(wf: conductor.Workflow, workflow_input: dict[str, Any]) -> None:
    with ThreadPoolExecutor(2, thread_name_prefix="trust-fuzz") as pool:
        run = wf.run(workflow_input, executor=pool, timeout=2)
    assert run.status in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED")
    event(f"ran: {run.status}")
    json.dumps(run.result.report().model_dump(mode="json"))  # the report stays JSON-ready


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(case=near_valid(), workflow_input=st.dictionaries(st.sampled_from(["x", "user", "lines",
                                                                          "warehouse", "id"]),
                                                         anything, max_size=3))
def test_a_near_valid_definition_loads_or_fails_with_the_librarys_error(
        case: tuple[str, Any], workflow_input: dict[str, Any]) -> None:
    _, definition = case
    wf = _load(definition)
    if wf is not None:
        _run(wf, workflow_input)


@st.composite
def spliced_text(draw: Any) -> str:
    """The JSON text of a base definition, cut, spliced with odd text or with a byte dropped."""
    text = json.dumps(BASES[draw(st.sampled_from(sorted(BASES)))])
    at = draw(st.integers(1, len(text) - 1))
    op = draw(st.sampled_from(["cut", "insert", "drop"]))
    if op == "cut":
        return text[:at]
    if op == "insert":
        return text[:at] + draw(st.text(max_size=8) | st.sampled_from(
            ["{", "[", '"', "\\", "\x00", "NaN", "1e999", ",", "}", "]", "\ud800"])) + text[at:]
    return text[:at] + text[at + 1:]


@SETTINGS
@given(text=spliced_text())
def test_broken_json_text_fails_with_the_librarys_error(text: str) -> None:
    wf = _load(text)
    if wf is not None:  # a splice that kept valid JSON (inside a string, say)
        _run(wf, {})


@settings(max_examples=100, deadline=None)
@given(value=anything)
def test_any_value_as_the_definition_or_the_workflows_fails_cleanly(value: Any) -> None:
    for call in (lambda: conductor.load(value, _AnyName(), allow_hosts=()),
                 lambda: conductor.load(BASES["sub_workflow_parent"], _AnyName(),
                                        workflows=[value], allow_hosts=()),
                 lambda: conductor.load(BASES["decision_exclusive_join"], _AnyName(),
                                        task_definitions=[value], allow_hosts=())):
        try:
            call()
        except FlowDefinitionError:
            pass
        except TypeError as exc:
            assert "definition must be a dict" in str(exc), repr(exc)


# -- what the fuzz found, kept as plain regression tests ----------------------------------------


def _task(**fields: Any) -> dict[str, Any]:
    return {"name": "a", "taskReferenceName": "a", "type": "SIMPLE", **fields}


@pytest.mark.parametrize("definition", [
    {"tasks": [_task(type=["SIMPLE"])]},  # a type that is not hashable
    {"tasks": [_task(type={"name": "x"})]},
    {"tasks": [_task(type="FORK_JOIN", forkTasks=1.5)]},  # branches that are not a list
    {"tasks": [_task(type="DYNAMIC", dynamicTaskNameParam=["x"],
                     inputParameters={"taskToExecute": "a"})]},
    "[" * 100_000,  # JSON text nested past the interpreter's recursion limit
    '{"tasks": [' + "[" * 100_000,
], ids=["type-list", "type-dict", "forktasks-float", "dynamic-param-list", "deep-text",
        "deep-tasks"])
def test_definitions_the_fuzz_found_fail_with_the_librarys_error(definition: Any) -> None:
    with pytest.raises(FlowDefinitionError):
        conductor.load(definition, _AnyName(), allow_hosts=())


def test_a_document_nested_past_the_recursion_limit_fails_cleanly() -> None:
    nested: Any = 1
    for _ in range(5000):
        nested = {"x": nested}
    with pytest.raises(FlowDefinitionError, match="nested too deeply"):
        conductor.load({"tasks": [_task(inputParameters=nested)]}, _AnyName())


@pytest.mark.parametrize("path", ["bad\x00name.json", "/dev/null\x00"])
def test_a_path_with_a_nul_or_binary_content_fails_cleanly(path: str, tmp_path: Path) -> None:
    with pytest.raises(FlowDefinitionError, match="cannot read workflow definition"):
        conductor.load(path, _AnyName())
    binary = tmp_path / "definition.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FlowDefinitionError, match="cannot read workflow definition"):
        conductor.load(binary, _AnyName())
    with pytest.raises(FlowDefinitionError, match="cannot read workflow definition"):
        conductor.load({"tasks": []}, _AnyName(), workflows=[path])
