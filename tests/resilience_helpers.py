"""Helpers shared by the tests of taskflow.resilience: a fake clock, a thread runner, a poll
for a figure another thread moves and the ERROR lines taskflow logs."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

from conftest import LONG


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
    """Start ``n`` named threads that wait on one Barrier, run ``body(i)`` and are joined.

    The interpreter switches threads every microsecond meanwhile, to make races likely
    (CPython's own ``test_pending_calls_race`` does the same).
    """
    barrier = threading.Barrier(n)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _start_and_join(n, body, barrier, name)
    finally:
        sys.setswitchinterval(interval)


def _start_and_join(n: int, body: Callable[[int], None], barrier: threading.Barrier,
                    name: str) -> None:

    def target(i: int) -> None:
        barrier.wait()
        body(i)

    threads = [threading.Thread(target=target, args=(i,), name=f"{name}-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a test thread did not finish"


@contextlib.contextmanager
def logged_errors() -> Iterator[list[str]]:
    """taskflow's ERROR log lines while the block runs (an illegal state move is one, when it
    does not raise; so is an internal error caught in a worker)."""
    from loguru import logger

    lines: list[str] = []
    logger.enable("taskflow")
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="ERROR",
                      format="{message}")
    try:
        yield lines
    finally:
        logger.remove(sink)
        logger.disable("taskflow")


def wait_until(cond: Callable[[], bool], timeout: float = LONG) -> None:
    """Poll ``cond`` (a figure another thread moves) until it holds or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.001)
