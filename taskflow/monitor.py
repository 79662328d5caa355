"""Pool monitoring: periodic snapshots of a pool and of the process, alarms, Prometheus text.

``PoolMonitor`` runs one daemon thread that, every ``interval`` seconds, takes a snapshot: the
pool's ``metrics()`` (a :class:`~taskflow.pool.ThreadPool` or
:class:`~taskflow.pool.MonitoredExecutor`; any other executor gives ``None`` pool figures)
and psutil figures of the process read inside one ``Process.oneshot()``. It keeps a bounded
history, evaluates the alarm thresholds (defaults from dynamic-tp: liveness >= 70 %, queue
usage >= 70 %, any new rejection, abandoned tasks present), silences each alarm for a period
after it fired, logs alarms with loguru and hands them to ``on_alarm``.

Sampling reads the pool's counters under its lock for a few microseconds; nothing is added to
the task path.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from types import TracebackType
from typing import Any, Literal, TypeVar

import psutil  # type: ignore[import-untyped, unused-ignore]
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from taskflow.pool import Percentiles, PoolMetrics

__all__ = [
    "Alarm",
    "PoolMonitor",
    "PoolSnapshot",
    "ProcessMetrics",
    "Thresholds",
    "render_prometheus",
]

_R = TypeVar("_R")

AlarmKind = Literal["liveness", "queue_usage", "rejected", "abandoned"]


class Thresholds(BaseModel):
    """When ``PoolMonitor`` raises an alarm; ``None`` turns a rule off.

    Defaults are dynamic-tp's (``NotifyItem``): liveness and queue usage at 70 %, any
    rejection; plus any abandoned task still running, the sign that a pool bleeds threads to
    work nobody waits for. Pass a mapping to ``PoolMonitor`` to override some of them and keep
    the other defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    liveness_pct: float | None = Field(default=70.0, ge=0)
    """Alarm when ``active_count / max_size * 100`` reaches this."""
    queue_usage_pct: float | None = Field(default=70.0, ge=0)
    """Alarm when ``queue_size / queue_capacity * 100`` reaches this (bounded queues only)."""
    rejected: int | None = Field(default=1, ge=1)
    """Alarm when this many tasks were rejected since the previous sample."""
    abandoned_running: int | None = Field(default=1, ge=1)
    """Alarm when this many abandoned tasks are still running."""
    silence_s: float = Field(default=120.0, ge=0)
    """After an alarm fires, the same alarm is not raised again for this many seconds."""


class Alarm(BaseModel):
    """One alarm raised by a ``PoolMonitor``."""

    model_config = ConfigDict(frozen=True)

    kind: AlarmKind
    pool_name: str
    value: float
    threshold: float
    message: str
    timestamp: float
    """``time.time()`` when the alarm fired."""


class ProcessMetrics(BaseModel):
    """psutil figures of this process, read inside one ``Process.oneshot()``.

    ``None`` where the platform does not give the figure.
    """

    model_config = ConfigDict(frozen=True)

    pid: int
    cpu_percent: float | None
    """CPU use since the previous sample; can exceed 100 with several cores."""
    cpu_user_s: float | None
    cpu_system_s: float | None
    rss_bytes: int | None
    vms_bytes: int | None
    num_threads: int | None
    ctx_switches_voluntary: int | None
    ctx_switches_involuntary: int | None
    """A fast-rising count hints at GIL or CPU contention."""
    num_fds: int | None


class PoolSnapshot(BaseModel):
    """One sample taken by a ``PoolMonitor``."""

    model_config = ConfigDict(frozen=True)

    pool_name: str
    timestamp: float
    """``time.time()`` of the sample."""
    monotonic: float
    pool: PoolMetrics | None
    """``None`` when the executor has no ``metrics()``."""
    process: ProcessMetrics
    tps: float | None
    """Tasks completed per second since the previous sample."""
    worker_cpu_s: float | None
    """CPU seconds (user + system) used so far by the pool's live threads, when known."""
    alarms: tuple[Alarm, ...] = ()
    """Alarms fired by this sample (silenced ones are left out)."""


class PoolMonitor:
    """Watch a pool and the process in the background; raise alarms on thresholds.

    Args:
        executor: A :class:`~taskflow.pool.ThreadPool`, a
            :class:`~taskflow.pool.MonitoredExecutor`, or any executor (then only the process
            figures are known).
        interval: Seconds between samples taken by the background thread.
        thresholds: A :class:`Thresholds`, or a mapping of the thresholds to change (the others
            keep their defaults), or ``None`` for the defaults.
        on_alarm: Called with each :class:`Alarm` that fires, in the thread that took the sample
            (the monitor's thread, or the caller of ``sample()``), never under a lock. An
            exception it raises is logged and ignored.
        history_size: Samples kept by ``history()``.
        name: The pool's name in alarms and metrics; defaults to the pool's own name.
        thread_name_prefix: The monitor thread is named ``f"{prefix}-monitor-{name}"``.

    Raises:
        ValueError: ``interval <= 0``, ``history_size < 1`` or an unknown or invalid threshold.

    Use it as a context manager (``with PoolMonitor(pool) as monitor: ...``) or call ``start``
    and ``stop``. The monitor never shuts the executor down.
    """

    def __init__(
        self,
        executor: Executor,
        interval: float = 1.0,
        thresholds: Thresholds | Mapping[str, Any] | None = None,
        on_alarm: Callable[[Alarm], object] | None = None,
        *,
        history_size: int = 600,
        name: str | None = None,
        thread_name_prefix: str = "taskflow",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {history_size!r}")
        if thresholds is None:
            thresholds = Thresholds()
        elif not isinstance(thresholds, Thresholds):
            thresholds = Thresholds.model_validate(dict(thresholds))
        self._executor = executor
        self._interval = float(interval)
        self._thresholds = thresholds
        self._on_alarm = on_alarm
        metrics = getattr(executor, "metrics", None)
        self._metrics: Callable[[], PoolMetrics] | None = metrics if callable(metrics) else None
        pool_name = getattr(executor, "name", None)
        self._name = name or (pool_name if isinstance(pool_name, str) else type(executor).__name__)
        self._thread_name = f"{thread_name_prefix}-monitor-{self._name}"
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)  # the first call only primes the counter
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # _lock guards _history, _last, _fired_at; sample() holds it while it evaluates alarms
        self._lock = threading.Lock()
        self._history: deque[PoolSnapshot] = deque(maxlen=history_size)
        self._last: PoolSnapshot | None = None
        self._fired_at: dict[str, float] = {}

    @property
    def thresholds(self) -> Thresholds:
        """The thresholds in force."""
        return self._thresholds

    @property
    def name(self) -> str:
        """The pool's name in alarms and metrics."""
        return self._name

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PoolMonitor:
        """Take a first sample and start the sampling thread; returns ``self``.

        Raises:
            RuntimeError: the monitor is already running.
        """
        if self._thread is not None:
            raise RuntimeError(f"monitor {self._name!r} is already running")
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the sampling thread and wait for it (at most ``timeout`` seconds)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> PoolMonitor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a monitor must outlive a bad sample
                logger.exception("pool monitor {!r}: sampling failed", self._name)

    # ------------------------------------------------------------------ sampling
    def sample(self) -> PoolSnapshot:
        """Take a snapshot now, record it and evaluate the alarms.

        Runs in the calling thread; ``on_alarm`` is called from it for the alarms that fire.
        """
        pool = self._metrics() if self._metrics is not None else None
        process = self._read_process()
        worker_cpu = self._worker_cpu()
        now, mono = time.time(), time.monotonic()
        with self._lock:
            last = self._last
            tps: float | None = None
            rejected_delta = pool.rejected_count if pool is not None else 0
            if pool is not None and last is not None and last.pool is not None:
                elapsed = mono - last.monotonic
                done = pool.completed_task_count - last.pool.completed_task_count
                tps = done / elapsed if elapsed > 0 else None
                rejected_delta = pool.rejected_count - last.pool.rejected_count
            alarms = self._evaluate(pool, rejected_delta, now, mono) if pool is not None else ()
            snap = PoolSnapshot(
                pool_name=self._name, timestamp=now, monotonic=mono, pool=pool, process=process,
                tps=tps, worker_cpu_s=worker_cpu, alarms=alarms,
            )
            self._history.append(snap)
            self._last = snap
        for alarm in alarms:
            logger.warning(
                "pool {!r} alarm {}: {} (value {:g}, threshold {:g})",
                alarm.pool_name, alarm.kind, alarm.message, alarm.value, alarm.threshold,
            )
            if self._on_alarm is not None:
                try:
                    self._on_alarm(alarm)
                except Exception:  # noqa: BLE001 - user callback: logged, never fatal
                    logger.exception("pool monitor {!r}: on_alarm callback raised", self._name)
        return snap

    def _evaluate(
        self, pool: PoolMetrics, rejected_delta: int, now: float, mono: float
    ) -> tuple[Alarm, ...]:
        t = self._thresholds
        checks: list[tuple[AlarmKind, float | None, float | None, str]] = [
            ("liveness", pool.liveness_pct, t.liveness_pct,
             f"{pool.active_count} of {pool.max_size} threads busy"),
            ("queue_usage", pool.queue_usage_pct, t.queue_usage_pct,
             f"{pool.queue_size} of {pool.queue_capacity} queue slots used"),
            ("rejected", float(rejected_delta), None if t.rejected is None else float(t.rejected),
             f"{rejected_delta} task(s) rejected since the previous sample"),
            ("abandoned", float(pool.abandoned_running),
             None if t.abandoned_running is None else float(t.abandoned_running),
             f"{pool.abandoned_running} abandoned task(s) still hold a thread"),
        ]
        fired: list[Alarm] = []
        for kind, value, threshold, message in checks:
            if value is None or threshold is None or value < threshold:
                continue
            if kind == "queue_usage" and not pool.queue_size:
                continue  # dynamic-tp skips the capacity alarm on an empty queue
            last = self._fired_at.get(kind)
            if last is not None and mono - last < t.silence_s:
                continue
            self._fired_at[kind] = mono
            fired.append(Alarm(
                kind=kind, pool_name=self._name, value=value, threshold=threshold,
                message=message, timestamp=now,
            ))
        return tuple(fired)

    def _read_process(self) -> ProcessMetrics:
        p = self._process
        with p.oneshot():
            cpu = _safe(lambda: p.cpu_percent(None))
            times = _safe(p.cpu_times)
            mem = _safe(p.memory_info)
            ctx = _safe(p.num_ctx_switches)
            threads = _safe(p.num_threads)
            fds = _safe(p.num_fds) if hasattr(p, "num_fds") else None
        return ProcessMetrics(
            pid=p.pid,
            cpu_percent=cpu,
            cpu_user_s=times.user if times is not None else None,
            cpu_system_s=times.system if times is not None else None,
            rss_bytes=mem.rss if mem is not None else None,
            vms_bytes=mem.vms if mem is not None else None,
            num_threads=threads,
            ctx_switches_voluntary=ctx.voluntary if ctx is not None else None,
            ctx_switches_involuntary=ctx.involuntary if ctx is not None else None,
            num_fds=fds,
        )

    def _worker_cpu(self) -> float | None:
        ids_of = getattr(self._executor, "worker_native_ids", None)
        if not callable(ids_of):
            return None
        ids = set(ids_of())
        threads = _safe(self._process.threads)
        if threads is None:
            return None
        total: float = sum(t.user_time + t.system_time for t in threads if t.id in ids)
        return total

    # ------------------------------------------------------------------ reading
    def latest(self) -> PoolSnapshot | None:
        """The most recent sample, or ``None`` before the first."""
        with self._lock:
            return self._last

    def history(self) -> list[PoolSnapshot]:
        """The samples kept, oldest first (at most ``history_size``)."""
        with self._lock:
            return list(self._history)

    def to_prometheus(self) -> str:
        """The latest sample in the Prometheus text exposition format (version 0.0.4).

        Takes a sample first if there is none yet. Serve it with the content type
        ``text/plain; version=0.0.4; charset=utf-8``.
        """
        snap = self.latest()
        if snap is None:
            snap = self.sample()
        return render_prometheus([snap])


def _safe(read: Callable[[], _R]) -> _R | None:
    """A psutil reading, or ``None`` where the platform or permissions do not give it."""
    try:
        return read()
    except (psutil.Error, OSError, NotImplementedError):
        return None


# ---------------------------------------------------------------------- Prometheus rendering
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


def render_prometheus(snapshots: Iterable[PoolSnapshot], *, prefix: str = "taskflow") -> str:
    """Render snapshots of one or more pools in the Prometheus text exposition format.

    Each metric family appears once, with one series per pool (label ``pool``); the process
    figures are taken from the first snapshot. Unknown figures are left out.

    Args:
        snapshots: Samples of distinct pools (e.g. each monitor's ``latest()``).
        prefix: Prepended to every metric name.
    """
    snaps = list(snapshots)
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        if not samples:
            return
        out.append(f"# HELP {prefix}_{name} {help_text}")
        out.append(f"# TYPE {prefix}_{name} {kind}")
        for suffix_labels, value in samples:
            out.append(f"{prefix}_{suffix_labels} {_num(value)}")

    pooled = [(s, s.pool) for s in snaps if s.pool is not None]
    for name, kind, help_text, read in _POOL_FAMILIES:
        rows = []
        for s, m in pooled:
            value = read(m)
            if value is not None:
                rows.append((f"{name}{{pool={_label(s.pool_name)}}}", float(value)))
        family(name, kind, help_text, rows)
    rows = [(f"pool_tps{{pool={_label(s.pool_name)}}}", s.tps) for s in snaps if s.tps is not None]
    family("pool_tps", "gauge", "Tasks completed per second over the last sample interval.", rows)
    rows = [
        (f"pool_worker_cpu_seconds_total{{pool={_label(s.pool_name)}}}", s.worker_cpu_s)
        for s in snaps if s.worker_cpu_s is not None
    ]
    family("pool_worker_cpu_seconds_total", "counter",
           "CPU seconds used by the pool's live threads.", rows)
    summaries: list[tuple[str, str, Callable[[PoolMetrics], Percentiles | None],
                          Callable[[PoolMetrics], float | None]]] = [
        ("pool_queue_wait_seconds", "Time tasks waited in the queue (recent tasks).",
         lambda m: m.queue_wait_s, lambda m: m.queue_wait_total_s),
        ("pool_run_seconds", "Time tasks ran (recent tasks).",
         lambda m: m.run_time_s, lambda m: m.run_time_total_s),
    ]
    for metric, help_text, pct_of, total_of in summaries:
        rows = []
        for s, m in pooled:
            pct, total = pct_of(m), total_of(m)
            if pct is None or total is None:
                continue
            label = _label(s.pool_name)
            for q, v in (("0.5", pct.p50), ("0.9", pct.p90), ("0.99", pct.p99)):
                rows.append((f'{metric}{{pool={label},quantile="{q}"}}', v))
            rows.append((f"{metric}_sum{{pool={label}}}", total))
            rows.append((f"{metric}_count{{pool={label}}}", float(m.completed_task_count)))
        family(metric, "summary", help_text, rows)

    if snaps:
        p = snaps[0].process
        family("process_cpu_percent", "gauge", "CPU use of the process since the previous sample.",
               [("process_cpu_percent", p.cpu_percent)] if p.cpu_percent is not None else [])
        cpu_rows = []
        if p.cpu_user_s is not None:
            cpu_rows.append(('process_cpu_seconds_total{mode="user"}', p.cpu_user_s))
        if p.cpu_system_s is not None:
            cpu_rows.append(('process_cpu_seconds_total{mode="system"}', p.cpu_system_s))
        family("process_cpu_seconds_total", "counter", "CPU time of the process.", cpu_rows)
        for name, help_text, value in (
            ("process_resident_memory_bytes", "Resident set size.", p.rss_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size.", p.vms_bytes),
            ("process_threads", "OS threads of the process.", p.num_threads),
            ("process_open_fds", "Open file descriptors.", p.num_fds),
        ):
            family(name, "gauge", help_text, [(name, float(value))] if value is not None else [])
        ctx_rows = []
        if p.ctx_switches_voluntary is not None:
            ctx_rows.append(('process_context_switches_total{kind="voluntary"}',
                             float(p.ctx_switches_voluntary)))
        if p.ctx_switches_involuntary is not None:
            ctx_rows.append(('process_context_switches_total{kind="involuntary"}',
                             float(p.ctx_switches_involuntary)))
        family("process_context_switches_total", "counter", "Context switches of the process.",
               ctx_rows)
    return "\n".join(out) + "\n" if out else ""


def _label(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'"{escaped}"'


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
