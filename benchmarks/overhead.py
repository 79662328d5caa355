"""Per-node overhead of taskflow against the best hand-written runner, in one process.

The baseline is what a careful engineer writes by hand: ``graphlib.TopologicalSorter`` plus a
``ThreadPoolExecutor`` plus ``add_done_callback``, dispatching each node as soon as its fathers
finish. Both run the same no-op DAGs on the same 8-worker pool; each figure is the median of
``--repeat`` runs (default 9) after a warm-up.

    python benchmarks/overhead.py            # the table (about 30 s)
    python benchmarks/overhead.py --quick    # fewer repeats
    python benchmarks/overhead.py --stats    # with taskflow.observe.stats recording every run
    python benchmarks/overhead.py --otel     # traced (taskflow.observe.otel, SDK, batch export dropped)

Also reported: memory per node of a 10,000-node run (tracemalloc peak while it runs, over the
nodes) and the article's five-node DAG with 10 ms tasks against its 40 ms critical path.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from graphlib import TopologicalSorter
from typing import Any

from taskflow import FunctionNode, SchedulingNode, TaskScheduling

Graph = dict[str, list[str]]  # node -> fathers


def fan(n: int = 1000) -> Graph:
    g: Graph = {"src": []}
    for i in range(n):
        g[f"m{i}"] = ["src"]
    g["sink"] = [f"m{i}" for i in range(n)]
    return g


def chain(n: int = 1000) -> Graph:
    return {f"c{i}": ([f"c{i - 1}"] if i else []) for i in range(n)}


def layers(depth: int = 10, width: int = 100, max_fathers: int = 3, seed: int = 7) -> Graph:
    rnd = random.Random(seed)
    g: Graph = {}
    for d in range(depth):
        for w in range(width):
            fathers = [] if d == 0 else [
                f"l{d - 1}_{x}" for x in rnd.sample(range(width), rnd.randint(1, max_fathers))
            ]
            g[f"l{d}_{w}"] = fathers
    return g


def noop() -> None:
    return None


# -- the hand-written baseline ------------------------------------------------------------------

def handwritten(graph: Graph, executor: Executor,
                work: Mapping[str, Callable[[], Any]] | None = None) -> dict[str, Any]:
    """Dispatch each node as soon as its fathers finish; wait for all.

    Importable (``benchmarks/concurrency.py`` runs it beside taskflow). ``work`` maps a node to
    the zero-argument callable it runs (default: every node is :func:`noop`).
    """
    ts: TopologicalSorter[str] = TopologicalSorter(graph)
    ts.prepare()
    lock = threading.Lock()
    done = threading.Event()
    results: dict[str, Any] = {}
    remaining = [len(graph)]

    def on_done(name: str, fut: Any) -> None:
        results[name] = fut.result()
        with lock:
            ts.done(name)
            ready = ts.get_ready()
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()
        for n in ready:
            submit(n)

    def submit(name: str) -> None:
        fn = noop if work is None else work[name]
        executor.submit(fn).add_done_callback(partial(on_done, name))

    with lock:
        first = ts.get_ready()
    for n in first:
        submit(n)
    done.wait()
    return results


# -- taskflow -----------------------------------------------------------------------------------

def noop_task(ctx: Any, param: Any) -> None:
    return None


def build(graph: Graph, fn: Callable[[Any, Any], Any] = noop_task) -> list[SchedulingNode[Any, Any]]:
    nodes = {name: FunctionNode(fn, name=name) for name in graph}
    for name, fathers in graph.items():
        for f in fathers:
            nodes[f] >> nodes[name]
    return [nodes[n] for n, fathers in graph.items() if not fathers]


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up (and plan compilation for taskflow)
    samples = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def ancestors(graph: Graph, targets: list[str]) -> Graph:
    """The part of ``graph`` that ``targets`` need (themselves and their ancestors)."""
    keep: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name not in keep:
            keep.add(name)
            stack.extend(graph[name])
    return {name: fathers for name, fathers in graph.items() if name in keep}


def overhead_table(repeat: int, workers: int = 8) -> list[tuple[str, int, float, float]]:
    rows = []
    big = layers()
    last = [f"l9_{w}" for w in range(0, 100, 10)]  # ten nodes of the last layer
    with ThreadPoolExecutor(workers) as ex:
        for label, graph, targets in (
                ("fan-out 1->1000->1", fan(), None), ("chain 1000", chain(), None),
                ("layers 10x100 (<=3 fathers)", big, None),
                ("layers, 10 targets (ancestors)", big, last)):
            tops = build(graph)
            if targets is not None:
                graph = ancestors(graph, targets)  # what both sides run

            def run_tf(tops: list[SchedulingNode[Any, Any]] = tops,
                       targets: list[str] | None = targets) -> None:
                r = TaskScheduling.start(tops, executor=ex, targets=targets)
                assert r.ok

            def run_hw(graph: Graph = graph) -> None:
                handwritten(graph, ex)

            # interleave to share the machine's noise fairly
            hw = timed(run_hw, repeat)
            tf = timed(run_tf, repeat)
            hw2 = timed(run_hw, repeat)
            tf2 = timed(run_tf, repeat)
            rows.append((label, len(graph), min(hw, hw2), min(tf, tf2)))
    return rows


def memory_per_node(n: int = 10_000) -> tuple[float, float]:
    """tracemalloc peak bytes per node while running an n-node fan-out (first run, then cached)."""
    graph = fan(n - 2)
    tops = build(graph)
    with ThreadPoolExecutor(8) as ex:
        figures = []
        for _ in range(2):
            gc.collect()
            tracemalloc.start()
            r = TaskScheduling.start(tops, executor=ex)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert r.ok
            del r
            figures.append(peak / n)
    return figures[0], figures[1]


def article_five(repeat: int) -> tuple[float, float]:
    """Figure 7 of the article (1->2,3; 2->5; 3->4->5) with 10 ms tasks: critical path 40 ms."""

    def sleepy(ctx: Any, param: Any) -> None:
        time.sleep(0.010)

    n = {i: FunctionNode(sleepy, name=f"node{i}") for i in range(1, 6)}
    n[1].set_son_handler(n[2], n[3])
    n[2].set_son_handler(n[5]).set_father_handler(n[1])
    n[3].set_son_handler(n[4]).set_father_handler(n[1])
    n[4].set_son_handler(n[5]).set_father_handler(n[3])
    n[5].set_father_handler(n[2], n[4])
    graph = {"1": [], "2": ["1"], "3": ["1"], "4": ["3"], "5": ["2", "4"]}
    with ThreadPoolExecutor(8) as ex:
        def hw() -> None:
            ts: TopologicalSorter[str] = TopologicalSorter(graph)
            ts.prepare()
            lock = threading.Lock()
            done = threading.Event()
            left = [5]

            def on_done(name: str, fut: Any) -> None:
                with lock:
                    ts.done(name)
                    ready = ts.get_ready()
                    left[0] -= 1
                    if not left[0]:
                        done.set()
                for r in ready:
                    ex.submit(time.sleep, 0.010).add_done_callback(partial(on_done, r))

            for r in ts.get_ready():
                ex.submit(time.sleep, 0.010).add_done_callback(partial(on_done, r))
            done.wait()

        tf = timed(lambda: TaskScheduling.start(n[1], executor=ex, timeout=1.0), repeat)
        base = timed(hw, repeat)
    return tf, base


# called between sections: spans still queued for export are not left to the next section
def flush() -> object:
    return None


def instrument(*, stats: bool, otel: bool) -> str:
    """Turn on what the command line asks for; says what is on."""
    global flush
    on = []
    if stats:
        import taskflow.observe.stats

        taskflow.observe.stats.enable()
        on.append("stats on")
    if otel:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        import taskflow.observe.otel

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
        taskflow.observe.otel.instrument(tracer_provider=provider)
        flush = provider.force_flush
        on.append("traced (SDK, batch processor, spans dropped)")
    return ", ".join(on) or "uninstrumented"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--stats", action="store_true", help="taskflow.observe.stats.enable() first")
    ap.add_argument("--otel", action="store_true",
                    help="taskflow.observe.otel.instrument() first (needs the [otel] extra and the SDK)")
    args = ap.parse_args(argv)
    repeat = 3 if args.quick else max(7, args.repeat)
    setting = instrument(stats=args.stats, otel=args.otel)
    print(f"python {sys.version.split()[0]}, 8 workers, median of {repeat} runs (best of 2 interleaved rounds), {setting}")
    print(f"{'shape':30} {'nodes':>6} {'hand-written':>14} {'taskflow':>12} {'ratio':>7}")
    for label, nodes, hw, tf in overhead_table(repeat):
        print(f"{label:30} {nodes:6d} {hw / nodes * 1e6:10.2f} us/n {tf / nodes * 1e6:8.2f} us/n {tf / hw:7.2f}x")
    flush()
    first, cached = memory_per_node()
    print(f"memory per node, 10,000-node run: {first:.0f} B first run (plan compiled), {cached:.0f} B cached plan")
    flush()
    tf, base = article_five(repeat)
    print(f"article five-node DAG, 10 ms tasks, critical path 40 ms: taskflow {tf * 1e3:.2f} ms "
          f"(+{(tf - 0.040) * 1e3:.2f} ms), hand-written {base * 1e3:.2f} ms (+{(base - 0.040) * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
