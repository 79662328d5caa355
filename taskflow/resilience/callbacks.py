"""Running the primitives' callbacks: outside every lock, in order, without deep recursion.

A slot released by one attempt is handed to a waiter by calling the waiter's callback in the
releasing thread. That callback may submit work that runs at once (``CALLER_RUNS``, an inline
executor) and releases a slot again, and so on: a chain of handoffs would then grow the stack.
``run_callbacks`` is a per-thread trampoline: a call made while the same thread is already
running callbacks is queued and run by the outermost loop, so the stack stays flat and the
callbacks still run in the order they were handed over.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from taskflow.errors import traceback_text
from taskflow.logs import logger

__all__ = ["Callback", "run_callbacks"]

Callback = tuple[Callable[..., Any], tuple[Any, ...]]

_local = threading.local()


def run_callbacks(calls: Iterable[Callback]) -> None:
    """Call each ``fn(*args)`` in order on this thread; an exception is logged, not raised.

    Must be called with no lock held. Nested calls on the same thread (a callback that
    triggers more callbacks) are appended to the running loop and return at once.
    """
    pending: deque[Callback] | None = getattr(_local, "pending", None)
    if pending is not None:
        pending.extend(calls)
        return
    pending = deque(calls)
    if not pending:
        return
    _local.pending = pending
    try:
        while pending:
            fn, args = pending.popleft()
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - one failing callback must not stop the others
                # as text: a diagnose=True sink would print the frames' variables (the values
                # handed to waiters, a task run in place)
                logger.error("taskflow: resilience callback {!r} raised\n{}", fn,
                             traceback_text(exc))
    finally:
        _local.pending = None
