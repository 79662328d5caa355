"""Cost of one call through each resilience primitive, beside a bare ``Lock`` round trip.

The engine will pay these on every attempt of a node that uses them; the baseline is what one
uncontended ``with lock:`` costs in the same process, so the ratios survive a busy machine.

* ``bulkhead``: ``try_acquire()`` + ``release()`` with a free slot;
* ``bulkhead handoff``: ``release()`` handing the slot to a queued waiter + ``acquire()`` again;
* ``rate limit``: ``reserve()`` on a bucket that always has a token;
* ``breaker``: ``allow()`` + ``record(permit, True)`` while closed;
* ``single flight``: ``join`` as leader + ``set_result`` (the leader's own callback, no joiners);
* ``latency p95``: ``record`` + ``quantile(0.95)`` over a 256-sample ring (re-sorts each time).

Each figure is the median of ``--repeat`` timings of ``--n`` calls.

    python benchmarks/resilience_primitives.py
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

from taskflow.resilience import Bulkhead, CircuitBreaker, LatencyTracker, RateLimit, SingleFlight


def _ignore(outcome: object) -> None:
    pass


def _time(fn: Callable[[int], None], n: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    lock = threading.Lock()

    def bare(n: int) -> None:
        for _ in range(n):
            with lock:
                pass

    bh = Bulkhead("b", max_concurrent=1)

    def bulkhead(n: int) -> None:
        for _ in range(n):
            permit = bh.try_acquire()
            assert permit is not None
            permit.release()

    hb = Bulkhead("h", max_concurrent=1)
    held = [hb.try_acquire()]

    def on_grant(permit: object) -> None:
        held.append(permit)  # type: ignore[arg-type]

    def handoff(n: int) -> None:
        for _ in range(n):
            hb.acquire(on_grant)
            old = held.pop(0)
            assert old is not None
            old.release()

    limit = RateLimit("r", per_second=1e12, burst=10**9)

    def rate(n: int) -> None:
        for _ in range(n):
            limit.reserve()

    breaker = CircuitBreaker("c")

    def brk(n: int) -> None:
        for _ in range(n):
            breaker.record(breaker.allow(), True)

    flight = SingleFlight()

    def single(n: int) -> None:
        for i in range(n):
            flight.join(i, _ignore).call.set_result(i)

    tracker = LatencyTracker(size=256)

    def p95(n: int) -> None:
        for i in range(n):
            tracker.record(i * 1e-6)
            tracker.quantile(0.95)

    base = _time(bare, args.n, args.repeat)
    print(f"{'operation':<20} {'us/call':>9} {'x lock':>8}")
    print(f"{'lock round trip':<20} {base * 1e6:9.3f} {1.0:8.1f}")
    for label, fn in [("bulkhead", bulkhead), ("bulkhead handoff", handoff),
                      ("rate limit", rate), ("breaker", brk), ("single flight", single),
                      ("latency p95", p95)]:
        t = _time(fn, args.n, args.repeat)
        print(f"{label:<20} {t * 1e6:9.3f} {t / base:8.1f}")


if __name__ == "__main__":
    main()
