"""Load shedding: which runs ``start`` refuses when the pool or a bulkhead is saturated.

A run has a priority: ``"critical"``, ``"normal"`` (the default) or ``"sheddable"`` (bots,
prefetches, below-the-fold fragments). Before a run submits anything, the engine measures the
*load* of each resource the run would use (``taskflow.engine.shedding``):

- its executor: busy workers plus queued tasks, over the workers (1.0: no worker is free; 2.0:
  as many tasks wait as run);
- each bulkhead of its plan: slots in use plus waiters, over the bulkhead's current limit.

A resource that would refuse the work anyway (a bounded queue that is full, a bulkhead whose
``max_waiting`` waiters are queued) counts as infinitely loaded. A ``sheddable`` run is refused
with ``LoadShedError`` when any load reaches ``sheddable_at`` (default 1.0), a ``normal`` run when
any reaches ``normal_at`` (default None: normal runs are shed only once a threshold is set, so a
program that never names a priority behaves as it did), so under overload the bots lose first and
the pages that matter keep the pool. A ``critical`` run is never shed and is
not even measured.

The thresholds are process-wide (``set_load_shedding``), like ``set_max_detached``. The counters
(runs admitted and shed, per priority) show in ``PoolMonitor`` and Prometheus. ``_lock`` guards
the thresholds and the counters; nothing else is done under it. Nothing here imports pydantic
(``LoadShedder.metrics`` loads ``shedding_metrics`` when first asked): ``start`` reads this
module.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Literal

from taskflow import _fork
from taskflow.errors import FlowDefinitionError, LoadShedError
from taskflow.exposition import Sample
from taskflow.resilience.export import register, render_prometheus

if TYPE_CHECKING:
    from taskflow.resilience.shedding_metrics import LoadSheddingMetrics

__all__ = [
    "DEFAULT_NORMAL_AT",
    "DEFAULT_SHEDDABLE_AT",
    "PRIORITIES",
    "LoadShedder",
    "Priority",
    "set_load_shedding",
    "shedder",
]

Priority = Literal["critical", "normal", "sheddable"]
PRIORITIES: tuple[Priority, ...] = ("critical", "normal", "sheddable")
DEFAULT_SHEDDABLE_AT = 1.0
DEFAULT_NORMAL_AT: float | None = None


def _check_load(option: str, value: object, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and not math.isnan(value) and value > 0)
    if not ok:
        extra = " or None" if allow_none else ""
        raise FlowDefinitionError(
            f"set_load_shedding: {option} must be a load > 0 (1.0: no worker or slot is "
            f"free){extra}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


class LoadShedder:
    """The thresholds and counters of load shedding (one per process: ``shedder``)."""

    def __init__(self, name: str = "runs") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._sheddable_at = DEFAULT_SHEDDABLE_AT
        self._normal_at: float | None = DEFAULT_NORMAL_AT
        self._admitted: dict[str, int] = dict.fromkeys(PRIORITIES, 0)
        self._shed: dict[str, int] = dict.fromkeys(PRIORITIES, 0)

    def configure(self, sheddable_at: float, normal_at: float | None) -> None:
        sheddable = _check_load("sheddable_at", sheddable_at, allow_none=False)
        normal = _check_load("normal_at", normal_at, allow_none=True)
        assert sheddable is not None
        if normal is not None and normal < sheddable:
            raise FlowDefinitionError(
                f"set_load_shedding: normal_at ({normal!r}) must be >= sheddable_at "
                f"({sheddable!r}): sheddable runs are shed first")
        with self._lock:
            self._sheddable_at, self._normal_at = sheddable, normal

    def threshold(self, priority: Priority) -> float | None:
        """The load from which runs of ``priority`` are shed (None: never, nothing to measure)."""
        if priority == "normal":
            return self._normal_at
        if priority == "sheddable":
            return self._sheddable_at
        return None

    def admitted(self, priority: Priority) -> None:
        """Count a run let through."""
        with self._lock:
            self._admitted[priority] += 1

    def refuse(self, flow: str, priority: Priority, resource: str, load: float,
               threshold: float) -> LoadShedError:
        """Count a refusal and return the error to raise (nothing has been submitted)."""
        with self._lock:
            self._shed[priority] += 1
        return LoadShedError(flow, priority, resource, load, threshold)

    def metrics(self) -> LoadSheddingMetrics:
        # pydantic loads on first use: starting a run must not import it
        from taskflow.resilience.shedding_metrics import LoadSheddingMetrics

        with self._lock:
            return LoadSheddingMetrics(
                name=self.name, sheddable_at=self._sheddable_at, normal_at=self._normal_at,
                admitted=dict(self._admitted), shed=dict(self._shed))

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        out: list[Sample] = []
        for p in PRIORITIES:
            lab: tuple[tuple[str, str], ...] = (("shedding", self.name), ("priority", p))
            out.append(Sample("runs_admitted_total", "counter",
                              "Runs let through by load shedding, per priority.", lab,
                              m.admitted[p]))
            out.append(Sample("runs_shed_total", "counter",
                              "Runs refused at start by load shedding, per priority.", lab,
                              m.shed[p]))
        lab = (("shedding", self.name),)
        out.append(Sample("shedding_sheddable_at", "gauge",
                          "Load from which sheddable runs are refused.", lab, m.sheddable_at))
        if m.normal_at is not None:  # absent: normal runs are never shed (JSON has no +Inf)
            out.append(Sample("shedding_normal_at", "gauge",
                              "Load from which normal runs are refused.", lab, m.normal_at))
        return out

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """These figures in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        m = self.metrics()
        return (f"LoadShedder(sheddable_at={m.sheddable_at}, normal_at={m.normal_at}, "
                f"shed={m.shed})")


shedder = LoadShedder()
"""The process's load shedding (``taskflow.set_load_shedding`` sets its thresholds)."""

_fork.register(shedder, hold="_lock")
register(shedder, "shedding")  # PoolMonitor exports it by default


def set_load_shedding(sheddable_at: float = DEFAULT_SHEDDABLE_AT,
                      normal_at: float | None = DEFAULT_NORMAL_AT) -> None:
    """Set the loads from which ``start`` refuses runs, for this process.

    Args:
        sheddable_at: ``"sheddable"`` runs are refused once the pool or a bulkhead they use is
            at this load (busy plus waiting, over capacity; default 1.0: nothing is free).
        normal_at: ``"normal"`` runs are refused from this load (2.0: as much waits as runs);
            None (the default): normal runs are never shed. Must be >= ``sheddable_at``.
            ``"critical"`` runs are never shed.

    Raises:
        FlowDefinitionError: a threshold is not a number > 0, or ``normal_at < sheddable_at``.
    """
    shedder.configure(sheddable_at, normal_at)
