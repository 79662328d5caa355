"""The pydantic report models of a run (``FlowResult.report()``), imported on first use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["FlowReport", "NodeReport", "run_gantt", "short"]


class NodeReport(BaseModel):
    """One node of a run, JSON-ready. Times are seconds since the run started."""

    model_config = ConfigDict(frozen=True)

    name: str
    state: str
    node_state: str
    attempts: int
    queued_at: float | None
    started_at: float | None
    finished_at: float | None
    duration: float | None
    thread: str | None
    fathers: list[str]
    result: str | None
    error_type: str | None
    error: str | None
    cause: str | None


class FlowReport(BaseModel):
    """One run, JSON-ready (``model_dump_json()``)."""

    model_config = ConfigDict(frozen=True)

    flow_id: str
    ok: bool
    status: str = "COMPLETED"
    elapsed: float
    timeout: float | None
    cancelled: str | None
    counts: dict[str, int]
    nodes: list[NodeReport]


def short(value: Any, limit: int = 200) -> str | None:
    """``repr(value)``, cut to ``limit`` characters (None stays None)."""
    if value is None:
        return None
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."




# Mermaid gantt task tags by state name: done (grey), active (light), crit (red)
_TAGS = {
    "SUCCESS": "done",
    "DEGRADED": "done",
    "EXCEPTION": "crit",
    "TIMEOUT": "crit",
    "CANCELLED": "active",
    "SKIPPED": "active",
    "DEFAULT": "active",
}


def _label(name: str) -> str:
    # ':' and '#' end a gantt task name; keep the rest readable
    return name.replace(":", "_").replace("#", "_").replace(";", "_")


def run_gantt(result: Any) -> str:
    """A Mermaid ``gantt`` of one run (``FlowResult.to_mermaid``): a bar per node from start to
    end, in milliseconds since the run started; nodes that never started are listed as
    zero-length milestones."""
    t0 = result.started_at
    end_of_run = t0 + result.elapsed
    lines = [
        "gantt",
        (f"    title flow {result.flow_id} ({'ok' if result.ok else 'failed'}, "
         f"{result.elapsed * 1000:.1f} ms)"),
        "    dateFormat x",
        "    axisFormat %S.%L s",
    ]
    for name in result:
        wr = result.result_of(name)
        state = wr.state.name
        tag = _TAGS[state]
        label = f"{_label(name)} {state}"
        if wr.started_at is None:
            at = round(((wr.finished_at or end_of_run) - t0) * 1000)
            lines.append(f"    {label} : milestone, {tag}, {at}, 0ms")
            continue
        start = round((wr.started_at - t0) * 1000)
        finish = wr.finished_at if wr.finished_at is not None else end_of_run
        length = max(1, round((finish - wr.started_at) * 1000))
        lines.append(f"    {label} : {tag}, {start}, {length}ms")
    return "\n".join(lines) + "\n"
