"""A hypothesis fuzz of Conductor definitions: whatever the JSON, ``load`` ends in the library's
own error (never a bare KeyError/TypeError/AttributeError from deep inside) and a workflow that
loads runs to an end within its budget, reaching no host (``allow_hosts=()``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import FlowDefinitionError, conductor

TYPES = ["SIMPLE", "FORK_JOIN", "JOIN", "SWITCH", "DECISION", "EXCLUSIVE_JOIN", "DYNAMIC",
         "FORK_JOIN_DYNAMIC", "INLINE", "LAMBDA", "DO_WHILE", "SUB_WORKFLOW", "SET_VARIABLE",
         "TERMINATE", "JSON_JQ_TRANSFORM", "WAIT", "HTTP", "EVENT", "NOOP", "HUMAN", None, 3]
REFS = ["a", "b", "c", "d"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(
    ["", "x", "${workflow.input.x}", "${a.output.y}", "${ghost.output}", "${", "$${x}",
     "${CPEWF_TASK_ID}", "1 + 1", "while(true){}", ".a", "30s", "COMPLETED", "http://h.invalid/",
     "value-param", "javascript", "v", "true", "a", "b"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["v", "x", "uri", "expression", "evaluatorType", "queryExpression", "scriptExpression",
         "duration", "terminationStatus", "http_request", "name", "taskToExecute"]), inner,
        max_size=3)), max_leaves=6)


@st.composite
def task(draw: Any, depth: int = 0) -> Any:
    if draw(st.integers(0, 19)) == 0:
        return draw(values)  # not even a task object
    t: dict[str, Any] = {"name": draw(st.sampled_from(["echo"] * 6 + ["nope", "", None])),
                         "taskReferenceName": draw(st.sampled_from(REFS + ["", None]) | st.uuids(
                             ).map(lambda u: f"t{u.hex[:8]}")),
                         "type": draw(st.sampled_from(TYPES))}
    for key in draw(st.lists(st.sampled_from(
            ["inputParameters", "joinOn", "expression", "evaluatorType", "caseValueParam",
             "caseExpression", "loopCondition", "optional", "taskDefinition", "sink",
             "dynamicTaskNameParam", "defaultExclusiveJoinTask", "subWorkflowParam"]),
            max_size=4)):
        t[key] = draw(values)
    if depth < 2:
        for key in draw(st.lists(st.sampled_from(["forkTasks", "decisionCases", "loopOver",
                                                  "defaultCase"]), max_size=2)):
            branch = draw(st.lists(task(depth + 1), max_size=2))
            t[key] = ({"v": branch} if key == "decisionCases" else
                      [branch] if key == "forkTasks" else branch)
    return t


definitions = st.one_of(
    values,
    st.fixed_dictionaries({"name": st.sampled_from(["w", "", None]),
                           "tasks": st.lists(task(), max_size=4)},
                          optional={"outputParameters": values, "timeoutSeconds": values,
                                    "timeoutPolicy": values}),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=definitions)
def test_any_definition_loads_or_fails_with_the_librarys_error(definition: Any) -> None:
    try:
        wf = conductor.load(definition, {"echo": lambda i: i}, allow_hosts=(),
                            js_time_limit=0.5, jq_time_limit=1.0, max_loop_iterations=3)
    except FlowDefinitionError:
        return
    except TypeError as exc:
        # only the documented one: the definition itself is not a dict, text or path
        assert "definition must be a dict" in str(exc)
        return
    with ThreadPoolExecutor(2, thread_name_prefix="conductor-fuzz") as pool:
        run = wf.run({"x": 1}, executor=pool, timeout=1)
    assert run.status in ("COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED")
