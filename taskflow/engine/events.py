"""Instrumentation points of the engine: who watches runs, and what they are told.

A *listener* (``add_listener``) is asked once per run, when the run starts, whether it wants to
watch it: ``listener.run_started(run)`` returns a [`RunObserver`][taskflow.engine.events.RunObserver] (or None). The run keeps
the observers it got and tells them what happens to it; nothing else in the engine knows who
listens. Tracing ([`taskflow.observe.otel`][taskflow.observe.otel]) and statistics ([`taskflow.observe.stats.enable`][taskflow.observe.stats.enable]) are
listeners.

What it costs: with no listener, one test of a module-level tuple per run (``LISTENERS``, empty
by default) and one test of an empty tuple per node attempt and per node outcome
(``run.observers``; ``benchmarks/overhead.py`` is unchanged). An observer that only wants the end
of runs sets ``per_node = False`` and the run calls it once, at the end.

When observers are called (the engine's rules about threads apply to them as to hooks: never
under the run's lock, never on the timer thread or in a future's done-callback):

========================  =========================================================================
``run_started(run)``      the listener's method: in the caller of ``start``/``submit``, in its
                          contextvars (a nested run's caller is the node that started it)
``attempt_started``       before each attempt of a node (and its ``on_begin``): on the thread that
                          runs it, in the contextvars the task will see (thread executors); on the
                          run's owner thread for executors in other processes
``attempt_ended``         the attempt returned to taskflow (the thread that ran it; the owner for
                          other processes): ``RETRY`` another attempt follows, ``FINAL`` its outcome
                          is the node's (``node_settled`` follows at once), ``LATE`` the node had
                          already ended without it (timeout, cancel, the run closed): dropped
``node_settled(i)``       once per node, when it is terminal (its ``WorkResult`` tells how); a node
                          whose attempt was still running then was abandoned (its ``LATE``
                          ``attempt_ended`` may follow, or never come if its thread hangs). For a
                          node that ended as the run closed it may come after ``run_ended``
``event(i, name, a)``     something worth a mark: ``retry`` (attempt, delay, error; just before
                          that attempt's ``RETRY`` ``attempt_ended``), ``hedge``
                          (a duplicate attempt started), ``cancelled`` (``ctx.cancel``; ``i`` is
                          -1), ``item_failed`` (a fan-out item raised)
``run_ended(result)``     exactly once per run, with its ``FlowResult``, before ``start`` returns
                          (before ``submit``'s future resolves)
``detached_started``      an attempt of a detached node (``detach=True``, handed off: its
                          ``node_settled`` came with state ``DETACHED``) starts, on its thread, in
                          the contextvars its task will see; possibly after ``run_ended``
``detached_retry``        that attempt failed and another follows after ``delay`` seconds
``detached_ended``        once per handed-off node, with its final ``WorkResult``, on the thread
                          that ended it (its worker, or a coordinator thread at its timeout),
                          before its hook runs; possibly after ``run_ended``
========================  =========================================================================

An observer that raises is logged and never changes the run. Observers must be quick: they run on
the request path.
"""

from __future__ import annotations

import threading
import traceback
from typing import TYPE_CHECKING, Any, Protocol

from taskflow.logs import logger

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from taskflow.model.context import TaskContext
    from taskflow.model.result import FlowResult, WorkResult

__all__ = [
    "FINAL",
    "LATE",
    "LISTENERS",
    "RETRY",
    "Listener",
    "ObservedRun",
    "RunObserver",
    "add_listener",
    "attempt_ended",
    "attempt_started",
    "completed",
    "detached_ended",
    "detached_retry",
    "detached_started",
    "event",
    "node_settled",
    "observe",
    "remove_listener",
    "run_ended",
]

# the fate of an attempt that returned (``attempt_ended``)
RETRY, FINAL, LATE = "retry", "final", "late"


class ObservedRun(Protocol):
    """What an observer may read of a run (``taskflow.engine.run.Run`` satisfies it).

    ``results[i]`` is node ``i``'s WorkResult: ``queued_at``, ``started_at``, ``finished_at``
    (taskflow's monotonic clock, ``clock.now()``), ``attempts``, ``state`` and ``exception`` once it is terminal.
    """

    flow_id: str
    flow_name: str
    names: tuple[str, ...]
    results: list[WorkResult[Any]]
    t0: float
    deadline: float
    budget: float
    mode: str
    executor: Executor
    ctx: TaskContext


class RunObserver:
    """Watches one run; every method does nothing unless overridden (see the module docstring
    for when each is called). ``per_node = False``: only ``event`` and ``run_ended`` are
    called."""

    per_node = True

    def attempt_started(self, i: int, attempt: int) -> None:
        """Attempt ``attempt`` (1-based) of node ``i`` starts."""

    def attempt_ended(self, i: int, attempt: int, error: BaseException | None, fate: str) -> None:
        """Attempt ``attempt`` of node ``i`` returned (``RETRY``, ``FINAL`` or ``LATE``)."""

    def node_settled(self, i: int) -> None:
        """Node ``i`` is terminal."""

    def event(self, i: int, name: str, attrs: dict[str, Any]) -> None:
        """A mark on node ``i`` (-1: the run)."""

    def run_ended(self, result: FlowResult) -> None:
        """The run's result exists."""

    def detached_started(self, i: int, attempt: int) -> None:
        """Attempt ``attempt`` of detached node ``i`` starts (after its hand-off)."""

    def detached_retry(self, i: int, attempt: int, error: BaseException, delay: float) -> None:
        """Attempt ``attempt`` of detached node ``i`` failed; another follows after ``delay``."""

    def detached_ended(self, i: int, result: WorkResult[Any]) -> None:
        """Detached node ``i`` ended: ``result`` is its final WorkResult."""


class Listener(Protocol):
    """Decides, per run, whether to watch it."""

    def run_started(self, run: ObservedRun) -> RunObserver | None:
        """A run starts (in its caller's thread and contextvars); its observer, or None."""


LISTENERS: tuple[Listener, ...] = ()
"""The registered listeners (replaced, never mutated: runs read it without a lock)."""
_lock = threading.Lock()  # serialises add_listener/remove_listener


def add_listener(listener: Listener) -> None:
    """Watch every run started from now on (adding a listener twice adds it once)."""
    global LISTENERS
    with _lock:
        if listener not in LISTENERS:
            LISTENERS = (*LISTENERS, listener)


def remove_listener(listener: Listener) -> None:
    """Stop watching runs started from now on (runs already started keep their observers)."""
    global LISTENERS
    with _lock:
        LISTENERS = tuple(x for x in LISTENERS if x is not listener)


def _failed(what: str, where: Any) -> None:
    # the traceback as text: a sink with diagnose=True would print the frames' locals
    logger.error("taskflow: observer {!r} failed in {}; ignored\n{}", where, what,
                 traceback.format_exc())


def observe(run: ObservedRun) -> tuple[tuple[RunObserver, ...], tuple[RunObserver, ...]]:
    """Ask every listener about ``run``: (all its observers, those that want every node)."""
    found = []
    for listener in LISTENERS:
        try:
            obs = listener.run_started(run)
        except Exception:  # noqa: BLE001 - an observer never changes the run
            _failed("run_started", listener)
            continue
        if obs is not None:
            found.append(obs)
    return tuple(found), tuple(o for o in found if o.per_node)


def _tell(observers: tuple[RunObserver, ...], what: str, *args: Any) -> None:
    """Call ``observer.<what>(*args)`` on each observer; one that raises is logged."""
    for obs in observers:
        try:
            getattr(obs, what)(*args)
        except Exception:  # noqa: BLE001 - an observer never changes the run
            _failed(what, obs)


def attempt_started(observers: tuple[RunObserver, ...], i: int, attempt: int) -> None:
    _tell(observers, "attempt_started", i, attempt)


def attempt_ended(observers: tuple[RunObserver, ...], i: int, attempt: int,
                  error: BaseException | None, fate: str) -> None:
    _tell(observers, "attempt_ended", i, attempt, error, fate)


def node_settled(observers: tuple[RunObserver, ...], i: int) -> None:
    _tell(observers, "node_settled", i)


def completed(observers: tuple[RunObserver, ...], i: int, attempt: int,
              error: BaseException | None) -> None:
    """The attempt that decided node ``i``'s outcome returned, and the node is terminal."""
    _tell(observers, "attempt_ended", i, attempt, error, FINAL)
    _tell(observers, "node_settled", i)


def event(observers: tuple[RunObserver, ...], i: int, name: str, attrs: dict[str, Any]) -> None:
    _tell(observers, "event", i, name, attrs)


def run_ended(observers: tuple[RunObserver, ...], result: FlowResult) -> None:
    _tell(observers, "run_ended", result)


def _tell_if(observers: tuple[RunObserver, ...], what: str, *args: Any) -> None:
    """``_tell`` for the methods an observer written before them may lack."""
    for obs in observers:
        fn = getattr(obs, what, None)
        if fn is None:
            continue
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - an observer never changes the run
            _failed(what, obs)


def detached_started(observers: tuple[RunObserver, ...], i: int, attempt: int) -> None:
    _tell_if(observers, "detached_started", i, attempt)


def detached_retry(observers: tuple[RunObserver, ...], i: int, attempt: int,
                   error: BaseException, delay: float) -> None:
    _tell_if(observers, "detached_retry", i, attempt, error, delay)


def detached_ended(observers: tuple[RunObserver, ...], i: int, result: WorkResult[Any]) -> None:
    _tell_if(observers, "detached_ended", i, result)
