"""A JUC-style thread pool, and pool metrics for any executor.

``ThreadPool`` is a :class:`concurrent.futures.Executor` with the semantics of
``java.util.concurrent.ThreadPoolExecutor``. ``submit`` decides, in this order:

1. fewer than ``core_size`` threads: start a new thread for this task, even if others are idle;
2. otherwise offer the task to the queue (``queue_capacity=None``: unbounded; ``0``: a direct
   hand-off, accepted only when an idle thread is waiting, like a ``SynchronousQueue``);
3. queue full: start a thread above core, up to ``max_size``;
4. otherwise apply the :class:`RejectionPolicy`.

Threads above core (and every thread once ``max_size`` was lowered below the pool size) exit
after ``keep_alive`` seconds without work. ``set_core_size``/``set_max_size`` resize at run time.

How the pool works inside. The queue is a ``deque`` of futures guarded by the pool's one lock;
for every task appended a token is put on a ``queue.SimpleQueue``, which is only the doorbell idle
workers sleep on (a C-level blocking get, cheaper than a ``Condition``). A worker that finishes a
task counts it and takes the next queued one in the same lock section, then takes that task's
token without blocking; so a task costs one lock section in ``submit`` and one in the worker. A
worker woken for nothing (its token's task was taken, cancelled or evicted; a resize wake-up)
just waits again. A cancelled queued task leaves the counts at once and is dropped from the deque
when a worker reaches it. Every counter changes in the same lock section as the state it counts,
so a snapshot taken under the lock satisfies ``task_count == completed + cancelled + rejected +
active + queued`` at every instant. Counters are updated before a task's Future resolves: once
``future.result()`` returns, ``metrics()`` already counts that task. Queue-wait and run times go
into fixed-size ring buffers; percentiles are computed when a snapshot is taken, never per task.

A thread cannot be killed: a task still running after the flow that submitted it gave up is
*abandoned* (``mark_abandoned``), keeps its thread until it returns, and is counted in
``abandoned_running`` meanwhile.

``MonitoredExecutor`` wraps any executor (stdlib pools, loky, dask) and keeps the same counters;
figures it cannot know are ``None``.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from enum import Enum
from typing import Any, Final, ParamSpec, TypeVar

from loguru import logger
from pydantic import BaseModel, ConfigDict

from taskflow.errors import RejectedExecutionError

__all__ = [
    "MonitoredExecutor",
    "Percentiles",
    "PoolMetrics",
    "RejectionPolicy",
    "ThreadPool",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# ring buffer size for queue-wait/run-time samples; a power of two so the index is a mask
_RING: Final = 1024
_MASK: Final = _RING - 1

# task states, guarded by the owning pool's lock
_QUEUED: Final = 0  # in the deque, not started
_RUNNING: Final = 1  # taken by (or handed to) a worker thread
_DONE: Final = 2  # finished, or cancelled after a worker took it
_CLAIMED: Final = 3  # cancelled or evicted while queued; the deque entry is garbage
_RETIRE: Final = -1.0  # a worker's wait timeout meaning "this worker has exited"

_pool_seq = itertools.count()
_live_pools: weakref.WeakSet[ThreadPool] = weakref.WeakSet()
_interpreter_exiting = False


def _python_exit() -> None:
    """At interpreter exit, let every pool finish its queued work and its threads end."""
    global _interpreter_exiting
    _interpreter_exiting = True
    for pool in list(_live_pools):
        pool.shutdown(wait=False)


# Like concurrent.futures.thread: run before threading joins non-daemon threads, so idle workers
# wake up and exit instead of blocking interpreter exit. The hook never blocks.
_register_atexit: Callable[[Callable[[], None]], None] | None = getattr(
    threading, "_register_atexit", None
)
if _register_atexit is not None:
    _register_atexit(_python_exit)
else:  # pragma: no cover - CPython always has it since 3.9
    import atexit

    atexit.register(_python_exit)


class RejectionPolicy(str, Enum):
    """What ``ThreadPool.submit`` does when every thread is busy and the queue is full.

    The four ``RejectedExecutionHandler`` policies of ``java.util.concurrent``.
    """

    ABORT = "abort"
    """Raise :class:`~taskflow.errors.RejectedExecutionError` (JUC's default)."""
    CALLER_RUNS = "caller_runs"
    """Run the task in the submitting thread before ``submit`` returns."""
    DISCARD = "discard"
    """Drop the task: its Future is returned already cancelled."""
    DISCARD_OLDEST = "discard_oldest"
    """Cancel the oldest queued task and queue this one (drop this one if nothing is queued)."""


class Percentiles(BaseModel):
    """Distribution of the most recent samples (up to 1024), all figures in seconds."""

    model_config = ConfigDict(frozen=True)

    count: int
    min: float
    max: float
    avg: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, samples: list[float]) -> Percentiles | None:
        """Nearest-rank percentiles of ``samples``; ``None`` when there are none."""
        if not samples:
            return None
        s = sorted(samples)
        n = len(s)

        def rank(q: float) -> float:
            return s[min(n - 1, max(0, int(q * n + 0.999999) - 1))]

        return cls(
            count=n, min=s[0], max=s[-1], avg=sum(s) / n, p50=rank(0.50), p90=rank(0.90),
            p99=rank(0.99),
        )


class PoolMetrics(BaseModel):
    """An immutable snapshot of a pool: configuration, gauges, counters and recent timings.

    Counters (``*_count``, ``*_total``) never decrease. Each task submitted while the pool was
    open ends in exactly one of completed, cancelled or rejected, so at every snapshot
    ``task_count == completed_task_count + cancelled_task_count + rejected_count + active_count
    + queue_size`` (when the gauges are known). ``None`` means the figure cannot be known for
    this executor. ``active_count <= pool_size <= max_size`` holds except right after
    ``set_max_size`` lowered the maximum: busy threads above it exit when their task ends.
    """

    model_config = ConfigDict(frozen=True)

    # identity and configuration
    pool_name: str
    executor_type: str
    core_size: int | None
    max_size: int | None
    queue_capacity: int | None
    """``None``: unbounded (or unknown); ``0``: direct hand-off."""
    keep_alive_s: float | None
    rejection_policy: str | None
    # gauges
    pool_size: int | None
    largest_pool_size: int | None
    active_count: int | None
    queue_size: int | None
    queue_remaining_capacity: int | None
    abandoned_running: int
    """Tasks still running after the flow that submitted them gave up on them."""
    is_shutdown: bool
    is_terminated: bool | None
    # counters
    task_count: int
    """Tasks submitted while the pool was open, rejected ones included."""
    completed_task_count: int
    """Tasks that ran to the end on a pool thread, successfully or not."""
    failed_task_count: int
    """Completed tasks whose callable raised."""
    cancelled_task_count: int
    """Tasks cancelled before they started (by their Future, shutdown or ``DISCARD_OLDEST``)."""
    rejected_count: int
    """Tasks refused because the pool was saturated: raised (``ABORT``), run by the caller,
    dropped, or evicted by ``DISCARD_OLDEST``. ``ThreadPool`` does not count a submit after
    shutdown (it raises before the task is taken in); ``MonitoredExecutor`` counts every
    exception the inner ``submit`` raised."""
    abandoned_total: int
    # derived, percent; None when the denominator is unknown or unbounded
    liveness_pct: float | None
    """``active_count / max_size * 100`` (dynamic-tp liveness, hippo4j current load)."""
    peak_load_pct: float | None
    """``largest_pool_size / max_size * 100`` (hippo4j peak load)."""
    queue_usage_pct: float | None
    """``queue_size / queue_capacity * 100``; ``None`` for an unbounded queue."""
    # timings of the most recent tasks (seconds), plus cumulative sums over completed tasks
    queue_wait_s: Percentiles | None
    run_time_s: Percentiles | None
    queue_wait_total_s: float | None
    run_time_total_s: float | None
    # when
    timestamp: float
    """``time.time()`` of the snapshot."""
    monotonic: float
    """``time.monotonic()`` of the snapshot."""

    def __str__(self) -> str:
        state = "Terminated" if self.is_terminated else "Shutting down" if self.is_shutdown else "Running"
        return (
            f"{self.pool_name} [{state}, pool size = {_fmt(self.pool_size)}, "
            f"active threads = {_fmt(self.active_count)}, queued tasks = {_fmt(self.queue_size)}, "
            f"completed tasks = {self.completed_task_count}, failed = {self.failed_task_count}, "
            f"cancelled = {self.cancelled_task_count}, rejected = {self.rejected_count}, "
            f"abandoned running = {self.abandoned_running}]"
        )


def _fmt(value: int | None) -> str:
    return "?" if value is None else str(value)


def _pct(part: int | None, whole: int | None) -> float | None:
    if part is None or not whole:
        return None
    return part * 100.0 / whole


class _PoolFuture(Future[Any]):
    """A Future that also is the queue entry of its task.

    The fields below are guarded by the owning pool's lock (``_tstate``, ``_abandoned``) or
    written once before the future is published (the rest).
    """

    _pool: ThreadPool | None = None
    _tstate: int = _DONE
    _abandoned: bool = False
    _submitted_at: float = 0.0
    _fn: Callable[..., Any] | None = None
    _args: tuple[Any, ...] = ()
    _kwargs: dict[str, Any] | None = None

    def cancel(self) -> bool:
        """Cancel the task if it has not started; a queued task leaves the queue at once."""
        if not super().cancel():
            return False
        pool = self._pool
        if pool is not None and self._tstate == _QUEUED:
            pool._claim_cancelled(self)
        return True


class ThreadPool(Executor):
    """A thread pool with ``java.util.concurrent.ThreadPoolExecutor`` semantics.

    Args:
        core_size: Threads kept even when idle. Below it every submit starts a new thread.
        max_size: Most threads at once; defaults to ``max(core_size, 1)``. Threads above core
            are started only when the queue is full.
        queue_capacity: ``None`` for an unbounded queue (then the pool never grows past core,
            as in JUC), ``0`` for a direct hand-off to an idle thread, or a bound.
        keep_alive: Seconds a thread above core waits for work before it exits.
        rejection: What to do with a task when the pool is saturated (a
            :class:`RejectionPolicy` or its value, e.g. ``"caller_runs"``).
        thread_name_prefix: Threads are named ``f"{prefix}-{n}_{i}"``.
        name: The pool's name in metrics; defaults to ``f"{prefix}-{n}"``.

    Raises:
        ValueError: ``core_size < 0``, ``max_size <= 0``, ``max_size < core_size``,
            ``queue_capacity < 0`` or ``keep_alive < 0`` (JUC's argument checks).

    Tasks run in the pool's threads; a Future's done-callbacks run in the thread that finished
    it (the submitting thread under ``CALLER_RUNS``). Threads are not daemons: call
    ``shutdown`` or use the pool as a context manager. At interpreter exit the pool is shut down
    without waiting, and the interpreter then waits for queued and running tasks, like the
    standard ``ThreadPoolExecutor``.
    """

    def __init__(
        self,
        core_size: int,
        max_size: int | None = None,
        *,
        queue_capacity: int | None = None,
        keep_alive: float = 60.0,
        rejection: RejectionPolicy | str = RejectionPolicy.ABORT,
        thread_name_prefix: str = "taskflow",
        name: str | None = None,
    ) -> None:
        if max_size is None:
            max_size = max(core_size, 1)
        _check_sizes(core_size, max_size)
        if queue_capacity is not None and queue_capacity < 0:
            raise ValueError(f"queue_capacity must be None or >= 0, got {queue_capacity!r}")
        if keep_alive < 0:
            raise ValueError(f"keep_alive must be >= 0 seconds, got {keep_alive!r}")
        self._rejection = RejectionPolicy(rejection)
        seq = next(_pool_seq)
        self._thread_prefix = f"{thread_name_prefix}-{seq}"
        self._name = name if name is not None else self._thread_prefix
        # unbounded is stored as a huge bound so the hot path compares ints only
        self._bounded = queue_capacity is not None
        self._capacity: int = queue_capacity if queue_capacity is not None else 1 << 62
        self._keep_alive = float(keep_alive)
        # doorbell for idle workers: one token per queued task, plus wake-ups (see module doc)
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._thread_ids = itertools.count()

        # _lock guards every field below: sizes, the deque and its counts, the thread set, the
        # counters, the ring buffers, and each queued future's _tstate/_abandoned.
        self._lock = threading.Lock()
        self._core_size = core_size
        self._max_size = max_size
        self._queue: deque[_PoolFuture] = deque()
        self._queued = 0  # live (not cancelled) entries in _queue
        self._garbage = 0  # cancelled entries still in _queue
        self._idle = 0  # workers waiting for a token
        self._pool_size = 0
        self._largest_pool_size = 0
        self._threads: set[threading.Thread] = set()
        self._active = 0
        self._shutdown = False
        self._task_count = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._rejected = 0
        self._abandoned_running = 0
        self._abandoned_total = 0
        self._samples = 0
        self._waits = [0.0] * _RING
        self._runs = [0.0] * _RING
        self._wait_total = 0.0
        self._run_total = 0.0

        self._max_workers = max_size  # read by the engine to guess parallelism
        _live_pools.add(self)

    # ------------------------------------------------------------------ configuration
    @property
    def name(self) -> str:
        """The pool's name in metrics and logs."""
        return self._name

    @property
    def core_size(self) -> int:
        """Threads kept alive even when idle."""
        return self._core_size

    @property
    def max_size(self) -> int:
        """Most threads the pool may run at once."""
        return self._max_size

    @property
    def queue_capacity(self) -> int | None:
        """Bound of the queue; ``None`` when unbounded, ``0`` for a direct hand-off."""
        return self._capacity if self._bounded else None

    @property
    def keep_alive(self) -> float:
        """Seconds an idle thread above core waits for work before it exits."""
        return self._keep_alive

    @property
    def rejection(self) -> RejectionPolicy:
        """The policy applied when the pool is saturated."""
        return self._rejection

    def set_core_size(self, core_size: int) -> None:
        """Change the number of core threads at run time (JUC ``setCorePoolSize``).

        Growing starts threads at once for tasks waiting in the queue (at most one per queued
        task, up to the new core); shrinking lets idle threads above the new core exit after
        ``keep_alive`` without work (an idle core thread notices the change within
        ``keep_alive``, or 1 s when it is 0).

        Raises:
            ValueError: ``core_size < 0`` or ``core_size > max_size``.
        """
        with self._lock:
            _check_sizes(core_size, self._max_size)
            delta = core_size - self._core_size
            self._core_size = core_size
            wake = 0
            if self._pool_size > core_size:
                wake = self._idle  # idle core waiters re-evaluate: they now time out
            elif delta > 0:
                # like JUC: at most one new core thread per queued task, up to the new core
                for _ in range(min(delta, self._queued, core_size - self._pool_size)):
                    self._add_worker_locked(None)
        for _ in range(wake):
            self._tokens.put(None)
        logger.debug("pool {} core size {} -> {}", self._name, core_size - delta, core_size)

    def set_max_size(self, max_size: int) -> None:
        """Change the maximum number of threads at run time (JUC ``setMaximumPoolSize``).

        Shrinking makes idle threads above the new maximum exit at once and busy ones when
        their task ends.

        Raises:
            ValueError: ``max_size <= 0`` or ``max_size < core_size``.
        """
        with self._lock:
            _check_sizes(self._core_size, max_size)
            old = self._max_size
            self._max_size = max_size
            self._max_workers = max_size
            wake = self._idle if self._pool_size > max_size else 0
        for _ in range(wake):
            self._tokens.put(None)
        logger.debug("pool {} max size {} -> {}", self._name, old, max_size)

    def prestart_core_threads(self) -> int:
        """Start all core threads now instead of on demand; return how many were started."""
        started = 0
        with self._lock:
            if self._shutdown:
                return 0
            while self._pool_size < self._core_size:
                self._add_worker_locked(None)
                started += 1
        return started

    # ------------------------------------------------------------------ submission
    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Schedule ``fn(*args, **kwargs)`` and return its Future.

        Under ``CALLER_RUNS`` a rejected task runs in this thread before ``submit`` returns; the
        budget of a flow cannot preempt it there. Under ``DISCARD`` and ``DISCARD_OLDEST`` the
        dropped task's Future is cancelled, so nobody waits on it forever.

        Raises:
            RejectedExecutionError: the pool is saturated under ``ABORT``, or shut down (a
                ``RuntimeError``, like the standard executors raise).
        """
        f = _PoolFuture()
        f._fn = fn
        f._args = args
        f._kwargs = kwargs
        f._pool = self
        evicted: _PoolFuture | None = None
        queued = False
        busy = waiting = 0
        with self._lock:
            if self._shutdown:
                raise RejectedExecutionError(
                    "cannot schedule new futures after interpreter shutdown"
                    if _interpreter_exiting
                    else "cannot schedule new futures after shutdown"
                )
            self._task_count += 1
            f._submitted_at = time.monotonic()
            if self._pool_size < self._core_size:
                self._start_with_locked(f)
                return f
            # capacity 0 is a hand-off: accepted while an idle worker is free to take it
            if self._queued < (self._capacity or self._idle):
                f._tstate = _QUEUED
                self._queue.append(f)
                self._queued += 1
                queued = True
                if self._pool_size == 0:  # core_size 0: keep one thread for queued work
                    self._add_worker_locked(None)
            elif self._pool_size < self._max_size:
                self._start_with_locked(f)
                return f
            else:
                self._rejected += 1
                if self._rejection is RejectionPolicy.DISCARD_OLDEST and self._capacity:
                    evicted = self._poll_locked()
                if evicted is None:
                    busy, waiting = self._active, self._queued
                else:
                    # the evicted task is the rejected one; this one takes a place in the queue
                    evicted._tstate = _CLAIMED
                    f._tstate = _QUEUED
                    self._queue.append(f)
                    self._queued += 1
                    queued = True
        if queued:
            if evicted is None:
                self._tokens.put(None)
            else:  # the new task reuses the evicted task's token
                _cancel_and_notify(evicted)
                logger.debug("pool {} saturated: evicted the oldest queued task", self._name)
            return f
        return self._reject(f, busy, waiting)

    def _reject(self, f: _PoolFuture, busy: int, waiting: int) -> Future[Any]:
        """Apply the rejection policy to a task the pool refused (outside the lock)."""
        policy = self._rejection
        if policy is RejectionPolicy.ABORT:
            _release(f)
            raise RejectedExecutionError(
                f"pool {self._name!r} saturated ({busy} threads busy, {waiting} tasks queued, "
                f"max_size={self._max_size}); task rejected"
            )
        if policy is RejectionPolicy.CALLER_RUNS:
            logger.debug("pool {} saturated: task runs in the caller", self._name)
            _run_inline(f)
            return f
        logger.debug("pool {} saturated: task discarded", self._name)
        _cancel_and_notify(f)
        return f

    def _start_with_locked(self, f: _PoolFuture) -> None:
        """Start a new thread whose first task is ``f``."""
        f._tstate = _RUNNING
        self._active += 1
        try:
            self._add_worker_locked(f)
        except RuntimeError as exc:  # "can't start new thread"
            f._tstate = _DONE
            self._active -= 1
            self._rejected += 1
            raise RejectedExecutionError(f"pool {self._name!r} cannot start a thread") from exc

    def _add_worker_locked(self, first: _PoolFuture | None) -> None:
        t = threading.Thread(
            target=self._work,
            args=(first,),
            name=f"{self._thread_prefix}_{next(self._thread_ids)}",
        )
        self._threads.add(t)
        self._pool_size += 1
        # started under the lock so shutdown(wait=True) never sees an unstarted thread; this
        # happens only while the pool grows
        try:
            t.start()
        except BaseException:
            self._threads.discard(t)
            self._pool_size -= 1
            raise
        self._largest_pool_size = max(self._largest_pool_size, self._pool_size)

    def _poll_locked(self) -> _PoolFuture | None:
        """Pop the oldest live queued task, dropping cancelled entries on the way."""
        q = self._queue
        while q:
            f = q.popleft()
            if f._tstate == _QUEUED:
                self._queued -= 1
                return f
            self._garbage -= 1
        return None

    def _claim_cancelled(self, f: _PoolFuture) -> None:
        """A queued future was cancelled by its holder: take it out of the counts."""
        with self._lock:
            if f._tstate != _QUEUED:
                return  # a worker took it (and will see the cancel) or shutdown claimed it
            f._tstate = _CLAIMED
            self._queued -= 1
            self._cancelled += 1
            self._garbage += 1
            if self._garbage > 64 and self._garbage * 2 > len(self._queue):
                self._queue = deque(x for x in self._queue if x._tstate == _QUEUED)
                self._garbage = 0
        _release(f)
        f.set_running_or_notify_cancel()  # only the claimer notifies wait()/as_completed()

    # ------------------------------------------------------------------ workers
    def _work(self, first: _PoolFuture | None) -> None:
        """A worker thread: run the first task, then queued ones until it retires.

        After a task it takes the next queued one in the same lock section that counts the
        finished one (and then the token of that task, if no other worker holds it); it waits
        for a token only when the queue is empty.
        """
        lock = self._lock
        tokens = self._tokens
        mono = time.monotonic
        f = first
        nxt: _PoolFuture | float
        if f is None:
            with lock:
                nxt = self._next_locked(False)
        while True:
            if f is not None:
                fn, args, kwargs = f._fn, f._args, f._kwargs
                f._fn = None
                f._args = ()
                f._kwargs = None
                if f.set_running_or_notify_cancel():
                    assert fn is not None and kwargs is not None
                    start = mono()
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:  # noqa: BLE001 - the task's outcome, as in stdlib
                        nxt = self._finish(f, start, mono(), True)
                        f.set_exception(exc)
                        del exc
                    else:
                        nxt = self._finish(f, start, mono(), False)
                        f.set_result(result)
                        del result
                else:
                    with lock:
                        f._tstate = _DONE
                        self._active -= 1
                        self._cancelled += 1
                        if f._abandoned:
                            self._abandoned_running -= 1
                        nxt = self._next_locked(False)
                del fn, args, kwargs
            if isinstance(nxt, _PoolFuture):
                f = nxt
                try:  # its token: a worker woken by it would find nothing to do
                    tokens.get_nowait()
                except queue.Empty:
                    pass
                continue
            if nxt == _RETIRE:
                return
            try:
                tokens.get(True, nxt)
            except queue.Empty:
                timed_out = True
            else:
                timed_out = False
            with lock:
                self._idle -= 1
                nxt = self._next_locked(timed_out)
            f = None

    def _finish(self, f: _PoolFuture, start: float, end: float, failed: bool) -> _PoolFuture | float:
        """Count a task that ran, then take the next one (see ``_next_locked``)."""
        with self._lock:
            f._tstate = _DONE
            self._active -= 1
            self._completed += 1
            if failed:
                self._failed += 1
            if f._abandoned:
                self._abandoned_running -= 1
            i = self._samples & _MASK
            self._samples += 1
            wait = start - f._submitted_at
            run = end - start
            self._waits[i] = wait
            self._runs[i] = run
            self._wait_total += wait
            self._run_total += run
            return self._next_locked(False)

    def _next_locked(self, timed_out: bool) -> _PoolFuture | float:
        """What an idle worker does next: a queued task to run, or retire, or wait.

        Args:
            timed_out: The worker's last wait for a token timed out.

        Returns:
            The task to run (already counted active), ``_RETIRE`` if the worker has retired,
            or the timeout of its wait for a token (it is counted idle).
        """
        size = self._pool_size
        if size > self._max_size and (size > 1 or not self._queued):
            self._retire_locked()
            return _RETIRE
        f = self._poll_locked()
        if f is not None:
            f._tstate = _RUNNING
            self._active += 1
            if f._abandoned:
                self._abandoned_running += 1
                self._abandoned_total += 1
            return f
        if self._shutdown or (timed_out and size > self._core_size):
            self._retire_locked()
            return _RETIRE
        self._idle += 1
        if size > self._core_size:
            return self._keep_alive
        # A core thread waits for a token, but not forever: the wake-up tokens that resizing
        # puts are anonymous, and one thread may take several, so every idle thread re-reads
        # the sizes at least this often (JUC interrupts its idle workers instead).
        return self._keep_alive or 1.0

    def _retire_locked(self) -> None:
        self._pool_size -= 1
        self._threads.discard(threading.current_thread())
        if self._shutdown or self._pool_size > self._max_size:
            self._tokens.put(None)  # pass the wake-up on to the next idle worker

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks; queued tasks still run unless ``cancel_futures``.

        Args:
            wait: Block until every thread has exited (queued and running tasks finished).
                Called from one of the pool's own threads, that thread is not waited for.
            cancel_futures: Cancel every task still in the queue (counted as cancelled).
        """
        cancelled: list[_PoolFuture] = []
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while (f := self._poll_locked()) is not None:
                    f._tstate = _CLAIMED
                    self._cancelled += 1
                    cancelled.append(f)
                self._queue.clear()
                self._garbage = 0
        self._tokens.put(None)
        for f in cancelled:
            _cancel_and_notify(f)
        _live_pools.discard(self)
        if wait:
            self.await_termination()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the pool is shut down and every thread has exited.

        Args:
            timeout: Seconds to wait at most; ``None`` waits as long as it takes.

        Returns:
            True if the pool terminated, False if the timeout passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        while True:
            with self._lock:
                if not self._shutdown:
                    threads: list[threading.Thread] = []
                else:
                    threads = [t for t in self._threads if t is not me]
                shut = self._shutdown
            if not shut:
                if deadline is None:
                    raise RuntimeError("await_termination() before shutdown() would wait forever")
                time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
            elif not threads:
                return True
            for t in threads:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                t.join(remaining)
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    return self._shutdown and not (self._threads - {me})

    @property
    def is_shutdown(self) -> bool:
        """True once ``shutdown`` was called."""
        return self._shutdown

    @property
    def is_terminated(self) -> bool:
        """True once the pool is shut down and all its threads have exited."""
        with self._lock:
            return self._shutdown and self._pool_size == 0

    # ------------------------------------------------------------------ monitoring
    def mark_abandoned(self, future: Future[Any]) -> None:
        """Count ``future``'s task as abandoned: its flow gave up while it still runs.

        The task keeps its thread until it returns (a thread cannot be killed); it is counted in
        ``abandoned_running`` until then and once in ``abandoned_total``. A task still queued is
        counted if it starts; a finished one, or a future of another executor, is ignored.
        """
        if not isinstance(future, _PoolFuture) or future._pool is not self:
            return
        with self._lock:
            if future._abandoned:
                return
            state = future._tstate
            if state == _RUNNING:
                future._abandoned = True
                self._abandoned_running += 1
                self._abandoned_total += 1
            elif state == _QUEUED:
                future._abandoned = True

    def worker_native_ids(self) -> list[int]:
        """OS thread ids of the pool's live threads (to attribute CPU time with psutil)."""
        with self._lock:
            return [t.native_id for t in self._threads if t.native_id is not None]

    def metrics(self) -> PoolMetrics:
        """Take a consistent snapshot of the pool's sizes, counters and recent timings."""
        with self._lock:
            samples = self._samples
            waits = self._waits[:] if samples >= _RING else self._waits[:samples]
            runs = self._runs[:] if samples >= _RING else self._runs[:samples]
            core, max_size, size = self._core_size, self._max_size, self._pool_size
            largest, active, queued = self._largest_pool_size, self._active, self._queued
            shut = self._shutdown
            counts = (
                self._task_count, self._completed, self._failed, self._cancelled,
                self._rejected, self._abandoned_running, self._abandoned_total,
            )
            wait_total, run_total = self._wait_total, self._run_total
        tasks, completed, failed, cancelled, rejected, ab_running, ab_total = counts
        capacity = self.queue_capacity
        return PoolMetrics(
            pool_name=self._name,
            executor_type=type(self).__name__,
            core_size=core,
            max_size=max_size,
            queue_capacity=capacity,
            keep_alive_s=self._keep_alive,
            rejection_policy=self._rejection.value,
            pool_size=size,
            largest_pool_size=largest,
            active_count=active,
            queue_size=queued,
            queue_remaining_capacity=None if capacity is None else max(0, capacity - queued),
            abandoned_running=ab_running,
            is_shutdown=shut,
            is_terminated=shut and size == 0,
            task_count=tasks,
            completed_task_count=completed,
            failed_task_count=failed,
            cancelled_task_count=cancelled,
            rejected_count=rejected,
            abandoned_total=ab_total,
            liveness_pct=_pct(active, max_size),
            peak_load_pct=_pct(largest, max_size),
            queue_usage_pct=_pct(queued, capacity),
            queue_wait_s=Percentiles.of(waits),
            run_time_s=Percentiles.of(runs),
            queue_wait_total_s=wait_total,
            run_time_total_s=run_total,
            timestamp=time.time(),
            monotonic=time.monotonic(),
        )

    def __repr__(self) -> str:
        with self._lock:
            state = "Running" if not self._shutdown else "Shutting down" if self._pool_size else "Terminated"
            return (
                f"<ThreadPool {self._name!r} [{state}, pool size = {self._pool_size}, "
                f"active threads = {self._active}, queued tasks = {self._queued}, "
                f"completed tasks = {self._completed}]>"
            )


def _check_sizes(core_size: int, max_size: int) -> None:
    if core_size < 0:
        raise ValueError(f"core_size must be >= 0, got {core_size!r}")
    if max_size <= 0:
        raise ValueError(f"max_size must be > 0, got {max_size!r}")
    if max_size < core_size:
        raise ValueError(f"max_size ({max_size!r}) must be >= core_size ({core_size!r})")


def _cancel_and_notify(f: Future[Any]) -> None:
    """Cancel a future nobody will run, and release ``wait()``/``as_completed()`` waiters."""
    if isinstance(f, _PoolFuture):
        _release(f)
    f.cancel()
    f.set_running_or_notify_cancel()


def _release(f: _PoolFuture) -> None:
    """Drop a refused task's references to its callable and arguments."""
    f._fn = None
    f._args = ()
    f._kwargs = None


def _run_inline(f: _PoolFuture) -> None:
    """Run a task in the calling thread (``CALLER_RUNS``); its outcome goes to its Future."""
    fn, args, kwargs = f._fn, f._args, f._kwargs
    f._fn = None
    f._args = ()
    f._kwargs = None
    assert fn is not None and kwargs is not None
    if not f.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the task's outcome, as in stdlib
        f.set_exception(exc)
    else:
        f.set_result(result)


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
        self._name = name if name is not None else f"{type(executor).__name__}-{next(_pool_seq)}"
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
            Exception: whatever the inner executor's ``submit`` raises (counted as a rejection).
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
            liveness_pct=_pct(active_count, max_size),
            peak_load_pct=_pct(largest, max_size),
            queue_usage_pct=_pct(queue_size, capacity),
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
