"""What ``FlowStats.record_run`` costs per run, against running a no-op flow of the same shape.

For each shape (the article's 7-node product-detail DAG, a 20-node layered DAG, a 100-node
layered DAG) it measures, in one process on one 8-worker pool:

* ``run``: ``TaskScheduling.start`` of the flow with no-op tasks (the cheapest real run);
* ``record``: ``FlowStats.record_run`` of one such result, with the default ``RunLog`` and
  without one (``runs=None``);
* ``html``: ``render_html`` of the result, for scale (it is not on the request path);
* ``fed``: the same run with ``stats.enable()``: the engine records it before ``start`` returns
  (what a request pays when statistics are on).

Each figure is the median of ``--repeat`` batches (microseconds per run). The batches of the
four measurements are interleaved and each ratio is the median of per-repeat ratios against the
``run`` batch measured just before, so ratios stay meaningful on a busy machine.

    python benchmarks/stats_overhead.py            # about 20 s
    python benchmarks/stats_overhead.py --quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import FlowResult, FunctionNode, SchedulingNode, TaskScheduling
from taskflow.observe.html import render_html
from taskflow.observe.stats import FlowStats

Graph = dict[str, list[str]]  # node -> fathers


def product_detail() -> Graph:
    return {
        "product_info": [], "price": ["product_info"], "stock": ["product_info"],
        "category": [], "reviews": ["category"], "recommendations": ["category"],
        "aggregate": ["price", "stock", "reviews", "recommendations"],
    }


def layered(depth: int, width: int, seed: int = 7) -> Graph:
    rnd = random.Random(seed)
    g: Graph = {}
    for d in range(depth):
        for w in range(width):
            g[f"l{d}_{w}"] = [] if d == 0 else [
                f"l{d - 1}_{x}" for x in rnd.sample(range(width), rnd.randint(1, min(3, width)))
            ]
    return g


def noop(ctx: Any, param: Any) -> None:
    return None


def build(g: Graph) -> list[SchedulingNode[Any, Any]]:
    nodes = {name: FunctionNode(noop, name=name) for name in g}
    for name, fathers in g.items():
        for f in fathers:
            nodes[f] >> nodes[name]
    return [nodes[n] for n, fs in g.items() if not fs]


def batch_us(fn: Callable[[], object], calls: int) -> float:
    """Mean µs per call over one batch of ``calls`` calls."""
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def interleaved(fns: list[tuple[Callable[[], object], int]], repeat: int) -> list[list[float]]:
    """µs per call of each function, batches interleaved so each repeat sees the same load."""
    for fn, _ in fns:
        fn()  # warm-up
    return [[batch_us(fn, calls) for fn, calls in fns] for _ in range(repeat)]


def concurrent_record_us(stats: FlowStats, result: FlowResult, threads: int, calls: int) -> float:
    """Wall µs per recorded run when ``threads`` threads record at once (GIL included)."""
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        barrier.wait()
        for _ in range(calls):
            stats.record_run(result, flow="concurrent")

    workers = [threading.Thread(target=work, name=f"bench-recorder-{i}") for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t = time.perf_counter()
    for w in workers:
        w.join()
    return (time.perf_counter() - t) / (threads * calls) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    repeat = 3 if args.quick else args.repeat
    shapes = [("product_detail (7 nodes)", product_detail()),
              ("layered 4x5 (20 nodes)", layered(4, 5)),
              ("layered 10x10 (100 nodes)", layered(10, 10))]
    print(f"{'flow':<28}{'run µs':>10}{'record µs':>11}{'ratio':>8}"
          f"{'no log µs':>11}{'ratio':>8}{'html µs':>10}{'fed µs':>9}{'ratio':>8}")
    with ThreadPoolExecutor(8, thread_name_prefix="bench") as pool:
        for label, g in shapes:
            roots = build(g)
            calls = max(20, 4000 // len(g))

            def run(roots: list[SchedulingNode[Any, Any]] = roots) -> FlowResult:
                return TaskScheduling.start(roots, executor=pool, timeout=30)

            result = run()
            stats = FlowStats()
            bare = FlowStats(runs=None)
            fed = FlowStats()

            def run_fed(run: Callable[[], FlowResult] = run, fed: FlowStats = fed) -> None:
                fed.enable()
                try:
                    run()
                finally:
                    fed.disable()

            rows = interleaved([
                (run, max(5, calls // 4)),
                (lambda s=stats, r=result: s.record_run(r, flow="bench"), calls),
                (lambda s=bare, r=result: s.record_run(r, flow="bench"), calls),
                (lambda r=result: render_html(r), max(3, calls // 40)),
                (run_fed, max(5, calls // 4)),
            ], repeat)
            run_us, rec_us, bare_us, html_us, fed_us = (
                statistics.median(col) for col in zip(*rows, strict=True))
            rec_ratio = statistics.median(r[1] / r[0] for r in rows)
            bare_ratio = statistics.median(r[2] / r[0] for r in rows)
            fed_ratio = statistics.median(r[4] / r[0] for r in rows)
            print(f"{label:<28}{run_us:>10.1f}{rec_us:>11.1f}{rec_ratio:>8.1%}"
                  f"{bare_us:>11.1f}{bare_ratio:>8.1%}{html_us:>10.0f}{fed_us:>9.1f}"
                  f"{fed_ratio - 1:>+8.1%}")
        result = TaskScheduling.start(build(product_detail()), executor=pool, timeout=30)
        one = batch_us(lambda: FlowStats(runs=None).record_run(result), 1)
        shared = FlowStats(runs=None)
        conc = concurrent_record_us(shared, result, threads=4, calls=2000 if not args.quick else 500)
        print(f"\n4 threads recording into one FlowStats (product_detail): {conc:.1f} µs wall per "
              f"run (first record into a fresh FlowStats: {one:.0f} µs)")


if __name__ == "__main__":
    main()
