"""After ``os.fork`` the child starts with fresh primitives.

A process pool on Linux forks by default, and a fork copies every module-level bulkhead,
breaker and limit together with its lock. If another thread of the parent held that lock at
the moment of the fork, the child's copy stays locked for ever, and a task in the child that
starts a flow of its own would hang on it. The parent's bookkeeping is also meaningless in the
child: the slots it counts belong to the parent's threads, which do not exist there.

So every primitive registers itself here, and after a fork the child gives each one a new lock
and empty state (the latency trackers keep their history: it is still true). This matches
pickling, which also sends a fresh copy (``options.rebuild``).
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["track"]


class _Forkable(Protocol):
    def _after_fork(self) -> None: ...


_live: weakref.WeakSet[_Forkable] = weakref.WeakSet()


def track(obj: _Forkable) -> None:
    """Have ``obj._after_fork()`` called in the child of every later fork."""
    _live.add(obj)


def _after_fork_in_child() -> None:
    # runs in the child right after fork, while it has one thread: no lock can be contended
    for obj in list(_live):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
