"""A JUC-style thread pool, and pool metrics for any executor.

``ThreadPool`` is a ``concurrent.futures.Executor`` with the semantics of
``java.util.concurrent.ThreadPoolExecutor``. ``submit`` decides, in this order:

1. fewer than ``core_size`` threads: start a new thread for this task, even if others are idle
   (JUC's rule; the stdlib pool reuses an idle thread first);
2. otherwise offer the task to the queue (``queue_capacity=None``: unbounded; ``0``: a direct
   hand-off, accepted only when an idle thread is waiting, like a ``SynchronousQueue``);
3. queue full: start a thread above core, up to ``max_size``;
4. otherwise apply the [`RejectionPolicy`][taskflow.RejectionPolicy].

Threads above core (and every thread once ``max_size`` was lowered below the pool size) exit
after ``keep_alive`` seconds without work. ``set_core_size``/``set_max_size`` resize at run time.

How the pool works inside. The queue is a ``deque`` of futures guarded by the pool's one lock.
An idle worker *parks*: it pushes its own lock (held by itself) on the ``_parked`` stack, in the
same lock section that found the queue empty, and waits to acquire it again. ``submit`` appends
a task and, if a worker is parked, pops the last one parked and releases its lock: each queued
task wakes its own worker, so no worker idles while a task waits. Parked workers form a stack,
not a queue: the most recently idle thread (warm in the CPU's caches, often on the submitter's
CPU) runs the next task, and threads above core that stay at the bottom time out after
``keep_alive``, as in JUC. A worker that finishes a task takes the next queued one in the same
lock section that counts the finished one, so a task costs one lock section in ``submit`` and
one in the worker; a woken worker that finds the queue empty (a finishing worker took the task
first) parks again. A finishing worker does not block on a held lock at once: it yields the GIL
and retries (a bounded number of times, see ``_finish``), so the threads do not convoy on it.
Shutdown wakes every parked worker, lowering ``max_size`` the surplus ones; a core thread's
park times out now and then so that it notices a lowered ``core_size``. A cancelled queued task
leaves the counts at once (or in the next lock section, see below) and is dropped from the deque
when a worker reaches it. Every counter
changes in the same lock section as the state it counts, so a snapshot taken under the lock
satisfies ``task_count == completed + cancelled + rejected + active + queued`` at every instant.

Who waits for the lock. Workers and ``submit`` take it; the two calls a flow makes on its way
out at its deadline never wait for it: ``mark_abandoned`` and the cancel of a queued task try it
once, and if another thread holds it (under load that holder may itself be waiting for the GIL,
and a thread woken for a lock must win it again against every worker that spins on it) they
append their request to ``_deferred`` (no lock: a deque append) and return. The next lock
section of a worker finishing a task, of ``metrics()``, ``shutdown`` or a broken pool does the
deferred requests first (``_drain_locked``), so a mark is counted before its task can finish,
and a snapshot sees every request made before it was taken.
Counters are updated before a task's Future resolves: once ``future.result()`` returns,
``metrics()`` already counts that task. Queue-wait and run times go into fixed-size ring
buffers; percentiles are computed when a snapshot is taken, never per task.

Who holds the pool. A worker thread holds its pool strongly only while it runs a task or is in
a lock section of the pool; parked, it holds the pool's weak reference only (``_ref``), and a
queued task's Future holds the pool until the task finishes, is cancelled or is refused (then
``_pool`` is cleared). So a pool dropped without ``shutdown`` (``list(ThreadPool(4).map(f,
xs))``) runs what is queued, is collected once nothing runs, and the callback of ``_ref``
(``wake_parked``) wakes every parked thread, which finds the pool gone and exits; a held
Future of a finished task keeps nothing alive. ``_threads`` is replaced, never changed in place,
so code written for the stdlib pool may iterate a set it read while threads come and go.

Breaking and closing. A new thread first runs ``initializer(*initargs)``, if given; if that
raises, the pool is broken (``_broken``, set once under the lock): that thread's task and the
queue fail with ``BrokenPoolError`` and ``submit`` raises it from then on. ``submit`` on a pool
shut down raises ``RejectedExecutionError``; on one shut down at interpreter exit
(``_exit_shutdown``) it raises the stdlib's plain ``RuntimeError("cannot schedule new futures
after interpreter shutdown")``, which code running at exit expects.

A thread cannot be killed: a task still running after the flow that submitted it gave up is
*abandoned* (``mark_abandoned``), keeps its thread until it returns, and is counted in
``abandoned_running`` meanwhile.

Fork (``os.fork``, ``gunicorn --preload``, ``multiprocessing`` with the fork start method): the
child gets every pool back empty, with its configuration, no threads and fresh counters, and
starts threads on demand; tasks queued or running in the parent stay the parent's.

A task's Future and the worker loop are in ``taskflow.pools.workers``; the pool's metrics models
are in ``taskflow.metrics``; ``MonitoredExecutor`` (counts for any executor) is in
``taskflow.pools.monitored``.
"""

from __future__ import annotations

import concurrent.futures._base as _cfb
import itertools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from enum import Enum
from typing import Any, Final, ParamSpec, TypeVar

from taskflow import _fork, clock
from taskflow.errors import BrokenPoolError, RejectedExecutionError
from taskflow.logs import logger
from taskflow.metrics import SAMPLES_KEPT, Percentiles, PoolMetrics, pct
from taskflow.pools.workers import (
    CLAIMED,
    DONE,
    QUEUED,
    RETIRE,
    RUNNING,
    PoolFuture,
    cancel_and_notify,
    release,
    run_inline,
    wake_parked,
    work,
)

__all__ = ["RejectionPolicy", "ThreadPool"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_RING: Final = SAMPLES_KEPT
_MASK: Final = _RING - 1

_pool_seq = itertools.count()
_live_pools: weakref.WeakSet[ThreadPool] = weakref.WeakSet()  # not shut down yet
_interpreter_exiting = False
_yield = clock.real_sleep  # _yield(0) hands the GIL to another thread
_SPINS: Final = 64  # tries before a finishing worker blocks on the pool lock (see _finish)


def _python_exit() -> None:
    """At interpreter exit, let every pool finish its queued work and its threads end."""
    global _interpreter_exiting
    _interpreter_exiting = True
    for pool in list(_live_pools):
        pool._exit_shutdown = True
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
    """Raise [`RejectedExecutionError`][taskflow.errors.RejectedExecutionError] (JUC's default)."""
    CALLER_RUNS = "caller_runs"
    """Run the task in the submitting thread before ``submit`` returns."""
    DISCARD = "discard"
    """Drop the task: its Future is returned already cancelled."""
    DISCARD_OLDEST = "discard_oldest"
    """Cancel the oldest queued task and queue this one (drop this one if nothing is queued)."""


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
            [`RejectionPolicy`][taskflow.RejectionPolicy] or its value, e.g. ``"caller_runs"``).
        thread_name_prefix: Threads are named ``f"{prefix}-{n}_{i}"``.
        name: The pool's name in metrics; defaults to ``f"{prefix}-{n}"``.
        initializer: Called as ``initializer(*initargs)`` in each new thread before its first
            task, as ``ThreadPoolExecutor`` does. If it raises, the error is logged (CRITICAL,
            on the ``concurrent.futures`` logger, where the stdlib pool logs it) and the pool
            is *broken*: that thread's task and every queued one fail with
            [`BrokenPoolError`][taskflow.errors.BrokenPoolError] (a ``BrokenThreadPool``, counted
            rejected) and ``submit`` raises it from then on.
        initargs: The initializer's arguments.

    Raises:
        ValueError: ``core_size < 0``, ``max_size <= 0``, ``max_size < core_size``,
            ``queue_capacity < 0`` or ``keep_alive < 0`` (JUC's argument checks).
        TypeError: ``initializer`` is not callable.

    Tasks run in the pool's threads; a Future's done-callbacks run in the thread that finished
    it (the submitting thread under ``CALLER_RUNS``). Threads are not daemons: call
    ``shutdown`` or use the pool as a context manager. A pool dropped without ``shutdown``
    runs its queued tasks, then its threads exit (they hold the pool weakly, as the stdlib's
    do). At interpreter exit the pool is shut down without waiting, and the interpreter then
    waits for queued and running tasks, like the standard ``ThreadPoolExecutor``.
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
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r}")
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
        # how long an idle thread parks: above core keep_alive (-1: no limit, for a keep_alive
        # longer than a lock wait can be), a core thread at most that or 1 s (see _next_locked)
        self._park_s = self._keep_alive if self._keep_alive < threading.TIMEOUT_MAX else -1.0
        self._core_park_s = self._park_s or 1.0
        self._thread_ids = itertools.count()
        self._initializer = initializer
        self._initargs = tuple(initargs)

        # _lock guards every field below: sizes, the deque and its counts, the thread set, the
        # counters, the ring buffers, and each queued future's _tstate/_abandoned.
        self._lock = threading.Lock()
        self._core_size = core_size
        self._max_size = max_size
        self._queue: deque[PoolFuture] = deque()
        self._queued = 0  # live (not cancelled) entries in _queue
        self._garbage = 0  # cancelled entries still in _queue
        # idle workers, each parked on its own lock (held: acquiring it waits); the last one
        # parked is woken first (see the module docstring)
        self._parked: list[threading.Lock] = []
        # cancels (False) and abandon marks (True) made while another thread held the lock:
        # appended without it, done by the next lock section that drains it (_drain_locked)
        self._deferred: deque[tuple[PoolFuture, bool]] = deque()
        self._pool_size = 0
        self._largest_pool_size = 0
        # replaced, never changed in place: a reader may iterate what it read without the lock
        self._threads: frozenset[threading.Thread] = frozenset()
        self._active = 0
        # shut down at interpreter exit (then submit raises the stdlib's plain RuntimeError)
        self._exit_shutdown = _interpreter_exiting
        self._shutdown = self._exit_shutdown
        # set once, by the first thread whose initializer raised: what submit raises then
        self._broken: BrokenPoolError | None = None
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
        self._retired_cpu = 0.0  # CPU seconds of the threads that have exited

        # max_size under ThreadPoolExecutor's private name, for code written against the stdlib
        # pool; the engine reads max_size, and _max_workers only of a plain stdlib pool
        self._max_workers = max_size
        # the threads hold the pool through this reference only; its callback wakes them when
        # the pool is collected (_work)
        self._ref = weakref.ref(self, wake_parked(self._parked))
        if not self._shutdown:
            _live_pools.add(self)
        # its lock is held across a fork; the child gets the pool back empty
        _fork.register(self, hold="_lock")

    @classmethod
    def fixed(
        cls,
        max_workers: int | None = None,
        thread_name_prefix: str = "",
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> ThreadPool:
        """A pool of ``max_workers`` threads and an unbounded queue, built from
        ``ThreadPoolExecutor``'s arguments (JUC's ``Executors.newFixedThreadPool``).

        Code that builds a ``ThreadPoolExecutor`` switches by changing the name only: the
        arguments, their defaults, their checks and their errors are the stdlib's. The pool is
        a ``ThreadPool(max_workers, max_workers)`` otherwise, with two differences from the
        stdlib pool: until it has ``max_workers`` threads each task starts a new one (JUC's
        rule: core threads are started, not reused), and its threads are named
        ``f"{prefix}-{n}_{i}"``.

        Args:
            max_workers: Threads; default ``min(32, cpus + 4)``, as the stdlib's default.
            thread_name_prefix: Prefix of the threads' names (``"taskflow"`` when empty).
            initializer: Called in each new thread before its first task (see the class).
            initargs: The initializer's arguments.

        Raises:
            ValueError: ``max_workers <= 0``.
            TypeError: ``initializer`` is not callable.
        """
        if max_workers is None:
            cpus = getattr(os, "process_cpu_count", os.cpu_count)()
            max_workers = min(32, (cpus or 1) + 4)
        if max_workers <= 0:
            raise ValueError(f"max_workers must be greater than 0, got {max_workers!r}")
        return cls(
            max_workers, max_workers, thread_name_prefix=thread_name_prefix or "taskflow",
            initializer=initializer, initargs=initargs,
        )

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
        ``keep_alive`` without work (an idle thread notices the change when its park times
        out: within ``keep_alive``, or 1 s when that is 0).

        Raises:
            ValueError: ``core_size < 0`` or ``core_size > max_size``.
        """
        new: list[threading.Thread] = []
        with self._lock:
            _check_sizes(core_size, self._max_size)
            delta = core_size - self._core_size
            self._core_size = core_size
            # shrinking: idle threads stay parked (ready for a hand-off) until their park
            # times out, then see they are above core and exit (JUC: keepAlive after the change)
            if delta > 0 and self._pool_size < core_size:
                # like JUC: at most one new core thread per queued task, up to the new core
                for _ in range(min(delta, self._queued, core_size - self._pool_size)):
                    new.append(self._add_worker_locked(None))
        for t in new:
            self._launch(t, None)
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
            # wake as many idle threads as are above the new maximum (the longest idle): they
            # exit; the others stay parked, ready for a hand-off
            surplus = min(len(self._parked), max(0, self._pool_size - max_size))
            wake, self._parked[:surplus] = self._parked[:surplus], []
        for parker in wake:
            parker.release()
        logger.debug("pool {} max size {} -> {}", self._name, old, max_size)

    def prestart_core_threads(self) -> int:
        """Start all core threads now instead of on demand; return how many were started."""
        new: list[threading.Thread] = []
        with self._lock:
            if self._shutdown:
                return 0
            while self._pool_size < self._core_size:
                new.append(self._add_worker_locked(None))
        for t in new:
            self._launch(t, None)
        return len(new)

    def taskflow_load(self) -> tuple[int, int, int, bool]:
        """Busy workers, queued tasks, the most workers, and whether a submit now would be
        refused (a bounded queue that is full with every worker busy): what load shedding
        reads at ``start``. Read without the lock: gauges, each a single attribute read."""
        active, queued, max_size = self._active, self._queued, self._max_size
        capacity = self._capacity if self._bounded else None
        full = capacity is not None and queued >= capacity and active >= max_size
        return active, queued, max_size, full

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
        f = PoolFuture()
        f._fn = fn
        f._args = args
        f._kwargs = kwargs
        f._pool = self
        evicted: PoolFuture | None = None
        wake: threading.Lock | None = None
        start: threading.Thread | None = None  # registered under the lock, started after it
        queued = False
        busy = waiting = 0
        # read before the lock: every call made while holding the lock is a point where the
        # GIL can pass to a worker that then blocks on the lock (see _finish)
        f._submitted_at = clock.real_now()
        with self._lock:
            if self._shutdown or self._broken is not None:
                raise self._refusal()
            self._task_count += 1
            cap = self._capacity
            if self._pool_size < self._core_size:
                start = self._start_with_locked(f)
            # capacity 0 is a hand-off: accepted while an idle worker is free to take it
            elif (self._queued < cap) if cap else self._parked:
                f._tstate = QUEUED
                self._queue.append(f)
                self._queued += 1
                queued = True
                if self._parked:  # no thread idles while a task waits: wake the last parked
                    wake = self._parked.pop()
                elif self._pool_size == 0:  # core_size 0: keep one thread for queued work
                    start = self._add_worker_locked(None)
            elif self._pool_size < self._max_size:
                start = self._start_with_locked(f)
            else:
                self._rejected += 1
                if self._rejection is RejectionPolicy.DISCARD_OLDEST and self._capacity:
                    evicted = self._poll_locked()
                if evicted is None:
                    busy, waiting = self._active, self._queued
                else:
                    # the evicted task is the rejected one; this one takes a place in the queue
                    evicted._tstate = CLAIMED
                    f._tstate = QUEUED
                    self._queue.append(f)
                    self._queued += 1
                    queued = True
        if start is not None:
            self._launch(start, None if queued else f)
            return f
        if queued:
            if wake is not None:
                wake.release()
            if evicted is not None:  # the new task took the evicted one's place in the queue
                cancel_and_notify(evicted)
                logger.debug("pool {} saturated: evicted the oldest queued task", self._name)
            return f
        return self._reject(f, busy, waiting)

    def _refusal(self) -> Exception:
        """What ``submit`` raises once the pool takes no more tasks (as the stdlib pool does:
        broken first, then shut down, then the interpreter exiting)."""
        if self._broken is not None:
            error = BrokenPoolError(self._name, self._broken.cause)
            error.__cause__ = self._broken.cause
            return error
        if self._exit_shutdown:
            # the stdlib's exact error: code at exit catches this RuntimeError by its message
            return RuntimeError("cannot schedule new futures after interpreter shutdown")
        return RejectedExecutionError("cannot schedule new futures after shutdown")

    def _reject(self, f: PoolFuture, busy: int, waiting: int) -> Future[Any]:
        """Apply the rejection policy to a task the pool refused (outside the lock)."""
        policy = self._rejection
        if policy is RejectionPolicy.ABORT:
            release(f)
            raise RejectedExecutionError(
                f"pool {self._name!r} saturated ({busy} threads busy, {waiting} tasks queued, "
                f"max_size={self._max_size}); task rejected"
            )
        if policy is RejectionPolicy.CALLER_RUNS:
            logger.debug("pool {} saturated: task runs in the caller", self._name)
            run_inline(f)
            return f
        logger.debug("pool {} saturated: task discarded", self._name)
        cancel_and_notify(f)
        return f

    def _start_with_locked(self, f: PoolFuture) -> threading.Thread:
        """A new thread whose first task is ``f`` (registered; ``_launch`` starts it)."""
        f._tstate = RUNNING
        self._active += 1
        return self._add_worker_locked(f)

    def _add_worker_locked(self, first: PoolFuture | None) -> threading.Thread:
        """Register a new worker thread; the caller starts it after the lock (``_launch``).

        Starting a thread waits until the new thread runs, which under load means until it
        gets the GIL: done under the pool's lock, that wait would hold up every other thread
        that needs the lock (submitters, finishing workers, a flow at its deadline).
        """
        # in a list the thread empties: Thread keeps its args until the target returns
        t = threading.Thread(
            target=work,
            args=(self._ref, [first]),
            name=f"{self._thread_prefix}_{next(self._thread_ids)}",
        )
        self._threads = self._threads | {t}
        self._pool_size += 1
        self._largest_pool_size = max(self._largest_pool_size, self._pool_size)
        return t

    def _launch(self, t: threading.Thread, first: PoolFuture | None) -> None:
        """Start a thread registered by ``_add_worker_locked`` (never under the lock); if it
        cannot start, unregister it and refuse ``first``, its task."""
        try:
            t.start()
        except RuntimeError as exc:  # "can't start new thread"
            with self._lock:
                self._threads = self._threads - {t}
                self._pool_size -= 1
                if first is not None:
                    first._tstate = DONE
                    self._active -= 1
                    self._rejected += 1
            if first is None:
                raise
            release(first)
            raise RejectedExecutionError(f"pool {self._name!r} cannot start a thread") from exc

    def _poll_locked(self) -> PoolFuture | None:
        """Pop the oldest live queued task, dropping cancelled entries on the way."""
        q = self._queue
        while q:
            f = q.popleft()
            if f._tstate == QUEUED:
                self._queued -= 1
                return f
            self._garbage -= 1
        return None

    def _claim_cancelled(self, f: PoolFuture) -> None:
        """A queued future was cancelled by its holder: take it out of the counts.

        Never waits for the lock: if another thread holds it, the claim is left to the next
        lock section (``_deferred``); a worker that reaches the task first sees the cancel.
        """
        if not self._lock.acquire(False):
            self._deferred.append((f, False))
            return
        try:
            claimed = self._claim_locked(f)
        finally:
            self._lock.release()
        if claimed:
            release(f)
            f.set_running_or_notify_cancel()  # only the claimer notifies wait()/as_completed()

    def _claim_locked(self, f: PoolFuture) -> bool:
        """Take a cancelled queued task out of the counts; False if it left the queue already
        (a worker took it and sees the cancel, or shutdown claimed it)."""
        if f._tstate != QUEUED:
            return False
        f._tstate = CLAIMED
        self._queued -= 1
        self._cancelled += 1
        self._garbage += 1
        if self._garbage > 64 and self._garbage * 2 > len(self._queue):
            self._queue = deque(x for x in self._queue if x._tstate == QUEUED)
            self._garbage = 0
        return True

    def _mark_locked(self, f: PoolFuture) -> None:
        """Count ``f`` abandoned: now if it runs, when it starts if it is queued."""
        if f._abandoned:
            return
        state = f._tstate
        if state == RUNNING:
            f._abandoned = True
            self._abandoned_running += 1
            self._abandoned_total += 1
        elif state == QUEUED:
            f._abandoned = True

    def _drain_locked(self) -> None:
        """Do the cancels and marks other threads left while the lock was held.

        Notifying a claimed Future's waiters takes its condition under the pool's lock: the
        pool's lock is never taken while holding a Future's condition, so the order is safe.
        """
        deferred = self._deferred
        while deferred:
            f, mark = deferred.popleft()
            if mark:
                self._mark_locked(f)
            elif self._claim_locked(f):
                release(f)
                f.set_running_or_notify_cancel()

    # ------------------------------------------------------------------ workers
    def _initialize(self, first: PoolFuture | None) -> bool:
        """Run the initializer in a new thread, before its first task; False if it raised.

        A failure breaks the pool (``_break``): the thread leaves without running a task.
        """
        assert self._initializer is not None
        try:
            self._initializer(*self._initargs)
        except BaseException as exc:  # noqa: BLE001 - any failure breaks the pool, as in stdlib
            # where the stdlib pool reports it, so code written for that pool sees it
            _cfb.LOGGER.critical("Exception in initializer:", exc_info=True)
            self._break(first, exc)
            return False
        return True

    def _break(self, first: PoolFuture | None, cause: BaseException) -> None:
        """The calling thread's initializer raised: the pool is broken and this thread leaves.

        Its first task and every queued one fail with ``BrokenPoolError`` (counted rejected, or
        cancelled if their holder cancelled them first); ``submit`` refuses new tasks from now
        on. Threads already running keep running their tasks, then park until shutdown.
        """
        refused: list[PoolFuture] = []
        with self._lock:
            self._drain_locked()
            if self._broken is None:
                self._broken = BrokenPoolError(self._name, cause)
            if first is not None:
                first._tstate = DONE
                self._active -= 1
                if first._abandoned:
                    self._abandoned_running -= 1
                refused.append(first)
            while (f := self._poll_locked()) is not None:
                f._tstate = CLAIMED
                refused.append(f)
            self._queue.clear()
            self._garbage = 0
            self._retire_locked()
        cancelled = 0
        for f in refused:
            release(f)
            if f.set_running_or_notify_cancel():
                error = BrokenPoolError(self._name, cause)
                error.__cause__ = cause
                f.set_exception(error)
            else:
                cancelled += 1
        with self._lock:
            self._rejected += len(refused) - cancelled
            self._cancelled += cancelled
        del cause, refused

    def _finish(
        self, f: PoolFuture, start: float, end: float, failed: bool, parker: threading.Lock
    ) -> PoolFuture | float:
        """Count a task that ran, then take the next one (see ``_next_locked``).

        The lock is taken without ever blocking on it, yielding the GIL (``sleep(0)``) while
        another thread holds it. A blocking acquire waits with the GIL released and may get
        the lock while another thread has the GIL: it then holds the pool lock while it waits
        for the GIL, every other thread blocks on the lock, and the pool convoys. With 4 workers
        fed by one thread on 2 CPUs that cost ~35 voluntary context switches per 100 no-op
        tasks (the stdlib pool: ~13), about 1 with the yield. The wait is short: nothing
        slow runs under the pool lock (threads are started after it); after ``_SPINS`` tries
        the worker blocks on it after all, so a long hold (or a Python without a GIL) never
        turns into a spin.
        """
        lock = self._lock
        for _ in range(_SPINS):
            if lock.acquire(False):
                break
            _yield(0)
        else:  # held for long (its holder waits for the GIL) or no GIL to hand over: block
            lock.acquire()
        try:
            if self._deferred:  # a mark of this task must be counted before it is done
                self._drain_locked()
            f._tstate = DONE
            f._pool = None  # a Future kept by its holder does not keep the pool alive
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
            # The common case of _next_locked inline. Each Python call made under the lock is a
            # point where the GIL may pass to another thread, which then blocks on the lock (a
            # context switch or two each time; with 4 workers fed by one thread on 2 CPUs this
            # inlining cut them by a quarter and the CPU per task by ~12 %). Here the only call
            # is popleft.
            q = self._queue
            if q and self._pool_size <= self._max_size and q[0]._tstate == QUEUED:
                f = q.popleft()
                self._queued -= 1
                f._tstate = RUNNING
                self._active += 1
                if f._abandoned:
                    self._abandoned_running += 1
                    self._abandoned_total += 1
                return f
            return self._next_locked(False, parker)
        finally:
            lock.release()

    def _skip_cancelled(self, f: PoolFuture, parker: threading.Lock) -> PoolFuture | float:
        """Count a task its holder cancelled after a worker took it, then take the next one."""
        with self._lock:
            self._drain_locked()
            f._tstate = DONE
            f._pool = None
            self._active -= 1
            self._cancelled += 1
            if f._abandoned:
                self._abandoned_running -= 1
            return self._next_locked(False, parker)

    def _next_locked(self, timed_out: bool, parker: threading.Lock) -> PoolFuture | float:
        """What a worker without a task does next: a queued task to run, or retire, or park.

        Args:
            timed_out: The worker's last park timed out.
            parker: The worker's own lock, pushed on ``_parked`` if it parks.

        Returns:
            The task to run (already counted active), ``RETIRE`` if the worker has retired,
            or how long to park (``-1``: until woken); it is on ``_parked`` then.
        """
        size = self._pool_size
        if size > self._max_size and (size > 1 or not self._queued):
            self._retire_locked()
            return RETIRE
        f = self._poll_locked()
        if f is not None:
            f._tstate = RUNNING
            self._active += 1
            if f._abandoned:
                self._abandoned_running += 1
                self._abandoned_total += 1
            return f
        if self._shutdown or (timed_out and size > self._core_size):
            self._retire_locked()
            return RETIRE
        self._parked.append(parker)
        if size > self._core_size:
            return self._park_s
        # a core thread re-reads the sizes now and then, to notice a lowered core_size
        return self._core_park_s

    def _retire_locked(self) -> None:
        """The calling worker leaves the pool (it returns right after)."""
        self._pool_size -= 1
        self._threads = self._threads - {threading.current_thread()}
        # its CPU time stays in the counters once the thread is gone
        self._retired_cpu += clock.cpu_time()
        if self._queued and self._parked:
            # it may have been woken for a task it leaves queued: another thread takes it
            self._parked.pop().release()

    def _after_fork_in_child(self) -> None:
        """In a forked child: the same pool, with no threads, no tasks and fresh counters.

        The parent's threads do not exist in the child, and the tasks it had queued or running
        stay the parent's (running them here would run them twice): their Futures in the child
        are detached from the pool and never complete. Threads start again on demand, like in
        a new pool; a pool shut down before the fork stays shut down.
        """
        for f in self._queue:
            f._pool = None
            f._tstate = CLAIMED
        self._lock = threading.Lock()
        self._parked = []
        self._deferred = deque()
        self._ref = weakref.ref(self, wake_parked(self._parked))
        self._queue = deque()
        self._queued = self._garbage = self._active = 0
        self._pool_size = self._largest_pool_size = 0
        self._threads = frozenset()
        self._task_count = self._completed = self._failed = self._cancelled = 0
        self._rejected = self._abandoned_running = self._abandoned_total = 0
        self._samples = 0
        self._waits = [0.0] * _RING
        self._runs = [0.0] * _RING
        self._wait_total = self._run_total = self._retired_cpu = 0.0

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks; queued tasks still run unless ``cancel_futures``.

        Args:
            wait: Block until every thread has exited (queued and running tasks finished).
                Called from one of the pool's own threads, that thread is not waited for.
            cancel_futures: Cancel every task still in the queue (counted as cancelled).
        """
        cancelled: list[PoolFuture] = []
        with self._lock:
            self._drain_locked()
            self._shutdown = True
            # idle threads exit once the queue is empty (emptied in place: wake_parked has it)
            wake = self._parked[:]
            self._parked.clear()
            if cancel_futures:
                while (f := self._poll_locked()) is not None:
                    f._tstate = CLAIMED
                    self._cancelled += 1
                    cancelled.append(f)
                self._queue.clear()
                self._garbage = 0
        for parker in wake:
            parker.release()
        for f in cancelled:
            cancel_and_notify(f)
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
        deadline = None if timeout is None else clock.real_now() + timeout
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
                clock.real_sleep(min(0.01, max(0.0, deadline - clock.real_now())))
            elif not threads:
                return True
            for t in threads:
                remaining = None if deadline is None else deadline - clock.real_now()
                if remaining is not None and remaining <= 0:
                    return False
                if t.ident is None:  # registered, being started by _launch: look again
                    clock.real_sleep(0.001)
                    break
                clock.real_join(t, remaining)
            if deadline is not None and clock.real_now() >= deadline:
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

        Never waits for the pool's lock (a flow calls this on its way to returning at its
        deadline): if another thread holds it, the mark is counted by the next lock section,
        before the task can finish, and ``metrics()`` always includes it.
        """
        if not isinstance(future, PoolFuture) or future._pool is not self:
            return
        if not self._lock.acquire(False):
            self._deferred.append((future, True))
            return
        try:
            self._mark_locked(future)
        finally:
            self._lock.release()

    def worker_native_ids(self) -> list[int]:
        """OS thread ids of the pool's live threads (to attribute CPU time with psutil)."""
        with self._lock:
            return [t.native_id for t in self._threads if t.native_id is not None]

    def metrics(self) -> PoolMetrics:
        """Take a consistent snapshot of the pool's sizes, counters and recent timings."""
        with self._lock:
            self._drain_locked()
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
            retired_cpu = self._retired_cpu
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
            liveness_pct=pct(active, max_size),
            peak_load_pct=pct(largest, max_size),
            queue_usage_pct=pct(queued, capacity),
            queue_wait_s=Percentiles.of(waits),
            run_time_s=Percentiles.of(runs),
            queue_wait_total_s=wait_total,
            run_time_total_s=run_total,
            retired_worker_cpu_s=retired_cpu,
            timestamp=clock.real_wall(),
            monotonic=clock.real_now(),
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
