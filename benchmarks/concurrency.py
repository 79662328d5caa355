"""The request path: many caller threads starting one shared graph on one shared pool.

This is how taskflow is used inside Flask/Django handlers: the graph is defined once at import
time and every request thread starts it, all on one process-wide ``ThreadPoolExecutor``. Each
measurement starts ``callers`` threads (16, 32, 64) behind a barrier; each thread runs flows back
to back until the measurement's flows are done. The same workload runs through taskflow
(``TaskScheduling.start`` with a budget, as a handler would) and through the hand-written
``graphlib`` + ``add_done_callback`` runner of ``benchmarks/overhead.py`` (imported, not copied),
in the same process on the same pool, alternating which goes first in each round.

Graphs (both defined once and shared by every caller):

* ``product-detail``: 9 nodes after ``examples/product_detail.py`` (its seven calls plus
  ``user`` and ``shipping``); each backend node sleeps 1-20 ms (seeded random per node, the same
  for both runners), ``aggregate`` does no I/O.
* ``no-op 20``: 20 no-op nodes in 4 layers of 5 (each with 1-2 fathers in the layer above).

Per measurement: flows/s (flows over wall time), p50, p99 and mean latency of one flow as seen by
its caller, process CPU time per flow (``time.process_time``, all threads) and gc collections per
1,000 flows (``gc.get_stats()`` deltas, all generations). Each figure is reported as the
taskflow/hand-written ratio of the same round, then the median over rounds (flows/s above 1 and
latencies below 1 favour taskflow).

Physical bounds (:func:`bounds`), printed beside the figures so a reader sees how close each
runner is to what is possible, not only to the other. With per-node service times ``s`` (the
sleeps), ``W`` pool threads and ``N`` callers in a closed loop (each caller starts its next flow
as soon as the last returns):

* pool capacity: a flow occupies the pool for ``S = sum(s)`` thread-seconds, so at most
  ``W / S`` flows/s (no runner may run nodes outside the pool: ``start``'s caller never runs user
  code, it must return at its deadline whatever a task does);
* critical path: no flow takes less than ``C`` (the longest path of ``s``), so ``N`` callers do at
  most ``N / C`` flows/s;
* mean-latency floor (Little's law, ``N = flows/s x mean latency``): ``max(C, N * S / W)``. A p99
  below it is only possible if the slowest 1 % of flows wait far longer (reported as the mean
  those flows would need). It holds in steady state: the ends of a measurement (callers start
  together and finish apart) let a short one (``--quick``) dip a few per cent below it.

Each runner's *efficiency* is its flows/s over the bound. The no-op graph has no such bound
(``S = C = 0``): it is limited by CPU time under the GIL, hence the CPU-per-flow column.

    python benchmarks/concurrency.py               # 5 rounds (a few minutes)
    python benchmarks/concurrency.py --quick       # a short smoke run (3 rounds, fewer flows)
    python benchmarks/concurrency.py --graphs no-op --callers 16 --rounds 9   # one part, longer
    python benchmarks/concurrency.py --json        # the same figures as JSON on stdout
    python benchmarks/concurrency.py --graphs no-op --callers 16 --open-loop 3000   # see below
    python benchmarks/concurrency.py --gc-objects  # what 200 runs leave for the cycle collector

``--open-loop RATE``: the targets are set on the closed loop above, where every caller starts
its next flow at once, so both runners saturate the GIL and the p99 is decided by how unfairly
the GIL is handed over. A server sees requests arrive at some rate whatever it does: with
``--open-loop``, flows arrive at ``RATE`` per second (the ``n``-th at ``n / RATE`` s, handled by
caller ``n % callers``) and each latency counts from the arrival, so a runner that cannot keep up
falls behind and its latency grows (no coordinated omission). Not a target; it shows the
headroom each runner leaves at a given load.

``--gc-objects``: with ``gc`` disabled, run a 4-node diamond 200 times through each runner and
count the objects the next ``gc.collect()`` finds unreachable, i.e. what finished runs leave
for the cycle collector instead of being freed by reference counting.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from graphlib import TopologicalSorter
from typing import Any

from overhead import Graph, build, handwritten, layers  # the hand-written runner, by import

from taskflow import FunctionNode, SchedulingNode, TaskScheduling

CALLERS = (16, 32, 64)
WORKERS = 64  # the shared pool, fixed across caller counts (as in benchmarks/web_latency.py)
BUDGET = 2.0  # taskflow's per-request budget; generous: a timed-out flow is counted as failed

# the product-detail page: node -> fathers
PRODUCT_DETAIL: Graph = {
    "product_info": [],
    "category": [],
    "user": [],
    "price": ["product_info", "user"],
    "stock": ["product_info"],
    "shipping": ["stock", "user"],
    "reviews": ["category"],
    "recommendations": ["category", "user"],
    "aggregate": ["price", "stock", "shipping", "reviews", "recommendations"],
}


def backend_sleeps(graph: Graph, seed: int = 9) -> dict[str, float]:
    """Seconds each node sleeps: 1-20 ms per backend node, seeded; ``aggregate`` none."""
    rnd = random.Random(seed)
    return {name: 0.0 if name == "aggregate" else rnd.uniform(0.001, 0.020) for name in graph}


# -- what is physically possible ----------------------------------------------------------------

FLOWS_TARGET = 1.1  # the target: flows/s >= 1.1x the hand-written runner
P99_TARGET = 0.8  # and p99 <= 0.8x
TAIL = 0.01  # the share of flows above the p99


def critical_path(graph: Graph, service: Mapping[str, float]) -> float:
    """The longest path through ``graph`` with node ``n`` taking ``service[n]`` seconds."""
    finish: dict[str, float] = {}
    for name in TopologicalSorter(graph).static_order():
        finish[name] = service[name] + max((finish[f] for f in graph[name]), default=0.0)
    return max(finish.values(), default=0.0)


def bounds(graph: Graph, service: Mapping[str, float], workers: int,
           callers: int) -> dict[str, Any]:
    """What no runner can beat: ``callers`` threads starting flows back to back on a pool of
    ``workers`` threads, node ``n`` occupying a pool thread for ``service[n]`` seconds.

    ``max_flows_per_s`` is the lower of the pool's capacity (``workers / work``) and the
    critical-path limit (``callers / critical_path``); ``mean_latency_floor_ms`` follows from
    Little's law (``callers / max_flows_per_s``, i.e. ``max(critical_path, callers * work /
    workers)``). Without service times (no-op nodes) there is no such bound: every limit is None.
    """
    work = sum(service[n] for n in graph)
    crit = critical_path(graph, service)
    pool = workers / work if work > 0 else None
    path = callers / crit if crit > 0 else None
    limits = [(x, why) for x, why in ((pool, "pool"), (path, "critical path")) if x is not None]
    best, why = min(limits) if limits else (None, None)
    return {
        "work_ms": work * 1e3,
        "critical_path_ms": crit * 1e3,
        "max_flows_per_s_pool": pool,
        "max_flows_per_s_critical_path": path,
        "max_flows_per_s": best,
        "limited_by": why,
        "mean_latency_floor_ms": callers / best * 1e3 if best else None,
    }


def reachable(b: Mapping[str, Any], hand_flows_per_s: float,
              hand_p99_ms: float) -> dict[str, Any]:
    """Whether the targets against a hand-written runner measured at ``hand_flows_per_s``
    and ``hand_p99_ms`` can be met at all, given the bounds ``b`` (None: no physical bound).

    flows/s: ``1.1 x hand_flows_per_s`` must not exceed ``max_flows_per_s``. p99: ``0.8 x
    hand_p99_ms`` must not be below the critical path (every flow takes at least that); below
    the mean-latency floor it is possible only by making the slowest 1 % of flows wait long
    enough to bring the mean back up: ``tail_mean_ms`` is the mean those flows would need.
    """
    best, floor, crit = b["max_flows_per_s"], b["mean_latency_floor_ms"], b["critical_path_ms"]
    if best is None:
        return {"flows_per_s": None, "p99": None, "p99_target_ms": None, "tail_mean_ms": None}
    target = P99_TARGET * hand_p99_ms
    tail = None
    if target < crit:
        p99: bool | None = False
    elif target < floor:
        p99 = False
        tail = (floor - (1 - TAIL) * target) / TAIL
    else:
        p99 = True
    return {"flows_per_s": FLOWS_TARGET * hand_flows_per_s <= best, "p99": p99,
            "p99_target_ms": target, "tail_mean_ms": tail}


def sleep_overshoot(service: Mapping[str, float], repeat: int = 5) -> float:
    """Seconds ``time.sleep(s)`` overruns ``s`` on this machine (median over the graph's sleeps)."""
    over = []
    for s in service.values():
        if s > 0:
            for _ in range(repeat):
                t = time.perf_counter()
                time.sleep(s)
                over.append(time.perf_counter() - t - s)
    return statistics.median(over) if over else 0.0


def sleep_task(ctx: Any, seconds: float) -> None:
    if seconds:
        time.sleep(seconds)


class Workload:
    """One shared graph, ready for both runners."""

    def __init__(self, label: str, graph: Graph, sleeps: dict[str, float] | None) -> None:
        self.label = label
        self.graph = graph
        self.sleeps = sleeps
        self.service: dict[str, float] = dict(sleeps) if sleeps else dict.fromkeys(graph, 0.0)
        if sleeps is None:
            self.tops = build(graph)
            self.work: dict[str, Callable[[], Any]] | None = None
        else:
            nodes = {name: FunctionNode(sleep_task, sleeps[name], name=name) for name in graph}
            for name, fathers in graph.items():
                for f in fathers:
                    nodes[f] >> nodes[name]
            self.tops = [nodes[n] for n, fathers in graph.items() if not fathers]
            self.work = {name: partial(time.sleep, s) if s else _nothing
                         for name, s in sleeps.items()}

    def runner(self, which: str, pool: Executor, budget: float | None) -> Callable[[], bool]:
        """A zero-argument function running one flow; True when it succeeded."""
        if which == "taskflow":
            tops: list[SchedulingNode[Any, Any]] = self.tops

            def run_tf() -> bool:
                return TaskScheduling.start(tops, executor=pool, timeout=budget).ok

            return run_tf
        graph, work = self.graph, self.work

        def run_hw() -> bool:
            handwritten(graph, pool, work)
            return True

        return run_hw


def _nothing() -> None:
    return None


def measure(run: Callable[[], bool], callers: int, flows: int,
            rate: float | None = None) -> dict[str, Any]:
    """Run ``flows`` flows from ``callers`` threads at once; throughput, latencies, gc.

    Closed loop (``rate`` None): each caller starts its next flow as soon as the last returns.
    Open loop: flows arrive at ``rate`` per second, the ``n``-th at ``n / rate`` seconds,
    handled by caller ``n % callers``; a flow's latency runs from its arrival, so a caller still
    busy with an earlier flow counts the wait (no coordinated omission).
    """
    per_caller = [flows // callers + (1 if k < flows % callers else 0) for k in range(callers)]
    latencies: list[list[float]] = [[] for _ in range(callers)]
    failures = [0] * callers
    barrier = threading.Barrier(callers + 1)
    begin = [0.0]  # open loop: the first arrival (set before the barrier opens)

    def caller(k: int) -> None:
        mine = latencies[k]
        barrier.wait()
        clock = time.perf_counter
        for i in range(per_caller[k]):
            if rate is None:
                t0 = clock()
            else:
                t0 = begin[0] + (i * callers + k) / rate
                early = t0 - clock()
                if early > 0:
                    time.sleep(early)
            ok = run()
            mine.append(clock() - t0)
            if not ok:
                failures[k] += 1

    threads = [threading.Thread(target=caller, args=(k,), name=f"bench-caller-{k}")
               for k in range(callers)]
    for t in threads:
        t.start()
    gc.collect()
    before = gc.get_stats()
    begin[0] = time.perf_counter() + 0.005  # open loop: arrivals start once every caller waits
    barrier.wait()
    t0 = time.perf_counter() if rate is None else begin[0]
    cpu0 = time.process_time()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    after = gc.get_stats()
    samples = sorted(x for lat in latencies for x in lat)
    collections = [a["collections"] - b["collections"] for a, b in zip(after, before, strict=True)]
    return {
        "flows": len(samples),
        "failed": sum(failures),
        "flows_per_s": len(samples) / wall,
        "p50_ms": _pct(samples, 0.50) * 1e3,
        "p99_ms": _pct(samples, 0.99) * 1e3,
        "mean_ms": statistics.fmean(samples) * 1e3,
        "cpu_ms_per_flow": cpu * 1e3 / len(samples),
        "gc_per_1000": [c * 1000 / len(samples) for c in collections],
    }


def _pct(sorted_samples: Sequence[float], q: float) -> float:
    n = len(sorted_samples)
    return sorted_samples[min(n - 1, max(0, int(q * n + 0.999999) - 1))]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


GRAPHS = ("product-detail", "no-op")


def benchmark(rounds: int, flows_per_caller: dict[str, int], workers: int,
              budget: float | None, callers_list: Sequence[int],
              progress: Callable[[str], None],
              graphs: Sequence[str] = GRAPHS,
              open_loop: float | None = None) -> list[dict[str, Any]]:
    workloads = []
    if "product-detail" in graphs:
        workloads.append(
            Workload("product-detail 9", PRODUCT_DETAIL, backend_sleeps(PRODUCT_DETAIL)))
    if "no-op" in graphs:
        workloads.append(
            Workload("no-op 20", layers(depth=4, width=5, max_fathers=2, seed=20), None))
    rows = []
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-pool") as pool:
        for w in workloads:
            runners = {which: w.runner(which, pool, budget) for which in ("taskflow", "hand")}
            over = sleep_overshoot(w.service)
            slept = {n: s + over if s else 0.0 for n, s in w.service.items()}
            for callers in callers_list:
                flows = callers * flows_per_caller[w.label]
                for run in runners.values():  # warm-up: pool threads, compiled plan, allocator
                    measure(run, callers, max(callers, flows // 4))
                rate = open_loop
                per_round: list[dict[str, dict[str, Any]]] = []
                for r in range(rounds):
                    order = ("taskflow", "hand") if r % 2 == 0 else ("hand", "taskflow")
                    figures = {which: measure(runners[which], callers, flows, rate)
                               for which in order}
                    per_round.append(figures)
                    progress(f"{w.label} callers={callers} round {r + 1}/{rounds}: "
                             f"taskflow {figures['taskflow']['flows_per_s']:.0f} flows/s "
                             f"p99 {figures['taskflow']['p99_ms']:.1f} ms, hand-written "
                             f"{figures['hand']['flows_per_s']:.0f} flows/s "
                             f"p99 {figures['hand']['p99_ms']:.1f} ms")
                row = _summarise(w.label, callers, flows, per_round)
                row["open_loop_flows_per_s"] = rate
                row["bounds"] = bounds(w.graph, w.service, workers, callers)
                row["bounds_with_overshoot"] = bounds(w.graph, slept, workers, callers)
                row["bounds_with_overshoot"]["sleep_overshoot_ms"] = over * 1e3
                _against_bounds(row)
                rows.append(row)
    return rows


def _against_bounds(row: dict[str, Any]) -> None:
    """Add each runner's efficiency against the row's bounds and whether the targets are
    reachable at all."""
    b = row["bounds"]
    best, floor = b["max_flows_per_s"], b["mean_latency_floor_ms"]
    for which in ("taskflow", "hand"):
        r = row[which]
        r["efficiency"] = r["flows_per_s"] / best if best else None
        r["mean_vs_floor"] = r["mean_ms"] / floor if floor else None
    row["targets_reachable"] = reachable(b, row["hand"]["flows_per_s"], row["hand"]["p99_ms"])


def _summarise(label: str, callers: int, flows: int,
               per_round: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def med(which: str, key: str) -> float:
        return statistics.median(f[which][key] for f in per_round)

    def gc_total(f: dict[str, Any]) -> float:
        return float(sum(f["gc_per_1000"]))

    ratios = {
        "flows_per_s": _median([_ratio(f["taskflow"]["flows_per_s"], f["hand"]["flows_per_s"])
                                for f in per_round]),
        "p50": _median([_ratio(f["taskflow"]["p50_ms"], f["hand"]["p50_ms"]) for f in per_round]),
        "p99": _median([_ratio(f["taskflow"]["p99_ms"], f["hand"]["p99_ms"]) for f in per_round]),
        "gc_per_1000": _median([_ratio(gc_total(f["taskflow"]), gc_total(f["hand"]))
                                for f in per_round]),
    }
    p99s = [r for r in (_ratio(f["taskflow"]["p99_ms"], f["hand"]["p99_ms"]) for f in per_round)
            if r is not None]
    out: dict[str, Any] = {"graph": label, "callers": callers, "flows_per_round": flows,
                           "ratio": ratios,
                           # the p99 of one round is noisy: the spread of its ratio over rounds
                           "p99_ratio_range": [min(p99s), max(p99s)] if p99s else None}
    for which in ("taskflow", "hand"):
        out[which] = {
            "flows_per_s": med(which, "flows_per_s"),
            "p50_ms": med(which, "p50_ms"),
            "p99_ms": med(which, "p99_ms"),
            "mean_ms": med(which, "mean_ms"),
            "cpu_ms_per_flow": med(which, "cpu_ms_per_flow"),
            "gc_per_1000": [statistics.median(f[which]["gc_per_1000"][g] for f in per_round)
                            for g in range(3)],
            "failed": sum(f[which]["failed"] for f in per_round),
        }
    out["meets_targets"] = (ratios["flows_per_s"] is not None and ratios["flows_per_s"] >= 1.1
                            and ratios["p99"] is not None and ratios["p99"] <= 0.8)
    return out


# -- what finished runs leave for the cycle collector ------------------------------------------

DIAMOND: Graph = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def gc_objects(runs: int = 200, workers: int = 4) -> dict[str, int]:
    """Objects found unreachable by ``gc.collect()`` after ``runs`` finished runs, gc disabled."""
    tops = build(DIAMOND)
    out = {}
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-gc") as pool:
        runners: dict[str, Callable[[], Any]] = {
            "taskflow": lambda: TaskScheduling.start(tops, executor=pool, timeout=BUDGET),
            "hand": lambda: handwritten(DIAMOND, pool),
        }
        for which, run in runners.items():
            for _ in range(20):  # warm-up: pool threads, compiled plan, timer thread
                run()
            was_enabled = gc.isenabled()
            gc.collect()
            gc.disable()
            try:
                for _ in range(runs):
                    run()
                time.sleep(0.05)  # let the pool finish its done-callbacks of the last run
                out[which] = gc.collect()
            finally:
                if was_enabled:
                    gc.enable()
    return out


# -- output -------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def print_table(rows: list[dict[str, Any]], header: str) -> None:
    print(header)
    print("| graph | callers | flows/s | p50 | p99 (range over rounds) | gc/1k flows "
          "| taskflow flows/s, p99 | hand-written flows/s, p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        r, tf, hw = row["ratio"], row["taskflow"], row["hand"]
        spread = row["p99_ratio_range"]
        p99 = _fmt(r["p99"]) + ("" if spread is None else f" ({spread[0]:.2f}-{spread[1]:.2f})")
        print(f"| {row['graph']} | {row['callers']} | {_fmt(r['flows_per_s'])} | "
              f"{_fmt(r['p50'])} | {p99} | {_fmt(r['gc_per_1000'])} | "
              f"{tf['flows_per_s']:.0f}, {tf['p99_ms']:.1f} ms | "
              f"{hw['flows_per_s']:.0f}, {hw['p99_ms']:.1f} ms |")
    failed = sum(row["taskflow"]["failed"] + row["hand"]["failed"] for row in rows)
    met = sum(row["meets_targets"] for row in rows)
    print(f"targets (flows/s >= 1.1x and p99 <= 0.8x): met in {met} of {len(rows)} rows; "
          f"failed flows: {failed}")
    print()
    print_bounds(rows)


def _reach(ok: bool | None, note: str = "") -> str:
    return "n/a" if ok is None else "yes" if ok else f"no{note}"


def print_bounds(rows: list[dict[str, Any]]) -> None:
    """The physical bounds of each row and how close each runner gets (see ``bounds``)."""
    print("physical bounds (no-op graph: none, CPU-bound); efficiency = flows/s over the bound; "
          "mean/floor = mean latency over the mean-latency floor")
    print("| graph | callers | bound flows/s (limit) | mean-latency floor | taskflow: efficiency, "
          "mean/floor, CPU/flow | hand-written: efficiency, mean/floor, CPU/flow "
          "| flows/s >= 1.1x reachable | p99 <= 0.8x reachable |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        b, reach = row["bounds"], row["targets_reachable"]
        bound = ("none" if b["max_flows_per_s"] is None
                 else f"{b['max_flows_per_s']:.0f} ({b['limited_by']})")
        floor = _fmt(b["mean_latency_floor_ms"], ".1f", " ms")
        runners = []
        for which in ("taskflow", "hand"):
            r = row[which]
            runners.append(f"{_fmt(r['efficiency'], '.0%', '')}, {_fmt(r['mean_vs_floor'])}, "
                           f"{r['cpu_ms_per_flow']:.2f} ms")
        note = ""
        if reach["p99"] is False:
            tail = reach["tail_mean_ms"]
            note = (f" (target {reach['p99_target_ms']:.1f} ms < critical path)" if tail is None
                    else f" (target {reach['p99_target_ms']:.1f} ms < floor: the slowest 1 % "
                         f"would need a mean of {tail / 1e3:.2f} s)")
        print(f"| {row['graph']} | {row['callers']} | {bound} | {floor} | {runners[0]} | "
              f"{runners[1]} | {_reach(reach['flows_per_s'])} | {_reach(reach['p99'], note)} |")
    over = {row["graph"]: row["bounds_with_overshoot"] for row in rows
            if row["bounds"]["max_flows_per_s"] is not None}
    for graph, b in over.items():
        print(f"{graph}: work {b['work_ms']:.1f} ms per flow and critical path "
              f"{b['critical_path_ms']:.2f} ms with this machine's time.sleep overshoot "
              f"(+{b['sleep_overshoot_ms']:.2f} ms per call); nominal bounds above")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a short smoke run: 3 rounds, fewer flows (not for the README)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (at least 5)")
    ap.add_argument("--workers", type=int, default=WORKERS,
                    help="threads of the shared pool (default: %(default)s)")
    ap.add_argument("--callers", type=int, nargs="+", default=list(CALLERS),
                    help="caller thread counts (default: 16 32 64)")
    ap.add_argument("--budget", type=float, default=BUDGET,
                    help="taskflow's per-flow budget in seconds, 0 for none (default: %(default)s)")
    ap.add_argument("--graphs", nargs="+", choices=GRAPHS, default=list(GRAPHS),
                    help="the workloads to run (default: both)")
    ap.add_argument("--flows-per-caller", type=int, nargs=2, metavar=("PRODUCT", "NOOP"),
                    help="flows each caller runs per measurement, for each graph "
                         "(default: 25 60; --quick: 3 15)")
    ap.add_argument("--open-loop", type=float, metavar="RATE",
                    help="flows arrive at RATE per second (spread over the callers) instead of "
                         "each caller starting its next flow as soon as the last returns; "
                         "latency counts from the arrival (not what the targets are set on)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--gc-objects", action="store_true",
                    help="only count what 200 runs of a 4-node flow leave for the cycle collector")
    args = ap.parse_args(argv)

    if args.gc_objects:
        left = gc_objects()
        if args.json:
            print(json.dumps({"runs": 200, "graph": "diamond 4", "unreachable": left}))
        else:
            print("gc disabled, 200 finished runs of a 4-node diamond; objects the next "
                  "gc.collect() finds unreachable:")
            print(f"  taskflow {left['taskflow']:,}, hand-written {left['hand']:,}")
        return 0

    rounds = 3 if args.quick else max(5, args.rounds)
    product, noop = args.flows_per_caller or ((3, 15) if args.quick else (25, 60))
    if min(product, noop) < 1:
        ap.error("--flows-per-caller must be >= 1")
    flows_per_caller = {"product-detail 9": product, "no-op 20": noop}
    budget = args.budget or None
    header = (f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs (shared machine), "
              f"shared ThreadPoolExecutor({args.workers}), taskflow budget "
              f"{budget if budget else 'none'} s, {rounds} rounds alternating runner order; "
              f"ratios are taskflow/hand-written, median over rounds")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.open_loop is not None and not args.open_loop > 0:
        ap.error("--open-loop must be a positive rate (flows per second)")
    if args.open_loop is not None:
        header += (f"; OPEN LOOP: {args.open_loop:g} flows/s arrive, latency from arrival "
                   "(a runner that cannot keep up falls behind and its latency grows)")
    rows = benchmark(rounds, flows_per_caller, args.workers, budget, args.callers, progress,
                     args.graphs, args.open_loop)
    if args.json:
        print(json.dumps({"header": header, "rounds": rounds, "workers": args.workers,
                          "budget": budget, "rows": rows}, indent=2))
    else:
        print_table(rows, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
