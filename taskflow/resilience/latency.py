"""Recent durations per node: a bounded ring per key, and a bounded registry of rings.

``Hedge(after="p95")`` reads a node's recent 95th percentile here and the dispatcher reads its
recent median. Recording is one short critical section (a slot write); quantiles sort a copy
outside the lock and are cached until the next record.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from threading import Lock

from taskflow.resilience.options import check_int
from taskflow.resilience.process import track

__all__ = ["LatencyRegistry", "LatencyTracker", "latencies"]


class LatencyTracker:
    """The last ``size`` durations of one node (seconds), with quantiles over them."""

    __slots__ = ("__weakref__", "_buf", "_cache", "_count", "_lock", "size")

    def __init__(self, size: int = 256) -> None:
        self.size = check_int("latency tracker", "size", size, minimum=1)
        # _lock guards _buf and _count; _cache is replaced whole (one atomic store), never mutated
        self._lock = Lock()
        self._buf: list[float] = [0.0] * self.size
        self._count = 0  # durations recorded in total; the ring holds min(_count, size)
        self._cache: tuple[int, list[float]] = (0, [])  # (_count when sorted, sorted durations)
        track(self)

    def _after_fork(self) -> None:
        self._lock = Lock()  # the history stays true in the child; only the lock is renewed

    def record(self, seconds: float) -> None:
        """Add one duration (negative or non-finite values are ignored)."""
        if not (seconds >= 0.0 and math.isfinite(seconds)):
            return
        with self._lock:
            self._buf[self._count % self.size] = seconds
            self._count += 1

    @property
    def count(self) -> int:
        """Durations recorded in total (the quantiles use at most ``size`` recent ones)."""
        return self._count

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 <= q <= 1, nearest rank) of the recent durations, None if empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q!r}")
        with self._lock:
            count = self._count
            if count == 0:
                return None
            cached_at, values = self._cache
            if cached_at != count:
                values = self._buf[: min(count, self.size)]
        if cached_at != count:
            values.sort()  # outside the lock: recording never waits for a sort
            self._cache = (count, values)  # a racing older sort may win: it is rebuilt later
        rank = max(0, math.ceil(q * len(values)) - 1)
        return values[rank]

    def median(self) -> float | None:
        return self.quantile(0.5)

    def p95(self) -> float | None:
        return self.quantile(0.95)


class LatencyRegistry:
    """Trackers by key (e.g. ``(flow name, node name)``), at most ``max_keys``, least recent out.

    Args:
        max_keys: Keys kept (>= 1); the least recently used tracker is dropped beyond it.
        size: Durations kept per key (>= 1).
    """

    def __init__(self, *, max_keys: int = 4096, size: int = 256) -> None:
        self.max_keys = check_int("latency registry", "max_keys", max_keys, minimum=1)
        self.size = check_int("latency registry", "size", size, minimum=1)
        self._lock = Lock()  # guards _trackers
        self._trackers: OrderedDict[Hashable, LatencyTracker] = OrderedDict()
        track(self)

    def _after_fork(self) -> None:
        self._lock = Lock()

    def tracker(self, key: Hashable) -> LatencyTracker:
        """The tracker of ``key``, created on first use."""
        with self._lock:
            tracker = self._trackers.get(key)
            if tracker is None:
                tracker = self._trackers[key] = LatencyTracker(self.size)
                if len(self._trackers) > self.max_keys:
                    self._trackers.popitem(last=False)
            else:
                self._trackers.move_to_end(key)
            return tracker

    def get(self, key: Hashable) -> LatencyTracker | None:
        """The tracker of ``key`` if there is one (does not create it)."""
        with self._lock:
            return self._trackers.get(key)

    def record(self, key: Hashable, seconds: float) -> None:
        self.tracker(key).record(seconds)

    def median(self, key: Hashable) -> float | None:
        tracker = self.get(key)
        return None if tracker is None else tracker.median()

    def __len__(self) -> int:
        return len(self._trackers)


latencies = LatencyRegistry()
"""The process-wide registry the engine records attempt durations in."""
