"""ThreadPool and MonitoredExecutor against the standard ThreadPoolExecutor, in one process.

Run: ``python benchmarks/pool_throughput.py [--workers 4] [--tasks 100000] [--repeats 5]``

For each executor, with the same number of worker threads:

* round trip: the median time of ``submit(noop).result()`` one at a time (µs); the executors
  take turns every 50 calls, so a burst of load from other processes hits them alike;
* throughput: 100,000 tiny tasks submitted from one thread, then waited for (tasks/s), and the
  process CPU time spent per task (all threads, µs), which other processes disturb less.

Each figure is the median over ``--repeats`` rounds; within a round the executors take turns in
a rotating order, and a full garbage collection runs before every throughput run. Targets:
ThreadPool's time ratio to ThreadPoolExecutor <= 1.2; MonitoredExecutor's overhead <= 10 %.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from pathlib import Path

# run from a checkout without installing: the repository root goes first on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def noop() -> None:
    """The tiny task."""


def round_trips_us(executors: list[Executor], n: int, block: int = 50) -> list[float]:
    """Median µs of ``submit(noop).result()`` for each executor, taking turns every ``block``
    calls (so each runs warm, and a burst of outside load hits them alike)."""
    samples: list[list[float]] = [[] for _ in executors]
    clock = time.perf_counter
    for _ in range(max(1, n // block)):
        for ex, out in zip(executors, samples):
            for _ in range(block):
                t0 = clock()
                ex.submit(noop).result()
                out.append(clock() - t0)
    return [statistics.median(s) * 1e6 for s in samples]


def throughput(executor: Executor, n: int) -> tuple[float, float]:
    """Tasks per second, and process CPU µs per task, for ``n`` tiny tasks submitted from this
    thread and all waited for."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    futures = [executor.submit(noop) for _ in range(n)]
    wait(futures)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    del futures
    return n / elapsed, cpu / n * 1e6


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--round-trips", type=int, default=3_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    w = args.workers
    from taskflow.pool import MonitoredExecutor, ThreadPool

    factories: dict[str, Callable[[], Executor]] = {
        "ThreadPoolExecutor": lambda: ThreadPoolExecutor(w),
        "ThreadPool": lambda: ThreadPool(w),
        "MonitoredExecutor(TPE)": lambda: MonitoredExecutor(ThreadPoolExecutor(w)),
        "MonitoredExecutor(ThreadPool)": lambda: MonitoredExecutor(ThreadPool(w)),
    }
    executors = {name: make() for name, make in factories.items()}
    names = list(executors)
    rt: dict[str, list[float]] = {name: [] for name in names}
    tp: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    try:
        for ex in executors.values():  # warm up: start the threads
            throughput(ex, 2_000)
        round_trips_us(list(executors.values()), 200)
        for r in range(args.repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                rate, per_task = throughput(executors[name], args.tasks)
                tp[name].append(rate)
                cpu[name].append(per_task)
            for name, us in zip(order, round_trips_us([executors[n] for n in order], args.round_trips)):
                rt[name].append(us)
    finally:
        for ex in executors.values():
            ex.shutdown()

    med = statistics.median
    m_rt = {n: med(v) for n, v in rt.items()}
    m_tp = {n: med(v) for n, v in tp.items()}
    m_cpu = {n: med(v) for n, v in cpu.items()}
    base = "ThreadPoolExecutor"
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, {w} workers, "
        f"{args.tasks:,} tasks, {args.round_trips:,} round trips, median of {args.repeats} rounds"
    )
    header = (
        f"{'executor':<30} {'round trip µs':>13} {'ratio':>6} {'tasks/s':>9} "
        f"{'time ratio':>10} {'CPU µs/task':>11} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        print(
            f"{name:<30} {m_rt[name]:>13.1f} {m_rt[name] / m_rt[base]:>6.2f} {m_tp[name]:>9,.0f} "
            f"{m_tp[base] / m_tp[name]:>10.2f} {m_cpu[name]:>11.1f} {m_cpu[name] / m_cpu[base]:>6.2f}"
        )
    print()
    mon = "MonitoredExecutor(TPE)"
    print(
        f"ThreadPool vs ThreadPoolExecutor, {args.tasks:,} tasks: time ratio "
        f"{m_tp[base] / m_tp['ThreadPool']:.2f} (target <= 1.2), CPU ratio "
        f"{m_cpu['ThreadPool'] / m_cpu[base]:.2f}, round trip ratio "
        f"{m_rt['ThreadPool'] / m_rt[base]:.2f}"
    )
    print(
        f"MonitoredExecutor overhead on ThreadPoolExecutor: throughput "
        f"{(m_tp[base] / m_tp[mon] - 1) * 100:+.1f} %, CPU {(m_cpu[mon] / m_cpu[base] - 1) * 100:+.1f} %, "
        f"round trip {(m_rt[mon] / m_rt[base] - 1) * 100:+.1f} % (target <= 10 %)"
    )


if __name__ == "__main__":
    main()
