"""``Fallback``: a node's stand-in value when it would end ``EXCEPTION`` or ``TIMEOUT``.

The user gives ``fallback=`` a plain value or a callable ``fallback(ctx, error)``. The engine
builds ``Fallback(spec, node=name)`` when the node is defined (bad callables are refused there)
and, when the node fails, calls ``fallback.value(ctx, error)`` on the thread that settles the
node. It then ends the node ``DEGRADED`` with that value, or ``EXCEPTION`` with the
``FallbackError`` the call raised (both errors chained). To stand in with a value that is itself
callable, wrap it: ``fallback=lambda ctx, error: handler``.

The fallback is called, never awaited (for an async node too: the stand-in is computed on one of
the run's threads, ``engine/fallbacks.py``), so an async one is refused when the node is built,
a coroutine object given as the value as well (it is closed), and a plain def that returns a
coroutine fails the node with a ``FallbackError`` whose cause is the ``TypeError`` naming the
node (the coroutine closed).

Which failures it covers (``covers``): ``EXCEPTION`` and ``TIMEOUT``, whatever caused them (the
node's own error or timeout, a bulkhead, a breaker, a rate limit, a failed father). Never
``CANCELLED`` (the run or a join no longer wants the node) or ``SKIPPED``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import CoroutineType
from typing import Any

from taskflow.errors import FlowDefinitionError, returned_coroutine
from taskflow.resilience.errors import FallbackError
from taskflow.resilience.options import check_callable

__all__ = ["Fallback"]

_COVERED = frozenset({"EXCEPTION", "TIMEOUT"})


class Fallback:
    """A stand-in value (or a way to compute one) for one node.

    Args:
        spec: A value, or a callable ``(ctx, error) -> value``.
        node: The node's name, for error messages.

    Raises:
        FlowDefinitionError: ``spec`` is callable but cannot take ``(ctx, error)``, is async,
            or is a coroutine object (closed: it would stand in unawaited).
    """

    __slots__ = ("_fn", "_value", "node")

    def __init__(self, spec: Any, *, node: str) -> None:
        self.node = node
        self._fn: Callable[[Any, BaseException], Any] | None = None
        self._value: Any = None
        if callable(spec):
            check_callable(f"node {node!r}", "fallback", spec, "(ctx, error)")
            self._fn = spec
        elif type(spec) is CoroutineType:
            fn = spec.__qualname__
            spec.close()
            raise FlowDefinitionError(
                f"node {node!r}: fallback is the coroutine object {fn}(...), which taskflow "
                "would never await (it was closed); pass the value itself, or a plain function "
                "fallback(ctx, error) that returns it")
        else:
            self._value = spec

    @staticmethod
    def covers(state: object) -> bool:
        """Whether a node ending in ``state`` (a ``ResultState`` or its name) is degraded."""
        name = getattr(state, "value", state)
        return name in _COVERED

    def value(self, ctx: Any, error: BaseException) -> Any:
        """The stand-in value for ``error``; calls the user's callable when there is one.

        Raises:
            FallbackError: The callable raised (or, a plain def, returned a coroutine: the
                ``TypeError`` naming the node); its ``__cause__`` is that exception, whose
                ``__context__`` leads back to ``error``.
        """
        fn = self._fn
        if fn is None:
            return self._value
        try:
            value = fn(ctx, error)
            if type(value) is CoroutineType:  # nothing would await it: closed, the node fails
                raise returned_coroutine(
                    f"node {self.node!r}", value, "its fallback",
                    "a fallback is called on the run's threads and never awaited: return the "
                    "stand-in value from a plain def")
            return value
        except Exception as exc:
            if exc is not error and exc.__context__ is None and exc.__cause__ is None:
                exc.__context__ = error  # as if raised while handling it: tracebacks show both
            raise FallbackError(self.node, error, exc) from exc

    def __repr__(self) -> str:
        what = self._fn if self._fn is not None else self._value
        return f"Fallback({what!r}, node={self.node!r})"
