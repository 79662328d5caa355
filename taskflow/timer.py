"""One process-wide daemon thread, ``taskflow-timer``, that fires deadlines.

Used for per-node timeouts, retry back-offs and the budget of runs started with ``submit`` (a
``start`` caller watches its own budget). Callbacks run on the timer thread and must be quick;
an exception in one is logged and the thread goes on. The thread is started on first use and
never per run. A cancelled entry drops its references at once, so nothing it pointed to is kept
alive until its time comes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

__all__ = ["Timer", "schedule"]


class Timer:
    """A handle to one scheduled call; ``cancel()`` is idempotent and cheap."""

    __slots__ = ("args", "fn", "when")

    def __init__(self, when: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.fn: Callable[..., Any] | None = fn
        self.args = args

    def cancel(self) -> None:
        if self.fn is not None:
            self.fn = None
            self.args = ()
            _timer.cancelled += 1  # approximate (no lock): only decides when to compact


class _TimerThread:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())  # guards _heap and _thread
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.cancelled = 0  # cancelled entries still in the heap (approximately)

    def schedule(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        entry = Timer(when, fn, args)
        with self._cond:
            heap = self._heap
            if self.cancelled > 64 and self.cancelled * 2 > len(heap):
                # most entries were cancelled (items and nodes that finished in time): drop them
                # so the heap stays as large as what is really pending
                heap[:] = [e for e in heap if e[2].fn is not None]
                heapq.heapify(heap)
                self.cancelled = 0
            heapq.heappush(heap, (when, next(self._seq), entry))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="taskflow-timer", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is entry:
                self._cond.notify()
        return entry

    def _run(self) -> None:
        heap = self._heap
        while True:
            with self._cond:
                while True:
                    # drop cancelled entries at the top so they do not delay the wait
                    while heap and heap[0][2].fn is None:
                        heapq.heappop(heap)
                    now = time.monotonic()
                    if heap and heap[0][0] <= now:
                        entry = heapq.heappop(heap)[2]
                        break
                    self._cond.wait(None if not heap else heap[0][0] - now)
            fn, args = entry.fn, entry.args
            entry.fn, entry.args = None, ()
            if fn is None:
                continue
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - the timer thread must survive any callback
                logger.exception("taskflow timer callback {!r} raised", fn)


_timer = _TimerThread()
schedule = _timer.schedule
