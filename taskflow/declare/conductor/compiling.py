"""The compile context every Conductor task type's compile function is handed.

A compile function (one per task type, beside the task class it builds, in
``taskflow.declare.conductor.tasks``) takes a ``CompileContext`` and the ``Site`` of
its task, and returns the task's ``Step``: its entry node, its exit edges and how many tasks
of the list it used (a fork and its join are one step of two tasks). The loader owns the table
of compile functions and hands it to the context, which dispatches every task through it.

The context holds what the compile functions share: the definition's name and version, the
``load`` call's ``Library`` (registry, limits, task definitions, sub-workflow
definitions), the graph being compiled, every task's position, the error and warning helpers,
and the callables that compile a nested workflow (``compile_workflow``) or a task a dynamic fork
forks at run time (``compile_forked``). This module imports no task module: the task modules
import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loguru import logger

from taskflow.declare.conductor.boundaries import Limits
from taskflow.declare.conductor.expressions import Ref, compile_value
from taskflow.errors import FlowDefinitionError
from taskflow.model.node import SchedulingNode

if TYPE_CHECKING:
    from taskflow.declare.conductor.workflow import Workflow

__all__ = ["COMMON_FIELDS", "TYPE_FIELDS", "CompileContext", "CompileFn", "Edge", "Library",
           "Node", "Site", "Step", "candidate_key", "empty", "latest"]

Node = SchedulingNode[Any, Any]
#: A dependency to add: (father, optional father).
Edge = tuple[Node, bool]
#: What compiling one step gives: (entry node, exit edges, tasks of the list used).
Step = tuple[Node, list[Edge], int]

#: Fields every workflow task may carry.
COMMON_FIELDS = frozenset({"name", "taskReferenceName", "type", "inputParameters", "optional",
                           "description", "taskDefinition", "retryCount"})
#: Fields each supported task type reads beyond the common ones (others are warned about).
TYPE_FIELDS = {
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
_TASKDEF_FIELDS = frozenset({"name", "description", "ownerEmail", "retryCount", "timeoutSeconds",
                             "retryDelaySeconds", "retryLogic", "timeoutPolicy",
                             "backoffScaleFactor", "createTime", "updateTime", "createdBy",
                             "updatedBy", "inputKeys", "outputKeys"})
_RETRY_LOGICS = ("FIXED", "EXPONENTIAL_BACKOFF", "LINEAR_BACKOFF")
_TIMEOUT_POLICIES = ("TIME_OUT_WF", "ALERT_ONLY", "RETRY")


def empty(value: Any) -> bool:
    """A field left at its default: ignoring it loses nothing, so it is not warned about."""
    return value is None or value is False or value == 0 or value == "" or value == [] \
        or value == {}


class Library:
    """What every workflow of one ``load`` call shares: the registry, the limits, the
    definitions sub-workflows may name, and the task definitions SIMPLE tasks may name."""

    def __init__(self, registry: Mapping[str, Callable[[dict[str, Any]], Any]] | None,
                 limits: Limits, max_concurrency: int, workflows: list[Mapping[str, Any]],
                 task_definitions: Mapping[str, Mapping[str, Any]]) -> None:
        self.registry = registry
        self.limits = limits
        self.max_concurrency = max_concurrency
        self.workflows = workflows
        self.task_definitions = task_definitions
        # the workflows a SUB_WORKFLOW may choose at run time, (name, version) -> Workflow:
        # every definition of ``workflows`` and the one being loaded, each compiled once;
        # complete when ``load`` returns (nodes read it only when they run)
        self.candidates: dict[tuple[str, Any], Workflow] = {}
        self.compiling: set[tuple[str, Any]] = set()  # candidates being compiled
        self.refused: dict[tuple[str, Any], str] = {}  # candidates that do not load: why

    def find(self, name: str, version: Any) -> Mapping[str, Any] | None:
        """The definition named ``name`` (the given version, else the highest)."""
        found: Mapping[str, Any] | None = latest(
            [w for w in self.workflows if w.get("name") == name], version,
            lambda w: w.get("version"))
        return found

    def compile_candidates(self, compile_workflow: Callable[[Any, tuple[str, ...]], Workflow]
                           ) -> None:
        """Compile every definition of ``workflows`` not compiled (nor being compiled) yet
        into ``candidates``, or into ``refused`` with the reason it does not load."""
        for data in self.workflows:
            key = candidate_key(data)
            if key in self.compiling or key in self.candidates or key in self.refused:
                continue
            self.compiling.add(key)
            try:
                self.candidates[key] = compile_workflow(data, (key[0],))
            except FlowDefinitionError as exc:
                self.refused[key] = str(exc)
            finally:
                self.compiling.discard(key)


def candidate_key(data: Any) -> tuple[str, Any]:
    """A definition's (name, version) as a key of ``Library.candidates`` (a version that
    is not a number or a string is keyed by its text)."""
    if not isinstance(data, Mapping):
        return "workflow", None
    version = data.get("version")
    if not isinstance(version, (int, str, type(None))):
        version = repr(version)
    return str(data.get("name") or "workflow"), version


def latest(found: Sequence[Any], version: Any, version_of: Callable[[Any], Any]) -> Any:
    """Of ``found`` (one name's definitions), the one of ``version`` (an int, or digits), or
    the highest version when ``version`` is None; None when there is none."""
    if isinstance(version, str) and version.strip().isdigit():
        version = int(version)
    if version is not None:
        found = [w for w in found if version_of(w) == version]
    if not found:
        return None

    def number(w: Any) -> int:
        v = version_of(w)
        return v if isinstance(v, int) and not isinstance(v, bool) else -1

    return max(found, key=number)


@dataclass(frozen=True)
class Site:
    """One task of a task list, where it is, and what surrounds it.

    ``fathers`` are the edges the step's entry depends on (the previous step's exits);
    ``nxt``/``next_where`` the task after it (a fork's join) and its position, or None.
    """

    task: Mapping[str, Any]
    ref: str
    kind: str
    where: str
    fathers: list[Edge] = field(default_factory=list)
    nxt: Any = None
    next_where: str = ""

    @property
    def optional(self) -> bool:
        return bool(self.task.get("optional"))

    @property
    def label(self) -> str:
        return f"task {self.ref!r} ({self.where})"


#: A task type's compile function.
CompileFn = Callable[["CompileContext", Site], Step]


class CompileContext:
    """Compiles one definition's task tree into wired nodes (see the module docstring).

    Invariants: ``where`` holds every task compiled so far, nested ones included (reference
    names are unique across the definition); ``nodes`` is the graph being compiled (the top
    level, or a loop body while one is compiled); ``depth`` counts the switches enclosing the
    task being compiled.
    """

    def __init__(self, library: Library, workflow_name: str, version: Any,
                 chain: tuple[str, ...], compilers: Mapping[str, CompileFn],
                 compile_workflow: Callable[[Any, tuple[str, ...]], Workflow],
                 compile_forked: Callable[[Mapping[str, Any]], Workflow]) -> None:
        self.library = library
        self.registry = library.registry
        self.limits = library.limits
        self.workflow_name = workflow_name
        self.version = version
        self.chain = chain  # the workflows being compiled, outermost first
        self.compilers = compilers  # Conductor type -> its compile function
        # compiles a nested definition under a longer chain (sub-workflows)
        self.compile_workflow = compile_workflow
        # compiles a task a dynamic fork forks at run time, as a one-task workflow
        self.compile_forked = compile_forked
        self.nodes: dict[str, Node] = {}
        self.where: dict[str, str] = {}  # every task of the definition -> its position
        self.switch_depth: dict[str, int] = {}
        self.optional: set[str] = set()
        self.warnings: list[str] = []
        self.expressions: list[tuple[str, str, Ref]] = []  # (ref, where, expression)
        self.depth = 0
        self.dynamic_forks: list[Any] = []  # the DynamicForkTask nodes, told the static refs

    # -- helpers --

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        logger.warning("conductor workflow {!r}: {}", self.workflow_name, message)

    @staticmethod
    def fail(message: str) -> FlowDefinitionError:
        return FlowDefinitionError(message)

    @staticmethod
    def label(ref: str, where: str) -> str:
        return f"task {ref!r} ({where})"

    @staticmethod
    def wire(node: Node, fathers: Sequence[Edge]) -> None:
        for father, optional in fathers:
            node.depends_on(father, optional=optional)

    def single(self, site: Site, node: Node) -> Step:
        """The step of a task that is one node: wired to the site's fathers, its own exit."""
        self.wire(node, site.fathers)
        return node, [(node, site.optional)], 1

    def compile_inputs(self, value: Any, ref: str, where: str, field: str) -> Any:
        refs: list[tuple[str, Ref]] = []
        try:
            compiled = compile_value(value, field, refs)
        except ValueError as exc:
            raise self.fail(f"{self.label(ref, where)}: {exc}") from None
        self.expressions.extend((ref, f"{where}.{w}", r) for w, r in refs)
        return compiled

    def params(self, site: Site) -> Mapping[str, Any]:
        """The task's ``inputParameters`` (an object, else FlowDefinitionError)."""
        params = site.task.get("inputParameters") or {}
        if not isinstance(params, Mapping):
            raise self.fail(f"{site.label}: inputParameters must be an object")
        return params

    # -- nodes --

    def new_node(self, cls: type[Any], site: Site, **extra: Any) -> Any:
        """A node of ``cls`` for the site's task, with the options of its task definition."""
        options, delays, alert = self.node_options(site.task, site.ref, site.where)
        return self.register(cls(name=site.ref, **options), site, delays, alert, **extra)

    def register(self, node: Any, site: Site, delays: tuple[float, ...], alert: float | None,
                 **extra: Any) -> Any:
        """Give ``node`` what every Conductor task carries and add it to the graph."""
        task, ref, where = site.task, site.ref, site.where
        inputs = self.compile_inputs(task.get("inputParameters") or {}, ref, where,
                                     "inputParameters")
        node.__dict__.update(ref=ref, task_type=task.get("type") or "SIMPLE", inputs=inputs,
                             workflow_name=self.workflow_name, workflow_version=self.version,
                             optional_task=bool(task.get("optional")), input=None,
                             limits=self.limits, retry_delays=delays, alert_after=alert,
                             **extra)
        self.nodes[ref] = node
        self.where[ref] = where
        self.switch_depth[ref] = self.depth
        if task.get("optional"):
            self.optional.add(ref)
        return node

    def node_options(self, task: Mapping[str, Any], ref: str, where: str
                     ) -> tuple[dict[str, Any], tuple[float, ...], float | None]:
        """Node options, in-task retry delays and ALERT_ONLY time from the task's definition
        (embedded ``taskDefinition``, else one given to ``load`` by name)."""
        label = self.label(ref, where)
        tdef = self.task_definition(task, label)
        if not tdef:
            return {}, (), None
        retries, timeout, delay, scale = _definition_numbers(tdef, label)
        logic = _definition_choice(tdef, "retryLogic", _RETRY_LOGICS, label)
        policy = _definition_choice(tdef, "timeoutPolicy", _TIMEOUT_POLICIES, label)
        options, delays = _retry_plan(retries, logic, delay, scale)
        alert: float | None = None
        if timeout and policy == "ALERT_ONLY":
            alert = timeout
        elif timeout:
            if policy == "RETRY":
                self.warn(f"{label}: timeoutPolicy 'RETRY' runs as 'TIME_OUT_WF' (a timed-out "
                          "attempt cannot be interrupted, so timeoutSeconds covers every "
                          "attempt)")
            options["timeout"] = timeout
        return options, delays, alert

    def task_definition(self, task: Mapping[str, Any], label: str) -> dict[str, Any]:
        """The task's definition, its own ``retryCount`` winning; unknown fields warned
        about."""
        tdef = task.get("taskDefinition")
        if not tdef and (task.get("type") or "SIMPLE") == "SIMPLE":
            tdef = self.library.task_definitions.get(task.get("name") or "")
        if tdef is not None and not isinstance(tdef, Mapping):
            raise self.fail(f"{label}: taskDefinition must be an object")
        tdef = dict(tdef or {})
        if task.get("retryCount") is not None:
            tdef["retryCount"] = task["retryCount"]  # the workflow task's own count wins
        for key, value in tdef.items():
            if key not in _TASKDEF_FIELDS and not empty(value):
                self.warn(f"{label}: taskDefinition.{key} is not supported in-process and is "
                          "ignored")
        return tdef

    # -- sequences --

    def header(self, task: Any, where: str) -> tuple[str, str]:
        """The task's reference name (new to the definition) and its supported type."""
        if not isinstance(task, Mapping):
            raise self.fail(f"{where} must be a task object, got {type(task).__name__}")
        ref = task.get("taskReferenceName")
        if not isinstance(ref, str) or not ref:
            raise self.fail(f"{where} (name {task.get('name')!r}) has no taskReferenceName")
        if ref in self.where:
            raise self.fail(f"duplicate taskReferenceName {ref!r}: {self.where[ref]} and {where}")
        kind = task.get("type") or "SIMPLE"
        if not isinstance(kind, str) or kind not in self.compilers:
            raise self.fail(
                f"{self.label(ref, where)} has unsupported type {kind!r}; supported types: "
                + ", ".join(sorted(self.compilers))
            )
        return ref, kind

    def check_fields(self, task: Mapping[str, Any], ref: str, kind: str, where: str) -> None:
        """Warn about every field the task's type does not read (unless left empty)."""
        allowed = COMMON_FIELDS | TYPE_FIELDS[kind]
        for key, value in task.items():
            if key not in allowed and not empty(value):
                self.warn(f"{self.label(ref, where)}: field {key!r} is not supported in-process "
                          "and is ignored")

    def join_site(self, site: Site) -> Site:
        """The site of the JOIN that follows the fork at ``site`` (checked like any task)."""
        ref, _ = self.header(site.nxt, site.next_where)
        self.check_fields(site.nxt, ref, "JOIN", site.next_where)
        return Site(site.nxt, ref, "JOIN", site.next_where)

    def sequence(self, tasks: Any, where: str, fathers: list[Edge]
                 ) -> tuple[Node | None, list[Edge]]:
        """Compile a task list run in order; return its entry node and its exit edges."""
        if not isinstance(tasks, list):
            raise self.fail(f"{where} must be a list of tasks, got {type(tasks).__name__}")
        entry: Node | None = None
        i = 0
        while i < len(tasks):
            nxt = tasks[i + 1] if i + 1 < len(tasks) else None
            first, fathers, used = self.step(tasks[i], f"{where}[{i}]", fathers, nxt,
                                             f"{where}[{i + 1}]")
            if entry is None:
                entry = first
            i += used
        return entry, fathers

    def step(self, task: Any, where: str, fathers: list[Edge], nxt: Any, next_where: str
             ) -> Step:
        """Compile one step through the compile function of the task's type."""
        ref, kind = self.header(task, where)
        self.check_fields(task, ref, kind, where)
        return self.compilers[kind](self, Site(task, ref, kind, where, fathers, nxt, next_where))

    def check_expressions(self) -> None:
        """Every expression names ``workflow`` or a task of this workflow (Conductor's rule)."""
        for ref, where, expr in self.expressions:
            if expr.is_task and expr.root not in self.where:
                raise self.fail(
                    f"{self.label(ref, self.where[ref])}: expression '${{{expr.text}}}' in "
                    f"{where.split('.', 1)[-1] if '.' in where else where} names task "
                    f"{expr.root!r}, which is not defined in the workflow"
                )


def _definition_numbers(tdef: Mapping[str, Any], label: str
                        ) -> tuple[int, float, float, float]:
    """(retryCount, timeoutSeconds, retryDelaySeconds, backoffScaleFactor), none negative."""
    try:
        retries = int(tdef.get("retryCount") or 0)
        timeout = float(tdef.get("timeoutSeconds") or 0)
        delay = float(tdef.get("retryDelaySeconds") or 0)
        scale = float(tdef.get("backoffScaleFactor") or 1)
    except (TypeError, ValueError) as exc:
        raise FlowDefinitionError(f"{label}: bad taskDefinition value: {exc}") from None
    if retries < 0 or timeout < 0 or delay < 0 or scale < 0 or math.isnan(timeout) \
            or math.isnan(delay) or math.isnan(scale):
        raise FlowDefinitionError(f"{label}: taskDefinition values must not be negative")
    return retries, timeout, delay, scale


def _definition_choice(tdef: Mapping[str, Any], key: str, allowed: tuple[str, ...],
                       label: str) -> str:
    """The definition's ``key``, one of ``allowed`` (the first is the default)."""
    value = tdef.get(key) or allowed[0]
    if value not in allowed:
        raise FlowDefinitionError(f"{label}: {key} {value!r} is not one of "
                                  + ", ".join(allowed))
    return str(value)


def _retry_plan(retries: int, logic: str, delay: float, scale: float
                ) -> tuple[dict[str, Any], tuple[float, ...]]:
    """(engine retry options, in-task retry delays) for ``retries`` retries under ``logic``."""
    if not retries:
        return {}, ()
    if logic == "EXPONENTIAL_BACKOFF" or delay == 0:
        # Conductor's delay * 2**n is the engine's own back-off, which holds no worker
        return {"retries": retries, "retry_backoff": delay}, ()
    if logic == "FIXED":
        return {}, (delay,) * retries
    return {}, tuple(delay * scale * (n + 1) for n in range(retries))  # LINEAR_BACKOFF
