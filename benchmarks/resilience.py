"""The product page under load with one backend degraded, with and without resilience options.

With and without the options, and against hand-written futures code, in one run.

32 callers share one 32-thread pool. 24 of them request the product page (product_info ->
price, stock; category -> reviews, recommendations; -> page), 8 request a cart page that never
touches recommendations (product_info -> price -> cart). Every backend call takes 5-10 ms;
recommendations is the bad backend: in ``--mode slow`` 10 % of its calls take 300 ms, in
``--mode fail`` 20 % raise. The page budget is 200 ms. Variants:

* ``healthy``: taskflow, no option, recommendations healthy (the reference for the cart p99);
* ``futures``: hand-written stages (submit, ``future.result(timeout=left)``), all-or-nothing;
* ``taskflow``: the same graph, no option: a failed or late recommendations fails the page;
* ``resilient``: recommendations with ``bulkhead`` (6 threads at most, nobody waits),
  ``fallback=[]`` (the page renders without it), ``hedge`` after 40 ms (idempotent) and a
  100 ms node timeout;
* ``resilient-p95``: the same with ``Hedge(after="p95")``, the recommended setting (the delay
  follows the node's durations in this process, starting cold in each round).

Per variant: page p50/p99 (caller's clock), the share of pages rendered (complete, or degraded
where recommendations is optional), the share complete (recommendations included), the cart p99, and the peak number of pool threads inside
the bad backend at once. Then single flight: 32 concurrent requests for one key, with and
without ``share_key``, count the backend calls.

    python benchmarks/resilience.py                # both modes (about a minute)
    python benchmarks/resilience.py --mode slow --requests 10

Targets: ``resilient`` p99 <= budget and >= 99 % rendered; its cart p99 within
1.2x of ``healthy``'s; single flight: 1 backend call.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import Bulkhead, FunctionNode, Hedge, TaskContext, TaskScheduling

BUDGET = 0.2
CALLERS = 32
CART_CALLERS = 8
POOL_THREADS = 32


class Backends:
    """The simulated backends; ``bad`` is how recommendations misbehaves."""

    def __init__(self, bad: str | None, seed: int = 7) -> None:
        self.bad = bad
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.inside = 0  # threads inside recommendations now
        self.peak = 0

    def call(self, seconds: float) -> None:
        time.sleep(seconds)

    def recommendations(self, ctx: object) -> list[str]:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            roll = self.rng.random()
        try:
            if self.bad == "slow" and roll < 0.10:
                time.sleep(0.3)  # does not poll ctx.cancelled: holds its thread throughout
            elif self.bad == "fail" and roll < 0.20:
                time.sleep(0.005)
                raise ConnectionError("recommendations backend answered 503")
            else:
                time.sleep(0.008)
            return ["sku-2", "sku-3"]
        finally:
            with self.lock:
                self.inside -= 1


def product_calls(b: Backends) -> tuple[Any, Any]:
    """The two backend calls the page and the cart share: product_info and price."""

    def product_info(ctx: TaskContext, p: Any) -> dict[str, str]:
        b.call(0.008)
        return {"sku": ctx["sku"]}

    def price(ctx: TaskContext, p: Any) -> float:
        b.call(0.006)
        return 79.0

    return product_info, price


def build_page(b: Backends, resilient: bool, hedge: Hedge | None = None) -> FunctionNode:
    product_info, price = product_calls(b)

    def stock(ctx: TaskContext, p: Any) -> int:
        b.call(0.006)
        return 42

    def category(ctx: TaskContext, p: Any) -> str:
        b.call(0.005)
        return "keyboards"

    def reviews(ctx: TaskContext, p: Any) -> float:
        b.call(0.010)
        return 4.7

    def recommendations(ctx: TaskContext, p: Any) -> list[str]:
        return b.recommendations(ctx)

    def page(ctx: TaskContext, p: Any) -> dict[str, Any]:
        return {n: ctx.result_of(n) for n in ("product_info", "price", "stock", "reviews",
                                              "recommendations")}

    options: dict[str, Any] = {}
    if resilient:
        # max_waiting=0: with 8 calls in flight, the page renders without recommendations at
        # once rather than wait for a slot
        options = {"bulkhead": Bulkhead("recommendations", max_concurrent=6, max_waiting=0),
                   "fallback": [], "hedge": hedge or Hedge(after=0.04), "idempotent": True,
                   "timeout": 0.1}
    top = FunctionNode(page)
    FunctionNode(product_info) >> [FunctionNode(price), FunctionNode(stock)] >> top
    FunctionNode(category) >> [FunctionNode(reviews),
                               FunctionNode(recommendations, **options)] >> top
    return top


def build_cart(b: Backends) -> FunctionNode:
    product_info, price = product_calls(b)

    def cart(ctx: TaskContext, p: Any) -> float:
        return float(ctx.result_of("price"))

    top = FunctionNode(cart)
    FunctionNode(product_info) >> FunctionNode(price) >> top
    return top


def futures_page(pool: ThreadPoolExecutor, b: Backends, sku: str) -> bool:
    """Hand-written stages: the page is rendered only if every call answered in the budget."""
    deadline = time.monotonic() + BUDGET

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    try:
        f_info = pool.submit(lambda: (b.call(0.008), {"sku": sku})[1])
        f_cat = pool.submit(lambda: (b.call(0.005), "keyboards")[1])
        f_info.result(timeout=left())
        f_price = pool.submit(lambda: (b.call(0.006), 79.0)[1])
        f_stock = pool.submit(lambda: (b.call(0.006), 42)[1])
        f_cat.result(timeout=left())
        f_rev = pool.submit(lambda: (b.call(0.010), 4.7)[1])
        f_reco = pool.submit(b.recommendations, None)
        for f in (f_price, f_stock, f_rev, f_reco):
            f.result(timeout=left())
        return True
    except Exception:  # noqa: BLE001 - a late or failed call fails the page
        return False


def run_variant(name: str, bad: str | None, requests: int) -> dict[str, Any]:
    b = Backends(bad)
    page = build_page(b, resilient=name.startswith("resilient"),
                      hedge=Hedge(after="p95") if name == "resilient-p95" else None)
    cart = build_cart(b)
    page_times: list[float] = []
    cart_times: list[float] = []
    rendered = [0]
    complete = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(CALLERS)
    with ThreadPoolExecutor(POOL_THREADS, thread_name_prefix=f"bench-{name}") as pool:

        def caller(k: int) -> None:
            barrier.wait()
            for r in range(requests):
                sku = f"sku-{k}-{r}"
                t0 = time.monotonic()
                if k < CART_CALLERS:
                    TaskScheduling.start(cart, executor=pool, timeout=BUDGET,
                                         context=TaskContext(sku=sku))
                    with lock:
                        cart_times.append(time.monotonic() - t0)
                    continue
                if name == "futures":
                    ok = whole = futures_page(pool, b, sku)
                else:
                    result = TaskScheduling.start(page, executor=pool, timeout=BUDGET,
                                                  context=TaskContext(sku=sku))
                    ok, whole = result.ok, result.ok and not result.degraded
                with lock:
                    page_times.append(time.monotonic() - t0)
                    rendered[0] += ok
                    complete[0] += whole

        threads = [threading.Thread(target=caller, args=(k,), name=f"caller-{k}")
                   for k in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"variant": name, "p50": _pct(page_times, 0.5), "p99": _pct(page_times, 0.99),
            "rendered": rendered[0] / len(page_times),
            "complete": complete[0] / len(page_times), "cart_p99": _pct(cart_times, 0.99),
            "held": b.peak}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def single_flight(shared: bool) -> int:
    calls = [0]
    lock = threading.Lock()

    def stock(ctx: TaskContext, p: Any) -> int:
        with lock:
            calls[0] += 1
        time.sleep(0.1)
        return 42

    options: dict[str, Any] = {"share_key": lambda ctx, p: ("stock", ctx["sku"])} if shared else {}
    node = FunctionNode(stock, **options)
    barrier = threading.Barrier(CALLERS)
    with ThreadPoolExecutor(POOL_THREADS) as pool:

        def caller(k: int) -> None:
            barrier.wait()
            TaskScheduling.start(node, executor=pool, timeout=1.0, context=TaskContext(sku="s"))

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return calls[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                 epilog="Targets: resilient p99 <= the budget, >= 99 % "
                                 "of pages rendered, cart p99 within 1.2x of healthy's; single "
                                 "flight: 1 backend call.")
    ap.add_argument("--mode", choices=("slow", "fail", "both"), default="both",
                    help="how recommendations misbehaves: 10 %% of calls take 300 ms (slow), "
                    "20 %% raise (fail), or one table each (default: both)")
    ap.add_argument("--requests", type=int, default=15,
                    help="requests per caller (default: 15; 5 for a quick look)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds; each figure is the median over them (default: 3)")
    args = ap.parse_args(argv)
    modes = ("slow", "fail") if args.mode == "both" else (args.mode,)
    print(f"{CALLERS} callers ({CART_CALLERS} on the cart page), {POOL_THREADS}-thread pool, "
          f"budget {BUDGET * 1000:.0f} ms, {args.requests} requests per caller, median of "
          f"{args.rounds} rounds")
    def measure(name: str, bad: str | None) -> dict[str, Any]:
        runs = [run_variant(name, bad, args.requests) for _ in range(args.rounds)]
        out = {k: statistics.median(r[k] for r in runs) for k in ("p50", "p99", "rendered",
                                                                  "complete", "cart_p99")}
        return {**out, "variant": name, "held": max(r["held"] for r in runs)}

    run_variant("healthy", None, 3)  # warm-up: threads, plans, imports
    healthy = measure("healthy", None)
    for mode in modes:
        print(f"\nrecommendations degraded: {'10 % of calls take 300 ms' if mode == 'slow' else '20 % of calls fail'}")
        print(f"{'variant':14} {'page p50':>9} {'page p99':>9} {'rendered':>9} {'complete':>9} "
              f"{'cart p99':>9} {'cart/healthy':>13} {'bad-backend threads':>20}")
        rows: list[dict[str, Any]] = [healthy]
        rows += [measure(v, mode) for v in ("futures", "taskflow", "resilient", "resilient-p95")]
        for row in rows:
            ratio = row["cart_p99"] / healthy["cart_p99"]
            print(f"{row['variant']:14} {row['p50'] * 1000:7.1f}ms {row['p99'] * 1000:7.1f}ms "
                  f"{row['rendered'] * 100:8.1f}% {row['complete'] * 100:8.1f}% "
                  f"{row['cart_p99'] * 1000:7.1f}ms "
                  f"{ratio:12.2f}x {row['held']:>20}")
    one = single_flight(True)
    many = single_flight(False)
    print(f"\nsingle flight: {CALLERS} concurrent requests for one key -> {one} backend call(s) "
          f"with share_key, {many} without")


if __name__ == "__main__":
    main()
