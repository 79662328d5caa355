"""Pool monitoring: counts for any executor, periodic snapshots, alarms, Prometheus export.

``MonitoredExecutor`` wraps any executor and counts its tasks (submitted, queued, active,
completed, failed, cancelled, rejected, abandoned) with queue-wait and run times. In process it
keeps per-thread counters that only their thread writes, so workers never take a lock; a plain
stdlib ``ThreadPoolExecutor`` gets timed work items put on its own queue, and Futures that count
their own cancellation, so monitoring adds no call frame and no bookkeeping list per task; the
threads such a pool starts after it is wrapped run ``_monitored_worker``, the stdlib worker loop
with the monitor's tasks inlined and the thread's counters in a local variable. Once such a pool
has all its threads, its submit and its monitored workers skip the stdlib's idle-thread semaphore
(it only decides whether to start a thread, and a full pool starts none): that lock, taken twice
per task by the submitter and the workers, is where the stdlib pool's threads convoy, so a wrapped
pool runs no-op tasks faster than the bare one although the counting itself costs CPU (see
``benchmarks/pool_throughput.py``).

``PoolMonitor`` runs one daemon thread that, every ``interval`` seconds, takes a snapshot: the
pool's ``metrics()`` (a :class:`~taskflow.pool.ThreadPool` or a ``MonitoredExecutor``; any
other executor gives ``None`` pool figures) and psutil figures of the process read inside one
``Process.oneshot()``. It keeps a bounded history, evaluates the alarm thresholds (defaults from
dynamic-tp: liveness >= 70 %, queue usage >= 70 %, any new rejection, abandoned tasks present;
plus queue wait dominating run time, which says the pool is too small), silences each alarm for
a period after it fired, logs alarms with loguru and hands them to ``on_alarm``. Scrapes
(``to_prometheus``, :class:`~taskflow.prometheus.PoolCollector`) take their own snapshot at
scrape time.

Sampling reads the pool's counters under its lock for a few microseconds; nothing is added to
the task path. After ``os.fork`` (``gunicorn --preload``) the child's monitors read the child's
process and restart their sampling thread, and ``MonitoredExecutor`` counts start over.
"""

from __future__ import annotations

import concurrent.futures._base as _cfb
import concurrent.futures.thread as _cft
import inspect
import itertools
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, ParamSpec, TypeVar

import psutil  # type: ignore[import-untyped, unused-ignore]
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from taskflow import _fork
from taskflow.errors import traceback_text
from taskflow.metrics import SAMPLES_KEPT, Percentiles, PoolMetrics, pct
from taskflow.pool import ThreadPool
from taskflow.prometheus import render_prometheus
from taskflow.resilience.breaker import BreakerMetrics
from taskflow.resilience.bulkhead import BulkheadMetrics
from taskflow.resilience.export import Exportable, Sample, registered
from taskflow.resilience.ratelimit import RateLimitMetrics
from taskflow.resilience.singleflight import SingleFlightMetrics

if TYPE_CHECKING:
    from typing_extensions import Self

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

# states of a task a MonitoredExecutor sent out of process (see _Tracked)
_QUEUED: Final = 0  # handed to the inner executor, outcome not seen yet
_DONE: Final = 2  # its outcome is counted (or it was rejected)

_monitor_seq = itertools.count()


# ---------------------------------------------------------------------- MonitoredExecutor
class _Tracked:
    """A task submitted through a ``MonitoredExecutor`` that runs out of process.

    Its outcome is counted by ``done``, a done-callback on the inner Future. ``state`` is
    guarded by the monitor's lock.
    """

    __slots__ = ("mon", "state")

    def __init__(self, mon: MonitoredExecutor) -> None:
        self.mon = mon
        self.state = _QUEUED

    def done(self, future: Future[Any]) -> None:
        """Done-callback on the inner future (run by whichever thread completes it)."""
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


_monotonic = time.monotonic


def _stdlib_work_item_fits() -> bool:
    """Whether this Python's ``ThreadPoolExecutor`` internals are the ones ``_TimedWorkItem``
    is written against (CPython 3.9 to 3.13: ``_WorkItem(future, fn, args, kwargs)`` on
    ``_work_queue``, ``_adjust_thread_count``, ``_shutdown_lock``)."""
    try:
        params = list(inspect.signature(_cft._WorkItem.__init__).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    try:
        worker = list(inspect.signature(_cft._worker).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    return params == ["self", "future", "fn", "args", "kwargs"] and worker == [
        "executor_reference", "work_queue", "initializer", "initargs",
    ] and hasattr(_cft, "_threads_queues") and hasattr(_cfb, "LOGGER") and all(
        hasattr(_cft, name) for name in ("_global_shutdown_lock", "_shutdown", "BrokenThreadPool")
    ) and hasattr(_cfb, "PENDING") and all(
        hasattr(ThreadPoolExecutor, name)
        for name in ("_adjust_thread_count", "_initializer_failed", "submit")
    )


_STDLIB_FITS: Final = _stdlib_work_item_fits()


class _TimedWorkItem:
    """A stdlib ``ThreadPoolExecutor`` work item that times and counts its task.

    A ``MonitoredExecutor`` puts it on a stdlib pool's queue itself, so monitoring adds no
    call frame and no argument packing to a task (a wrapping callable alone made no-op
    throughput 7-12 % slower). ``_monitored_worker`` runs it inline; the stdlib's worker (in
    threads the pool started before it was wrapped) calls ``run()``; both read ``future`` (to
    cancel or fail queued items), as for the stdlib's ``_WorkItem``. ``__slots__`` makes it
    cheaper to build than a ``_WorkItem``, which pays back part of the timing.
    """

    __slots__ = ("args", "fn", "future", "kwargs", "mon", "submitted_at")

    def __init__(
        self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
        kwargs: dict[str, Any], mon: MonitoredExecutor, submitted_at: float,
    ) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.mon = mon
        self.submitted_at = submitted_at

    def run(self) -> None:
        """Run in a pool thread, as the stdlib's ``_WorkItem.run``, counting the task."""
        future = self.future
        if not future.set_running_or_notify_cancel():
            return  # cancelled before it started: its _MonitoredFuture counted that
        try:
            st: _ThreadStats = self.mon._tls.stats
        except AttributeError:
            st = self.mon._register_thread()
        n = st.started
        st.started = n + 1
        start = _monotonic()
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - the task's outcome, as in stdlib
            st.finish_failed(n, self.submitted_at, start)
            future.set_exception(exc)
            # break the cycle frame -> future -> exc -> traceback -> frame, as the stdlib does
            self = future = None  # type: ignore[assignment]
        else:
            st.finish(n, self.submitted_at, start, _monotonic())
            future.set_result(result)


class _MonitoredFuture(Future[Any]):
    """The Future of a task a ``MonitoredExecutor`` put on a stdlib pool's queue itself.

    It counts its own cancellation before the task started (by its holder, or by the pool's
    ``shutdown(cancel_futures=True)``), so the monitor keeps no list of pending futures.
    """

    __slots__ = ("_taskflow_monitor",)

    _taskflow_monitor: MonitoredExecutor

    def cancel(self) -> bool:
        """Cancel the task if it has not started; counted once, as cancelled before start."""
        with self._condition:  # an RLock: Future.cancel takes it again
            pending = self._state == _cfb.PENDING
            cancelled = super().cancel()
        if pending and cancelled:
            mon = self._taskflow_monitor
            with mon._lock:
                mon._cancelled += 1
        return cancelled


class _ThreadStats:
    """Counts and times of the tasks one thread ran for a ``MonitoredExecutor``.

    Only the owning thread writes them, so workers take no lock and allocate nothing per task.
    A thread runs one task at a time: its ``n``-th task (from 0) sets ``started = n + 1``
    before it runs; when it ends, its clock readings go to ``subs``, ``starts`` and ``ends`` at
    index ``n % SAMPLES_KEPT`` (three list stores, no tuple to build and free); the task that
    fills the last index folds the lap's times into ``totals`` (one tuple store:
    ``(tasks folded, wait total, run total)``); then ``completed = n + 1``, then (if it
    raised) ``failed += 1``. ``read`` gives a consistent view without stopping the thread.
    """

    __slots__ = ("completed", "ends", "failed", "started", "starts", "subs", "thread", "totals")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.started = 0
        self.completed = 0
        self.failed = 0
        self.subs = [0.0] * _RING
        self.starts = [0.0] * _RING
        self.ends = [0.0] * _RING
        self.totals: tuple[int, float, float] = (0, 0.0, 0.0)

    def fold(self) -> None:
        """Add the lap just recorded (all ``SAMPLES_KEPT`` entries) to ``totals``."""
        folded, wait, run = self.totals
        started = math.fsum(self.starts)
        self.totals = (
            folded + _RING,
            wait + (started - math.fsum(self.subs)),
            run + (math.fsum(self.ends) - started),
        )

    def finish(self, n: int, submitted_at: float, start: float, end: float) -> None:
        """Record the ``n``-th task (``_monitored_worker`` inlines this)."""
        i = n & _MASK
        self.subs[i] = submitted_at
        self.starts[i] = start
        self.ends[i] = end
        if i == _MASK:
            self.fold()
        self.completed = n + 1

    def finish_failed(self, n: int, submitted_at: float, start: float) -> None:
        """Record the ``n``-th task, which raised."""
        self.finish(n, submitted_at, start, _monotonic())
        self.failed += 1

    def read(
        self, waits: list[float] | None = None, runs: list[float] | None = None,
    ) -> tuple[int, int, int, float, float]:
        """``(failed, completed, started, wait total, run total)``, consistent, while the
        thread may be running tasks; appends the most recent samples to ``waits``/``runs``.

        The figures are read in the reverse order of the writes (so ``failed <= completed <=
        started``), the three lists copied whole (each copy is atomic under the GIL). Tasks
        before ``completed`` have their entries written; an entry is only overwritten by the
        task ``SAMPLES_KEPT`` later, which has not started if ``started <= n +
        SAMPLES_KEPT``: so the lap not folded into ``totals`` yet is intact when ``started <=
        folded + SAMPLES_KEPT`` (else read again: the thread lapped the ring meanwhile), and
        the samples of tasks ``started - SAMPLES_KEPT`` to ``completed`` are whole.
        """
        while True:
            failed = self.failed
            folded, wait, run = self.totals
            done = self.completed
            subs, starts, ends = self.subs[:], self.starts[:], self.ends[:]
            started = self.started
            if started <= folded + _RING:
                break
        k = done - folded  # tasks folded .. done-1 sit at indices 0 .. k-1
        if k:
            began = math.fsum(starts[:k])
            wait += began - math.fsum(subs[:k])
            run += math.fsum(ends[:k]) - began
        if waits is not None and runs is not None:
            for n in range(max(0, started - _RING), done):
                i = n & _MASK
                waits.append(starts[i] - subs[i])
                runs.append(ends[i] - starts[i])
        return failed, done, started, wait, run


def _monitored_worker(
    executor_reference: weakref.ref[Any], work_queue: Any,
    initializer: Callable[..., object] | None, initargs: tuple[Any, ...],
    monitor_reference: weakref.ref[MonitoredExecutor],
) -> None:
    """The stdlib ``concurrent.futures.thread._worker`` loop, with its monitor's tasks inlined.

    A stdlib pool wrapped by a ``MonitoredExecutor`` starts its new threads on this function
    (see ``_adjust_monitored_threads``). The thread's ``_ThreadStats`` is a local variable here,
    so a task of that monitor costs no thread-local lookup and no ``run()`` frame; other work
    items (submitted to the pool directly, or through another monitor) run as the stdlib runs
    them. Exit and initializer failure are the stdlib's, and so is idle accounting while the
    pool is below its size; a full pool starts no thread, so its workers skip the idle-thread
    semaphore (as ``_adjust_monitored_threads`` does), which no one reads then. Like the stdlib
    worker, it holds only weak references to the pool and to the monitor, so a pool dropped
    without ``shutdown`` still lets its threads exit, and it drops each task (callable,
    arguments, result, Future) before it waits for the next.
    """
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException:  # noqa: BLE001 - as the stdlib worker
            _cfb.LOGGER.critical("Exception in initializer:", exc_info=True)
            executor = executor_reference()
            if executor is not None:
                executor._initializer_failed()
            return
    mon = monitor_reference()
    if mon is None:
        st = _ThreadStats(threading.current_thread())  # counted nowhere: nobody can read it
    else:
        st = mon._register_thread()
    del mon
    executor = executor_reference()
    if executor is None:
        return
    idle = executor._idle_semaphore.release
    threads, most = executor._threads, executor._max_workers
    del executor
    get = work_queue.get
    subs, starts, ends = st.subs, st.starts, st.ends
    clock = _monotonic
    try:
        while True:
            item = get(block=True)
            if item is not None:
                if type(item) is _TimedWorkItem and item.mon._wref is monitor_reference:
                    future = item.future
                    if future.set_running_or_notify_cancel():
                        n = st.started
                        st.started = n + 1
                        start = clock()
                        try:
                            result = item.fn(*item.args, **item.kwargs)
                        except BaseException as exc:  # noqa: BLE001 - the task's outcome
                            st.finish_failed(n, item.submitted_at, start)
                            future.set_exception(exc)
                        else:
                            end = clock()
                            i = n & _MASK  # as _ThreadStats.finish, inlined
                            subs[i] = item.submitted_at
                            starts[i] = start
                            ends[i] = end
                            if i == _MASK:
                                st.fold()
                            st.completed = n + 1
                            future.set_result(result)
                            del result
                    # drop the task (and break the cycle frame -> future -> exc -> frame)
                    del future
                else:
                    item.run()
                del item
                if len(threads) < most:
                    idle()
                continue
            executor = executor_reference()
            # exit as the stdlib worker does: interpreter shutdown, pool collected or shut down
            if _cft._shutdown or executor is None or executor._shutdown:
                if executor is not None:
                    executor._shutdown = True
                work_queue.put(None)
                return
            del executor
    except BaseException:  # noqa: BLE001 - as the stdlib worker
        _cfb.LOGGER.critical("Exception in worker", exc_info=True)


class _MonitoredThreadCount:
    """Replaces ``_adjust_thread_count`` on a stdlib pool instance a ``MonitoredExecutor``
    wraps, so whoever submits to the pool starts its new threads on ``_monitored_worker``.

    It holds weak references only, so the pool and the monitor are freed as before.
    """

    __slots__ = ("executor_reference", "monitor_reference")

    def __init__(
        self, executor: Executor, monitor_reference: weakref.ref[MonitoredExecutor],
    ) -> None:
        self.executor_reference: weakref.ref[Any] = weakref.ref(executor)
        self.monitor_reference = monitor_reference

    def __call__(self) -> None:
        executor = self.executor_reference()
        if executor is not None:
            _adjust_monitored_threads(executor, self.monitor_reference)


def _adjust_monitored_threads(
    self: Any, monitor_reference: weakref.ref[MonitoredExecutor],
) -> None:
    """``ThreadPoolExecutor._adjust_thread_count`` (CPython 3.9 to 3.13), starting threads on
    ``_monitored_worker``.

    A full pool returns at once: the stdlib's version would take an idle token (a lock and,
    with none left, a ``Condition.wait(0)``) only to start nothing. The pool's threads never
    retire, so a full pool stays full; tokens left over from before are never read.
    """
    if len(self._threads) >= self._max_workers:
        return
    if self._idle_semaphore.acquire(timeout=0):
        return

    def weakref_cb(_: object, q: Any = self._work_queue) -> None:
        q.put(None)

    num_threads = len(self._threads)
    if num_threads < self._max_workers:
        thread_name = f"{self._thread_name_prefix or self}_{num_threads}"
        t = threading.Thread(
            name=thread_name, target=_monitored_worker,
            args=(weakref.ref(self, weakref_cb), self._work_queue, self._initializer,
                  self._initargs, monitor_reference),
        )
        t.start()
        self._threads.add(t)
        threads_queues: Any = _cft._threads_queues
        threads_queues[t] = self._work_queue


class MonitoredExecutor(Executor):
    """Counts the tasks of any executor: submitted, queued, active, completed, failed, timings.

    Args:
        executor: The executor to wrap (stdlib thread or process pools, loky, dask's
            ``ClientExecutor``, a :class:`~taskflow.pool.ThreadPool`, ...). ``submit`` and
            ``shutdown`` are passed through; the wrapper is itself an Executor, so flows run
            on it.
        name: The pool's name in metrics; defaults to the inner type's name and a number.
        in_process: Whether tasks run in threads of this process. Then each task runs inside a
            small wrapper that times it and counts it active while it runs, with per-thread
            counters so worker threads never contend on a lock (the cost: well under a
            microsecond per task). Otherwise (process pools, remote executors) the callable is
            passed through untouched, so it pickles as before, and outcomes are counted by a
            done-callback (run by whichever thread completes the Future): the timings are
            ``None`` and ``active_count`` comes from ``Future.running()`` where the executor
            reports it. Default: True for ``ThreadPoolExecutor`` and ``ThreadPool``.

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
        # a plain stdlib pool: tasks go straight onto its queue as _TimedWorkItems
        self._direct = (
            _STDLIB_FITS and isinstance(executor, ThreadPoolExecutor)
            and type(executor).submit is ThreadPoolExecutor.submit
            and type(executor)._adjust_thread_count is ThreadPoolExecutor._adjust_thread_count
        )
        self._wref = weakref.ref(self)
        if self._direct:
            # threads the pool starts from now on run _monitored_worker (those it has run
            # the stdlib's worker, which calls _TimedWorkItem.run)
            executor._adjust_thread_count = _MonitoredThreadCount(  # type: ignore[attr-defined]
                executor, self._wref
            )
        self._name = name if name is not None else f"{type(executor).__name__}-{next(_monitor_seq)}"
        module = type(executor).__module__
        # dask futures never report running(); process pools mark queued calls running early
        self._running_known = not in_process and not module.startswith("distributed")
        self._tls = threading.local()  # .stats: the _ThreadStats of the current thread
        # in_process: the futures of tasks handed to the inner executor, some done since;
        # appended without a lock (deque appends are atomic), scanned under _lock for Futures
        # cancelled before their task started (those never run, so nothing else counts them)
        self._waiting: deque[Future[Any]] = deque()
        self._scan_at = 1 << 16
        # tasks submitted, counted without a lock: next() on it is atomic; a reader calls
        # next() too (under _lock), and subtracts the calls readers made (_peeks)
        self._submitted = itertools.count()
        self._peeks = 0
        # _lock guards every field below
        self._lock = threading.Lock()
        self._shutdown = False
        self._cancelled = 0
        self._rejected = 0
        self._completed = 0  # not in_process (done-callbacks); in_process: retired threads
        self._failed = 0
        self._retired_started = 0
        self._retired_wait_total = 0.0
        self._retired_run_total = 0.0
        self._stats: list[_ThreadStats] = []
        # Futures of abandoned tasks not seen finished yet -> counted in _abandoned_total yet
        self._abandoned: dict[Future[Any], bool] = {}
        self._abandoned_total = 0
        self._largest_seen = 0
        # not in_process: the inner futures not done yet, to ask them running()
        self._pending: dict[int, Future[Any]] = {}
        _fork.register(self, hold="_lock")  # the child starts its counts over

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
            Exception: whatever the inner executor's ``submit`` raises (counted as a rejection).
        """
        if self._direct:
            # ThreadPoolExecutor.submit of the inner stdlib pool, inlined, with a
            # _TimedWorkItem: one call frame per task, as the bare pool has
            inner: Any = self._inner
            with inner._shutdown_lock, _cft._global_shutdown_lock:
                next(self._submitted)  # counted before it can start: queued is never negative
                if inner._broken or inner._shutdown or _cft._shutdown:
                    self._reject_direct(inner)
                direct = _MonitoredFuture()
                direct._taskflow_monitor = self
                inner._work_queue.put(_TimedWorkItem(direct, fn, args, kwargs, self, _monotonic()))
                _adjust_monitored_threads(inner, self._wref)
            return direct
        next(self._submitted)  # counted before it can start: queued is never negative
        item: _Tracked | None = None
        try:
            if self._in_process:
                future: Future[Any] = self._inner.submit(self._run, fn, args, kwargs, _monotonic())
            else:
                item = _Tracked(self)
                future = self._inner.submit(fn, *args, **kwargs)
        except BaseException:
            with self._lock:
                if item is not None:
                    item.state = _DONE
                self._rejected += 1
            raise
        try:
            future._taskflow_monitor = self  # type: ignore[attr-defined]
        except AttributeError:  # a future class with __slots__: mark_abandoned ignores it
            pass
        if item is None:
            waiting = self._waiting
            waiting.append(future)
            if len(waiting) > self._scan_at:
                self._scan_cancelled()
        else:
            with self._lock:
                if item.state != _DONE:
                    self._pending[id(item)] = future
            future.add_done_callback(item.done)
        return future

    def _reject_direct(self, inner: Any) -> NoReturn:
        """Count and raise the refusal of a task by a broken or shut-down stdlib pool."""
        with self._lock:
            self._rejected += 1
        if inner._broken:
            raise _cft.BrokenThreadPool(inner._broken)
        raise RuntimeError(
            "cannot schedule new futures after shutdown" if inner._shutdown
            else "cannot schedule new futures after interpreter shutdown"
        )

    def _run(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        submitted_at: float,
    ) -> Any:
        """Run one task in the inner executor's thread (in_process); the monitored hot path.

        A few writes to fields only this thread writes and two clock reads; no lock (see
        ``_ThreadStats``).
        """
        try:
            st: _ThreadStats = self._tls.stats
        except AttributeError:
            st = self._register_thread()
        n = st.started
        st.started = n + 1
        start = _monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            st.finish_failed(n, submitted_at, start)
            raise
        st.finish(n, submitted_at, start, _monotonic())
        return result

    def _scan_cancelled(self) -> None:
        """Count tasks cancelled before they started; forget the futures of the others."""
        waiting = self._waiting
        keep = waiting.append
        with self._lock:
            # popleft the entries there now; submitters may append meanwhile (to the right)
            for _ in range(len(waiting)):
                future = waiting.popleft()
                if future.cancelled():  # a cancelled Future never runs its task
                    self._cancelled += 1
                elif not future.done():
                    keep(future)
            self._scan_at = max(1 << 16, 2 * len(waiting))

    def _register_thread(self) -> _ThreadStats:
        st = _ThreadStats(threading.current_thread())
        self._tls.stats = st
        with self._lock:
            # fold the counts of threads that have exited, so the list stays short
            for old in [s for s in self._stats if not s.thread.is_alive()]:
                self._retire_stats_locked(old)
            self._stats.append(st)
        return st

    def _retire_stats_locked(self, old: _ThreadStats) -> None:
        self._stats.remove(old)
        failed, completed, started, wait_total, run_total = old.read()
        self._retired_started += started
        self._completed += completed
        self._failed += failed
        self._retired_wait_total += wait_total
        self._retired_run_total += run_total

    def mark_abandoned(self, future: Future[Any]) -> None:
        """Count ``future``'s task as abandoned while it still runs (see ``ThreadPool``).

        A task still queued is counted if it starts; out of process, a task not done yet
        counts as running. A finished task, or a future of another executor, is ignored.
        """
        if getattr(future, "_taskflow_monitor", None) is not self:
            return
        with self._lock:
            if future in self._abandoned or future.done():
                return
            counted = future.running() or not self._in_process
            self._abandoned[future] = counted
            if counted:
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

    def _after_fork_in_child(self) -> None:
        """In a forked child: fresh counters (the inner pool's threads are the parent's)."""
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._waiting = deque()
        self._submitted = itertools.count()
        self._peeks = self._cancelled = self._rejected = self._completed = self._failed = 0
        self._retired_started = 0
        self._retired_wait_total = self._retired_run_total = 0.0
        self._stats = []
        self._abandoned = {}
        self._abandoned_total = self._largest_seen = 0
        self._pending = {}

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
            for st in self._stats:
                st_failed, st_done, st_started, st_wait, st_run = st.read(waits, runs)
                failed += st_failed
                completed += st_done
                started += st_started
                wait_total += st_wait
                run_total += st_run
            pending = list(self._pending.values())
            ab_running = 0
            for future, counted in list(self._abandoned.items()):
                if future.cancelled():
                    del self._abandoned[future]  # it never ran
                    continue
                done = future.done()
                began = done or future.running()
                if began and not counted:
                    self._abandoned[future] = True  # it started after it was marked
                    self._abandoned_total += 1
                if done:
                    del self._abandoned[future]
                elif began or not self._in_process:
                    ab_running += 1
            tasks = next(self._submitted) - self._peeks  # after the threads' counts (above)
            self._peeks += 1
            cancelled, rejected = self._cancelled, self._rejected
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
            retired_worker_cpu_s=(
                base.retired_worker_cpu_s if base is not None
                else 0.0 if isinstance(inner, ThreadPoolExecutor)  # its threads never exit
                else None
            ),
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

AlarmKind = Literal["liveness", "queue_usage", "rejected", "abandoned", "queue_wait"]


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
    queue_wait_ratio: float | None = Field(default=1.0, gt=0)
    """Alarm when, over the tasks completed since the previous sample, time spent waiting in
    the queue reaches this multiple of time spent running: requests wait for the pool, which
    is too small for the load (see "Sizing the pool" in the README)."""
    queue_wait_min_s: float = Field(default=0.005, ge=0)
    """...and the average queue wait over those tasks is at least this long (so a pool of
    microsecond tasks does not alarm on microsecond waits)."""
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
    resilience: tuple[
        BulkheadMetrics | RateLimitMetrics | BreakerMetrics | SingleFlightMetrics, ...
    ] = ()
    """``metrics()`` of the bulkheads, rate limits and circuit breakers the monitor exports (see
    ``PoolMonitor``'s ``resilience``), in their order."""
    resilience_samples: tuple[Sample, ...] = Field(default=(), repr=False)
    """The same objects' Prometheus series, read in the same sample."""


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
        resilience: The bulkheads, rate limits, circuit breakers (and single flights) whose
            metrics each sample carries (``PoolSnapshot.resilience``) and the Prometheus output
            shows (series labelled ``bulkhead``, ``rate_limit``, ``breaker``, ``single_flight``;
            a breaker's state is the gauge ``taskflow_breaker_state``, 1 for its current
            state). ``None`` (the default): every ``Bulkhead``, ``RateLimit`` and
            ``CircuitBreaker`` alive in the process when the sample is taken (each registers
            itself when made; a second live object of the same kind and name is not
            registered, see :mod:`taskflow.resilience.export`). ``()``: none.

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
            thread.join(timeout)

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
        while not self._stop.wait(self._interval):
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
        now, mono = time.time(), time.monotonic()
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
        ``prometheus_client`` registry register a :class:`~taskflow.prometheus.PoolCollector`
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
