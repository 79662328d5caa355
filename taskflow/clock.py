"""The one clock seam: every reading of time and every timed wait in taskflow goes through here.

No other module of ``taskflow`` calls ``time.monotonic``, ``time.time``, ``time.sleep`` or waits
with a timeout on an ``Event``, a ``Condition``, a queue, a lock, a thread or a future
(``tests/structure/test_clock_seam.py`` reads the sources and fails on one that does). Callers
write ``from taskflow import clock`` and ``clock.now()``: they read the module attribute at each
call, never an alias bound at import, so what is installed here is what every caller sees.

Two kinds of time:

- **Semantic time** is what a run means by time: its budget and the timer's deadlines, node
  timeouts and ``deadline=``, retry back-offs, batch windows, rate-limit refills, breaker open
  periods, hedge delays, single-flight and cache TTLs and stale windows, retry budgets, the
  adaptive bulkhead's latency samples, ``ctx.remaining()``/``ctx.timeout()``, report and stats
  timings and stamps, the deadline headers. It is read through ``now()`` (monotonic seconds),
  ``wall()``/``wall_ns()`` (Unix time, for stamps and headers other machines read), ``sleep(s)``,
  the timed waits ``wait``, ``wait_for``, ``get`` and ``result``, ``call_later`` (a timer for
  the parts below the engine, which may not use its timer thread) and ``acquire`` (an untimed
  lock acquire whose holder may wait in the clock: a fake counts the waiter as blocked). Outside a fake clock these
  are ``time.monotonic``, ``time.time``, ``time.time_ns`` and ``time.sleep`` themselves (no extra
  call per reading) and the waits are the plain stdlib waits.
- **Mechanical time** is what keeps the machinery going; it has no meaning for a run's outcome
  and stays real under a fake clock. Its names say so: ``real_now``, ``real_wall``,
  ``real_sleep``, ``cpu_time``, ``real_wait``, ``real_wait_for``, ``real_get``, ``real_result``,
  ``real_join``, ``real_acquire``. The sites: the engine timer thread's own loop (``engine/timer.py`` serves real
  time; a fake gives semantic entries a heap of its own), ``Economy.watchdog`` (it looks every
  couple of milliseconds whether busy loops progress: on a virtual clock it would always be the
  next due timer, so it is armed on the real timer thread by name), ``closing.HOOK_GRACE`` (how
  long a closing run waits for hooks still running), ``Coordinator.KEEP_ALIVE`` (how long an idle
  coordinator thread lives), ``PoolMonitor`` (samples a real pool), the pools (keep-alive waits,
  queue-wait and run-time statistics, shutdown joins, handing the GIL over) and the jq child
  process of the declarative tasks (another process never runs on virtual time).

Installing a fake: ``install(fake)`` rebinds the semantic names of this module to the fake's
methods of the same names (``SemanticClock``); ``uninstall(fake)`` puts the real ones back.
Functions registered with ``on_change`` are called after each (with the fake, then with None),
for seams outside this module such as the engine timer's ``schedule``. A primitive made with
``clock=None`` (the default of ``Bulkhead``, ``RateLimit``, ``CircuitBreaker``, ``Batch``,
``SingleFlight``, the caches, ``RetryBudget``) reads the seam at each call, so one made at module
level before a fake is installed follows it; a clock given explicitly stays the primitive's own.
Only one fake is installed at a time; installing while runs are in flight is for the fake to
refuse (their ``t0`` was read on the other clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = [
    "SemanticClock",
    "acquire",
    "busy",
    "call_later",
    "cpu_time",
    "get",
    "install",
    "idle",
    "installed",
    "now",
    "on_change",
    "real_acquire",
    "real_get",
    "real_join",
    "real_now",
    "real_result",
    "real_sleep",
    "real_wait",
    "real_wait_for",
    "real_wall",
    "reset_counts",
    "result",
    "sleep",
    "uninstall",
    "wait",
    "wait_for",
    "wall",
    "wall_ns",
    "work_began",
    "work_ended",
    "work_queued",
    "work_started",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Waitable(Protocol):
    def wait(self, timeout: float | None = ...) -> bool: ...


class _Condition(Protocol):
    def wait_for(self, predicate: Callable[[], T], timeout: float | None = ...) -> T: ...


class _Queue(Protocol[T_co]):
    def get(self, block: bool = ..., timeout: float | None = ...) -> T_co: ...


class _Future(Protocol):
    def result(self, timeout: float | None = ...) -> Any: ...


class _Thread(Protocol):
    def join(self, timeout: float | None = ...) -> None: ...


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class SemanticClock(Protocol):
    """What a fake clock provides to be installed: the semantic names of this module."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def wall_ns(self) -> int: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, waitable: _Waitable, timeout: float | None) -> bool: ...

    def wait_for(self, cond: _Condition, predicate: Callable[[], T],
                 timeout: float | None) -> T: ...

    def get(self, queue: _Queue[T], timeout: float | None) -> T: ...

    def result(self, future: _Future, timeout: float | None) -> Any: ...

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> _Cancellable: ...

    def acquire(self, lock: _Lock) -> None: ...


# -- semantic time: what a fake clock replaces ---------------------------------------------------

now: Callable[[], float] = time.monotonic
"""Monotonic seconds: budgets, deadlines, timeouts, windows, TTLs, report timings."""

wall: Callable[[], float] = time.time
"""Unix time in seconds: stamps and ages compared across processes or shown to people."""

wall_ns: Callable[[], int] = time.time_ns
"""Unix time in nanoseconds: the absolute deadline header."""

sleep: Callable[[float], None] = time.sleep
"""Block the calling thread ``seconds`` of semantic time."""


def wait(waitable: _Waitable, timeout: float | None) -> bool:
    """``waitable.wait(timeout)`` of an ``Event`` or a held ``Condition``, in semantic time."""
    return waitable.wait(timeout)


def wait_for(cond: _Condition, predicate: Callable[[], T], timeout: float | None) -> T:
    """``cond.wait_for(predicate, timeout)`` of a held ``Condition``, in semantic time."""
    return cond.wait_for(predicate, timeout)


def get(queue: _Queue[T], timeout: float | None) -> T:
    """``queue.get(timeout=timeout)`` in semantic time (``queue.Empty`` when it passes)."""
    return queue.get(timeout=timeout)


def result(future: _Future, timeout: float | None) -> Any:
    """``future.result(timeout)`` in semantic time (``TimeoutError`` when it passes)."""
    return future.result(timeout)


def call_later(delay: float, fn: Callable[..., Any], *args: Any) -> _Cancellable:
    """Call ``fn(*args)`` on a daemon thread of its own after ``delay`` seconds of semantic time
    (for parts that may not use the engine's timer thread); the handle's ``cancel()`` drops it."""
    handle = threading.Timer(delay, fn, args)
    handle.daemon = True
    handle.start()
    return handle


def acquire(lock: _Lock) -> None:
    """``lock.acquire()``, without a timeout, where the holder may wait in the clock (a source
    sleeping in ``sleep`` while holding it): under a fake clock the waiting thread counts as
    blocked, not as work that can progress, so autojump still moves time for the holder. A
    caller on a hot path tries ``lock.acquire(False)`` first and comes here only when it is
    held."""
    lock.acquire()


# -- mechanical time: always real, fake clock or not --------------------------------------------

real_now: Callable[[], float] = time.monotonic
"""Monotonic seconds of the machinery: the timer thread, the watchdog, pools, monitors."""

real_wall: Callable[[], float] = time.time
"""Unix time of the machinery: pool and monitor snapshots."""

real_sleep: Callable[[float], None] = time.sleep
"""A real pause (``real_sleep(0)`` hands the GIL to another thread)."""

cpu_time: Callable[[], float] = time.thread_time
"""CPU seconds of the calling thread (pool statistics)."""


def real_wait(waitable: _Waitable, timeout: float | None) -> bool:
    """``waitable.wait(timeout)`` in real time."""
    return waitable.wait(timeout)


def real_wait_for(cond: _Condition, predicate: Callable[[], T], timeout: float | None) -> T:
    """``cond.wait_for(predicate, timeout)`` in real time."""
    return cond.wait_for(predicate, timeout)


def real_get(queue: _Queue[T], timeout: float | None) -> T:
    """``queue.get(timeout=timeout)`` in real time."""
    return queue.get(timeout=timeout)


def real_result(future: _Future, timeout: float | None) -> Any:
    """``future.result(timeout)`` in real time."""
    return future.result(timeout)


def real_join(thread: _Thread, timeout: float | None) -> None:
    """``thread.join(timeout)`` in real time."""
    thread.join(timeout)


def real_acquire(lock: _Lock, timeout: float) -> bool:
    """``lock.acquire(True, timeout)`` in real time (``timeout`` < 0: no limit)."""
    return lock.acquire(True, timeout)


# -- installing a fake ---------------------------------------------------------------------------

_SEMANTIC = ("now", "wall", "wall_ns", "sleep", "wait", "wait_for", "get", "result",
             "call_later", "acquire")
_REAL: dict[str, Any] = {name: globals()[name] for name in _SEMANTIC}
_installed: SemanticClock | None = None
_listeners: list[Callable[[SemanticClock | None], None]] = []
_shift_listeners: list[Callable[[float], None]] = []
offset = 0.0
"""Seconds added to the monotonic clocks since a fake clock left time ahead of them (0.0 in a
process that never installed one: then ``now`` and ``real_now`` are ``time.monotonic``)."""


def installed() -> SemanticClock | None:
    """The fake clock installed, or None (real time)."""
    return _installed


def on_change(listener: Callable[[SemanticClock | None], None]) -> None:
    """Call ``listener(fake)`` after each ``install`` and ``listener(None)`` after each
    ``uninstall``, on the thread that made the change (a seam kept outside this module)."""
    _listeners.append(listener)


def on_shift(listener: Callable[[float], None]) -> None:
    """Call ``listener(seconds)`` when the clocks move ahead by ``seconds`` (``uninstall``
    with ``ahead``): what was scheduled on ``real_now`` before must move with it."""
    _shift_listeners.append(listener)


def _shift(seconds: float) -> None:
    """Move ``now`` and ``real_now`` ahead by ``seconds``, for good. Unix time (``wall``) stays
    the real one: other machines and processes read it."""
    global offset
    offset += seconds
    ahead, mono = offset, time.monotonic

    def shifted_now() -> float:
        return mono() + ahead

    globals()["real_now"] = shifted_now
    _REAL["now"] = shifted_now
    for listener in list(_shift_listeners):
        listener(seconds)


def install(fake: SemanticClock) -> None:
    """Point the semantic names of this module at ``fake``'s methods of the same names (a
    ``seam_<name>`` attribute, when the fake has one, stands for ``<name>``).

    Raises:
        RuntimeError: another fake clock is installed (the first must be uninstalled first).
    """
    global _installed
    if _installed is not None:
        raise RuntimeError(f"a fake clock is already installed ({_installed!r}): "
                           "uninstall it before installing another")
    names = globals()
    for name in _SEMANTIC:
        names[name] = getattr(fake, f"seam_{name}", None) or getattr(fake, name)
    _installed = fake
    for listener in list(_listeners):
        listener(fake)


def uninstall(fake: SemanticClock, ahead: float = 0.0) -> None:
    """Put real time back (undoes ``install(fake)``). ``ahead``: how far the fake's time ran
    ahead of the real clock; monotonic time then continues from there (``now`` and ``real_now``
    move ahead by it, and ``on_shift`` listeners are told), so it never goes back: a timestamp a
    bulkhead, breaker, rate limit or cache took under the fake stays in the past. Unix time
    (``wall``) is the real one again.

    Raises:
        RuntimeError: ``fake`` is not the installed clock.
    """
    global _installed
    if _installed is not fake:
        raise RuntimeError(f"{fake!r} is not the installed clock ({_installed!r})")
    if ahead > 0:
        _shift(ahead)
    globals().update(_REAL)
    _installed = None
    for listener in list(_listeners):
        listener(None)


# -- what a fake clock's autojump watches: taskflow work that can make progress -----------------
# While ``counting`` (set by an installed fake clock), the worker loops count themselves
# (``engine/loops.py``): a loop is *queued* from its submission until it starts, then its thread is
# *active* until its outermost loop returns, except while the thread blocks in the fake clock (a
# ``sleep``, a timed wait, an untimed wait or ``acquire`` in the clock: ``idle``). Each thread
# keeps its own part (``_Count``), stamped with the ``reset_counts`` it was counted under, so a
# loop left running from an earlier clock neither stalls this one nor hides its work. ``busy()`` is queued + active: 0 means no taskflow work can
# progress until time moves. ``changes`` counts every change, so a watcher can tell "0 for a
# while" from "0 now". Outside a fake clock nothing is counted: one read of ``counting`` per loop.

counting = False
"""Whether the loops count themselves (a fake clock is installed)."""

changes = 0
"""How many times the counts changed (what a watcher compares)."""

_count_lock = threading.Lock()  # guards _queued, _active, changes and every thread's _Count
_queued = 0
_active = 0
_generation = 0  # bumped by each reset_counts: a thread's count of an earlier one is not ours


class _Count:
    """One thread's part in the counts: how many loops it runs (one inside another), how many
    clock waits it is blocked in, and under which ``reset_counts`` it was counted (a loop that
    began under an earlier fake clock, still running when this one was entered, belongs to an
    ended run: it neither adds to this clock's counts nor takes from them when it ends)."""

    __slots__ = ("blocked", "depth", "generation")

    def __init__(self) -> None:
        self.depth = 0
        self.blocked = 0
        self.generation = -1


_local = threading.local()


def _count() -> _Count:
    try:
        return _local.count  # type: ignore[no-any-return]
    except AttributeError:
        count = _local.count = _Count()
        return count


def work_queued(k: int = 1) -> None:
    """``k`` loops were handed to an executor (before ``submit``); each later starts or drops."""
    global _queued, changes
    with _count_lock:
        _queued += k
        changes += 1


def work_dropped() -> None:
    """A queued loop will never start (refused, cancelled, dropped by the executor)."""
    global _queued, changes
    with _count_lock:
        _queued = max(0, _queued - 1)
        changes += 1


def _enter() -> None:
    """Under ``_count_lock``: one more loop on this thread (the thread is active from the first
    it runs under these counts)."""
    global _active
    count = _count()
    if count.generation != _generation:  # first loop under these counts: the thread joins them
        count.generation = _generation
        count.blocked = 0  # it is running, not waiting in a clock
        _active += 1
    elif count.depth == 0:
        _active += 1
    count.depth += 1


def work_started(runs_here: bool = True) -> None:
    """A queued loop started on this thread (``runs_here=False``: it was queued behind one this
    thread already runs, and runs inside it)."""
    global _queued, changes
    with _count_lock:
        if runs_here:
            _enter()
        _queued = max(0, _queued - 1)
        changes += 1


def work_began() -> None:
    """This thread does taskflow work that was never queued (a ``start`` caller serving its
    run); ``work_ended()`` follows."""
    global changes
    with _count_lock:
        _enter()
        changes += 1


def work_ended() -> None:
    """The loop this thread started with ``work_started()`` returned."""
    global _active, changes
    with _count_lock:
        count = _count()
        if count.depth > 0:
            count.depth -= 1
            if count.depth == 0 and count.generation == _generation and not count.blocked:
                _active -= 1
        changes += 1


def idle(blocked: bool) -> None:
    """This thread blocks in the fake clock (``True``) or is back from it (``False``): a loop
    thread that sleeps or waits in virtual time cannot progress until time moves."""
    global _active, changes
    count = getattr(_local, "count", None)
    if count is None or not count.depth:
        return  # not a loop's thread: it was never counted
    with _count_lock:
        if count.generation != _generation:
            return  # counted under an earlier clock: not part of these counts
        if blocked:
            count.blocked += 1
            if count.blocked == 1:
                _active -= 1
        elif count.blocked:
            count.blocked -= 1
            if count.blocked == 0:
                _active += 1
        changes += 1


def busy() -> int:
    """Loops queued plus threads running a loop and not blocked in the clock."""
    return _queued + _active


def reset_counts(on: bool) -> None:
    """Start (``on``) or stop counting, from zero (a fake clock's install and uninstall). A
    thread still in a loop it began before is left out of the new counts until its next loop."""
    global counting, _queued, _active, changes, _generation
    with _count_lock:
        counting = on
        _queued = _active = 0
        _generation += 1
        changes += 1
