"""After a fork the child's primitives are fresh: no lock inherited locked, no parent state."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest

from taskflow.resilience import Bulkhead, CircuitBreaker, RateLimit, SingleFlight, latencies

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _fork_and_wait(child: object, timeout: float = 20.0) -> int:
    """Run ``child()`` in a forked process; its exit code (99 if it hung and was killed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            code = child()  # type: ignore[operator]
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)  # polling a child process; nothing to wait on instead
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return 99


def test_a_fork_while_another_thread_holds_the_locks_gives_the_child_fresh_objects() -> None:
    bh = Bulkhead("inventory", max_concurrent=1)
    held = bh.try_acquire()
    assert held is not None
    breaker = CircuitBreaker("inventory", window=1, min_calls=1)
    quiet = CircuitBreaker("quiet")
    stale = quiet.allow()  # taken in the parent, in the generation the child starts from
    breaker.record(breaker.allow(), False)
    limit = RateLimit("inventory", per_second=1, burst=1)
    limit.reserve()
    flight = SingleFlight("stock")
    flight.join("k", lambda o: None)
    latencies.record(("fork-test", "node"), 0.5)

    locked, release = threading.Event(), threading.Event()
    locks = [bh._lock, breaker._lock, limit._lock, flight._lock, latencies._lock]

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        locked.set()
        release.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold, name="lock-holder")
    holder.start()
    try:
        assert locked.wait(10)

        def child() -> int:
            ok = (
                bh.try_acquire() is not None
                and held.release() is False  # the parent's permit means nothing here
                and bh.metrics().in_use == 1
                and quiet.record(stale, False) is False
                and breaker.state.value == "closed"
                and limit.try_take()
                and flight.join("k", lambda o: None).leader
                and latencies.median(("fork-test", "node")) == 0.5
            )
            return 0 if ok else 1

        assert _fork_and_wait(child) == 0
    finally:
        release.set()
        holder.join()
    # the parent is untouched
    assert bh.metrics().in_use == 1
    assert breaker.state.value == "open"
