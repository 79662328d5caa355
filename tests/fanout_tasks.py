"""Picklable fan-out nodes for the process-pool tests of ``test_fanout.py``.

A process pool pickles the node and imports its class *by reference* in the worker: everything
here lives at module level of a module a spawned child can import (pytest puts ``tests/`` on
``sys.path`` and ``multiprocessing`` hands ``sys.path`` to its children). Test modules themselves
are not used for this: pytest may import them under another name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from taskflow import TaskContext
from taskflow.kinds.fanout import FanOutNode


class RemoteSquares(FanOutNode[int]):
    """Items ``0..param-1``; ``work`` returns ``(pid, i * i)`` and fails for multiples of 7
    (other than 0) with ``ValueError`` — a failed batch item, listed by id."""

    def items(self, ctx: TaskContext, param: int) -> Iterator[tuple[str, int]]:
        for i in range(param):
            yield f"item-{i:03d}", i

    def work(self, ctx: TaskContext, item: int) -> tuple[int, int]:
        if item and item % 7 == 0:
            raise ValueError(f"item {item} is corrupt")
        return os.getpid(), item * item


class CountedPickles:
    """A manifest that counts how often it is pickled in this process (the caller's)."""

    pickled = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> tuple[Any, ...]:
        type(self).pickled += 1
        return (CountedPickles, (self.n,))


class ManifestFanOut(FanOutNode[CountedPickles]):
    """Items from a manifest ``param`` (a frozen list of files in real life); ``work`` only needs
    the item, never the manifest."""

    def items(self, ctx: TaskContext, param: CountedPickles) -> Iterator[tuple[int, int]]:
        for i in range(param.n):
            yield i, i

    def work(self, ctx: TaskContext, item: int) -> int:
        return item + 1


class Numbers(FanOutNode[int]):
    """Items ``0..param-1`` (ids are the numbers); ``work`` returns the item and fails item 2
    with ``ValueError``."""

    def items(self, ctx: TaskContext, param: int) -> Iterator[tuple[int, int]]:
        yield from ((i, i) for i in range(param))

    def work(self, ctx: TaskContext, item: int) -> int:
        if item == 2:
            raise ValueError("item 2 is corrupt")
        return item


async def square(item: int) -> int:
    """An async call, for ``CoroutineItems``."""
    return item * item


class CoroutineItems(FanOutNode[int]):
    """Items ``0..param-1``; ``work`` is a plain def that returns the coroutine ``square(item)``
    instead of awaiting it."""

    def items(self, ctx: TaskContext, param: int) -> Iterator[tuple[int, int]]:
        yield from ((i, i) for i in range(param))

    def work(self, ctx: TaskContext, item: int) -> Any:
        return square(item)
