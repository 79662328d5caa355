"""The event loops async nodes run on, watched: a step of a task that blocks its loop, the
loop's lag and the async attempts in flight on it (read by ``taskflow.observe``).

A step that blocks
==================
An ``async def`` task that makes a sync call (``time.sleep``, ``requests.get``, a CPU loop)
holds its loop for the length of the call: every other async node on that loop waits. Each step
of an attempt (``aio._Steps._step``: one ``send``/``throw`` into the coroutine, from one
``await`` to the next) is timed with two mechanical clock readings (``clock.real_now``: real
time even under a fake clock, since a blocked loop is a fact of the machine). A step that ran
``threshold()`` seconds or more (0.1 s by default, ``set_block_threshold``: the public
``taskflow.set_loop_block_threshold``) counts for its node
(``blocked_steps``), and the first one of each node (by flow name and node name, once per
process: a page served a thousand times a second would otherwise log a thousand lines) is
logged as a WARNING naming the node, the flow, the run and the lag measured.

A step that never returns would never be timed: while attempts are in flight, a watcher thread
(``taskflow-asyncio-watch``) looks every ``threshold() / 2`` seconds at the step each loop is in
(``Loop.step``, ``Loop.t0``, written by the loop thread around each step) and reports a step
still running ``STILL_BLOCKING`` seconds (1 s, or the threshold when longer) while it blocks;
its end is then counted, not logged again. A shorter step is reported as it ends, with the
whole lag it caused.
The warnings are written from a coordinator thread: a log sink is the application's code, and
neither the loop thread nor the watcher runs it.

Lag and attempts in flight
==========================
The lag of a loop is how late a callback scheduled now runs: the watcher (while attempts are in
flight) and every ``loops()`` reading (a ``PoolMonitor`` sample) post a probe with
``call_soon_threadsafe`` unless one is pending, and the probe writes how late it ran. A reading
gives the last measured lag, or how long the pending probe has waited, when longer (a loop
blocked now shows its lag growing without waiting for it). ``Loop.running`` counts the attempts
whose task has begun and not ended, written on the loop thread only.

Which loops: those that ran an async attempt in this process (taskflow's loop thread, the
application's loop given to ``set_event_loop``, a loop awaiting ``run_async``), named by their
thread; a loop is dropped once closed or collected. After a fork the child starts with none
(``_fork``), and reports blocking nodes afresh.

Costs: two clock readings and four attribute writes per step; one dict look-up per attempt;
nothing at all for sync nodes.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from typing import Any

from taskflow import _fork, clock
from taskflow.engine import remote
from taskflow.errors import InvalidArgumentError, InvalidArgumentValueError
from taskflow.logs import logger

__all__ = ["STILL_BLOCKING", "WATCH_THREAD", "Loop", "began", "blocked_steps", "ended", "loop_of", "loops",
           "set_block_threshold", "stepped", "stepping", "threshold"]

WATCH_THREAD = "taskflow-asyncio-watch"
# the watcher thread exits after this many real seconds with no attempt in flight
_KEEP_ALIVE = 5.0
# a step still running this long (or the threshold, when longer) is reported while it blocks;
# a shorter one is reported as it ends, with the lag it caused
STILL_BLOCKING = 1.0


class Loop:
    """What is watched of one event loop: the attempt whose step runs now (``step``, from real
    time ``t0``; None between steps), the attempts in flight, the pending lag probe and the
    last lag measured. Written on the loop's thread, read anywhere without a lock."""

    __slots__ = ("__weakref__", "ident", "lag", "name", "probe", "ref", "running", "step",
                 "t0", "tls")

    def __init__(self, loop: Any) -> None:
        thread = threading.current_thread()
        self.ref = weakref.ref(loop)
        self.name = thread.name
        self.ident = thread.ident
        self.tls: dict[str, Any] | None = None  # the loop thread's ``current`` dict
        self.step: Any = None
        self.t0 = 0.0
        self.running = 0
        self.probe: float | None = None
        self.lag: float | None = None

    def alive(self) -> Any:
        """The loop, while it is open (else None)."""
        loop = self.ref()
        return None if loop is None or loop.is_closed() else loop


class _Registry:
    """The loops watched (id -> ``Loop``), the blocked steps by node, the nodes reported, the
    watcher thread; ``lock`` guards the rare writes (a new loop, a report, the watcher)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loops: dict[int, Loop] = {}
        self.blocked: dict[str, int] = {}
        self.reported: set[tuple[str, str]] = set()
        self.watcher: threading.Thread | None = None
        self.threshold = 0.1
        _fork.register(self, hold="lock")

    def _after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.loops = {}
        self.blocked = {}
        self.reported = set()
        self.watcher = None


_reg = _Registry()


def threshold() -> float:
    """Seconds a step may hold its loop before it counts as blocking it."""
    return _reg.threshold


def set_block_threshold(seconds: float) -> None:
    """Count (and report once per node) a step of an async task that holds its loop
    ``seconds`` or more (default 0.1).

    Raises:
        InvalidArgumentError: ``seconds`` is not a number.
        InvalidArgumentValueError: ``seconds`` is not > 0.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentError(
            f"set_loop_block_threshold: seconds must be a number of seconds (an int or a "
            f"float), got {type(seconds).__name__} {seconds!r}", argument="seconds")
    if not seconds > 0:
        raise InvalidArgumentValueError(
            f"set_loop_block_threshold: seconds must be > 0 (math.inf counts no step), "
            f"got {seconds!r}", argument="seconds")
    _reg.threshold = float(seconds)


def loop_of(loop: Any, tls: dict[str, Any]) -> Loop:
    """The loop thread, as an attempt begins: the record of ``loop`` (made on first use);
    ``tls`` is the thread's ``current`` dict."""
    w = _reg.loops.get(id(loop))
    if w is None or w.ref() is not loop:
        with _reg.lock:
            w = _reg.loops.get(id(loop))
            if w is None or w.ref() is not loop:
                w = _reg.loops[id(loop)] = Loop(loop)
                w.tls = tls
    return w


def began(w: Loop) -> None:
    """The loop thread: an attempt's task began on ``w``; the watcher runs while any does."""
    w.running += 1
    if _reg.watcher is None:
        with _reg.lock:
            if _reg.watcher is None:
                t = threading.Thread(target=_watch, name=WATCH_THREAD, daemon=True)
                _reg.watcher = t
                t.start()


def ended(w: Loop) -> None:
    """The loop thread: an attempt's task on ``w`` ended."""
    w.running -= 1


def stepped(att: Any, lag: float) -> None:
    """The loop thread: a step of attempt ``att`` held its loop ``lag`` seconds, at least the
    threshold."""
    node = att.run.names[att.i]
    with _reg.lock:
        _reg.blocked[node] = _reg.blocked.get(node, 0) + 1
    _report(att, lag, True)


def _report(att: Any, lag: float, done: bool) -> None:
    run = att.run
    if run is None:  # the watcher read the step as it ended (``aio.Attempt.ended``)
        return
    key = (run.flow_name, run.names[att.i])
    with _reg.lock:
        if key in _reg.reported:
            return
        _reg.reported.add(key)
    remote.coordinator.put(contextvars.Context(), _warn,
                           (run.flow_name, run.flow_id, key[1], lag, done))


def _warn(flow: str, flow_id: str, node: str, lag: float, done: bool) -> None:
    held = (f"one step of its task held the event loop {lag:.3f}s" if done
            else f"one step of its task has held the event loop {lag:.3f}s so far")
    logger.bind(flow=flow, flow_id=flow_id, node=node).warning(
        "async node {} of flow {} (run {}) blocks its event loop: {} (a sync call inside "
        "async def?); every other async node on that loop waited meanwhile. Await an async "
        "call instead, or make the task a plain def (it then runs on the executor). Reported "
        "once per node", node, flow or "?", flow_id, held)


def _watch() -> None:
    """The watcher thread (see the module)."""
    me = threading.current_thread()
    idle_since = clock.real_now()
    while True:
        limit = _reg.threshold
        clock.real_sleep(min(max(limit / 2, 0.01), 0.5))
        now = clock.real_now()
        running = False
        for w in list(_reg.loops.values()):
            att, t0 = w.step, w.t0
            if att is not None and w.step is att and now - t0 >= max(limit, STILL_BLOCKING):
                _report(att, now - t0, False)
            if w.running > 0:
                running = True
                _probe(w, now)
        if running:
            idle_since = now
        elif now - idle_since >= _KEEP_ALIVE:
            with _reg.lock:
                if _reg.watcher is not me:
                    return  # a forked child's registry
                if not any(w.running > 0 for w in _reg.loops.values()):
                    _reg.watcher = None
                    return


def _probe(w: Loop, now: float) -> None:
    """Post a lag probe to ``w``'s loop unless one is pending."""
    if w.probe is not None:
        return
    loop = w.alive()
    if loop is None:
        return
    w.probe = now
    try:
        loop.call_soon_threadsafe(_arrived, w, now)
    except RuntimeError:  # closed meanwhile
        w.probe = None


def _arrived(w: Loop, sent: float) -> None:
    """The loop thread: the probe posted at ``sent`` ran."""
    w.lag = clock.real_now() - sent
    w.probe = None


def loops() -> list[tuple[str, float | None, int]]:
    """Per open loop watched: its name (its thread's), its lag in seconds (None: not measured
    yet) and the async attempts in flight on it. Posts a lag probe to each (see the module);
    loops closed or collected are dropped."""
    now = clock.real_now()
    out = []
    for key, w in list(_reg.loops.items()):
        if w.alive() is None:
            _reg.loops.pop(key, None)
            continue
        _probe(w, now)
        lag, sent = w.lag, w.probe
        if sent is not None:
            lag = max(lag or 0.0, now - sent)
        out.append((w.name, lag, w.running))
    return out


def blocked_steps() -> dict[str, int]:
    """Node name -> steps of its async task that blocked their loop, in this process."""
    with _reg.lock:
        return dict(_reg.blocked)


def stepping(run: Any) -> list[tuple[int, dict[str, Any]]]:
    """The loop threads in a step of an attempt of ``run`` now, as (thread ident, its
    ``current`` dict): an async attempt the run gives up while a step still blocks its loop
    cannot be cancelled, so it is abandoned like a sync one (``inflight.gave_up``)."""
    out = []
    for w in list(_reg.loops.values()):
        att = w.step
        if att is not None and att.run is run and w.tls is not None and w.ident is not None:
            out.append((w.ident, w.tls))
    return out

