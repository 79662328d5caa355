"""What a run knows of single attempts: ``ctx.on_cancel`` callbacks, the deadline an attempt may
still use, and the calls clamped to it.

Nothing here exists for a run until one of its tasks asks: ``run.watch`` is None, and every
engine path that could abandon an attempt tests that one field first, so nodes that do not use
these options pay nothing.

Attempts and their end
======================
An attempt is one call of a node's task (or of a fan-out item's ``work``) on one thread. The
engine already writes, on the thread running it, ``current.run`` (the run) and ``current.idx``
(the node) around every task call, and ``current.item`` around every fan-out item. The first
``ctx.on_cancel`` of an attempt replaces ``current.idx`` with a ``Mark``: an ``int`` equal to
the node's index (every reader of ``current.idx`` sees the same number) whose identity names
the attempt. The engine overwrites ``current.idx`` when the thread moves to another node, a
hedged duplicate or the end of its loop, so the attempt is still running exactly while its
thread's ``current`` still holds the run, the mark, the same item and the node's attempt count
(a retry on the same thread counts one more). A nested inline run on the same thread
(``inline.py``) keeps the outer pair in ``Run.outer``, so an attempt inside a nested flow is
still seen running. An attempt whose task has returned but whose outcome was not recorded
yet counts as running: its outcome will be dropped.

Abandonment
===========
Every way a run gives up on attempts calls ``abandon(run, nodes)`` once the nodes' new state is
written: ``closing.close`` (the run's deadline, ``ctx.cancel``: its victims), ``deadlines.
node_timeout`` (a node's own timeout), ``settling`` (a join that no longer needs a father),
``Run.complete`` (the node's outcome was recorded by another attempt: a hedged
duplicate that won, or a fan-out whose items still run; the recording thread's own attempt is
spared) and the fan-out's item timeout (that item only). ``abandon`` takes the attempts still
running out of the watch, under the watch's lock, and hands their callbacks to a
``taskflow-coordinator`` thread (``remote.coordinator``, the helper threads that also own
``submit`` runs): never the timer thread, never under a lock, and never lost when ``start`` has
returned (the owner's inbox is no longer read then). One slow callback gets a coordinator
thread of its own, so it delays no run. Attempts that ended by themselves are dropped without
a call. Each callback is taken out exactly once, under the lock, so it runs at most once.

Registering after the abandonment (``register`` finds the node already ended, the run closed
without it, or its item no longer in flight) runs ``fn`` at once on the registering thread.
Both sides read the node's state under the watch's lock after the engine wrote it under the
run's, so one of them always sees the other: every callback runs exactly once.

Lock order: the run's lock, then the watch's (``abandon`` may be called under the run's lock;
nothing here takes the run's lock while holding the watch's, but ``watch_of`` creating it).

Fields of a ``Watch`` (all guarded by ``Watch.lock``)
======================================================
``live``: node -> attempts that registered callbacks and were not yet abandoned or dropped.
``counts``: node -> [callbacks registered, run, raised].
``clamps``: node -> up to ``MAX_CLAMPS`` (attempt, seconds) of calls clamped to the deadline;
``clamped``: node -> how many calls were clamped in all.
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from taskflow.engine import hooks as hooking
from taskflow.engine import remote, sections
from taskflow.errors import traceback_text
from taskflow.model.context import current
from taskflow.model.result import AttemptNotes, ResultState

__all__ = ["MAX_CLAMPS", "Asking", "Mark", "Watch", "WatchedRun", "abandon", "deadline_of",
           "note_clamp", "register", "track", "track_many", "watch_of"]

# clamped calls kept per node for the report (all are counted)
MAX_CLAMPS = 16
# attempts kept per node before ended ones are pruned at the next registration
_PRUNE_AT = 64

_DEFAULT = ResultState.DEFAULT


class WatchRecord(Protocol):
    """What a finished run leaves for its result (``closing.FinishedRun``): its watch."""

    watch: Watch | None


class WatchedRun(hooking.HookedRun, Protocol):
    """What this module uses of a run (``run.Run`` satisfies it; ``run.py`` has mypy check
    that): what hooks see, and ``watch`` (created once under ``lock``: ``watch_of``), ``fans``
    (under ``lock``; read here with single dict look-ups) and ``cv`` (fixed)."""

    watch: Watch | None
    fans: dict[int, Any]
    cv: contextvars.Context

    @property
    def record(self) -> WatchRecord | None:
        """What the run left for its result once it finished (None before)."""


class Mark(int):
    """``current.idx`` while an attempt that registered callbacks runs: the node's index, whose
    identity names the attempt."""

    __slots__ = ()


class _Attempt:
    """One attempt with callbacks: its thread's ``current`` dict, the mark, the node's attempt
    count and the fan-out item it runs (None: the node itself)."""

    __slots__ = ("fns", "item", "mark", "number", "stop", "tls")

    def __init__(self, tls: dict[str, Any], mark: Mark, number: int, item: Any) -> None:
        self.tls = tls
        self.mark = mark
        self.number = number
        self.item = item
        self.fns: list[Callable[[], object]] = []
        self.stop: Callable[[], object] | None = None  # the engine's own (``track``)


class Watch:
    """One run's attempts with callbacks, their counts and the clamped calls (see the
    module)."""

    __slots__ = ("clamped", "clamps", "counts", "live", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, list[_Attempt]] = {}
        self.counts: dict[int, list[int]] = {}
        self.clamps: dict[int, list[tuple[int, float]]] = {}
        self.clamped: dict[int, int] = {}

    def notes(self) -> dict[int, AttemptNotes]:
        """Node -> what its attempts registered, ran and were clamped to (nodes with any)."""
        out: dict[int, AttemptNotes] = {}
        with self.lock:
            for i in sorted(set(self.counts) | set(self.clamps)):
                registered, ran, raised = self.counts.get(i, (0, 0, 0))
                out[i] = AttemptNotes(tuple(self.clamps.get(i, ())), self.clamped.get(i, 0),
                                      registered, ran, raised)
        return out


class Asking:
    """The attempt of node ``i`` (fan-out ``item``, or None) running on the asking thread, as
    the context sees it (``model.context.AttemptView``; made per question, by ``Run.asking``)."""

    __slots__ = ("i", "item", "run")

    def __init__(self, run: WatchedRun, i: int, item: Any) -> None:
        self.run = run
        self.i = i
        self.item = item

    def deadline(self) -> float:
        return deadline_of(self.run, self.i, self.item)

    def on_cancel(self, fn: Callable[[], object]) -> None:
        register(self.run, self.i, fn)

    def note_clamp(self, seconds: float) -> None:
        note_clamp(self.run, self.i, seconds)


def watch_of(run: WatchedRun) -> Watch:
    """The run's watch, created on first use."""
    w = run.watch
    if w is None:
        with run.lock:
            w = run.watch
            if w is None:
                w = run.watch = Watch()
                record = run.record
                if record is not None:  # an abandoned attempt asks after the run finished
                    record.watch = w
    return w


def deadline_of(run: WatchedRun, i: int, item: Any) -> float:
    """The deadline (``clock.now()``) of an attempt of node ``i`` (of its fan-out ``item``,
    or None): the run's, its node's own timeout from its first start, its deadline from the
    run's start, the item's timeout;
    ``-inf`` once the run has given up on it."""
    wr = run.results[i]
    if wr.state is not _DEFAULT or (run.closed and i != run.keep):
        return -math.inf
    plan = run.plan
    deadline = run.deadline
    t = plan.timeout[i]
    began = wr.started_at
    if t is not None and began is not None:
        deadline = min(deadline, began + t)
    if plan.any_deadline:
        deadline = sections.limit(plan, i, run.t0, deadline)
    if item is not None:
        fan = run.fans.get(i)
        if fan is not None:
            deadline = min(deadline, fan.item_deadline(item))
    return deadline


def _running(run: WatchedRun, i: int, a: _Attempt) -> bool:
    """Whether attempt ``a`` of node ``i`` is still running (see the module)."""
    d = a.tls
    owner, idx = d.get("run"), d.get("idx")
    while owner is not None:
        if owner is run:
            return (idx is a.mark and run.results[i].attempts == a.number
                    and (a.item is None or d.get("item") == a.item))
        outer = getattr(owner, "outer", None)
        if outer is None:
            return False
        owner, idx = outer
    return False


def register(run: WatchedRun, i: int, fn: Callable[[], object]) -> None:
    """``ctx.on_cancel(fn)`` from the attempt of node ``i`` running on this thread."""
    watch = watch_of(run)
    d = current.__dict__
    item = d.get("item")
    number = run.results[i].attempts
    with watch.lock:
        counts = watch.counts.get(i)
        if counts is None:
            counts = watch.counts[i] = [0, 0, 0]
        counts[0] += 1
        gone = deadline_of(run, i, item) == -math.inf
        if not gone:
            mark = d.get("idx")
            found = None
            attempts = watch.live.get(i)
            if attempts is None:
                attempts = watch.live[i] = []
            if type(mark) is Mark:
                for a in attempts:
                    if a.mark is mark and a.number == number and a.item == item:
                        found = a
                        break
            if found is None:
                if len(attempts) >= _PRUNE_AT:
                    attempts[:] = [a for a in attempts if _running(run, i, a)]
                mark = Mark(i)
                found = _Attempt(d, mark, number, item)
                attempts.append(found)
                d["idx"] = mark
            found.fns.append(fn)
    if gone:
        _call(run, i, fn)


def track(run: WatchedRun, i: int, tls: dict[str, Any], stop: Callable[[], object]) -> bool:
    """An attempt of node ``i`` that runs off the thread that starts it (an async node's task on
    an event loop, ``aio.py``): ``tls`` is its own dict standing for a thread's ``current``
    (``run``, ``idx``, ``item``; ``idx`` gets the attempt's ``Mark``, which the attempt's steps
    show in ``current``, so its ``ctx.on_cancel`` callbacks join this attempt), and ``stop()`` is
    called once, directly, when the run abandons it (any thread, maybe under the run's lock:
    it must be quick and call no user code). It is not counted as a callback. Returns False,
    tracking nothing, when the run has already given up on the node (the attempt must not
    start)."""
    watch = watch_of(run)
    number = run.results[i].attempts
    with watch.lock:
        if deadline_of(run, i, None) == -math.inf:
            return False
        attempts = watch.live.get(i)
        if attempts is None:
            attempts = watch.live[i] = []
        elif len(attempts) >= _PRUNE_AT:
            attempts[:] = [a for a in attempts if _running(run, i, a)]
        mark = Mark(i)
        a = _Attempt(tls, mark, number, None)
        a.stop = stop
        attempts.append(a)
        tls["idx"] = mark
    return True


def track_many(run: WatchedRun, items: list[tuple[int, dict[str, Any], Callable[[], object]]],
               ) -> list[bool]:
    """``track`` for several attempts ``(i, tls, stop)`` started together, under one acquisition
    of the watch's lock; one answer per attempt, in order."""
    watch = watch_of(run)
    results = run.results
    live = watch.live
    out: list[bool] = []
    with watch.lock:
        for i, tls, stop in items:
            if deadline_of(run, i, None) == -math.inf:
                out.append(False)
                continue
            attempts = live.get(i)
            if attempts is None:
                attempts = live[i] = []
            elif len(attempts) >= _PRUNE_AT:
                attempts[:] = [a for a in attempts if _running(run, i, a)]
            mark = Mark(i)
            a = _Attempt(tls, mark, results[i].attempts, None)
            a.stop = stop
            attempts.append(a)
            tls["idx"] = mark
            out.append(True)
    return out


def abandon(run: WatchedRun, nodes: Iterable[int], *, item: Any = None,
            spare: dict[str, Any] | None = None) -> None:
    """The run gave up on the running attempts of ``nodes`` (only fan-out ``item``'s, when
    given; not the attempt of the thread whose ``current`` dict is ``spare``): their callbacks
    go to a coordinator thread. Any thread, the run's lock held or not; no user code here."""
    watch = run.watch
    if watch is None:
        return
    due: list[tuple[int, list[Callable[[], object]]]] = []
    stops: list[Callable[[], object]] = []
    with watch.lock:
        for i in nodes:
            attempts = watch.live.get(i)
            if not attempts:
                continue
            left = []
            for a in attempts:
                if item is not None and a.item != item:
                    left.append(a)
                elif a.tls is not spare and _running(run, i, a):
                    if a.stop is not None:
                        stops.append(a.stop)
                    if a.fns:
                        due.append((i, a.fns))
            if left:
                watch.live[i] = left
            else:
                del watch.live[i]
    for stop in stops:
        stop()
    for i, fns in due:
        remote.coordinator.put(run.cv, _call_all, (run, i, fns))


def _call_all(run: WatchedRun, i: int, fns: list[Callable[[], object]]) -> None:
    """A coordinator thread: the callbacks of one abandoned attempt of node ``i``, in order."""
    for fn in fns:
        _call(run, i, fn)


def _call(run: WatchedRun, i: int, fn: Callable[[], object]) -> None:
    """Call one callback, holding no lock; an exception is logged and counted, never raised."""
    raised = False
    try:
        hooking.unawaited(fn(), run.names[i], fn, callback=True)
    except BaseException as exc:  # noqa: BLE001 - a callback never changes the run
        raised = True
        name = run.names[i]
        # the traceback as text, not the record's exception: a diagnose=True sink would print
        # the callback's variables (sockets, tokens)
        run.log.bind(node=name).error(
            "on_cancel callback {} of node {} raised; ignored\n{}",
            getattr(fn, "__name__", "?"), name, traceback_text(exc))
    watch = watch_of(run)
    with watch.lock:
        counts = watch.counts[i]
        counts[1] += 1
        if raised:
            counts[2] += 1


def note_clamp(run: WatchedRun, i: int, seconds: float) -> None:
    """A client clamped a call of the attempt of node ``i`` on this thread to ``seconds``."""
    watch = watch_of(run)
    number = run.results[i].attempts
    with watch.lock:
        kept = watch.clamps.get(i)
        if kept is None:
            kept = watch.clamps[i] = []
        if len(kept) < MAX_CLAMPS:
            kept.append((number, seconds))
        watch.clamped[i] = watch.clamped.get(i, 0) + 1


