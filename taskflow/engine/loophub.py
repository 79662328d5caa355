"""Hand-overs to and from an event loop in batches (``aio.py``'s attempts use them).

A ``Hub`` stands for one event loop. Any thread hands the loop a call with ``Hub.call``: the
call joins the hub's queue, and only the thread that finds no drain scheduled schedules one
(``call_soon_threadsafe``: one write to the loop's self-pipe, one wake-up of its thread), so
the attempts that workers start while the loop thread waits for the GIL are begun together, by
one drain. The drain clears the flag before it takes the first call, so a call queued after
the flag was read set is taken by this drain, and one queued after the flag was cleared
schedules another (which may find nothing left: harmless).

The loop thread hands outcomes to a run's owner with ``Hub.post``: they are kept per run until
the end of the loop's iteration, then go over in one ``run.post`` (one wake-up of the owner
for all the attempts of the run that ended in the same iteration), in the order they came; a
row of calls of a function registered in ``batched`` is made as one call of its batch function
(``aio.py``'s outcomes: recorded under one lock of the run, ``aiorecord.py``).

``Hub.name`` is the loop thread's name (from the first drain on; None before), what an
attempt on the loop shows as its thread.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any

from taskflow import _fork

__all__ = ["Hub", "hub_of", "name_of"]

# hubs kept before those of loops gone are pruned
_PRUNE_AT = 64


class Hub:
    """One event loop's queue of calls to make on it and outcomes to hand back (see the
    module)."""

    __slots__ = ("__weakref__", "calls", "ends", "flushing", "name", "ref", "scheduled")

    def __init__(self, loop: Any, name: str | None) -> None:
        self.ref = weakref.ref(loop)
        self.name = name
        self.calls: deque[tuple[Any, Any]] = deque()
        self.scheduled = False  # a drain is scheduled on the loop (any thread)
        self.ends: dict[int, tuple[Any, list[tuple[Any, tuple[Any, ...]]]]] = {}  # loop only
        self.flushing = False  # a flush of ``ends`` is scheduled (loop thread only)

    def call(self, loop: Any, fn: Any, arg: Any) -> None:
        """Any thread: have the loop call ``fn(arg)`` soon.

        Raises:
            RuntimeError: the loop is closed (the call is not made).
        """
        item = (fn, arg)
        self.calls.append(item)
        if self.scheduled:
            return  # the drain scheduled takes it
        self.scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            self.scheduled = False
            try:
                self.calls.remove(item)
            except ValueError:
                pass  # taken meanwhile: it runs
            else:
                raise

    def _drain(self) -> None:
        """The loop thread: make the calls queued."""
        self.scheduled = False
        if self.name is None:
            self.name = threading.current_thread().name
        calls = self.calls
        try:
            while calls:
                fn, arg = calls.popleft()
                fn(arg)
        finally:
            if calls and not self.scheduled:  # a call raised: the next drain takes the rest
                self.scheduled = True
                loop = self.ref()
                if loop is not None:
                    loop.call_soon(self._drain)

    def post(self, run: Any, fn: Any, args: tuple[Any, ...]) -> None:
        """The loop thread: ``run.post(fn, *args)`` at the end of this iteration of the loop,
        with the other outcomes for ``run`` of the iteration."""
        batch = self.ends.get(id(run))
        if batch is not None:
            batch[1].append((fn, args))
            return
        self.ends[id(run)] = (run, [(fn, args)])
        if not self.flushing:
            self.flushing = True
            self.ref().call_soon(self._flush)  # type: ignore[union-attr]  # it runs this

    def _flush(self) -> None:
        """The loop thread: hand each run its outcomes of the iteration."""
        self.flushing = False
        ends, self.ends = self.ends, {}
        for run, items in ends.values():
            if len(items) == 1:
                fn, args = items[0]
                run.post(fn, *args)
            else:
                run.post(_each, items)


# fn -> a function taking the argument tuples of a row of calls of fn (registered by its module)
batched: dict[Any, Any] = {}


def _each(items: list[tuple[Any, tuple[Any, ...]]]) -> None:
    """The run's owner: the outcomes one iteration of the loop handed over, in order; a row of
    calls of a function in ``batched`` goes to its batch function in one call."""
    j, n = 0, len(items)
    while j < n:
        fn, args = items[j]
        many = batched.get(fn)
        if many is None:
            fn(*args)
            j += 1
            continue
        k = j + 1
        while k < n and items[k][0] is fn:
            k += 1
        many([a for _, a in items[j:k]])
        j = k


class _Hubs:
    """The hubs by ``id`` of their loop (``lock`` guards adding one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_loop: dict[int, Hub] = {}
        _fork.register(self, hold="lock")

    def _after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.by_loop = {}  # the parent's loops do not run here


_hubs = _Hubs()


def name_of(loop: Any) -> str | None:
    """The name of the thread running ``loop``, once a drain ran there (else None)."""
    hub = _hubs.by_loop.get(id(loop))
    return hub.name if hub is not None and hub.ref() is loop else None


def hub_of(loop: Any, name: str | None = None) -> Hub:
    """The hub of ``loop`` (made on first use; ``name``: its thread's, when known)."""
    hub = _hubs.by_loop.get(id(loop))
    if hub is not None and hub.ref() is loop:
        return hub
    with _hubs.lock:
        by_loop = _hubs.by_loop
        hub = by_loop.get(id(loop))
        if hub is None or hub.ref() is not loop:
            if len(by_loop) >= _PRUNE_AT:
                for key in [k for k, h in by_loop.items() if h.ref() is None]:
                    del by_loop[key]
            hub = by_loop[id(loop)] = Hub(loop, name)
        return hub
