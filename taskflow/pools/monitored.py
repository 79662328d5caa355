"""``MonitoredExecutor``: counts for any executor, with queue-wait and run times.

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
``benchmarks/pool_throughput.py``). All this holds only where ``stdlib_copy_fits()``: the
interpreter's own pool and worker loop behave as the copy assumes; elsewhere a stdlib pool's
tasks run inside a timing wrapper on its own workers, with the same counts.

The snapshots it returns (``metrics()``) are [`PoolMetrics`][taskflow.metrics.PoolMetrics];
[`PoolMonitor`][taskflow.observe.monitor.PoolMonitor] samples them in the background. After
``os.fork`` (``gunicorn --preload``) a ``MonitoredExecutor``'s counts start over in the child.
"""

from __future__ import annotations

import concurrent.futures._base as _cfb
import concurrent.futures.thread as _cft
import functools
import itertools
import math
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Final, NamedTuple, NoReturn, ParamSpec, TypeVar

from taskflow import _fork, clock
from taskflow.metrics import SAMPLES_KEPT, Percentiles, PoolMetrics, pct
from taskflow.pools.stdlib_fit import stdlib_pool_matches, worker_loop_matches
from taskflow.pools.threadpool import ThreadPool

__all__ = ["MonitoredExecutor"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_RING: Final = SAMPLES_KEPT
_MASK: Final = _RING - 1

# states of a task a MonitoredExecutor sent out of process (see _Tracked)
_QUEUED: Final = 0  # handed to the inner executor, outcome not seen yet
_DONE: Final = 2  # its outcome is counted (or it was rejected)

_monitor_seq = itertools.count()


class _Tracked:
    """A task submitted through a ``MonitoredExecutor`` that runs out of process.

    Its outcome is counted by ``done``, a done-callback on the inner Future. ``state`` is
    guarded by the monitor's lock. It holds the monitor weakly: the inner Future keeps its
    callbacks, and a Future kept by its holder must not keep the monitor and its pool alive.
    """

    __slots__ = ("mon", "state")

    def __init__(self, mon: MonitoredExecutor) -> None:
        self.mon = mon._wref
        self.state = _QUEUED

    def done(self, future: Future[Any]) -> None:
        """Done-callback on the inner future (run by whichever thread completes it)."""
        mon = self.mon()
        if mon is None:  # collected: nobody can read its counts
            return
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


_monotonic = clock.real_now  # the pools keep real time, fake clock or not


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
    ``shutdown(cancel_futures=True)``), so the monitor keeps no list of pending futures. It
    holds its monitor weakly (``_taskflow_monitor`` is the monitor's ``_wref``), as every
    Future a monitor returns: a Future kept by its holder keeps neither the monitor nor the
    pool alive, so a pool dropped without ``shutdown`` lets its threads exit as the stdlib's do.
    """

    __slots__ = ("_taskflow_monitor",)

    _taskflow_monitor: weakref.ref[MonitoredExecutor]

    def cancel(self) -> bool:
        """Cancel the task if it has not started; counted once, as cancelled before start."""
        with self._condition:  # an RLock: Future.cancel takes it again
            pending = self._state == _cfb.PENDING
            cancelled = super().cancel()
        if pending and cancelled:
            mon = self._taskflow_monitor()
            if mon is not None:
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
    monitor_reference: weakref.ref[MonitoredExecutor], polls_first: bool,
) -> None:
    """The stdlib ``concurrent.futures.thread._worker`` loop, with its monitor's tasks inlined.

    A stdlib pool wrapped by a ``MonitoredExecutor`` starts its new threads on this function
    (see ``_adjust_monitored_threads``). The thread's ``_ThreadStats`` is a local variable here,
    so a task of that monitor costs no thread-local lookup and no ``run()`` frame; other work
    items (submitted to the pool directly, or through another monitor) run as the stdlib runs
    them. Exit and initializer failure are the stdlib's, and so is idle accounting while the
    pool is below its size, in the interpreter's shape (see ``stdlib_copy_shape``): with
    ``polls_first`` (CPython 3.12, 3.13) a worker polls the queue and releases an idle token
    only when it finds it empty; without (3.10, 3.11) it releases one after every task. A full
    pool starts no thread, so its workers skip the idle-thread semaphore (as
    ``_adjust_monitored_threads`` does), which no one reads then. Like the stdlib worker, it
    holds only weak references to the pool and to the monitor, so a pool dropped without
    ``shutdown`` still lets its threads exit, and it drops each task (callable, arguments,
    result, Future) before it waits for the next.
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
    get, get_nowait = work_queue.get, work_queue.get_nowait
    subs, starts, ends = st.subs, st.starts, st.ends
    clock = _monotonic
    try:
        while True:
            if polls_first and len(threads) < most:
                try:
                    item = get_nowait()
                except queue.Empty:
                    idle()
                    item = get(block=True)
            else:
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
                if not polls_first and len(threads) < most:
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
    """``ThreadPoolExecutor._adjust_thread_count`` (the same in CPython 3.10 to 3.13),
    starting threads on ``_monitored_worker``.

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
                  self._initargs, monitor_reference, stdlib_copy_shape() == _POLLS_FIRST),
        )
        t.start()
        self._threads.add(t)
        threads_queues: Any = _cft._threads_queues
        threads_queues[t] = self._work_queue


# the shapes of the stdlib worker loop's idle accounting that _monitored_worker can take
_RELEASES_AFTER_EACH_TASK: Final = "releases an idle token after each task"
_POLLS_FIRST: Final = "polls the queue, releases an idle token when it is empty"


@functools.cache
def stdlib_copy_shape() -> str | None:
    """The shape of the stdlib worker loop that ``_monitored_worker`` takes on this interpreter,
    or ``None`` when it can take none (checked at first use, then cached).

    A shape fits when the stdlib pool and worker loop of this interpreter behave as the copy in
    that shape assumes (see ``taskflow.pools.stdlib_fit``). By CPython version: 3.10 and 3.11
    (whose ``thread.py`` is the same file) release an idle token after every task; 3.12 and
    3.13 (the same loop as each other) poll the queue with ``get_nowait`` and release a token
    only when they find it empty, so a token means a thread is waiting. Both fit. A loop of any
    other shape (another CPython, another implementation) fits neither.
    """
    if not stdlib_pool_matches():
        return None
    for shape in (_RELEASES_AFTER_EACH_TASK, _POLLS_FIRST):
        if worker_loop_matches(_monitored_worker, _no_monitor(), shape == _POLLS_FIRST):
            return shape
    return None


def stdlib_copy_fits() -> bool:
    """Whether ``MonitoredExecutor`` may put its own work items on a plain stdlib pool's queue
    and start the pool's new threads on ``_monitored_worker``: the copy fits this interpreter's
    loop in one of its shapes (``stdlib_copy_shape``). Elsewhere a wrapped stdlib pool keeps
    its own submit and worker, and each task runs inside ``MonitoredExecutor._run``: the same
    counts and timings, one call frame more per task.
    """
    return stdlib_copy_shape() is not None


class _Collected:
    """Stands for a monitor already collected."""


def _no_monitor() -> weakref.ref[Any]:
    """A dead weak reference: the probed worker loop counts its thread for no monitor."""
    return weakref.ref(_Collected())


class MonitoredExecutor(Executor):
    """Counts the tasks of any executor: submitted, queued, active, completed, failed, timings.

    Args:
        executor: The executor to wrap (stdlib thread or process pools, loky, dask's
            ``ClientExecutor``, a [`ThreadPool`][taskflow.pools.threadpool.ThreadPool], ...). ``submit`` and
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
            isinstance(executor, ThreadPoolExecutor)
            and type(executor).submit is ThreadPoolExecutor.submit
            and type(executor)._adjust_thread_count is ThreadPoolExecutor._adjust_thread_count
            and stdlib_copy_fits()
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
    def _max_workers(self) -> int | None:
        """``max_size`` under the stdlib pool's private name, for code written against
        ``ThreadPoolExecutor``. taskflow's engine does not read it: it reads ``max_size``
        (``taskflow.engine.executors.capabilities``), and ``_max_workers`` only of a plain
        stdlib pool."""
        return _max_workers_of(self._inner)

    @property
    def _threads(self) -> Any:
        """The inner pool's threads under the stdlib pool's private name (as ``_max_workers``),
        for code written against ``ThreadPoolExecutor``; an empty set when it has none."""
        return getattr(self._inner, "_threads", frozenset())

    @property
    def _broken(self) -> Any:
        """Whether the inner pool is broken, under the stdlib pool's private name (its
        ``_broken``: false while it is not)."""
        return getattr(self._inner, "_broken", False)

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
                direct._taskflow_monitor = self._wref
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
            future._taskflow_monitor = self._wref  # type: ignore[attr-defined]
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
        if getattr(future, "_taskflow_monitor", None) is not self._wref:
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
        counts = self._read_counts(size)
        active_count, queue_size = self._active_and_queued(counts)
        return self._snapshot(base, size, counts, active_count, queue_size)

    def _read_counts(self, size: int | None) -> _Counts:
        """The counts, read under the lock; ``size`` is the inner pool's live workers.

        ``task_count`` is read after the threads' counts: a task is counted submitted before
        it can start, so queued = task_count - started - ... is never negative.
        """
        waits: list[float] = []
        runs: list[float] = []
        with self._lock:
            failed, completed, started, wait_total, run_total = self._thread_totals_locked(
                waits, runs
            )
            pending = list(self._pending.values())
            ab_running = self._abandoned_running_locked()
            tasks = next(self._submitted) - self._peeks  # after the threads' counts (above)
            self._peeks += 1
            if size is not None and size > self._largest_seen:
                self._largest_seen = size
            return _Counts(
                failed=failed, completed=completed, started=started, wait_total=wait_total,
                run_total=run_total, pending=pending, abandoned_running=ab_running,
                tasks=tasks, cancelled=self._cancelled, rejected=self._rejected,
                abandoned_total=self._abandoned_total, shutdown=self._shutdown,
                largest=self._largest_seen if size is not None else None,
                waits=waits if self._in_process else [],
                runs=runs if self._in_process else [],
            )

    def _thread_totals_locked(
        self, waits: list[float], runs: list[float],
    ) -> tuple[int, int, int, float, float]:
        """``(failed, completed, started, wait total, run total)`` of the retired threads and
        the live ones (see ``_ThreadStats.read``); appends the live ones' recent samples."""
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
        return failed, completed, started, wait_total, run_total

    def _abandoned_running_locked(self) -> int:
        """Abandoned tasks still running; counts those that started since they were marked,
        and forgets those that finished or were cancelled (out of process, a task not done
        counts as running)."""
        running = 0
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
                running += 1
        return running

    def _active_and_queued(self, c: _Counts) -> tuple[int | None, int | None]:
        """``(active_count, queue_size)``; both ``None`` out of process where the inner
        executor's ``running()`` means nothing."""
        if self._in_process:
            return max(0, c.started - c.completed), max(
                0, c.tasks - c.started - c.cancelled - c.rejected
            )
        if not self._running_known:
            return None, None
        # out of process, "queued" would be every task not done: split it where running()
        # means something
        not_done = c.tasks - c.completed - c.cancelled - c.rejected
        active = sum(1 for f in c.pending if f.running())
        return active, max(0, not_done - active)

    def _snapshot(
        self, base: PoolMetrics | None, size: int | None, c: _Counts,
        active_count: int | None, queue_size: int | None,
    ) -> PoolMetrics:
        """The ``PoolMetrics`` of counts ``c``; the pool's configuration is ``base``'s (the
        inner pool's own snapshot), else what can be read of the inner executor."""
        inner = self._inner
        config = _configuration(base, inner, size, c.largest)
        max_size, capacity = config["max_size"], config["queue_capacity"]
        largest = config["largest_pool_size"]
        return PoolMetrics(
            pool_name=self._name,
            executor_type=type(inner).__name__,
            **config,
            pool_size=size,
            active_count=active_count,
            queue_size=queue_size,
            queue_remaining_capacity=(
                None if capacity is None or queue_size is None else max(0, capacity - queue_size)
            ),
            abandoned_running=c.abandoned_running,
            is_shutdown=c.shutdown or _inner_shut_down(inner),
            task_count=c.tasks,
            completed_task_count=c.completed,
            failed_task_count=c.failed,
            cancelled_task_count=c.cancelled,
            rejected_count=c.rejected,
            abandoned_total=c.abandoned_total,
            liveness_pct=pct(active_count, max_size),
            peak_load_pct=pct(largest, max_size),
            queue_usage_pct=pct(queue_size, capacity),
            queue_wait_s=Percentiles.of(c.waits),
            run_time_s=Percentiles.of(c.runs),
            queue_wait_total_s=c.wait_total if self._in_process else None,
            run_time_total_s=c.run_total if self._in_process else None,
            timestamp=clock.real_wall(),
            monotonic=clock.real_now(),
        )

    def __repr__(self) -> str:
        return f"<MonitoredExecutor {self._name!r} of {self._inner!r}>"


class _Counts(NamedTuple):
    """What ``MonitoredExecutor.metrics`` reads under the monitor's lock."""

    failed: int
    completed: int
    started: int
    wait_total: float
    run_total: float
    pending: list[Future[Any]]  # out of process: the inner futures not done yet
    abandoned_running: int
    tasks: int
    cancelled: int
    rejected: int
    abandoned_total: int
    shutdown: bool
    largest: int | None  # the most live workers seen, None when they cannot be read
    waits: list[float]  # the recent samples (empty out of process)
    runs: list[float]


def _configuration(
    base: PoolMetrics | None, inner: Executor, size: int | None, largest_seen: int | None,
) -> dict[str, Any]:
    """The pool's configuration figures and its largest size: ``base``'s (the inner pool's
    own snapshot), else what can be read of ``inner``."""
    if base is not None:
        return {
            "core_size": base.core_size, "max_size": base.max_size,
            "queue_capacity": base.queue_capacity, "keep_alive_s": base.keep_alive_s,
            "rejection_policy": base.rejection_policy, "is_terminated": base.is_terminated,
            "largest_pool_size": base.largest_pool_size,
            "retired_worker_cpu_s": base.retired_worker_cpu_s,
        }
    stdlib = isinstance(inner, ThreadPoolExecutor)
    return {
        "core_size": None, "max_size": _max_workers_of(inner), "queue_capacity": None,
        "keep_alive_s": None, "rejection_policy": None, "is_terminated": None,
        # a stdlib pool's threads never exit
        "largest_pool_size": size if stdlib else largest_seen,
        "retired_worker_cpu_s": 0.0 if stdlib else None,
    }


def _inner_shut_down(inner: Executor) -> bool:
    """Whether the inner executor says it is shut down (stdlib thread and process pools)."""
    return getattr(inner, "_shutdown", False) is True or (
        getattr(inner, "_shutdown_thread", False) is True
    )


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
