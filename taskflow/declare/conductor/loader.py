"""``load``: a Conductor definition compiled into wired taskflow nodes.

The ``tasks`` list is a sequence: each step's nodes depend on the previous step's *exit* nodes
(a fork and its join are one step; a switch's exits are its cases' exits). Loop bodies and
sub-workflows are compiled into graphs of their own, run by their task as nested runs.

Each task is compiled by the function ``COMPILERS`` maps its ``type`` to, which lives
beside the task class it builds and is handed the
``CompileContext``.

Everything is checked before anything runs, following Conductor's rules, and raises
[`FlowDefinitionError`][taskflow.FlowDefinitionError] naming the task and where it is. Task types that need a
Conductor server are all named at once, each with its type and position.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from taskflow.declare.conductor.boundaries import EventSink, Limits
from taskflow.declare.conductor.compiling import (
    CompileContext,
    CompileFn,
    Library,
    candidate_key,
    empty,
)
from taskflow.declare.conductor.expressions import Ref, compile_value
from taskflow.declare.conductor.tasks.control import (
    compile_event,
    compile_set_variable,
    compile_terminate,
    compile_wait,
)
from taskflow.declare.conductor.tasks.flow import (
    TaskFn,
    compile_dynamic,
    compile_dynamic_fork,
    compile_exclusive_join,
    compile_fork,
    compile_join,
    compile_noop,
    compile_simple,
    compile_switch,
)
from taskflow.declare.conductor.tasks.http import compile_http
from taskflow.declare.conductor.tasks.javascript import compile_inline, compile_lambda
from taskflow.declare.conductor.tasks.jq import compile_jq
from taskflow.declare.conductor.tasks.nested import compile_do_while, compile_sub_workflow
from taskflow.declare.conductor.workflow import Workflow
from taskflow.errors import FlowDefinitionError

__all__ = ["COMPILERS", "SERVER_ONLY", "SUPPORTED_TYPES", "compile_forked", "load"]

#: Conductor task type -> the compile function of the task class it builds (the one table
#: every task is compiled through).
COMPILERS: dict[str, CompileFn] = {
    "DECISION": compile_switch,
    "DO_WHILE": compile_do_while,
    "DYNAMIC": compile_dynamic,
    "EVENT": compile_event,
    "EXCLUSIVE_JOIN": compile_exclusive_join,
    "FORK_JOIN": compile_fork,
    "FORK_JOIN_DYNAMIC": compile_dynamic_fork,
    "HTTP": compile_http,
    "INLINE": compile_inline,
    "JOIN": compile_join,
    "JSON_JQ_TRANSFORM": compile_jq,
    "LAMBDA": compile_lambda,
    "NOOP": compile_noop,
    "SET_VARIABLE": compile_set_variable,
    "SIMPLE": compile_simple,
    "SUB_WORKFLOW": compile_sub_workflow,
    "SWITCH": compile_switch,
    "TERMINATE": compile_terminate,
    "WAIT": compile_wait,
}

#: Task types ``load`` compiles.
SUPPORTED_TYPES = tuple(sorted(COMPILERS))

#: Conductor task types that need a Conductor server -> why; refused at load, each task named
#: with its type and position.
SERVER_ONLY = {
    "HUMAN": "waits for a person (a Conductor server's human task queue)",
    "USER_DEFINED": "is run by a Conductor server's plugin",
    "KAFKA_PUBLISH": "publishes through a Conductor server's Kafka client",
    "START_WORKFLOW": "starts a workflow on a Conductor server",
    "BUSINESS_RULE": "is run by an Orkes server",
}
_WORKFLOW_METADATA = frozenset({
    "name", "description", "version", "schemaVersion", "ownerEmail", "ownerApp", "createTime",
    "updateTime", "createdBy", "updatedBy", "tags", "inputParameters", "restartable",
    "accessPolicy", "metadata", "inputSchema", "outputSchema", "enforceSchema",
    "workflowStatusListenerEnabled", "variables", "inputTemplate",
})
_WORKFLOW_FIELDS = _WORKFLOW_METADATA | {"tasks", "outputParameters", "timeoutSeconds",
                                         "timeoutPolicy"}


def read_definition(definition: Any) -> Any:
    """A definition given as a dict/list, JSON text (a str starting with ``{`` or ``[``) or a
    path, as plain data."""
    if isinstance(definition, (Mapping, list)):
        return definition
    if isinstance(definition, (str, os.PathLike)):
        text_given = isinstance(definition, str) and definition.lstrip()[:1] in ("{", "[")
        if text_given:
            text, source = str(definition), "definition"
        else:
            path = Path(definition)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, not UTF-8
                raise FlowDefinitionError(
                    f"cannot read workflow definition {str(path)!r}: {exc}") from exc
            source = str(path)
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise FlowDefinitionError(
                f"workflow definition {source!r} is not valid JSON: {exc.msg} at line "
                f"{exc.lineno} column {exc.colno}"
            ) from exc
    raise TypeError(
        "definition must be a dict, JSON text or a path, got " + type(definition).__name__
    )


def _unsupported(tasks: Any, where: str, limits: Limits, out: list[str]) -> None:
    """Append every task under ``tasks`` that cannot run in-process, with its position."""
    if not isinstance(tasks, list):
        return
    for i, task in enumerate(tasks):
        if not isinstance(task, Mapping):
            continue
        kind = task.get("type") or "SIMPLE"
        if not isinstance(kind, str):
            continue  # the compiler names a type that is not a string
        w = f"{where}[{i}]"
        refusal = _refusal(task, kind, limits)
        if refusal is not None:
            out.append(f"task {task.get('taskReferenceName')!r} ({w}) {refusal}")
        for branch, branch_where in _task_lists(task, w):
            _unsupported(branch, branch_where, limits, out)


def _refusal(task: Mapping[str, Any], kind: str, limits: Limits) -> str | None:
    """Why the task (of type ``kind``) cannot run in-process ("has type ..."), or None."""
    if kind in SERVER_ONLY:
        return f"has type {kind!r}, which {SERVER_ONLY[kind]}"
    if kind == "EVENT" and limits.event_sink is None:
        return "has type 'EVENT', which needs an event_sink passed to load()"
    if kind == "WAIT" and not _waits_for_time(task):
        return ("has type 'WAIT' without a duration or until, which waits for a signal sent "
                "to a Conductor server")
    if kind not in COMPILERS:
        return f"has unsupported type {kind!r}"
    return None


def _waits_for_time(task: Mapping[str, Any]) -> bool:
    """A WAIT task with a duration or an until (not one waiting for a signal)."""
    params = task.get("inputParameters") or {}
    return isinstance(params, Mapping) and bool(params.get("duration") or params.get("until"))


def _task_lists(task: Mapping[str, Any], where: str) -> Iterator[tuple[Any, str]]:
    """(task list, its position) of every list of tasks nested in ``task``."""
    branches = task.get("forkTasks")
    for b, branch in enumerate(branches if isinstance(branches, list) else ()):
        yield branch, f"{where}.forkTasks[{b}]"
    cases = task.get("decisionCases")
    if isinstance(cases, Mapping):
        for value, branch in cases.items():
            yield branch, f"{where}.decisionCases[{value!r}]"
    yield task.get("defaultCase"), f"{where}.defaultCase"
    yield task.get("loopOver"), f"{where}.loopOver"
    sub = task.get("subWorkflowParam")
    if isinstance(sub, Mapping) and isinstance(sub.get("workflowDefinition"), Mapping):
        yield (sub["workflowDefinition"].get("tasks"),
               f"{where}.subWorkflowParam.workflowDefinition.tasks")


def _compile_workflow(data: Any, library: Library, chain: tuple[str, ...]) -> Workflow:
    """Compile one definition (the top one, or a sub-workflow's) into a Workflow."""
    data = _workflow_object(data)
    name = data.get("name") or "workflow"
    if not isinstance(name, str):
        raise FlowDefinitionError(f"workflow name must be a string, got {name!r}")
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise FlowDefinitionError(f"workflow {name!r} has no tasks")
    _refuse_unsupported(name, tasks, library.limits)
    ctx = _context(library, name, data.get("version"), chain)
    _warn_workflow_fields(ctx, data)
    _, tail = ctx.sequence(tasks, "tasks", [])
    ctx.check_expressions()
    static = frozenset(ctx.where)
    for fan in ctx.dynamic_forks:
        fan.__dict__["static_refs"] = static
    timeout, alert = _workflow_timeout(data, name)
    output_parameters = _output_parameters(data, name, ctx.where)
    return Workflow(name, data.get("version"), dict(data), ctx.nodes, ctx.warnings,
                    timeout, [n for n, _ in tail], output_parameters,
                    frozenset(ctx.optional), library.registry is not None, alert)


def _workflow_object(data: Any) -> Mapping[str, Any]:
    """The definition as an object (a bare ``tasks`` list is a workflow named "workflow")."""
    if isinstance(data, list):
        data = {"name": "workflow", "tasks": data}
    if not isinstance(data, Mapping):
        raise FlowDefinitionError(f"a workflow definition must be a JSON object, got "
                                  f"{type(data).__name__}")
    return data


def _refuse_unsupported(name: str, tasks: list[Any], limits: Limits) -> None:
    """Name every task of the tree that cannot run in-process, all at once."""
    refused: list[str] = []
    _unsupported(tasks, "tasks", limits, refused)
    if refused:
        raise FlowDefinitionError(
            f"workflow {name!r} uses {len(refused)} task(s) that cannot run in-process: "
            + "; ".join(refused) + ". Supported types: " + ", ".join(SUPPORTED_TYPES))


def _context(library: Library, name: str, version: Any, chain: tuple[str, ...]
             ) -> CompileContext:
    """The compile context of one definition, dispatching through COMPILERS."""
    return CompileContext(
        library, name, version, chain, COMPILERS,
        compile_workflow=functools.partial(_compile_nested, library),
        compile_forked=functools.partial(compile_forked, library=library, chain=chain))


def _compile_nested(library: Library, data: Any, chain: tuple[str, ...]) -> Workflow:
    """A sub-workflow's definition compiled under ``chain`` (it ends with its name)."""
    return _compile_workflow(data, library, chain)


def _warn_workflow_fields(ctx: CompileContext, data: Mapping[str, Any]) -> None:
    """Warn about workflow fields not read in-process and a schemaVersion other than 2."""
    for key, value in data.items():
        if key not in _WORKFLOW_FIELDS and not empty(value):
            ctx.warn(f"workflow field {key!r} is not supported in-process and is ignored")
    if data.get("schemaVersion") not in (None, 2):
        ctx.warn(f"schemaVersion {data.get('schemaVersion')!r}: expressions are read as in "
                 "schemaVersion 2 (${...})")


def _output_parameters(data: Mapping[str, Any], name: str, tasks: Mapping[str, str]) -> Any:
    """The compiled ``outputParameters`` (None if absent); each expression names ``workflow``
    or one of ``tasks``."""
    if not data.get("outputParameters"):
        return None
    refs: list[tuple[str, Ref]] = []
    try:
        compiled = compile_value(data["outputParameters"], "outputParameters", refs)
    except ValueError as exc:
        raise FlowDefinitionError(f"workflow {name!r}: {exc}") from None
    for where, expr in refs:
        if expr.is_task and expr.root not in tasks:
            raise FlowDefinitionError(
                f"workflow {name!r}: expression '${{{expr.text}}}' in {where} names task "
                f"{expr.root!r}, which is not defined in the workflow"
            )
    return compiled


def compile_forked(task: Mapping[str, Any], library: Library, chain: tuple[str, ...]
                   ) -> Workflow:
    """A task a dynamic fork forks at run time (any type but SIMPLE), as a one-task workflow
    compiled with the limits and definitions of the ``load`` call that loaded the fork."""
    return _compile_workflow({"name": f"{chain[-1]}.dynamic", "tasks": [dict(task)]}, library,
                             chain)


def _workflow_timeout(data: Mapping[str, Any], name: str) -> tuple[float | None, float | None]:
    """(budget, ALERT_ONLY time) from the definition's timeoutSeconds and timeoutPolicy."""
    seconds = data.get("timeoutSeconds") or 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise FlowDefinitionError(f"workflow {name!r}: timeoutSeconds must be a non-negative "
                                  f"number, got {seconds!r}")
    policy = data.get("timeoutPolicy") or "TIME_OUT_WF"
    if policy not in ("TIME_OUT_WF", "ALERT_ONLY"):
        raise FlowDefinitionError(f"workflow {name!r}: timeoutPolicy {policy!r} is not "
                                  "'TIME_OUT_WF' or 'ALERT_ONLY'")
    if not seconds:
        return None, None
    if policy == "ALERT_ONLY":
        return None, float(seconds)
    return float(seconds), None


def _known_workflows(workflows: Iterable[Any] | Mapping[str, Any] | None
                     ) -> list[Mapping[str, Any]]:
    """The definitions of ``workflows=``, read and checked: each has a ``name`` (from its key
    when given as a mapping without one)."""
    if workflows is None:
        return []
    if isinstance(workflows, (str, bytes)) or not isinstance(workflows, Iterable):
        raise TypeError("workflows must be an iterable of workflow definitions or a mapping "
                        f"name -> definition, got {type(workflows).__name__}")
    entries = (list(workflows.items()) if isinstance(workflows, Mapping)
               else [(None, w) for w in workflows])
    known: list[Mapping[str, Any]] = []
    for key, w in entries:
        d = read_definition(w)
        if isinstance(d, Mapping) and key is not None:
            if d.get("name") is None:
                d = {**d, "name": key}
            elif d.get("name") != key:
                raise FlowDefinitionError(f"workflows[{key!r}] is the definition of "
                                          f"{d.get('name')!r}; the key must be its name")
        if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
            raise FlowDefinitionError("every entry of workflows= must be a workflow definition "
                                      f"with a name, got {type(d).__name__}")
        known.append(d)
    return known


def load(definition: Any, registry: Mapping[str, TaskFn] | None, *,
         max_concurrency: int = 8,
         workflows: Iterable[Any] | Mapping[str, Any] | None = None,
         task_definitions: Iterable[Mapping[str, Any]] | None = None,
         allow_hosts: Sequence[str] | None = None,
         max_response_bytes: int = 10 * 1024 * 1024,
         js_time_limit: float = 5.0,
         js_memory_limit: int = 64 * 1024 * 1024,
         jq_time_limit: float = 5.0,
         jq_memory_limit: int = 1024 * 1024 * 1024,
         max_loop_iterations: int = 1000,
         max_workflow_depth: int = 32,
         event_sink: EventSink | None = None) -> Workflow:
    """Compile a Conductor workflow definition into a runnable [`Workflow`][taskflow.declare.conductor.Workflow].

    Args:
        definition: the workflow definition: a dict (or a bare ``tasks`` list), JSON text (a str
            starting with ``{``), or a path to a JSON file.
        registry: task ``name`` -> ``callable(input: dict) -> dict`` for every SIMPLE task (and
            every task a dynamic fork or DYNAMIC task may run). None loads the definition for
            drawing only (``start`` then refuses to run it).
        max_concurrency: forked tasks of a FORK_JOIN_DYNAMIC in flight at once.
        workflows: definitions (dicts, JSON text or paths) that SUB_WORKFLOW tasks may name by
            ``name`` and ``version``: an iterable of them, or a mapping name -> definition (a
            definition without a ``name`` takes its key).
        task_definitions: Conductor task definitions (``retryCount``, ``retryLogic``,
            ``timeoutSeconds``...) for SIMPLE tasks without an embedded ``taskDefinition``,
            matched by ``name``.
        allow_hosts: host names (or ``host:port``) HTTP tasks may reach; None: any host.
        max_response_bytes: the largest HTTP response body accepted.
        js_time_limit: seconds one JavaScript evaluation may run (capped by the budget).
        js_memory_limit: bytes of heap one JavaScript evaluation may use.
        jq_time_limit: seconds one jq program may run (capped by the budget).
        jq_memory_limit: bytes of address space a jq worker process may use.
        max_loop_iterations: iterations after which a DO_WHILE fails.
        max_workflow_depth: workflows a run may nest (itself, its sub-workflows, theirs...);
            a SUB_WORKFLOW that would nest deeper fails.
        event_sink: ``fn(sink, payload)`` that EVENT tasks publish to; without it EVENT tasks
            are refused at load.

    Returns:
        The Workflow; its nodes are named by ``taskReferenceName``.

    Raises:
        FlowDefinitionError: the definition breaks one of Conductor's rules (a fork not followed
            by a join, an unknown ``joinOn`` reference, a name missing from the registry,
            duplicate reference names, task types that need a Conductor server — all of them
            named —, a malformed expression, a sub-workflow whose literal name reaches itself), is not valid
            JSON, or cannot be read. The message names the task and where it is.
        TypeError: ``definition``, ``registry`` or ``workflows`` of the wrong type.
        ValueError: a limit that is not positive.
    """
    if registry is not None and not isinstance(registry, Mapping):
        raise TypeError(f"registry must be a mapping of task name -> callable, got "
                        f"{type(registry).__name__}")
    if isinstance(allow_hosts, str):
        raise TypeError("allow_hosts must be a sequence of host names, not one string")
    limits = Limits(allow_hosts=None if allow_hosts is None else tuple(allow_hosts),
                    max_response_bytes=max_response_bytes, js_time_limit=js_time_limit,
                    js_memory_limit=js_memory_limit, jq_time_limit=jq_time_limit,
                    jq_memory_limit=jq_memory_limit, max_loop_iterations=max_loop_iterations,
                    max_workflow_depth=max_workflow_depth, event_sink=event_sink)
    try:
        known = _known_workflows(workflows)
        tdefs: dict[str, Mapping[str, Any]] = {}
        for t in task_definitions or ():
            if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
                raise FlowDefinitionError("every entry of task_definitions= must be a task "
                                          "definition with a name")
            tdefs[t["name"]] = t
        library = Library(registry, limits, max_concurrency, known, tdefs)
        data = read_definition(definition)
        key = candidate_key(data)
        library.compiling.add(key)  # a candidate of its own sub-workflows chosen at run time
        workflow = _compile_workflow(data, library, (key[0],))
        library.candidates[key] = workflow
        return workflow
    except RecursionError:  # JSON text or a document nested thousands of levels deep
        raise FlowDefinitionError("workflow definition is nested too deeply") from None
