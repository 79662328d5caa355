"""Where the time goes in ``benchmarks/concurrency.py``: the measurements behind
``docs/concepts/performance.md``, for both runners on the same shared pool.

    python benchmarks/concurrency_profile.py chain 16    # each flow's critical chain, decomposed
    python benchmarks/concurrency_profile.py counts 64   # submissions and worker loops per flow
    python benchmarks/concurrency_profile.py pool 32     # pool busy time per flow, utilisation

``chain`` (product-detail page): walks each flow back from ``aggregate`` through the father that
finished last and splits its latency into the wait for the first root to start, the gaps between
a father's end and its son's start (the son on the same thread or another), the sleeps'
overrun (``time.sleep`` returning late, mostly waiting for the GIL) and the hand-back to the
caller; averages over all flows, the slowest 5 % and the slowest 1 %. taskflow's stamps come
from each node's ``WorkResult``; the hand-written runner's work is wrapped to stamp the same.

``counts``: executor submissions per flow for both runners and graphs, and for taskflow the
worker loops that found nothing to do. ``pool``: the thread time the pool spends per flow (every
work item timed) and how busy it was, which separates per-flow overhead from idle threads.
Instrumentation (wrappers, patched methods) costs a little: compare runners, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import thread as _thread
from typing import Any

from concurrency import PRODUCT_DETAIL, Workload, backend_sleeps, layers, measure
from overhead import handwritten

from taskflow import TaskScheduling
from taskflow.engine import run as _run

WORKERS = 64
_mono = time.monotonic


def chain(callers: int, flows_per_caller: int = 100) -> None:
    graph, sleeps = PRODUCT_DETAIL, backend_sleeps(PRODUCT_DETAIL)
    w = Workload("product-detail 9", graph, sleeps)
    recs: list[tuple[float, float, dict[str, tuple[float, float, str]]]] = []
    lock = threading.Lock()
    for which in ("taskflow", "hand"):
        recs.clear()
        with ThreadPoolExecutor(WORKERS) as pool:
            def run_tf(pool: ThreadPoolExecutor = pool) -> bool:
                m0 = _mono()
                r = TaskScheduling.start(w.tops, executor=pool, timeout=2.0)
                m1 = _mono()
                stamps = {}
                for n in r:
                    wr = r[n].work_result
                    stamps[n] = (wr.started_at, wr.finished_at, wr.thread)
                with lock:
                    recs.append((m0, m1, stamps))
                return True

            def run_hw(pool: ThreadPoolExecutor = pool) -> bool:
                stamps: dict[str, tuple[float, float, str]] = {}

                def stamped(n: str, s: float) -> Callable[[], None]:
                    def work() -> None:
                        a = _mono()
                        if s:
                            time.sleep(s)
                        stamps[n] = (a, _mono(), threading.current_thread().name)
                    return work

                m0 = _mono()
                handwritten(graph, pool, {n: stamped(n, s) for n, s in sleeps.items()})
                m1 = _mono()
                with lock:
                    recs.append((m0, m1, stamps))
                return True

            run = run_tf if which == "taskflow" else run_hw
            measure(run, callers, callers * 10)
            recs.clear()
            measure(run, callers, callers * flows_per_caller)
        rows = []
        for m0, m1, t in recs:
            parts: Counter[str] = Counter()
            n = "aggregate"
            parts["return"] = m1 - t[n][1]
            while True:
                s, f, th = t[n]
                parts["overrun"] += (f - s) - sleeps[n]
                if not graph[n]:
                    parts["root start"] += s - m0
                    break
                last = max(graph[n], key=lambda x: t[x][1])
                parts["same thread" if t[last][2] == th else "other thread"] += s - t[last][1]
                n = last
            rows.append((m1 - m0, parts))
        rows.sort(key=lambda r: r[0])
        total = len(rows)
        print(f"{which}, {callers} callers, {total} flows: p50 {rows[total // 2][0] * 1e3:.2f} ms, "
              f"p99 {rows[int(0.99 * total)][0] * 1e3:.2f} ms (means in ms)")
        for label, lo in (("all", 0), ("slowest 5 %", int(0.95 * total)),
                          ("slowest 1 %", int(0.99 * total))):
            sel = rows[lo:]
            keys = ("root start", "same thread", "other thread", "overrun", "return")
            print(f"  {label:12} latency {statistics.fmean(r[0] for r in sel) * 1e3:6.2f} | "
                  + " | ".join(f"{k} {statistics.fmean(p[k] for _, p in sel) * 1e3:5.2f}"
                               for k in keys))


def counts(callers: int) -> None:
    tally: Counter[str] = Counter()
    body = _run.Run.loop_body

    def loop_body(self: Any, token: int) -> None:
        tally["loops"] += 1
        with self.lock:
            self.starting -= 1
            i = self.next_node(token)
        if i < 0:
            tally["empty loops"] += 1
            return
        self.run_nodes(i, token)

    workloads = [Workload("product-detail 9", PRODUCT_DETAIL, backend_sleeps(PRODUCT_DETAIL)),
                 Workload("no-op 20", layers(depth=4, width=5, max_fathers=2, seed=20), None)]
    _run.Run.loop_body = loop_body  # type: ignore[method-assign]
    try:
        for w in workloads:
            for which in ("taskflow", "hand"):
                with ThreadPoolExecutor(WORKERS) as pool:
                    submit = pool.submit

                    def counted(*args: Any, submit: Any = submit, **kwargs: Any) -> Any:
                        tally["submissions"] += 1
                        return submit(*args, **kwargs)

                    pool.submit = counted  # type: ignore[method-assign]
                    run = w.runner(which, pool, 2.0)
                    measure(run, callers, callers * 10)
                    tally.clear()
                    m = measure(run, callers, callers * 40)
                per_flow = {k: round(v / m["flows"], 2) for k, v in sorted(tally.items())}
                print(f"{w.label}, {callers} callers, {which}: {per_flow} per flow")
    finally:
        _run.Run.loop_body = body  # type: ignore[method-assign]


def pool_time(callers: int, rounds: int = 4) -> None:
    w = Workload("product-detail 9", PRODUCT_DETAIL, backend_sleeps(PRODUCT_DETAIL))
    work = sum(w.service.values())
    busy = [0.0]
    original = _thread._WorkItem.run

    def timed(self: Any) -> None:
        t = time.perf_counter()
        original(self)
        busy[0] += time.perf_counter() - t

    _thread._WorkItem.run = timed  # type: ignore[method-assign]
    try:
        res: dict[str, list[tuple[float, float, float]]] = {"taskflow": [], "hand": []}
        with ThreadPoolExecutor(WORKERS) as pool:
            runs = {which: w.runner(which, pool, 2.0) for which in res}
            for r in runs.values():
                measure(r, callers, callers * 5)
            for k in range(rounds):
                for which in (("taskflow", "hand") if k % 2 == 0 else ("hand", "taskflow")):
                    busy[0] = 0.0
                    t0 = time.perf_counter()
                    m = measure(runs[which], callers, callers * 25)
                    wall = time.perf_counter() - t0
                    res[which].append((m["flows_per_s"], busy[0] / m["flows"],
                                       busy[0] / (WORKERS * wall)))
    finally:
        _thread._WorkItem.run = original  # type: ignore[method-assign]
    for which, v in res.items():
        fps, per_flow, util = (statistics.median(c) for c in zip(*v, strict=True))
        print(f"product-detail 9, {callers} callers, {which}: {fps:.0f} flows/s, pool busy "
              f"{per_flow * 1e3:.2f} ms per flow ({(per_flow - work) * 1e3:.2f} beyond the "
              f"sleeps), utilisation {util:.1%} (medians of {rounds} rounds)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("what", choices=("chain", "counts", "pool"))
    ap.add_argument("callers", type=int, nargs="?", default=32)
    args = ap.parse_args(argv)
    {"chain": chain, "counts": counts, "pool": pool_time}[args.what](args.callers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
