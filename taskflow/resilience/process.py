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

from typing import Protocol

from taskflow import _fork

__all__ = ["track"]


class _Forkable(Protocol):
    def _after_fork(self) -> None: ...


def track(obj: _Forkable) -> None:
    """Have ``obj._after_fork()`` called in the child of every later fork (the library's one
    at-fork registry, ``taskflow._fork``, runs it while the child has one thread)."""
    _fork.register(obj, after_in_child="_after_fork")
