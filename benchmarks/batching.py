"""A 30-SKU carousel page with and without ``batch=``, and an outage with and without a retry
budget.

    PYTHONPATH=. python benchmarks/batching.py              # about 20 s
    PYTHONPATH=. python benchmarks/batching.py --pages 50 --callers 8

Carousel: a page node, then a price node and a stock node per SKU (60 nodes), then a render
node that waits for all of them. Each backend answers one SKU (``get``) or many (``get_many``)
in 5-20 ms per call, whatever the number of SKUs. ``--callers`` threads share one 32-thread
pool and render ``--pages`` pages each, the two variants interleaved round by round:

* ``one call per SKU``: each node calls ``get``: 60 backend calls per page;
* ``batch=``: the price nodes share ``Batch("prices", get_many)``, the stock nodes
  ``Batch("stock", get_many)``: the nodes of a batch ready together make one call.

Per variant: backend calls per page, median and p99 page time; then the ratios.

Outage: a stock backend that fails every call (1 ms), ``retries=3``, ``--outage-runs`` runs with
and without ``RetryBudget(ratio=0.2, min_per_second=10)``: backend calls, and the ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import Batch, FunctionNode, RetryBudget, TaskScheduling

SKUS = [f"sku-{n}" for n in range(30)]
BUDGET = 1.0
POOL = 32


class Backend:
    """``get(sku)`` and ``get_many(skus)``: 5-20 ms a call, counted."""

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.calls = 0

    def _wait(self) -> None:
        with self.lock:
            self.calls += 1
            seconds = self.rng.uniform(0.005, 0.020)
        time.sleep(seconds)

    def get(self, ctx: Any, sku: str) -> str:
        self._wait()
        return f"{self.name}:{sku}"

    def get_many(self, skus: Any) -> dict[str, str]:
        self._wait()
        return {sku: f"{self.name}:{sku}" for sku in skus}


def carousel(prices: Backend, stock: Backend, batched: bool) -> FunctionNode:
    """The page's graph: page -> 30 prices and 30 stocks -> render."""
    page = FunctionNode(lambda ctx, p: SKUS, name="page")
    render = FunctionNode(lambda ctx, p: len(ctx), name="render")
    price_batch = Batch(f"prices-{id(prices)}", prices.get_many) if batched else None
    stock_batch = Batch(f"stock-{id(stock)}", stock.get_many) if batched else None
    for sku in SKUS:
        price = FunctionNode(prices.get, param=sku, name=f"price-{sku}", batch=price_batch)
        level = FunctionNode(stock.get, param=sku, name=f"stock-{sku}", batch=stock_batch)
        page >> [price, level]
        [price, level] >> render
    return page


def pages(graph: FunctionNode, pool: ThreadPoolExecutor, callers: int, count: int) -> list[float]:
    """``callers`` threads render ``count`` pages each; every page's time."""
    times: list[float] = []
    lock = threading.Lock()
    failed = [0]

    def caller() -> None:
        for _ in range(count):
            t0 = time.monotonic()
            result = TaskScheduling.start(graph, executor=pool, timeout=BUDGET)
            elapsed = time.monotonic() - t0
            with lock:
                times.append(elapsed)
                failed[0] += not result.ok
    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failed[0] == 0, f"{failed[0]} pages failed"
    return times


def p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98]


def carousel_bench(rounds: int, pages_per_round: int, callers: int) -> None:
    variants = {"one call per SKU": False, "batch=": True}
    backends = {name: (Backend("price", 1), Backend("stock", 2)) for name in variants}
    graphs = {name: carousel(*backends[name], batched) for name, batched in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    with ThreadPoolExecutor(POOL, thread_name_prefix="bench-batch") as pool:
        for name in variants:  # warm up: plans compiled, durations learnt
            pages(graphs[name], pool, 1, 3)
        warm = {name: sum(b.calls for b in backends[name]) for name in variants}
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                times[name] += pages(graphs[name], pool, callers, pages_per_round)
    total = rounds * pages_per_round * callers
    print(f"carousel: 30 SKUs, price and stock per SKU (60 nodes), {callers} callers, "
          f"{total} pages per variant, a {POOL}-thread pool")
    figures = {}
    for name in variants:
        calls = (sum(b.calls for b in backends[name]) - warm[name]) / total
        figures[name] = (calls, statistics.median(times[name]), p99(times[name]))
        print(f"  {name:18} backend calls/page {calls:6.2f}   median "
              f"{figures[name][1] * 1e3:6.1f} ms   p99 {figures[name][2] * 1e3:6.1f} ms")
    plain, batched = figures["one call per SKU"], figures["batch="]
    print(f"  ratios batch=/plain: calls {batched[0] / plain[0]:.3f}x "
          f"({plain[0]:.0f} -> {batched[0]:.0f}), median {batched[1] / plain[1]:.3f}x, "
          f"p99 {batched[2] / plain[2]:.3f}x")


class Outage:
    """A stock backend that fails every call after 1 ms, counted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0

    def __call__(self, ctx: Any, param: Any) -> None:
        with self.lock:
            self.calls += 1
        time.sleep(0.001)
        raise ConnectionError("stock backend down")


def outage_bench(runs: int) -> None:
    budget = RetryBudget("outage-bench", ratio=0.2, min_per_second=10)
    counts = {}
    for name, options in (("retries=3", {}), ("retries=3 + budget", {"retry_budget": budget})):
        backend = Outage()
        node = FunctionNode(backend, name="stock", retries=3, **options)
        with ThreadPoolExecutor(8, thread_name_prefix="bench-outage") as pool:
            t0 = time.monotonic()
            futures = [TaskScheduling.submit(node, executor=pool, timeout=BUDGET)
                       for _ in range(runs)]
            for f in futures:
                f.result()
            elapsed = time.monotonic() - t0
        counts[name] = backend.calls
        print(f"  {name:20} backend calls {backend.calls:5d} ({backend.calls / runs:.2f} per "
              f"run, {elapsed:.2f} s)")
    m = budget.metrics()
    print(f"  budget: {m.attempts} first attempts, {m.retries} retries made, {m.refused} "
          f"refused; calls with/without: "
          f"{counts['retries=3 + budget'] / counts['retries=3']:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pages", type=int, default=25, help="pages per caller and round")
    ap.add_argument("--callers", type=int, default=4)
    ap.add_argument("--outage-runs", type=int, default=200)
    args = ap.parse_args()
    carousel_bench(args.rounds, args.pages, args.callers)
    print(f"outage: every call fails, {args.outage_runs} runs")
    outage_bench(args.outage_runs)


if __name__ == "__main__":
    main()
