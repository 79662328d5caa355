"""Two versions of the engine in one process: per-node overhead and the no-op request path, old
against new, alternating, each against the hand-written runner of the same round.

    git archive <old-commit> | tar -x -C /tmp/old      # any checkout of the older code
    python benchmarks/ab_engines.py /tmp/old            # overhead shapes + no-op at 16, 32 callers
    python benchmarks/ab_engines.py /tmp/old --rounds 9 --callers 16

The older tree's ``taskflow`` package is copied to a temporary directory as ``taskflow_old`` (every
``taskflow`` word in its sources renamed), so both import side by side and share the machine's
noise: each round measures old, new and the hand-written runner back to back, alternating the
order. Ratios are per round (taskflow / hand-written of that round); the table shows medians.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from concurrency import layers, measure
from overhead import ancestors, chain, fan, handwritten, timed
from overhead import layers as overhead_layers

import taskflow


def load_old(tree: Path) -> Any:
    """Import ``tree/taskflow`` as ``taskflow_old``."""
    dest = Path(tempfile.mkdtemp(prefix="taskflow-old-"))
    shutil.copytree(tree / "taskflow", dest / "taskflow_old")
    word = re.compile(r"\btaskflow\b")
    for path in (dest / "taskflow_old").rglob("*.py"):
        path.write_text(word.sub("taskflow_old", path.read_text()))
    sys.path.insert(0, str(dest))
    return importlib.import_module("taskflow_old")


def build(tf: Any, graph: dict[str, list[str]]) -> list[Any]:
    nodes = {name: tf.FunctionNode(_noop, name=name) for name in graph}
    for name, fathers in graph.items():
        for f in fathers:
            nodes[f] >> nodes[name]
    return [nodes[n] for n, fathers in graph.items() if not fathers]


def _noop(ctx: Any, param: Any) -> None:
    return None


def overhead(engines: dict[str, Any], rounds: int, repeat: int) -> None:
    big = overhead_layers()
    last = [f"l9_{w}" for w in range(0, 100, 10)]
    shapes = (("fan-out 1->1000->1", fan(), None), ("chain 1000", chain(), None),
              ("layers 10x100", big, None), ("layers, 10 targets", big, last))
    with ThreadPoolExecutor(8) as ex:
        for label, graph, targets in shapes:
            tops = {k: build(tf, graph) for k, tf in engines.items()}
            hw_graph = ancestors(graph, targets) if targets else graph
            ratios: dict[str, list[float]] = {k: [] for k in engines}
            per_node: dict[str, list[float]] = {k: [] for k in engines}
            for r in range(rounds):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                hw = timed(partial(handwritten, hw_graph, ex), repeat)
                for k in order:
                    t = timed(partial(engines[k].TaskScheduling.start, tops[k], executor=ex,
                                      targets=targets), repeat)
                    ratios[k].append(t / hw)
                    per_node[k].append(t / len(hw_graph) * 1e6)
            print(f"{label:22} " + "  ".join(
                f"{k}: {statistics.median(per_node[k]):.2f} us/node "
                f"{statistics.median(ratios[k]):.3f}x ({min(ratios[k]):.3f}-{max(ratios[k]):.3f})"
                for k in engines))


def noop_requests(engines: dict[str, Any], rounds: int, callers_list: list[int]) -> None:
    graph = layers(depth=4, width=5, max_fathers=2, seed=20)
    with ThreadPoolExecutor(64, thread_name_prefix="bench-pool") as pool:
        runners = {}
        for k, tf in engines.items():
            tops = build(tf, graph)
            runners[k] = (lambda tf=tf, tops=tops: tf.TaskScheduling.start(
                tops, executor=pool, timeout=2.0).ok)

        def run_hw() -> bool:
            handwritten(graph, pool)
            return True

        runners["hand"] = run_hw
        for callers in callers_list:
            flows = callers * 60
            for run in runners.values():
                measure(run, callers, max(callers, flows // 4))
            figs: dict[str, list[dict[str, Any]]] = {k: [] for k in runners}
            for r in range(rounds):
                order = list(runners) if r % 2 == 0 else list(reversed(runners))
                for k in order:
                    figs[k].append(measure(runners[k], callers, flows))
            for k in engines:
                p99 = [a["p99_ms"] / b["p99_ms"] for a, b in zip(figs[k], figs["hand"], strict=True)]
                fps = [a["flows_per_s"] / b["flows_per_s"]
                       for a, b in zip(figs[k], figs["hand"], strict=True)]
                p50 = [a["p50_ms"] / b["p50_ms"] for a, b in zip(figs[k], figs["hand"], strict=True)]
                cpu = statistics.median(a["cpu_ms_per_flow"] for a in figs[k])
                print(f"no-op 20, {callers} callers, {k}: flows/s {statistics.median(fps):.2f}x, "
                      f"p50 {statistics.median(p50):.2f}x, p99 {statistics.median(p99):.2f}x "
                      f"({min(p99):.2f}-{max(p99):.2f}), p99 "
                      f"{statistics.median(a['p99_ms'] for a in figs[k]):.2f} ms, "
                      f"CPU {cpu:.3f} ms/flow")
            print(f"no-op 20, {callers} callers, hand-written: p99 "
                  f"{statistics.median(a['p99_ms'] for a in figs['hand']):.2f} ms, CPU "
                  f"{statistics.median(a['cpu_ms_per_flow'] for a in figs['hand']):.3f} ms/flow")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("old", type=Path, help="a checkout (or archive) of the older code")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=7, help="runs per overhead figure")
    ap.add_argument("--callers", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--only", choices=("overhead", "requests"))
    args = ap.parse_args(argv)
    engines = {"old": load_old(args.old), "new": taskflow}
    if args.only != "requests":
        overhead(engines, args.rounds, args.repeat)
    if args.only != "overhead":
        noop_requests(engines, args.rounds, args.callers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
