"""Dispatch order for ready nodes when there are more of them than free workers.

Order: higher ``priority`` first, then the node with the longest remaining path to a sink (the
sum of recent median durations along the heaviest path from the node, itself included), then
first ready first. Starting the critical path early shortens the run; priority lets a request
mark what must not wait. ``min_budget`` keeps a node from starting when its run cannot give it
that much time.

How the engine uses it: at plan time ``remaining_paths(sons, weights)`` once per run (weights
from ``node_weights`` over the process's recent medians); when a node becomes ready
``queue.push(node, priority=..., path=paths[node])``; when a worker frees ``queue.pop()``; before
starting a node ``fits_budget(ctx.remaining(), node.min_budget)``.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping
from graphlib import TopologicalSorter
from threading import Lock
from typing import Generic, TypeVar

__all__ = ["ReadyQueue", "fits_budget", "node_weights", "remaining_paths"]

H = TypeVar("H", bound=Hashable)
T = TypeVar("T")


def node_weights(nodes: Iterable[H], median: Callable[[H], float | None], *,
                 default: float = 1e-3) -> dict[H, float]:
    """Each node's weight: its recent median duration; unmeasured nodes get the median of the
    measured ones (they count as typical), or ``default`` when none is measured."""
    nodes = list(nodes)
    known = {n: m for n in nodes if (m := median(n)) is not None and m >= 0.0}
    fill = statistics.median(known.values()) if known else default
    return {n: known.get(n, fill) for n in nodes}


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


def fits_budget(remaining: float, min_budget: float | None) -> bool:
    """Whether a node with ``min_budget`` may start with ``remaining`` seconds of budget left."""
    return min_budget is None or remaining >= min_budget


class ReadyQueue(Generic[T]):
    """Ready items, popped by (priority desc, path desc, arrival). Thread-safe."""

    def __init__(self) -> None:
        self._lock = Lock()  # guards _heap
        self._heap: list[tuple[float, float, int, T]] = []
        self._seq = itertools.count()

    def push(self, item: T, *, priority: float = 0, path: float = 0.0) -> None:
        with self._lock:
            heapq.heappush(self._heap, (-priority, -path, next(self._seq), item))

    def pop(self) -> T | None:
        """The next item to start, or None when empty."""
        with self._lock:
            return heapq.heappop(self._heap)[3] if self._heap else None

    def remove_if(self, drop: Callable[[T], bool]) -> list[T]:
        """Remove and return the items for which ``drop`` is true (e.g. a finished run's).

        ``drop`` runs outside the queue's lock, on a snapshot; an item popped meanwhile is not
        returned.
        """
        with self._lock:
            snapshot = list(self._heap)
        doomed = {id(e) for e in snapshot if drop(e[3])}
        if not doomed:
            return []
        with self._lock:
            gone = [e[3] for e in self._heap if id(e) in doomed]
            self._heap = [e for e in self._heap if id(e) not in doomed]
            heapq.heapify(self._heap)
        return gone

    def __len__(self) -> int:
        return len(self._heap)
