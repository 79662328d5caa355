"""One process-wide daemon thread, ``taskflow-timer``, that fires deadlines.

Used for per-node timeouts, fan-out item timeouts, retry back-offs and the budget of runs started
with ``submit`` (a ``start`` caller watches its own budget). A callback must be quick and must not
call user code or ``executor.submit``: the engine's callbacks only move a run's state under its
lock and hand the rest (hooks, submissions) to the run's own threads. An exception in one is logged
and the thread goes on. The thread is started on first use, never per run, and again in a forked
child (``taskflow._fork``). A cancelled entry drops its references at once, so nothing it
pointed to is kept alive until its time comes.

Times at or beyond ``threading.TIMEOUT_MAX`` from now are never due (an entry for them is kept
but not waited on precisely), so a huge timeout cannot kill the thread.

The thread keeps real time (``clock.real_now``, ``clock.real_wait``): callers pass times read
from ``clock.now()``, which is real time outside a fake clock. Every caller goes through the
module attribute ``schedule`` (a fake clock points it at a heap of virtual time), except the
mechanical ones (``Economy.watchdog``) that call ``timer_thread.schedule`` by name.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

from taskflow import _fork, clock
from taskflow.logs import logger

__all__ = ["Timer", "TimerThread", "schedule", "timer_thread"]

# the longest single wait (threading refuses longer ones)
_MAX_WAIT = min(threading.TIMEOUT_MAX, 86400.0)


class Timer:
    """A handle to one scheduled call; ``cancel()`` is idempotent and cheap."""

    __slots__ = ("args", "fn", "owner", "when")

    def __init__(self, owner: TimerThread, when: float, fn: Callable[..., Any],
                 args: tuple[Any, ...]) -> None:
        self.owner = owner
        self.when = when
        self.fn: Callable[..., Any] | None = fn
        self.args = args

    def cancel(self) -> None:
        """Drop the call (and its references); a no-op once fired or cancelled."""
        if self.fn is not None:
            self.fn = None
            self.args = ()
            self.owner.cancelled += 1  # approximate (no lock): only decides when to compact


class TimerThread:
    """A heap of timed calls served by one daemon thread (see the module docstring)."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())  # guards heap and thread
        self.heap: list[tuple[float, int, Timer]] = []
        self.seq = itertools.count()
        self.thread: threading.Thread | None = None
        self.cancelled = 0  # cancelled entries still in the heap (approximately)

    def schedule(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Call ``fn(*args)`` on the timer thread at ``clock.real_now()`` ``when``."""
        entry = Timer(self, when, fn, args)
        with self.cond:
            heap = self.heap
            if self.cancelled > 64 and self.cancelled * 2 > len(heap):
                # most entries were cancelled (items and nodes that finished in time): drop them
                # so the heap stays as large as what is really pending
                heap[:] = [e for e in heap if e[2].fn is not None]
                heapq.heapify(heap)
                self.cancelled = 0
            heapq.heappush(heap, (when, next(self.seq), entry))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.serve, name="taskflow-timer",
                                               daemon=True)
                self.thread.start()
            elif heap[0][2] is entry:
                self.cond.notify()
        return entry

    def serve(self) -> None:
        """The timer thread's loop."""
        heap = self.heap
        while True:
            with self.cond:
                while True:
                    # drop cancelled entries at the top so they do not delay the wait
                    while heap and heap[0][2].fn is None:
                        heapq.heappop(heap)
                    now = clock.real_now()
                    if heap and heap[0][0] <= now:
                        entry = heapq.heappop(heap)[2]
                        break
                    clock.real_wait(self.cond, None if not heap else min(heap[0][0] - now, _MAX_WAIT))
            fn, args = entry.fn, entry.args
            entry.fn, entry.args = None, ()
            if fn is None:
                continue
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - the timer thread must survive any callback
                logger.exception("taskflow timer callback {!r} raised", fn)
            del fn, args, entry

    def shift(self, seconds: float) -> None:
        """The clocks moved ahead by ``seconds`` (``clock.on_shift``): every entry keeps the
        delay it had left."""
        with self.cond:
            moved = [(when + seconds, seq, entry) for when, seq, entry in self.heap]
            for when, _, entry in moved:
                entry.when = when
            self.heap[:] = moved  # a uniform shift keeps the heap's order
            self.cond.notify()

    def after_fork_in_child(self) -> None:
        """A forked child has no timer thread: start afresh (the parent's entries are not ours)."""
        self.cond = threading.Condition(threading.Lock())
        self.heap = []
        self.thread = None
        self.cancelled = 0


timer_thread = TimerThread()
schedule = timer_thread.schedule

_fork.register(timer_thread, after_in_child="after_fork_in_child")
clock.on_shift(timer_thread.shift)
