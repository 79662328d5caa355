"""Conductor workflow definitions, run in-process: ``load(definition, registry)``.

Netflix/Orkes Conductor describes a workflow as JSON: a ``tasks`` list run one after another,
with operators for parallelism and branching. ``load`` compiles such a definition into taskflow
nodes (one per task, named by ``taskReferenceName``) and returns a :class:`Workflow`, so a team can
run and test a Conductor workflow in a unit test, on any ``concurrent.futures`` executor, with the
task workers replaced by plain Python callables from a *registry* (task ``name`` -> ``fn(input:
dict) -> dict``).

How a definition becomes a graph
================================
The ``tasks`` list is a sequence: each step's nodes depend on the previous step's *exit* nodes.

``SIMPLE``
    One node calling ``registry[name](input)``; its output (and result in the run) is the dict
    the callable returns (``None`` counts as ``{}``; any other value as ``{"result": value}``, as
    Conductor's Python workers do). Raise :class:`TaskFailedError` to fail with partial output.
``FORK_JOIN`` + ``JOIN``
    A no-op fork node; each ``forkTasks`` branch is compiled as a sequence after it. The JOIN
    that must follow depends on its ``joinOn`` tasks only, so a branch left out of ``joinOn``
    runs without blocking it (with an empty ``joinOn`` the join waits for the fork alone).
    The JOIN's output is ``{ref: output}`` of the joined tasks, as in Conductor.
``SWITCH`` (``evaluatorType: value-param``)
    The switch's value is its input parameter named by ``expression``, compared as text with the
    ``decisionCases`` keys (Java's ``"" + value``: ``true``, ``null``, ``42``). The chosen case
    (or ``defaultCase``) runs and every other case is ``SKIPPED``. The next step depends on each
    case's exit nodes, and on the switch itself when there is no default, so it runs after the
    branch that ran, or right after the switch when no case matched: as in Conductor, a value
    with no case and no default runs no branch and the workflow goes on. The switch's output is
    ``{"evaluationResult": [case], "selectedCase": case}``.
``FORK_JOIN_DYNAMIC`` + ``JOIN``
    A :class:`~taskflow.fanout.FanOutNode` that reads the task list from its input
    (``dynamicForkTasksParam``/``dynamicForkTasksInputParamName``, or ``forkTaskName`` and
    ``forkTaskInputs``) when it runs, and calls the registry for each; the JOIN outputs
    ``{dynamic ref: output}``.
``optional: true``
    Every edge out of the task is optional (``depends_on(x, optional=True)``): its failure does
    not fail the JOIN or the next step, and a failed optional task appears in the JOIN output with
    whatever output it has (``{}``, or :attr:`TaskFailedError.output`). It is still listed in
    ``FlowResult.failed``; :meth:`Workflow.status` says ``COMPLETED`` as Conductor would.

Inputs: ``inputParameters`` are resolved when the task starts, from the workflow input (kept in
the run's :class:`~taskflow.TaskContext` under ``"workflow.input"``) and the outputs of earlier
tasks: ``${workflow.input.x}``, ``${ref.output.a.b[0]}``, ``${ref.input.x}``,
``${workflow.workflowId}``. A string that is exactly one expression becomes the value itself; an
expression inside a longer string is replaced by its text; ``$${`` is a literal ``${``; a path
that leads nowhere gives ``None`` (Conductor's ``null``). A task's input is resolved by its
``on_begin`` hook and the outputs are recorded by ``on_success``/``on_fail`` in the context: on
executors that run tasks in other processes those hooks run in the caller's process, so the
resolved input travels with the task's context snapshot and expressions may read any earlier
task there too (the registry's callables must then be picklable: module-level functions).

Validation follows Conductor's rules and raises :class:`~taskflow.FlowDefinitionError` naming the
task: a fork not followed by a join, a ``joinOn`` reference that does not exist, a task name
missing from the registry, duplicate reference names, an unsupported task type, a malformed
expression or one that names an unknown task. Fields taskflow does not implement are reported
(a loguru warning and :attr:`Workflow.warnings`), never silently ignored.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from taskflow.context import TaskContext, TaskSupport
from taskflow.errors import FlowDefinitionError, ResultNotAvailableError, TaskflowError
from taskflow.fanout import FanInResult, FanOutNode
from taskflow.node import SchedulingNode
from taskflow.result import FlowResult, ResultState
from taskflow.scheduling import TaskScheduling

__all__ = [
    "INPUT_KEY",
    "SUPPORTED_TYPES",
    "TaskFailedError",
    "TaskFn",
    "Workflow",
    "load",
]

#: The TaskContext key holding the workflow input (``${workflow.input...}`` reads it).
INPUT_KEY = "workflow.input"
#: Task types ``load`` compiles.
SUPPORTED_TYPES = ("FORK_JOIN", "FORK_JOIN_DYNAMIC", "JOIN", "SIMPLE", "SWITCH")
#: A registry entry: called with the task's resolved input, returns its output.
TaskFn = Callable[[dict[str, Any]], Any]

_STORE_KEY = "conductor.tasks"  # TaskContext key: flow_id -> ref -> {"input", "output"}

# fields read by the compiler; any other field with a non-empty value is reported
_COMMON_FIELDS = frozenset({"name", "taskReferenceName", "type", "inputParameters", "optional",
                            "description", "taskDefinition"})
_TYPE_FIELDS = {
    "SIMPLE": frozenset(),
    "FORK_JOIN": frozenset({"forkTasks"}),
    "JOIN": frozenset({"joinOn"}),
    "SWITCH": frozenset({"decisionCases", "defaultCase", "evaluatorType", "expression"}),
    "FORK_JOIN_DYNAMIC": frozenset({"dynamicForkTasksParam", "dynamicForkTasksInputParamName"}),
}
_WORKFLOW_METADATA = frozenset({
    "name", "description", "version", "schemaVersion", "ownerEmail", "ownerApp", "createTime",
    "updateTime", "createdBy", "updatedBy", "tags", "inputParameters", "restartable",
    "accessPolicy", "metadata", "inputSchema", "outputSchema", "enforceSchema",
})
_WORKFLOW_FIELDS = _WORKFLOW_METADATA | {"tasks", "outputParameters", "timeoutSeconds",
                                         "timeoutPolicy"}
_TASKDEF_FIELDS = frozenset({"name", "description", "ownerEmail", "retryCount", "timeoutSeconds",
                             "retryDelaySeconds", "retryLogic", "createTime", "updateTime",
                             "createdBy", "updatedBy"})


class TaskFailedError(TaskflowError, RuntimeError):
    """Raised by a task callable to fail with partial output (a Conductor worker's FAILED result).

    The output is what a JOIN shows for a failed optional task and what ``${ref.output...}``
    reads afterwards.

    Args:
        reason: why the task failed (Conductor's ``reasonForIncompletion``).
        output: the task's output so far.
    """

    def __init__(self, reason: str, output: Mapping[str, Any] | None = None) -> None:
        self.reason = reason
        self.output: dict[str, Any] = dict(output or {})
        super().__init__(reason)

    def __reduce__(self) -> tuple[Any, ...]:
        # the output travels back from executors that run tasks in other processes
        return (type(self), (self.reason, self.output))


# -- expressions --------------------------------------------------------------------------------


class _Ref:
    """One ``${...}``: a root (``workflow`` or a task reference), a field and a path."""

    __slots__ = ("field", "path", "root", "text")

    def __init__(self, root: str, field: str, path: tuple[str | int, ...], text: str) -> None:
        self.root = root
        self.field = field  # workflow: input/workflowId/workflowType/version; task: input/output
        self.path = path
        self.text = text


class _Template:
    """A string with expressions: literal text and ``_Ref`` parts (``whole``: one ref, no text)."""

    __slots__ = ("parts", "whole")

    def __init__(self, parts: list[str | _Ref]) -> None:
        self.parts = parts
        self.whole = len(parts) == 1 and isinstance(parts[0], _Ref)


_TOKEN = re.compile(
    r"""\.(?P<key>[^.\[\]'"\s]+)|\[\s*(?P<idx>-?\d+)\s*\]|\[\s*'(?P<sq>[^']*)'\s*\]|\[\s*"(?P<dq>[^"]*)"\s*\]"""
)
_WORKFLOW_FIELDS_READ = ("input", "workflowId", "workflowType", "version")
_TASK_FIELDS_READ = ("input", "output")


def _parse_path(text: str) -> _Ref:
    """``workflow.input.a[0]`` -> _Ref; ValueError with the reason if it is malformed."""
    body = text.strip()
    body = body.removeprefix("$.")
    m = re.match(r"[^.\[\]\s]+", body)
    if m is None:
        raise ValueError("it does not start with 'workflow' or a task reference name")
    root = m.group(0)
    tokens: list[str | int] = []
    pos = m.end()
    while pos < len(body):
        t = _TOKEN.match(body, pos)
        if t is None:
            raise ValueError(f"cannot read the path at {body[pos:]!r}")
        if t.group("idx") is not None:
            tokens.append(int(t.group("idx")))
        else:
            key = t.group("key") or t.group("sq") or t.group("dq") or ""
            if t.group("key") is not None and ("*" in key or key.startswith("?")):
                raise ValueError(f"wildcards and filters ({key!r}) are not supported")
            tokens.append(key)
        pos = t.end()
    if not tokens or not isinstance(tokens[0], str):
        raise ValueError(f"{root!r} must be followed by a field such as '.input' or '.output'")
    field = tokens[0]
    allowed = _WORKFLOW_FIELDS_READ if root == "workflow" else _TASK_FIELDS_READ
    if field not in allowed:
        raise ValueError(
            f"{root}.{field} is not supported; use "
            + " or ".join(f"{root}.{f}" for f in allowed)
        )
    return _Ref(root, field, tuple(tokens[1:]), text)


def _compile_string(text: str) -> str | _Template:
    """Split ``text`` into literals and expressions (ValueError if an expression is malformed)."""
    if "${" not in text:
        return text
    parts: list[str | _Ref] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("$${", i):
            buf.append("${")
            i += 3
            continue
        if text.startswith("${", i):
            end = text.find("}", i + 2)
            if end < 0:
                raise ValueError(f"unclosed '${{' at position {i}")
            inner = text[i + 2:end]
            if "${" in inner or "{" in inner:
                raise ValueError("nested expressions are not supported")
            if not inner.strip():
                raise ValueError("empty expression '${}'")
            if buf:
                parts.append("".join(buf))
                buf = []
            parts.append(_parse_path(inner))
            i = end + 1
            continue
        buf.append(text[i])
        i += 1
    if buf:
        parts.append("".join(buf))
    if not any(isinstance(p, _Ref) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    return _Template(parts)


def _compile_value(value: Any, where: str, refs: list[tuple[str, _Ref]]) -> Any:
    """The definition value with its strings compiled; every ``_Ref`` is appended to ``refs``."""
    if isinstance(value, str):
        try:
            compiled = _compile_string(value)
        except ValueError as exc:
            raise ValueError(f"{where}: malformed expression {value!r}: {exc}") from None
        if isinstance(compiled, _Template):
            refs.extend((where, p) for p in compiled.parts if isinstance(p, _Ref))
        return compiled
    if isinstance(value, Mapping):
        return {k: _compile_value(v, f"{where}.{k}", refs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_compile_value(v, f"{where}[{i}]", refs) for i, v in enumerate(value)]
    return value


def _walk(value: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        if isinstance(step, int):
            if isinstance(value, (list, tuple)) and -len(value) <= step < len(value):
                value = value[step]
            else:
                return None
        elif isinstance(value, Mapping):
            value = value.get(step)
        else:
            return None
        if value is None:
            return None
    return value


def _text(value: Any) -> str:
    """A value inside a longer string, as Conductor (Java's ``toString``) would write it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class _Scope:
    """What expressions read during a run (``lookup``) or after it (``Workflow.output``)."""

    def __init__(self, workflow_input: Any, flow_id: str | None, name: str, version: Any,
                 output_of: Callable[[str], Any], input_of: Callable[[str], Any]) -> None:
        self.workflow_input = workflow_input
        self.flow_id = flow_id
        self.name = name
        self.version = version
        self.output_of = output_of
        self.input_of = input_of

    def read(self, ref: _Ref) -> Any:
        if ref.root == "workflow":
            if ref.field == "input":
                base = self.workflow_input
            elif ref.field == "workflowId":
                base = self.flow_id
            elif ref.field == "workflowType":
                base = self.name
            else:
                base = self.version
        elif ref.field == "output":
            base = self.output_of(ref.root)
        else:
            base = self.input_of(ref.root)
        return _walk(base, ref.path)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, _Template):
            if value.whole:
                return self.read(value.parts[0])  # type: ignore[arg-type]
            return "".join(p if isinstance(p, str) else _text(self.read(p)) for p in value.parts)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value


def _copy(value: Any) -> Any:
    """A deep copy, so that a callable mutating its input cannot change another task's output."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an uncopyable value is passed as it is
        return value


def _as_output(value: Any) -> dict[str, Any]:
    """A callable's return value as a Conductor task output (a dict)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    return {"result": value}


def _failure_output(exc: BaseException | None) -> dict[str, Any]:
    if isinstance(exc, TaskFailedError):
        return dict(exc.output)
    return {}


def _run_store(ctx: TaskContext) -> Mapping[str, Mapping[str, Any]]:
    """This run's ref -> {"input", "output"} record in the context (read only)."""
    runs = ctx.get(_STORE_KEY) or {}
    return runs.get(ctx.flow_id) or {}


_STORE_LOCK = threading.Lock()  # serialises the read-modify-write of _STORE_KEY in any context


def _store_put(ctx: TaskContext, ref: str, **fields: Any) -> None:
    """Record ``fields`` for task ``ref`` in this run's record.

    Copy on write: a record already in the context is never mutated, because a snapshot of the
    context taken for a task on another process may be being pickled meanwhile.
    """
    flow_id = ctx.flow_id
    with _STORE_LOCK:
        runs = dict(ctx.get(_STORE_KEY) or {})
        run = dict(runs.get(flow_id) or {})
        rec = dict(run.get(ref) or {})
        rec.update(fields)
        run[ref] = rec
        runs[flow_id] = run
        ctx[_STORE_KEY] = runs


def _case_value(value: Any) -> str:
    """A switch value as Conductor compares it with the case names (Java's ``"" + value``)."""
    return _text(value)


# -- nodes --------------------------------------------------------------------------------------


class _TaskMixin:
    """What every node compiled from a Conductor task shares: its input, its output."""

    # set by the compiler (through __dict__)
    ref: str
    task_type: str
    inputs: Any  # compiled inputParameters
    workflow_name: str
    workflow_version: Any
    optional_task: bool

    def _scope(self, ctx: TaskContext, store: Mapping[str, Mapping[str, Any]]) -> _Scope:
        def output_of(ref: str) -> Any:
            try:
                value = ctx.result_of(ref)
            except (ResultNotAvailableError, KeyError):
                rec = store.get(ref)
                return None if rec is None else rec.get("output")
            return {} if isinstance(value, FanInResult) else value

        def input_of(ref: str) -> Any:
            rec = store.get(ref)
            return None if rec is None else rec.get("input")

        return _Scope(ctx.get(INPUT_KEY) or {}, ctx.flow_id, self.workflow_name,
                      self.workflow_version, output_of, input_of)

    def _resolve_input(self, ctx: TaskContext) -> dict[str, Any]:
        """Resolve ``inputParameters`` and record them (``${ref.input...}``, ``node.input``)."""
        value = _copy(self._scope(ctx, _run_store(ctx)).resolve(self.inputs))
        resolved: dict[str, Any] = value if isinstance(value, dict) else {}
        _store_put(ctx, self.ref, input=resolved)
        self.__dict__["input"] = resolved  # on this run's copy: result[ref].input
        return resolved

    def _input(self, ctx: TaskContext) -> dict[str, Any]:
        """The input ``on_begin`` resolved for this attempt (resolved now if it did not)."""
        rec = _run_store(ctx).get(self.ref)
        if rec is not None and "input" in rec:
            return _copy(rec["input"])  # type: ignore[no-any-return]
        return self._resolve_input(ctx)

    # The hooks run in the caller's process on executors that run tasks in other processes, and
    # before the context snapshot that travels with the task is taken: inputs are resolved and
    # outputs recorded there, so expressions can read any earlier task, not only the fathers.

    def on_begin(self, support: TaskSupport) -> None:
        self._resolve_input(support.context)

    def on_success(self, support: TaskSupport) -> None:
        value = support.work_result.result
        _store_put(support.context, self.ref,
                   output={} if isinstance(value, FanInResult) else value)

    def on_fail(self, support: TaskSupport) -> None:
        _store_put(support.context, self.ref,
                   output=_failure_output(support.work_result.exception))


class _SimpleTask(_TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``SIMPLE``: calls the registry's callable with the resolved input."""

    _viz_kind: ClassVar[str] = "task"
    fn: TaskFn | None

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        task_input = self._input(ctx)
        fn = self.fn
        if fn is None:
            raise FlowDefinitionError(
                f"task {self.ref!r} has no callable: its workflow was loaded without a registry"
            )
        return _as_output(fn(task_input))


class _ForkTask(_TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``FORK_JOIN``: a no-op whose sons are the branches' first tasks (no output)."""

    _viz_kind: ClassVar[str] = "fork"

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        self._input(ctx)
        return {}


class _JoinTask(_TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``JOIN``: ``{ref: output}`` of the joined tasks in this run."""

    _viz_kind: ClassVar[str] = "join"
    joined: tuple[str, ...]  # static fork: the joinOn refs
    dynamic: str | None  # dynamic fork: the fan-out's ref

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        self._input(ctx)
        if self.dynamic is not None:
            return self._dynamic_output(ctx, self.dynamic)
        store = _run_store(ctx)
        out: dict[str, Any] = {}
        for ref in self.joined:
            try:
                value = ctx.result_of(ref)
            except (ResultNotAvailableError, KeyError):
                rec = store.get(ref)
                if rec is None or "output" not in rec:
                    continue  # never ran: an unchosen switch case, not part of this run
                out[ref] = rec["output"] or {}  # failed (optional): whatever output it has
                continue
            out[ref] = {} if isinstance(value, FanInResult) else value
        return out

    @staticmethod
    def _dynamic_output(ctx: TaskContext, ref: str) -> dict[str, Any]:
        try:
            fan = ctx.result_of(ref)
        except (ResultNotAvailableError, KeyError):  # an optional dynamic fork that failed
            return {}
        if not isinstance(fan, FanInResult):
            return {}
        order = (_run_store(ctx).get(ref) or {}).get("forked", list(fan.succeeded))
        out: dict[str, Any] = {}
        for key in order:
            if key in fan.succeeded:
                value = fan.succeeded[key]
                out[str(key)] = value.output if isinstance(value, _OptionalFailure) else value
        return out


class _SwitchTask(_TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``SWITCH`` with ``value-param``: chooses the case whose name is the value's text."""

    _routes_sons: ClassVar[bool] = True
    _viz_kind: ClassVar[str] = "switch"
    expression: str
    cases: Mapping[str, tuple[SchedulingNode[Any, Any], ...]]  # case -> entry node (non-empty)
    default: tuple[SchedulingNode[Any, Any], ...] | None

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        task_input = self._input(ctx)
        case = _case_value(task_input.get(self.expression))
        return {"evaluationResult": [case], "selectedCase": case}

    def _choose(self, value: Mapping[str, Any]) -> tuple[SchedulingNode[Any, Any], ...]:
        """The definition sons that run: the chosen case's entry, or the default's, or none,
        plus every son that is not a case entry (the next step, a join on the switch)."""
        case = value.get("selectedCase") if isinstance(value, Mapping) else None
        branch = self.cases.get(case) if isinstance(case, str) else None
        if branch is None:
            branch = self.default or ()
        routed = {id(n) for b in self.cases.values() for n in b}
        routed.update(id(n) for n in self.default or ())
        return tuple(branch) + tuple(s for s in self._sons if id(s) not in routed)

    def __getstate__(self) -> dict[str, Any]:
        # the branches stay in the caller's process; the engine asks the definition node
        state = super().__getstate__()
        state["cases"] = {}
        state["default"] = None
        return state


class _OptionalFailure:
    """A failed optional dynamic task's output, carried through the fan-in as a success."""

    __slots__ = ("error", "output")

    def __init__(self, output: dict[str, Any], error: BaseException) -> None:
        self.output = output
        self.error = error

    def __repr__(self) -> str:
        return f"<optional task failed: {self.error!r} output={self.output!r}>"


class _DynamicForkTask(_TaskMixin, FanOutNode[None]):
    """``FORK_JOIN_DYNAMIC``: forks one registry call per task listed in its input."""

    _viz_kind: ClassVar[str] = "fanout"
    tasks_param: str | None
    input_param: str | None
    registry: Mapping[str, TaskFn] | None
    static_refs: frozenset[str]

    def items(self, ctx: TaskContext, param: None) -> Iterator[tuple[Hashable, Any]]:
        forked = self._forked(self._input(ctx))
        _store_put(ctx, self.ref, forked=[ref for ref, _, _, _ in forked])
        for ref, name, fn_input, optional in forked:
            yield ref, (ref, name, fn_input, optional)

    def _forked(self, task_input: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], bool]]:
        """(ref, name, input, optional) of each forked task, checked before any of them runs."""
        out: list[tuple[str, str, dict[str, Any], bool]] = []
        inputs = task_input.get("forkTaskInputs")
        if isinstance(inputs, list):
            name = task_input.get("forkTaskName") or task_input.get("forkTaskType")
            if not isinstance(name, str) or not name:
                raise ValueError(f"dynamic fork {self.ref!r}: forkTaskInputs needs a forkTaskName")
            for i, item in enumerate(inputs):
                fn_input = dict(item) if isinstance(item, Mapping) else {"input": item}
                fn_input["__index"] = i
                out.append((f"_{name}_{i}", name, fn_input, self.optional_task))
        else:
            tasks = task_input.get(self.tasks_param or "")
            if not isinstance(tasks, list):
                raise TypeError(
                    f"dynamic fork {self.ref!r}: input {self.tasks_param!r} must be a list of "
                    f"tasks, got {type(tasks).__name__}"
                )
            all_inputs = task_input.get(self.input_param or "")
            if not isinstance(all_inputs, Mapping):
                raise TypeError(
                    f"dynamic fork {self.ref!r}: input {self.input_param!r} must be a map of "
                    f"task reference name -> input, got {type(all_inputs).__name__}"
                )
            for i, t in enumerate(tasks):
                if not isinstance(t, Mapping) or not isinstance(t.get("taskReferenceName"), str):
                    raise TypeError(
                        f"dynamic fork {self.ref!r}: task {i} has no taskReferenceName: {t!r}"
                    )
                ref = t["taskReferenceName"]
                kind = t.get("type") or "SIMPLE"
                if kind != "SIMPLE":
                    raise ValueError(
                        f"dynamic fork {self.ref!r}: task {ref!r} has type {kind!r}; "
                        "only SIMPLE tasks can be forked dynamically in-process"
                    )
                name = t.get("name")
                if not isinstance(name, str) or not name:
                    raise ValueError(f"dynamic fork {self.ref!r}: task {ref!r} has no name")
                fn_input = all_inputs.get(ref) or {}
                optional = bool(t.get("optional")) or self.optional_task
                out.append((ref, name, dict(fn_input), optional))
        seen: set[str] = set()
        registry = self.registry
        for ref, name, _, _ in out:
            if ref in seen or ref in self.static_refs:
                raise ValueError(
                    f"dynamic fork {self.ref!r}: task reference name {ref!r} is used twice"
                )
            seen.add(ref)
            if registry is None or not callable(registry.get(name)):
                raise LookupError(
                    f"dynamic fork {self.ref!r}: task {ref!r} uses name {name!r}, "
                    "which is not in the registry"
                )
        return out

    def work(self, ctx: TaskContext, item: Any) -> Any:
        _ref, name, fn_input, optional = item
        assert self.registry is not None  # checked by _forked
        try:
            return _as_output(self.registry[name](_copy(fn_input)))
        except Exception as exc:
            if optional:
                return _OptionalFailure(_failure_output(exc), exc)
            raise


# -- the workflow -------------------------------------------------------------------------------


class Workflow:
    """A loaded Conductor workflow: its nodes and how to run them.

    Attributes:
        name: the definition's ``name``.
        version: its ``version`` (None if absent).
        nodes: every node, in definition order (usable with ``TaskScheduling.start``; put the
            workflow input in the context under :data:`INPUT_KEY`).
        warnings: the fields found in the definition that taskflow does not implement.
        timeout: the definition's ``timeoutSeconds`` as a budget (None: no limit).
        definition: the definition as loaded (a dict).
    """

    def __init__(self, name: str, version: Any, definition: dict[str, Any],
                 nodes: dict[str, SchedulingNode[Any, Any]], warnings: list[str],
                 timeout: float | None, tail: list[SchedulingNode[Any, Any]],
                 output_parameters: Any, optional: frozenset[str],
                 has_registry: bool) -> None:
        self.name = name
        self.version = version
        self.definition = definition
        self._by_ref = nodes
        self.nodes: list[SchedulingNode[Any, Any]] = list(nodes.values())
        self.warnings = warnings
        self.timeout = timeout
        self._tail = tail
        self._output_parameters = output_parameters
        self._optional = optional
        self._has_registry = has_registry

    def __getitem__(self, ref: str) -> SchedulingNode[Any, Any]:
        """The node of task ``ref`` (its ``taskReferenceName``)."""
        return self._by_ref[ref]

    def __contains__(self, ref: object) -> bool:
        return ref in self._by_ref

    def start(self, input: Mapping[str, Any] | None = None, *, executor: Executor,
              timeout: float | None = None, context: TaskContext | None = None) -> FlowResult:
        """Run the workflow on ``executor`` and wait for it (``TaskScheduling.start``).

        Args:
            input: the workflow input (``${workflow.input...}``); None is ``{}``.
            executor: any ``concurrent.futures.Executor``; never shut down here.
            timeout: the run's budget in seconds; None uses the definition's ``timeoutSeconds``
                (none if it has none), ``math.inf`` means no budget. ``start`` returns by then;
                unfinished tasks become TIMEOUT.
            context: the run's TaskContext (a new one if None); the input is stored in it under
                :data:`INPUT_KEY`.

        Returns:
            The FlowResult: node name (task reference name) -> node; ``outputs[ref]`` is a
            task's output.

        Raises:
            FlowDefinitionError: the workflow was loaded without a registry.
            TypeError: ``input`` is not a mapping, or a bad executor/context (see ``start``).
        """
        if not self._has_registry:
            raise FlowDefinitionError(
                f"workflow {self.name!r} was loaded without a registry; "
                "pass one to taskflow.conductor.load() to run it"
            )
        if input is not None and not isinstance(input, Mapping):
            raise TypeError(f"workflow input must be a mapping, got {type(input).__name__}")
        ctx = context if context is not None else TaskContext()
        if not isinstance(ctx, TaskContext):
            raise TypeError(f"context must be a taskflow.TaskContext or None, got {type(ctx).__name__}")
        ctx[INPUT_KEY] = dict(input or {})
        budget = self.timeout if timeout is None else timeout
        return TaskScheduling.start(self.nodes, executor=executor, timeout=budget, context=ctx)

    def status(self, result: FlowResult) -> str:
        """The run's Conductor status: ``COMPLETED`` (failures of optional tasks only),
        ``FAILED``, ``TIMED_OUT`` or ``TERMINATED`` (``ctx.cancel``)."""
        if result.cancelled is not None:
            return "TERMINATED"
        failed = {n: wr for n, wr in result.failed.items() if n not in self._optional}
        if not failed:
            return "COMPLETED"
        if any(wr.state is ResultState.TIMEOUT for wr in failed.values()):
            return "TIMED_OUT"
        return "FAILED"

    def output(self, result: FlowResult, input: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The workflow's output for a run: its ``outputParameters`` resolved against the run
        (``input`` is the workflow input the run was started with), or without them, as in
        Conductor, the output of the last task that ran."""
        def output_of(ref: str) -> Any:
            if ref not in result:
                return None
            wr = result.result_of(ref)
            if wr.state is ResultState.SUCCESS:
                return {} if isinstance(wr.result, FanInResult) else wr.result
            if wr.state in (ResultState.SKIPPED, ResultState.DEFAULT):
                return None
            return _failure_output(wr.exception)

        def input_of(ref: str) -> Any:
            return result[ref].__dict__.get("input") if ref in result else None

        if self._output_parameters is None:
            for node in self._tail:
                value = output_of(node.name)
                if value is not None and result.result_of(node.name).state is ResultState.SUCCESS:
                    return dict(value)
            return {}
        scope = _Scope(dict(input or {}), result.flow_id, self.name, self.version, output_of,
                       input_of)
        value = scope.resolve(self._output_parameters)
        return value if isinstance(value, dict) else {}

    def to_mermaid(self, result: FlowResult | None = None) -> str:
        """A Mermaid flowchart of the workflow (coloured by state for a run ``result``)."""
        from taskflow.viz import definition_to_mermaid

        return definition_to_mermaid(self.nodes, result=result, title=self.name)

    def to_dot(self, result: FlowResult | None = None) -> str:
        """A Graphviz DOT graph of the workflow (coloured by state for a run ``result``)."""
        from taskflow.viz import to_dot

        return to_dot(self.nodes, result=result, title=self.name)

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r} tasks={len(self.nodes)}>"


# -- loading and compiling ----------------------------------------------------------------------


def _read_definition(definition: Any) -> Any:
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
            except OSError as exc:
                raise FlowDefinitionError(f"cannot read workflow definition {str(path)!r}: {exc}") from exc
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
    return value is None or value is False or value == 0 or value == "" or value == [] or value == {}


class _Compiler:
    """Compiles a definition's task tree into wired nodes (see the module docstring)."""

    def __init__(self, registry: Mapping[str, TaskFn] | None, workflow_name: str, version: Any,
                 max_concurrency: int) -> None:
        self.registry = registry
        self.workflow_name = workflow_name
        self.version = version
        self.max_concurrency = max_concurrency
        self.nodes: dict[str, SchedulingNode[Any, Any]] = {}
        self.where: dict[str, str] = {}
        self.switch_depth: dict[str, int] = {}
        self.optional: set[str] = set()
        self.warnings: list[str] = []
        self.expressions: list[tuple[str, str, _Ref]] = []  # (ref, where, expression)
        self.depth = 0  # switches enclosing the task being compiled
        self.dynamic_forks: list[_DynamicForkTask] = []

    # -- helpers --

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        logger.warning("conductor workflow {!r}: {}", self.workflow_name, message)

    @staticmethod
    def fail(message: str) -> FlowDefinitionError:
        return FlowDefinitionError(message)

    def label(self, ref: str, where: str) -> str:
        return f"task {ref!r} ({where})"

    def wire(self, node: SchedulingNode[Any, Any],
             fathers: Sequence[tuple[SchedulingNode[Any, Any], bool]]) -> None:
        for father, optional in fathers:
            node.depends_on(father, optional=optional)

    def new_node(self, cls: type[Any], task: Mapping[str, Any], ref: str, where: str,
                 **extra: Any) -> Any:
        options = self.node_options(task, ref, where)
        if cls is _DynamicForkTask:
            node = cls(name=ref, max_concurrency=self.max_concurrency,
                       timeout=options.get("timeout"))
            if options.get("retries"):
                self.warn(f"{self.label(ref, where)}: retryCount is not supported on a dynamic "
                          "fork and is ignored")
        else:
            node = cls(name=ref, **options)
        refs: list[tuple[str, _Ref]] = []
        try:
            inputs = _compile_value(task.get("inputParameters") or {}, "inputParameters", refs)
        except ValueError as exc:
            raise self.fail(f"{self.label(ref, where)}: {exc}") from None
        self.expressions.extend((ref, f"{where}.{w}", r) for w, r in refs)
        d = node.__dict__
        d.update(ref=ref, task_type=task.get("type") or "SIMPLE", inputs=inputs,
                 workflow_name=self.workflow_name, workflow_version=self.version,
                 optional_task=bool(task.get("optional")), input=None, **extra)
        self.nodes[ref] = node
        self.where[ref] = where
        self.switch_depth[ref] = self.depth
        if task.get("optional"):
            self.optional.add(ref)
        return node

    def node_options(self, task: Mapping[str, Any], ref: str, where: str) -> dict[str, Any]:
        """Node options from the task's embedded ``taskDefinition`` (retries, timeout)."""
        tdef = task.get("taskDefinition")
        if not tdef:
            return {}
        if not isinstance(tdef, Mapping):
            raise self.fail(f"{self.label(ref, where)}: taskDefinition must be an object")
        for key, value in tdef.items():
            if key not in _TASKDEF_FIELDS and not _empty(value):
                self.warn(f"{self.label(ref, where)}: taskDefinition.{key} is not supported "
                          "in-process and is ignored")
        options: dict[str, Any] = {}
        try:
            retries = int(tdef.get("retryCount") or 0)
            timeout = float(tdef.get("timeoutSeconds") or 0)
            delay = float(tdef.get("retryDelaySeconds") or 0)
        except (TypeError, ValueError) as exc:
            raise self.fail(f"{self.label(ref, where)}: bad taskDefinition value: {exc}") from None
        if retries < 0 or timeout < 0 or delay < 0 or math.isnan(timeout) or math.isnan(delay):
            raise self.fail(f"{self.label(ref, where)}: taskDefinition values must not be negative")
        if retries:
            options["retries"] = retries
            options["retry_backoff"] = delay
            logic = tdef.get("retryLogic") or "FIXED"
            if delay and logic != "EXPONENTIAL_BACKOFF":
                self.warn(f"{self.label(ref, where)}: retryLogic {logic!r} is run as "
                          "exponential back-off starting at retryDelaySeconds")
        if timeout:
            options["timeout"] = timeout
        return options

    def check_fields(self, task: Mapping[str, Any], ref: str, kind: str, where: str) -> None:
        allowed = _COMMON_FIELDS | _TYPE_FIELDS[kind]
        for key, value in task.items():
            if key not in allowed and not _empty(value):
                self.warn(f"{self.label(ref, where)}: field {key!r} is not supported in-process "
                          "and is ignored")

    # -- sequences --

    def sequence(self, tasks: Any, where: str,
                 fathers: list[tuple[SchedulingNode[Any, Any], bool]]
                 ) -> tuple[SchedulingNode[Any, Any] | None, list[tuple[SchedulingNode[Any, Any], bool]]]:
        """Compile a task list run in order; return its entry node and its exit edges."""
        if not isinstance(tasks, list):
            raise self.fail(f"{where} must be a list of tasks, got {type(tasks).__name__}")
        entry: SchedulingNode[Any, Any] | None = None
        i = 0
        while i < len(tasks):
            task_where = f"{where}[{i}]"
            task = tasks[i]
            nxt = tasks[i + 1] if i + 1 < len(tasks) else None
            first, fathers, used = self.step(task, task_where, fathers, nxt, f"{where}[{i + 1}]")
            if entry is None:
                entry = first
            i += used
        return entry, fathers

    def step(self, task: Any, where: str, fathers: list[tuple[SchedulingNode[Any, Any], bool]],
             nxt: Any, next_where: str
             ) -> tuple[SchedulingNode[Any, Any], list[tuple[SchedulingNode[Any, Any], bool]], int]:
        """Compile one step (a fork and its join are one step): entry, exits, tasks used."""
        ref, kind = self.header(task, where)
        self.check_fields(task, ref, kind, where)
        optional = bool(task.get("optional"))
        if kind == "SIMPLE":
            name = task.get("name")
            if not isinstance(name, str) or not name:
                raise self.fail(f"{self.label(ref, where)} has no name")
            fn = None
            if self.registry is not None:
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
            node = self.new_node(_SimpleTask, task, ref, where, fn=fn)
            self.wire(node, fathers)
            return node, [(node, optional)], 1
        if kind == "SWITCH":
            return self.switch(task, ref, where, fathers, optional)
        if kind in ("FORK_JOIN", "FORK_JOIN_DYNAMIC"):
            return self.fork(task, ref, kind, where, fathers, optional, nxt, next_where)
        # a JOIN here follows no fork
        raise self.fail(f"join {self.label(ref, where)} does not follow a FORK_JOIN or "
                        "FORK_JOIN_DYNAMIC task")

    def header(self, task: Any, where: str) -> tuple[str, str]:
        if not isinstance(task, Mapping):
            raise self.fail(f"{where} must be a task object, got {type(task).__name__}")
        ref = task.get("taskReferenceName")
        if not isinstance(ref, str) or not ref:
            raise self.fail(f"{where} (name {task.get('name')!r}) has no taskReferenceName")
        if ref in self.nodes:
            raise self.fail(f"duplicate taskReferenceName {ref!r}: {self.where[ref]} and {where}")
        kind = task.get("type") or "SIMPLE"
        if kind not in SUPPORTED_TYPES:
            raise self.fail(
                f"{self.label(ref, where)} has unsupported type {kind!r}; supported types: "
                + ", ".join(SUPPORTED_TYPES)
            )
        return ref, kind

    def switch(self, task: Mapping[str, Any], ref: str, where: str,
               fathers: list[tuple[SchedulingNode[Any, Any], bool]], optional: bool
               ) -> tuple[SchedulingNode[Any, Any], list[tuple[SchedulingNode[Any, Any], bool]], int]:
        evaluator = task.get("evaluatorType")
        if evaluator != "value-param":
            if evaluator is None:
                raise self.fail(f"switch {self.label(ref, where)} has no evaluatorType; "
                                "use 'value-param'")
            raise self.fail(f"switch {self.label(ref, where)} uses evaluatorType {evaluator!r}, "
                            "which is not supported in-process; use 'value-param'")
        expression = task.get("expression")
        params = task.get("inputParameters") or {}
        if not isinstance(expression, str) or not expression:
            raise self.fail(f"switch {self.label(ref, where)} has no expression")
        if not isinstance(params, Mapping) or expression not in params:
            raise self.fail(f"switch {self.label(ref, where)}: malformed expression "
                            f"{expression!r}: with value-param it must name one of its "
                            "inputParameters")
        cases_def = task.get("decisionCases") or {}
        default_def = task.get("defaultCase") or []
        if not isinstance(cases_def, Mapping):
            raise self.fail(f"switch {self.label(ref, where)}: decisionCases must be an object")
        node = self.new_node(_SwitchTask, task, ref, where, expression=expression, cases={},
                             default=None)
        self.wire(node, fathers)
        exits: list[tuple[SchedulingNode[Any, Any], bool]] = []
        cases: dict[str, tuple[SchedulingNode[Any, Any], ...]] = {}
        self.depth += 1
        try:
            for value, branch in cases_def.items():
                entry, ends = self.sequence(branch, f"{where}.decisionCases[{value!r}]",
                                            [(node, False)])
                if entry is not None:
                    cases[_case_value(value)] = (entry,)
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

    def fork(self, task: Mapping[str, Any], ref: str, kind: str, where: str,
             fathers: list[tuple[SchedulingNode[Any, Any], bool]], optional: bool, nxt: Any,
             next_where: str
             ) -> tuple[SchedulingNode[Any, Any], list[tuple[SchedulingNode[Any, Any], bool]], int]:
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
            join = self.new_node(_JoinTask, nxt, join_ref, next_where, joined=(), dynamic=ref)
            join.depends_on(fork, optional=optional)
            return fork, [(join, bool(nxt.get("optional")))], 2
        branches = task.get("forkTasks")
        if not isinstance(branches, list) or not branches:
            raise self.fail(f"fork {self.label(ref, where)} has no forkTasks")
        fork = self.new_node(_ForkTask, task, ref, where)
        self.wire(fork, fathers)
        before = len(self.nodes)
        for b, branch in enumerate(branches):
            if not isinstance(branch, list) or not branch:
                raise self.fail(f"fork {self.label(ref, where)}: branch forkTasks[{b}] is empty")
            self.sequence(branch, f"{where}.forkTasks[{b}]", [(fork, optional)])
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
        join = self.new_node(_JoinTask, nxt, join_ref, next_where, joined=joined, dynamic=None)
        # a joined task inside a switch case may be skipped: hearing from the fork keeps the
        # join from being skipped with it (and is the join's only father with no joinOn)
        if not joined or any(self.switch_depth[r] > self.depth for r in joined):
            join.depends_on(fork, optional=optional)
        for r in joined:
            join.depends_on(self.nodes[r], optional=r in self.optional)
        return fork, [(join, bool(nxt.get("optional")))], 2

    def dynamic_fork(self, task: Mapping[str, Any], ref: str, where: str) -> _DynamicForkTask:
        params = task.get("inputParameters") or {}
        tasks_param = task.get("dynamicForkTasksParam")
        input_param = task.get("dynamicForkTasksInputParamName")
        simple = isinstance(params, Mapping) and "forkTaskInputs" in params
        if not simple:
            if not tasks_param or not input_param:
                raise self.fail(
                    f"dynamic fork {self.label(ref, where)} needs dynamicForkTasksParam and "
                    "dynamicForkTasksInputParamName, or forkTaskName and forkTaskInputs in its "
                    "inputParameters"
                )
            for key in (tasks_param, input_param):
                if not isinstance(params, Mapping) or key not in params:
                    raise self.fail(f"dynamic fork {self.label(ref, where)}: {key!r} is not one "
                                    "of its inputParameters")
        else:
            name = params.get("forkTaskName")
            if isinstance(name, str) and self.registry is not None and "${" not in name \
                    and name not in self.registry:
                raise self.fail(f"dynamic fork {self.label(ref, where)} uses forkTaskName "
                                f"{name!r}, which is not in the registry")
        node: _DynamicForkTask = self.new_node(
            _DynamicForkTask, task, ref, where, tasks_param=tasks_param, input_param=input_param,
            registry=self.registry, static_refs=frozenset())
        self.dynamic_forks.append(node)
        return node

    def check_expressions(self) -> None:
        """Every expression names ``workflow`` or a task of this workflow (Conductor's rule)."""
        for ref, where, expr in self.expressions:
            if expr.root != "workflow" and expr.root not in self.nodes:
                raise self.fail(
                    f"{self.label(ref, self.where[ref])}: expression '${{{expr.text}}}' in "
                    f"{where.split('.', 1)[-1] if '.' in where else where} names task "
                    f"{expr.root!r}, which is not defined in the workflow"
                )


def load(definition: Any, registry: Mapping[str, TaskFn] | None, *,
         max_concurrency: int = 8) -> Workflow:
    """Compile a Conductor workflow definition into a runnable :class:`Workflow`.

    Args:
        definition: the workflow definition: a dict (or a bare ``tasks`` list), JSON text (a str
            starting with ``{``), or a path to a JSON file.
        registry: task ``name`` -> ``callable(input: dict) -> dict`` for every SIMPLE task (and
            every task a dynamic fork may fork). None loads the definition for drawing only
            (``start`` then refuses to run it).
        max_concurrency: forked tasks of a FORK_JOIN_DYNAMIC in flight at once.

    Returns:
        The Workflow; its nodes are named by ``taskReferenceName``.

    Raises:
        FlowDefinitionError: the definition breaks one of Conductor's rules (a fork not followed
            by a join, an unknown ``joinOn`` reference, a name missing from the registry,
            duplicate reference names, an unsupported task type, a malformed expression), is
            not valid JSON, or cannot be read. The message names the task and where it is.
        TypeError: ``definition`` or ``registry`` of the wrong type.
    """
    if registry is not None and not isinstance(registry, Mapping):
        raise TypeError(f"registry must be a mapping of task name -> callable, got "
                        f"{type(registry).__name__}")
    data = _read_definition(definition)
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
    compiler = _Compiler(registry, name, data.get("version"), max_concurrency)
    for key, value in data.items():
        if key not in _WORKFLOW_FIELDS and not _empty(value):
            compiler.warn(f"workflow field {key!r} is not supported in-process and is ignored")
    if data.get("schemaVersion") not in (None, 2):
        compiler.warn(f"schemaVersion {data.get('schemaVersion')!r}: expressions are read as in "
                      "schemaVersion 2 (${...})")
    _, tail = compiler.sequence(tasks, "tasks", [])
    compiler.check_expressions()
    static = frozenset(compiler.nodes)
    for fan in compiler.dynamic_forks:
        fan.__dict__["static_refs"] = static
    timeout = _workflow_timeout(data, compiler)
    output_parameters = None
    if data.get("outputParameters"):
        refs: list[tuple[str, _Ref]] = []
        try:
            output_parameters = _compile_value(data["outputParameters"], "outputParameters", refs)
        except ValueError as exc:
            raise FlowDefinitionError(f"workflow {name!r}: {exc}") from None
        for where, expr in refs:
            if expr.root != "workflow" and expr.root not in compiler.nodes:
                raise FlowDefinitionError(
                    f"workflow {name!r}: expression '${{{expr.text}}}' in {where} names task "
                    f"{expr.root!r}, which is not defined in the workflow"
                )
    return Workflow(name, data.get("version"), dict(data), compiler.nodes, compiler.warnings,
                    timeout, [n for n, _ in tail], output_parameters,
                    frozenset(compiler.optional), registry is not None)


def _workflow_timeout(data: Mapping[str, Any], compiler: _Compiler) -> float | None:
    seconds = data.get("timeoutSeconds") or 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise FlowDefinitionError(f"workflow {compiler.workflow_name!r}: timeoutSeconds must be a "
                                  f"non-negative number, got {seconds!r}")
    if not seconds:
        return None
    policy = data.get("timeoutPolicy") or "TIME_OUT_WF"
    if policy == "ALERT_ONLY":
        compiler.warn("timeoutPolicy 'ALERT_ONLY' has no in-process equivalent: the workflow "
                      "runs without a budget")
        return None
    return float(seconds)
