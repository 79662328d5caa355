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

import itertools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, Literal, ParamSpec, TypeVar

import psutil  # type: ignore[import-untyped, unused-ignore]
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from taskflow.metrics import SAMPLES_KEPT, Percentiles, PoolMetrics, pct
from taskflow.pool import ThreadPool

__all__ = [
    "Alarm",
    "MonitoredExecutor",
    "PoolMonitor",
    "PoolSnapshot",
    "ProcessMetrics",
    "Thresholds",
    "render_prometheus",
]

_R = TypeVar("_R")
_P = ParamSpec("_P")
_T = TypeVar("_T")

_RING: Final = SAMPLES_KEPT
_MASK: Final = _RING - 1

# states of a task submitted through a MonitoredExecutor (see _Tracked)
_QUEUED: Final = 0  # handed to the inner executor, not started
_RUNNING: Final = 1  # started
_DONE: Final = 2  # finished
_CLAIMED: Final = 3  # cancelled before it started, and counted so

_monitor_seq = itertools.count()


# ---------------------------------------------------------------------- MonitoredExecutor
class _Tracked:
    """One task submitted through a ``MonitoredExecutor``; the callable the inner pool runs.

    ``state`` is written by the thread that moves the task on (submitter, worker or the
    monitor's cancel scan); ``abandoned`` and ``counted`` are guarded by the monitor's lock.
    The rest is written once before the task is handed to the inner executor.
    """

    __slots__ = ("abandoned", "args", "counted", "fn", "kwargs", "mon", "state", "submitted_at")

    def __init__(
        self, mon: MonitoredExecutor, fn: Callable[..., Any] | None, args: tuple[Any, ...],
        kwargs: dict[str, Any], submitted_at: float,
    ) -> None:
        self.mon = mon
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.state = _QUEUED
        self.submitted_at = submitted_at
        self.abandoned = False
        self.counted = False  # abandoned and already added to abandoned_total

    def __call__(self) -> Any:
        """Run the task in the inner executor's thread; counts go to this thread's stats."""
        mon = self.mon
        fn = self.fn
        self.fn = None
        assert fn is not None
        try:
            st: _ThreadStats = mon._tls.stats
        except AttributeError:
            st = mon._register_thread()
        mon._waiting.pop(self, None)
        self.state = _RUNNING
        started, completed, failures = st.counts
        st.counts = (started + 1, completed, failures)
        mono = time.monotonic
        start = mono()
        failed = True
        try:
            result = fn(*self.args, **self.kwargs)
            failed = False
            return result
        finally:
            run = mono() - start
            wait = start - self.submitted_at
            i = st.samples & _MASK
            st.samples += 1
            st.waits[i] = wait
            st.runs[i] = run
            st.wait_total += wait
            st.run_total += run
            self.state = _DONE  # before completed: whoever counts it done sees it finished
            started, completed, failures = st.counts
            st.counts = (started, completed + 1, failures + failed)

    def done(self, future: Future[Any]) -> None:
        """Done-callback on the inner future, used when tasks run out of process."""
        mon = self.mon
        cancelled = future.cancelled()
        failed = not cancelled and future.exception() is not None
        with mon._lock:
            if self.state == _DONE:
                return
            self.state = _DONE
            if cancelled:
                mon._cancelled += 1
            else:
                mon._completed += 1
                if failed:
                    mon._failed += 1
            mon._pending.pop(id(self), None)


class _ThreadStats:
    """Counters of the tasks one thread ran for a ``MonitoredExecutor``.

    Only the owning thread writes them, so workers never take the monitor's lock. ``counts``
    (started, completed, failed) is replaced as one tuple, so a snapshot reads a consistent
    triple for each thread: a thread's started - completed is the task it runs now.
    """

    __slots__ = ("counts", "run_total", "runs", "samples", "thread", "wait_total", "waits")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.counts = (0, 0, 0)
        self.samples = 0
        self.waits = [0.0] * _RING
        self.runs = [0.0] * _RING
        self.wait_total = 0.0
        self.run_total = 0.0


def _items_of(shared: dict[_Tracked, Future[Any]]) -> list[tuple[_Tracked, Future[Any]]]:
    """A copy of a dict that other threads change without a lock (single operations only).

    Copying can let another thread run (an allocation may start the garbage collector, which
    may run Python code), and a change in between makes the copy raise: copy again.
    """
    while True:
        try:
            return list(shared.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue


class MonitoredExecutor(Executor):
    """Counts the tasks of any executor: submitted, queued, active, completed, failed, timings.

    Args:
        executor: The executor to wrap (stdlib thread or process pools, loky, dask's
            ``ClientExecutor``, a :class:`ThreadPool`, ...). ``submit`` and ``shutdown`` are
            passed through; the wrapper is itself an Executor, so flows run on it.
        name: The pool's name in metrics; defaults to the inner type's name and a number.
        in_process: Whether tasks run in threads of this process. Then each task is wrapped to
            time it and to count it active while it runs, with per-thread counters so worker
            threads never contend on a lock. Otherwise (process pools, remote executors) the
            callable is passed through untouched, so it pickles as before, and outcomes are
            counted by a done-callback (run by whichever thread completes the Future): the
            timings are ``None`` and ``active_count`` comes from ``Future.running()`` where
            the executor reports it. Default: True for ``ThreadPoolExecutor`` and ``ThreadPool``.

    Figures the wrapper cannot know are ``None`` in ``metrics()``. Tasks cancelled before they
    started are found when a snapshot is taken (and now and then on submit), not when they are
    cancelled.
    """

    def __init__(
        self, executor: Executor, *, name: str | None = None, in_process: bool | None = None,
    ) -> None:
        self._inner = executor
        if in_process is None:
            in_process = isinstance(executor, (ThreadPoolExecutor, ThreadPool)) or (
                isinstance(executor, MonitoredExecutor) and executor._in_process
            )
        self._in_process: bool = in_process
        self._name = name if name is not None else f"{type(executor).__name__}-{next(_monitor_seq)}"
        module = type(executor).__module__
        # dask futures never report running(); process pools mark queued calls running early
        self._running_known = not in_process and not module.startswith("distributed")
        self._tls = threading.local()  # .stats: the _ThreadStats of the current thread
        # in_process: tasks handed to the inner executor and not started, with their futures;
        # single dict operations only (atomic), scanned for cancellations under _lock
        self._waiting: dict[_Tracked, Future[Any]] = {}
        self._scan_at = 1 << 16
        # _lock guards every field below, and each _Tracked's abandoned/counted
        self._lock = threading.Lock()
        self._shutdown = False
        self._task_count = 0
        self._cancelled = 0
        self._rejected = 0
        self._completed = 0  # not in_process (done-callbacks); in_process: retired threads
        self._failed = 0
        self._retired_started = 0
        self._retired_wait_total = 0.0
        self._retired_run_total = 0.0
        self._stats: list[_ThreadStats] = []
        self._abandoned: dict[_Tracked, None] = {}  # abandoned tasks not seen finished yet
        self._abandoned_total = 0
        self._largest_seen = 0
        # not in_process: the inner futures not done yet, to ask them running()
        self._pending: dict[int, Future[Any]] = {}

    @property
    def executor(self) -> Executor:
        """The wrapped executor."""
        return self._inner

    @property
    def name(self) -> str:
        """The pool's name in metrics."""
        return self._name

    @property
    def max_size(self) -> int | None:
        """The inner executor's worker count, when it can be read."""
        return _max_workers_of(self._inner)

    @property
    def _max_workers(self) -> int | None:  # read by the engine to guess parallelism
        return _max_workers_of(self._inner)

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Submit ``fn(*args, **kwargs)`` to the inner executor, counting it.

        Raises:
            Whatever the inner executor's ``submit`` raises (counted as a rejection).
        """
        in_process = self._in_process
        item = _Tracked(self, fn if in_process else None, args, kwargs, time.monotonic())
        with self._lock:
            self._task_count += 1
        try:
            if in_process:
                future: Future[Any] = self._inner.submit(item)
            else:
                future = self._inner.submit(fn, *args, **kwargs)
        except BaseException:
            with self._lock:
                item.state = _DONE
                self._rejected += 1
            raise
        try:
            future._taskflow_task = item  # type: ignore[attr-defined]
        except AttributeError:  # a future class with __slots__: mark_abandoned ignores it
            pass
        if in_process:
            if item.state == _QUEUED:
                self._waiting[item] = future
                if len(self._waiting) > self._scan_at:
                    self._scan_cancelled()
        else:
            with self._lock:
                if item.state != _DONE:
                    self._pending[id(item)] = future
            future.add_done_callback(item.done)
        return future

    def _scan_cancelled(self) -> None:
        """Count tasks cancelled before they started; drop entries of finished tasks."""
        waiting = self._waiting
        with self._lock:
            for item, future in _items_of(waiting):
                if future.done():
                    waiting.pop(item, None)
                    if item.state == _QUEUED and future.cancelled():
                        item.state = _CLAIMED
                        self._cancelled += 1
            self._scan_at = max(1 << 16, 2 * len(waiting))

    def _register_thread(self) -> _ThreadStats:
        st = _ThreadStats(threading.current_thread())
        self._tls.stats = st
        with self._lock:
            # fold the counts of threads that have exited, so the list stays short
            for old in [s for s in self._stats if not s.thread.is_alive()]:
                self._stats.remove(old)
                started, completed, failed = old.counts
                self._retired_started += started
                self._completed += completed
                self._failed += failed
                self._retired_wait_total += old.wait_total
                self._retired_run_total += old.run_total
            self._stats.append(st)
        return st

    def mark_abandoned(self, future: Future[Any]) -> None:
        """Count ``future``'s task as abandoned while it still runs (see ``ThreadPool``).

        Out of process, a task not done yet counts as running.
        """
        item = getattr(future, "_taskflow_task", None)
        if not isinstance(item, _Tracked) or item.mon is not self:
            return
        with self._lock:
            if item.abandoned or item.state == _DONE or item.state == _CLAIMED:
                return
            item.abandoned = True
            self._abandoned[item] = None
            if item.state == _RUNNING or not self._in_process:
                item.counted = True
                self._abandoned_total += 1
        inner_mark = getattr(self._inner, "mark_abandoned", None)
        if inner_mark is not None:
            inner_mark(future)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut the inner executor down (see ``concurrent.futures.Executor.shutdown``)."""
        with self._lock:
            self._shutdown = True
        self._inner.shutdown(wait=wait, cancel_futures=cancel_futures)

    def worker_native_ids(self) -> list[int]:
        """OS thread ids of the inner pool's threads, when they can be read."""
        ids = getattr(self._inner, "worker_native_ids", None)
        if callable(ids):
            return list(ids())
        threads: Iterable[threading.Thread] = getattr(self._inner, "_threads", ()) or ()
        return [t.native_id for t in list(threads) if t.native_id is not None]

    def metrics(self) -> PoolMetrics:
        """A snapshot of the counts; figures this executor cannot give are ``None``."""
        inner = self._inner
        base = inner.metrics() if isinstance(inner, (ThreadPool, MonitoredExecutor)) else None
        size = base.pool_size if base is not None else _pool_size_of(inner)
        if self._in_process:
            self._scan_cancelled()
        waits: list[float] = []
        runs: list[float] = []
        with self._lock:
            # task_count is read after the threads' counts: a task is counted submitted before
            # it can start, so queued = task_count - started - ... is never negative
            failed, completed = self._failed, self._completed
            started = self._retired_started
            wait_total, run_total = self._retired_wait_total, self._retired_run_total
            stats = list(self._stats)
            for st in stats:
                s_, c_, f_ = st.counts
                started += s_
                completed += c_
                failed += f_
                wait_total += st.wait_total
                run_total += st.run_total
            for st in stats:
                n = st.samples
                waits += st.waits if n >= _RING else st.waits[:n]
                runs += st.runs if n >= _RING else st.runs[:n]
            pending = list(self._pending.values())
            ab_running = 0
            for item in list(self._abandoned):
                state = item.state
                if state != _QUEUED and state != _CLAIMED and not item.counted:
                    item.counted = True  # it started after it was marked
                    self._abandoned_total += 1
                if state == _RUNNING or (state == _QUEUED and not self._in_process):
                    ab_running += 1
                elif state != _QUEUED:
                    del self._abandoned[item]
            tasks, cancelled, rejected = self._task_count, self._cancelled, self._rejected
            ab_total = self._abandoned_total
            shut = self._shutdown
            if size is not None and size > self._largest_seen:
                self._largest_seen = size
            largest = self._largest_seen if size is not None else None
        active_count: int | None
        queue_size: int | None
        if self._in_process:
            active_count = max(0, started - completed)
            queue_size = max(0, tasks - started - cancelled - rejected)
        else:
            not_done = tasks - completed - cancelled - rejected
            # out of process, "queued" would be every task not done: split it where running()
            # means something
            if self._running_known:
                active_count = sum(1 for f in pending if f.running())
                queue_size = max(0, not_done - active_count)
            else:
                active_count = queue_size = None
            waits = runs = []
        max_size = base.max_size if base is not None else _max_workers_of(inner)
        capacity = base.queue_capacity if base is not None else None
        shut = shut or getattr(inner, "_shutdown", False) is True or (
            getattr(inner, "_shutdown_thread", False) is True
        )
        if base is not None:
            largest = base.largest_pool_size
        elif isinstance(inner, ThreadPoolExecutor):
            largest = size  # its threads never exit
        return PoolMetrics(
            pool_name=self._name,
            executor_type=type(inner).__name__,
            core_size=base.core_size if base is not None else None,
            max_size=max_size,
            queue_capacity=capacity,
            keep_alive_s=base.keep_alive_s if base is not None else None,
            rejection_policy=base.rejection_policy if base is not None else None,
            pool_size=size,
            largest_pool_size=largest,
            active_count=active_count,
            queue_size=queue_size,
            queue_remaining_capacity=(
                None if capacity is None or queue_size is None else max(0, capacity - queue_size)
            ),
            abandoned_running=ab_running,
            is_shutdown=shut,
            is_terminated=base.is_terminated if base is not None else None,
            task_count=tasks,
            completed_task_count=completed,
            failed_task_count=failed,
            cancelled_task_count=cancelled,
            rejected_count=rejected,
            abandoned_total=ab_total,
            liveness_pct=pct(active_count, max_size),
            peak_load_pct=pct(largest, max_size),
            queue_usage_pct=pct(queue_size, capacity),
            queue_wait_s=Percentiles.of(waits),
            run_time_s=Percentiles.of(runs),
            queue_wait_total_s=wait_total if self._in_process else None,
            run_time_total_s=run_total if self._in_process else None,
            timestamp=time.time(),
            monotonic=time.monotonic(),
        )

    def __repr__(self) -> str:
        return f"<MonitoredExecutor {self._name!r} of {self._inner!r}>"


def _max_workers_of(executor: Executor) -> int | None:
    size = getattr(executor, "max_size", None)
    if not isinstance(size, int):
        size = getattr(executor, "_max_workers", None)
    return size if isinstance(size, int) else None


def _pool_size_of(executor: Executor) -> int | None:
    """Live workers of a stdlib (or look-alike) pool, read from its private fields."""
    if isinstance(executor, ProcessPoolExecutor) or hasattr(executor, "_processes"):
        procs = getattr(executor, "_processes", None)
        return len(procs) if isinstance(procs, dict) else None
    threads = getattr(executor, "_threads", None)
    return len(threads) if isinstance(threads, (set, list)) else None


# ---------------------------------------------------------------------- PoolMonitor

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
