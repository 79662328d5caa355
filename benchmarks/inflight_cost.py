"""The cost of reading what is running now: one ``taskflow.observe.inflight()`` call (and one
``dump()``) with many runs in flight.

    python benchmarks/inflight_cost.py                  # 500 runs of 10 nodes
    python benchmarks/inflight_cost.py --runs 500 --nodes 20 --calls 50

The runs are ``submit`` runs on a one-worker pool whose worker is held by a gate: each run's
root is QUEUED behind it and its other nodes WAITING, so every run stays in flight while the
reads are timed; then the gate opens and the runs finish.
"""

from __future__ import annotations

import argparse
import io
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import taskflow.observe as observe
from taskflow import FunctionNode, TaskScheduling


def _noop(ctx: Any, param: Any) -> None:
    return None


def chain(n: int) -> FunctionNode[Any, Any]:
    nodes = [FunctionNode(_noop, name=f"n{i}") for i in range(n)]
    for a, b in zip(nodes, nodes[1:], strict=False):
        a >> b
    return nodes[0]


def timed(fn: Any, calls: int) -> float:
    """Median seconds of one call of ``fn`` over ``calls`` calls."""
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(gate.wait)  # holds the only worker: every run's root stays QUEUED
        futures = [TaskScheduling.submit(chain(args.nodes), executor=pool, timeout=600,
                                         name=f"flow{i % 7}") for i in range(args.runs)]
        seen = len(observe.inflight())
        assert seen >= args.runs, f"only {seen} runs in flight"
        t_inflight = timed(observe.inflight, args.calls)
        t_abandoned = timed(observe.abandoned, args.calls)
        t_dump = timed(lambda: observe.dump(io.StringIO()), max(3, args.calls // 5))
        gate.set()
        for f in futures:
            f.result(60)
    print(f"{args.runs} runs of {args.nodes} nodes in flight ({args.runs * args.nodes} nodes)")
    print(f"  inflight():  {t_inflight * 1e3:8.2f} ms per call "
          f"({t_inflight / args.runs * 1e6:.1f} us per run, "
          f"{t_inflight / (args.runs * args.nodes) * 1e6:.2f} us per node)")
    print(f"  abandoned(): {t_abandoned * 1e3:8.3f} ms per call (none abandoned)")
    print(f"  dump():      {t_dump * 1e3:8.2f} ms per call")


if __name__ == "__main__":
    main()
