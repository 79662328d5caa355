"""Worker loops: callables submitted to a thread executor that each pull work from an owner until
there is none. Used by runs (nodes) and by fan-outs (items) alike.

A loop is identified by a *token*. ``spawn`` submits loops; a loop that starts leaves
``unstarted`` and runs ``owner.loop_body(token)``. A loop that never starts (its future was
cancelled by ``shutdown(cancel_futures=True)``, dropped by a DISCARD policy, or failed) is a
refused submission. The future's done-callback may run on any thread, even one holding the
executor's shutdown lock, so it never calls ``submit`` or user code: it only hands the refusal to
the owner's own thread with ``owner.post``. A submission refused at once (``submit`` raised, or
returned something that is not a Future) is reported to the owner right there, on the thread that
called ``spawn`` (never a done-callback).

A loop never runs on top of another loop of the same owner. An executor may run a task inside
``submit`` (a pool's caller-runs policy when it is saturated, a direct executor): a loop that
starts more loops (a fan-out item loop before its item, a run's loop after a node) would then nest
one loop per item or node on the same stack and die of RecursionError. So a thread records, in a
thread-local map, the owners whose loop it is running; a loop of the same owner started on it is
queued instead (it counts as started: its future completes at once, and a done-callback sees
nothing to refuse) and runs when the loop below it returns, on the same thread, before the
submitted callable returns. The stack then holds at most one loop per owner, whatever the number
of items or nodes. The loop that asked goes on with its own work first (it does what a nested
loop would have done: loops never wait for each other), and the queued loop finds what is left.
Loops of different owners still nest (a fan-out's item loop inside the run's loop that started
it, a nested flow's loop inside a task): their depth is the flow's nesting, not its size.

The owner's ``lock`` guards ``tokens``, ``unstarted`` (submitted, not started), ``live``
(submitted, not exited) and ``loop_futs``. ``loop_futs`` holds the
future of each loop that has not exited, so that closing can cancel or abandon it; an exited loop's
future is dropped at once, which keeps runs free of reference cycles.

Under a fake clock (``taskflow.clock.counting``), a loop counts itself queued from
its submission until it starts or is refused, and its thread active until its outermost loop
returns: what the fake clock reads to know that no taskflow work can progress until time moves.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Protocol

from taskflow import clock
from taskflow.errors import RejectedExecutionError
from taskflow.logs import logger

__all__ = ["LoopOwner", "queued_here", "spawn"]

# per thread: id(owner) -> the tokens of that owner's loops queued behind the one this thread runs
_here = threading.local()


class LoopOwner(Protocol):
    """What a group of worker loops needs from its owner (a run or a fan-out)."""

    executor: Executor
    lock: threading.Lock
    tokens: int
    unstarted: set[int]
    live: set[int]
    loop_futs: dict[int, Future[Any]]

    def loop_body(self, token: int) -> None:
        """Pull and run work until there is none (or the loop is abandoned)."""

    def loop_refused(self, exc: BaseException) -> None:
        """A loop was refused: account for it (called on the owner's own thread)."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a thread that owns the owner's work (never this one)."""

    def describe(self) -> str:
        """Names the owner in error messages."""


def _start(owner: LoopOwner, token: int) -> None:
    """The submitted callable: one loop, or, on a thread already running one of the owner's
    loops, a loop queued to run after it (see the module docstring)."""
    with owner.lock:
        owner.unstarted.discard(token)
    counted = clock.counting
    try:
        frames = _here.frames
    except AttributeError:
        frames = _here.frames = {}
    key = id(owner)
    queued = frames.get(key)
    if queued is not None:
        # ``submit`` ran this loop in the thread that asked for it (a caller-runs pool): it is
        # counted and started, and runs when the owner's loop below it on this stack returns
        queued.append(token)
        if counted:
            clock.work_started(runs_here=False)
        return
    frames[key] = queued = deque()
    if counted:
        clock.work_started()
    try:
        _run(owner, token)
        while queued:
            _run(owner, queued.popleft())
    finally:
        del frames[key]
        if counted:
            clock.work_ended()


def _run(owner: LoopOwner, token: int) -> None:
    """Run loop ``token`` to its end; it is then no longer live."""
    try:
        owner.loop_body(token)
    except BaseException:  # noqa: BLE001 - nobody reads a loop's future: never lose it silently
        logger.opt(exception=True).error("taskflow: a worker loop of {} failed",
                                         owner.describe())
    finally:
        with owner.lock:
            owner.live.discard(token)
            owner.loop_futs.pop(token, None)


def queued_here(owner: LoopOwner) -> bool:
    """Whether a loop of ``owner`` is queued behind the one this thread runs: another one started
    from here would only queue up behind it too."""
    frames = getattr(_here, "frames", None)
    return bool(frames and frames.get(id(owner)))


def _done(owner: LoopOwner, token: int, fut: Future[Any]) -> None:
    """Done-callback of a loop future (any thread, possibly under the executor's locks)."""
    if token not in owner.unstarted:
        # the common case: the loop ran (a token leaves ``unstarted`` once and never returns;
        # reading the set without the lock is atomic), so the lock is not needed to say so
        return
    with owner.lock:
        if token not in owner.unstarted:
            return
        owner.unstarted.discard(token)
        owner.live.discard(token)
        owner.loop_futs.pop(token, None)
    if clock.counting:
        clock.work_dropped()
    exc = None if fut.cancelled() else fut.exception()
    if exc is None:
        exc = RejectedExecutionError(f"the executor dropped taskflow work of {owner.describe()}")
    owner.post(owner.loop_refused, exc)


def spawn(owner: LoopOwner, k: int) -> None:
    """Submit ``k`` loops (the owner has already counted them). Never call it from a
    done-callback or with the owner's lock held. Two lock round trips whatever ``k``
    (tokens, then the futures of the loops submitted), but for a refused submission."""
    executor = owner.executor
    with owner.lock:
        first = owner.tokens + 1
        owner.tokens += k
        for token in range(first, first + k):
            owner.unstarted.add(token)
            owner.live.add(token)
    submitted: list[tuple[int, Future[Any]]] = []
    for token in range(first, first + k):
        if clock.counting:
            clock.work_queued()
        try:
            fut: Any = executor.submit(_start, owner, token)
            if not isinstance(fut, Future):
                raise TypeError(
                    f"{type(executor).__name__}.submit returned {type(fut).__name__}, "
                    "not a concurrent.futures.Future"
                )
        except BaseException as exc:  # noqa: BLE001 - shut down, rejected, broken: a node outcome
            with owner.lock:
                refused = token in owner.unstarted
                owner.unstarted.discard(token)
                owner.live.discard(token)
            if refused:
                if clock.counting:
                    clock.work_dropped()
                owner.loop_refused(exc)
            continue
        submitted.append((token, fut))
    if not submitted:
        return
    with owner.lock:
        live, loop_futs = owner.live, owner.loop_futs
        for token, fut in submitted:
            if token in live:
                loop_futs[token] = fut
    for token, fut in submitted:
        fut.add_done_callback(partial(_done, owner, token))
