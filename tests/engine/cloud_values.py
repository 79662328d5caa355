"""Picklable tasks whose results or exceptions only cloudpickle can carry, for
tests/engine/test_remote_pickling.py.

Process pools and loky import these by reference in their workers: everything lives at module
level of a module a spawned child can import (pytest puts this folder on ``sys.path``, and
``multiprocessing`` and loky hand ``sys.path`` to their children).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

from taskflow import FanOutNode


def identity(ctx: Any, value: Any) -> Any:
    """Return ``param``."""
    return value


def returns_closure(ctx: Any, value: Any) -> Callable[[], Any]:
    """A local function: pickle refuses it ("can't pickle local object"), cloudpickle carries it."""

    def closure() -> Any:
        return value

    return closure


def call_result(ctx: Any, name: str) -> Any:
    """Call the result of node ``name`` (a father that returned a function)."""
    return ctx.result_of(name)()


class CallbackError(Exception):
    """An exception carrying a local function: only cloudpickle can send it back."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"failed with callback for {value!r}")
        self.callback = returns_closure(None, value)


def raises_callback_error(ctx: Any, value: Any) -> None:
    """Raise ``CallbackError(value)``."""
    raise CallbackError(value)


class ClosureItems(FanOutNode[int]):
    """Items ``(i, i)`` for i < param; item ``1``'s work returns a local function."""

    def items(self, ctx: Any, param: int) -> Iterator[tuple[Hashable, Any]]:
        return ((i, i) for i in range(param))

    def work(self, ctx: Any, item: int) -> Any:
        if item == 1:
            return returns_closure(ctx, item)
        return item
