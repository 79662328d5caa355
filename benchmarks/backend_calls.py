"""A backend that hangs, with and without the clamped session; and what the deadline options cost.

Part 1, abandoned threads. A local HTTP server on 127.0.0.1 accepts every request and never
answers (until the end). ``--runs`` runs (200) of a one-node flow that calls it, each with a
``--budget`` (20 ms), one after another on one ``taskflow.ThreadPool`` (16 core threads, a
direct hand-off queue, up to ``--runs`` + 16 threads, so a stuck thread makes the pool grow
rather than queue): through a plain ``requests.Session`` (no timeout, as code that forgot one
has), then through ``taskflow.http.session()``. Every run ends ``TIMEOUT`` at its deadline
either way; what differs is what the pool keeps: ``abandoned running`` (threads still inside a
call a run gave up on) and its size, read after the runs and a short settle.

Part 2, the cost to nodes. A 1000-node chain of plain function nodes, per-node time (median
of ``--repeat`` runs) with no option; then with each node asking ``ctx.timeout()``; then with
each node registering a ``ctx.on_cancel`` callback. Nodes that use none pay nothing: the
engine's per-node path is unchanged (``benchmarks/ab_engines.py OLD --only overhead`` compares
it with an older tree); those that use them pay what the table shows.

    python benchmarks/backend_calls.py
    python benchmarks/backend_calls.py --runs 50 --repeat 5

Target: 0 abandoned threads with the clamped session after the runs (one per run without it).
A call to ``ctx.timeout()`` costs a few microseconds (part 2), well under any backend call.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

import taskflow.http
from taskflow import FunctionNode, TaskContext, TaskScheduling, ThreadPool


class HungBackend:
    """Accepts every request and answers none until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for a GET
                backend.release.wait(600)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that timed out have gone

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hang"
        self.thread = threading.Thread(target=self.server.serve_forever, name="hung-backend",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def abandoned_after(get: Callable[[str], Any], backend: HungBackend, runs: int,
                    budget: float) -> dict[str, Any]:
    pool = ThreadPool(16, max_size=runs + 16, queue_capacity=0, thread_name_prefix="page")
    node = FunctionNode(lambda ctx, p: get(backend.url), name="backend")
    started = time.perf_counter()
    timed_out = 0
    try:
        for _ in range(runs):
            result = TaskScheduling.start(node, executor=pool, timeout=budget)
            timed_out += not result.ok
        elapsed = time.perf_counter() - started
        time.sleep(budget * 5 + 0.2)  # settle: a clamped call returns right after its deadline
        m = pool.metrics()
        return {"runs": runs, "timed out": timed_out, "abandoned running": m.abandoned_running,
                "abandoned in all": m.abandoned_total, "pool threads": m.pool_size,
                "seconds": round(elapsed, 2)}
    finally:
        backend.release.set()  # let the plain session's threads out before the pool goes
        pool.shutdown(wait=True)
        backend.release.clear()


def per_node_us(task: Callable[[TaskContext, Any], Any], repeat: int, n: int = 1000) -> float:
    nodes = [FunctionNode(task, name=f"c{i}") for i in range(n)]
    for a, b in zip(nodes, nodes[1:], strict=False):
        a >> b
    with ThreadPoolExecutor(4) as pool:
        TaskScheduling.start(nodes[0], executor=pool, timeout=60)  # warm-up, plan compiled
        samples = []
        for _ in range(repeat):
            t = time.perf_counter()
            result = TaskScheduling.start(nodes[0], executor=pool, timeout=60)
            samples.append(time.perf_counter() - t)
            assert result.ok
    return statistics.median(samples) / n * 1e6


def plain(ctx: TaskContext, param: Any) -> None:
    return None


def asks_timeout(ctx: TaskContext, param: Any) -> None:
    ctx.timeout()


def registers(ctx: TaskContext, param: Any) -> None:
    ctx.on_cancel(_nothing)


def _nothing() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--budget", type=float, default=0.02)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()

    backend = HungBackend()
    try:
        plain_session = requests.Session()
        clamped = taskflow.http.session()
        rows = {
            "plain requests.Session": abandoned_after(lambda u: plain_session.get(u), backend,
                                                      args.runs, args.budget),
            "taskflow.http.session()": abandoned_after(lambda u: clamped.get(u), backend,
                                                       args.runs, args.budget),
        }
    finally:
        backend.close()
    print(f"hung backend, {args.runs} runs of {args.budget * 1000:.0f} ms, one after another:")
    for name, row in rows.items():
        print(f"  {name:26} " + ", ".join(f"{k} {v}" for k, v in row.items()))

    base = per_node_us(plain, args.repeat)
    print(f"\n1000-node chain, per node (median of {args.repeat}):")
    print(f"  no option              {base:6.2f} us")
    for label, task in (("ctx.timeout() per node", asks_timeout),
                        ("ctx.on_cancel per node", registers)):
        us = per_node_us(task, args.repeat)
        print(f"  {label:22} {us:6.2f} us  ({us / base:.2f}x)")


if __name__ == "__main__":
    main()
