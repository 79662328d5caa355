"""Virtual time on event loops: what a ``FakeClock`` does to the loops async nodes run on.

While a ``FakeClock`` is entered, every loop an async node's attempt is handed to (taskflow's
loop thread ``taskflow-asyncio``, the loop given to ``taskflow.set_event_loop``, the loop that
awaits ``run_async``) is *attached* before the attempt reaches it (``aio.on_loop``), and
taskflow's loop thread is attached on entering if it runs already. An attached loop:

- reads virtual time: its ``time`` method is replaced by one that goes on from the loop's own
  time at attaching and moves only as virtual time moves (the two differ by a constant per loop,
  so no timer the loop set before jumps), so ``asyncio.sleep``, ``asyncio.wait_for``,
  ``asyncio.timeout``, ``loop.call_later``/``call_at`` and every library built on them wait in
  virtual time;
- waits in ``select`` for its sockets as before, but never longer than a short real slice while
  a timer is due only in virtual time, and the fake wakes it (``call_soon_threadsafe``) each time
  virtual time moves, so a timer fires as soon as its virtual time comes;
- is counted by autojump: the loop is quiet only while it blocks in ``select`` with no ready
  callback and no timer due, so time moves only when no async task can progress either. A task
  awaiting an ``asyncio.sleep`` on virtual time is blocked; a task awaiting a real socket holds
  time while bytes arrive (each event the loop serves counts as activity) and, as any wait
  taskflow cannot see, lets time move once nothing happened for ``autojump_threshold``;
- gives the fake its earliest timer (``next_due``), so ``advance`` fires the loop's timers and
  the engine's in the order of their times, waiting (real time, bounded) after each step until
  the loop has served what came due, and ``jump`` and autojump go to a loop's timer as to any.

On leaving, the loop's own ``select`` is back, and its own ``time`` too unless virtual time ran
ahead of it: then the loop's time is its own plus how far ahead it got (for the rest of the
loop's life), so it never goes back and a timer set under the fake clock fires in real time
after what was left of its delay, late rather than never.

Limits: only loops built on ``asyncio.BaseEventLoop`` with a selector (the default loops on
Linux and macOS) can be attached; another loop (uvloop, the Windows proactor) is left on real
time, with a warning once. A loop attached after the fake clock was entered (the loop of a
``run_async`` caller, at its first async node) is on virtual time from then on; what it did
before ran in real time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from taskflow import clock
from taskflow.logs import logger

__all__ = ["VirtualLoops"]

# the longest an attached loop waits in select while a timer is due in virtual time (real s)
_CAP = 0.05
# how long settling looks between two checks (real seconds)
_SLICE = 0.00025


def _noop() -> None:
    """What waking a loop runs."""


def _ahead(own: Callable[[], float], ahead: float) -> Callable[[], float]:
    """A loop's time after a fake clock left it ``ahead`` seconds ahead of its own."""

    def time() -> float:
        return own() + ahead

    return time


class _Attached:
    """One attached loop: what was replaced, how its time relates to the seam's (``delta``:
    seam time minus loop time), and whether the loop blocks in select."""

    __slots__ = ("blocked", "delta", "had_time", "ident", "loop", "old_time", "own", "selector",
                 "tell")

    def __init__(self, loop: Any, seam_now: float) -> None:
        self.loop = loop
        self.selector = loop._selector
        self.had_time = "time" in vars(loop)
        self.old_time = vars(loop).get("time")
        self.own: Callable[[], float] = loop.time
        self.delta: float = seam_now - self.own()
        self.blocked = False
        self.ident = 0  # the loop's thread, once it selected
        self.tell = True  # whether entering the next blocking select is news


def _due(loop: Any) -> float | None:
    """The earliest time a live timer of ``loop`` waits for (read from another thread)."""
    best: float | None = None
    for handle in list(loop._scheduled):
        if not handle._cancelled and (best is None or handle._when < best):
            best = handle._when
    return best


class VirtualLoops:
    """The loops a fake clock drives (see the module docstring).

    Args:
        now: the fake's seam time (read without counting as a reading of the clock).
        moved: called when an attached loop did something (``True``: it now blocks in
            select, with timers, so a waiting driver should look again).
    """

    def __init__(self, now: Callable[[], float], moved: Callable[[bool], None]) -> None:
        self._now = now
        self._moved = moved
        self._lock = threading.Lock()  # guards _loops
        self._loops: dict[int, _Attached] = {}
        self._warned = False
        self.activity = 0  # how many times an attached loop served something

    def __bool__(self) -> bool:
        return bool(self._loops)

    def attach(self, loop: Any) -> None:
        """Drive ``loop``'s timers on virtual time from now on (any thread; once per loop)."""
        if id(loop) in self._loops:
            return
        if not all(hasattr(loop, name) for name in ("_selector", "_scheduled", "_ready")):
            if not self._warned:
                self._warned = True
                logger.warning("taskflow FakeClock: the event loop {!r} is not an asyncio "
                               "selector loop; its timers stay on real time", loop)
            return
        if loop.is_closed():
            return
        with self._lock:
            if id(loop) in self._loops:
                return
            att = _Attached(loop, self._now())
            att.selector.select = self._select(att, att.selector.select)
            loop.time = self._time(att)
            self._loops[id(loop)] = att
        self._wake(att)  # a select already waiting on real time looks again
        self._moved(True)

    def _time(self, att: _Attached) -> Callable[[], float]:
        now, delta = self._now, att.delta

        def time() -> float:
            return now() - delta

        return time

    def _select(self, att: _Attached, real_select: Callable[[Any], Any]
                ) -> Callable[..., Any]:
        def select(timeout: float | None = None) -> Any:
            att.ident = threading.get_ident()
            if timeout is not None and timeout <= 0:  # ready callbacks: the loop is busy
                self.activity += 1
                self._moved(False)
                return real_select(timeout)
            if timeout is not None:
                timeout = min(timeout, _CAP)
            att.blocked = True
            if att.tell:
                self._moved(True)
            try:
                events = real_select(timeout)
            finally:
                att.blocked = False
            att.tell = bool(events)
            if events:
                self.activity += 1
                self._moved(False)
            return events

        return select

    def next_due(self) -> float | None:
        """The earliest time a timer of an attached loop waits for, or None."""
        best: float | None = None
        for att in list(self._loops.values()):
            if att.loop.is_closed():
                continue
            due = _due(att.loop)
            if due is not None and (best is None or due + att.delta < best):
                best = due + att.delta
        return best

    def quiet(self) -> bool:
        """Whether no attached loop can progress before time moves: each blocks in select with
        no ready callback and no timer due (the calling thread's own loop is not waited for)."""
        me = threading.get_ident()
        now = self._now()
        for att in list(self._loops.values()):
            loop = att.loop
            if loop.is_closed() or not loop.is_running() or att.ident == me:
                continue  # nothing runs there, or it is the caller's own
            if not att.blocked or loop._ready:
                return False
            due = _due(loop)
            if due is not None and due + att.delta <= now:
                return False
        return True

    def wake(self) -> None:
        """Have every attached loop look at the time again (virtual time moved)."""
        for att in list(self._loops.values()):
            self._wake(att)

    @staticmethod
    def _wake(att: _Attached) -> None:
        with contextlib.suppress(RuntimeError):  # closed: nothing runs there
            att.loop.call_soon_threadsafe(_noop)

    def settle(self, others_quiet: Callable[[], bool], timeout: float) -> bool:
        """Wake the loops and wait (``timeout`` real seconds at most) until they and
        ``others_quiet`` (what hands work to them) are quiet together; False if it passed."""
        if not self._loops:
            return True
        self.wake()
        deadline = clock.real_now() + timeout
        while True:
            seen = self.activity
            if self.quiet() and others_quiet() and self.quiet() and self.activity == seen:
                return True
            if clock.real_now() >= deadline:
                return False
            clock.real_sleep(_SLICE)

    def restore(self) -> None:
        """Put every attached loop's own ``time`` and ``select`` back (the fake clock left)
        and wake it."""
        with self._lock:
            attached, self._loops = list(self._loops.values()), {}
        for att in attached:
            with contextlib.suppress(AttributeError):
                del att.selector.select
            loop = att.loop
            ahead = (self._now() - att.delta) - att.own()
            if ahead > 0:
                loop.time = _ahead(att.own, ahead)  # on from the virtual time reached
            elif att.had_time:
                loop.time = att.old_time
            else:
                with contextlib.suppress(AttributeError):
                    del loop.time
            self._wake(att)
