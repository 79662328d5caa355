"""What ``run_async``'s hand-off costs: an executor that may run a task in the submitting thread
(an inline executor, a ``CALLER_RUNS`` pool) has its first worker loops submitted by a
coordinator thread, so that no sync task runs on the awaiting loop; a queuing pool is
submitted to from the loop directly.

Awaits a page of three sync nodes (two roots and their join) one run after another, on the same
``ThreadPoolExecutor`` submitted to directly and through the hand-off (forced), and on a
``taskflow.ThreadPool`` with the ``ABORT`` and ``CALLER_RUNS`` policies; prints the median
microseconds per awaited run over the rounds.

    python benchmarks/run_async_hand_off.py [--runs 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import taskflow
from taskflow import FunctionNode
from taskflow.engine import executors
from taskflow.pools.threadpool import RejectionPolicy, ThreadPool


def page() -> FunctionNode:
    a = FunctionNode(lambda ctx, p: 1, name="a")
    b = FunctionNode(lambda ctx, p: 2, name="b")
    j = FunctionNode(lambda ctx, p: ctx.result_of("a") + ctx.result_of("b"), name="j")
    a >> j
    b >> j
    return j


async def per_run(node: FunctionNode, executor: Executor, runs: int) -> float:
    for _ in range(50):  # warm up
        await taskflow.run_async(node, executor=executor, timeout=5.0)
    t0 = time.perf_counter()
    for _ in range(runs):
        result = await taskflow.run_async(node, executor=executor, timeout=5.0)
        assert result.ok, result.summary
    return (time.perf_counter() - t0) / runs * 1e6


def measure(executor: Executor, runs: int, rounds: int, force_hand_off: bool = False) -> float:
    real = executors.queues
    if force_hand_off:
        executors.queues = lambda ex, remote: False  # type: ignore[assignment]
    try:
        node = page()
        return statistics.median(asyncio.run(per_run(node, executor, runs))
                                 for _ in range(rounds))
    finally:
        executors.queues = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows: list[tuple[str, Any]] = []
    with ThreadPoolExecutor(4) as pool:
        rows.append(("ThreadPoolExecutor, from the loop", measure(pool, args.runs, args.rounds)))
        rows.append(("ThreadPoolExecutor, handed off (forced)",
                     measure(pool, args.runs, args.rounds, force_hand_off=True)))
    for policy in (RejectionPolicy.ABORT, RejectionPolicy.CALLER_RUNS):
        tp = ThreadPool(4, 4, rejection=policy, name=f"bench-{policy.value}")
        try:
            tp.prestart_core_threads()
            where = "handed off" if policy is RejectionPolicy.CALLER_RUNS else "from the loop"
            rows.append((f"taskflow.ThreadPool {policy.value}, {where}",
                         measure(tp, args.runs, args.rounds)))
        finally:
            tp.shutdown()
    for label, us in rows:
        print(f"  {label:45s} {us:8.1f} us per awaited run")
    print(f"  hand-off cost on the same pool: {rows[1][1] - rows[0][1]:+.1f} us per run "
          f"({rows[1][1] / rows[0][1]:.2f}x)")


if __name__ == "__main__":
    main()
