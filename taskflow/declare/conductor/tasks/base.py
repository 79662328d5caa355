"""What every node compiled from a Conductor task shares: its input, output, retries, failure.

Inputs are resolved by the node's ``on_begin`` hook and outputs recorded by ``on_success`` /
``on_fail`` in the run's context (``taskflow.declare.conductor.state``). On executors that run tasks
in other processes those hooks run in the caller's process, before the context snapshot that
travels with the task is taken, so expressions may read any earlier task, not only the fathers.

A required task that fails fails the workflow, as in Conductor: its ``on_fail`` records it and
cancels the run (``ctx.cancel``), so no other branch starts anything afterwards.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from loguru import logger

from taskflow import clock
from taskflow.declare.conductor import state
from taskflow.declare.conductor.boundaries import Limits
from taskflow.declare.conductor.expressions import Scope
from taskflow.errors import ResultNotAvailableError, TaskflowError, UpstreamFailedError
from taskflow.kinds.fanout import FanInResult
from taskflow.model.context import TaskContext, TaskSupport
from taskflow.model.result import ResultState

__all__ = ["TaskFailedError", "TaskMixin", "as_output", "copy_value", "failure_output", "pause"]


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


def copy_value(value: Any) -> Any:
    """A deep copy, so that a callable mutating its input cannot change another task's output."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an uncopyable value is passed as it is
        return value


def as_output(value: Any) -> dict[str, Any]:
    """A callable's return value as a Conductor task output (a dict)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    return {"result": value}


def failure_output(exc: BaseException | None) -> dict[str, Any]:
    """The output a failed task leaves (its [`TaskFailedError`][taskflow.declare.conductor.tasks.base.TaskFailedError] output, else ``{}``)."""
    if isinstance(exc, TaskFailedError):
        return dict(exc.output)
    return {}


_STATUS = {ResultState.EXCEPTION: "FAILED", ResultState.TIMEOUT: "TIMED_OUT",
           ResultState.CANCELLED: "CANCELED"}


class TaskMixin:
    """Input, output and failure handling of a node compiled from a Conductor task.

    Subclasses implement ``execute``; ``task`` resolves the input and applies the task
    definition's FIXED/LINEAR_BACKOFF retries (EXPONENTIAL_BACKOFF is the engine's own).
    """

    # set by the compiler (through __dict__)
    ref: str
    task_type: str
    inputs: Any  # compiled inputParameters
    workflow_name: str
    workflow_version: Any
    optional_task: bool
    limits: Limits
    retry_delays: tuple[float, ...]  # in-task retries (FIXED, LINEAR_BACKOFF): the delays
    alert_after: float | None  # timeoutPolicy ALERT_ONLY: log when an attempt runs longer

    def scope(self, ctx: TaskContext, task_id: str | None = None) -> Scope:
        """What this task's expressions read in the run of ``ctx`` (``${CPEWF_TASK_ID}`` is
        ``task_id``, by default this attempt's)."""
        records = state.tasks(ctx)

        def task_of(ref: str) -> Any:
            rec = records.get(ref)
            try:
                value = ctx.result_of(ref)
            except (ResultNotAvailableError, KeyError):
                return rec
            out = dict(rec or {})
            out["output"] = {} if isinstance(value, FanInResult) else value
            return out

        return Scope(state.workflow_object(ctx, self.workflow_name, self.workflow_version),
                     task_of, task_id if task_id is not None else self.task_id(ctx))

    def task_id(self, ctx: TaskContext, retry: int | None = None) -> str:
        """This task's id in the run (``${CPEWF_TASK_ID}``, ``${ref.taskId}``): that of retry
        ``retry`` (0: the first attempt), by default of the attempt running. As in Conductor,
        every retry is a task of its own, with an id of its own."""
        if retry is None:
            rec = state.tasks(ctx).get(self.ref) or {}
            retry = rec.get("retryCount") or 0
        base = f"{state.run_key(ctx)}/{self.ref}"
        return base if not retry else f"{base}/retry-{retry}"

    def resolve_input(self, ctx: TaskContext, retry: int = 0) -> dict[str, Any]:
        """Resolve ``inputParameters`` for retry ``retry`` (0: the first attempt) with that
        attempt's task id, and record them (``${ref.input...}``, ``node.input``): Conductor
        resolves a retry's input again, so ``${CPEWF_TASK_ID}`` and anything that changed
        since (a variable, an earlier task) are read anew."""
        task_id = self.task_id(ctx, retry)
        value = copy_value(self.scope(ctx, task_id).resolve(self.inputs))
        resolved: dict[str, Any] = value if isinstance(value, dict) else {}
        state.put_task(ctx, self.ref, input=resolved, taskId=task_id, retryCount=retry,
                       taskType=self.task_type, referenceTaskName=self.ref,
                       status="IN_PROGRESS")
        self.__dict__["input"] = resolved  # on this run's copy: result[ref].input
        return resolved

    def get_input(self, ctx: TaskContext) -> dict[str, Any]:
        """The input ``on_begin`` resolved for this attempt (resolved now if it did not)."""
        rec = state.tasks(ctx).get(self.ref)
        if rec is not None and "input" in rec and rec.get("status") == "IN_PROGRESS":
            return copy_value(rec["input"])  # type: ignore[no-any-return]
        return self.resolve_input(ctx)

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> Any:
        """The task's work; returns its output."""
        raise NotImplementedError

    def task(self, ctx: TaskContext, param: Any) -> Any:
        task_input = self.get_input(ctx)
        delays = self.retry_delays
        first = (state.tasks(ctx).get(self.ref) or {}).get("retryCount") or 0
        attempt = 0
        while True:
            try:
                return self.execute(ctx, copy_value(task_input))
            except Exception:
                if attempt >= len(delays):
                    raise
                delay = delays[attempt]
                if delay > ctx.remaining() or ctx.cancelled:
                    raise  # the next try would not fit the run's budget
                logger.debug("conductor task {!r}: retry {} in {} s", self.ref, attempt + 1,
                             delay)
                if delay > 0:
                    pause(ctx, delay)
                if ctx.cancelled:
                    raise
                attempt += 1
                task_input = self.resolve_input(ctx, first + attempt)  # a new task, as retried

    # -- hooks (in the caller's process on executors that run tasks elsewhere) --

    def on_begin(self, support: TaskSupport) -> None:
        # once per attempt of the engine's retries (support.attempt counts from 1)
        self.resolve_input(support.context, support.attempt - 1)

    def on_success(self, support: TaskSupport) -> None:
        value = support.work_result.result
        output = {} if isinstance(value, FanInResult) else value
        state.put_task(support.context, self.ref, output=output, status="COMPLETED")
        alert = self.alert_after
        duration = support.work_result.duration
        if alert is not None and duration is not None and duration > alert:
            logger.warning("conductor task {!r} ran {:.3f} s, over its timeoutSeconds {} "
                           "(timeoutPolicy ALERT_ONLY)", self.ref, duration, alert)

    def on_fail(self, support: TaskSupport) -> None:
        wr = support.work_result
        ctx = support.context
        status = _STATUS.get(wr.state, "FAILED")
        state.put_task(ctx, self.ref, output=failure_output(wr.exception), status=status)
        if wr.state in (ResultState.EXCEPTION, ResultState.TIMEOUT) and not self.optional_task:
            # Conductor fails the workflow at the first required failure and cancels the rest;
            # a task failed fast after its father's failure leaves the father as the culprit
            if not isinstance(wr.exception, UpstreamFailedError):
                state.claim_meta(ctx, "failed_by", failed_by=self.ref, failed_status=status,
                                 reason=f"{type(wr.exception).__name__}: {wr.exception}")
            ctx.cancel(f"conductor task {self.ref!r} {status.lower()}")


def pause(ctx: TaskContext, seconds: float) -> None:
    """Wait ``seconds`` (a retry delay, a WAIT task), waking early when the run is cancelled.

    The waiting thread is a worker of the run's executor: it is held for the wait.
    """
    deadline = clock.now() + seconds
    tick = threading.Event()
    while not ctx.cancelled:
        left = deadline - clock.now()
        if left <= 0:
            return
        clock.wait(tick, min(left, 0.05))
