"""A page of many backend calls, as async nodes against the same page as sync nodes.

    python benchmarks/async_nodes.py                 # 50 calls of 20 ms, 4 workers, 10 pages
    python benchmarks/async_nodes.py --calls 200 --workers 16
    python benchmarks/async_nodes.py --smoke         # seconds: what CI runs

A sync node holds a worker while it waits for its backend, so a page of ``calls`` calls of
``latency`` seconds on ``workers`` workers takes about ``calls / workers * latency``; an async
node waits on the event loop and holds no worker, so the page takes about one ``latency``
whatever the pool. Both are timed one after the other in the same process; the table shows the
median time per page and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import FunctionNode, TaskScheduling


def page(kind: str, calls: int, latency: float) -> list[FunctionNode]:
    async def async_call(ctx: Any, k: int) -> int:
        await asyncio.sleep(latency)  # a backend answering after ``latency`` seconds
        return k

    def sync_call(ctx: Any, k: int) -> int:
        time.sleep(latency)
        return k

    fn = async_call if kind == "async" else sync_call
    return [FunctionNode(fn, k, name=f"call-{k}") for k in range(calls)]


def per_page(kind: str, calls: int, latency: float, workers: int, pages: int) -> float:
    """Median seconds per page of ``kind`` nodes."""
    nodes = page(kind, calls, latency)
    times = []
    with ThreadPoolExecutor(workers) as pool:
        assert TaskScheduling.start(nodes, executor=pool, timeout=60).ok  # warm-up
        for _ in range(pages):
            t0 = time.perf_counter()
            result = TaskScheduling.start(nodes, executor=pool, timeout=60)
            times.append(time.perf_counter() - t0)
            assert result.ok, result.failed
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="a few small pages")
    args = parser.parse_args(argv)
    if args.smoke:
        args.calls, args.pages, args.latency = 12, 2, 0.01
    out = {kind: per_page(kind, args.calls, args.latency, args.workers, args.pages)
           for kind in ("async", "sync")}
    print(f"a page of {args.calls} calls of {args.latency * 1000:.0f} ms on {args.workers} "
          f"workers, median of {args.pages} pages:")
    for kind, seconds in out.items():
        print(f"  {kind:5} nodes: {seconds * 1000:8.1f} ms per page")
    print(f"  sync / async: {out['sync'] / out['async']:.1f}x")
    return out


if __name__ == "__main__":
    main()
