"""Whether this interpreter's ``ThreadPoolExecutor`` behaves as a copy of its worker loop assumes.

``MonitoredExecutor`` puts its own work items on a plain stdlib pool's queue and starts that
pool's new threads on a copy of the stdlib worker loop. Both lean on private behaviour of
``concurrent.futures.thread``, which CPython changes between versions, so the copy is used only
where it behaves as the interpreter's own code does. The checks here run that code, not read
its signatures:

* ``stdlib_pool_matches``: on a throwaway pool that never starts a thread, ``submit`` puts one
  ``_WorkItem(future, fn, args, kwargs)`` on ``_work_queue`` and calls
  ``_adjust_thread_count``; ``run()`` sets the future's result or exception, and runs nothing
  once the future is cancelled; ``_initializer_failed`` sets ``_broken`` and fails the queued
  futures with ``BrokenThreadPool``; ``shutdown(cancel_futures=True)`` cancels them, sets
  ``_shutdown`` and puts the sentinel ``None``; ``_adjust_thread_count`` takes an idle token
  from ``_idle_semaphore`` and then starts nothing; the module's ``_shutdown`` flag is False.
* ``worker_loop_matches(copy)``: the stdlib ``_worker`` and ``copy`` are run in the calling
  thread on a recording queue and a recording stand-in pool (below its size, so the copy keeps
  the stdlib's idle accounting), in each of three cases: a task then the sentinel on a pool
  shut down, the sentinel on a running pool, a failing initializer. (A pool collected while
  its thread lives is not probed: there the copy returns or releases a token no one reads,
  where the stdlib's loop waits for the sentinel.) Their traces (queue calls, tasks run, idle tokens released, ``_shutdown`` set,
  ``_initializer_failed`` calls, messages logged) must be equal.

The probes keep no error past their return: a traceback left in a cycle would keep the frames
of their caller (the first ``MonitoredExecutor`` of the process, with its pool) alive until the
cycle collector runs.

The recording queue never blocks: a blocking ``get`` on it when empty raises, which both loops
catch and log, so a loop of another shape ends too. The probes' log records are kept off the
``concurrent.futures`` logger's handlers.
"""

from __future__ import annotations

import concurrent.futures._base as _cfb
import concurrent.futures.thread as _cft
import logging
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["stdlib_pool_matches", "worker_loop_matches"]

Trace = list[tuple[str, object]]


class _ProbeEnd(BaseException):
    """Raised by a blocking ``get`` on an empty ``_ProbeQueue``: the loop under probe is done."""


class _ProbeQueue:
    """A work queue that records its calls and never blocks."""

    def __init__(self, trace: Trace, items: list[object]) -> None:
        self.trace = trace
        self.items = deque(items)

    def get(self, block: bool = True) -> object:
        self.trace.append(("get", block))
        if not self.items:
            raise _ProbeEnd
        return self.items.popleft()

    def get_nowait(self) -> object:
        self.trace.append(("get_nowait", None))
        if not self.items:
            raise queue.Empty
        return self.items.popleft()

    def put(self, item: object) -> None:
        self.trace.append(("put", item))


class _ProbeItem:
    """A work item that records that it ran."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.future = None

    def run(self) -> None:
        self.trace.append(("run", None))


class _ProbeSemaphore:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def release(self) -> None:
        self.trace.append(("idle", None))


class _ProbePool:
    """What a worker loop reads of its pool; below its size, with no thread of its own."""

    def __init__(self, trace: Trace, shutdown: bool) -> None:
        self.trace = trace
        self._idle_semaphore = _ProbeSemaphore(trace)
        self._threads: set[threading.Thread] = set()
        self._max_workers = 2
        self._shutdown = shutdown

    def _initializer_failed(self) -> None:
        self.trace.append(("initializer failed", None))


def _failing_initializer() -> None:
    raise RuntimeError("probe")


class _KeepOwnRecords(logging.Filter):
    """Records the calling thread's messages to the ``concurrent.futures`` logger and drops
    them; other threads' records pass."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        self.ident = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.ident:
            return True
        self.trace.append(("log", record.getMessage()))
        return False


def _trace_case(loop: Callable[..., object], case: str, extra: tuple[Any, ...]) -> Trace:
    """The trace of ``loop`` (a worker loop, with ``extra`` arguments after the stdlib's) in
    ``case``."""
    trace: Trace = []
    initializer: Callable[[], None] | None = None
    pool = _ProbePool(trace, shutdown=case == "task, sentinel")
    items: list[object] = [None]
    if case == "task, sentinel":
        items = [_ProbeItem(trace), None]
    elif case == "failing initializer":
        initializer = _failing_initializer
    ref = weakref.ref(pool)
    work_queue = _ProbeQueue(trace, items)
    keep = _KeepOwnRecords(trace)
    _cfb.LOGGER.addFilter(keep)
    try:
        loop(ref, work_queue, initializer, (), *extra)
    finally:
        _cfb.LOGGER.removeFilter(keep)
    trace.append(("shutdown flag", pool._shutdown))
    return trace


_CASES = ("task, sentinel", "sentinel, running", "failing initializer")


def worker_loop_matches(copy: Callable[..., object], *extra: Any) -> bool:
    """Whether ``copy`` (called with ``extra`` after the stdlib's four arguments) leaves the
    same trace as ``concurrent.futures.thread._worker`` in every probed case."""
    try:
        return all(
            _trace_case(_cft._worker, case, ()) == _trace_case(copy, case, extra)
            for case in _CASES
        )
    except (Exception, _ProbeEnd):  # noqa: BLE001 - a loop of another shape: no match
        return False


def _unstarted_pool() -> tuple[ThreadPoolExecutor, list[None]]:
    """A stdlib pool whose ``_adjust_thread_count`` only records its calls: it starts no
    thread."""
    pool = ThreadPoolExecutor(1)
    calls: list[None] = []
    pool._adjust_thread_count = lambda: calls.append(None)  # type: ignore[method-assign]
    return pool, calls


def _work_items_match() -> bool:
    """``submit`` queues a ``_WorkItem`` whose ``run`` keeps the future's contract."""
    pool, calls = _unstarted_pool()
    ran: list[object] = []

    def task(*args: object, **kwargs: object) -> object:
        ran.append((args, kwargs))
        if kwargs.get("fail"):
            raise LookupError("probe")
        return args

    ok = pool.submit(task, 1, k=2)
    item = pool._work_queue.get_nowait()
    fits = (
        type(item) is _cft._WorkItem and item.future is ok and item.fn is task
        and item.args == (1,) and item.kwargs == {"k": 2} and calls == [None]
    )
    item.run()
    failing = pool.submit(task, fail=True)
    pool._work_queue.get_nowait().run()
    cancelled = pool.submit(task, 3)
    cancelled.cancel()
    pool._work_queue.get_nowait().run()
    failed = isinstance(failing.exception(0), LookupError)
    # the error's traceback holds the frames down from here (and, through them, the callers'):
    # drop it now rather than leave a cycle for the collector
    del failing
    return fits and ok.result(0) == (1,) and failed and cancelled.cancelled() and len(ran) == 2


def _initializer_failure_matches() -> bool:
    """``_initializer_failed`` breaks the pool and fails its queued futures."""
    pool, _ = _unstarted_pool()
    queued = pool.submit(int)
    pool._initializer_failed()
    try:
        pool.submit(int)
    except _cft.BrokenThreadPool:
        refused = True
    else:
        refused = False
    return bool(pool._broken) and refused and isinstance(
        queued.exception(0), _cft.BrokenThreadPool
    )


def _shutdown_matches() -> bool:
    """``shutdown(cancel_futures=True)`` cancels the queued futures and leaves the sentinel."""
    pool, _ = _unstarted_pool()
    queued = pool.submit(int)
    pool.shutdown(wait=False, cancel_futures=True)
    try:
        pool.submit(int)
    except RuntimeError:
        refused = True
    else:
        refused = False
    sentinel = pool._work_queue.get_nowait()
    return queued.cancelled() and pool._shutdown is True and refused and sentinel is None


def _idle_token_matches() -> bool:
    """``_adjust_thread_count`` takes an idle token and then starts no thread."""
    pool = ThreadPoolExecutor(1)
    pool._idle_semaphore.release()
    pool._adjust_thread_count()
    return not pool._threads and not pool._idle_semaphore.acquire(timeout=0)


def stdlib_pool_matches() -> bool:
    """Whether the stdlib pool's submit, work items, shutdown, initializer failure and idle
    tokens behave as described in the module docstring."""
    try:
        return _cft._shutdown is False and _work_items_match() and (
            _initializer_failure_matches() and _shutdown_matches() and _idle_token_matches()
        )
    except Exception:  # noqa: BLE001 - internals of another shape: they do not match
        return False
