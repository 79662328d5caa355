"""Load shedding at ``start``: measure what a run would use, refuse it before it submits anything.

The thresholds and counters are process-wide (``taskflow.resilience.shedding``); this module
reads the loads. A run's resources are its executor and the bulkheads of its plan:

- an executor that declares ``taskflow_load() -> (busy, queued, workers, full)``
  (``taskflow.ThreadPool``), also behind a wrapper (``MonitoredExecutor``, see
  ``executors.unwrap``); a stdlib ``ThreadPoolExecutor`` (its threads less the idle ones, its
  work queue, ``max_workers``). Other executors (process pools, dask) report no load: only
  their runs' bulkheads can shed them;
- each bulkhead: ``Bulkhead.load()`` (in use plus waiting over its current limit).

The reads take no lock of the pool's (gauges read as single attributes, or the stdlib queue's
own ``qsize``): a run decided on a load a moment old is the same as one that arrived a moment
earlier. A ``critical`` run measures nothing; a run started inline (a nested ``start`` on a
worker of the same pool, which submits nothing) is never shed.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from taskflow.engine.executors import unwrap
from taskflow.errors import InvalidArgumentError, InvalidArgumentValueError, did_you_mean
from taskflow.resilience.shedding import shedder

if TYPE_CHECKING:
    from taskflow.resilience.shedding import Priority as Priority

__all__ = ["admit", "check_priority", "executor_load"]

_FULL = float("inf")


def check_priority(priority: object) -> Priority:
    """``priority`` when it is ``"critical"``, ``"normal"`` or ``"sheddable"``, else a clear
    error (``start`` checks it before anything runs)."""
    if priority == "normal" or priority == "critical" or priority == "sheddable":
        return priority
    if not isinstance(priority, str):
        raise InvalidArgumentError(
            f"priority must be 'critical', 'normal' or 'sheddable', got {type(priority).__name__}",
            argument="priority")
    raise InvalidArgumentValueError(
        f"priority must be 'critical', 'normal' or 'sheddable', got {priority!r}"
        f"{did_you_mean(priority, ('critical', 'normal', 'sheddable'))}", argument="priority")


def executor_load(executor: Executor) -> tuple[str, float] | None:
    """``(what, load)`` of ``executor``, or None when it does not say."""
    inner = executor if type(executor) is ThreadPoolExecutor else unwrap(executor)
    declared = getattr(inner, "taskflow_load", None)
    if declared is not None:
        busy, queued, workers, full = declared()
        what = f"pool {getattr(inner, 'name', type(inner).__name__)!r}"
        return what, _FULL if full else (busy + queued) / max(1, workers)
    if isinstance(inner, ThreadPoolExecutor):
        return f"executor {type(inner).__name__}", _stdlib_load(inner)
    return None


def _stdlib_load(pool: Any) -> float:
    workers: int = max(1, pool._max_workers)
    idle_sem = getattr(pool, "_idle_semaphore", None)
    idle = getattr(idle_sem, "_value", 0)
    busy: int = max(0, len(pool._threads) - idle)
    queue = getattr(pool, "_work_queue", None)
    queued: int = queue.qsize() if queue is not None else 0
    return float(busy + queued) / workers


def admit(plan: Any, executor: Executor, priority: Priority, flow: str) -> None:
    """Count the run admitted, or raise ``LoadShedError`` (counted) when its priority is shed
    at the load of its executor or of one of its bulkheads."""
    threshold = shedder.threshold(priority)
    if threshold is not None:
        measured = executor_load(executor)
        if measured is not None and measured[1] >= threshold:
            raise shedder.refuse(flow, priority, measured[0], measured[1], threshold)
        for bulkhead in plan.bulkheads:
            load, full = bulkhead.load()
            if full:
                load = _FULL
            if load >= threshold:
                raise shedder.refuse(flow, priority, f"bulkhead {bulkhead.name!r}", load,
                                     threshold)
    shedder.admitted(priority)
