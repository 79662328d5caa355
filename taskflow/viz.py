"""Pictures of runs: a Mermaid Gantt chart (``FlowResult.to_mermaid``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from taskflow.result import ResultState

if TYPE_CHECKING:
    from taskflow.result import FlowResult

__all__ = ["run_to_mermaid"]

# Mermaid gantt task tags: done (grey), active (light), crit (red)
_TAGS = {
    ResultState.SUCCESS: "done",
    ResultState.EXCEPTION: "crit",
    ResultState.TIMEOUT: "crit",
    ResultState.CANCELLED: "active",
    ResultState.SKIPPED: "active",
    ResultState.DEFAULT: "active",
}


def _label(name: str) -> str:
    # ':' and '#' end a gantt task name; keep the rest readable
    return name.replace(":", "_").replace("#", "_").replace(";", "_")


def run_to_mermaid(result: FlowResult) -> str:
    """A Mermaid ``gantt`` of one run: a bar per node from start to end, in milliseconds since
    the run started; nodes that never started are listed as zero-length milestones."""
    t0 = result.started_at
    end_of_run = t0 + result.elapsed
    lines = [
        "gantt",
        f"    title flow {result.flow_id} ({'ok' if result.ok else 'failed'}, {result.elapsed * 1000:.1f} ms)",
        "    dateFormat x",
        "    axisFormat %S.%L s",
    ]
    for name in result:
        wr = result.result_of(name)
        tag = _TAGS[wr.state]
        label = f"{_label(name)} {wr.state.name}"
        if wr.started_at is None:
            at = int(round(((wr.finished_at or end_of_run) - t0) * 1000))
            lines.append(f"    {label} : milestone, {tag}, {at}, 0ms")
            continue
        start = int(round((wr.started_at - t0) * 1000))
        finish = wr.finished_at if wr.finished_at is not None else end_of_run
        length = max(1, int(round((finish - wr.started_at) * 1000)))
        lines.append(f"    {label} : {tag}, {start}, {length}ms")
    return "\n".join(lines) + "\n"
