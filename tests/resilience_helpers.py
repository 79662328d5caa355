"""Helpers shared by the tests of taskflow.resilience: a fake clock and a thread runner."""

from __future__ import annotations

import threading
from collections.abc import Callable


class FakeClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def run_threads(n: int, body: Callable[[int], None], *, name: str = "resilience-test") -> None:
    """Start ``n`` named threads that wait on one Barrier, run ``body(i)`` and are joined."""
    barrier = threading.Barrier(n)

    def target(i: int) -> None:
        barrier.wait()
        body(i)

    threads = [threading.Thread(target=target, args=(i,), name=f"{name}-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a test thread did not finish"
