"""``load``: a Conductor definition compiled into wired taskflow nodes.

The ``tasks`` list is a sequence: each step's nodes depend on the previous step's *exit* nodes
(a fork and its join are one step; a switch's exits are its cases' exits). Loop bodies and
sub-workflows are compiled into graphs of their own, run by their task as nested runs.

Everything is checked before anything runs, following Conductor's rules, and raises
:class:`~taskflow.FlowDefinitionError` naming the task and where it is. Task types that need a
Conductor server are all named at once, each with its type and position.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from taskflow.declare.conductor.boundaries import EventSink, Limits
from taskflow.declare.conductor.expressions import Ref, compile_value
from taskflow.declare.conductor.tasks.control import (
    TERMINATION_STATUSES,
    EventTask,
    SetVariableTask,
    TerminateTask,
    WaitTask,
    parse_duration,
)
from taskflow.declare.conductor.tasks.flow import (
    DynamicForkTask,
    DynamicTask,
    ExclusiveJoinTask,
    ForkTask,
    JoinTask,
    NoopTask,
    SimpleTask,
    SwitchTask,
    TaskFn,
    case_value,
)
from taskflow.declare.conductor.tasks.http import HttpTask
from taskflow.declare.conductor.tasks.javascript import InlineTask, LambdaTask
from taskflow.declare.conductor.tasks.jq import JqTask
from taskflow.declare.conductor.tasks.nested import DoWhileTask, SubWorkflowTask
from taskflow.declare.conductor.workflow import Workflow
from taskflow.errors import FlowDefinitionError
from taskflow.model.node import SchedulingNode

__all__ = ["SUPPORTED_TYPES", "load"]

#: Task types ``load`` compiles.
SUPPORTED_TYPES = ("DECISION", "DO_WHILE", "DYNAMIC", "EVENT", "EXCLUSIVE_JOIN", "FORK_JOIN",
                   "FORK_JOIN_DYNAMIC", "HTTP", "INLINE", "JOIN", "JSON_JQ_TRANSFORM", "LAMBDA",
                   "NOOP", "SET_VARIABLE", "SIMPLE", "SUB_WORKFLOW", "SWITCH", "TERMINATE",
                   "WAIT")

Edge = tuple[SchedulingNode[Any, Any], bool]
Node = SchedulingNode[Any, Any]

_COMMON_FIELDS = frozenset({"name", "taskReferenceName", "type", "inputParameters", "optional",
                            "description", "taskDefinition", "retryCount"})
_TYPE_FIELDS = {
    "SIMPLE": frozenset(),
    "NOOP": frozenset(),
    "FORK_JOIN": frozenset({"forkTasks"}),
    "JOIN": frozenset({"joinOn"}),
    "EXCLUSIVE_JOIN": frozenset({"joinOn", "defaultExclusiveJoinTask"}),
    "SWITCH": frozenset({"decisionCases", "defaultCase", "evaluatorType", "expression"}),
    "DECISION": frozenset({"decisionCases", "defaultCase", "caseValueParam", "caseExpression"}),
    "FORK_JOIN_DYNAMIC": frozenset({"dynamicForkTasksParam", "dynamicForkTasksInputParamName"}),
    "DYNAMIC": frozenset({"dynamicTaskNameParam"}),
    "INLINE": frozenset(),
    "LAMBDA": frozenset(),
    "JSON_JQ_TRANSFORM": frozenset(),
    "HTTP": frozenset(),
    "WAIT": frozenset(),
    "SET_VARIABLE": frozenset(),
    "TERMINATE": frozenset(),
    "EVENT": frozenset({"sink", "asyncComplete"}),
    "DO_WHILE": frozenset({"loopCondition", "loopOver", "evaluatorType", "items"}),
    "SUB_WORKFLOW": frozenset({"subWorkflowParam"}),
}
_SERVER_ONLY = {
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
_TASKDEF_FIELDS = frozenset({"name", "description", "ownerEmail", "retryCount", "timeoutSeconds",
                             "retryDelaySeconds", "retryLogic", "timeoutPolicy",
                             "backoffScaleFactor", "createTime", "updateTime", "createdBy",
                             "updatedBy", "inputKeys", "outputKeys"})
_RETRY_LOGICS = ("FIXED", "EXPONENTIAL_BACKOFF", "LINEAR_BACKOFF")
_TIMEOUT_POLICIES = ("TIME_OUT_WF", "ALERT_ONLY", "RETRY")


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


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == "" or value == [] \
        or value == {}


class _Library:
    """What every workflow of one ``load`` call shares: the registry, the limits, the
    definitions sub-workflows may name, and the chain of workflows being compiled."""

    def __init__(self, registry: Mapping[str, TaskFn] | None, limits: Limits,
                 max_concurrency: int, workflows: list[Mapping[str, Any]],
                 task_definitions: Mapping[str, Mapping[str, Any]]) -> None:
        self.registry = registry
        self.limits = limits
        self.max_concurrency = max_concurrency
        self.workflows = workflows
        self.task_definitions = task_definitions

    def find(self, name: str, version: Any) -> Mapping[str, Any] | None:
        """The definition named ``name`` (the given version, else the highest)."""
        found = [w for w in self.workflows if w.get("name") == name]
        if version is not None:
            found = [w for w in found if w.get("version") == version]
        if not found:
            return None
        def version_of(w: Mapping[str, Any]) -> int:
            v = w.get("version")
            return v if isinstance(v, int) else -1

        return max(found, key=version_of)


def _unsupported(tasks: Any, where: str, limits: Limits, out: list[str]) -> None:
    """Append every task under ``tasks`` that needs a Conductor server, with its position."""
    if not isinstance(tasks, list):
        return
    for i, task in enumerate(tasks):
        w = f"{where}[{i}]"
        if not isinstance(task, Mapping):
            continue
        kind = task.get("type") or "SIMPLE"
        if not isinstance(kind, str):
            continue  # the compiler names a type that is not a string
        ref = task.get("taskReferenceName")
        label = f"task {ref!r} ({w})"
        if kind in _SERVER_ONLY:
            out.append(f"{label} has type {kind!r}, which {_SERVER_ONLY[kind]}")
        elif kind == "EVENT" and limits.event_sink is None:
            out.append(f"{label} has type 'EVENT', which needs an event_sink passed to load()")
        elif kind == "WAIT":
            params = task.get("inputParameters") or {}
            if not isinstance(params, Mapping) or not (params.get("duration")
                                                       or params.get("until")):
                out.append(f"{label} has type 'WAIT' without a duration or until, which waits "
                           "for a signal sent to a Conductor server")
        elif kind not in SUPPORTED_TYPES:
            out.append(f"{label} has unsupported type {kind!r}")
        for key in ("forkTasks",):
            branches = task.get(key)
            for b, branch in enumerate(branches if isinstance(branches, list) else ()):
                _unsupported(branch, f"{w}.{key}[{b}]", limits, out)
        cases = task.get("decisionCases")
        if isinstance(cases, Mapping):
            for value, branch in cases.items():
                _unsupported(branch, f"{w}.decisionCases[{value!r}]", limits, out)
        _unsupported(task.get("defaultCase"), f"{w}.defaultCase", limits, out)
        _unsupported(task.get("loopOver"), f"{w}.loopOver", limits, out)
        sub = task.get("subWorkflowParam")
        if isinstance(sub, Mapping) and isinstance(sub.get("workflowDefinition"), Mapping):
            _unsupported(sub["workflowDefinition"].get("tasks"),
                         f"{w}.subWorkflowParam.workflowDefinition.tasks", limits, out)


class _Compiler:
    """Compiles one definition's task tree into wired nodes (see the module docstring)."""

    def __init__(self, library: _Library, workflow_name: str, version: Any,
                 chain: tuple[str, ...]) -> None:
        self.library = library
        self.registry = library.registry
        self.limits = library.limits
        self.workflow_name = workflow_name
        self.version = version
        self.chain = chain  # the workflows being compiled, outermost first
        self.nodes: dict[str, Node] = {}  # the graph being compiled (top level or a loop body)
        self.where: dict[str, str] = {}  # every task of the definition -> its position
        self.switch_depth: dict[str, int] = {}
        self.optional: set[str] = set()
        self.warnings: list[str] = []
        self.expressions: list[tuple[str, str, Ref]] = []  # (ref, where, expression)
        self.depth = 0  # switches enclosing the task being compiled
        self.dynamic_forks: list[DynamicForkTask] = []

    # -- helpers --

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        logger.warning("conductor workflow {!r}: {}", self.workflow_name, message)

    @staticmethod
    def fail(message: str) -> FlowDefinitionError:
        return FlowDefinitionError(message)

    def label(self, ref: str, where: str) -> str:
        return f"task {ref!r} ({where})"

    def wire(self, node: Node, fathers: Sequence[Edge]) -> None:
        for father, optional in fathers:
            node.depends_on(father, optional=optional)

    def compile_inputs(self, value: Any, ref: str, where: str, field: str) -> Any:
        refs: list[tuple[str, Ref]] = []
        try:
            compiled = compile_value(value, field, refs)
        except ValueError as exc:
            raise self.fail(f"{self.label(ref, where)}: {exc}") from None
        self.expressions.extend((ref, f"{where}.{w}", r) for w, r in refs)
        return compiled

    def new_node(self, cls: type[Any], task: Mapping[str, Any], ref: str, where: str,
                 **extra: Any) -> Node:
        options, delays, alert = self.node_options(task, ref, where)
        if cls is DynamicForkTask:
            node = cls(name=ref, max_concurrency=self.library.max_concurrency,
                       timeout=options.get("timeout"))
            if options.get("retries") or delays:
                self.warn(f"{self.label(ref, where)}: retryCount is not supported on a dynamic "
                          "fork and is ignored")
            delays = ()
        else:
            node = cls(name=ref, **options)
        inputs = self.compile_inputs(task.get("inputParameters") or {}, ref, where,
                                     "inputParameters")
        d = node.__dict__
        d.update(ref=ref, task_type=task.get("type") or "SIMPLE", inputs=inputs,
                 workflow_name=self.workflow_name, workflow_version=self.version,
                 optional_task=bool(task.get("optional")), input=None, limits=self.limits,
                 retry_delays=delays, alert_after=alert, **extra)
        self.nodes[ref] = node
        self.where[ref] = where
        self.switch_depth[ref] = self.depth
        if task.get("optional"):
            self.optional.add(ref)
        return node  # type: ignore[no-any-return]

    def node_options(self, task: Mapping[str, Any], ref: str, where: str
                     ) -> tuple[dict[str, Any], tuple[float, ...], float | None]:
        """Node options, in-task retry delays and ALERT_ONLY time from the task's definition
        (embedded ``taskDefinition``, else one given to ``load`` by name)."""
        tdef = task.get("taskDefinition")
        if not tdef and (task.get("type") or "SIMPLE") == "SIMPLE":
            tdef = self.library.task_definitions.get(task.get("name") or "")
        if tdef is not None and not isinstance(tdef, Mapping):
            raise self.fail(f"{self.label(ref, where)}: taskDefinition must be an object")
        tdef = dict(tdef or {})
        if task.get("retryCount") is not None:
            tdef["retryCount"] = task["retryCount"]  # the workflow task's own count wins
        if not tdef:
            return {}, (), None
        for key, value in tdef.items():
            if key not in _TASKDEF_FIELDS and not _empty(value):
                self.warn(f"{self.label(ref, where)}: taskDefinition.{key} is not supported "
                          "in-process and is ignored")
        try:
            retries = int(tdef.get("retryCount") or 0)
            timeout = float(tdef.get("timeoutSeconds") or 0)
            delay = float(tdef.get("retryDelaySeconds") or 0)
            scale = float(tdef.get("backoffScaleFactor") or 1)
        except (TypeError, ValueError) as exc:
            raise self.fail(f"{self.label(ref, where)}: bad taskDefinition value: {exc}") from None
        if retries < 0 or timeout < 0 or delay < 0 or scale < 0 or math.isnan(timeout) \
                or math.isnan(delay) or math.isnan(scale):
            raise self.fail(f"{self.label(ref, where)}: taskDefinition values must not be "
                            "negative")
        logic = tdef.get("retryLogic") or "FIXED"
        if logic not in _RETRY_LOGICS:
            raise self.fail(f"{self.label(ref, where)}: retryLogic {logic!r} is not one of "
                            + ", ".join(_RETRY_LOGICS))
        policy = tdef.get("timeoutPolicy") or "TIME_OUT_WF"
        if policy not in _TIMEOUT_POLICIES:
            raise self.fail(f"{self.label(ref, where)}: timeoutPolicy {policy!r} is not one of "
                            + ", ".join(_TIMEOUT_POLICIES))
        options: dict[str, Any] = {}
        delays: tuple[float, ...] = ()
        if retries:
            if logic == "EXPONENTIAL_BACKOFF" or delay == 0:
                # Conductor's delay * 2**n is the engine's own back-off, which holds no worker
                options["retries"] = retries
                options["retry_backoff"] = delay
            elif logic == "FIXED":
                delays = (delay,) * retries
            else:  # LINEAR_BACKOFF
                delays = tuple(delay * scale * (n + 1) for n in range(retries))
        alert: float | None = None
        if timeout:
            if policy == "ALERT_ONLY":
                alert = timeout
            else:
                if policy == "RETRY":
                    self.warn(f"{self.label(ref, where)}: timeoutPolicy 'RETRY' runs as "
                              "'TIME_OUT_WF' (a timed-out attempt cannot be interrupted, so "
                              "timeoutSeconds covers every attempt)")
                options["timeout"] = timeout
        return options, delays, alert

    def check_fields(self, task: Mapping[str, Any], ref: str, kind: str, where: str) -> None:
        allowed = _COMMON_FIELDS | _TYPE_FIELDS[kind]
        for key, value in task.items():
            if key not in allowed and not _empty(value):
                self.warn(f"{self.label(ref, where)}: field {key!r} is not supported in-process "
                          "and is ignored")

    def params(self, task: Mapping[str, Any], ref: str, where: str) -> Mapping[str, Any]:
        params = task.get("inputParameters") or {}
        if not isinstance(params, Mapping):
            raise self.fail(f"{self.label(ref, where)}: inputParameters must be an object")
        return params

    # -- sequences --

    def sequence(self, tasks: Any, where: str, fathers: list[Edge]
                 ) -> tuple[Node | None, list[Edge]]:
        """Compile a task list run in order; return its entry node and its exit edges."""
        if not isinstance(tasks, list):
            raise self.fail(f"{where} must be a list of tasks, got {type(tasks).__name__}")
        entry: Node | None = None
        i = 0
        while i < len(tasks):
            task_where = f"{where}[{i}]"
            nxt = tasks[i + 1] if i + 1 < len(tasks) else None
            first, fathers, used = self.step(tasks[i], task_where, fathers, nxt,
                                             f"{where}[{i + 1}]")
            if entry is None:
                entry = first
            i += used
        return entry, fathers

    def step(self, task: Any, where: str, fathers: list[Edge], nxt: Any, next_where: str
             ) -> tuple[Node, list[Edge], int]:
        """Compile one step (a fork and its join are one step): entry, exits, tasks used."""
        ref, kind = self.header(task, where)
        self.check_fields(task, ref, kind, where)
        optional = bool(task.get("optional"))
        if kind in ("SWITCH", "DECISION"):
            return self.switch(task, ref, kind, where, fathers, optional)
        if kind in ("FORK_JOIN", "FORK_JOIN_DYNAMIC"):
            return self.fork(task, ref, kind, where, fathers, optional, nxt, next_where)
        if kind == "JOIN":
            raise self.fail(f"join {self.label(ref, where)} does not follow a FORK_JOIN or "
                            "FORK_JOIN_DYNAMIC task")
        node = self.simple_step(task, ref, kind, where)
        self.wire(node, fathers)
        return node, [(node, optional)], 1

    def simple_step(self, task: Mapping[str, Any], ref: str, kind: str, where: str) -> Node:
        """One task that is one node: every type but the forks and switches."""
        label = self.label(ref, where)
        params = self.params(task, ref, where)
        if kind == "SIMPLE":
            return self.new_node(SimpleTask, task, ref, where, fn=self.callable_for(task, ref,
                                                                                     where))
        if kind == "NOOP":
            return self.new_node(NoopTask, task, ref, where)
        if kind == "DYNAMIC":
            param = task.get("dynamicTaskNameParam") or "taskToExecute"
            if not isinstance(param, str) or param not in params:
                raise self.fail(f"dynamic task {label}: dynamicTaskNameParam {param!r} is not "
                                "one of its inputParameters")
            return self.new_node(DynamicTask, task, ref, where, name_param=param,
                                 registry=self.registry)
        if kind == "INLINE":
            evaluator = params.get("evaluatorType") or "javascript"
            if evaluator not in ("javascript", "graaljs", "value-param"):
                raise self.fail(f"inline {label}: evaluatorType {evaluator!r} is not "
                                "'javascript', 'graaljs' or 'value-param'")
            if not isinstance(params.get("expression"), str):
                raise self.fail(f"inline {label} has no inputParameters.expression")
            return self.new_node(InlineTask, task, ref, where)
        if kind == "LAMBDA":
            if not isinstance(params.get("scriptExpression"), str):
                raise self.fail(f"lambda {label} has no inputParameters.scriptExpression")
            return self.new_node(LambdaTask, task, ref, where)
        if kind == "JSON_JQ_TRANSFORM":
            if not isinstance(params.get("queryExpression"), str):
                raise self.fail(f"json_jq_transform {label} has no "
                                "inputParameters.queryExpression")
            return self.new_node(JqTask, task, ref, where)
        if kind == "HTTP":
            spec = params.get("http_request", params)
            if not isinstance(spec, Mapping) or not (spec.get("uri") or spec.get("url")):
                raise self.fail(f"http {label} has no inputParameters.http_request.uri")
            return self.new_node(HttpTask, task, ref, where)
        if kind == "WAIT":
            duration = params.get("duration")
            if isinstance(duration, str) and "${" not in duration:
                try:
                    parse_duration(duration)
                except ValueError as exc:
                    raise self.fail(f"wait {label}: {exc}") from None
            return self.new_node(WaitTask, task, ref, where)
        if kind == "SET_VARIABLE":
            return self.new_node(SetVariableTask, task, ref, where)
        if kind == "TERMINATE":
            status = params.get("terminationStatus")
            if isinstance(status, str) and "${" not in status \
                    and status not in TERMINATION_STATUSES:
                raise self.fail(f"terminate {label}: terminationStatus {status!r} is not one of "
                                + ", ".join(TERMINATION_STATUSES))
            return self.new_node(TerminateTask, task, ref, where)
        if kind == "EVENT":
            sink = task.get("sink")
            if not isinstance(sink, str) or not sink:
                raise self.fail(f"event {label} has no sink")
            return self.new_node(EventTask, task, ref, where, sink=sink)
        if kind == "EXCLUSIVE_JOIN":
            return self.exclusive_join(task, ref, where)
        if kind == "DO_WHILE":
            return self.do_while(task, ref, where)
        if kind == "SUB_WORKFLOW":
            return self.sub_workflow(task, ref, where)
        raise self.fail(f"{label} has unsupported type {kind!r}")  # pragma: no cover

    def callable_for(self, task: Mapping[str, Any], ref: str, where: str) -> TaskFn | None:
        name = task.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(f"{self.label(ref, where)} has no name")
        if self.registry is None:
            return None
        fn = self.registry.get(name)
        if fn is None:
            known = ", ".join(repr(k) for k in sorted(self.registry)) or "none"
            raise self.fail(
                f"{self.label(ref, where)} uses name {name!r}, which is not in the "
                f"registry (registry: {known})"
            )
        if not callable(fn):
            raise self.fail(f"registry entry {name!r} (for {self.label(ref, where)}) "
                            f"is not callable: {fn!r}")
        return fn

    def header(self, task: Any, where: str) -> tuple[str, str]:
        if not isinstance(task, Mapping):
            raise self.fail(f"{where} must be a task object, got {type(task).__name__}")
        ref = task.get("taskReferenceName")
        if not isinstance(ref, str) or not ref:
            raise self.fail(f"{where} (name {task.get('name')!r}) has no taskReferenceName")
        if ref in self.where:
            raise self.fail(f"duplicate taskReferenceName {ref!r}: {self.where[ref]} and {where}")
        kind = task.get("type") or "SIMPLE"
        if not isinstance(kind, str) or kind not in SUPPORTED_TYPES:
            raise self.fail(
                f"{self.label(ref, where)} has unsupported type {kind!r}; supported types: "
                + ", ".join(SUPPORTED_TYPES)
            )
        return ref, kind

    # -- branching --

    def switch(self, task: Mapping[str, Any], ref: str, kind: str, where: str,
               fathers: list[Edge], optional: bool) -> tuple[Node, list[Edge], int]:
        label = self.label(ref, where)
        params = self.params(task, ref, where)
        evaluator: Any
        expression: Any
        if kind == "DECISION":
            if task.get("caseValueParam"):
                evaluator, expression = "value-param", task["caseValueParam"]
            elif task.get("caseExpression"):
                evaluator, expression = "javascript", task["caseExpression"]
            else:
                raise self.fail(f"decision {label} has no caseValueParam or caseExpression")
        else:
            evaluator = task.get("evaluatorType")
            expression = task.get("expression")
            if evaluator is None:
                raise self.fail(f"switch {label} has no evaluatorType; use 'value-param', "
                                "'javascript' or 'graaljs'")
            if evaluator not in ("value-param", "javascript", "graaljs"):
                raise self.fail(f"switch {label} uses evaluatorType {evaluator!r}, which is not "
                                "supported in-process; use 'value-param', 'javascript' or "
                                "'graaljs'")
            if evaluator == "graaljs":
                evaluator = "javascript"
        if not isinstance(expression, str) or not expression:
            raise self.fail(f"{kind.lower()} {label} has no expression")
        if evaluator == "value-param" and expression not in params:
            raise self.fail(f"{kind.lower()} {label}: malformed expression {expression!r}: with "
                            "value-param it must name one of its inputParameters")
        cases_def = task.get("decisionCases") or {}
        default_def = task.get("defaultCase") or []
        if not isinstance(cases_def, Mapping):
            raise self.fail(f"{kind.lower()} {label}: decisionCases must be an object")
        node = self.new_node(SwitchTask, task, ref, where, evaluator=evaluator,
                             expression=expression, decision=kind == "DECISION", cases={},
                             default=None)
        self.wire(node, fathers)
        exits: list[Edge] = []
        cases: dict[str, tuple[Node, ...]] = {}
        self.depth += 1
        try:
            for value, branch in cases_def.items():
                entry, ends = self.sequence(branch, f"{where}.decisionCases[{value!r}]",
                                            [(node, False)])
                if entry is not None:
                    cases[case_value(value)] = (entry,)
                    exits.extend(ends)
            entry, ends = self.sequence(default_def, f"{where}.defaultCase", [(node, False)])
        finally:
            self.depth -= 1
        default = (entry,) if entry is not None else None
        exits.extend(ends)
        if default is None:
            # no branch may run: the next step also hears from the switch itself
            exits.append((node, optional))
        node.__dict__.update(cases=cases, default=default)
        return node, exits, 1

    def exclusive_join(self, task: Mapping[str, Any], ref: str, where: str) -> Node:
        label = self.label(ref, where)
        join_on = task.get("joinOn") or []
        defaults = task.get("defaultExclusiveJoinTask") or []
        for field, refs in (("joinOn", join_on), ("defaultExclusiveJoinTask", defaults)):
            if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
                raise self.fail(f"exclusive join {label}: {field} must be a list of task "
                                "reference names")
            for r in refs:
                if r not in self.where:
                    raise self.fail(f"exclusive join {label}: {field} names {r!r}, which is "
                                    "not a task before it")
        return self.new_node(ExclusiveJoinTask, task, ref, where, joined=tuple(join_on),
                             defaults=tuple(defaults))

    def fork(self, task: Mapping[str, Any], ref: str, kind: str, where: str,
             fathers: list[Edge], optional: bool, nxt: Any, next_where: str
             ) -> tuple[Node, list[Edge], int]:
        if not isinstance(nxt, Mapping) or (nxt.get("type") or "SIMPLE") != "JOIN":
            what = "fork" if kind == "FORK_JOIN" else "dynamic fork"
            raise self.fail(f"{what} {self.label(ref, where)} is not followed by a join task")
        if kind == "FORK_JOIN_DYNAMIC":
            fork = self.dynamic_fork(task, ref, where)
            self.wire(fork, fathers)
            join_ref, _ = self.header(nxt, next_where)
            self.check_fields(nxt, join_ref, "JOIN", next_where)
            if nxt.get("joinOn"):
                self.warn(f"join {self.label(join_ref, next_where)}: joinOn is ignored after a "
                          "dynamic fork (the join waits for every forked task)")
            join = self.new_node(JoinTask, nxt, join_ref, next_where, joined=(), dynamic=ref)
            join.depends_on(fork, optional=optional)
            return fork, [(join, bool(nxt.get("optional")))], 2
        branches = task.get("forkTasks")
        if not isinstance(branches, list) or not branches:
            raise self.fail(f"fork {self.label(ref, where)} has no forkTasks")
        fork_node = self.new_node(ForkTask, task, ref, where)
        self.wire(fork_node, fathers)
        before = len(self.nodes)
        for b, branch in enumerate(branches):
            if not isinstance(branch, list) or not branch:
                raise self.fail(f"fork {self.label(ref, where)}: branch forkTasks[{b}] is empty")
            self.sequence(branch, f"{where}.forkTasks[{b}]", [(fork_node, optional)])
        inside = list(self.nodes)[before:]
        join_ref, _ = self.header(nxt, next_where)
        self.check_fields(nxt, join_ref, "JOIN", next_where)
        join_on = nxt.get("joinOn") or []
        if not isinstance(join_on, list) or not all(isinstance(r, str) for r in join_on):
            raise self.fail(f"join {self.label(join_ref, next_where)}: joinOn must be a list of "
                            "task reference names")
        for r in join_on:
            if r not in self.nodes:
                raise self.fail(
                    f"join {self.label(join_ref, next_where)} joins on {r!r}, which does not "
                    f"exist (tasks of fork {ref!r}: {', '.join(repr(x) for x in inside)})"
                )
            if r not in inside:
                raise self.fail(f"join {self.label(join_ref, next_where)} joins on {r!r}, "
                                f"which is not a task of fork {ref!r}")
        joined = tuple(dict.fromkeys(join_on))
        join = self.new_node(JoinTask, nxt, join_ref, next_where, joined=joined, dynamic=None)
        # a joined task inside a switch case may be skipped: hearing from the fork keeps the
        # join from being skipped with it (and is the join's only father with no joinOn)
        if not joined or any(self.switch_depth[r] > self.depth for r in joined):
            join.depends_on(fork_node, optional=optional)
        for r in joined:
            join.depends_on(self.nodes[r], optional=r in self.optional)
        return fork_node, [(join, bool(nxt.get("optional")))], 2

    def dynamic_fork(self, task: Mapping[str, Any], ref: str, where: str) -> DynamicForkTask:
        params = self.params(task, ref, where)
        tasks_param = task.get("dynamicForkTasksParam")
        input_param = task.get("dynamicForkTasksInputParamName")
        simple = "forkTaskInputs" in params
        if not simple:
            if not tasks_param or not input_param:
                raise self.fail(
                    f"dynamic fork {self.label(ref, where)} needs dynamicForkTasksParam and "
                    "dynamicForkTasksInputParamName, or forkTaskName and forkTaskInputs in its "
                    "inputParameters"
                )
            for key in (tasks_param, input_param):
                if key not in params:
                    raise self.fail(f"dynamic fork {self.label(ref, where)}: {key!r} is not one "
                                    "of its inputParameters")
        else:
            name = params.get("forkTaskName")
            if isinstance(name, str) and self.registry is not None and "${" not in name \
                    and name not in self.registry:
                raise self.fail(f"dynamic fork {self.label(ref, where)} uses forkTaskName "
                                f"{name!r}, which is not in the registry")
        node: DynamicForkTask = self.new_node(  # type: ignore[assignment]
            DynamicForkTask, task, ref, where, tasks_param=tasks_param, input_param=input_param,
            registry=self.registry, static_refs=frozenset(),
            compile_task=functools.partial(compile_forked, library=self.library,
                                           chain=self.chain))
        self.dynamic_forks.append(node)
        return node

    # -- nested graphs --

    def do_while(self, task: Mapping[str, Any], ref: str, where: str) -> Node:
        label = self.label(ref, where)
        loop_over = task.get("loopOver")
        if not isinstance(loop_over, list) or not loop_over:
            raise self.fail(f"do_while {label} has no loopOver tasks")
        evaluator = task.get("evaluatorType") or "javascript"
        if evaluator not in ("javascript", "graaljs", "value-param"):
            raise self.fail(f"do_while {label}: evaluatorType {evaluator!r} is not "
                            "'javascript', 'graaljs' or 'value-param'")
        condition = task.get("loopCondition")
        if condition is not None and not isinstance(condition, str):
            raise self.fail(f"do_while {label}: loopCondition must be a string")
        items = None
        if task.get("items") is not None:
            items = self.compile_inputs(task["items"], ref, where, "items")
        if not condition:
            if items is None:
                self.warn(f"do_while {label} has no loopCondition: it runs once")
            condition = None
        node = self.new_node(DoWhileTask, task, ref, where, body=[], body_refs=(),
                             condition=condition, items=items, body_optional=frozenset(),
                             evaluator="value-param" if evaluator == "value-param"
                             else "javascript")
        outer, before = self.nodes, set(self.where)
        self.nodes = {}
        try:
            self.sequence(loop_over, f"{where}.loopOver", [])
            body = list(self.nodes.values())
        finally:
            self.nodes = outer
        self.nodes[ref] = node  # keep definition order: the loop, then what follows
        body_refs = tuple(r for r in self.where if r not in before)
        node.__dict__.update(body=body, body_refs=body_refs,
                             body_optional=frozenset(r for r in body_refs if r in self.optional))
        return node

    def sub_workflow(self, task: Mapping[str, Any], ref: str, where: str) -> Node:
        label = self.label(ref, where)
        param = task.get("subWorkflowParam")
        if not isinstance(param, Mapping):
            raise self.fail(f"sub_workflow {label} has no subWorkflowParam")
        data = param.get("workflowDefinition")
        name = param.get("name")
        if isinstance(data, str) and "${" in data:
            raise self.fail(f"sub_workflow {label}: a workflowDefinition chosen at run time is "
                            "not supported in-process; pass the definitions to load()")
        if data is None:
            if not isinstance(name, str) or not name:
                raise self.fail(f"sub_workflow {label}: subWorkflowParam needs a name or a "
                                "workflowDefinition")
            if name in self.chain:
                loop = " -> ".join(repr(n) for n in self.chain + (name,))
                raise self.fail(f"sub_workflow {label} reaches workflow {name!r} again "
                                f"({loop}): a workflow may not run itself")
            data = self.library.find(name, param.get("version"))
            if data is None:
                known = sorted({str(w.get("name")) for w in self.library.workflows})
                raise self.fail(
                    f"sub_workflow {label}: no definition of workflow {name!r}"
                    + (f" version {param.get('version')!r}" if param.get("version") else "")
                    + " was passed to load(workflows=...) (known: "
                    + (", ".join(repr(k) for k in known) or "none") + ")")
        if not isinstance(data, Mapping):
            raise self.fail(f"sub_workflow {label}: workflowDefinition must be an object")
        sub_name = str(data.get("name") or name or f"{self.workflow_name}.{ref}")
        if data.get("name") and data["name"] in self.chain:
            loop = " -> ".join(repr(n) for n in self.chain + (data["name"],))
            raise self.fail(f"sub_workflow {label} reaches workflow {data['name']!r} again "
                            f"({loop}): a workflow may not run itself")
        try:
            sub = _compile_workflow(data, self.library, self.chain + (str(sub_name),))
        except FlowDefinitionError as exc:
            raise self.fail(f"sub_workflow {label}: {exc}") from None
        self.warnings.extend(f"sub_workflow {ref!r}: {w}" for w in sub.warnings)
        return self.new_node(SubWorkflowTask, task, ref, where, sub=sub)

    def check_expressions(self) -> None:
        """Every expression names ``workflow`` or a task of this workflow (Conductor's rule)."""
        for ref, where, expr in self.expressions:
            if expr.is_task and expr.root not in self.where:
                raise self.fail(
                    f"{self.label(ref, self.where[ref])}: expression '${{{expr.text}}}' in "
                    f"{where.split('.', 1)[-1] if '.' in where else where} names task "
                    f"{expr.root!r}, which is not defined in the workflow"
                )


def _compile_workflow(data: Any, library: _Library, chain: tuple[str, ...]) -> Workflow:
    """Compile one definition (the top one, or a sub-workflow's) into a Workflow."""
    if isinstance(data, list):
        data = {"name": "workflow", "tasks": data}
    if not isinstance(data, Mapping):
        raise FlowDefinitionError(f"a workflow definition must be a JSON object, got "
                                  f"{type(data).__name__}")
    name = data.get("name") or "workflow"
    if not isinstance(name, str):
        raise FlowDefinitionError(f"workflow name must be a string, got {name!r}")
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise FlowDefinitionError(f"workflow {name!r} has no tasks")
    refused: list[str] = []
    _unsupported(tasks, "tasks", library.limits, refused)
    if refused:
        raise FlowDefinitionError(
            f"workflow {name!r} uses {len(refused)} task(s) that cannot run in-process: "
            + "; ".join(refused) + ". Supported types: " + ", ".join(SUPPORTED_TYPES))
    compiler = _Compiler(library, name, data.get("version"), chain)
    for key, value in data.items():
        if key not in _WORKFLOW_FIELDS and not _empty(value):
            compiler.warn(f"workflow field {key!r} is not supported in-process and is ignored")
    if data.get("schemaVersion") not in (None, 2):
        compiler.warn(f"schemaVersion {data.get('schemaVersion')!r}: expressions are read as in "
                      "schemaVersion 2 (${...})")
    _, tail = compiler.sequence(tasks, "tasks", [])
    compiler.check_expressions()
    static = frozenset(compiler.where)
    for fan in compiler.dynamic_forks:
        fan.__dict__["static_refs"] = static
    timeout, alert = _workflow_timeout(data, compiler)
    output_parameters = None
    if data.get("outputParameters"):
        refs: list[tuple[str, Ref]] = []
        try:
            output_parameters = compile_value(data["outputParameters"], "outputParameters", refs)
        except ValueError as exc:
            raise FlowDefinitionError(f"workflow {name!r}: {exc}") from None
        for where, expr in refs:
            if expr.is_task and expr.root not in compiler.where:
                raise FlowDefinitionError(
                    f"workflow {name!r}: expression '${{{expr.text}}}' in {where} names task "
                    f"{expr.root!r}, which is not defined in the workflow"
                )
    return Workflow(name, data.get("version"), dict(data), compiler.nodes, compiler.warnings,
                    timeout, [n for n, _ in tail], output_parameters,
                    frozenset(compiler.optional), library.registry is not None, alert)


def compile_forked(task: Mapping[str, Any], library: _Library, chain: tuple[str, ...]
                   ) -> Workflow:
    """A task a dynamic fork forks at run time (any type but SIMPLE), as a one-task workflow
    compiled with the limits and definitions of the ``load`` call that loaded the fork."""
    return _compile_workflow({"name": f"{chain[-1]}.dynamic", "tasks": [dict(task)]}, library,
                             chain)


def _workflow_timeout(data: Mapping[str, Any], compiler: _Compiler
                      ) -> tuple[float | None, float | None]:
    """(budget, ALERT_ONLY time) from the definition's timeoutSeconds and timeoutPolicy."""
    seconds = data.get("timeoutSeconds") or 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise FlowDefinitionError(f"workflow {compiler.workflow_name!r}: timeoutSeconds must be a "
                                  f"non-negative number, got {seconds!r}")
    policy = data.get("timeoutPolicy") or "TIME_OUT_WF"
    if policy not in ("TIME_OUT_WF", "ALERT_ONLY"):
        raise FlowDefinitionError(f"workflow {compiler.workflow_name!r}: timeoutPolicy "
                                  f"{policy!r} is not 'TIME_OUT_WF' or 'ALERT_ONLY'")
    if not seconds:
        return None, None
    if policy == "ALERT_ONLY":
        return None, float(seconds)
    return float(seconds), None


def load(definition: Any, registry: Mapping[str, TaskFn] | None, *,
         max_concurrency: int = 8,
         workflows: Iterable[Any] | None = None,
         task_definitions: Iterable[Mapping[str, Any]] | None = None,
         allow_hosts: Sequence[str] | None = None,
         max_response_bytes: int = 10 * 1024 * 1024,
         js_time_limit: float = 5.0,
         js_memory_limit: int = 64 * 1024 * 1024,
         jq_time_limit: float = 5.0,
         jq_memory_limit: int = 1024 * 1024 * 1024,
         max_loop_iterations: int = 1000,
         event_sink: EventSink | None = None) -> Workflow:
    """Compile a Conductor workflow definition into a runnable :class:`Workflow`.

    Args:
        definition: the workflow definition: a dict (or a bare ``tasks`` list), JSON text (a str
            starting with ``{``), or a path to a JSON file.
        registry: task ``name`` -> ``callable(input: dict) -> dict`` for every SIMPLE task (and
            every task a dynamic fork or DYNAMIC task may run). None loads the definition for
            drawing only (``start`` then refuses to run it).
        max_concurrency: forked tasks of a FORK_JOIN_DYNAMIC in flight at once.
        workflows: definitions (dicts, JSON text or paths) that SUB_WORKFLOW tasks may name by
            ``name`` and ``version``.
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
        event_sink: ``fn(sink, payload)`` that EVENT tasks publish to; without it EVENT tasks
            are refused at load.

    Returns:
        The Workflow; its nodes are named by ``taskReferenceName``.

    Raises:
        FlowDefinitionError: the definition breaks one of Conductor's rules (a fork not followed
            by a join, an unknown ``joinOn`` reference, a name missing from the registry,
            duplicate reference names, task types that need a Conductor server — all of them
            named —, a malformed expression, a sub-workflow that reaches itself), is not valid
            JSON, or cannot be read. The message names the task and where it is.
        TypeError: ``definition`` or ``registry`` of the wrong type.
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
                    event_sink=event_sink)
    try:
        known: list[Mapping[str, Any]] = []
        for w in workflows or ():
            d = read_definition(w)
            if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
                raise FlowDefinitionError("every entry of workflows= must be a workflow definition "
                                          f"with a name, got {type(d).__name__}")
            known.append(d)
        tdefs: dict[str, Mapping[str, Any]] = {}
        for t in task_definitions or ():
            if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
                raise FlowDefinitionError("every entry of task_definitions= must be a task "
                                          "definition with a name")
            tdefs[t["name"]] = t
        library = _Library(registry, limits, max_concurrency, known, tdefs)
        data = read_definition(definition)
        top = data.get("name") if isinstance(data, Mapping) else None
        return _compile_workflow(data, library, (str(top or "workflow"),))
    except RecursionError:  # JSON text or a document nested thousands of levels deep
        raise FlowDefinitionError("workflow definition is nested too deeply") from None
