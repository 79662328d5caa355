"""Virtual time for tests: ``FakeClock``, installed in taskflow's one clock seam.

While a ``FakeClock`` is entered, every semantic reading of time in taskflow (``taskflow.clock``:
run budgets and their timers, node timeouts and ``deadline=``, back-offs, batch windows,
rate-limit refills, breaker periods, hedge delays, TTLs, ``ctx.remaining()``, report timings) is
the fake's ``now()``, and every semantic timer (``taskflow.engine.timer.schedule``) goes on the
fake's own heap. Time moves only when the test says so:

- ``advance(s)`` moves time forward by ``s`` and fires, in order of their times, every timer due
  by then (on the calling thread, each with ``now()`` at its own time), then wakes the threads in
  ``sleep`` or in a timed wait whose time has come;
- ``sleep(s)`` blocks the calling thread until virtual time has advanced by ``s`` (a task that
  stands in for a slow backend);
- ``autojump=True``: a driver thread moves time to the next due timer, sleeper or timed wait once
  taskflow's work is quiet: no worker loop is queued on an executor or running on a thread that
  is not blocked in the clock (the loops count themselves while a fake clock is installed:
  ``taskflow.clock.busy``), no timer is firing, and neither the counts nor any reading
  of the clock changed for ``autojump_threshold`` real seconds (for the threads taskflow cannot
  see). A task blocked outside the clock (on a plain ``Event``, a socket) holds time still, as it
  would in Go's ``testing/synctest``: make it wait with ``clock.sleep`` or advance by hand.
- ``wait_until_blocked()`` waits in real time until no taskflow work can progress before time
  moves (trio's ``wait_all_tasks_blocked``): with ``autojump=False``, call it after ``submit`` and
  before ``advance``, so that the nodes have started and armed their timers.
- With ``ManualExecutor`` and ``autojump=True``, ``run_until_idle()`` jumps itself: when nothing
  is queued it moves time to the next due timer and goes on, so a seed gives the same order twice.

Event loops: while entered, the loops async nodes run on follow virtual time (their ``time``
reads it, their ``select`` is woken as it moves, ``advance`` steps through their timers in order
with the fake's own, autojump waits until they are quiet): ``taskflow.testing.aioclock``.

Not virtual: threads that never call taskflow or the clock, other processes (``start`` refuses a
process executor under a fake clock), and the machinery's own waits (``clock.real_*``).

Timed waits (``clock.wait``, ``clock.get``, ``clock.result``, ``clock.wait_for``) wait for their
object in short real slices and give up once virtual time passes their timeout. At exit every
thread still in ``sleep`` is released (its sleep returns), the timers still pending move to the
real timer thread with the virtual delay they had left (a run left in flight still ends), and
real time is back.

Time never goes back, entering or leaving. taskflow's own reading (``clock.now()``, the seam)
continues from the time of entering, and ``now()`` is that reading offset to count from
``start``; on leaving, if virtual time ran ahead of the real clock, the seam's monotonic clocks
stay that far ahead for the rest of the process (``clock.offset``). So a bulkhead, breaker, rate
limit or in-process cache made at import, used before, under and after a fake clock, never sees
time go backwards (a rate limit would otherwise refill nothing, a breaker stay open, a cached
value never age). Unix time (``clock.wall``: deadline headers, ``RedisCache`` stamps, which
other processes read) moves with virtual time while entered and is the real one again after:
a value a test stored in a shared ``RedisCache`` under a fake clock that ran ahead looks newer
than it is to later tests.

Concurrency: ``_cond`` guards the heap, ``_now``, the sleepers, the waiters and ``_closed``;
``_firing`` (taken before ``_cond``, never after) lets one thread at a time fire timers, so they
fire in order. No callback runs under ``_cond``. ``_epoch`` is bumped without a lock (a lost
update still changes it): it only tells the driver that something happened.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import queue as queue_module
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import TracebackType
from typing import Any, TypeVar

from taskflow import clock
from taskflow.engine import aio, inflight, remote
from taskflow.engine import timer as engine_timer
from taskflow.errors import InvalidArgumentValueError
from taskflow.logs import logger
from taskflow.testing.aioclock import VirtualLoops

__all__ = ["FakeClock"]

T = TypeVar("T")

# how long a timed wait blocks on its object between two looks at virtual time (real seconds)
_SLICE = 0.001
# the longest ``advance`` waits for the coordinator threads to hand over what its timers caused
_SETTLE = 5.0
# the smallest real quiet the driver waits for before a jump
_MIN_THRESHOLD = 0.0005


class _Entry:
    """A fake timer (the engine's ``Timer`` interface: ``cancel()``, ``when``)."""

    __slots__ = ("args", "fn", "when")

    def __init__(self, when: float, fn: Callable[..., Any] | None, args: tuple[Any, ...]) -> None:
        self.when = when
        self.fn = fn
        self.args = args

    def cancel(self) -> None:
        self.fn = None
        self.args = ()


def _ready(obj: Any) -> bool:
    """Whether what a timed wait waits for is there already (its waiter is about to run)."""
    try:
        if isinstance(obj, threading.Event):
            return obj.is_set()
        if isinstance(obj, (queue_module.Queue, queue_module.SimpleQueue)):
            return not obj.empty()
        done = getattr(obj, "done", None)
        return bool(done()) if callable(done) else False
    except Exception:  # noqa: BLE001 - a look, never a failure
        return False


class FakeClock:
    """Virtual time for taskflow while entered (see the module docstring).

    Args:
        start: the virtual time ``now()`` reads on entering.
        autojump: move time to the next due timer whenever taskflow's work is quiet.
        autojump_threshold: real seconds of quiet before a jump.

    Raises:
        InvalidArgumentValueError: ``start`` is not a finite number, ``autojump_threshold`` is
            negative (both also ValueErrors).
    """

    def __init__(self, start: float = 0.0, *, autojump: bool = False,
                 autojump_threshold: float = 0.005) -> None:
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not (
                abs(start) < float("inf")):
            raise InvalidArgumentValueError(f"start must be a finite number of seconds, got "
                                            f"{start!r}", argument="start")
        if isinstance(autojump_threshold, bool) or not isinstance(
                autojump_threshold, (int, float)) or not 0 <= autojump_threshold < float("inf"):
            raise InvalidArgumentValueError(
                f"autojump_threshold must be >= 0 seconds, got {autojump_threshold!r}",
                argument="autojump_threshold")
        self._start = float(start)
        self._base = 0.0  # the seam's time on entering
        self._now = 0.0  # the seam's time: _base + the virtual seconds that passed
        self._wall0 = 0.0
        self.autojump = bool(autojump)
        self.autojump_threshold = float(autojump_threshold)
        self._cond = threading.Condition(threading.Lock())
        self._firing = threading.RLock()
        self._heap: list[tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._sleepers: dict[int, float] = {}  # sleep id -> wake time
        self._waiters: dict[int, tuple[float, Any]] = {}  # timed wait id -> (timeout time, obj)
        self._epoch = 0
        self._entered = False
        self._closed = False
        self._driver: threading.Thread | None = None
        self._saved_schedule: Any = None
        self.jumps = 0  # how many times autojump (or run_until_idle) moved time
        self._loops = VirtualLoops(self._loop_time, self._loop_moved)

    def __repr__(self) -> str:
        return (f"FakeClock(now={self._start + self._now - self._base!r}, "
                f"autojump={self.autojump!r})")

    # -- entering and leaving ---------------------------------------------------------------------

    def __enter__(self) -> FakeClock:
        if self._entered:
            raise RuntimeError(f"{self!r} was already entered: a FakeClock is entered once, "
                               "make a new one")
        installed = clock.installed()
        if installed is not None:
            raise RuntimeError(f"another fake clock is entered ({installed!r}): leave it before "
                               "entering a second one")
        running = inflight.runs()
        if running:
            raise RuntimeError(
                f"{len(running)} taskflow run(s) are in flight (first: "
                f"{running[0].flow_name!r}): their times were read on the real clock; enter the "
                "FakeClock before starting them, or wait for them to end")
        self._base = self._now = clock.now()
        self._wall0 = clock.wall() - self._base
        self._entered = True
        clock.install(self)
        self._saved_schedule = engine_timer.schedule
        setattr(engine_timer, "schedule", self.schedule)  # noqa: B010 - a seam, typed there
        clock.reset_counts(True)
        aio.on_loop = self._loops.attach
        if aio.loop_thread.loop is not None:
            self._loops.attach(aio.loop_thread.loop)
        if self.autojump:
            self._driver = threading.Thread(target=self._drive, name="taskflow-fake-clock",
                                            daemon=True)
            self._driver.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._cond:
            self._closed = True
            pending = [(when - self._now, entry) for when, _, entry in self._heap
                       if entry.fn is not None]
            self._heap.clear()
            self._cond.notify_all()  # sleepers return, the driver stops
        if self._driver is not None:
            clock.real_join(self._driver, 5.0)
        clock.reset_counts(False)
        aio.on_loop = None
        setattr(engine_timer, "schedule", self._saved_schedule)  # noqa: B010
        # real time continues from the virtual time reached, never back from it
        clock.uninstall(self, ahead=max(0.0, self._now - clock.real_now()))
        self._loops.restore()
        base = clock.real_now()
        for delay, entry in pending:  # what is still due runs in real time, late rather than never
            fn, args = entry.fn, entry.args
            if fn is not None:
                entry.fn, entry.args = None, ()
                engine_timer.schedule(base + max(0.0, delay), fn, *args)

    # -- the semantic clock ---------------------------------------------------------------------

    def now(self) -> float:
        """The virtual time, in seconds: ``start`` on entering, then as time moves, to the
        nanosecond (virtual time is kept on the seam's scale, where a jump of a whole hour can
        read a float rounding off; rounded, it reads 3600.0)."""
        self._epoch += 1
        return round(self._start + self._now - self._base, 9)

    def seam_now(self) -> float:
        """What taskflow reads as ``clock.now()`` while entered: the seam's time when the clock
        was entered (so timestamps taken before stay in the past), moved as virtual time
        moves. It differs from ``now()`` by a constant: compare differences."""
        self._epoch += 1
        return self._now

    def _loop_time(self) -> float:
        """An attached event loop's ``time()``: the seam's time, not counted as a reading
        (the loop reads it at each turn)."""
        return self._now

    def _loop_moved(self, blocked: bool) -> None:
        """An attached loop served something (``blocked``: it now waits in select with timers:
        a driver waiting for a due time looks again)."""
        self._epoch += 1
        if blocked:
            with self._cond:
                self._cond.notify_all()

    def wall(self) -> float:
        """Unix time that moves with virtual time (it read the real one on entering)."""
        self._epoch += 1
        return self._wall0 + self._now

    def wall_ns(self) -> int:
        """``wall()`` in nanoseconds."""
        return int(self.wall() * 1e9)

    def schedule(self, when: float, fn: Callable[..., Any], *args: Any) -> _Entry:
        """Call ``fn(*args)`` when virtual time reaches ``when`` (the engine timer's seam)."""
        entry = _Entry(when, fn, args)
        with self._cond:
            if self._closed:
                engine_timer.timer_thread.schedule(clock.real_now() + max(0.0, when - self._now),
                                                   fn, *args)
                entry.fn = None
                return entry
            heapq.heappush(self._heap, (when, next(self._seq), entry))
            self._epoch += 1
            self._cond.notify_all()
        return entry

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> _Entry:
        """Call ``fn(*args)`` ``delay`` seconds of virtual time from now."""
        return self.schedule(self._now + delay, fn, *args)

    def pending(self) -> int:
        """How many timers wait for their time (cancelled ones not counted)."""
        with self._cond:
            return sum(1 for _, _, entry in self._heap if entry.fn is not None)

    def next_due(self) -> float | None:
        """The earliest virtual time a timer, a sleeper or a timed wait waits for, or None."""
        with self._cond:
            return self._next_due()

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by ``seconds``, firing what is due, in order.

        Raises:
            InvalidArgumentValueError: ``seconds`` is negative, NaN or infinite (also a
                ValueError): virtual time never goes back.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                0 <= seconds < float("inf")):
            raise InvalidArgumentValueError(
                f"advance takes a finite number of seconds >= 0, got {seconds!r}: virtual time "
                "never goes back", argument="seconds")
        self._advance_to(self._now + seconds)
        self._settle()

    def _settle(self) -> None:
        """Wait (real time, bounded) until the work the fired timers handed to taskflow's
        coordinator threads is done, and the attached event loops have served what came due: a
        back-off's next attempt has reached its executor when ``advance`` returns."""
        if threading.current_thread().name.startswith("taskflow-coordinator"):
            return
        deadline = clock.real_now() + _SETTLE
        while not remote.coordinator.quiet() and clock.real_now() < deadline:
            clock.real_sleep(_SLICE / 4)
        self._settle_loops()

    def _settle_loops(self) -> None:
        """After a step of time: the attached loops (and the coordinator threads between them
        and the runs) have served what came due, before time moves on."""
        if self._loops:
            on_coordinator = threading.current_thread().name.startswith("taskflow-coordinator")
            self._loops.settle(lambda: on_coordinator or remote.coordinator.quiet(), _SETTLE)

    def wait_until_blocked(self, timeout: float = 10.0) -> bool:
        """Wait (``timeout`` real seconds at most) until no taskflow work can progress before
        time moves: nothing queued on an executor or handed to a coordinator thread, every
        thread that runs taskflow work blocked in the clock (trio's ``wait_all_tasks_blocked``).
        Returns False if ``timeout`` passed first. A test that moves time by hand calls it after
        ``submit`` so that the nodes have armed their timers before it ``advance``s.

        Raises:
            RuntimeError: the clock is not entered.
        """
        if not self._entered or self._closed:
            raise RuntimeError(f"{self!r} is not entered")
        deadline = clock.real_now() + timeout
        threshold = max(self.autojump_threshold, _MIN_THRESHOLD)
        while clock.real_now() < deadline:
            with self._cond:
                quiet = self._quiet()
            if quiet and self._quiet_for(threshold):
                return True
            if not quiet:
                clock.real_sleep(_SLICE / 4)
        return False

    def jump(self) -> bool:
        """Move time to the next due timer, sleeper or timed wait, firing what is due; False if
        nothing waits for a time to come."""
        with self._cond:
            due = self._next_due()
        if due is None or self._closed:
            return False
        self.jumps += 1
        self._advance_to(max(due, self._now))
        self._settle()
        return True

    def _advance_to(self, target: float) -> None:
        with self._firing:
            while True:
                fn = None
                with self._cond:
                    while self._heap and self._heap[0][2].fn is None:
                        heapq.heappop(self._heap)
                    step = self._loop_step(target)
                    if step is not None:  # an event loop's timer comes first: its time, alone
                        self._now = step
                        self._epoch += 1
                        self._cond.notify_all()
                    elif self._heap and self._heap[0][0] <= target and not self._closed:
                        when, _, entry = heapq.heappop(self._heap)
                        self._now = max(self._now, when)
                        fn, args = entry.fn, entry.args
                        entry.fn, entry.args = None, ()
                        self._epoch += 1
                        self._cond.notify_all()  # sleepers due before this timer wake first
                    else:
                        self._now = max(self._now, target)
                        self._epoch += 1
                        self._cond.notify_all()
                        self._loops.wake()
                        return
                if fn is not None:
                    try:
                        fn(*args)
                    except BaseException:  # noqa: BLE001 - as the real timer thread: log, go on
                        logger.exception("taskflow fake-clock timer callback {!r} raised", fn)
                    del fn, args
                self._settle_loops()

    def _loop_step(self, target: float) -> float | None:
        """Under ``_cond``: the time of an attached loop's timer due after now, by ``target``
        and before the next fake timer, or None."""
        if not self._loops or self._closed:
            return None
        due = self._loops.next_due()
        if due is None or not self._now < due <= target:
            return None
        if self._heap and self._heap[0][0] <= due:
            return None
        return due

    def sleep(self, seconds: float) -> None:
        """Block the calling thread until virtual time has advanced by ``seconds`` (returns at
        once when the clock is left)."""
        if not seconds > 0:
            return
        key = next(self._seq)
        with self._cond:
            wake = self._now + seconds
            self._sleepers[key] = wake
            self._epoch += 1
            self._cond.notify_all()
            clock.idle(True)
            try:
                while self._now < wake and not self._closed:
                    self._cond.wait()
            finally:
                clock.idle(False)
                del self._sleepers[key]
                self._epoch += 1

    # -- timed waits: the object in real slices, the timeout in virtual time ------------------------

    @contextlib.contextmanager
    def _blocked(self) -> Iterator[None]:
        """An untimed wait in the clock: the thread cannot progress until what it waits for comes
        (taskflow work counted elsewhere, or a thread taskflow cannot see)."""
        clock.idle(True)
        try:
            yield
        finally:
            clock.idle(False)
            self._epoch += 1

    def _until(self, timeout: float, obj: Any) -> tuple[int, float]:
        key = next(self._seq)
        with self._cond:
            until = self._now + timeout
            self._waiters[key] = (until, obj)
            self._epoch += 1
            self._cond.notify_all()
        clock.idle(True)
        return key, until

    def _done_waiting(self, key: int) -> None:
        clock.idle(False)
        with self._cond:
            self._waiters.pop(key, None)
            self._epoch += 1

    def _passed(self, until: float) -> bool:
        return self._now >= until or self._closed

    def wait(self, waitable: Any, timeout: float | None) -> bool:
        """``waitable.wait(timeout)`` with ``timeout`` in virtual seconds."""
        if timeout is None:
            with self._blocked():
                return bool(waitable.wait(None))
        key, until = self._until(timeout, waitable)
        try:
            while True:
                if clock.real_wait(waitable, _SLICE):
                    return True
                if self._passed(until):
                    return False
        finally:
            self._done_waiting(key)

    def wait_for(self, cond: Any, predicate: Callable[[], T], timeout: float | None) -> T:
        """``cond.wait_for(predicate, timeout)`` of a held ``cond``, ``timeout`` in virtual
        seconds."""
        if timeout is None:
            with self._blocked():
                return cond.wait_for(predicate)  # type: ignore[no-any-return]
        key, until = self._until(timeout, None)
        try:
            while True:
                result = predicate()
                if result or self._passed(until):
                    return result
                clock.real_wait(cond, _SLICE)
        finally:
            self._done_waiting(key)

    def acquire(self, lock: Any) -> None:
        """``lock.acquire()``: blocked in the clock while another thread holds it (the holder
        may be in ``sleep``; it counts for itself)."""
        if lock.acquire(False):
            return
        with self._blocked():
            lock.acquire()

    def get(self, queue: Any, timeout: float | None) -> Any:
        """``queue.get(timeout=timeout)`` with ``timeout`` in virtual seconds."""
        if timeout is None:
            with self._blocked():
                return queue.get()
        key, until = self._until(timeout, queue)
        try:
            while True:
                try:
                    return clock.real_get(queue, _SLICE)
                except queue_module.Empty:
                    if self._passed(until):
                        raise
        finally:
            self._done_waiting(key)

    def result(self, future: Any, timeout: float | None) -> Any:
        """``future.result(timeout)`` with ``timeout`` in virtual seconds."""
        if timeout is None:
            with self._blocked():
                return future.result()
        key, until = self._until(timeout, future)
        try:
            while True:
                try:
                    return clock.real_result(future, _SLICE)
                except FutureTimeoutError:
                    if self._passed(until):
                        raise
        finally:
            self._done_waiting(key)

    # -- autojump -------------------------------------------------------------------------------

    def _next_due(self) -> float | None:
        """The earliest time something waits for (under ``_cond``), or None."""
        while self._heap and self._heap[0][2].fn is None:
            heapq.heappop(self._heap)
        times = list(self._sleepers.values())
        times += [until for until, _ in self._waiters.values()]
        if self._heap:
            times.append(self._heap[0][0])
        loop_due = self._loops.next_due() if self._loops else None
        if loop_due is not None:
            times.append(loop_due)
        return min(times) if times else None

    def _quiet(self) -> bool:
        """Under ``_cond``: no taskflow work can progress and no waiter is about to."""
        if clock.busy() or not self._loops.quiet():
            return False
        return not any(_ready(obj) for _, obj in self._waiters.values() if obj is not None)

    def _quiet_for(self, threshold: float) -> bool:
        """Whether nothing moved (no reading of the clock, no count) for ``threshold`` real
        seconds and taskflow's work is quiet at the end of them."""
        seen = (self._epoch, clock.changes)
        clock.real_sleep(threshold)
        with self._cond:
            return (self._epoch, clock.changes) == seen and self._quiet()

    def _drive(self) -> None:
        """The autojump driver: jump once nothing moved for the threshold."""
        threshold = max(self.autojump_threshold, _MIN_THRESHOLD)
        while True:
            with self._cond:
                if self._closed:
                    return
                if self._next_due() is None:
                    clock.real_wait(self._cond, None)  # a timer, sleeper or waiter notifies
                    continue
            if not self._quiet_for(threshold):
                continue
            with self._cond:
                if self._closed:
                    return
                due = self._next_due()
                if due is None or due <= self._now:
                    continue  # a sleeper or waiter whose time came is on its way out
            self.jumps += 1
            self._advance_to(due)
