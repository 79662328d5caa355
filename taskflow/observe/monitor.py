"""``PoolMonitor``: periodic snapshots of a pool and the process, alarms, Prometheus export.

``PoolMonitor`` runs one daemon thread that, every ``interval`` seconds, takes a snapshot: the
pool's ``metrics()`` (a [`ThreadPool`][taskflow.pools.threadpool.ThreadPool] or a
[`MonitoredExecutor`][taskflow.pools.monitored.MonitoredExecutor]; any other executor gives ``None`` pool
figures) and psutil figures of the process read inside one ``Process.oneshot()``. It keeps a
bounded history, evaluates the alarm thresholds (defaults from dynamic-tp: liveness >= 70 %,
queue usage >= 70 %, any new rejection, abandoned tasks present; plus queue wait dominating run
time, which says the pool is too small), silences each alarm for a period after it fired, logs
alarms with loguru and hands them to ``on_alarm``. Scrapes (``to_prometheus``,
``PoolCollector``) take their own snapshot at scrape time.

Sampling reads the pool's counters under its lock for a few microseconds; nothing is added to
the task path. After ``os.fork`` (``gunicorn --preload``) the child's monitors read the child's
process and restart their sampling thread.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import psutil  # type: ignore[import-untyped, unused-ignore]

from taskflow import _fork, clock
from taskflow.errors import traceback_text
from taskflow.logs import logger
from taskflow.metrics import PoolMetrics
from taskflow.observe.prometheus import render_prometheus
from taskflow.observe.snapshots import Alarm, AlarmKind, PoolSnapshot, ProcessMetrics, Thresholds
from taskflow.resilience.export import Exportable, registered

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PoolMonitor"]

_R = TypeVar("_R")


class PoolMonitor:
    """Watch a pool and the process in the background; raise alarms on thresholds.

    Args:
        executor: A [`ThreadPool`][taskflow.pools.threadpool.ThreadPool], a
            ``MonitoredExecutor``, or any executor (then only the process
            figures are known).
        interval: Seconds between samples taken by the background thread.
        thresholds: A [`Thresholds`][taskflow.Thresholds], or a mapping of the thresholds to change (the others
            keep their defaults), or ``None`` for the defaults.
        on_alarm: Called with each [`Alarm`][taskflow.Alarm] that fires, in the thread that took the sample
            (the monitor's thread, or the caller of ``sample()``), never under a lock. An
            exception it raises is logged and ignored.
        history_size: Samples kept by ``history()``.
        name: The pool's name in alarms and metrics; defaults to the pool's own name.
        thread_name_prefix: The monitor thread is named ``f"{prefix}-monitor-{name}"``.
        resilience: The bulkheads, rate limits, circuit breakers (and single flights) whose
            metrics each sample carries (``PoolSnapshot.resilience``) and the Prometheus output
            shows (series labelled ``bulkhead``, ``rate_limit``, ``breaker``, ``single_flight``;
            a breaker's state is the gauge ``taskflow_breaker_state``, 1 for its current
            state). ``None`` (the default): every ``Bulkhead``, ``RateLimit`` and
            ``CircuitBreaker`` alive in the process when the sample is taken (each registers
            itself when made; a second live object of the same kind and name is not
            registered, see ``taskflow.resilience.export``), the load shedder and the
            process's detached slots (``DetachedMetrics``: ``running``, ``refused``, ...;
            ``taskflow_detached_*``). ``()``: none.

    Raises:
        ValueError: ``interval <= 0``, ``history_size < 1``, an unknown or invalid threshold,
            or two ``resilience`` objects of one kind with the same name (their series would
            clash).
        TypeError: a ``resilience`` object has no ``metrics()``/``prometheus_samples()``.

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
        resilience: Iterable[Exportable] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {history_size!r}")
        if thresholds is None:
            thresholds = Thresholds()
        elif not isinstance(thresholds, Thresholds):
            thresholds = Thresholds.model_validate(dict(thresholds))
        self._resilience = None if resilience is None else _check_resilience(resilience)
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
        # worker CPU, guarded by _lock: the last reading per live thread id, the CPU of the
        # threads seen to vanish (when the pool does not report it), and the highest total
        # reported, so the counter never goes down
        self._thread_cpu: dict[int, float] = {}
        self._vanished_cpu = 0.0
        self._cpu_high = 0.0
        # the child samples its own process, its sampling thread running again
        _fork.register(self, hold="_lock")

    @property
    def thresholds(self) -> Thresholds:
        """The thresholds in force."""
        return self._thresholds

    @property
    def name(self) -> str:
        """The pool's name in alarms and metrics."""
        return self._name

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
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
            clock.real_join(thread, timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _after_fork_in_child(self) -> None:
        """In a forked child: the same monitor, for this process, its thread running again.

        The parent's history and alarm silences describe the parent; they are dropped. If the
        monitor was running, a new sampling thread starts here (the parent's does not exist in
        the child).
        """
        self._lock = threading.Lock()
        self._process = psutil.Process(os.getpid())
        _safe(lambda: self._process.cpu_percent(None))
        self._history = deque(maxlen=self._history.maxlen)
        self._last = None
        self._fired_at = {}
        self._thread_cpu = {}
        self._vanished_cpu = self._cpu_high = 0.0
        if self._thread is not None and not self._stop.is_set():
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
            self._thread.start()
        else:
            self._thread = None

    def _run(self) -> None:
        while not clock.real_wait(self._stop, self._interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a monitor must outlive a bad sample
                logger.exception("pool monitor {!r}: sampling failed", self._name)

    # ------------------------------------------------------------------ sampling
    def sample(self, *, record: bool = True) -> PoolSnapshot:
        """Take a snapshot now, record it and evaluate the alarms.

        Args:
            record: ``False`` takes a snapshot for a scrape (``to_prometheus``, the Prometheus
                collector): it is not kept in the history, raises no alarm, and ``tps`` is
                measured since the last recorded sample.

        Runs in the calling thread; ``on_alarm`` is called from it for the alarms that fire.
        """
        pool = self._metrics() if self._metrics is not None else None
        process = self._read_process()
        worker_cpu = self._worker_cpu(pool)
        objects = registered() if self._resilience is None else self._resilience
        resilience = tuple(obj.metrics() for obj in objects)
        resilience_samples = tuple(s for obj in objects for s in obj.prometheus_samples())
        now, mono = clock.real_wall(), clock.real_now()
        with self._lock:
            last = self._last
            tps: float | None = None
            if pool is not None and last is not None and last.pool is not None:
                elapsed = mono - last.monotonic
                done = pool.completed_task_count - last.pool.completed_task_count
                tps = done / elapsed if elapsed > 0 else None
            alarms: tuple[Alarm, ...] = ()
            if record and pool is not None:
                alarms = self._evaluate(pool, last.pool if last is not None else None, now, mono)
            snap = PoolSnapshot(
                pool_name=self._name, timestamp=now, monotonic=mono, pool=pool, process=process,
                tps=tps, worker_cpu_s=worker_cpu, alarms=alarms, resilience=resilience,
                resilience_samples=resilience_samples,
            )
            if record:
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
                except Exception as exc:  # noqa: BLE001 - user callback: logged, never fatal
                    # as text: a diagnose=True sink would print the callback's variables
                    logger.error("pool monitor {!r}: on_alarm callback raised\n{}", self._name,
                                 traceback_text(exc))
        return snap

    def _evaluate(
        self, pool: PoolMetrics, last: PoolMetrics | None, now: float, mono: float
    ) -> tuple[Alarm, ...]:
        t = self._thresholds
        rejected_delta = pool.rejected_count - (last.rejected_count if last is not None else 0)
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
            _queue_wait_check(pool, last, t),
        ]
        fired: list[Alarm] = []
        for kind, value, threshold, message in checks:
            if value is None or threshold is None or value < threshold:
                continue
            if kind == "queue_usage" and not pool.queue_size:
                continue  # dynamic-tp skips the capacity alarm on an empty queue
            fired_at = self._fired_at.get(kind)
            if fired_at is not None and mono - fired_at < t.silence_s:
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

    def _worker_cpu(self, pool: PoolMetrics | None) -> float | None:
        """CPU seconds of the pool's threads so far, retired ones included; never decreases.

        Live threads are read with psutil; threads that have exited count with the CPU the
        pool recorded as they retired (``retired_worker_cpu_s``) or, for executors that do not
        record it, with their last reading here.
        """
        ids_of = getattr(self._executor, "worker_native_ids", None)
        if not callable(ids_of):
            return None
        ids = set(ids_of())
        threads = _safe(self._process.threads)
        if threads is None:
            return None
        live = {t.id: t.user_time + t.system_time for t in threads if t.id in ids}
        retired = pool.retired_worker_cpu_s if pool is not None else None
        with self._lock:
            if retired is None:
                for tid, cpu in self._thread_cpu.items():
                    if tid not in live:
                        self._vanished_cpu += cpu
                self._thread_cpu = live
                retired = self._vanished_cpu
            # psutil's tick-rounded readings and the exact CPU of a retiring thread can differ
            # by a tick: a counter must never go down, so report the highest total seen
            total = max(self._cpu_high, retired + sum(live.values()))
            self._cpu_high = total
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
        """A snapshot taken now, in the Prometheus text exposition format (version 0.0.4).

        The snapshot is taken at call time (``sample(record=False)``), so a scrape is never
        ``interval`` seconds old. Serve it with the content type
        ``text/plain; version=0.0.4; charset=utf-8``. Applications that already have a
        ``prometheus_client`` registry register a ``PoolCollector``
        instead.
        """
        return render_prometheus([self.sample(record=False)])


def _queue_wait_check(
    pool: PoolMetrics, last: PoolMetrics | None, t: Thresholds
) -> tuple[AlarmKind, float | None, float | None, str]:
    """The queue-wait alarm: tasks completed since ``last`` waited longer than they ran."""
    kind: AlarmKind = "queue_wait"
    if (
        t.queue_wait_ratio is None or last is None or pool.queue_wait_total_s is None
        or pool.run_time_total_s is None or last.queue_wait_total_s is None
        or last.run_time_total_s is None
    ):
        return kind, None, None, ""
    done = pool.completed_task_count - last.completed_task_count
    wait = pool.queue_wait_total_s - last.queue_wait_total_s
    run = pool.run_time_total_s - last.run_time_total_s
    if done <= 0 or wait / done < t.queue_wait_min_s:
        return kind, None, None, ""
    ratio = wait / run if run > 0 else math.inf
    if pool.queue_capacity is None and pool.core_size is not None:
        change = (
            f"raise core_size (now {pool.core_size}; with an unbounded queue the pool never "
            "grows past core)"
        )
    elif pool.max_size is not None:
        change = f"raise max_size (now {pool.max_size})"
    else:
        change = "give the executor more workers"
    message = (
        f"tasks waited {wait / done * 1000:.1f} ms in the queue for {run / done * 1000:.1f} ms "
        f"of run time ({done} tasks since the previous sample): the pool is the bottleneck. "
        f"{change[0].upper()}{change[1:]}, to about the number of threads that submit to it "
        "times the nodes each request runs at once; or lower the load"
    )
    return kind, ratio, t.queue_wait_ratio, message


def _check_resilience(objects: Iterable[Exportable]) -> tuple[Exportable, ...]:
    """The resilience objects a monitor was given, checked before it samples anything."""
    out = tuple(objects)
    seen: set[tuple[type, str]] = set()
    for obj in out:
        if not (callable(getattr(obj, "metrics", None))
                and callable(getattr(obj, "prometheus_samples", None))):
            raise TypeError(
                f"resilience objects need metrics() and prometheus_samples(), got {obj!r}"
            )
        key = (type(obj), obj.name)
        if key in seen:
            raise ValueError(
                f"two {type(obj).__name__} objects named {obj.name!r} in resilience: their "
                "series would clash; give them distinct names"
            )
        seen.add(key)
    return out


def _safe(read: Callable[[], _R]) -> _R | None:
    """A psutil reading, or ``None`` where the platform or permissions do not give it."""
    try:
        return read()
    except (psutil.Error, OSError, NotImplementedError):
        return None
