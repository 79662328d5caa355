"""Tasks that act on the workflow itself: SET_VARIABLE, TERMINATE, WAIT and EVENT."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, ClassVar

from taskflow.declare.conductor import state
from taskflow.declare.conductor.compiling import CompileContext, Site, Step
from taskflow.declare.conductor.tasks.base import TaskMixin, pause
from taskflow.model.context import TaskContext, TaskSupport
from taskflow.model.node import SchedulingNode

__all__ = ["EventTask", "SetVariableTask", "TerminateTask", "WaitTask", "compile_event",
           "compile_set_variable", "compile_terminate", "compile_wait", "parse_duration"]

TERMINATION_STATUSES = ("COMPLETED", "FAILED", "TERMINATED")


class SetVariableTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``SET_VARIABLE``: merges its input into ``${workflow.variables}``; empty output."""

    draw_as: ClassVar[str | None] = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        state.set_variables(ctx, task_input)
        return {}

    def on_success(self, support: TaskSupport) -> None:
        # again in the caller's process: a task run in another process wrote to a copy
        super().on_success(support)
        rec = state.tasks(support.context).get(self.ref) or {}
        state.set_variables(support.context, rec.get("input") or {})


class TerminateTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``TERMINATE``: ends the workflow with ``terminationStatus`` (``COMPLETED``, ``FAILED``
    or ``TERMINATED``), ``terminationReason`` and ``workflowOutput`` as the workflow's output.

    Every other task still running is cancelled (``ctx.cancel``); ``Workflow.status`` reports
    the termination status and ``Workflow.output`` the workflow output. Output:
    ``{"output": workflowOutput}``.
    """

    draw_as: ClassVar[str | None] = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        status = task_input.get("terminationStatus")
        if status not in TERMINATION_STATUSES:
            raise ValueError(f"terminate task {self.ref!r}: terminationStatus must be one of "
                             f"{', '.join(TERMINATION_STATUSES)}, got {status!r}")
        output = task_input.get("workflowOutput")
        if output is not None and not isinstance(output, Mapping):
            output = {"output": output}
        self._terminate(ctx, status, task_input.get("terminationReason"), dict(output or {}))
        return {"output": dict(output or {})}

    def _terminate(self, ctx: TaskContext, status: str, reason: Any,
                   output: dict[str, Any]) -> None:
        state.claim_meta(ctx, "terminated", terminated={"status": status, "reason": reason,
                                                        "output": output, "by": self.ref})
        ctx.cancel(f"terminated by task {self.ref!r} with status {status}"
                   + (f": {reason}" if reason else ""))

    def on_success(self, support: TaskSupport) -> None:
        # again in the caller's process: in another process ctx.cancel has no effect
        super().on_success(support)
        rec = state.tasks(support.context).get(self.ref) or {}
        task_input = rec.get("input") or {}
        value = support.work_result.result
        output = value.get("output") if isinstance(value, Mapping) else None
        self._terminate(support.context, str(task_input.get("terminationStatus")),
                        task_input.get("terminationReason"), dict(output or {}))


_UNITS = {"d": 86400.0, "day": 86400.0, "days": 86400.0, "h": 3600.0, "hr": 3600.0,
          "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0, "m": 60.0, "min": 60.0,
          "mins": 60.0, "minute": 60.0, "minutes": 60.0, "s": 1.0, "sec": 1.0, "secs": 1.0,
          "second": 1.0, "seconds": 1.0, "ms": 0.001}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


def parse_duration(text: str) -> float:
    """Conductor's WAIT duration (``"30s"``, ``"1h 30m"``, ``"2 days 3 hours"``) in seconds.

    Raises:
        ValueError: not a duration.
    """
    pos, total, parts = 0, 0.0, 0
    text = text.strip()
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{text!r} is not a duration such as '30s' or '1h 30m'")
        total += float(m.group(1)) * _UNITS[m.group(2).lower()]
        pos = m.end()
        parts += 1
    if not parts:
        raise ValueError(f"{text!r} is not a duration such as '30s' or '1h 30m'")
    return total


_UNTIL_FORMATS = ("%Y-%m-%d %H:%M %z", "%Y-%m-%d %H:%M:%S %z", "%Y-%m-%d %H:%M",
                  "%Y-%m-%d %H:%M:%S", "%Y-%m-%d")


def _until_seconds(text: str) -> float:
    for fmt in _UNTIL_FORMATS:
        try:
            when = datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    raise ValueError(f"{text!r} is not a time such as '2024-01-31 09:30 +0000'")


class WaitTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``WAIT`` with ``duration`` or ``until``: waits in a worker, within the run's budget.

    A wait longer than what remains of the budget times out with the run. A WAIT with neither
    field waits for an external signal and needs a Conductor server: it is refused at load.
    """

    draw_as: ClassVar[str | None] = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        duration, until = task_input.get("duration"), task_input.get("until")
        if isinstance(duration, str) and duration.strip():
            seconds = parse_duration(duration)
        elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
            seconds = float(duration)
        elif isinstance(until, str) and until.strip():
            seconds = _until_seconds(until)
        else:
            raise ValueError(f"wait task {self.ref!r}: needs a duration or an until time, got "
                             f"duration={duration!r} until={until!r}")
        pause(ctx, seconds)
        ctx.raise_if_cancelled()
        return {}


class EventTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``EVENT``: hands ``sink`` and the task input to the ``event_sink`` given to ``load``.

    Output: ``{"event_produced": sink, "sink": sink, "workflowType", "workflowVersion",
    "workflowInstanceId"}`` plus whatever mapping the sink returns.
    """

    draw_as: ClassVar[str | None] = "task"
    sink: str

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        fn = self.limits.event_sink
        if fn is None:
            raise LookupError(f"event task {self.ref!r}: no event_sink was given to load()")
        wf = state.workflow_object(ctx, self.workflow_name, self.workflow_version)
        out: dict[str, Any] = {"event_produced": self.sink, "sink": self.sink,
                               "workflowType": self.workflow_name,
                               "workflowVersion": self.workflow_version,
                               "workflowInstanceId": wf["workflowId"]}
        extra = fn(self.sink, task_input)
        if isinstance(extra, Mapping):
            out.update(extra)
        return out


def compile_set_variable(ctx: CompileContext, site: Site) -> Step:
    """``SET_VARIABLE``."""
    ctx.params(site)
    return ctx.single(site, ctx.new_node(SetVariableTask, site))


def compile_terminate(ctx: CompileContext, site: Site) -> Step:
    """``TERMINATE``: a literal ``terminationStatus`` is one of TERMINATION_STATUSES."""
    status = ctx.params(site).get("terminationStatus")
    if isinstance(status, str) and "${" not in status and status not in TERMINATION_STATUSES:
        raise ctx.fail(f"terminate {site.label}: terminationStatus {status!r} is not one of "
                       + ", ".join(TERMINATION_STATUSES))
    return ctx.single(site, ctx.new_node(TerminateTask, site))


def compile_wait(ctx: CompileContext, site: Site) -> Step:
    """``WAIT``: a literal ``duration`` parses (one without a duration or until was refused
    before compiling)."""
    duration = ctx.params(site).get("duration")
    if isinstance(duration, str) and "${" not in duration:
        try:
            parse_duration(duration)
        except ValueError as exc:
            raise ctx.fail(f"wait {site.label}: {exc}") from None
    return ctx.single(site, ctx.new_node(WaitTask, site))


def compile_event(ctx: CompileContext, site: Site) -> Step:
    """``EVENT``: it names its ``sink``."""
    ctx.params(site)
    sink = site.task.get("sink")
    if not isinstance(sink, str) or not sink:
        raise ctx.fail(f"event {site.label} has no sink")
    return ctx.single(site, ctx.new_node(EventTask, site, sink=sink))
