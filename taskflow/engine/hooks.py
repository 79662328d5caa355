"""A run's hooks and outcome lines: admitting a hook, calling it, the owed ones, the log.

``hook(run, fn, i, attempt, outcome)`` admits a hook under the run's lock, then calls it
outside: an outcome hook (``on_success``/``on_fail``) runs at most once (``run.claimed``), and
after the run closed only the closer's and ``keep``'s hooks run; ``on_begin`` is refused once
the run closed. ``call_hook`` calls an admitted hook (``run.hooks_running`` counts it from
admission to return). ``run_owed`` runs the outcome hooks a closer claimed (``run.owed``) and
nobody started yet. ``log_outcome`` writes how a node ended.

Invariants: a hook is never called while holding ``run.lock``; a raising hook never changes the
flow (its first error is kept in ``run.hook_errors`` unless the run has finished); its traceback
is logged as text, never as the record's exception (a ``diagnose=True`` sink would print the
hook's variables).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import CoroutineType
from typing import Any, Protocol

from taskflow.errors import returned_coroutine, traceback_text
from taskflow.model.context import RunView, TaskSupport, current
from taskflow.model.graph import Plan
from taskflow.model.result import HookError, ResultState

__all__ = ["HookedRun", "call_hook", "hook", "log_outcome", "run_owed"]

_SUCCESS = ResultState.SUCCESS
_DEGRADED = ResultState.DEGRADED
_EXCEPTION = ResultState.EXCEPTION
_TIMEOUT = ResultState.TIMEOUT
_CANCELLED = ResultState.CANCELLED


class HookedRun(RunView, Protocol):
    """Exactly what this module uses of a run (``run.Run`` satisfies it; ``run.py`` has mypy
    check that). ``plan`` and ``names`` are fixed; under ``lock``: ``closed``, ``finished``,
    ``keep``, ``claimed``, ``owed``, ``hooks_running``, ``hooks_idle``, ``hook_errors``."""

    plan: Plan
    lock: threading.Lock
    closed: bool
    keep: int
    claimed: bytearray
    owed: list[int]
    hooks_running: int
    hooks_idle: threading.Condition | None

    @property
    def log(self) -> Any:
        """The run's logger."""


def hook(run: HookedRun, fn: Callable[[TaskSupport], object], i: int, attempt: int,
         outcome: bool) -> None:
    """Call a hook if it is admitted: an outcome hook (``on_success``/``on_fail``) runs once
    (``claimed``), and after the run closed only the closer's and ``keep``'s run."""
    with run.lock:
        if outcome:
            if run.claimed[i] or (run.closed and i != run.keep) or run.finished:
                return
            run.claimed[i] = 1
        elif run.closed:
            return
        run.hooks_running += 1
    call_hook(run, fn, i, attempt)


_HOOK_FIX = ("hooks run on the run's threads and are never awaited: await in the task (an async "
             "def task) and keep the hook a plain def")
_CALLBACK_FIX = ("on_cancel callbacks run on a coordinator thread and are never awaited; in an "
                 "async def task clean up where asyncio.CancelledError arrives (try/finally, "
                 "async with)")


def unawaited(value: object, name: str, fn: object, callback: bool = False) -> None:
    """What hook (or, ``callback``, ``ctx.on_cancel`` callback) ``fn`` of node ``name``
    returned is not a coroutine; if it is, it is closed (nothing would await it) and the
    call fails with the ``TypeError`` naming the node, logged like any raising hook.

    Raises:
        TypeError: ``value`` is a coroutine.
    """
    if type(value) is CoroutineType:
        fname = getattr(fn, "__name__", "?")
        what = f"its on_cancel callback {fname}" if callback else f"its hook {fname}"
        raise returned_coroutine(f"node {name!r}", value, what,
                                 _CALLBACK_FIX if callback else _HOOK_FIX)


def call_hook(run: HookedRun, fn: Callable[[TaskSupport], object], i: int, attempt: int) -> None:
    """Call an admitted hook (``hooks_running`` counts it). A raising hook is kept in
    ``hook_errors`` (the node's first, unless the run has finished) and logged with its
    traceback as text, never as the record's exception: a ``diagnose=True`` sink would
    print the hook's variables (context values, tokens)."""
    cur = current
    prev = cur.__dict__.get("run"), cur.__dict__.get("idx"), cur.__dict__.get("hooking")
    cur.run, cur.idx, cur.hooking = run, i, run
    try:
        unawaited(fn(TaskSupport(run, i, attempt)), run.names[i], fn)
    except BaseException as exc:  # noqa: BLE001 - a hook never changes the flow
        name = run.names[i]
        fname = getattr(fn, "__name__", "?")
        with run.lock:
            if i not in run.hook_errors and not run.finished:
                if not run.hook_errors:  # the run's class-level empty default: its own now
                    run.hook_errors = {}
                run.hook_errors[i] = HookError(fname, exc)
        run.log.bind(node=name).error(
            "hook {} of node {} raised; ignored\n{}", fname, name, traceback_text(exc))
    finally:
        cur.run, cur.idx, cur.hooking = prev
        with run.lock:
            run.hooks_running -= 1
            idle = run.hooks_idle
            if idle is not None and run.closed and run.hooks_running <= 1:
                idle.notify_all()


def run_owed(run: HookedRun) -> None:
    """Run the outcome hooks a closer claimed and nobody started yet."""
    while True:
        with run.lock:
            if not run.owed:
                return
            i = run.owed.pop(0)
            run.hooks_running += 1
        wr = run.results[i]
        node = run.node(i)
        st = wr.state
        fn = node.on_success if st is _SUCCESS else node.on_fail
        call_hook(run, fn, i, wr.attempts)


def log_outcome(run: HookedRun, i: int) -> None:
    """Log how node ``i`` ended (warning for failures)."""
    wr = run.results[i]
    name = run.names[i]
    st = wr.state
    log = run.log.bind(node=name)
    if st is _EXCEPTION or st is _TIMEOUT:
        exc = wr.exception
        # the traceback as text (never opt(exception=...): diagnose=True sinks would print
        # the frames' variables); a node failed fast has none
        trace = ""
        if exc is not None and exc.__traceback__ is not None:
            trace = "\n" + traceback_text(exc).rstrip()
        log.warning("node {} ended {}: {!r}{}", name, st.name, exc, trace)  # noqa: PLE1205 - loguru formats with {}
    elif st is _CANCELLED or st is _DEGRADED:
        log.info("node {} ended {}: {!r}", name, st.name, wr.exception)  # noqa: PLE1205 - loguru formats with {}
    else:
        log.debug("node {} ended {}", name, st.name)  # noqa: PLE1205 - loguru formats with {}
