"""Tasks that act on the workflow itself: SET_VARIABLE, TERMINATE, WAIT and EVENT."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from taskflow import clock
from taskflow.declare.conductor import state
from taskflow.declare.conductor.compiling import CompileContext, Site, Step
from taskflow.declare.conductor.tasks.base import TaskMixin, pause
from taskflow.model.context import TaskContext, TaskSupport
from taskflow.model.node import SchedulingNode

__all__ = ["EventTask", "SetVariableTask", "TerminateTask", "WaitTask", "compile_event",
           "compile_set_variable", "compile_terminate", "compile_wait", "parse_duration",
           "until_seconds"]

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


# Conductor's WAIT ``until`` patterns: ``yyyy-MM-dd HH:mm``, ``yyyy-MM-dd HH:mm z`` and
# ``yyyy-MM-dd`` (seconds are accepted too); ``z`` is one of Java's general time zones
_UNTIL = re.compile(r"(\d{4}-\d{2}-\d{2})(?:[ T](\d{1,2}):(\d{2})(?::(\d{2}))?)?(?:\s*(\S.*))?")
# ``GMT+04:00``, ``GMT-4``, ``UTC+0530``, ``+0400``, ``-04:00``
_OFFSET = re.compile(r"(?:GMT|UTC)?([+-])(\d{1,2})(?::?(\d{2}))?")
_UNTIL_EXAMPLE = ("'2024-04-30 15:20', '2024-04-30 15:20 GMT+04:00', '2024-04-30 15:20 UTC', "
                  "'2024-04-30 15:20 +0400', '2024-04-30 15:20 Europe/Paris' or '2024-04-30'")


def _zone(text: str) -> tzinfo:
    """A Java general time zone as a tzinfo: ``GMT``/``UTC``/``Z``, an offset (``GMT+04:00``,
    ``+0400``) or a zone name (``Europe/Paris``, ``EST``)."""
    if text.upper() in ("GMT", "UTC", "Z", "UT"):
        return timezone.utc
    offset = _OFFSET.fullmatch(text)
    if offset is not None:
        sign, hours, minutes = offset.groups()
        delta = timedelta(hours=int(hours), minutes=int(minutes or 0))
        if delta >= timedelta(hours=24):
            raise ValueError(f"time zone offset {text!r} is out of range")
        return timezone(-delta if sign == "-" else delta)
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {text!r}") from None


def until_seconds(text: str, now: datetime | None = None) -> float:
    """Seconds from ``now`` to Conductor's WAIT ``until`` time (0 when it has passed). A time
    without a zone is UTC.

    Raises:
        ValueError: not one of Conductor's patterns, or an unknown time zone.
    """
    match = _UNTIL.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a time such as {_UNTIL_EXAMPLE}")
    day, hour, minute, second, zone = match.groups()
    try:
        when = datetime.strptime(day, "%Y-%m-%d").replace(
            hour=int(hour or 0), minute=int(minute or 0), second=int(second or 0),
            tzinfo=_zone(zone.strip()) if zone else timezone.utc)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a time such as {_UNTIL_EXAMPLE}: {exc}") from None
    now = now or datetime.fromtimestamp(clock.wall(), timezone.utc)
    return max(0.0, (when - now).total_seconds())


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
            seconds = until_seconds(until)
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
    """``TERMINATE``: a literal ``terminationStatus`` is one of TERMINATION_STATUSES; it may not
    be optional (as Conductor checks at registration: ending the workflow is not skippable)."""
    if site.optional:
        raise ctx.fail(f"terminate {site.label} is optional; a TERMINATE task cannot be")
    status = ctx.params(site).get("terminationStatus")
    if isinstance(status, str) and "${" not in status and status not in TERMINATION_STATUSES:
        raise ctx.fail(f"terminate {site.label}: terminationStatus {status!r} is not one of "
                       + ", ".join(TERMINATION_STATUSES))
    return ctx.single(site, ctx.new_node(TerminateTask, site))


def compile_wait(ctx: CompileContext, site: Site) -> Step:
    """``WAIT``: ``duration`` or ``until``, not both (as Conductor checks at registration); a
    literal value parses (one without either was refused before compiling)."""
    params = ctx.params(site)
    if "duration" in params and "until" in params:
        raise ctx.fail(f"wait {site.label} has both duration and until; give only one")
    for field, parse in (("duration", parse_duration), ("until", until_seconds)):
        value = params.get(field)
        if isinstance(value, str) and "${" not in value:
            try:
                parse(value)
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
