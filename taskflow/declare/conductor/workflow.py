"""A loaded Conductor workflow ([`Workflow`][taskflow.declare.conductor.workflow.Workflow]) and one run of it ([`WorkflowRun`][taskflow.declare.conductor.workflow.WorkflowRun])."""

from __future__ import annotations

import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

from loguru import logger

from taskflow.declare.conductor import state
from taskflow.declare.conductor.expressions import Scope
from taskflow.declare.conductor.tasks.base import failure_output
from taskflow.errors import FlowDefinitionError
from taskflow.kinds.fanout import FanInResult
from taskflow.model.context import TaskContext
from taskflow.model.node import SchedulingNode
from taskflow.model.result import FlowResult, ResultState
from taskflow.scheduling import TaskScheduling

__all__ = ["Workflow", "WorkflowRun"]

#: TaskContext key: the token under which the run's executor is found by nested runs
EXECUTOR_KEY = "conductor.executor"

_executors: dict[str, Executor] = {}  # guarded by _executors_lock: token -> a running run's pool
_executors_lock = threading.Lock()


def executor_of(ctx: TaskContext) -> Executor | None:
    """The executor of the Conductor run ``ctx`` belongs to (None: unknown, e.g. in a child
    process)."""
    token = ctx.get(EXECUTOR_KEY)
    if not isinstance(token, str):
        return None
    with _executors_lock:
        return _executors.get(token)


class WorkflowRun:
    """One finished run, as Conductor would describe it.

    Attributes:
        result: the taskflow FlowResult (nodes by reference name).
        status: ``COMPLETED``, ``FAILED``, ``TIMED_OUT`` or ``TERMINATED`` (a TERMINATE task
            sets its own ``terminationStatus``).
        output: the workflow output (``outputParameters``, a TERMINATE's ``workflowOutput``,
            or the last task's output).
        variables: the workflow variables at the end (SET_VARIABLE).
        reason: why it did not complete (``reasonForIncompletion``), or None.
        failed_task: the reference name of the required task that failed it, or None.
    """

    __slots__ = ("failed_task", "output", "reason", "result", "status", "variables")

    def __init__(self, result: FlowResult, status: str, output: dict[str, Any],
                 variables: dict[str, Any], reason: str | None, failed_task: str | None) -> None:
        self.result = result
        self.status = status
        self.output = output
        self.variables = variables
        self.reason = reason
        self.failed_task = failed_task

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.status} flow={self.result.flow_id}>"


class Workflow:
    """A loaded Conductor workflow: its nodes and how to run them.

    Attributes:
        name: the definition's ``name``.
        version: its ``version`` (None if absent).
        nodes: every node of the top-level graph, in definition order (usable with
            ``TaskScheduling.start``; put the workflow input in the context under
            [`INPUT_KEY`][taskflow.declare.conductor.INPUT_KEY]).
        warnings: the fields found in the definition that taskflow does not implement.
        timeout: the definition's ``timeoutSeconds`` as a budget (None: no limit).
        alert_after: ``timeoutSeconds`` under ``timeoutPolicy: ALERT_ONLY`` (a run longer than
            this is logged, not stopped), else None.
        definition: the definition as loaded (a dict).
    """

    _RECORDS = 1024  # runs whose record status()/output() can still read

    def __init__(self, name: str, version: Any, definition: dict[str, Any],
                 nodes: dict[str, SchedulingNode[Any, Any]], warnings: list[str],
                 timeout: float | None, tail: list[SchedulingNode[Any, Any]],
                 output_parameters: Any, optional: frozenset[str],
                 has_registry: bool, alert_after: float | None = None) -> None:
        self.name = name
        self.version = version
        self.definition = definition
        self._by_ref = nodes
        self.nodes: list[SchedulingNode[Any, Any]] = list(nodes.values())
        self.warnings = warnings
        self.timeout = timeout
        self.alert_after = alert_after
        self._tail = tail
        self._output_parameters = output_parameters
        self._optional = optional
        self._has_registry = has_registry
        self._records: OrderedDict[str, dict[str, Any]] = OrderedDict()  # guarded by _lock
        self._lock = threading.Lock()

    def __getitem__(self, ref: str) -> SchedulingNode[Any, Any]:
        """The node of task ``ref`` (its ``taskReferenceName``)."""
        return self._by_ref[ref]

    def __contains__(self, ref: object) -> bool:
        return ref in self._by_ref

    def start(self, input: Mapping[str, Any] | None = None, *, executor: Executor,
              timeout: float | None = None, context: TaskContext | None = None,
              correlation_id: str | None = None) -> FlowResult:
        """Run the workflow on ``executor`` and wait for it (``TaskScheduling.start``), under the
        workflow's name: the run's flow name in its report, logs, traces and statistics.

        Args:
            input: the workflow input (``${workflow.input...}``); None is ``{}``.
            executor: any ``concurrent.futures.Executor``; never shut down here. DO_WHILE
                iterations and sub-workflows run as nested runs on it.
            timeout: the run's budget in seconds; None uses the definition's ``timeoutSeconds``
                (none if it has none), ``math.inf`` means no budget. ``start`` returns by then;
                unfinished tasks become TIMEOUT.
            context: the run's TaskContext (a new one if None); the input is stored in it under
                [`INPUT_KEY`][taskflow.declare.conductor.INPUT_KEY].
            correlation_id: ``${workflow.correlationId}``.

        Returns:
            The FlowResult: node name (task reference name) -> node; ``outputs[ref]`` is a
            task's output. A required task's failure or a TERMINATE cancels the rest of the
            run, so its ``status`` is then ``CANCELLED``: [`status`][taskflow.declare.conductor.workflow.Workflow.status] gives Conductor's.

        Raises:
            FlowDefinitionError: the workflow was loaded without a registry.
            TypeError: ``input`` is not a mapping, or a bad executor/context (see ``start``).
        """
        if not self._has_registry:
            raise FlowDefinitionError(
                f"workflow {self.name!r} was loaded without a registry; "
                "pass one to taskflow.declare.conductor.load() to run it"
            )
        if input is not None and not isinstance(input, Mapping):
            raise TypeError(f"workflow input must be a mapping, got {type(input).__name__}")
        ctx = context if context is not None else TaskContext()
        if not isinstance(ctx, TaskContext):
            raise TypeError(f"context must be a taskflow.TaskContext or None, got {type(ctx).__name__}")
        ctx[state.INPUT_KEY] = dict(input or {})
        if correlation_id is not None:
            ctx[state.CORRELATION_KEY] = correlation_id
        ctx[state.CHAIN_KEY] = ((self.name, self.version, state.fingerprint(ctx[state.INPUT_KEY])),)
        token = uuid.uuid4().hex
        ctx[EXECUTOR_KEY] = token
        budget = self.timeout if timeout is None else timeout
        with _executors_lock:
            _executors[token] = executor
        try:
            result = TaskScheduling.start(self.nodes, executor=executor, timeout=budget,
                                          context=ctx, name=self.name or None)
        finally:
            with _executors_lock:
                _executors.pop(token, None)
        record = state.snapshot(ctx)
        record["input"] = dict(input or {})
        with self._lock:
            self._records[str(result.flow_id)] = record
            while len(self._records) > self._RECORDS:
                self._records.popitem(last=False)
        if self.alert_after is not None and result.elapsed > self.alert_after:
            logger.warning("conductor workflow {!r} ran {:.3f} s, over its timeoutSeconds {} "
                           "(timeoutPolicy ALERT_ONLY)", self.name, result.elapsed,
                           self.alert_after)
        return result

    def run(self, input: Mapping[str, Any] | None = None, *, executor: Executor,
            timeout: float | None = None, context: TaskContext | None = None,
            correlation_id: str | None = None) -> WorkflowRun:
        """[`start`][taskflow.declare.conductor.workflow.Workflow.start], described as Conductor would (status, output, variables)."""
        result = self.start(input, executor=executor, timeout=timeout, context=context,
                            correlation_id=correlation_id)
        record = self._record(result)
        meta = record.get("meta") or {}
        status = self.status(result)
        reason = None
        if "terminated" in meta:
            reason = meta["terminated"].get("reason")
        elif status != "COMPLETED":
            reason = meta.get("reason") or result.cancelled or _first_error(result, self._optional)
        return WorkflowRun(result, status, self.output(result, input),
                           dict(record.get("variables") or {}), reason, meta.get("failed_by"))

    def _record(self, result: FlowResult) -> dict[str, Any]:
        with self._lock:
            return self._records.get(str(result.flow_id)) or {}

    def status(self, result: FlowResult) -> str:
        """The run's Conductor status: ``COMPLETED`` (failures of optional tasks only),
        ``FAILED``, ``TIMED_OUT``, ``TERMINATED`` (``ctx.cancel``), or a TERMINATE task's
        ``terminationStatus``."""
        return conductor_status(result, self._record(result).get("meta") or {}, self._optional)

    def output(self, result: FlowResult, input: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The workflow's output for a run: a TERMINATE's ``workflowOutput``; else its
        ``outputParameters`` resolved against the run (``input`` is the workflow input the run
        was started with; by default the one [`start`][taskflow.declare.conductor.workflow.Workflow.start] recorded); or without them, as in
        Conductor, the output of the last task that ran."""
        record = self._record(result)
        meta = record.get("meta") or {}
        if "terminated" in meta:
            return dict(meta["terminated"].get("output") or {})
        if input is None:
            input = record.get("input") or {}
        return resolve_output(result, record, self._output_parameters, self._tail,
                              dict(input), self.name, self.version)

    def to_mermaid(self, result: FlowResult | None = None) -> str:
        """A Mermaid flowchart of the workflow (coloured by state for a run ``result``)."""
        from taskflow.observe.viz import definition_to_mermaid

        return definition_to_mermaid(self.nodes, result=result, title=self.name)

    def to_dot(self, result: FlowResult | None = None) -> str:
        """A Graphviz DOT graph of the workflow (coloured by state for a run ``result``)."""
        from taskflow.observe.viz import to_dot

        return to_dot(self.nodes, result=result, title=self.name)

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r} tasks={len(self.nodes)}>"


def _first_error(result: FlowResult, optional: frozenset[str]) -> str | None:
    for name, wr in result.failed.items():
        if name not in optional:
            return f"task {name!r}: {type(wr.exception).__name__}: {wr.exception}"
    return None


def conductor_status(result: FlowResult, meta: Mapping[str, Any], optional: frozenset[str]
                     ) -> str:
    """Conductor's status of a run from its FlowResult and its record's ``meta``."""
    terminated = meta.get("terminated")
    if terminated:
        return str(terminated.get("status"))
    if meta.get("failed_by"):
        return "TIMED_OUT" if meta.get("failed_status") == "TIMED_OUT" else "FAILED"
    if result.cancelled is not None:
        return "TERMINATED"
    failed = {n: wr for n, wr in result.failed.items() if n not in optional}
    if not failed:
        return "COMPLETED"
    if any(wr.state is ResultState.TIMEOUT for wr in failed.values()):
        return "TIMED_OUT"
    return "FAILED"


def resolve_output(result: FlowResult, record: Mapping[str, Any], output_parameters: Any,
                   tail: list[SchedulingNode[Any, Any]], workflow_input: dict[str, Any],
                   name: str, version: Any) -> dict[str, Any]:
    """A run's workflow output (``outputParameters`` resolved, else the last task's output)."""
    records = record.get("tasks") or {}

    def output_of(ref: str) -> Any:
        if ref not in result:
            rec = records.get(ref)  # a task of a DO_WHILE body: its last iteration
            return None if rec is None else rec.get("output")
        wr = result.result_of(ref)
        if wr.state is ResultState.SUCCESS:
            return {} if isinstance(wr.result, FanInResult) else wr.result
        if wr.state in (ResultState.SKIPPED, ResultState.DEFAULT):
            return None
        return failure_output(wr.exception)

    def task_of(ref: str) -> Any:
        rec = dict(records.get(ref) or {})
        if ref in result and "input" not in rec:
            rec["input"] = result[ref].__dict__.get("input")
        rec["output"] = output_of(ref)
        return rec

    if output_parameters is None:
        for node in tail:
            value = output_of(node.name)
            if value is not None and result.result_of(node.name).state is ResultState.SUCCESS:
                return dict(value)
        return {}
    workflow = {"input": workflow_input, "variables": dict(record.get("variables") or {}),
                "workflowId": result.flow_id, "workflowType": name, "version": version,
                "status": "COMPLETED"}
    value = Scope(workflow, task_of).resolve(output_parameters)
    return value if isinstance(value, dict) else {}


def nested_timeout(ctx: TaskContext) -> float | None:
    """A nested run's budget: what remains of the enclosing run's."""
    left = ctx.remaining()
    return None if math.isinf(left) else max(left, 0.0)
