"""The budget under load: how late ``start`` returns at its deadline with CPU-bound neighbours.

One process holds what a busy web worker holds: ``--callers`` request threads (16), each
starting a page back to back, and ``--burners`` CPU-bound threads (2) running pure-Python loops
(they hold the GIL until the interpreter takes it from them, every ``sys.getswitchinterval()``,
5 ms). A page is ``--backends`` backend calls (4) in parallel, then an ``aggregate`` that reads
them; a backend sleeps 5-50 ms, and in ``--hang`` of the pages (10 %) one backend sleeps past the
budget (``--budget`` + 1 s), so that page ends at its deadline (``--budget``, 2 s).

Four runners, on two pools of ``--workers`` threads (64) made once, before the CPU-bound threads
start, as a server makes its pool at start-up (the ``ThreadPool`` starts its core threads then,
``prestart_core_threads``; both pools are warmed by one untimed pass of every runner):

* ``taskflow/ThreadPool``: ``TaskScheduling.start(page, executor=ThreadPool(64), timeout=2)``;
* ``taskflow/stdlib``: the same on ``ThreadPoolExecutor(64)``;
* ``baseline/stdlib``: the hand-written way on ``ThreadPoolExecutor(64)``: submit the backends,
  ``concurrent.futures.wait(them, timeout=left)``, cancel what is not done, then submit the
  aggregate and wait for it with what is left;
* ``baseline/ThreadPool``: the same hand-written code on a ``ThreadPool(64)``.

``--cold`` makes each runner's pool anew for each round instead, not started and not warmed (what
the first requests after a deploy meet: a ``ThreadPool`` starts a thread per task up to its core
size, the stdlib pool whenever no thread is idle).

Each round runs every runner once, in an order that rotates from round to round, each on a quiet
pool (the next one starts after every backend of the last has returned). Per runner and round:

* **late**: for the pages that hit the deadline, how long after it the caller got its result
  (``return time - (call time + budget)``): median, p90, p99, max, and how many pages were
  later than 100 ms and 500 ms;
* **overhead**: for the pages that did not, their latency over their slowest backend (what the
  runner and the load add to the page): median, p90, p99.

The table gives each figure's median over the rounds, and each taskflow runner's ratio to the
baseline on the same pool in the same round (median over rounds; below 1 favours taskflow).
Absolute figures depend on the machine and its other load; the ratios are the result.

``--phases`` also times where a taskflow caller's lateness goes, for pages that hit the
deadline (on both pools): ``lag`` (how much later than the call's own deadline the engine's
is: ``start`` takes its ``t0`` once it has checked its arguments and built the run), ``submit`` (time the caller spent in ``executor.submit`` after the
deadline: the engine's owner submits worker loops while it waits), ``wake`` (from the deadline
until the caller's wait for the result returns and it starts closing the run; a submit in
progress at the deadline is in it too), ``close`` (the run's lock section: every unsettled node
TIMEOUT), ``abandon`` (``mark_abandoned`` of the running work), ``cancel+hooks`` (cancelling the
queued work, giving back resilience places, the owed hooks), ``finish`` (building the result)
and ``return``; beside them the caller thread's CPU time over the whole lateness (the rest it
spent waiting: for the GIL, or for a lock). The same split is given for the baseline (``wake``:
until ``wait`` returned; ``cancel``; the aggregate's round trip is not in it: the page is over).

    python benchmarks/budget_under_load.py                 # 3 rounds, ~2 minutes
    python benchmarks/budget_under_load.py --rounds 5 --phases
    python benchmarks/budget_under_load.py --quick         # 1 round, 8 pages per caller
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

from taskflow import FunctionNode, TaskContext, TaskScheduling, ThreadPool
from taskflow.engine import closing
from taskflow.engine.run import Run

RUNNERS = ("taskflow/ThreadPool", "taskflow/stdlib", "baseline/stdlib", "baseline/ThreadPool")


class Load:
    """What every page of a round shares: the backends still sleeping (to wait for a quiet
    pool between runners)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sleeping = 0
        self.quiet = threading.Condition(self.lock)

    def backend(self, seconds: float) -> float:
        with self.lock:
            self.sleeping += 1
        try:
            time.sleep(seconds)
        finally:
            with self.lock:
                self.sleeping -= 1
                if not self.sleeping:
                    self.quiet.notify_all()
        return seconds

    def wait_quiet(self, timeout: float) -> None:
        with self.lock:
            self.quiet.wait_for(lambda: not self.sleeping, timeout)


LOAD = Load()


def _backend(ctx: Any, i: int) -> float:
    return LOAD.backend(ctx["plan"][i])


def _aggregate(ctx: Any, n: int) -> float:
    return sum(ctx.result_of(f"backend{i}") for i in range(n))


def build_page(backends: int) -> list[Any]:
    """The page, built once and shared by every caller (as at import time in a web app)."""
    agg = FunctionNode(_aggregate, param=backends, name="aggregate")
    nodes = [FunctionNode(_backend, param=i, name=f"backend{i}") for i in range(backends)]
    for node in nodes:
        node >> agg
    return nodes


def taskflow_page(page: list[Any], pool: Executor, plan: list[float], budget: float) -> None:
    TaskScheduling.start(page, executor=pool, timeout=budget, context=TaskContext(plan=plan))


def baseline_page(pool: Executor, plan: list[float], budget: float) -> None:
    """The hand-written page: submit, ``wait(timeout)``, cancel what is late."""
    deadline = time.monotonic() + budget
    futs = [pool.submit(LOAD.backend, s) for s in plan]
    _, late = wait(futs, timeout=deadline - time.monotonic())
    if late:
        PHASES.mark("woke")
        for f in late:
            f.cancel()
        return
    agg: Future[float] = pool.submit(sum, [f.result() for f in futs])
    try:
        agg.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        agg.cancel()


class Phases:
    """Where the lateness of pages that hit the deadline goes (``--phases``); off: no cost."""

    def __init__(self) -> None:
        self.on = False
        self.tls = threading.local()
        self.lock = threading.Lock()
        self.rows: dict[str, list[dict[str, float]]] = {}
        self.runner = ""

    def begin(self, deadline: float) -> None:
        if self.on:
            self.tls.row = {"deadline": deadline, "cpu0": time.thread_time()}

    def mark(self, name: str) -> None:
        row = getattr(self.tls, "row", None) if self.on else None
        if row is not None and name not in row:
            row[name] = time.monotonic()

    def add(self, name: str, seconds: float) -> None:
        row = getattr(self.tls, "row", None) if self.on else None
        if row is not None:
            row[name] = row.get(name, 0.0) + seconds

    def add_late(self, name: str, start: float, end: float) -> None:
        """Count the part of ``start``..``end`` after the page's deadline under ``name``."""
        row = getattr(self.tls, "row", None) if self.on else None
        if row is not None and end > row["deadline"]:
            row[name] = row.get(name, 0.0) + end - max(start, row["deadline"])

    def end(self, timed_out: bool) -> None:
        row = getattr(self.tls, "row", None) if self.on else None
        self.tls.row = None
        if row is None or not timed_out:
            return
        row["returned"] = time.monotonic()
        row["cpu"] = time.thread_time() - row["cpu0"]
        with self.lock:
            self.rows.setdefault(self.runner, []).append(row)


PHASES = Phases()


@contextmanager
def timed_phases() -> Iterator[None]:
    """Wrap the engine's closing steps so that ``PHASES`` sees them (benchmark only)."""
    expire, close_rest, finish = closing.expire, closing.close_rest, closing.finish
    mark_abandoned = Run.mark_abandoned

    def timed_expire(run: Any) -> None:
        PHASES.mark("woke")
        PHASES.add("lag", run.deadline)  # the engine's deadline (t0 + budget), as a time
        expire(run)

    def timed_close_rest(run: Any, *args: Any, **kwargs: Any) -> None:
        PHASES.mark("closed")
        close_rest(run, *args, **kwargs)

    def timed_finish(run: Any) -> None:
        PHASES.mark("rested")
        finish(run)
        PHASES.mark("finished")

    def timed_mark_abandoned(run: Any, futs: list[Future[Any]]) -> None:
        t = time.monotonic()
        mark_abandoned(run, futs)
        PHASES.add("abandon", time.monotonic() - t)

    submits = {cls: cls.submit for cls in (ThreadPool, ThreadPoolExecutor)}

    def timed(submit: Any) -> Any:
        def timed_submit(pool: Any, *args: Any, **kwargs: Any) -> Any:
            t = time.monotonic()
            try:
                return submit(pool, *args, **kwargs)
            finally:
                PHASES.add_late("submit", t, time.monotonic())

        return timed_submit

    closing.expire, closing.close_rest, closing.finish = timed_expire, timed_close_rest, timed_finish
    Run.mark_abandoned = timed_mark_abandoned  # type: ignore[method-assign]
    for cls, submit in submits.items():
        cls.submit = timed(submit)  # type: ignore[method-assign]
    try:
        yield
    finally:
        closing.expire, closing.close_rest, closing.finish = expire, close_rest, finish
        Run.mark_abandoned = mark_abandoned  # type: ignore[method-assign]
        for cls, submit in submits.items():
            cls.submit = submit  # type: ignore[method-assign]


def burn(stop: threading.Event) -> None:
    """A CPU-bound neighbour: pure Python, never blocking."""
    while not stop.is_set():
        sum(i * i for i in range(2_000))


def plans(seed: int, n: int, backends: int, hang: float, budget: float) -> list[list[float]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        plan = [rnd.uniform(0.005, 0.050) for _ in range(backends)]
        if rnd.random() < hang:
            plan[rnd.randrange(backends)] = budget + 1.0
        out.append(plan)
    return out


def run_one(runner: str, pools: dict[str, Executor], args: argparse.Namespace,
            round_no: int, pages: int) -> dict[str, list[float]]:
    """Every caller runs ``pages`` pages with ``runner``; the lateness and overhead samples."""
    kind = runner.split("/")[1]
    pool = new_pool(kind, args.workers) if args.cold else pools[kind]
    page = build_page(args.backends)
    late: list[float] = []
    overhead: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(args.callers)
    PHASES.runner = runner

    def caller(k: int) -> None:
        mine = plans(1000 * round_no + k, pages, args.backends, args.hang, args.budget)
        barrier.wait()
        for plan in mine:
            t = time.monotonic()
            deadline = t + args.budget
            PHASES.begin(deadline)
            if runner.startswith("taskflow"):
                taskflow_page(page, pool, plan, args.budget)
            else:
                baseline_page(pool, plan, args.budget)
            end = time.monotonic()
            hit = max(plan) >= args.budget
            PHASES.end(hit)
            with lock:
                if hit:
                    late.append(end - deadline)
                else:
                    overhead.append(end - t - max(plan))

    threads = [threading.Thread(target=caller, args=(k,), name=f"caller-{k}")
               for k in range(args.callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    LOAD.wait_quiet(args.budget + 5.0)
    if args.cold:
        pool.shutdown(wait=True)
    return {"late": late, "overhead": overhead}


def new_pool(kind: str, workers: int) -> Executor:
    if kind == "ThreadPool":
        return ThreadPool(workers, thread_name_prefix="bench")
    return ThreadPoolExecutor(workers, thread_name_prefix="bench")


def q(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def figures(s: dict[str, list[float]]) -> dict[str, float]:
    late, over = s["late"], s["overhead"]
    return {
        "late p50": q(late, 0.5), "late p90": q(late, 0.9), "late p99": q(late, 0.99),
        "late max": max(late, default=float("nan")),
        ">100ms": float(sum(x > 0.1 for x in late)), ">500ms": float(sum(x > 0.5 for x in late)),
        "pages late": float(len(late)),
        "over p50": q(over, 0.5), "over p90": q(over, 0.9), "over p99": q(over, 0.99),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def report(per_round: list[dict[str, dict[str, float]]]) -> None:
    keys = list(next(iter(per_round[0].values())))
    print(f"{'runner':22}" + "".join(f"{k:>11}" for k in keys))
    for runner in RUNNERS:
        med = {k: statistics.median(r[runner][k] for r in per_round) for k in keys}
        cells = [f"{med[k] * 1e3:9.0f}ms" if k.startswith(("late", "over")) else f"{med[k]:11.0f}"
                 for k in keys]
        print(f"{runner:22}" + "".join(f"{c:>11}" for c in cells))
    print("\nratio to the baseline on the same pool, same round (median over rounds)")
    shown = ["late p50", "late p90", "late p99", "late max", "over p50", "over p90", "over p99"]
    print(f"{'':22}" + "".join(f"{k:>11}" for k in shown))
    for pool in ("ThreadPool", "stdlib"):
        cells = [statistics.median(ratio(r[f"taskflow/{pool}"][k], r[f"baseline/{pool}"][k])
                                   for r in per_round) for k in shown]
        print(f"{'taskflow/' + pool:22}" + "".join(f"{c:11.2f}" for c in cells))
    cells = [statistics.median(ratio(r["taskflow/ThreadPool"][k], r["taskflow/stdlib"][k])
                               for r in per_round) for k in shown]
    print(f"{'ThreadPool/stdlib':22}" + "".join(f"{c:11.2f}" for c in cells))


def report_phases() -> None:
    print("\nwhere the lateness goes (pages that hit the deadline; medians and p90, ms)")
    cols = ["lag", "submit", "wake", "close", "abandon", "cancel+hooks", "finish", "return",
            "late", "cpu"]
    print(f"{'runner':22}" + "".join(f"{c:>15}" for c in cols))
    for runner in RUNNERS:
        rows = PHASES.rows.get(runner, [])
        if not rows:
            continue
        split: dict[str, list[float]] = {c: [] for c in cols}
        for r in rows:
            end = r["returned"]
            split["late"].append(end - r["deadline"])
            split["cpu"].append(r["cpu"])
            split["submit"].append(r.get("submit", 0.0))
            if "lag" in r:
                split["lag"].append(r["lag"] - r["deadline"])
            if "woke" not in r:
                continue
            split["wake"].append(r["woke"] - r["deadline"])
            if runner.startswith("baseline"):
                split["cancel+hooks"].append(end - r["woke"])
                continue
            if "closed" in r and "rested" in r and "finished" in r:
                split["close"].append(r["closed"] - r["woke"])
                ab = r.get("abandon", 0.0)
                split["abandon"].append(ab)
                split["cancel+hooks"].append(r["rested"] - r["closed"] - ab)
                split["finish"].append(r["finished"] - r["rested"])
                split["return"].append(end - r["finished"])
        cells = [f"{q(split[c], 0.5) * 1e3:6.1f} /{q(split[c], 0.9) * 1e3:6.1f}"
                 if split[c] else "-" for c in cols]
        print(f"{runner:22}" + "".join(f"{c:>15}" for c in cells))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--hang", type=float, default=0.10)
    parser.add_argument("--pages", type=int, default=20, help="pages per caller per runner")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--cold", action="store_true", help="a new, cold pool per runner")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the run (default: the interpreter's)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.pages = 1, 8
    PHASES.on = args.phases
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    print(f"python {sys.version.split()[0]}, {args.callers} callers, {args.burners} CPU-bound "
          f"threads, {args.workers} pool threads ({'cold' if args.cold else 'warm'}), budget "
          f"{args.budget}s, {args.hang:.0%} pages hang, {args.pages} pages per caller, "
          f"{args.rounds} rounds, GIL switch interval {sys.getswitchinterval() * 1e3:g} ms")
    pools = {kind: new_pool(kind, args.workers) for kind in ("ThreadPool", "stdlib")}
    pools["ThreadPool"].prestart_core_threads()  # type: ignore[attr-defined]
    stop = threading.Event()
    burners = [threading.Thread(target=burn, args=(stop,), name=f"burner-{i}", daemon=True)
               for i in range(args.burners)]
    for t in burners:
        t.start()
    per_round: list[dict[str, dict[str, float]]] = []
    order = list(RUNNERS)
    try:
        for runner in RUNNERS if not args.cold else ():  # warm-up, not counted
            run_one(runner, pools, args, -1, 3)
        with timed_phases() if args.phases else _nothing():
            for r in range(args.rounds):
                results = {}
                for runner in order:
                    results[runner] = figures(run_one(runner, pools, args, r, args.pages))
                per_round.append(results)
                order = order[1:] + order[:1]
                print(f"round {r + 1}: " + ", ".join(
                    f"{k} late p99 {v['late p99'] * 1e3:.0f}ms" for k, v in results.items()),
                    flush=True)
    finally:
        stop.set()
        for t in burners:
            t.join()
        for pool in pools.values():
            pool.shutdown(wait=True)
    print()
    report(per_round)
    if args.phases:
        report_phases()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    main()
