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

from taskflow import _fork

__all__ = ["new_flow_id"]


class _FlowIds:
    """The prefix and the counter (renewed after a fork)."""

    def __init__(self) -> None:
        self._after_fork_in_child()

    def _after_fork_in_child(self) -> None:
        self.prefix = os.urandom(3).hex()
        self.counter = itertools.count(int.from_bytes(os.urandom(3), "big"))

    def new(self) -> str:
        """The next flow id."""
        return f"{self.prefix}{next(self.counter) & 0xFFFFFF:06x}"


_ids = _FlowIds()
_fork.register(_ids)
new_flow_id = _ids.new
