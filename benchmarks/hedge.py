"""Hedging a backend that is slow in 10 % of its calls: fixed delay against ``after="p95"``.

    PYTHONPATH=. python benchmarks/hedge.py              # about 30 s
    PYTHONPATH=. python benchmarks/hedge.py --requests 20

16 callers share a 32-thread pool and start a flow (budget 200 ms) of ``--stages`` backend
calls in sequence, each taking 5-10 ms, or ``--slow-ms`` (300) in one call of ten. Variants, interleaved round by round, each with a fresh
node (so a percentile starts cold, as in a new process):

* ``none``: no hedge;
* ``fixed 50ms``: ``Hedge(after=0.05)``;
* ``p95 uncapped``: ``Hedge(after="p95", median_cap=None)``: the plain 95th percentile, which
  with 10 % of calls slow is itself a slow call;
* ``p95``: ``Hedge(after="p95")``, the default: the slowest duration until 20 are known, then
  the percentile, at most 3 x the median.

Per variant: runs over budget (a call that did not succeed within it), p99 of the run, and backend calls per run (the
load a hedge adds).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import FunctionNode, Hedge, ResultState, TaskScheduling

BUDGET = 0.2
CALLERS = 16
VARIANTS: dict[str, Hedge | None] = {
    "none": None,
    "fixed 50ms": Hedge(after=0.05),
    "p95 uncapped": Hedge(after="p95", median_cap=None),
    "p95": Hedge(after="p95"),
}


def one_round(name: str, hedge: Hedge | None, requests: int, seed: int,
              pool: ThreadPoolExecutor, slow: float, stages: int) -> dict[str, Any]:
    rng = random.Random(seed)
    lock = threading.Lock()
    calls = [0]

    def backend(ctx: Any, param: Any) -> str:
        with lock:
            calls[0] += 1
            seconds = slow if rng.random() < 0.10 else rng.uniform(0.005, 0.010)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not ctx.cancelled:  # a loser stops early
            time.sleep(0.002)
        return "ok"

    options: dict[str, Any] = {"hedge": hedge, "idempotent": True} if hedge else {}
    nodes = [FunctionNode(backend, name=f"call{k}-{name}-{seed}", **options)
             for k in range(stages)]
    for father, son in zip(nodes, nodes[1:], strict=False):
        father >> son
    node = nodes[-1]
    times: list[float] = []
    over = [0]

    def caller() -> None:
        for _ in range(requests):
            t0 = time.monotonic()
            result = TaskScheduling.start(node, executor=pool, timeout=BUDGET)
            with lock:
                times.append(time.monotonic() - t0)
                over[0] += any(result.result_of(n.name).state is not ResultState.SUCCESS
                               for n in nodes)

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times.sort()
    return {"over": over[0], "runs": len(times), "p99": times[int(0.99 * len(times))],
            "calls": calls[0] / len(times)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=25, help="requests per caller and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--slow-ms", type=float, default=300.0,
                    help="how long a slow call takes (default 300)")
    ap.add_argument("--stages", type=int, default=1,
                    help="backend calls in sequence per run (default 1)")
    args = ap.parse_args(argv)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with ThreadPoolExecutor(32, thread_name_prefix="bench-hedge") as pool:
        for r in range(args.rounds):
            for name, hedge in VARIANTS.items():
                rows[name].append(one_round(name, hedge, args.requests, r, pool,
                                            args.slow_ms / 1000, args.stages))
    runs = CALLERS * args.requests * args.rounds
    print(f"{CALLERS} callers, budget {BUDGET * 1000:.0f} ms, {args.stages} call(s) in sequence, "
          f"10 % of calls {args.slow_ms:.0f} ms, {runs} runs per variant")
    print(f"{'variant':14} {'over budget':>12} {'p99':>9} {'calls/run':>10}")
    for name, results in rows.items():
        over = sum(x["over"] for x in results)
        p99 = statistics.median(x["p99"] for x in results)
        calls = statistics.mean(x["calls"] for x in results)
        print(f"{name:14} {over:>5} of {runs:<5} {p99 * 1000:7.1f}ms {calls:10.2f}")


if __name__ == "__main__":
    main()
