"""What is running now in this process: the runs in progress, the attempts they gave up whose
thread is still in the task, and a text dump of both, on demand or from a signal.

A Python thread cannot be stopped: a call that ignores its timeout keeps its worker after its
run gave up on it, and a pool that fills with such threads ends up timing every page out.
``inflight()`` answers "what is every run doing right now" and ``abandoned()`` "which given-up
calls still hold a thread, and where are they stuck".

It costs a run nothing per node: a run registers once when it starts and leaves once when it
finishes; nothing is read until one of these functions asks. A reading takes no run's lock and
no lock of the engine at all (it copies what it reads), so it never delays a run, and it may be
a few microseconds stale: a node that moved while it was read shows its previous state, a run
that finished while it was read may still be listed.

What is shown follows the web view's rules: names of flows, nodes and threads, states, times
and stacks (the code a thread is in); never a node's value or the run's context.

The views are named tuples (immutable, cheap to build: reading 500 runs costs milliseconds;
``_asdict()`` for JSON), built without pydantic so a signal handler can build them.

After a fork, the child lists only its own runs (the parent's threads are not in it): a child
starts with empty lists.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import IO, Any, NamedTuple

from taskflow import clock
from taskflow.engine import inflight as _inflight
from taskflow.engine import looplag
from taskflow.engine.inflight import abandoned_warning, set_abandoned_warning
from taskflow.errors import InvalidArgumentError, InvalidArgumentValueError
from taskflow.exposition import Sample
from taskflow.metrics import InflightMetrics, LoopMetrics
from taskflow.resilience.export import register

__all__ = ["AbandonedAttempt", "NodeNow", "RunNow", "abandoned", "abandoned_warning", "dump",
           "dump_on_signal", "inflight", "set_abandoned_warning"]

# signals a Python handler cannot take (uncatchable, or faults that must not return into code)
_REFUSED = {name: getattr(signal, name) for name in (
    "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL") if hasattr(signal, name)}


def _now() -> float:
    """The one clock read of this module (``clock.now``, as the engine's times)."""
    return clock.now()


class NodeNow(NamedTuple):
    """One node of a run in progress, as read."""

    name: str
    state: str
    """``WAITING``, ``QUEUED``, ``RUNNING``, ``BACKOFF``, ``PARKED``, ``TERMINAL`` or
    ``SETTLED``."""
    for_s: float | None
    """Seconds in that state so far: since it was queued (QUEUED) or its first attempt began
    (RUNNING); None where the engine does not know it cheaply."""
    waits_on: str | None
    """What it waits for: ``"fathers: a, b"``, ``"a worker"``, ``"a bulkhead"``,
    ``"a rate limit"``, ``"a batch window"``, ``"a shared call"``, ``"a back-off"``,
    ``"a detached slot"``; None when it waits for nothing (running, ended)."""
    thread: str | None
    """The name of the thread running it (RUNNING only)."""
    thread_ident: int | None
    """That thread's ``threading.get_ident()``, when the run drains it on its own threads."""

    def describe(self) -> str:
        """Its state, how long, its thread and what it waits on, as text:
        ``RUNNING for 0.120s on thread shop_3``, ``WAITING waits on fathers: price``."""
        parts = [self.state]
        if self.for_s is not None:
            parts.append(f"for {self.for_s:.3f}s")
        if self.thread is not None:
            parts.append(f"on thread {self.thread}")
        if self.waits_on is not None:
            parts.append(f"waits on {self.waits_on}")
        return " ".join(parts)


class RunNow(NamedTuple):
    """One run in progress."""

    flow: str
    """The flow's name (``start(..., name=...)``)."""
    run_id: str
    """The run's ``flow_id``, as in its log lines and ``FlowResult``."""
    age_s: float
    """Seconds since ``start`` was called."""
    budget_left_s: float
    """Seconds left of its budget (``inf``: none; negative: past it, closing)."""
    priority: str
    closed: bool
    """The run gave up (deadline, cancel) and waits for what it still owes."""
    nodes: tuple[NodeNow, ...]

    def running(self) -> tuple[NodeNow, ...]:
        """The nodes RUNNING now."""
        return tuple(n for n in self.nodes if n.state == "RUNNING")


class AbandonedAttempt(NamedTuple):
    """An attempt its run gave up on (its own timeout, the run's deadline or cancel, a join
    that no longer needs it) whose thread is still in the task."""

    node: str
    flow: str
    run_id: str
    attempt: int
    """Which attempt of its node (1: the first)."""
    running_s: float
    """Seconds since the attempt's node first started."""
    past_deadline_s: float
    """Seconds since the deadline it passed (or since it was given up, when that came first)."""
    thread: str
    thread_ident: int
    stack: tuple[str, ...] | None = None
    """Its thread's current stack, outermost frame first, one ``traceback`` entry per frame
    (``abandoned(with_stacks=True)``); None when not asked for."""

    def frame(self) -> str | None:
        """Where its thread is now: ``function (file:line)``, read when called (None: the
        thread has returned)."""
        return _inflight.frame_of(self.thread_ident)


def inflight() -> list[RunNow]:
    """The runs in progress in this process, oldest first (see the module for staleness)."""
    now = _now()
    out = []
    for run in _inflight.runs():
        nodes = tuple(
            NodeNow(name, state, None if since is None else max(0.0, now - since), waits,
                    thread, ident)
            for name, state, since, waits, thread, ident in _inflight.node_rows(run))
        out.append(RunNow(run.flow_name, run.flow_id, now - run.t0, run.deadline - now,
                          run.priority, run.closed, nodes))
    return out


def abandoned(*, with_stacks: bool = False) -> list[AbandonedAttempt]:
    """The abandoned attempts whose thread is still in the task, oldest first; an attempt
    leaves the list when its thread returns from the task.

    Args:
        with_stacks: Also read each thread's current stack (``sys._current_frames()``, taken
            only then).
    """
    now = _now()
    out = []
    for g in _inflight.gone():
        stack = None
        if with_stacks:
            stack = tuple(traceback.format_list(_inflight.stack_of(g.ident)))
        out.append(AbandonedAttempt(g.node, g.flow, g.flow_id, g.number, now - g.since,
                                    now - g.deadline, g.thread, g.ident, stack))
    return out


def _text() -> str:
    """Both lists as readable text."""
    runs = inflight()
    gone = abandoned(with_stacks=True)
    lines = [f"taskflow: {len(runs)} run(s) in progress in process {os.getpid()}"]
    for r in runs:
        lines.append(f"run {r.run_id} flow {r.flow or '?'!r}: age {r.age_s:.3f}s, budget left "
                     f"{r.budget_left_s:.3f}s, priority {r.priority}"
                     + (", closed" if r.closed else ""))
        for n in r.nodes:
            if n.state in ("TERMINAL", "SETTLED"):
                continue
            lines.append(f"  {n.name}: {n.describe()}")
    lines.append(f"taskflow: {len(gone)} abandoned attempt(s) still running")
    for g in gone:
        lines.append(f"node {g.node!r} of flow {g.flow or '?'!r} (run {g.run_id}), attempt "
                     f"{g.attempt}: running {g.running_s:.3f}s, {g.past_deadline_s:.3f}s past "
                     f"its deadline, on thread {g.thread} (ident {g.thread_ident})")
        for entry in g.stack or ():
            lines.extend("    " + line for line in entry.rstrip("\n").split("\n"))
    return "\n".join(lines) + "\n"


def dump(file: IO[str] | None = None) -> None:
    """Write ``inflight()`` and ``abandoned(with_stacks=True)`` as text to ``file``
    (default: ``sys.stderr`` at the time of the call)."""
    (sys.stderr if file is None else file).write(_text())


def _check_signal(signum: Any) -> int:
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise InvalidArgumentError(
            f"signum must be a signal number (signal.SIGPROF, ...), got {signum!r}",
            argument="signum")
    for name, value in _REFUSED.items():
        if signum == value:
            raise InvalidArgumentValueError(
                f"dump_on_signal cannot use {name}: a Python handler cannot take it; pick a "
                "signal the application does not use (signal.SIGPROF, or signal.SIGRTMIN + n "
                "on Linux)", argument="signum")
    if signum not in signal.valid_signals():
        raise InvalidArgumentValueError(
            f"signal {signum} does not exist on this platform ({sys.platform})",
            argument="signum")
    return int(signum)


def _descriptor(target: Any) -> int:
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    try:
        return int(target.fileno())
    except (AttributeError, OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"file must have a fileno() or be a file descriptor, got {target!r}",
            argument="file") from exc


def dump_on_signal(signum: int, *, file: IO[str] | int | None = None, chain: bool = True) -> None:
    """Have signal ``signum`` write ``dump()``'s text, as ``faulthandler.register`` does for
    stacks.

    The handler runs on the main thread between two of its bytecodes; it takes no lock
    (reading never does) and writes the text with one ``os.write`` to the descriptor, so it
    cannot deadlock on a lock or a stream the main thread held when the signal came. A
    previous Python handler of ``signum`` is called after it when ``chain`` is true.

    Under gunicorn, install it in a worker (the ``post_worker_init`` hook) with a signal that
    neither the arbiter nor the workers use: ``signal.SIGPROF`` (unless a profiler of the
    application uses it), or ``signal.SIGRTMIN + 1`` on Linux. Workers reset ABRT, HUP, QUIT,
    INT, TERM, USR1, USR2, WINCH and CHLD when they start and use several of them, and the
    arbiter also uses TTIN and TTOU.

    Args:
        signum: The signal (``signal.SIGPROF``, ...).
        file: Where to write: a file with a ``fileno()`` (kept open while the handler is
            installed) or a descriptor (default: standard error's, read now).
        chain: Call the handler ``signum`` had before, if it was a Python function.

    Raises:
        InvalidArgumentError: ``signum`` is not a signal number, or ``file`` has no
            descriptor.
        InvalidArgumentValueError: the signal is one a Python handler cannot take (SIGKILL,
            SIGSTOP, the fault signals), does not exist on this platform, or this is not the
            main thread (only it may install signal handlers).
    """
    sig = _check_signal(signum)
    target = sys.stderr if file is None else file
    fd = _descriptor(target)
    if threading.current_thread() is not threading.main_thread():
        raise InvalidArgumentValueError(
            "dump_on_signal must be called from the main thread (Python installs signal "
            "handlers there only)", argument="signum")
    previous = signal.getsignal(sig)

    def handler(num: int, frame: Any, _keep: Any = target) -> None:
        # ``_keep`` holds the file while the handler is installed: a file opened in the call
        # (``file=open(...)`` in a server's hook) would be closed, and its descriptor with it,
        # as soon as the caller dropped it
        try:
            data = _text().encode("utf-8", "replace")
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            pass  # nowhere to write: the signal must not kill the process for it
        if chain and callable(previous):
            previous(num, frame)

    signal.signal(sig, handler)


class _Counts:
    """The counts ``PoolMonitor`` and Prometheus export (``resilience.export``): runs in
    progress, abandoned attempts still running by node."""

    name = "inflight"

    def metrics(self) -> InflightMetrics:
        by_node: dict[str, int] = {}
        for g in _inflight.gone():
            by_node[g.node] = by_node.get(g.node, 0) + 1
        return InflightMetrics(name=self.name, runs=len(_inflight.runs()), abandoned=by_node)

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        out = [Sample("inflight_runs", "gauge", "Runs in progress in this process.", (),
                      m.runs)]
        for node, n in sorted(m.abandoned.items()):
            out.append(Sample("abandoned_attempts", "gauge",
                              "Attempts given up whose thread is still in the task, by node.",
                              (("node", node),), n))
        return out


counts = _Counts()
"""What is running now, as counts (``taskflow_inflight_runs``,
``taskflow_abandoned_attempts{node=...}``): exported by every ``PoolMonitor`` built without
``resilience=``."""
register(counts, "inflight")


class _Loops:
    """The event loops of async nodes as ``PoolMonitor`` and Prometheus export them
    (``resilience.export``): lag and attempts in flight by loop, blocked steps by node."""

    name = "loops"

    def metrics(self) -> LoopMetrics:
        lag: dict[str, float] = {}
        attempts: dict[str, int] = {}
        for name, lag_s, running in looplag.loops():
            # loops of one thread name (run_async's, one after another): the worst lag, the sum
            if lag_s is not None:
                lag[name] = max(lag.get(name, 0.0), lag_s)
            attempts[name] = attempts.get(name, 0) + running
        return LoopMetrics(name=self.name, lag_s=lag, attempts=attempts,
                           blocked_steps=looplag.blocked_steps())

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        out = []
        for loop, lag in sorted(m.lag_s.items()):
            out.append(Sample("loop_lag_seconds", "gauge",
                              "How late a callback scheduled on the event loop runs, by loop.",
                              (("loop", loop),), lag))
        for loop, n in sorted(m.attempts.items()):
            out.append(Sample("loop_async_attempts", "gauge",
                              "Async attempts in flight on the event loop, by loop.",
                              (("loop", loop),), n))
        for node, n in sorted(m.blocked_steps.items()):
            out.append(Sample("loop_blocked_steps_total", "counter",
                              "Steps of an async task that blocked their event loop, by node.",
                              (("node", node),), n))
        return out


loops = _Loops()
"""The event loops of async nodes, as figures (``taskflow_loop_lag_seconds{loop=...}``,
``taskflow_loop_async_attempts{loop=...}``, ``taskflow_loop_blocked_steps_total{node=...}``):
exported by every ``PoolMonitor`` built without ``resilience=``; nothing until an async node
ran."""
register(loops, "loops")
