"""A product-detail request through Flask: hand-written staged futures vs taskflow.

Both handlers call the same seven step functions (``taskflow.cli.demo``: product side 30 -> 20/25 ms,
item side 15 -> 40/35 ms, then a 5 ms aggregation) on the same shared pool:

* ``/staged/<sku>``: the article's hand-written code (``demo.run_staged``): submit the product
  side and wait for it, then the item side, then aggregate. About 115 ms of stages.
* ``/taskflow/<sku>``: the module-level graph started per request; both sides overlap, so the
  page is ready after the slower side: about 60 ms.

Requests go through Flask's test client (the whole WSGI stack, no sockets) from ``--concurrency``
client threads at once; each figure is over ``--requests`` requests after a warm-up. The two
handlers take turns in rounds so both see the same machine.

    python benchmarks/web_latency.py                  # 200 requests at concurrency 16 each
    python benchmarks/web_latency.py --requests 400 --workers 32
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from flask import Flask, jsonify

from taskflow import TaskContext, TaskScheduling
from taskflow.cli.demo import build_flow, run_staged

BUDGET = 1.0


def make_app(pool: Executor) -> Flask:
    app = Flask(__name__)
    flow = build_flow()  # built once, started by every request

    @app.get("/staged/<sku>")
    def staged(sku: str) -> Any:
        page, _ = run_staged(pool, sku, timeout=BUDGET)
        return jsonify(page)

    @app.get("/taskflow/<sku>")
    def flow_page(sku: str) -> Any:
        result = TaskScheduling.start(flow, executor=pool, timeout=BUDGET,
                                      context=TaskContext(sku=sku))
        result.raise_for_failure()
        return jsonify(result.outputs["aggregate"])

    return app


def load(app: Flask, route: str, requests: int, concurrency: int) -> tuple[list[float], float]:
    """Send ``requests`` GETs from ``concurrency`` threads at once; latencies (s) and wall time."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))
    barrier = threading.Barrier(concurrency + 1)
    errors: list[str] = []

    def client() -> None:
        c = app.test_client()
        barrier.wait()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            response = c.get(f"/{route}/sku-{i}")
            dt = time.perf_counter() - t0
            if response.status_code != 200:
                errors.append(f"{route} {response.status_code}")
            with lock:
                latencies.append(dt)

    threads = [threading.Thread(target=client, name=f"bench-client-{k}")
               for k in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[0]}")
    return latencies, wall


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per handler")
    parser.add_argument("--concurrency", type=int, default=16, help="client threads at once")
    parser.add_argument("--workers", type=int, default=64, help="threads of the shared pool")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per handler")
    args = parser.parse_args(argv)

    with ThreadPoolExecutor(args.workers, thread_name_prefix="bench-pool") as pool:
        app = make_app(pool)
        for route in ("staged", "taskflow"):  # warm-up: threads, imports, compiled plan
            load(app, route, args.concurrency * 2, args.concurrency)
        samples: dict[str, list[float]] = {"staged": [], "taskflow": []}
        walls: dict[str, float] = {"staged": 0.0, "taskflow": 0.0}
        per_round = max(1, args.requests // args.rounds)
        for _ in range(args.rounds):
            for route in ("staged", "taskflow"):
                lat, wall = load(app, route, per_round, args.concurrency)
                samples[route] += lat
                walls[route] += wall

    print(f"product-detail page via Flask's test client: {len(samples['staged'])} requests per "
          f"handler, concurrency {args.concurrency}, shared ThreadPoolExecutor({args.workers})")
    print(f"{'handler':<28} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>8}")
    for route, label in (("staged", "hand-written staged futures"), ("taskflow", "taskflow DAG")):
        s = samples[route]
        figures = [pct(s, 0.5), pct(s, 0.9), pct(s, 0.99), statistics.fmean(s)]
        print(f"{label:<28} " + " ".join(f"{x * 1e3:8.1f}" for x in figures)
              + f" {len(s) / walls[route]:8.1f}")
    speedup = pct(samples["staged"], .5) / pct(samples["taskflow"], .5)
    print(f"taskflow p50 is {speedup:.2f}x faster (critical path 60 ms vs 115 ms of stages)")


if __name__ == "__main__":
    main()
