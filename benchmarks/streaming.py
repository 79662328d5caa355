"""The streamed product page of ``examples/flask_app.py``: when each part reaches the client.

``GET /products/<sku>/page`` (``TaskScheduling.stream`` behind ``stream_with_context``) sends
the top of the page at once, then each part as its node settles; the full reviews (a 250 ms
backend) come last. For each request this measures, from the request:

* ``first byte``: the top of the page (no node needed);
* ``first part``: the first section (product_info, 30 ms of backend);
* ``above the fold``: product_info, price and stock all sent (about 55 ms of backend);
* ``full page``: the last chunk (the reviews, about 265 ms).

and, for comparison, the same parts rendered by ``TaskScheduling.start`` and sent in one piece
(``buffered``: the client sees nothing until the slowest part is done). Requests go through
Flask's test client (the whole WSGI stack, no sockets) from ``--concurrency`` threads at once;
the two routes take turns so both see the same machine. The figures worth reading are the
ratios, measured in the same run::

    python benchmarks/streaming.py                     # 60 requests per route, 8 at once
    python benchmarks/streaming.py --requests 200 --concurrency 16
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flask_app.py"
ABOVE_THE_FOLD = ("product_info", "price", "stock")


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flask_app_bench", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["flask_app_bench"] = module
    spec.loader.exec_module(module)
    return module


def add_buffered_route(example: ModuleType) -> None:
    """The same parts from ``start``, sent in one piece once every part is done."""
    from flask import Response

    from taskflow import TaskContext, TaskScheduling

    def buffered(sku: str) -> Response:
        result = TaskScheduling.start(example.STREAMED_PAGE, executor=example.POOL,
                                      timeout=example.STREAM_BUDGET, name="product_page",
                                      context=TaskContext(sku=sku))
        parts = [example.PAGE_TOP.format(sku=sku)]
        parts += [example.page_part(name, result.result_of(name)) for name in result]
        parts.append(example.PAGE_END)
        return Response("".join(parts), mimetype="text/html")

    example.app.add_url_rule("/products/<sku>/buffered", "buffered", buffered)


def one_request(client: Any, route: str) -> dict[str, float]:
    """Seconds from the request to its first byte, first part, above the fold and last chunk."""
    t0 = time.perf_counter()
    response = client.get(route, buffered=False)
    marks: dict[str, float] = {}
    seen = ""
    for chunk in response.response:
        now = time.perf_counter() - t0
        seen += chunk.decode()
        marks.setdefault("first byte", now)
        if "<section" in seen:
            marks.setdefault("first part", now)
        if all(f'id="{p}"' in seen for p in ABOVE_THE_FOLD):
            marks.setdefault("above the fold", now)
        marks["full page"] = now
    response.close()
    assert seen.endswith("</html>\n") and 'id="reviews"' in seen, seen[-200:]
    return marks


def load(client_of: Any, route: str, requests: int, concurrency: int) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        client = client_of()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            marks = one_request(client, route.format(i=i))
            with lock:
                out.append(marks)

    threads = [threading.Thread(target=worker, name=f"bench-client-{k}")
               for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def median(samples: list[dict[str, float]], mark: str) -> float:
    return statistics.median(s[mark] for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="requests per route")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads at once")
    parser.add_argument("--rounds", type=int, default=3, help="turns each route takes")
    args = parser.parse_args()

    example = load_example()
    add_buffered_route(example)
    example.logger.disable("flask_app_bench")  # the example's own INFO lines
    example.logger.disable("taskflow")
    client_of = example.app.test_client
    one_request(client_of(), "/products/warm/page")  # warm-up: imports, pool threads, estimates
    one_request(client_of(), "/products/warm/buffered")
    streamed: list[dict[str, float]] = []
    buffered: list[dict[str, float]] = []
    per_round = max(1, args.requests // args.rounds)
    for _ in range(args.rounds):
        streamed += load(client_of, "/products/sku-{i}/page", per_round, args.concurrency)
        buffered += load(client_of, "/products/sku-{i}/buffered", per_round, args.concurrency)
    example.MONITOR.stop()
    example.POOL.shutdown()

    full = median(streamed, "full page")
    print(f"streamed product page, {len(streamed)} requests per route, "
          f"{args.concurrency} at once (medians; the reviews backend takes "
          f"{example.REVIEWS_S * 1000:.0f} ms)")
    print(f"{'':<18}{'ms':>8}{'of the full page':>20}")
    for mark in ("first byte", "first part", "above the fold", "full page"):
        m = median(streamed, mark)
        print(f"{mark:<18}{m * 1000:>8.1f}{m / full:>19.2f}x")
    whole = median(buffered, "first byte")
    print(f"{'buffered (start)':<18}{whole * 1000:>8.1f}{whole / full:>19.2f}x"
          "   <- its first byte is its full page")
    print(f"above the fold, streamed vs buffered: "
          f"{median(streamed, 'above the fold') / whole:.2f}x the time")


if __name__ == "__main__":
    main()
