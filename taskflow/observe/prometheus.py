"""Prometheus export of pool snapshots: their metric families, and a ``prometheus_client`` collector.

Both are built from one table of metric families, so the ``/metrics`` text a
[`PoolMonitor`][taskflow.observe.monitor.PoolMonitor] renders and what ``PoolCollector`` hands to a
``prometheus_client`` registry carry the same names, types and labels. Counters (``*_total``)
never decrease within a process: the pool counts are cumulative, and the worker CPU counter
keeps the CPU of threads that have retired. A forked child (``gunicorn --preload``) starts its
counts from zero, like any new process; its ``pid`` differs.

``prometheus_client`` is needed only for ``PoolCollector`` (``pip install
'taskflow-juc[prometheus]'``); it is imported when a collector is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from taskflow.exposition import Family, render_families, sample_families
from taskflow.metrics import Percentiles, PoolMetrics
from taskflow.observe.snapshots import PoolSnapshot

__all__ = ["PoolCollector", "families", "render_prometheus"]


class Sampler(Protocol):
    """What a collector reads at scrape time: a ``PoolMonitor``."""

    def sample(self, *, record: bool = True) -> PoolSnapshot: ...

# (name, type, help, value of the snapshot's PoolMetrics)
_POOL_FAMILIES: list[tuple[str, str, str, Callable[[PoolMetrics], float | int | None]]] = [
    ("pool_core_size", "gauge", "Core number of threads.", lambda m: m.core_size),
    ("pool_max_size", "gauge", "Maximum number of threads.", lambda m: m.max_size),
    ("pool_size", "gauge", "Threads in the pool now.", lambda m: m.pool_size),
    ("pool_largest_size", "gauge", "Most threads ever in the pool at once.",
     lambda m: m.largest_pool_size),
    ("pool_active", "gauge", "Threads running a task now.", lambda m: m.active_count),
    ("pool_queue_size", "gauge", "Tasks waiting in the queue.", lambda m: m.queue_size),
    ("pool_queue_capacity", "gauge", "Bound of the queue (absent when unbounded).",
     lambda m: m.queue_capacity),
    ("pool_queue_remaining", "gauge", "Free places in the queue.",
     lambda m: m.queue_remaining_capacity),
    ("pool_liveness_percent", "gauge", "Active threads as a percentage of the maximum.",
     lambda m: m.liveness_pct),
    ("pool_queue_usage_percent", "gauge", "Queue use as a percentage of its capacity.",
     lambda m: m.queue_usage_pct),
    ("pool_abandoned_running", "gauge",
     "Tasks still running after the flow that submitted them gave up.",
     lambda m: m.abandoned_running),
    ("pool_tasks_total", "counter", "Tasks submitted.", lambda m: m.task_count),
    ("pool_completed_total", "counter", "Tasks that ran to the end.",
     lambda m: m.completed_task_count),
    ("pool_failed_total", "counter", "Completed tasks that raised.",
     lambda m: m.failed_task_count),
    ("pool_cancelled_total", "counter", "Tasks cancelled before they started.",
     lambda m: m.cancelled_task_count),
    ("pool_rejected_total", "counter", "Tasks the pool refused.", lambda m: m.rejected_count),
    ("pool_abandoned_total", "counter", "Tasks abandoned while running.",
     lambda m: m.abandoned_total),
]

_SUMMARIES: list[tuple[str, str, Callable[[PoolMetrics], Percentiles | None],
                       Callable[[PoolMetrics], float | None]]] = [
    ("pool_queue_wait_seconds", "Time tasks waited in the queue (recent tasks).",
     lambda m: m.queue_wait_s, lambda m: m.queue_wait_total_s),
    ("pool_run_seconds", "Time tasks ran (recent tasks).",
     lambda m: m.run_time_s, lambda m: m.run_time_total_s),
]


def families(snapshots: Iterable[PoolSnapshot], *, prefix: str = "taskflow") -> list[Family]:
    """The metric families of snapshots of one or more pools (label ``pool``).

    Process figures are taken from the first snapshot; the resilience primitives' families
    (``PoolSnapshot.resilience_samples``) follow, each series once. Families with no known
    sample are left out.
    """
    snaps = list(snapshots)
    out: list[Family] = []

    def family(name: str, kind: str, help_text: str) -> Family:
        fam = Family(f"{prefix}_{name}", kind, help_text)
        out.append(fam)
        return fam

    pooled = [(s, s.pool) for s in snaps if s.pool is not None]
    for name, kind, help_text, read in _POOL_FAMILIES:
        fam = family(name, kind, help_text)
        for s, m in pooled:
            fam.add(fam.name, {"pool": s.pool_name}, read(m))
    fam = family("pool_tps", "gauge", "Tasks completed per second over the last sample interval.")
    for s in snaps:
        fam.add(fam.name, {"pool": s.pool_name}, s.tps)
    fam = family("pool_worker_cpu_seconds_total", "counter",
                 "CPU seconds used by the pool's threads, those that have exited included.")
    for s in snaps:
        fam.add(fam.name, {"pool": s.pool_name}, s.worker_cpu_s)
    for metric, help_text, pct_of, total_of in _SUMMARIES:
        fam = family(metric, "summary", help_text)
        for s, m in pooled:
            pct, total = pct_of(m), total_of(m)
            if pct is None or total is None:
                continue
            for q, v in (("0.5", pct.p50), ("0.9", pct.p90), ("0.99", pct.p99)):
                fam.add(fam.name, {"pool": s.pool_name, "quantile": q}, v)
            fam.add(f"{fam.name}_sum", {"pool": s.pool_name}, total)
            fam.add(f"{fam.name}_count", {"pool": s.pool_name}, m.completed_task_count)

    if snaps:
        p = snaps[0].process
        family("process_cpu_percent", "gauge", "CPU use of the process since the previous sample.",
               ).add(f"{prefix}_process_cpu_percent", {}, p.cpu_percent)
        fam = family("process_cpu_seconds_total", "counter", "CPU time of the process.")
        fam.add(fam.name, {"mode": "user"}, p.cpu_user_s)
        fam.add(fam.name, {"mode": "system"}, p.cpu_system_s)
        for name, help_text, value in (
            ("process_resident_memory_bytes", "Resident set size.", p.rss_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size.", p.vms_bytes),
            ("process_threads", "OS threads of the process.", p.num_threads),
            ("process_open_fds", "Open file descriptors.", p.num_fds),
        ):
            fam = family(name, "gauge", help_text)
            fam.add(fam.name, {}, value)
        fam = family("process_context_switches_total", "counter",
                     "Context switches of the process.")
        fam.add(fam.name, {"kind": "voluntary"}, p.ctx_switches_voluntary)
        fam.add(fam.name, {"kind": "involuntary"}, p.ctx_switches_involuntary)
    out += sample_families((x for s in snaps for x in s.resilience_samples), prefix=prefix)
    return [f for f in out if f.samples]


def render_prometheus(snapshots: Iterable[PoolSnapshot], *, prefix: str = "taskflow") -> str:
    """Render snapshots of one or more pools in the Prometheus text exposition format (0.0.4).

    Each metric family appears once, with one series per pool (label ``pool``); the process
    figures are taken from the first snapshot. Unknown figures are left out.

    Args:
        snapshots: Samples of distinct pools (e.g. each monitor's ``sample(record=False)``).
        prefix: Prepended to every metric name.
    """
    return render_families(families(snapshots, prefix=prefix))


class PoolCollector:
    """A ``prometheus_client`` collector of one or more ``PoolMonitor``s, sampled at scrape time.

    For applications that already expose a ``prometheus_client`` registry::

        from prometheus_client import REGISTRY
        REGISTRY.register(PoolCollector(monitor))

    Every scrape calls each monitor's ``sample(record=False)`` in the scraping thread (a few
    hundred microseconds: psutil figures and a pool snapshot), so figures are never stale;
    the monitors' histories and alarms are left to their own sampling threads. The families
    are the ones ``PoolMonitor.to_prometheus`` renders.

    Args:
        monitors: The monitors to export (one series per pool, label ``pool``).
        prefix: Prepended to every metric name.

    Raises:
        ImportError: ``prometheus_client`` is not installed (``pip install
            'taskflow-juc[prometheus]'``).
    """

    def __init__(self, *monitors: Sampler, prefix: str = "taskflow") -> None:
        try:
            from prometheus_client.core import Metric
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "PoolCollector needs prometheus_client: pip install 'taskflow-juc[prometheus]'"
            ) from exc
        self._metric = Metric
        self._monitors = monitors
        self._prefix = prefix

    def collect(self) -> Iterator[Any]:
        """Sample every monitor now and yield ``prometheus_client`` metric families."""
        snaps = [monitor.sample(record=False) for monitor in self._monitors]
        for fam in families(snaps, prefix=self._prefix):
            # prometheus_client names a counter family without its _total suffix
            name = fam.name.removesuffix("_total") if fam.kind == "counter" else fam.name
            metric = self._metric(name, fam.help, fam.kind)
            for name, labels, value in fam.samples:
                metric.add_sample(name, labels, value)
            yield metric

    def describe(self) -> list[Any]:
        """No names ahead of time, so registering does not take a sample (the registry then
        cannot check these names for duplicates; they all start with ``prefix``)."""
        return []
