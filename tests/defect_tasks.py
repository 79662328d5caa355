"""Picklable tasks and nodes for tests/facade/test_executor_faults.py (values that cannot travel).

Process pools and loky import these by reference in their workers, so everything lives at
module level of a module a spawned child can import (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any, NoReturn

from taskflow import FanOutNode


def const(ctx: Any, value: Any) -> Any:
    """Return ``param``."""
    return value


class ApiError(Exception):
    """An ordinary exception whose ``__init__`` takes two arguments: it pickles (its ``args``
    are the one formatted message) but cannot be rebuilt from that message."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"backend answered {status}: {body}")
        self.status = status
        self.body = body


def raise_api_error(ctx: Any, status: int) -> NoReturn:
    """Raise ``ApiError(status, "service unavailable")``."""
    raise ApiError(status, "service unavailable")


def _refuse_to_load() -> NoReturn:
    raise RuntimeError("this value cannot be unpickled")


class Unloadable:
    """Pickles fine; unpickling it raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse_to_load, ())


def return_unloadable(ctx: Any, param: Any) -> Unloadable:
    """Return a value that pickles but does not unpickle."""
    return Unloadable()


class ApiErrorItems(FanOutNode[Any]):
    """A fan-out of two items whose ``work`` raises ``ApiError`` for item ``"bad"``."""

    def items(self, ctx: Any, param: Any) -> Iterator[tuple[Hashable, Any]]:
        yield "good", 1
        yield "bad", 2

    def work(self, ctx: Any, item: Any) -> Any:
        if item == 2:
            raise ApiError(502, "bad gateway")
        return item
