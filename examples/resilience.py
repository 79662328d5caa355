"""Request-path resilience, one feature at a time (the guide is
``docs/guides/resilience.md``).

Each ``*_demo`` function builds a tiny flow, runs it and returns what it shows; ``main`` prints
them all. The backends are simulated with short sleeps. Run it with
``python examples/resilience.py``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import (
    Bulkhead,
    CircuitBreaker,
    CircuitOpenError,
    FunctionNode,
    Hedge,
    RateLimit,
    TaskContext,
    TaskScheduling,
)


def bulkhead_demo(requests: int = 6) -> dict[str, Any]:
    """At most 2 calls to the inventory backend at once, across concurrent requests; the
    others wait for a slot without holding a pool thread."""
    inventory = Bulkhead("inventory", max_concurrent=2, max_waiting=32)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def get_stock(ctx: TaskContext, param: Any) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return 42

    stock = FunctionNode(get_stock, name="stock", bulkhead=inventory)
    with ThreadPoolExecutor(8) as pool:
        futures = [TaskScheduling.submit(stock, executor=pool, timeout=2.0)
                   for _ in range(requests)]
        ok = sum(f.result().ok for f in futures)
    return {"requests": requests, "ok": ok, "peak_concurrent": peak[0]}


def rate_limit_demo(calls: int = 5) -> dict[str, Any]:
    """50 calls per second with a burst of 1: five calls take about 80 ms."""
    limit = RateLimit("search", per_second=50, burst=1)
    nodes = [FunctionNode(lambda ctx, p: p, param=k, name=f"search{k}", rate_limit=limit)
             for k in range(calls)]
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(nodes, executor=pool, timeout=2.0)
    return {"ok": result.ok, "elapsed_ms": round(result.elapsed * 1000),
            "granted": limit.metrics().granted}


def breaker_demo() -> dict[str, Any]:
    """After 3 failures in a window of 4 calls the breaker opens: later calls fail at once with
    ``CircuitOpenError`` and never reach the backend."""
    breaker = CircuitBreaker("payments", failure_ratio=0.75, window=4, min_calls=3, open_for=30)
    reached = [0]

    def charge(ctx: TaskContext, param: Any) -> None:
        reached[0] += 1
        raise ConnectionError("payments backend down")

    outcomes = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(6):
            node = FunctionNode(charge, name="charge", breaker=breaker)
            error = TaskScheduling.start(node, executor=pool, timeout=1.0) \
                .result_of("charge").exception
            outcomes.append("open" if isinstance(error, CircuitOpenError) else "failed")
    return {"outcomes": outcomes, "backend_calls": reached[0], "state": breaker.state.value}


def fallback_demo() -> dict[str, Any]:
    """Recommendations fail; the page still renders, with an empty list standing in."""

    def recommendations(ctx: TaskContext, param: Any) -> list[str]:
        raise TimeoutError("recommendations backend timed out")

    def page(ctx: TaskContext, param: Any) -> dict[str, Any]:
        return {"title": "Keyboard K8", "recommended": ctx.result_of("recommendations")}

    reco = FunctionNode(recommendations, fallback=lambda ctx, error: [])
    render = FunctionNode(page, name="page")
    reco >> render
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(render, executor=pool, timeout=1.0)
    return {"status": result.status.name, "page": result.outputs["page"],
            "degraded": sorted(result.degraded)}


def hedge_demo() -> dict[str, Any]:
    """One replica in ten is slow (here: the first call). After 20 ms a duplicate call starts;
    the first answer wins and the slow call sees ``ctx.cancelled``."""
    calls = [0]
    lock = threading.Lock()

    def price(ctx: TaskContext, param: Any) -> float:
        with lock:
            calls[0] += 1
            n = calls[0]
        if n == 1:  # the slow replica: polls ctx.cancelled instead of sleeping 300 ms
            end = time.monotonic() + 0.3
            while not ctx.cancelled and time.monotonic() < end:
                time.sleep(0.002)
        else:
            time.sleep(0.005)
        return 79.0

    node = FunctionNode(price, hedge=Hedge(after=0.02, max_extra=1), idempotent=True)
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=1.0)
    return {"price": result.outputs["price"], "hedges": result.result_of("price").hedges,
            "elapsed_ms": round(result.elapsed * 1000)}


def single_flight_demo(requests: int = 16) -> dict[str, Any]:
    """16 concurrent requests for the same SKU make one backend call; the others share it."""
    calls = [0]
    lock = threading.Lock()

    def get_stock(ctx: TaskContext, param: Any) -> int:
        with lock:
            calls[0] += 1
        time.sleep(0.1)  # the other requests join while it runs
        return 42

    stock = FunctionNode(get_stock, name="stock",
                         share_key=lambda ctx, param: ("stock", ctx["sku"]))
    with ThreadPoolExecutor(4) as pool:
        futures = [TaskScheduling.submit(stock, executor=pool, timeout=2.0,
                                         context=TaskContext(sku="sku-1"))
                   for _ in range(requests)]
        results = [f.result() for f in futures]
    return {"requests": requests, "backend_calls": calls[0],
            "all_ok": all(r.outputs["stock"] == 42 for r in results)}


def priority_demo() -> list[str]:
    """One worker, four ready calls: the one the page cannot do without goes first."""
    order: list[str] = []
    start = FunctionNode(lambda ctx, p: None, name="start")
    for name, priority in (("ads", 0), ("price", 10), ("reviews", 1), ("stock", 5)):
        start >> FunctionNode(lambda ctx, p: order.append(p), param=name, name=name,
                              priority=priority)
    with ThreadPoolExecutor(1) as pool:
        TaskScheduling.start(start, executor=pool, timeout=1.0)
    return order


def min_budget_demo() -> dict[str, Any]:
    """A report that needs 200 ms does not start with 50 ms of budget: it is degraded at once."""
    ran = [False]

    def report(ctx: TaskContext, param: Any) -> str:
        ran[0] = True
        return "full report"

    node = FunctionNode(report, min_budget=0.2, fallback="summary only")
    with ThreadPoolExecutor(1) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=0.05)
    return {"state": result.result_of("report").state.name, "value": result.outputs["report"],
            "ran": ran[0]}


def main() -> None:
    for demo in (bulkhead_demo, rate_limit_demo, breaker_demo, fallback_demo, hedge_demo,
                 single_flight_demo, priority_demo, min_budget_demo):
        print(f"{demo.__name__:20} {demo()}")


if __name__ == "__main__":
    main()
