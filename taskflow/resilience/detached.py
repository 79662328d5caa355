"""The process-wide bound on detached work: runs do not wait for it, so something must bound it.

A node with ``detach=True`` (and a cache's stale-while-revalidate refresh) runs after the run
that started it may have returned. Each such piece of work holds one *slot* from start to end;
``set_max_detached(n)`` (default 64) bounds how many are held at once in this process, and work
that finds every slot taken is refused (not queued) and counted, so a burst of pages can never
pile up unbounded background work on a shared pool.

How the engine uses it (all calls are non-blocking)::

    if not detached.try_enter():   # no slot: refused, counted in metrics().refused
        ...                        # the node ends refused, its hook is told why
    try: ...                       # the work runs (bounded by its own timeout)
    finally: detached.leave(ok)    # exactly once per slot taken

``PoolMonitor`` shows these figures by default (``PoolSnapshot.resilience``) and exports them
to Prometheus (``taskflow_detached_running``, ``taskflow_detached_refused_total``, ...).

Lowering the limit below the slots held refuses new work until enough of it has ended; it never
cancels work already running. The lock guards the counters and the limit; nothing is called
under it.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel, ConfigDict

from taskflow import _fork
from taskflow.exposition import Sample
from taskflow.resilience.export import register, render_prometheus
from taskflow.resilience.options import check_int

__all__ = [
    "DEFAULT_MAX_DETACHED",
    "DetachedMetrics",
    "DetachedSlots",
    "leave",
    "max_detached",
    "metrics",
    "set_max_detached",
    "slots",
    "try_enter",
]

DEFAULT_MAX_DETACHED = 64


class DetachedMetrics(BaseModel):
    """A snapshot of the process's detached work."""

    model_config = ConfigDict(frozen=True)

    name: str
    limit: int  # set_max_detached's bound
    running: int  # slots held now
    started: int  # slots taken (total)
    refused: int  # work refused: every slot was taken (total)
    succeeded: int  # work that ended well (total)
    failed: int  # work that ended with an error or a timeout (total)


class DetachedSlots:
    """A counter of slots with a limit: ``try_enter``/``leave``, never blocking."""

    def __init__(self, name: str = "detached", limit: int = DEFAULT_MAX_DETACHED) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._limit = check_int("set_max_detached", "n", limit, minimum=1)
        self._running = 0
        self._started = 0
        self._refused = 0
        self._succeeded = 0
        self._failed = 0

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, n: int) -> None:
        """Bound the slots held at once to ``n`` (an int >= 1)."""
        n = check_int("set_max_detached", "n", n, minimum=1)
        with self._lock:
            self._limit = n

    def try_enter(self) -> bool:
        """Take a slot; ``False`` (and counted as refused) when every slot is taken."""
        with self._lock:
            if self._running >= self._limit:
                self._refused += 1
                return False
            self._running += 1
            self._started += 1
            return True

    def leave(self, ok: bool = True) -> None:
        """Give back a slot taken by ``try_enter`` (once per slot), counting how it ended."""
        with self._lock:
            if self._running <= 0:
                raise RuntimeError("detached slot given back twice (a bug in taskflow)")
            self._running -= 1
            if ok:
                self._succeeded += 1
            else:
                self._failed += 1

    def metrics(self) -> DetachedMetrics:
        with self._lock:
            return DetachedMetrics(name=self.name, limit=self._limit, running=self._running,
                                   started=self._started, refused=self._refused,
                                   succeeded=self._succeeded, failed=self._failed)

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("detached", self.name),)
        return [
            Sample("detached_limit", "gauge", "Detached work allowed at once.", lab, m.limit),
            Sample("detached_running", "gauge", "Detached work running now.", lab, m.running),
            Sample("detached_started_total", "counter", "Detached work started.", lab,
                   m.started),
            Sample("detached_refused_total", "counter",
                   "Detached work refused: every slot was taken.", lab, m.refused),
            Sample("detached_succeeded_total", "counter", "Detached work that ended well.",
                   lab, m.succeeded),
            Sample("detached_failed_total", "counter",
                   "Detached work that failed or timed out.", lab, m.failed),
        ]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """These figures in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def _after_fork_in_child(self) -> None:
        # the parent's work does not run in the child: its slots are not held here
        self._lock = threading.Lock()
        self._running = 0

    def __repr__(self) -> str:
        m = self.metrics()
        return f"DetachedSlots(limit={m.limit}, running={m.running}, refused={m.refused})"


slots = DetachedSlots()
"""The process's one bound (``taskflow.set_max_detached`` sets its limit)."""

_fork.register(slots, hold="_lock")
register(slots, "detached")  # PoolMonitor exports it by default (running, refused, ...)


def set_max_detached(n: int) -> None:
    """Bound the detached work running at once in this process to ``n`` (default 64).

    Past it, a detached node (or a cache refresh) is refused, not queued, and counted
    (``taskflow.resilience.detached.metrics().refused``, ``PoolMonitor``, Prometheus).
    """
    slots.set_limit(n)


def max_detached() -> int:
    """The current bound (``set_max_detached``)."""
    return slots.limit


def try_enter() -> bool:
    """Take a slot of the process's bound; ``False`` (counted) when none is free."""
    return slots.try_enter()


def leave(ok: bool = True) -> None:
    """Give back a slot taken by ``try_enter``."""
    slots.leave(ok)


def metrics() -> DetachedMetrics:
    """A snapshot of the process's detached work."""
    return slots.metrics()
