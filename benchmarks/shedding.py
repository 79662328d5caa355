"""Load shedding under 2x overload, and the adaptive bulkhead against a backend that slows down.

    PYTHONPATH=. python benchmarks/shedding.py              # about 20 s
    PYTHONPATH=. python benchmarks/shedding.py --seconds 2 --overload 3

**Shedding.** A ``taskflow.ThreadPool`` of 4 workers serves pages whose one node waits 20 ms on
a backend: 200 pages a second at most. Requests arrive open-loop (a fixed rate, whatever the
server does) at ``--overload`` times that, 30 % of them ``"critical"`` and 70 % ``"sheddable"``
(bots, prefetches), each with a 200 ms budget, from a pool of caller threads. Two variants, in
the same process one after the other: without shedding every run queues for the pool (the
thresholds set out of reach); with ``set_load_shedding(sheddable_at=1.0)`` a sheddable run
finding no free worker is refused at ``start``. Per variant and priority: the share of
requests served (``result.ok`` within the budget), and the p99 of the served ones.

**Adaptive bulkhead.** 32 callers call a backend in a loop through ``Bulkhead(max_concurrent=32)``:
static, or ``adaptive=True, min_concurrent=2``. The backend serves 32 calls at once at 10 ms;
after a third of the time it slows down to 4 at once (each call beyond 4 in flight adds its
share of 10 ms: it queues inside). Per variant: the bulkhead's limit before and after the
slowdown (and the lowest it reached), the calls served, and after the slowdown the calls in flight at the backend and the
time a call spends inside it (what the sick backend bears; with a closed loop of callers the
end-to-end time is the same either way, the queue is in the bulkhead instead).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import (
    Bulkhead,
    FunctionNode,
    LoadShedError,
    TaskScheduling,
    ThreadPool,
    set_load_shedding,
)

BUDGET = 0.2
WORKERS = 4
SERVICE = 0.020  # seconds one page holds a worker
CRITICAL_SHARE = 0.3


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def overload(shedding: bool, seconds: float, factor: float, seed: int) -> dict[str, Any]:
    """Serve ``factor`` x capacity for ``seconds``; the share served per priority."""
    if shedding:
        set_load_shedding(sheddable_at=1.0, normal_at=None)
    else:
        set_load_shedding(sheddable_at=1e9, normal_at=None)  # nothing is ever shed
    pool = ThreadPool(core_size=WORKERS, max_size=WORKERS, name=f"web-{shedding}")
    page = FunctionNode(lambda ctx, p: time.sleep(SERVICE) or "page", name="page")
    rate = factor * WORKERS / SERVICE
    rng = random.Random(seed)
    lock = threading.Lock()
    served: dict[str, list[float]] = {"critical": [], "sheddable": []}
    offered = {"critical": 0, "sheddable": 0}
    shed = {"critical": 0, "sheddable": 0}

    def handle(priority: str) -> None:
        t0 = time.monotonic()
        try:
            result = TaskScheduling.start(page, executor=pool, timeout=BUDGET,
                                          priority=priority)  # type: ignore[arg-type]
        except LoadShedError:
            with lock:
                shed[priority] += 1
            return
        took = time.monotonic() - t0
        if result.ok:
            with lock:
                served[priority].append(took)

    callers = ThreadPoolExecutor(int(rate * BUDGET * 2) + 16, thread_name_prefix="caller")
    start = time.monotonic()
    n = 0
    while True:
        due = start + n / rate
        now = time.monotonic()
        if due - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        priority = "critical" if rng.random() < CRITICAL_SHARE else "sheddable"
        offered[priority] += 1
        callers.submit(handle, priority)
        n += 1
    callers.shutdown(wait=True)
    pool.shutdown()
    set_load_shedding()
    return {p: {"offered": offered[p], "served": len(served[p]), "shed": shed[p],
                "share": len(served[p]) / max(1, offered[p]),
                "p99": _p(served[p], 0.99)} for p in offered}


def bulkhead_run(adaptive: bool, seconds: float) -> dict[str, Any]:
    """32 callers in a loop; the backend serves 32 at once for the first third of the time,
    then 4 (it slowed down: each call beyond 4 in flight adds its share of 10 ms)."""
    base = 0.010
    capacity = [32]
    inflight = [0]
    lock = threading.Lock()
    inside: list[float] = []  # seconds each call spent in the backend, after the slowdown
    crowd: list[int] = []  # calls in flight at the backend, seen by each call after it

    def backend(ctx: Any, p: Any) -> str:
        with lock:
            inflight[0] += 1
            n = inflight[0]
            cap = capacity[0]
        t0 = time.monotonic()
        time.sleep(base * max(1.0, n / cap))  # beyond its capacity it queues
        with lock:
            inflight[0] -= 1
            if cap == 4:
                inside.append(time.monotonic() - t0)
                crowd.append(n)
        return "ok"

    options: dict[str, Any] = {"adaptive": True, "min_concurrent": 2} if adaptive else {}
    bulkhead = Bulkhead(f"inventory-{adaptive}", max_concurrent=32, max_waiting=64, **options)
    node = FunctionNode(backend, name=f"stock-{adaptive}", bulkhead=bulkhead)
    pool = ThreadPoolExecutor(48, thread_name_prefix="bh")
    begin = time.monotonic()
    stop = begin + seconds
    served = [0]

    def caller() -> None:
        while time.monotonic() < stop:
            if TaskScheduling.start(node, executor=pool, timeout=1.0).ok:
                with lock:
                    served[0] += 1

    threads = [threading.Thread(target=caller) for _ in range(32)]
    for t in threads:
        t.start()
    time.sleep(seconds / 3)
    before = bulkhead.metrics().limit
    with lock:
        capacity[0] = 4  # the backend slows down
    lowest = before
    while time.monotonic() < stop:  # the limit, every 10 ms
        lowest = min(lowest, bulkhead.metrics().limit)
        time.sleep(0.01)
    for t in threads:
        t.join()
    pool.shutdown()
    return {"before": before, "lowest": lowest, "limit": bulkhead.metrics().limit,
            "served": served[0],
            "crowd": statistics.mean(crowd) if crowd else 0.0,
            "p50": statistics.median(inside) if inside else 0.0, "p99": _p(inside, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(f"# shedding: {WORKERS} workers x {SERVICE * 1000:.0f} ms pages = "
          f"{WORKERS / SERVICE:.0f}/s; offered {args.overload:g}x, budget "
          f"{BUDGET * 1000:.0f} ms, {CRITICAL_SHARE:.0%} critical")
    rows = {}
    for shedding in (False, True):
        rows[shedding] = overload(shedding, args.seconds, args.overload, args.seed)
        label = "with shedding   " if shedding else "without shedding"
        for p, r in rows[shedding].items():
            print(f"{label} {p:9s} offered {r['offered']:5d}  served {r['share']:6.1%}  "
                  f"shed {r['shed']:5d}  p99 {r['p99'] * 1000:6.1f} ms")
    before, after = rows[False]["critical"]["share"], rows[True]["critical"]["share"]
    print(f"critical runs served: {before:.1%} -> {after:.1%} "
          f"({after / max(before, 1e-9):.2f}x)")
    print("# adaptive bulkhead: 32 callers, max_concurrent=32; the backend drops from 32 calls "
          "at once to 4 (10 ms each)")
    for adaptive in (False, True):
        r = bulkhead_run(adaptive, args.seconds)
        label = "adaptive" if adaptive else "static  "
        print(f"{label} limit {r['before']:3d} -> lowest {r['lowest']:3d} -> {r['limit']:3d}  "
              f"served {r['served']:5d}  "
              f"in flight at the backend {r['crowd']:5.1f}  time in the backend "
              f"p50 {r['p50'] * 1000:6.1f} ms  p99 {r['p99'] * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
