"""Nested runs on the caller's thread.

A ``start`` called from a task that runs on a worker of the same pool (compared through wrappers:
``executors.same_executor``) cannot wait for that pool: on a saturated (e.g. one-worker) pool the
nodes would never run. Such a run is *inline*: its caller drains the run's ready queue itself,
between waits on the run's inbox (``closing.wait``), so the nested flow needs no other worker. Nodes
that become ready while the caller waits post a wake-up to the inbox; the roots need none (``begin``
queues them on the caller's thread, which drains before it first waits).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from taskflow.engine.economy import Economy

__all__ = ["INLINE_LOOP", "InlineRun", "drain"]

# the loop token of the caller's own loop
INLINE_LOOP = -1


class InlineRun(Protocol):
    """What draining needs from a run."""

    lock: threading.Lock
    finished: bool

    @property
    def economy(self) -> Economy:
        """The run's loop economy (its fields under ``lock``)."""

    def run_nodes(self, i: int, token: int) -> None:
        """Run node ``i`` and the nodes popped after it."""


def drain(run: InlineRun) -> None:
    """Run the ready nodes on this thread until none is ready."""
    while not run.finished:
        with run.lock:
            run.economy.loops += 1
            i = run.economy.next_node(INLINE_LOOP)
        if i < 0:
            return
        run.run_nodes(i, INLINE_LOOP)
