"""Tasks that run a graph of their own: DO_WHILE (once per iteration) and SUB_WORKFLOW.

Each runs its graph as a nested ``TaskScheduling.start`` on the run's own executor (a nested
start from one of its workers runs inline, so even a one-worker pool cannot deadlock), with a
budget of what remains of the enclosing run's, and a fresh context seeded with what the nested
tasks may read.

DO_WHILE, as Conductor runs it: the ``loopOver`` tasks run, then ``loopCondition`` (JavaScript,
``$`` bound to the loop's input plus ``$.<loop ref>`` = the loop's output so far and
``$.<task ref>`` = each loop task's latest output) decides whether to go again. The loop's
output is ``{"iteration": n, "1": {ref: output, ...}, "2": {...}}``; loop tasks read
``${loop.output.iteration}``, and tasks after the loop read a loop task's last iteration. A
failed loop task fails the loop (with the output so far). ``max_loop_iterations`` (``load``)
bounds a loop whose condition never turns false.

SUB_WORKFLOW: ``subWorkflowParam`` names a definition given to ``load`` (``name``, optional
``version``) or embeds one (``workflowDefinition``). Its input is the task's input; its output
is the sub-workflow's output plus ``subWorkflowId``; a sub-workflow that does not complete
fails the task with that output. A ``name`` (or ``version``) that is an expression
(``${workflow.input.subwf}``) is resolved when the task runs, as Conductor resolves it when it
schedules the task, among every definition passed to ``load(workflows=...)`` and the one
loaded, all compiled at load. A name that matches none fails the task, naming it. Since such a
workflow may run itself (with other input), recursion is checked when the task runs: running a
workflow of the chain again with the same input, or nesting deeper than
``max_workflow_depth``, fails the task.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

from taskflow.declare.conductor import state
from taskflow.declare.conductor.compiling import CompileContext, Site, Step, latest
from taskflow.declare.conductor.tasks.base import TaskFailedError, TaskMixin
from taskflow.declare.conductor.tasks.javascript import evaluate, truthy
from taskflow.errors import FlowDefinitionError
from taskflow.model.context import TaskContext, TaskSupport
from taskflow.model.node import SchedulingNode
from taskflow.model.result import FlowResult

if TYPE_CHECKING:
    from taskflow.declare.conductor.workflow import Workflow

__all__ = ["DoWhileTask", "SubWorkflowTask", "compile_do_while", "compile_sub_workflow",
           "run_nested"]


def _nested(ctx: TaskContext, nodes: list[SchedulingNode[Any, Any]], child: TaskContext
            ) -> FlowResult:
    """Run ``nodes`` with context ``child`` on the enclosing run's executor."""
    from taskflow.declare.conductor.workflow import EXECUTOR_KEY, executor_of, nested_timeout
    from taskflow.scheduling import TaskScheduling

    child[EXECUTOR_KEY] = ctx.get(EXECUTOR_KEY)
    for key in (state.CORRELATION_KEY, state.CHAIN_KEY):
        if key in ctx and key not in child:
            child[key] = ctx[key]
    executor: Executor | None = executor_of(ctx)
    if executor is not None:
        return TaskScheduling.start(nodes, executor=executor, timeout=nested_timeout(ctx),
                                    context=child)
    # the run's executor is not known here (a task started outside Workflow.start, or in
    # another process): a small pool of our own, for this nested run only
    pool = ThreadPoolExecutor(4, thread_name_prefix="taskflow-conductor-nested")
    try:
        return TaskScheduling.start(nodes, executor=pool, timeout=nested_timeout(ctx),
                                    context=child)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # abandoned tasks end on their own


def run_nested(ctx: TaskContext, nodes: list[SchedulingNode[Any, Any]],
               workflow_input: dict[str, Any], key: str, chain: tuple[Any, ...] | None = None
               ) -> tuple[FlowResult, dict[str, Any]]:
    """Run ``nodes`` as a workflow of its own (input ``workflow_input``, record ``key``; a
    sub-workflow's ``chain`` of enclosing workflows, itself last) on the enclosing run's
    executor; its FlowResult and its record (tasks, variables, meta)."""
    child = TaskContext()
    if chain is not None:
        child[state.CHAIN_KEY] = chain
    child[state.INPUT_KEY] = workflow_input
    child[state.WORKFLOW_ID_KEY] = key
    state.seed(child, key, {})
    result = _nested(ctx, nodes, child)
    return result, state.snapshot(child)


def _keep_last(keep: Any) -> int | None:
    """``keepLastN``: a positive int keeps that many iterations' outputs; else all are
    kept."""
    return keep if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0 else None


class DoWhileTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``DO_WHILE``: see the module docstring."""

    draw_as: ClassVar[str | None] = "task"
    body: list[SchedulingNode[Any, Any]]  # the loopOver graph's nodes
    body_refs: tuple[str, ...]  # every task of the body (nested ones included), in order
    condition: str | None
    evaluator: str  # "javascript" or "value-param"
    body_optional: frozenset[str]  # the body's optional tasks
    items: Any  # the compiled ``items`` expression (list iteration), or None

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        """Run the body once per iteration until the condition is false, the items are done,
        a TERMINATE inside ends the workflow, or an iteration fails (which fails the loop)."""
        output: dict[str, Any] = {}
        items = self._items(ctx)
        keep_last = _keep_last(task_input.get("keepLastN"))
        iteration = 0
        while True:
            ctx.raise_if_cancelled()  # the enclosing run ended (a failure elsewhere, the budget)
            iteration += 1
            if items is not None and iteration > len(items):
                return output  # every item done (an empty list runs no iteration)
            self._begin(ctx, output, iteration, items)
            child, result = self._run_body(ctx, iteration)
            self._record(ctx, child, output, iteration, keep_last)
            if self._terminated(ctx, child):
                return output
            self._check_iteration(child, result, output, iteration)
            state.put_task(ctx, self.ref, output=dict(output))
            if items is not None and self.condition is None:
                continue
            if not self._again(ctx, output):
                return output

    def _begin(self, ctx: TaskContext, output: dict[str, Any], iteration: int,
               items: list[Any] | None) -> None:
        """Record the iteration (and its item) as the loop's output before the body runs;
        past max_loop_iterations the loop fails."""
        limit = self.limits.max_loop_iterations
        if iteration > limit:
            raise TaskFailedError(
                f"do_while task {self.ref!r}: still looping after max_loop_iterations="
                f"{limit} iterations", output)
        output["iteration"] = iteration
        if items is not None:
            output["loopItem"] = items[iteration - 1]
            output["loopIndex"] = iteration - 1
        state.put_task(ctx, self.ref, output=dict(output), iteration=iteration)

    def _run_body(self, ctx: TaskContext, iteration: int) -> tuple[TaskContext, FlowResult]:
        """Run the body as a nested run seeded with the workflow's records (its own failures
        and terminations starting empty): its context and result."""
        child = TaskContext()
        child[state.INPUT_KEY] = ctx.get(state.INPUT_KEY) or {}
        wid = state.workflow_object(ctx, self.workflow_name, self.workflow_version)
        child[state.WORKFLOW_ID_KEY] = wid["workflowId"]
        record = state.snapshot(ctx)
        record.pop("meta", None)  # the loop's own failures and terminations start empty
        state.seed(child, f"{state.run_key(ctx)}/{self.ref}#{iteration}", record)
        return child, _nested(ctx, self.body, child)

    def _record(self, ctx: TaskContext, child: TaskContext, output: dict[str, Any],
                iteration: int, keep_last: int | None) -> None:
        """Copy the body's task records and variables to the workflow, and its outputs to
        ``output[str(iteration)]`` (keeping the last ``keep_last`` iterations)."""
        records = state.tasks(child)
        done = {r: dict(records[r]) for r in self.body_refs if r in records}
        state.put_tasks(ctx, done)
        output[str(iteration)] = {r: rec.get("output") or {} for r, rec in done.items()
                                  if "output" in rec}
        if keep_last is not None:
            output.pop(str(iteration - keep_last), None)
        child_vars = state.variables(child)
        if child_vars:
            state.set_variables(ctx, child_vars)

    @staticmethod
    def _terminated(ctx: TaskContext, child: TaskContext) -> bool:
        """A TERMINATE inside the loop ends the whole workflow: record it, cancel the run."""
        meta = state.meta(child)
        if "terminated" not in meta:
            return False
        state.put_meta(ctx, terminated=meta["terminated"])
        ctx.cancel(f"terminated by task {meta['terminated'].get('by')!r}")
        return True

    def _check_iteration(self, child: TaskContext, result: FlowResult, output: dict[str, Any],
                         iteration: int) -> None:
        """An iteration that did not complete fails the loop, naming the task that failed."""
        from taskflow.declare.conductor.workflow import conductor_status

        meta = state.meta(child)
        if conductor_status(result, meta, self.body_optional) != "COMPLETED":
            why = meta.get("reason") or result.cancelled or "failed"
            raise TaskFailedError(
                f"do_while task {self.ref!r}: iteration {iteration} failed: task "
                f"{meta.get('failed_by')!r}: {why}", output)

    def _items(self, ctx: TaskContext) -> list[Any] | None:
        """The list a list-iterating loop (``items``) walks, or None for a counting loop."""
        if self.items is None:
            return None
        items = self.scope(ctx).resolve(self.items)
        if not isinstance(items, list):
            raise TypeError(f"do_while task {self.ref!r}: items must give a list, got "
                            f"{type(items).__name__}")
        return items

    def on_success(self, support: TaskSupport) -> None:
        # in the caller's process: the loop tasks' last outputs, for the tasks after the loop
        # (a loop run in another process recorded them in a copy of the context)
        super().on_success(support)
        value = support.work_result.result
        if isinstance(value, dict):
            last = value.get(str(value.get("iteration")))
            if isinstance(last, dict):
                known = state.tasks(support.context)
                state.put_tasks(support.context, {
                    r: {**(known.get(r) or {}), "output": out, "status": "COMPLETED"}
                    for r, out in last.items()})

    def _again(self, ctx: TaskContext, output: dict[str, Any]) -> bool:
        if self.condition is None:
            return False
        bindings = dict(self.scope(ctx).resolve(self.inputs) or {})
        if self.evaluator == "value-param":
            return truthy(bindings.get(self.condition))
        bindings[self.ref] = output
        records = state.tasks(ctx)
        for r in self.body_refs:
            if r in records:
                bindings[r] = records[r].get("output") or {}
        return truthy(evaluate(self.ref, self.condition, bindings, self.limits,
                               ctx.remaining()))


class SubWorkflowTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``SUB_WORKFLOW``: see the module docstring."""

    draw_as: ClassVar[str | None] = "task"
    sub: Workflow | None  # the sub-workflow; None when it is chosen at run time
    choice: Any  # the compiled [name, version] expressions of a choice at run time
    candidates: Mapping[tuple[str, Any], Workflow]  # what a choice may choose
    refused: Mapping[tuple[str, Any], str]  # what it may choose and cannot run: why

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        from taskflow.declare.conductor.workflow import conductor_status, resolve_output

        sub = self.sub if self.sub is not None else self._chosen(ctx)
        sub_id = self.task_id(ctx)
        chain = self._chain(ctx, sub, task_input)
        result, record = run_nested(ctx, sub.nodes, task_input, sub_id, chain)
        status = conductor_status(result, record.get("meta") or {}, sub._optional)
        terminated = (record.get("meta") or {}).get("terminated")
        if terminated:
            output = dict(terminated.get("output") or {})
        else:
            output = resolve_output(result, record, sub._output_parameters, sub._tail,
                                    task_input, sub.name, sub.version)
        output["subWorkflowId"] = sub_id
        if status != "COMPLETED":
            meta = record.get("meta") or {}
            raise TaskFailedError(
                f"sub_workflow task {self.ref!r}: workflow {sub.name!r} ended {status}"
                + (f": {meta.get('reason')}" if meta.get("reason") else ""), output)
        return output

    def _chosen(self, ctx: TaskContext) -> Workflow:
        """The workflow the task's ``name`` and ``version`` expressions name in this run."""
        name, version = self.scope(ctx).resolve(self.choice)
        if not isinstance(name, str) or not name:
            raise TaskFailedError(f"sub_workflow task {self.ref!r}: subWorkflowParam.name gave "
                                  f"{name!r}, not a workflow name")
        refused = latest([k for k in self.refused if k[0] == name], version, lambda k: k[1])
        key = latest([k for k in self.candidates if k[0] == name], version, lambda k: k[1])
        if refused is not None and (key is None or _newer(refused[1], key[1])):
            raise TaskFailedError(f"sub_workflow task {self.ref!r}: workflow {name!r} version "
                                  f"{refused[1]!r} cannot run in-process: "
                                  f"{self.refused[refused]}")
        if key is None:
            known = sorted({k[0] for k in self.candidates})
            raise TaskFailedError(
                f"sub_workflow task {self.ref!r}: no workflow {name!r}"
                + (f" version {version!r}" if version is not None else "")
                + " was passed to load(workflows=...) (known: "
                + ", ".join(repr(k) for k in known) + ")")
        return self.candidates[key]

    def _chain(self, ctx: TaskContext, sub: Workflow, task_input: dict[str, Any]
               ) -> tuple[Any, ...]:
        """The enclosing workflows plus ``sub``; a workflow of the chain run again with the
        same input (it would nest for ever) or a chain past ``max_workflow_depth`` fails."""
        chain = tuple(ctx.get(state.CHAIN_KEY) or ())
        entry = (sub.name, sub.version, state.fingerprint(task_input))
        path = " -> ".join(repr(e[0]) for e in chain + (entry,))
        if entry in chain:
            raise TaskFailedError(
                f"sub_workflow task {self.ref!r}: workflow {sub.name!r} would run again with "
                f"the input it already runs with ({path}), nesting for ever")
        if len(chain) >= self.limits.max_workflow_depth:
            raise TaskFailedError(
                f"sub_workflow task {self.ref!r}: workflow {sub.name!r} would nest "
                f"{len(chain) + 1} workflows deep ({path}), past max_workflow_depth="
                f"{self.limits.max_workflow_depth}")
        return chain + (entry,)


def compile_do_while(ctx: CompileContext, site: Site) -> Step:
    """``DO_WHILE``: the loop node, its ``loopOver`` tasks compiled as a graph of their own
    (their references stay unique across the whole definition)."""
    ctx.params(site)
    loop_over = site.task.get("loopOver")
    if not isinstance(loop_over, list) or not loop_over:
        raise ctx.fail(f"do_while {site.label} has no loopOver tasks")
    evaluator = _loop_evaluator(ctx, site)
    condition, items = _loop_condition(ctx, site)
    node = ctx.new_node(DoWhileTask, site, body=[], body_refs=(), condition=condition,
                        items=items, body_optional=frozenset(), evaluator=evaluator)
    outer, before = ctx.nodes, set(ctx.where)
    ctx.nodes = {}
    try:
        ctx.sequence(loop_over, f"{site.where}.loopOver", [])
        body = list(ctx.nodes.values())
    finally:
        ctx.nodes = outer
    ctx.nodes[site.ref] = node  # keep definition order: the loop, then what follows
    body_refs = tuple(r for r in ctx.where if r not in before)
    node.__dict__.update(body=body, body_refs=body_refs,
                         body_optional=frozenset(r for r in body_refs if r in ctx.optional))
    return ctx.single(site, node)


def _loop_evaluator(ctx: CompileContext, site: Site) -> str:
    """"value-param" or "javascript" (graaljs read as javascript)."""
    evaluator = site.task.get("evaluatorType") or "javascript"
    if evaluator not in ("javascript", "graaljs", "value-param"):
        raise ctx.fail(f"do_while {site.label}: evaluatorType {evaluator!r} is not "
                       "'javascript', 'graaljs' or 'value-param'")
    return "value-param" if evaluator == "value-param" else "javascript"


def _loop_condition(ctx: CompileContext, site: Site) -> tuple[str | None, Any]:
    """(loopCondition or None, the compiled ``items`` or None); a loop needs a condition
    unless it iterates ``items``, as Conductor checks at registration (an empty condition is
    one: it is false, so the loop runs once, or once per item)."""
    condition = site.task.get("loopCondition")
    if condition is not None and not isinstance(condition, str):
        raise ctx.fail(f"do_while {site.label}: loopCondition must be a string")
    items = None
    if site.task.get("items") is not None:
        items = ctx.compile_inputs(site.task["items"], site.ref, site.where, "items")
    if condition is None and items is None:
        raise ctx.fail(f"do_while {site.label} has no loopCondition (and no items to iterate)")
    return condition or None, items


def compile_sub_workflow(ctx: CompileContext, site: Site) -> Step:
    """``SUB_WORKFLOW``: its definition (embedded, or passed to ``load`` by name) compiled
    through the context's ``compile_workflow``; a workflow may not reach itself."""
    ctx.params(site)
    param = site.task.get("subWorkflowParam")
    if not isinstance(param, Mapping):
        raise ctx.fail(f"sub_workflow {site.label} has no subWorkflowParam")
    if _chosen_at_run_time(param):
        return _compile_choice(ctx, site, param)
    data = _sub_definition(ctx, site, param)
    name = param.get("name")
    sub_name = str(data.get("name") or name or f"{ctx.workflow_name}.{site.ref}")
    if data.get("name"):
        _refuse_cycle(ctx, site, data["name"])
    try:
        sub = ctx.compile_workflow(data, ctx.chain + (sub_name,))
    except FlowDefinitionError as exc:
        raise ctx.fail(f"sub_workflow {site.label}: {exc}") from None
    ctx.warnings.extend(f"sub_workflow {site.ref!r}: {w}" for w in sub.warnings)
    return ctx.single(site, ctx.new_node(SubWorkflowTask, site, sub=sub, choice=None,
                                         candidates={}, refused={}))


def _newer(a: Any, b: Any) -> bool:
    """Version ``a`` above version ``b`` (a version that is not a number is lowest)."""
    def number(v: Any) -> int:
        return v if isinstance(v, int) and not isinstance(v, bool) else -1

    return number(a) > number(b)


def _chosen_at_run_time(param: Mapping[str, Any]) -> bool:
    """A ``name`` or ``version`` that is an expression (and no embedded definition)."""
    if param.get("workflowDefinition") is not None:
        return False
    return any(isinstance(param.get(k), str) and "${" in param[k] for k in ("name", "version"))


def _compile_choice(ctx: CompileContext, site: Site, param: Mapping[str, Any]) -> Step:
    """A SUB_WORKFLOW whose ``name`` or ``version`` is an expression: the expressions compiled
    (and checked like any), every candidate compiled now (see the module docstring)."""
    choice = ctx.compile_inputs([param.get("name"), param.get("version")], site.ref,
                                site.where, "subWorkflowParam")
    library = ctx.library
    if not library.workflows:
        raise ctx.fail(f"sub_workflow {site.label} chooses its workflow when it runs (name "
                       f"{param.get('name')!r}) among the definitions passed to "
                       "load(workflows=...), and none was passed")
    library.compile_candidates(ctx.compile_workflow)
    for (name, version), why in sorted(library.refused.items(), key=repr):
        ctx.warn(f"sub_workflow {site.label} may choose workflow {name!r} version {version!r}, "
                 f"which fails the task if chosen: {why}")
    node = ctx.new_node(SubWorkflowTask, site, sub=None, choice=choice,
                        candidates=library.candidates, refused=library.refused)
    return ctx.single(site, node)


def _sub_definition(ctx: CompileContext, site: Site, param: Mapping[str, Any]
                    ) -> Mapping[str, Any]:
    """The sub-workflow's definition: ``workflowDefinition``, else the one named."""
    data = param.get("workflowDefinition")
    if isinstance(data, str) and "${" in data:
        raise ctx.fail(f"sub_workflow {site.label}: a workflowDefinition chosen at run time is "
                       "not supported in-process; pass the definitions to load()")
    if data is None:
        data = _named_definition(ctx, site, param)
    if not isinstance(data, Mapping):
        raise ctx.fail(f"sub_workflow {site.label}: workflowDefinition must be an object")
    return data


def _named_definition(ctx: CompileContext, site: Site, param: Mapping[str, Any]
                      ) -> Mapping[str, Any]:
    """The definition passed to ``load(workflows=...)`` that ``param`` names."""
    name = param.get("name")
    if not isinstance(name, str) or not name:
        raise ctx.fail(f"sub_workflow {site.label}: subWorkflowParam needs a name or a "
                       "workflowDefinition")
    _refuse_cycle(ctx, site, name)
    data = ctx.library.find(name, param.get("version"))
    if data is None:
        known = sorted({str(w.get("name")) for w in ctx.library.workflows})
        raise ctx.fail(
            f"sub_workflow {site.label}: no definition of workflow {name!r}"
            + (f" version {param.get('version')!r}" if param.get("version") else "")
            + " was passed to load(workflows=...) (known: "
            + (", ".join(repr(k) for k in known) or "none") + ")")
    return data


def _refuse_cycle(ctx: CompileContext, site: Site, name: Any) -> None:
    """A workflow being compiled (one of the chain) may not be reached again."""
    if name in ctx.chain:
        loop = " -> ".join(repr(n) for n in ctx.chain + (name,))
        raise ctx.fail(f"sub_workflow {site.label} reaches workflow {name!r} again ({loop}): "
                       "a workflow may not run itself")
