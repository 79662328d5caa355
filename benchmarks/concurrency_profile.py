"""Where the time goes in ``benchmarks/concurrency.py``: the measurements behind
``docs/concepts/performance.md``, for both runners on the same shared pool.

    python benchmarks/concurrency_profile.py chain 16    # each flow's critical chain, decomposed
    python benchmarks/concurrency_profile.py counts 64   # submissions and worker loops per flow
    python benchmarks/concurrency_profile.py pool 32     # pool busy time per flow, utilisation
    python benchmarks/concurrency_profile.py tail 16     # no-op graph: what the slowest 1 % wait for

``chain`` (product-detail page): walks each flow back from ``aggregate`` through the father that
finished last and splits its latency into the wait for the first root to start, the gaps between
a father's end and its son's start (the son on the same thread or another), the sleeps'
overrun (``time.sleep`` returning late, mostly waiting for the GIL) and the hand-back to the
caller; averages over all flows, the slowest 5 % and the slowest 1 %. taskflow's stamps come
from each node's ``WorkResult``; the hand-written runner's work is wrapped to stamp the same.

``counts``: executor submissions per flow for both runners and graphs, and for taskflow the
worker loops that found nothing to do. ``pool``: the thread time the pool spends per flow (every
work item timed) and how busy it was, which separates per-flow overhead from idle threads.
``tail`` (the 20-node no-op graph): per flow, the caller's start, each worker loop's
submission and start (and how many tasks were waiting in the pool's queue when it was
submitted), each node's start and end and thread, the run's finish (the result handed to the
caller's inbox) and the caller's return; the watchdog's firings, and the gc pauses
(``gc.callbacks``) that overlap the flow. It splits each flow's latency into: caller to first
loop submitted (``begin``), the first loop's wait in the pool's queue (``queue``), loop start to
first node (``pickup``), first node start to last node end (``nodes``; of it, time between
nodes not spent in any node, ``gaps``), last node end to ``finish`` (``settle``), and finish to the
caller's return (``wake``); for the hand-written runner, ``begin`` is the caller to its first
node's start, and ``wake`` the last node's end to the caller's return. Averages over all flows,
the slowest 5 % and 1 %. Beside them, a probe thread that sleeps 0.5 ms over and over measures
how late any thread of the process wakes up during each runner's rounds (GIL and CPU waits).
Instrumentation (wrappers, patched methods) costs a little: compare runners, not runs.
"""

from __future__ import annotations

import argparse
import gc
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
from taskflow.engine import closing as _closing
from taskflow.engine import economy as _economy
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
            i = self.economy.first_node(token)
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


def tail(callers: int, flows_per_caller: int = 60, rounds: int = 3) -> None:
    w = Workload("no-op 20", layers(depth=4, width=5, max_fathers=2, seed=20), None)
    graph = w.graph
    lock = threading.Lock()
    pauses: list[tuple[float, float, int]] = []
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = _mono()
        else:
            pauses.append((gc_start[0], _mono(), info["generation"]))

    # per run (flow id): loop submissions (t, queue size), loop starts, watchdog firings, finish
    subs: dict[str, list[tuple[float, int]]] = {}
    starts: dict[str, list[float]] = {}
    watch: Counter[str] = Counter()
    fin: dict[str, float] = {}
    finish, watchdog = _closing.finish, _economy.Economy.watchdog

    def finish_stamped(self: Any) -> None:
        fin.setdefault(self.flow_id, _mono())
        finish(self)

    def watchdog_counted(self: Any, progress: int, grow: int = 1) -> None:
        watch[self.start.args[0]().flow_id] += 1  # start: partial(_start_loops, run's weakref)
        watchdog(self, progress, grow)

    def summary(which: str, rows: list[tuple[float, dict[str, float]]]) -> None:
        rows.sort(key=lambda r: r[0])
        total = len(rows)
        keys = ("begin", "queue", "pickup", "nodes", "gaps", "settle", "wake", "gc",
                "loops", "queued", "watchdog", "threads")
        print(f"{which}, {callers} callers, {total} flows: p50 {rows[total // 2][0] * 1e3:.2f} ms,"
              f" p99 {rows[int(0.99 * total)][0] * 1e3:.2f} ms (times: means in ms)")
        for label, lo in (("all", 0), ("slowest 5 %", int(0.95 * total)),
                          ("slowest 1 %", int(0.99 * total))):
            sel = rows[lo:]
            print(f"  {label:12} latency {statistics.fmean(r[0] for r in sel) * 1e3:6.2f} | "
                  + " | ".join(f"{k} {statistics.fmean(p.get(k, 0.0) for _, p in sel) * (1 if k in ('loops', 'queued', 'watchdog', 'threads') else 1e3):.2f}"
                               for k in keys if any(k in p for _, p in sel)))

    def gc_in(a: float, b: float) -> float:
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y, _ in pauses if y > a and x < b)

    def spans(m0: float, m1: float, stamps: dict[str, tuple[float, float, str]]) -> dict[str, float]:
        first = min(v[0] for v in stamps.values())
        last = max(v[1] for v in stamps.values())
        busy, end = 0.0, first
        for a, b, _ in sorted(stamps.values()):
            if b > end:
                busy += b - max(a, end)
                end = b
        return {"nodes": last - first, "gaps": (last - first) - busy,
                "threads": len({v[2] for v in stamps.values()}), "gc": gc_in(m0, m1),
                "_first": first, "_last": last}

    gc.callbacks.append(on_gc)
    _closing.finish = finish_stamped
    _economy.Economy.watchdog = watchdog_counted  # type: ignore[method-assign]
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            submit = pool.submit
            queue = pool._work_queue

            def stamped_submit(fn: Any, *args: Any, **kwargs: Any) -> Any:
                owner = args[0] if args else None
                fid = getattr(owner, "flow_id", None)
                if fid is None or not isinstance(owner, _run.Run):
                    return submit(fn, *args, **kwargs)
                rec = subs.setdefault(fid, [])
                rec.append((_mono(), queue.qsize()))

                def started(*a: Any, **k: Any) -> Any:
                    starts.setdefault(fid, []).append(_mono())
                    return fn(*a, **k)

                return submit(started, *args, **kwargs)

            pool.submit = stamped_submit  # type: ignore[method-assign]
            lateness: dict[str, list[float]] = {"taskflow": [], "hand-written": []}
            probing: list[str | None] = [None]
            stop = threading.Event()

            def probe() -> None:
                while not stop.is_set():
                    a = _mono()
                    time.sleep(0.0005)
                    who = probing[0]
                    if who is not None:
                        lateness[who].append(_mono() - a - 0.0005)
            rec_tf: list[tuple[float, dict[str, float]]] = []
            rec_hw: list[tuple[float, dict[str, float]]] = []

            def run_tf() -> bool:
                m0 = _mono()
                r = TaskScheduling.start(w.tops, executor=pool, timeout=2.0)
                m1 = _mono()
                st = {n: (r[n].work_result.started_at, r[n].work_result.finished_at,
                          r[n].work_result.thread) for n in r}
                with lock:
                    rec_tf.append((m0, m1, r.flow_id, st))  # type: ignore[arg-type]
                return r.ok

            def run_hw() -> bool:
                stamps: dict[str, tuple[float, float, str]] = {}

                def stamped(n: str) -> Callable[[], None]:
                    def work() -> None:
                        a = _mono()
                        stamps[n] = (a, _mono(), threading.current_thread().name)
                    return work

                work = {n: stamped(n) for n in graph}
                m0 = _mono()
                handwritten(graph, pool, work)
                m1 = _mono()
                with lock:
                    rec_hw.append((m0, m1, "", stamps))  # type: ignore[arg-type]
                return True

            for run in (run_tf, run_hw):
                measure(run, callers, callers * 10)
            rec_tf.clear()
            rec_hw.clear()
            subs.clear()
            starts.clear()
            watch.clear()
            fin.clear()
            pauses.clear()
            prober = threading.Thread(target=probe, name="gil-probe", daemon=True)
            prober.start()
            for k in range(rounds):
                for run in ((run_tf, run_hw) if k % 2 == 0 else (run_hw, run_tf)):
                    probing[0] = "taskflow" if run is run_tf else "hand-written"
                    measure(run, callers, callers * flows_per_caller)
                    probing[0] = None
            stop.set()
            prober.join()
    finally:
        gc.callbacks.remove(on_gc)
        _closing.finish = finish
        _economy.Economy.watchdog = watchdog  # type: ignore[method-assign]
    rows: list[tuple[float, dict[str, float]]] = []
    for m0, m1, fid, st in rec_tf:  # type: ignore[misc]
        p = spans(m0, m1, st)
        sub, sta = subs.get(fid, []), starts.get(fid, [])
        if sub and sta:
            p["begin"] = sub[0][0] - m0
            p["queue"] = sta[0] - sub[0][0]
            p["pickup"] = p["_first"] - sta[0]
            p["queued"] = sub[0][1]
        p["loops"] = len(sub)
        p["watchdog"] = watch.get(fid, 0)
        done = fin.get(fid, m1)
        p["settle"] = done - p["_last"]
        p["wake"] = m1 - done
        rows.append((m1 - m0, p))
    summary("taskflow", rows)
    rows = []
    for m0, m1, _, st in rec_hw:  # type: ignore[misc]
        p = spans(m0, m1, st)
        p["begin"] = p["_first"] - m0
        p["wake"] = m1 - p["_last"]
        rows.append((m1 - m0, p))
    summary("hand-written", rows)
    for who, late in lateness.items():
        late.sort()
        if late:
            print(f"probe (0.5 ms sleeps) during {who} rounds: {len(late)} wake-ups, late by "
                  f"p50 {late[len(late) // 2] * 1e3:.2f} ms, p99 {late[int(0.99 * len(late))] * 1e3:.2f}"
                  f" ms, max {late[-1] * 1e3:.2f} ms")
    gens = Counter(g for _, _, g in pauses)
    print(f"gc pauses during the measured rounds: {dict(gens)} (by generation), longest "
          f"{max((b - a for a, b, _ in pauses), default=0.0) * 1e3:.2f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("what", choices=("chain", "counts", "pool", "tail"))
    ap.add_argument("callers", type=int, nargs="?", default=32)
    args = ap.parse_args(argv)
    {"chain": chain, "counts": counts, "pool": pool_time, "tail": tail}[args.what](args.callers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
