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

The owner's ``lock`` guards ``tokens``, ``unstarted`` (submitted, not started), ``live``
(submitted, not exited) and ``loop_futs``. ``loop_futs`` holds the
future of each loop that has not exited, so that closing can cancel or abandon it; an exited loop's
future is dropped at once, which keeps runs free of reference cycles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, Protocol

from loguru import logger

from taskflow.errors import RejectedExecutionError

__all__ = ["LoopOwner", "spawn"]


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
    """The submitted callable: one loop."""
    with owner.lock:
        owner.unstarted.discard(token)
    try:
        owner.loop_body(token)
    except BaseException:  # noqa: BLE001 - nobody reads a loop's future: never lose it silently
        logger.opt(exception=True).error("taskflow: a worker loop of {} failed",
                                         owner.describe())
    finally:
        with owner.lock:
            owner.live.discard(token)
            owner.loop_futs.pop(token, None)


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
    exc = None if fut.cancelled() else fut.exception()
    if exc is None:
        exc = RejectedExecutionError(f"the executor dropped taskflow work of {owner.describe()}")
    owner.post(owner.loop_refused, exc)


def spawn(owner: LoopOwner, k: int) -> None:
    """Submit ``k`` loops (the owner has already counted them). Never call it from a
    done-callback or with the owner's lock held."""
    executor = owner.executor
    for _ in range(k):
        with owner.lock:
            owner.tokens += 1
            token = owner.tokens
            owner.unstarted.add(token)
            owner.live.add(token)
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
                owner.loop_refused(exc)
            continue
        with owner.lock:
            if token in owner.live:
                owner.loop_futs[token] = fut
        fut.add_done_callback(partial(_done, owner, token))
