"""Dispatch order for ready nodes when there are more of them than free workers.

Order: higher ``priority`` first, then the node with the longest remaining path to a sink (the
sum of recent median durations along the heaviest path from the node, itself included), then
first ready first. Starting the critical path early shortens the run; priority lets a request
mark what must not wait.

How the engine uses it (``taskflow.engine.guards``): once per run, ``remaining_paths(sons,
weights)`` with weights from ``node_weights`` over the process's recent medians; the run's ready
queue then orders its nodes by (priority, path, arrival).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from graphlib import TopologicalSorter
from typing import TypeVar

__all__ = ["node_weights", "remaining_paths"]

H = TypeVar("H", bound=Hashable)


def node_weights(nodes: Iterable[H], median: Callable[[H], float | None], *,
                 default: float = 1e-3) -> dict[H, float]:
    """Each node's weight: its recent median duration; unmeasured nodes get the median of the
    measured ones (they count as typical), or ``default`` when none is measured."""
    nodes = list(nodes)
    known = {n: m for n in nodes if (m := median(n)) is not None and m >= 0.0}
    fill = _median(sorted(known.values())) if known else default
    return {n: known.get(n, fill) for n in nodes}


def _median(ordered: list[float]) -> float:
    """``statistics.median`` of a sorted, non-empty list (that module stays off a run's path:
    ``import taskflow`` loads this one)."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def remaining_paths(sons: Mapping[H, Iterable[H]], weights: Mapping[H, float]) -> dict[H, float]:
    """Longest weighted path from each node to a sink, the node's own weight included.

    Args:
        sons: Each node's sons (every node must be a key; sinks map to nothing).
        weights: Each node's weight (missing: 0).

    Raises:
        graphlib.CycleError: The graph has a cycle.
    """
    sons_of = {n: list(s) for n, s in sons.items()}
    # with node -> sons as the "predecessor" map, static_order yields sons before fathers
    order = TopologicalSorter(sons_of).static_order()
    path: dict[H, float] = {}
    for node in order:
        tail = max((path[s] for s in sons_of.get(node, ())), default=0.0)
        path[node] = weights.get(node, 0.0) + tail
    return path
