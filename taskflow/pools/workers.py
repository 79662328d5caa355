"""A ``ThreadPool``'s tasks and its worker threads.

A task is a ``PoolFuture``: the Future its submitter holds is also its entry in the pool's
queue. Its fields are guarded by the owning pool's lock (``_tstate``, ``_abandoned``, and
``_pool`` once the Future is published) or written once before it is published (the callable,
its arguments, ``_submitted_at``). ``_pool`` refers to the pool while the task is queued or
running, and is cleared when the task finishes, is cancelled or is refused, so a Future kept
by its holder keeps no pool alive.

A worker thread runs ``work``: its first task, then queued ones, parking on its own lock in
between (the pool's module docstring explains parking). It holds its pool strongly only while
it has a task or is in a lock section of the pool, and the pool's weak reference otherwise;
the callback of that reference (``wake_parked``) wakes the parked threads of a pool that
was collected, and they exit. Nothing here holds a lock while it calls a task, a callback or
an initializer.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Final, Protocol

from taskflow import clock

__all__ = [
    "CLAIMED", "DONE", "QUEUED", "RETIRE", "RUNNING", "PoolFuture", "WorkerPool",
    "cancel_and_notify", "release", "run_inline", "wake_parked", "work",
]

# task states (PoolFuture._tstate), guarded by the owning pool's lock
QUEUED: Final = 0  # in the deque, not started
RUNNING: Final = 1  # taken by (or handed to) a worker thread
DONE: Final = 2  # finished, or cancelled after a worker took it
CLAIMED: Final = 3  # cancelled or evicted while queued; the deque entry is garbage
RETIRE: Final = -2.0  # in place of a park timeout: "this worker has exited"


class WorkerPool(Protocol):
    """What a worker thread and a task's Future use of their pool (``ThreadPool`` is one).

    The methods whose names end in ``_locked`` are called with ``_lock`` held; every change of
    the pool's state and counts happens in the pool's own methods.
    """

    _lock: threading.Lock
    _parked: list[threading.Lock]
    _initializer: Callable[..., object] | None

    def _initialize(self, first: PoolFuture | None) -> bool: ...

    def _finish(
        self, f: PoolFuture, start: float, end: float, failed: bool, parker: threading.Lock
    ) -> PoolFuture | float: ...

    def _skip_cancelled(self, f: PoolFuture, parker: threading.Lock) -> PoolFuture | float: ...

    def _next_locked(self, timed_out: bool, parker: threading.Lock) -> PoolFuture | float: ...

    def _claim_cancelled(self, f: PoolFuture) -> None: ...


class PoolFuture(Future[Any]):
    """A Future that also is the queue entry of its task (its fields: see the module
    docstring)."""

    _pool: WorkerPool | None = None
    _tstate: int = DONE
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
        if pool is not None and self._tstate == QUEUED:
            pool._claim_cancelled(self)
        return True


def cancel_and_notify(f: Future[Any]) -> None:
    """Cancel a future nobody will run, and release ``wait()``/``as_completed()`` waiters."""
    if isinstance(f, PoolFuture):
        release(f)
    f.cancel()
    f.set_running_or_notify_cancel()


def release(f: PoolFuture) -> None:
    """Drop a refused task's references to its callable, its arguments and its pool."""
    f._fn = None
    f._args = ()
    f._kwargs = None
    f._pool = None


def run_inline(f: PoolFuture) -> None:
    """Run a task in the calling thread (``CALLER_RUNS``); its outcome goes to its Future."""
    fn, args, kwargs = f._fn, f._args, f._kwargs
    release(f)
    assert fn is not None and kwargs is not None
    if not f.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the task's outcome, as in stdlib
        f.set_exception(exc)
    else:
        f.set_result(result)


def work(ref: weakref.ref[WorkerPool], first_task: list[PoolFuture | None]) -> None:
    """A worker thread of the pool ``ref`` refers to: its first task, then queued ones until it
    retires.

    The thread holds its pool strongly only while it has a task or is in a lock section of the
    pool; parked, it holds only ``ref``, so a pool dropped without ``shutdown`` can be
    collected, and its collection wakes every parked thread (``wake_parked``), which then
    exits. After a task it takes the next queued one in the same lock section that counts the
    finished one; it parks (waits on its own lock, see ``taskflow.pools.threadpool``) only
    when the queue is empty. It drops its last task (and that task's Future, result and callable) as
    soon as the task is done: an idle worker references nothing of the work it ran.
    """
    pool = ref()
    f = first_task.pop()
    if pool is None:  # pragma: no cover - the pool starts its threads under its own lock
        return
    if pool._initializer is not None and not pool._initialize(f):
        return
    lock = pool._lock
    mono = clock.real_now  # keep-alive waits are real time, fake clock or not
    parker = threading.Lock()
    parker.acquire()  # held while not parked: acquiring it again is the wait
    nxt: PoolFuture | float
    if f is None:
        with lock:
            nxt = pool._next_locked(False, parker)
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
                    nxt = pool._finish(f, start, mono(), True, parker)
                    f.set_exception(exc)
                    del exc
                else:
                    nxt = pool._finish(f, start, mono(), False, parker)
                    f.set_result(result)
                    del result
            else:
                nxt = pool._skip_cancelled(f, parker)
            del fn, args, kwargs
            f = None
        if isinstance(nxt, PoolFuture):
            f = nxt
            continue
        if nxt == RETIRE:
            return
        # parked (on pool._parked): woken by a submit (a task is queued), a resize, shutdown,
        # or the pool's collection; holding the pool now would keep a dropped pool alive
        del pool
        woken = clock.real_acquire(parker, nxt)
        pool = ref()
        if pool is None:
            return
        if woken:
            with lock:
                nxt = pool._next_locked(False, parker)
            continue
        with lock:
            try:
                pool._parked.remove(parker)
            except ValueError:  # popped by a waker that releases it after its lock section
                popped = True
            else:
                popped = False
                nxt = pool._next_locked(True, parker)
        if popped:
            parker.acquire()  # take the wake-up that is on its way
            with lock:
                nxt = pool._next_locked(False, parker)


def wake_parked(parked: list[threading.Lock]) -> Callable[[object], None]:
    """The callback of a pool's weak reference: when the pool is collected, wake its parked
    threads (they find the pool gone and exit). Nothing else touches ``parked`` by then: a
    thread reaches it only through the pool."""

    def wake(_: object) -> None:
        while parked:
            parked.pop().release()

    return wake
