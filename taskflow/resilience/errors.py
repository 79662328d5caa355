"""Errors raised by the resilience primitives (to move into ``taskflow/errors.py`` on merge)."""

from __future__ import annotations

import math

from taskflow.errors import TaskflowError

__all__ = ["BulkheadFullError", "CircuitOpenError", "FallbackError", "UnhashableKeyError"]


class BulkheadFullError(TaskflowError, RuntimeError):
    """A bulkhead refused a waiter: ``max_waiting`` callers were already waiting for a slot."""

    def __init__(self, bulkhead: str, max_concurrent: int, max_waiting: int) -> None:
        self.bulkhead = bulkhead
        self.max_concurrent = max_concurrent
        self.max_waiting = max_waiting
        super().__init__(
            f"bulkhead {bulkhead!r} is full: {max_concurrent} running and"
            f" {max_waiting} waiting"
        )


class CircuitOpenError(TaskflowError, RuntimeError):
    """A circuit breaker refused a call without running it.

    ``retry_in`` is the number of seconds until the breaker lets a trial call through (0 when it
    is half-open and all its trial calls are taken; the next one frees when a trial finishes).
    """

    def __init__(self, breaker: str, state: str, retry_in: float) -> None:
        self.breaker = breaker
        self.state = state
        self.retry_in = retry_in
        if state == "half_open":
            detail = "half-open and its trial calls are taken"
        else:
            detail = f"open; next trial in {retry_in:.3g}s" if math.isfinite(retry_in) else "open"
        super().__init__(f"circuit breaker {breaker!r} is {detail}")


class UnhashableKeyError(TaskflowError, TypeError):
    """A single-flight key (a node's ``share_key`` result) cannot be hashed.

    ``owner`` names who gave it: ``node 'stock'`` or ``single flight 'shared'``.
    """

    def __init__(self, owner: str, key: object) -> None:
        self.owner = owner
        self.key = key
        super().__init__(
            f"{owner}: share key {key!r} is not hashable ({type(key).__name__});"
            " return a tuple of strings or numbers"
        )


class FallbackError(TaskflowError, RuntimeError):
    """A node's fallback raised while standing in for the node's own failure.

    ``error`` is the failure the fallback stood in for; ``fallback_error`` (also ``__cause__``)
    is what the fallback raised, and its ``__context__`` leads back to ``error``, so a traceback
    shows both.
    """

    def __init__(self, node: str, error: BaseException, fallback_error: BaseException) -> None:
        self.node = node
        self.error = error
        self.fallback_error = fallback_error
        super().__init__(
            f"node {node!r}: fallback raised {type(fallback_error).__name__}: {fallback_error}"
            f" while standing in for {type(error).__name__}: {error}"
        )
