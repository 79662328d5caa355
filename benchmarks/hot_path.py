"""The hot path: a product page's fan-out and a chain, against hand-written futures, under load.

Two shapes of 20 no-op nodes: **fan** (19 backends into one assembly node, the shape of a
product page) and **chain** (20 in a row). Three systems run them on one shared
``ThreadPoolExecutor(16)``, driven by 16 caller threads in a closed loop (each caller starts
the next run as soon as its last one returned):

- **taskflow**: ``TaskScheduling.start(tops, executor=pool, timeout=5)``;
- **submit + result**: the code taskflow replaces. In dependency order, ``.result()`` each
  father's future, then ``submit`` the node; then wait for all;
- **callbacks**: ``graphlib.TopologicalSorter`` plus ``add_done_callback``, dispatching each
  node as soon as its fathers finish (the baseline of ``benchmarks/overhead.py``).

Each round runs every system for ``--seconds`` in turn, the order alternating round by round; a
figure is the median over ``--rounds`` of the per-round ratio of runs per second, taskflow over
the better baseline of the same round.

Then taskflow's own bookkeeping, with no thread hand-off at all: the graph started from a task
of a one-worker pool, so the nested run is inline on that worker. Per node is the whole run's
time over its nodes; the set-up is the intercept and the per-node cost the slope of a
least-squares line through chains of 1, 5, 10, 20 and 40 nodes (medians of ``--inline`` runs).
The memory a kept 20-node result holds is the tracemalloc growth per result over 200 results
kept in a list.

    python benchmarks/hot_path.py             # the figures (about 40 s)
    python benchmarks/hot_path.py --smoke     # every measurement, tiny (a few seconds; CI runs it)
    python benchmarks/hot_path.py --old /tmp/old   # also an older checkout's engine, same rounds

``--old`` loads ``<tree>/taskflow`` beside this one (as ``benchmarks/ab_engines.py`` does) and
adds it as a fourth system of every loaded round, so before and after share the machine's noise;
the inline bookkeeping is then measured three times for each engine, alternating (medians).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from overhead import Graph, build, chain, handwritten, noop_task  # a sibling: run as a script

from taskflow import TaskScheduling

WORKERS = 16
CALLERS = 16


def fan(width: int = 19) -> Graph:
    """``width`` sources into one sink."""
    g: Graph = {f"b{i}": [] for i in range(width)}
    g["page"] = [f"b{i}" for i in range(width)]
    return g


SHAPES: dict[str, Callable[[], Graph]] = {"fan 19->1": fan, "chain 20": lambda: chain(20)}


def _noop() -> None:
    return None


def submit_and_result(graph: Graph, executor: Executor) -> None:
    """The hand-written stages: each node after ``.result()`` of each of its fathers."""
    futures: dict[str, Future[None]] = {}
    for name, fathers in graph.items():  # the shapes list every node after its fathers
        for f in fathers:
            futures[f].result()
        futures[name] = executor.submit(_noop)
    for fut in futures.values():
        fut.result()


def systems(graph: Graph, pool: Executor, old: Any = None) -> dict[str, Callable[[], Any]]:
    tops = build(graph)
    out: dict[str, Callable[[], Any]] = {
        "taskflow": lambda: TaskScheduling.start(tops, executor=pool, timeout=5.0),
        "submit + result": lambda: submit_and_result(graph, pool),
        "callbacks": lambda: handwritten(graph, pool),
    }
    if old is not None:
        from ab_engines import build as build_with  # a sibling, as overhead

        old_tops = build_with(old, graph)
        out["taskflow (old)"] = lambda: old.TaskScheduling.start(old_tops, executor=pool,
                                                                 timeout=5.0)
    return out


def closed_loop(run: Callable[[], Any], seconds: float, callers: int = CALLERS) -> float:
    """Runs per second of ``callers`` threads each running ``run`` back to back."""
    go = threading.Barrier(callers + 1)
    stop = threading.Event()
    counts = [0] * callers

    def caller(k: int) -> None:
        go.wait()
        n = 0
        while not stop.is_set():
            run()
            n += 1
        counts[k] = n

    threads = [threading.Thread(target=caller, args=(k,), daemon=True) for k in range(callers)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def under_load(rounds: int, seconds: float, old: Any = None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="hot-path") as pool:
        for shape, make in SHAPES.items():
            runs = systems(make(), pool, old)
            for run in runs.values():  # warm-up: threads started, plans compiled
                closed_loop(run, seconds / 4)
            figs: dict[str, list[float]] = {k: [] for k in runs}
            for r in range(rounds):
                order = list(runs) if r % 2 == 0 else list(reversed(runs))
                for k in order:
                    gc.collect()
                    figs[k].append(closed_loop(runs[k], seconds))
            ratios = [t / max(s, c) for t, s, c in
                      zip(figs["taskflow"], figs["submit + result"], figs["callbacks"], strict=True)]
            out[shape] = {
                "runs_per_s": {k: statistics.median(v) for k, v in figs.items()},
                "ratio": statistics.median(ratios),
                "ratio_range": (min(ratios), max(ratios)),
            }
            if old is not None:
                out[shape]["old_ratio"] = statistics.median(
                    [t / max(s, c) for t, s, c in zip(figs["taskflow (old)"],
                                                      figs["submit + result"], figs["callbacks"],
                                                      strict=True)])
    return out


def inline_seconds(graph: Graph, repeat: int, tf: Any = None) -> float:
    """The median time of one run of ``graph``, started inline on a one-worker pool (by the
    engine of package ``tf``; None: this tree's)."""
    if tf is None:
        tops, start = build(graph), TaskScheduling.start
    else:
        from ab_engines import build as build_with  # a sibling, as overhead

        tops, start = build_with(tf, graph), tf.TaskScheduling.start
    with ThreadPoolExecutor(1) as pool:
        def nested() -> list[float]:
            samples = []
            for _ in range(repeat):
                t = time.perf_counter()
                start(tops, executor=pool, timeout=5.0)
                samples.append(time.perf_counter() - t)
            return samples

        pool.submit(nested).result()  # warm-up
        return statistics.median(pool.submit(nested).result())


def call_seconds(repeat: int) -> float:
    """What calling a no-op task costs, the floor of a node."""
    ctx, param = object(), None
    t = time.perf_counter()
    for _ in range(repeat):
        noop_task(ctx, param)
    return (time.perf_counter() - t) / repeat


def bookkeeping(repeat: int, tf: Any = None) -> dict[str, Any]:
    per_node = {shape: inline_seconds(make(), repeat, tf) / len(make())
                for shape, make in SHAPES.items()}
    sizes = [1, 5, 10, 20, 40]
    times = [inline_seconds(chain(n), repeat, tf) for n in sizes]
    mean_n, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    slope = (sum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, times, strict=True))
             / sum((n - mean_n) ** 2 for n in sizes))
    return {"per_node_s": per_node, "setup_s": mean_t - slope * mean_n, "marginal_s": slope,
            "call_s": call_seconds(repeat * 20)}


def kept_result_bytes(keep: int = 200) -> dict[str, float]:
    out = {}
    with ThreadPoolExecutor(4) as pool:
        for shape, make in SHAPES.items():
            tops = build(make())
            TaskScheduling.start(tops, executor=pool, timeout=5.0)
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            kept = [TaskScheduling.start(tops, executor=pool, timeout=5.0) for _ in range(keep)]
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            out[shape] = held / len(kept)
            del kept
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the loaded figures")
    parser.add_argument("--seconds", type=float, default=0.6, help="seconds per system per round")
    parser.add_argument("--inline", type=int, default=2000, help="runs per inline figure")
    parser.add_argument("--smoke", action="store_true", help="every measurement, tiny")
    parser.add_argument("--old", type=Path, help="an older checkout to measure beside this one")
    args = parser.parse_args(argv)
    old = None
    if args.old is not None:
        from ab_engines import load_old  # a sibling, as overhead

        old = load_old(args.old)
    if args.smoke:
        args.rounds, args.seconds, args.inline = 1, 0.05, 20

    print(f"{CALLERS} callers, one ThreadPoolExecutor({WORKERS}), no-op nodes, closed loop; "
          f"median of {args.rounds} rounds of {args.seconds} s per system")
    for shape, fig in under_load(args.rounds, args.seconds, old).items():
        rps = fig["runs_per_s"]
        low, high = fig["ratio_range"]
        print(f"  {shape:10}  taskflow {rps['taskflow']:8.0f} runs/s   submit + result "
              f"{rps['submit + result']:8.0f}   callbacks {rps['callbacks']:8.0f}   "
              f"taskflow / better baseline {fig['ratio']:.2f}x ({low:.2f}-{high:.2f})")
        if old is not None:
            print(f"  {'':10}  old taskflow {rps['taskflow (old)']:8.0f} runs/s   "
                  f"old / better baseline {fig['old_ratio']:.2f}x")
    engines = {"": None} if old is None else {"": None, "old ": old}
    books: dict[str, list[dict[str, Any]]] = {k: [] for k in engines}
    for r in range(1 if old is None else 3):  # with --old: alternating, the median of 3 each
        for k in (list(engines) if r % 2 == 0 else list(reversed(engines))):
            books[k].append(bookkeeping(args.inline, engines[k]))
    for k, measured in books.items():
        book = {key: statistics.median(b[key] for b in measured)
                for key in ("setup_s", "marginal_s", "call_s")}
        print(f"{k}bookkeeping inline on a one-worker pool (median of {args.inline} runs; "
              f"calling a no-op task {book['call_s'] * 1e6:.2f} us):")
        for shape in SHAPES:
            seconds = statistics.median(b["per_node_s"][shape] for b in measured)
            print(f"  {shape:10}  {seconds * 1e6:6.2f} us per node")
        print(f"  chains of 1-40: set-up {book['setup_s'] * 1e6:6.2f} us per run, "
              f"{book['marginal_s'] * 1e6:5.2f} us per node more")
    for shape, size in kept_result_bytes(20 if args.smoke else 200).items():
        print(f"a kept {shape} result holds {size / 1024:5.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
