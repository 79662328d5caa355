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
  ``wall()``/``wall_ns()`` (Unix time, for stamps and headers other machines read), ``sleep(s)``
  and the timed waits ``wait``, ``wait_for``, ``get`` and ``result``. Outside a fake clock these
  are ``time.monotonic``, ``time.time``, ``time.time_ns`` and ``time.sleep`` themselves (no extra
  call per reading) and the waits are the plain stdlib waits.
- **Mechanical time** is what keeps the machinery going; it has no meaning for a run's outcome
  and stays real under a fake clock. Its names say so: ``real_now``, ``real_wall``,
  ``real_sleep``, ``cpu_time``, ``real_wait``, ``real_wait_for``, ``real_get``, ``real_join``,
  ``real_acquire``. The sites: the engine timer thread's own loop (``engine/timer.py`` serves real
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

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = [
    "SemanticClock",
    "cpu_time",
    "get",
    "install",
    "installed",
    "now",
    "on_change",
    "real_acquire",
    "real_get",
    "real_join",
    "real_now",
    "real_sleep",
    "real_wait",
    "real_wait_for",
    "real_wall",
    "result",
    "sleep",
    "uninstall",
    "wait",
    "wait_for",
    "wall",
    "wall_ns",
]

T = TypeVar("T")


class _Waitable(Protocol):
    def wait(self, timeout: float | None = ...) -> bool: ...


class _Condition(Protocol):
    def wait_for(self, predicate: Callable[[], T], timeout: float | None = ...) -> T: ...


class _Queue(Protocol):
    def get(self, block: bool = ..., timeout: float | None = ...) -> Any: ...


class _Future(Protocol):
    def result(self, timeout: float | None = ...) -> Any: ...


class _Thread(Protocol):
    def join(self, timeout: float | None = ...) -> None: ...


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...


class SemanticClock(Protocol):
    """What a fake clock provides to be installed: the semantic names of this module."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def wall_ns(self) -> int: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, waitable: _Waitable, timeout: float | None) -> bool: ...

    def wait_for(self, cond: _Condition, predicate: Callable[[], T],
                 timeout: float | None) -> T: ...

    def get(self, queue: _Queue, timeout: float | None) -> Any: ...

    def result(self, future: _Future, timeout: float | None) -> Any: ...


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


def get(queue: _Queue, timeout: float | None) -> Any:
    """``queue.get(timeout=timeout)`` in semantic time (``queue.Empty`` when it passes)."""
    return queue.get(timeout=timeout)


def result(future: _Future, timeout: float | None) -> Any:
    """``future.result(timeout)`` in semantic time (``TimeoutError`` when it passes)."""
    return future.result(timeout)


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


def real_get(queue: _Queue, timeout: float | None) -> Any:
    """``queue.get(timeout=timeout)`` in real time."""
    return queue.get(timeout=timeout)


def real_join(thread: _Thread, timeout: float | None) -> None:
    """``thread.join(timeout)`` in real time."""
    thread.join(timeout)


def real_acquire(lock: _Lock, timeout: float) -> bool:
    """``lock.acquire(True, timeout)`` in real time (``timeout`` < 0: no limit)."""
    return lock.acquire(True, timeout)


# -- installing a fake ---------------------------------------------------------------------------

_SEMANTIC = ("now", "wall", "wall_ns", "sleep", "wait", "wait_for", "get", "result")
_REAL: dict[str, Any] = {name: globals()[name] for name in _SEMANTIC}
_installed: SemanticClock | None = None
_listeners: list[Callable[[SemanticClock | None], None]] = []


def installed() -> SemanticClock | None:
    """The fake clock installed, or None (real time)."""
    return _installed


def on_change(listener: Callable[[SemanticClock | None], None]) -> None:
    """Call ``listener(fake)`` after each ``install`` and ``listener(None)`` after each
    ``uninstall``, on the thread that made the change (a seam kept outside this module)."""
    _listeners.append(listener)


def install(fake: SemanticClock) -> None:
    """Point the semantic names of this module at ``fake``'s methods of the same names.

    Raises:
        RuntimeError: another fake clock is installed (the first must be uninstalled first).
    """
    global _installed
    if _installed is not None:
        raise RuntimeError(f"a fake clock is already installed ({_installed!r}): "
                           "uninstall it before installing another")
    names = globals()
    for name in _SEMANTIC:
        names[name] = getattr(fake, name)
    _installed = fake
    for listener in list(_listeners):
        listener(fake)


def uninstall(fake: SemanticClock) -> None:
    """Put real time back (undoes ``install(fake)``).

    Raises:
        RuntimeError: ``fake`` is not the installed clock.
    """
    global _installed
    if _installed is not fake:
        raise RuntimeError(f"{fake!r} is not the installed clock ({_installed!r})")
    globals().update(_REAL)
    _installed = None
    for listener in list(_listeners):
        listener(None)
