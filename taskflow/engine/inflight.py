"""The runs in progress in this process, and the attempts they gave up while a thread is still
in the task (read by ``taskflow.observe.now``).

What it costs a run
===================
Nothing per node. A run joins once, as ``Run.begin`` starts (``join``: one dict insert of its
weak reference), and leaves once, when ``closing.finish`` sets ``finished`` (``leave``: one
pop); every begun run reaches that line (empty plan, spent budget, close). Each thread that
drains a run's nodes (a worker loop, an inline caller) writes its ident and its
``model.context.current`` dict into ``run.threads`` once per loop (``Run.run_nodes``). Nothing
else is written while a run works: its state is read only when someone asks (``runs``,
``node_rows``), without the run's lock, as ``Run.__repr__`` reads it.

Abandoned attempts
==================
A Python thread cannot be stopped: when a run gives up on a running node (its own timeout, the
run's deadline or ``ctx.cancel``, a join that no longer needs it), the thread stays in the task
until the task returns. The engine calls ``gave_up(run, nodes)`` where it gives those nodes up,
after their new state is written (``deadlines.node_timeout``, ``closing.close``,
``settling``): the threads of ``run.threads`` whose ``current`` still holds the run and one of
those nodes (directly, or under a nested inline run, ``Run.outer``) are recorded. A record
lives while that ``current`` dict still holds the run, the node and the node's attempt count,
the test ``attempts._running`` makes: it is checked on read, so the thread pays nothing when
it returns; records found ended are pruned on read and when more than ``MAX_GONE`` are kept.
Attempts on threads a run does not drain itself (hedged duplicates, fan-out items, detached
work) are not recorded. An async attempt is cancelled when given up, so it is not recorded,
unless one of its steps still blocks its loop then (a sync call inside ``async def``): that
step cannot be cancelled, and its loop thread (``looplag.stepping``) is recorded like a
worker, until the step returns.

Each record arms one timer entry, ``warn_after`` seconds (``set_abandoned_warning``) past its
deadline; if the attempt still runs then, one WARNING is logged (from a coordinator thread:
never the timer's) naming the node, the flow and the frame the thread is in.

Reading and locks
=================
Nothing here takes a run's lock, and nothing takes a lock at all on the paths a run uses
(``join``, ``leave``, ``gave_up``: single dict operations). A reader copies the dicts
(``_values``) and reads each run's lists without its lock, so a view may be a few microseconds
stale (a node that just moved shows its previous state) and never delays a run. That also
makes the reading safe from a signal handler that interrupted a thread holding any lock.

After a fork the child has none of the parent's threads, so it starts with empty lists
(``_fork``).
"""

from __future__ import annotations

import contextvars
import itertools
import os
import sys
import sysconfig
import threading
import traceback
import weakref
from types import FrameType
from typing import Any, Protocol

from taskflow import _fork, clock
from taskflow.engine import looplag, remote, sections, timer
from taskflow.engine.states import (
    BACKOFF,
    PARKED,
    QUEUED,
    RUNNING,
    STATE_NAMES,
    TERMINAL,
    WAITING,
)
from taskflow.errors import InvalidArgumentError, InvalidArgumentValueError
from taskflow.logs import logger

__all__ = ["MAX_GONE", "Gone", "ViewedRun", "abandoned_warning", "frame_of", "gave_up", "gone",
           "join", "leave", "node_rows", "runs", "set_abandoned_warning", "stack_of"]

# records of abandoned attempts kept at most (ended ones are pruned first, then the oldest)
MAX_GONE = 10_000
# where frames are not the application's (``frame_of``)
_NOT_THE_APPLICATION = (os.path.join(sysconfig.get_paths()["stdlib"], ""),
                        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     ""))
# what a PARKED node's guard waits for (``guards.Guard.wait``; ``batching.WAIT_BATCH``)
_PARKED_FOR = {1: "a shared call", 2: "a rate limit", 3: "a bulkhead", 4: "a batch window"}


def _now() -> float:
    """The one clock read of this module."""
    return clock.now()


class ViewedRun(Protocol):
    """What is read of a run (``run.Run``), all without its lock."""

    ref: weakref.ref[Any]
    plan: Any
    names: tuple[str, ...]
    flow_id: str
    flow_name: str
    t0: float
    deadline: float
    budget: float
    priority: str
    code: list[int]
    left: list[int]
    results: list[Any]
    guards: dict[int, Any]
    threads: dict[int, dict[str, Any]]
    closed: bool
    finished: bool
    mode: str


class Gone:
    """One abandoned attempt: node ``i`` of the run behind ``ref``, its attempt ``number``, the
    thread (``ident``, ``thread`` its name, ``tls`` its ``current`` dict), when the attempt
    started (``since``), the deadline it passed and when it was given up."""

    __slots__ = ("abandoned_at", "deadline", "flow", "flow_id", "i", "ident", "node", "number",
                 "ref", "since", "thread", "tls", "warning")

    def __init__(self, run: ViewedRun, i: int, ident: int, tls: dict[str, Any],
                 deadline: float, now: float) -> None:
        wr = run.results[i]
        self.ref = run.ref
        self.flow = run.flow_name
        self.flow_id = run.flow_id
        self.i = i
        self.node = run.names[i]
        self.number = wr.attempts
        self.ident = ident
        self.thread = wr.thread or _thread_name(ident)
        self.tls = tls
        self.since = wr.started_at if wr.started_at is not None else now
        self.deadline = deadline
        self.abandoned_at = now
        self.warning: timer.Timer | None = None

    def alive(self) -> bool:
        """Whether the thread is still in the attempt (see the module)."""
        run = self.ref()
        return (run is not None and _holder(run, self.tls) == self.i
                and run.results[self.i].attempts == self.number)


class _Registry:
    """The process's runs in progress (``runs``: id -> weak reference) and abandoned attempts
    (``gone``: sequence number -> ``Gone``); dict operations only, no lock (see the module)."""

    def __init__(self) -> None:
        self.runs: dict[int, weakref.ref[Any]] = {}
        self.gone: dict[int, Gone] = {}
        self.seq = itertools.count()
        self.warn_after: float | None = 30.0
        _fork.register(self)

    def _after_fork_in_child(self) -> None:
        self.runs = {}
        self.gone = {}


_registry = _Registry()


def join(run: Any) -> None:
    """``Run.begin``: the run is in progress."""
    _registry.runs[id(run)] = run.ref


def leave(run: Any) -> None:
    """``closing.finish``: the run has finished."""
    _registry.runs.pop(id(run), None)


def _values(d: dict[int, Any]) -> list[Any]:
    """A copy of ``d``'s values, taken while other threads may insert and pop."""
    while True:
        try:
            return list(d.values())
        except RuntimeError:  # changed size during the copy: copy again
            continue


def runs() -> list[Any]:
    """The runs in progress, oldest first (strong references: hold them briefly)."""
    out = [r for ref in _values(_registry.runs) if (r := ref()) is not None and not r.finished]
    out.sort(key=lambda r: r.t0)
    return out


def gone() -> list[Gone]:
    """The abandoned attempts still running, oldest first; ended ones are dropped."""
    live = []
    for g in _values(_registry.gone):
        if g.alive():
            live.append(g)
        else:
            _drop(g)
    return live


def _drop(g: Gone) -> None:
    for k, v in list(_registry.gone.items()):
        if v is g:
            _registry.gone.pop(k, None)
            break
    if g.warning is not None:
        g.warning.cancel()
        g.warning = None


def _thread_name(ident: int) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return "?"


def _deadline(run: ViewedRun, i: int, now: float) -> float:
    """The deadline the attempt of node ``i`` passed: its run's, its own timeout's, its
    deadline from the run's start, or now (given up earlier: a cancel, a join)."""
    plan = run.plan
    deadline = run.deadline
    t = plan.timeout[i]
    began = run.results[i].started_at
    if t is not None and began is not None:
        deadline = min(deadline, began + t)
    if plan.any_deadline:
        deadline = sections.limit(plan, i, run.t0, deadline)
    return min(deadline, now)


def _holder(run: ViewedRun, tls: dict[str, Any]) -> int:
    """The node of ``run`` the thread whose ``current`` dict is ``tls`` runs (-1: none)."""
    owner, idx = tls.get("run"), tls.get("idx")
    while owner is not None:
        if owner is run:
            return idx if isinstance(idx, int) else -1
        outer = getattr(owner, "outer", None)
        if outer is None:
            return -1
        owner, idx = outer
    return -1


def gave_up(run: Any, nodes: Any) -> None:
    """The run gave up nodes ``nodes`` (their new state written): record those a thread of the
    run is still running. Any thread, the run's lock held or not; takes no lock but the
    timer's."""
    held = list(run.threads.items()) if run.threads else []
    if run.plan.any_async:
        held += looplag.stepping(run)  # a step still blocking its loop cannot be cancelled
    if not held:
        return
    wanted = set(nodes)
    now = 0.0
    for ident, tls in held:
        i = _holder(run, tls)
        if i < 0 or i not in wanted or run.code[i] < TERMINAL:
            continue
        now = now or _now()
        g = Gone(run, i, ident, tls, _deadline(run, i, now), now)
        reg = _registry
        if len(reg.gone) >= MAX_GONE:
            gone()
            while len(reg.gone) >= MAX_GONE:
                _drop(next(iter(_values(reg.gone))))
        reg.gone[next(reg.seq)] = g
        after = reg.warn_after
        if after is not None:
            g.warning = timer.schedule(g.deadline + after, _warn_due, g)


def set_abandoned_warning(seconds: float | None) -> None:
    """Log one WARNING per abandoned attempt still running ``seconds`` past its deadline
    (``None``: never). Applies to attempts abandoned from now on."""
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise InvalidArgumentError(
                f"seconds must be a number or None, got {seconds!r}", argument="seconds")
        if not seconds >= 0:
            raise InvalidArgumentValueError(
                f"seconds must be >= 0, got {seconds!r}", argument="seconds")
    _registry.warn_after = None if seconds is None else float(seconds)


def abandoned_warning() -> float | None:
    """The seconds past its deadline after which an abandoned attempt still running is logged."""
    return _registry.warn_after


def _warn_due(g: Gone) -> None:
    """Timer thread: quick; the warning (a log line: sinks are user code) goes to a
    coordinator."""
    g.warning = None
    if g.alive():
        remote.coordinator.put(contextvars.Context(), _warn, (g,))


def _warn(g: Gone) -> None:
    if not g.alive():
        return
    where = frame_of(g.ident)
    logger.bind(flow=g.flow, flow_id=g.flow_id, node=g.node).warning(
        "node {} of flow {} (run {}) still running {:.1f}s past its deadline on thread {}, "
        "abandoned; in {}", g.node, g.flow or "?", g.flow_id, _now() - g.deadline, g.thread,
        where or "?")


def stack_of(ident: int) -> list[traceback.FrameSummary]:
    """The current stack of thread ``ident``, outermost first (empty: no such thread)."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return []
    return list(traceback.extract_stack(frame))


def _where(frame: Any) -> str:
    code = frame.f_code
    return f"{code.co_name} ({code.co_filename}:{frame.f_lineno})"


def frame_of(ident: int) -> str | None:
    """Where thread ``ident`` is now: ``function (file:line)`` of its innermost frame, and of
    the innermost one outside the standard library and taskflow when that is another (the
    application's call that waits); None: no such thread."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return None
    f: FrameType | None = frame
    while f is not None and f.f_code.co_filename.startswith(_NOT_THE_APPLICATION):
        f = f.f_back
    if f is None or f is frame:
        return _where(frame)
    return f"{_where(frame)}, called from {_where(f)}"


def node_rows(run: ViewedRun) -> list[tuple[str, str, float | None, str | None, str | None,
                                             int | None]]:
    """Per node of ``run``, read without its lock: its name, state, since when (monotonic;
    None: not known cheaply), what it waits on, and the thread running it (name, ident)."""
    code = list(run.code)
    left = list(run.left)
    plan = run.plan
    names = run.names
    holders: dict[int, int] = {}
    for ident, tls in list(run.threads.items()):
        i = _holder(run, tls)
        if i >= 0:
            holders[i] = ident
    guards = run.guards
    rows: list[tuple[str, str, float | None, str | None, str | None, int | None]] = []
    for i, c in enumerate(code):
        wr = run.results[i]
        since: float | None = None
        waits: str | None = None
        thread: str | None = None
        held: int | None = None
        if c == WAITING:
            if left[i]:
                fathers = [names[f] for f in plan.fathers[i] if code[f] < TERMINAL]
                waits = "fathers: " + ", ".join(fathers)
        elif c == QUEUED:
            since = wr.queued_at
            waits = "a worker"
        elif c == RUNNING:
            since = wr.started_at
            thread = wr.thread
            held = holders.get(i)
            pol = plan.policy[i] if plan.any_policy else None
            if pol is not None and pol.detach:
                waits = "a detached slot"
        elif c == BACKOFF:
            waits = "a back-off"
        elif c == PARKED:
            g = guards.get(i)
            waits = _PARKED_FOR.get(g.wait, "a batch window") if g is not None else None
        rows.append((names[i], STATE_NAMES[c], since, waits, thread, held))
    return rows
