"""Flow ids: twelve hex digits, distinct per run across the processes of a deployment.

A run's id is a per-process random prefix (six hex digits, drawn at import and again in the
child of every fork, so a preforked worker never repeats its parent's ids) and a counter
(six hex digits from a random start, wrapping after 16.7 million runs). Drawing one is a
``next`` on a counter instead of an
``os.urandom`` call per run.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

from taskflow import _fork

__all__ = ["new_flow_id"]


class _FlowIds:
    """The prefix and the counter (renewed after a fork): ``ids`` yields the flow ids, each a
    ``next`` of C iterators (the counter, its wrap, the formatting) with no Python frame."""

    def __init__(self) -> None:
        self._after_fork_in_child()

    def _after_fork_in_child(self) -> None:
        self.prefix = os.urandom(3).hex()
        counter = itertools.count(int.from_bytes(os.urandom(3), "big"))
        self.ids: Iterator[str] = map(f"{self.prefix}%06x".__mod__,
                                      map((0xFFFFFF).__and__, counter))


_ids = _FlowIds()
_fork.register(_ids)


def new_flow_id() -> str:
    """The next flow id."""
    return next(_ids.ids)
