"""Dispatch order in a run of a plan with resilience options: each node's rank, and which ready
node a loop starts next.

When more nodes are ready than workers are free, higher ``priority`` goes first, then the node
with the longest remaining path to a sink (weighted by each node's typical duration so far).
``rank`` is computed once per run (``Run.begin``); ``pop_best`` runs under the run's lock (the
economy's ``next_node``) and calls nothing.
"""

from __future__ import annotations

from typing import Any

from taskflow.model.graph import Plan
from taskflow.resilience.dispatch import node_weights, remaining_paths

__all__ = ["pop_best", "rank"]


def rank(plan: Plan) -> list[tuple[float, float]]:
    """Each node's dispatch rank in a run of a plan with resilience options: (``priority``,
    longest remaining path to a sink), the path weighted by each node's typical duration so
    far (``plan.est``; an unmeasured node counts as the median of the measured ones)."""
    est = plan.est
    n = len(plan.nodes)
    weights = node_weights(range(n), lambda i: est[i] if est[i] >= 0.0 else None)
    paths = remaining_paths(dict(enumerate(plan.sons)), weights)
    return [(0.0 if p is None else p.priority, paths[i]) for i, p in enumerate(plan.policy)]


def pop_best(ready: Any, ranks: list[tuple[float, float]]) -> int:
    """Under the run's lock: remove and return the ready node to start first (highest rank,
    then the earliest queued)."""
    if len(ready) == 1:
        return int(ready.popleft())
    best = 0
    top = ranks[ready[0]]
    for k in range(1, len(ready)):
        r = ranks[ready[k]]
        if r > top:
            best, top = k, r
    i = int(ready[best])
    del ready[best]
    return i
