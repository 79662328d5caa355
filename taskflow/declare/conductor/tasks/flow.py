"""The tasks that shape the graph: SIMPLE, NOOP, DYNAMIC, FORK_JOIN, JOIN, EXCLUSIVE_JOIN,
SWITCH, DECISION and FORK_JOIN_DYNAMIC, and the functions that compile them."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, ClassVar

from taskflow.declare.conductor import state
from taskflow.declare.conductor.compiling import CompileContext, Edge, Node, Site, Step
from taskflow.declare.conductor.expressions import as_text
from taskflow.declare.conductor.tasks.base import (
    TaskFailedError,
    TaskMixin,
    as_output,
    copy_value,
    failure_output,
)
from taskflow.declare.conductor.tasks.javascript import evaluate, syntax_error
from taskflow.errors import FlowDefinitionError, ResultNotAvailableError
from taskflow.kinds.fanout import FanInResult, FanOutNode
from taskflow.model.context import TaskContext
from taskflow.model.node import NodeKind, SchedulingNode

__all__ = ["DynamicForkTask", "DynamicTask", "ExclusiveJoinTask", "ForkTask", "JoinTask",
           "NoopTask", "SimpleTask", "SwitchTask", "TaskFn", "compile_dynamic",
           "compile_dynamic_fork", "compile_exclusive_join", "compile_fork", "compile_join",
           "compile_noop", "compile_simple", "compile_switch"]

#: A registry entry: called with the task's resolved input, returns its output.
TaskFn = Callable[[dict[str, Any]], Any]


def case_value(value: Any) -> str:
    """A switch value as Conductor compares it with the case names (Java's ``"" + value``)."""
    return as_text(value)


class SimpleTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``SIMPLE``: calls the registry's callable with the resolved input."""

    draw_as: ClassVar[str | None] = "task"
    fn: TaskFn | None

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        fn = self.fn
        if fn is None:
            raise FlowDefinitionError(
                f"task {self.ref!r} has no callable: its workflow was loaded without a registry"
            )
        return as_output(fn(task_input))


class NoopTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``NOOP``: completes at once with an empty output."""

    draw_as: ClassVar[str | None] = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        return {}


class DynamicTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``DYNAMIC``: runs the registry task named by its input ``dynamicTaskNameParam``."""

    draw_as: ClassVar[str | None] = "task"
    name_param: str
    registry: Mapping[str, TaskFn] | None

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        name = task_input.get(self.name_param)
        if not isinstance(name, str) or not name:
            raise ValueError(f"dynamic task {self.ref!r}: input {self.name_param!r} must name a "
                             f"task, got {name!r}")
        fn = None if self.registry is None else self.registry.get(name)
        if fn is None or not callable(fn):
            raise LookupError(f"dynamic task {self.ref!r}: task name {name!r} is not in the "
                              "registry")
        return as_output(fn(task_input))


class ForkTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``FORK_JOIN``: a no-op whose sons are the branches' first tasks (no output)."""

    draw_as: ClassVar[str | None] = "fork"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        return {}


class JoinTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``JOIN``: ``{ref: output}`` of the joined tasks in this run; as in Conductor, a task
    whose output is empty is left out."""

    draw_as: ClassVar[str | None] = "join"
    joined: tuple[str, ...]  # static fork: the joinOn refs
    dynamic: str | None  # dynamic fork: the fan-out's ref

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        if self.dynamic is not None:
            return self._dynamic_output(ctx, self.dynamic)
        out: dict[str, Any] = {}
        for ref in self.joined:
            value = _output_of(ctx, ref)
            if value:  # never ran (an unchosen case), or an empty output: left out
                out[ref] = value
        return out

    @staticmethod
    def _dynamic_output(ctx: TaskContext, ref: str) -> dict[str, Any]:
        try:
            fan = ctx.result_of(ref)
        except (ResultNotAvailableError, KeyError):  # an optional dynamic fork that failed
            return {}
        if not isinstance(fan, FanInResult):
            return {}
        order = (state.tasks(ctx).get(ref) or {}).get("forked", list(fan.succeeded))
        out: dict[str, Any] = {}
        for key in order:
            if key in fan.succeeded:
                value = fan.succeeded[key]
                value = value.output if isinstance(value, OptionalFailure) else value
                if value:
                    out[str(key)] = value
        return out


def _output_of(ctx: TaskContext, ref: str) -> Any:
    """Task ``ref``'s output in this run: its value, a failed optional task's partial output,
    or None when it did not run."""
    try:
        value = ctx.result_of(ref)
    except (ResultNotAvailableError, KeyError):
        rec = state.tasks(ctx).get(ref)
        if rec is None or "output" not in rec:
            return None
        return rec["output"] or {}
    return {} if isinstance(value, FanInResult) else value


class ExclusiveJoinTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``EXCLUSIVE_JOIN``: the output of the one ``joinOn`` task that ran (the branch a DECISION
    or SWITCH chose), else of the first ``defaultExclusiveJoinTask`` that ran."""

    draw_as: ClassVar[str | None] = "join"
    joined: tuple[str, ...]
    defaults: tuple[str, ...]

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        for ref in self.joined + self.defaults:
            value = _output_of(ctx, ref)
            if value is not None:
                return dict(value)
        return {}


class SwitchTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``SWITCH`` (``value-param``, ``javascript``, ``graaljs``) and ``DECISION``
    (``caseValueParam``, ``caseExpression``): chooses the case whose name is the value's text.

    Output: ``{"evaluationResult": [case], "selectedCase": case}`` for a SWITCH and
    ``{"caseOutput": [case]}`` for a DECISION, as in Conductor.
    """

    # the engine asks choose_sons which sons run, as for a SwitchNode
    node_kind: ClassVar[NodeKind] = NodeKind.SWITCH
    draw_as: ClassVar[str | None] = "switch"
    evaluator: str  # "value-param" or "javascript"
    expression: str  # the input parameter's name, or the script
    decision: bool  # a DECISION (output caseOutput)
    cases: Mapping[str, tuple[SchedulingNode[Any, Any], ...]]  # case -> entry node (non-empty)
    default: tuple[SchedulingNode[Any, Any], ...] | None

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        if self.evaluator == "value-param":
            value = task_input.get(self.expression)
        else:
            value = evaluate(self.ref, self.expression, task_input, self.limits, ctx.remaining())
        case = case_value(value)
        if self.decision:
            return {"caseOutput": [case]}
        return {"evaluationResult": [case], "selectedCase": case}

    def choose_sons(self, value: object) -> tuple[SchedulingNode[Any, Any], ...]:
        """The definition sons that run: the chosen case's entry, or the default's, or none,
        plus every son that is not a case entry (the next step, a join on the switch)."""
        case = None
        if isinstance(value, Mapping):
            case = value.get("selectedCase")
            if case is None and isinstance(value.get("caseOutput"), list) and value["caseOutput"]:
                case = value["caseOutput"][0]
        branch = self.cases.get(case) if isinstance(case, str) else None
        if branch is None:
            branch = self.default or ()
        routed = {id(n) for b in self.cases.values() for n in b}
        routed.update(id(n) for n in self.default or ())
        return tuple(branch) + tuple(s for s in self._sons if id(s) not in routed)

    def __getstate__(self) -> dict[str, Any]:
        # the branches stay in the caller's process; the engine asks the definition node
        st = super().__getstate__()
        st["cases"] = {}
        st["default"] = None
        return st


class OptionalFailure:
    """A failed optional dynamic task's output, carried through the fan-in as a success."""

    __slots__ = ("error", "output")

    def __init__(self, output: dict[str, Any], error: BaseException) -> None:
        self.output = output
        self.error = error

    def __repr__(self) -> str:
        return f"<optional task failed: {self.error!r} output={self.output!r}>"


class DynamicForkTask(TaskMixin, FanOutNode[None]):
    """``FORK_JOIN_DYNAMIC``: forks the tasks listed in its input.

    Each forked task's input is its own ``inputParameters`` (resolved when the fork runs)
    merged with its entry in the tasks-input map, the entry winning, as in Conductor. An entry
    that is not an object fails the fork, naming the fork and the task. A SIMPLE task is a
    registry call; a task of any other type (SUB_WORKFLOW, HTTP, INLINE...) is compiled when
    the fork runs, with the limits and definitions of the ``load`` call, and runs as a nested
    one-task run, its input given as data (never read as expressions). Every forked task is
    checked before any of them runs.
    """

    draw_as: ClassVar[str | None] = "fanout"
    tasks_param: str | None
    input_param: str | None
    registry: Mapping[str, TaskFn] | None
    static_refs: frozenset[str]
    # compiles a forked system task as a one-task workflow, with the limits and definitions
    # of the load() call: the compile context's compile_forked, handed over at compile time
    compile_task: Callable[[Mapping[str, Any]], Any]

    task = FanOutNode.task  # the engine schedules the items; TaskMixin's task is not used

    def items(self, ctx: TaskContext, param: None) -> Iterator[tuple[Hashable, Any]]:
        forked = self._forked(ctx, self.get_input(ctx))
        state.put_task(ctx, self.ref, forked=[item[0] for item in forked])
        for item in forked:
            yield item[0], item

    def _forked(self, ctx: TaskContext, task_input: dict[str, Any]
                ) -> list[tuple[str, str, dict[str, Any], bool, bool]]:
        """(ref, name, input, optional, system) of each forked task, checked before any of
        them runs; for a system task (any type but SIMPLE) the input is its definition."""
        inputs = task_input.get("forkTaskInputs")
        system: dict[str, dict[str, Any]] = {}  # ref -> a forked system task's definition
        if isinstance(inputs, list):
            out = self._named_forks(task_input, inputs)
        else:
            out, system = self._listed_forks(ctx, task_input)
        self._check_forked(out, system)
        return [(ref, name, system.get(ref, fn_input), optional, ref in system)
                for ref, name, fn_input, optional in out]

    def _named_forks(self, task_input: dict[str, Any], inputs: list[Any]
                     ) -> list[tuple[str, str, dict[str, Any], bool]]:
        """``forkTaskName`` forked once per ``forkTaskInputs`` entry, as ``_{name}_{i}``."""
        name = task_input.get("forkTaskName") or task_input.get("forkTaskType")
        if not isinstance(name, str) or not name:
            raise ValueError(f"dynamic fork {self.ref!r}: forkTaskInputs needs a forkTaskName")
        out = []
        for i, item in enumerate(inputs):
            fn_input = dict(item) if isinstance(item, Mapping) else {"input": item}
            fn_input["__index"] = i
            out.append((f"_{name}_{i}", name, fn_input, self.optional_task))
        return out

    def _listed_forks(self, ctx: TaskContext, task_input: dict[str, Any]
                      ) -> tuple[list[tuple[str, str, dict[str, Any], bool]],
                                 dict[str, dict[str, Any]]]:
        """The tasks the tasks param lists, and ref -> definition of the system tasks among
        them (every one compiled here, before any forked task runs)."""
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
        scopes: list[Any] = []  # the fork's scope, resolved once, when a task needs it

        def scope() -> Any:
            if not scopes:
                scopes.append(self.scope(ctx))
            return scopes[0]

        out = []
        system: dict[str, dict[str, Any]] = {}
        for i, t in enumerate(tasks):
            ref, name, merged = self._listed_fork(i, t, all_inputs, scope)
            if (t.get("type") or "SIMPLE") != "SIMPLE":
                system[ref] = _as_system_task(t, merged)
            out.append((ref, name, merged, bool(t.get("optional")) or self.optional_task))
        for ref, tdef in system.items():
            self._compile_one(ref, tdef)  # checked before any forked task runs
        return out, system

    def _listed_fork(self, i: int, t: Any, all_inputs: Mapping[str, Any],
                     scope: Callable[[], Any]) -> tuple[str, str, dict[str, Any]]:
        """(ref, name, input) of listed task ``i``: its own ``inputParameters`` (resolved in
        the fork's scope) merged with its entry in the tasks-input map, the entry winning."""
        if not isinstance(t, Mapping) or not isinstance(t.get("taskReferenceName"), str):
            raise TypeError(f"dynamic fork {self.ref!r}: task {i} has no taskReferenceName: {t!r}")
        ref = t["taskReferenceName"]
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"dynamic fork {self.ref!r}: task {ref!r} has no name")
        entry = all_inputs.get(ref)
        if entry is not None and not isinstance(entry, Mapping):
            raise TypeError(
                f"dynamic fork {self.ref!r}: the input of task {ref!r} in "
                f"{self.input_param!r} must be an object, got {type(entry).__name__} {entry!r}"
            )
        own = t.get("inputParameters") or {}
        if not isinstance(own, Mapping):
            raise TypeError(f"dynamic fork {self.ref!r}: inputParameters of task {ref!r} must "
                            f"be an object, got {type(own).__name__}")
        merged: dict[str, Any] = {}
        if own:
            merged.update(_resolve_forked_input(self.ref, ref, own, scope()))
        merged.update(entry or {})
        return ref, name, merged

    def _check_forked(self, out: list[tuple[str, str, dict[str, Any], bool]],
                      system: Mapping[str, Any]) -> None:
        """Every forked reference is new to the workflow and used once; every forked SIMPLE
        task's name is in the registry."""
        seen: set[str] = set()
        registry = self.registry
        for ref, name, _, _ in out:
            if ref in seen or ref in self.static_refs:
                raise ValueError(
                    f"dynamic fork {self.ref!r}: task reference name {ref!r} is used twice"
                )
            seen.add(ref)
            if ref in system:
                continue
            if registry is None or not callable(registry.get(name)):
                raise LookupError(
                    f"dynamic fork {self.ref!r}: task {ref!r} uses name {name!r}, "
                    "which is not in the registry"
                )

    def _compile_one(self, ref: str, tdef: Mapping[str, Any]) -> Any:
        """A forked system task as a one-task workflow (FlowDefinitionError naming it)."""
        try:
            return self.compile_task(tdef)
        except FlowDefinitionError as exc:
            raise FlowDefinitionError(f"dynamic fork {self.ref!r}: task {ref!r}: {exc}") from None

    def work(self, ctx: TaskContext, item: Any) -> Any:
        ref, name, fn_input, optional, system = item
        try:
            if system:
                return self._run_system(ctx, ref, fn_input)
            assert self.registry is not None  # checked by _forked
            return as_output(self.registry[name](copy_value(fn_input)))
        except Exception as exc:
            if optional:
                return OptionalFailure(failure_output(exc), exc)
            raise

    def _run_system(self, ctx: TaskContext, ref: str, tdef: Mapping[str, Any]) -> Any:
        """Run a forked system task (HTTP, INLINE, SUB_WORKFLOW...) as a nested one-task run."""
        from taskflow.declare.conductor.tasks.nested import run_nested

        wf = self._compile_one(ref, tdef)
        result, _record = run_nested(ctx, wf.nodes, {}, f"{state.run_key(ctx)}/{ref}")
        wr = result.result_of(ref)
        if ref in result.outputs:
            return result.outputs[ref]
        raise TaskFailedError(f"dynamic fork {self.ref!r}: task {ref!r} ended {wr.state.name}: "
                              f"{wr.exception}", failure_output(wr.exception))


def _escape(value: Any) -> Any:
    """Data given as a definition's literal: ``${`` in strings is not an expression."""
    if isinstance(value, str):
        return value.replace("${", "$${")
    if isinstance(value, Mapping):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value


def _as_system_task(task: Mapping[str, Any], task_input: dict[str, Any]) -> dict[str, Any]:
    """A forked system task's definition, with its resolved input as literal inputParameters."""
    tdef = dict(task)
    tdef["inputParameters"] = _escape(task_input)
    return tdef


def _resolve_forked_input(fork: str, ref: str, params: Mapping[str, Any], scope: Any
                          ) -> dict[str, Any]:
    from taskflow.declare.conductor.expressions import compile_value

    refs: list[Any] = []
    try:
        compiled = compile_value(dict(params), "inputParameters", refs)
    except ValueError as exc:
        raise ValueError(f"dynamic fork {fork!r}: task {ref!r}: {exc}") from None
    value = scope.resolve(compiled)
    return dict(value) if isinstance(value, Mapping) else {}


# -- compile functions (see taskflow.declare.conductor.compiling) --


def compile_simple(ctx: CompileContext, site: Site) -> Step:
    """``SIMPLE``: one registry call (None when loaded without a registry)."""
    ctx.params(site)
    return ctx.single(site, ctx.new_node(SimpleTask, site, fn=_registry_callable(ctx, site)))


def _registry_callable(ctx: CompileContext, site: Site) -> TaskFn | None:
    """The registry's callable for the task's ``name`` (FlowDefinitionError if missing)."""
    name = site.task.get("name")
    if not isinstance(name, str) or not name:
        raise ctx.fail(f"{site.label} has no name")
    if ctx.registry is None:
        return None
    fn = ctx.registry.get(name)
    if fn is None:
        known = ", ".join(repr(k) for k in sorted(ctx.registry)) or "none"
        raise ctx.fail(f"{site.label} uses name {name!r}, which is not in the registry "
                       f"(registry: {known})")
    if not callable(fn):
        raise ctx.fail(f"registry entry {name!r} (for {site.label}) is not callable: {fn!r}")
    return fn


def compile_noop(ctx: CompileContext, site: Site) -> Step:
    """``NOOP``."""
    ctx.params(site)
    return ctx.single(site, ctx.new_node(NoopTask, site))


def compile_dynamic(ctx: CompileContext, site: Site) -> Step:
    """``DYNAMIC``: its ``dynamicTaskNameParam`` must be one of its inputParameters."""
    params = ctx.params(site)
    param = site.task.get("dynamicTaskNameParam") or "taskToExecute"
    if not isinstance(param, str) or param not in params:
        raise ctx.fail(f"dynamic task {site.label}: dynamicTaskNameParam {param!r} is not one "
                       "of its inputParameters")
    return ctx.single(site, ctx.new_node(DynamicTask, site, name_param=param,
                                         registry=ctx.registry))


def compile_join(ctx: CompileContext, site: Site) -> Step:
    """``JOIN``: compiled with the fork before it, so one reached alone is refused."""
    raise ctx.fail(f"join {site.label} does not follow a FORK_JOIN or FORK_JOIN_DYNAMIC task")


def compile_exclusive_join(ctx: CompileContext, site: Site) -> Step:
    """``EXCLUSIVE_JOIN``: ``joinOn`` and ``defaultExclusiveJoinTask`` name tasks before it."""
    ctx.params(site)
    join_on = site.task.get("joinOn") or []
    defaults = site.task.get("defaultExclusiveJoinTask") or []
    for field, refs in (("joinOn", join_on), ("defaultExclusiveJoinTask", defaults)):
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise ctx.fail(f"exclusive join {site.label}: {field} must be a list of task "
                           "reference names")
        for r in refs:
            if r not in ctx.where:
                raise ctx.fail(f"exclusive join {site.label}: {field} names {r!r}, which is "
                               "not a task before it")
    return ctx.single(site, ctx.new_node(ExclusiveJoinTask, site, joined=tuple(join_on),
                                         defaults=tuple(defaults)))


def compile_switch(ctx: CompileContext, site: Site) -> Step:
    """``SWITCH`` and ``DECISION``: the switch, then its cases, each a sequence after it.

    Its exits are its cases' exits, and the switch itself when it has no default case (no
    branch may run)."""
    params = ctx.params(site)
    evaluator, expression = _switch_evaluator(ctx, site)
    what = site.kind.lower()
    if not isinstance(expression, str) or not expression:
        raise ctx.fail(f"{what} {site.label} has no expression")
    if evaluator == "value-param" and expression not in params:
        raise ctx.fail(f"{what} {site.label}: malformed expression {expression!r}: with "
                       "value-param it must name one of its inputParameters")
    if evaluator == "javascript":
        # as Conductor checks at registration: the script parses (it is not run)
        error = syntax_error(expression, ctx.limits)
        if error is not None:
            field = "caseExpression" if site.kind == "DECISION" else "expression"
            raise ctx.fail(f"{what} {site.label}: {field} is not valid JavaScript: {error}")
    cases_def = site.task.get("decisionCases") or {}
    if not isinstance(cases_def, Mapping):
        raise ctx.fail(f"{what} {site.label}: decisionCases must be an object")
    node = ctx.new_node(SwitchTask, site, evaluator=evaluator, expression=expression,
                        decision=site.kind == "DECISION", cases={}, default=None)
    ctx.wire(node, site.fathers)
    cases, default, exits = _switch_cases(ctx, site, node, cases_def)
    if default is None:
        exits.append((node, site.optional))  # no branch may run: the next step hears it too
    node.__dict__.update(cases=cases, default=default)
    return node, exits, 1


def _switch_evaluator(ctx: CompileContext, site: Site) -> tuple[Any, Any]:
    """(evaluator, expression) of a DECISION or SWITCH (graaljs read as javascript)."""
    task = site.task
    if site.kind == "DECISION":
        # as Conductor's DecisionTaskMapper: a non-blank caseExpression wins over caseValueParam
        expression = task.get("caseExpression")
        if isinstance(expression, str) and expression.strip():
            return "javascript", expression
        if task.get("caseValueParam"):
            return "value-param", task["caseValueParam"]
        raise ctx.fail(f"decision {site.label} has no caseValueParam or caseExpression")
    evaluator = task.get("evaluatorType")
    if evaluator is None:
        raise ctx.fail(f"switch {site.label} has no evaluatorType; use 'value-param', "
                       "'javascript' or 'graaljs'")
    if evaluator not in ("value-param", "javascript", "graaljs"):
        raise ctx.fail(f"switch {site.label} uses evaluatorType {evaluator!r}, which is not "
                       "supported in-process; use 'value-param', 'javascript' or 'graaljs'")
    return "javascript" if evaluator == "graaljs" else evaluator, task.get("expression")


def _switch_cases(ctx: CompileContext, site: Site, node: SwitchTask,
                  cases_def: Mapping[str, Any]
                  ) -> tuple[dict[str, tuple[Node, ...]], tuple[Node, ...] | None, list[Edge]]:
    """(case value -> entry, default entry, exits) of the switch's branches, each compiled
    one switch deeper."""
    exits: list[Edge] = []
    cases: dict[str, tuple[Node, ...]] = {}
    ctx.depth += 1
    try:
        for value, branch in cases_def.items():
            entry, ends = ctx.sequence(branch, f"{site.where}.decisionCases[{value!r}]",
                                       [(node, False)])
            if entry is not None:
                cases[case_value(value)] = (entry,)
                exits.extend(ends)
        entry, ends = ctx.sequence(site.task.get("defaultCase") or [],
                                   f"{site.where}.defaultCase", [(node, False)])
    finally:
        ctx.depth -= 1
    exits.extend(ends)
    return cases, (entry,) if entry is not None else None, exits


def _require_join(ctx: CompileContext, site: Site) -> None:
    """A fork is followed by its JOIN (the two are one step)."""
    nxt = site.nxt
    if not isinstance(nxt, Mapping) or (nxt.get("type") or "SIMPLE") != "JOIN":
        what = "fork" if site.kind == "FORK_JOIN" else "dynamic fork"
        raise ctx.fail(f"{what} {site.label} is not followed by a join task")


def compile_fork(ctx: CompileContext, site: Site) -> Step:
    """``FORK_JOIN`` and the JOIN after it: the branches run after the fork, the join after
    the tasks its ``joinOn`` names (and after the fork when that list is empty or a joined
    task is inside a switch case, which may skip it)."""
    _require_join(ctx, site)
    branches = site.task.get("forkTasks")
    if not isinstance(branches, list) or not branches:
        raise ctx.fail(f"fork {site.label} has no forkTasks")
    fork = ctx.new_node(ForkTask, site)
    ctx.wire(fork, site.fathers)
    before = len(ctx.nodes)
    for b, branch in enumerate(branches):
        if not isinstance(branch, list) or not branch:
            raise ctx.fail(f"fork {site.label}: branch forkTasks[{b}] is empty")
        ctx.sequence(branch, f"{site.where}.forkTasks[{b}]", [(fork, site.optional)])
    join_site = ctx.join_site(site)
    joined = _joined(ctx, site, join_site, list(ctx.nodes)[before:])
    join = ctx.new_node(JoinTask, join_site, joined=joined, dynamic=None)
    if not joined or any(ctx.switch_depth[r] > ctx.depth for r in joined):
        join.depends_on(fork, optional=site.optional)
    for r in joined:
        join.depends_on(ctx.nodes[r], optional=r in ctx.optional)
    return fork, [(join, join_site.optional)], 2


def _joined(ctx: CompileContext, site: Site, join_site: Site, inside: list[str]
            ) -> tuple[str, ...]:
    """The join's ``joinOn``, each a task of the fork's branches (``inside``), once each."""
    join_on = join_site.task.get("joinOn") or []
    if not isinstance(join_on, list) or not all(isinstance(r, str) for r in join_on):
        raise ctx.fail(f"join {join_site.label}: joinOn must be a list of task reference names")
    for r in join_on:
        if r not in ctx.nodes:
            raise ctx.fail(f"join {join_site.label} joins on {r!r}, which does not exist "
                           f"(tasks of fork {site.ref!r}: {', '.join(repr(x) for x in inside)})")
        if r not in inside:
            raise ctx.fail(f"join {join_site.label} joins on {r!r}, which is not a task of "
                           f"fork {site.ref!r}")
    return tuple(dict.fromkeys(join_on))


def compile_dynamic_fork(ctx: CompileContext, site: Site) -> Step:
    """``FORK_JOIN_DYNAMIC`` and the JOIN after it, which waits for every forked task.

    The fork is handed the context's ``compile_forked`` to compile the system tasks it forks
    when it runs."""
    _require_join(ctx, site)
    fork = _dynamic_fork_node(ctx, site)
    ctx.wire(fork, site.fathers)
    join_site = ctx.join_site(site)
    if join_site.task.get("joinOn"):
        ctx.warn(f"join {join_site.label}: joinOn is ignored after a dynamic fork (the join "
                 "waits for every forked task)")
    join = ctx.new_node(JoinTask, join_site, joined=(), dynamic=site.ref)
    join.depends_on(fork, optional=site.optional)
    return fork, [(join, join_site.optional)], 2


def _dynamic_fork_node(ctx: CompileContext, site: Site) -> DynamicForkTask:
    """The fan-out node (its retries are ignored, with a warning)."""
    tasks_param, input_param = _dynamic_fork_params(ctx, site)
    options, delays, alert = ctx.node_options(site.task, site.ref, site.where)
    node = DynamicForkTask(name=site.ref, max_concurrency=ctx.library.max_concurrency,
                           timeout=options.get("timeout"))
    if options.get("retries") or delays:
        ctx.warn(f"{site.label}: retryCount is not supported on a dynamic fork and is ignored")
    ctx.register(node, site, (), alert, tasks_param=tasks_param, input_param=input_param,
                 registry=ctx.registry, static_refs=frozenset(),
                 compile_task=ctx.compile_forked)
    ctx.dynamic_forks.append(node)
    return node


def _dynamic_fork_params(ctx: CompileContext, site: Site) -> tuple[Any, Any]:
    """(dynamicForkTasksParam, dynamicForkTasksInputParamName), both inputParameters, unless
    the fork names one task (``forkTaskName``, ``forkTaskInputs``)."""
    params = ctx.params(site)
    tasks_param = site.task.get("dynamicForkTasksParam")
    input_param = site.task.get("dynamicForkTasksInputParamName")
    if "forkTaskInputs" in params:
        name = params.get("forkTaskName")
        if isinstance(name, str) and ctx.registry is not None and "${" not in name \
                and name not in ctx.registry:
            raise ctx.fail(f"dynamic fork {site.label} uses forkTaskName {name!r}, which is "
                           "not in the registry")
        return tasks_param, input_param
    if not tasks_param or not input_param:
        raise ctx.fail(f"dynamic fork {site.label} needs dynamicForkTasksParam and "
                       "dynamicForkTasksInputParamName, or forkTaskName and forkTaskInputs in "
                       "its inputParameters")
    for key in (tasks_param, input_param):
        if key not in params:
            raise ctx.fail(f"dynamic fork {site.label}: {key!r} is not one of its "
                           "inputParameters")
    return tasks_param, input_param
