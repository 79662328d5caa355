"""Deadlines from the run's start (a node's ``deadline=``, a ``Section``'s): the numbers the
other clocks of the engine read.

``plan.deadline[i]`` is node ``i``'s deadline in seconds from the run's start (``run.t0``), or
None. ``arm(run)`` (``Run.begin``, under the run's lock, once the roots are queued) schedules, for each such node
whose deadline comes before the run's, one timer entry in ``run.node_timers[i]`` that ends the
node the way its own timeout does (``deadlines.node_timeout``), whether it is still WAITING
for its fathers, queued, parked, backing off or running. When the node starts, its own
timeout replaces that entry only if it comes first (``deadlines.arm_node_timeout``). Every
limit an attempt is held to — ``ctx.timeout()``, the clamped HTTP clients, a batch's call, a
remote task's time, a retry's back-off — is capped by ``limit(plan, i, t0, other)``.

A leaf of the engine: it reads the plan and the errors, and owns no state.
"""

from __future__ import annotations

from typing import Any

from taskflow.engine import timer
from taskflow.errors import NodeTimeoutError
from taskflow.model.graph import Plan

__all__ = ["arm", "limit", "passed", "timeout_error"]


def arm(run: Any, fire: Any) -> None:
    """Under the run's lock, once, as the run begins: schedule ``fire(run, i)`` at the
    deadline of each node that has one (before the run's own deadline). (The timer thread
    never holds its lock while it calls back, so scheduling under the run's is safe.)"""
    plan: Plan = run.plan
    t0, end = run.t0, run.deadline
    timers = run.node_timers
    for i, d in enumerate(plan.deadline):
        if d is not None and t0 + d < end:
            timers[i] = timer.schedule(t0 + d, fire, run, i)


def limit(plan: Plan, i: int, t0: float, other: float) -> float:
    """``other`` (a monotonic time) capped by node ``i``'s deadline from ``t0``."""
    d = plan.deadline[i]
    return other if d is None or t0 + d >= other else t0 + d


def passed(plan: Plan, i: int, t0: float, now: float) -> bool:
    """Whether node ``i``'s deadline from the run's start has passed at ``now``."""
    d = plan.deadline[i]
    return d is not None and now >= t0 + d


def timeout_error(plan: Plan, i: int, t0: float, now: float) -> NodeTimeoutError:
    """The error of node ``i`` ending at ``now`` for want of time: its deadline's when that has
    passed, else its own timeout's."""
    if passed(plan, i, t0, now):
        return NodeTimeoutError(plan.names[i], plan.deadline[i], deadline=True,
                                section=plan.section[i])
    return NodeTimeoutError(plan.names[i], plan.timeout[i])
