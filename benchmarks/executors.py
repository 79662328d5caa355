"""Per-node overhead of taskflow on each kind of executor, in one table.

For each executor: the bare round trip of one ``submit(noop).result()`` (what any code pays),
then no-op flows run by taskflow:

* ``1-node flow``: a whole run of a single node (the fixed cost of ``start``);
* ``chain``: N nodes, each the son of the previous; time per node. On thread pools a chain runs
  in one worker without a round trip per node; on remote executors every node is its own
  submission (only the task travels), so a chain pays a round trip per node;
* ``fan-out``: one root, N parallel sons, one sink; time per node.

Each figure is the median of ``--repeat`` runs after a warm-up. Remote executors get smaller N
(their round trip is 100x a thread's). loky and dask rows are skipped when not installed.

    python benchmarks/executors.py            # about a minute
    python benchmarks/executors.py --quick
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from taskflow import FunctionNode, TaskScheduling


def noop(ctx: Any = None, param: Any = None) -> None:
    return None


def chain(n: int) -> FunctionNode:
    first = node = FunctionNode(noop, name="c0")
    for i in range(1, n):
        node = node >> FunctionNode(noop, name=f"c{i}")
    return first


def fan(n: int) -> FunctionNode:
    root, sink = FunctionNode(noop, name="root"), FunctionNode(noop, name="sink")
    root >> [FunctionNode(noop, name=f"m{i}") for i in range(n)] >> sink
    return root


@contextmanager
def thread_pool() -> Iterator[Executor]:
    with ThreadPoolExecutor(8) as ex:
        yield ex


@contextmanager
def taskflow_pool() -> Iterator[Executor]:
    from taskflow import ThreadPool

    with ThreadPool(8) as ex:
        yield ex


def process_pool(method: str) -> Callable[[], Any]:
    @contextmanager
    def make() -> Iterator[Executor]:
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(method)) as ex:
            yield ex

    return make


@contextmanager
def loky_pool() -> Iterator[Executor]:
    import loky

    ex = loky.get_reusable_executor(max_workers=2)
    try:
        yield ex
    finally:
        ex.shutdown(wait=True)


def dask_pool(processes: bool) -> Callable[[], Any]:
    @contextmanager
    def make() -> Iterator[Executor]:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=processes,
                               dashboard_address=":0", silence_logs=logging.ERROR,
                               **({"host": "127.0.0.1"} if processes else {}))
        client = Client(cluster)
        try:
            yield client.get_executor(pure=False)
        finally:
            client.close()
            cluster.close()

    return make


KINDS: list[tuple[str, Callable[[], Any], str | None, int]] = [
    # label, factory, package needed, N for chain/fan-out
    ("ThreadPoolExecutor(8)", thread_pool, None, 1000),
    ("taskflow ThreadPool(8)", taskflow_pool, None, 1000),
    ("ProcessPoolExecutor(2) fork", process_pool("fork"), None, 200),
    ("ProcessPoolExecutor(2) spawn", process_pool("spawn"), None, 200),
    ("loky reusable executor(2)", loky_pool, "loky", 200),
    ("dask processes=False 2x2", dask_pool(False), "distributed", 50),
    ("dask processes=True 2x2", dask_pool(True), "distributed", 50),
]


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_flow(ex: Executor, root: FunctionNode) -> None:
    result = TaskScheduling.start(root, executor=ex, timeout=300)
    result.raise_for_failure()


def measure(ex: Executor, n: int, repeat: int) -> dict[str, float]:
    one = FunctionNode(noop, name="one")
    chained, fanned = chain(n), fan(n)
    for _ in range(3):  # warm-up: workers started, taskflow imported there, plans compiled
        run_flow(ex, one)
        run_flow(ex, fanned)
    run_flow(ex, chained)
    return {
        "raw": median_time(lambda: ex.submit(noop).result(), repeat * 20),
        "one": median_time(lambda: run_flow(ex, one), repeat * 10),
        "chain": median_time(lambda: run_flow(ex, chained), repeat) / n,
        "fan": median_time(lambda: run_flow(ex, fanned), repeat) / (n + 2),
    }


def fmt(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1000:8.2f} ms" if us >= 10_000 else f"{us:8.1f} µs"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and nodes")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    repeat = 2 if args.quick else args.repeat

    print(f"{'executor':<30} {'submit→result':>13} {'1-node flow':>13} {'chain/node':>13} "
          f"{'fan-out/node':>13}")
    for label, factory, package, n in KINDS:
        if args.quick:
            n = max(10, n // 5)
        if package is not None:
            try:
                __import__(package)
            except ImportError:
                print(f"{label:<30} skipped: {package} is not installed")
                continue
        with factory() as ex:
            m = measure(ex, n, repeat)
        print(f"{label:<30} {fmt(m['raw']):>13} {fmt(m['one']):>13} {fmt(m['chain']):>13} "
              f"{fmt(m['fan']):>13}")


if __name__ == "__main__":
    main()
