"""ThreadPool and MonitoredExecutor against the standard ThreadPoolExecutor, in one process.

Run: ``python benchmarks/pool_throughput.py [--workers 4] [--tasks 100000] [--rounds 7] [--repeats 3]``

Three ratios, each against a ``ThreadPoolExecutor`` with the same number of worker threads
measured in the same round (so a burst of load from other processes hits both alike), and each
the median over ``--rounds`` rounds (at least 7):

* **round trip**: ``ThreadPool`` / stdlib, the median time of ``submit(noop).result()`` one at
  a time, on a separate pair of executors that only ever see this tight loop (so the stdlib
  pool keeps one thread, while ``ThreadPool`` starts all its core threads, as JUC does); the
  two take turns every 50 calls. Goal <= 1.10.
* **throughput**: ``ThreadPool`` / stdlib, the wall time of 100,000 no-op tasks submitted from
  one thread and then waited for. Goal <= 1.05.
* **monitoring overhead**: ``MonitoredExecutor(ThreadPoolExecutor)`` / stdlib on the same
  no-op throughput run. Goal <= 1.05. It comes out below 1: a wrapped pool that has all its
  threads skips the stdlib's idle-thread semaphore, the lock its threads convoy on (see
  ``taskflow/pools/monitored.py``), which gains more than counting and timing each task costs.
  ``--own-cost`` adds a fourth executor to every round, the stdlib pool with the same skip and
  no monitoring (:class:`FullPoolSkip`), and prints what the monitoring itself costs against it.

Why the throughput rounds are built the way they are. With 4 workers, the submitting thread and
one GIL on 2 CPUs, the cost of one 100,000-task run depends on how the OS happens to schedule
the threads during it (how often a woken worker lands on the other CPU and convoys on the GIL):
the same executor's CPU per task varies by +-15 % from one run to the next, independently of
the other executors in the round (it is not a load burst that a same-round baseline cancels).
A ratio of two single runs therefore spread 0.87-1.42 over 15 rounds, wider than the goal. So
each round runs every executor ``--repeats`` times (default 3), the executors taking turns in
an order that rotates on every pass, and takes each executor's median of those runs; every
executor also runs one full-size run first that is not counted (heap and thread warm-up), and
before every run a full collection runs and the survivors are frozen (``gc.freeze``), so a run
does not pay to traverse the previous runs' leftovers. What is measured is unchanged: the wall
time of 100,000 no-op tasks against the stdlib pool in the same round. Beside each wall ratio
the table gives the ratio of process CPU time per task (it tracks the wall ratio: the run is
GIL-bound), and the spread of the per-round ratios as the interquartile range (IQR) and the
range.

The round-trip rounds follow the throughput rounds. The absolute figures (µs, tasks/s, process
CPU µs per task) are printed too; on a shared machine only the ratios mean something.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

# run from a checkout without installing: the repository root goes first on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOALS = {"round trip": 1.10, "throughput": 1.05, "monitoring overhead": 1.05}


def noop() -> None:
    """The tiny task."""


def _skip_worker(executor_reference: Any, work_queue: Any) -> None:
    """The stdlib worker loop, skipping the idle-thread semaphore once the pool is full (a
    benchmark's pool: any ``None`` on the queue means shut down)."""
    executor = executor_reference()
    idle = executor._idle_semaphore.release
    threads, most = executor._threads, executor._max_workers
    del executor
    while (item := work_queue.get(block=True)) is not None:
        item.run()
        del item
        if len(threads) < most:
            idle()
    work_queue.put(None)  # wake the next worker, which exits too


class FullPoolSkip(ThreadPoolExecutor):
    """The stdlib pool with ``MonitoredExecutor``'s full-pool skip and no monitoring: the
    baseline of ``--own-cost`` (what counting and timing cost, the skip aside)."""

    def _adjust_thread_count(self) -> None:
        threads: Any = self._threads
        if len(threads) >= self._max_workers or self._idle_semaphore.acquire(timeout=0):
            return  # full (the skip), or an idle thread takes the task
        t = threading.Thread(target=_skip_worker, args=(weakref.ref(self), self._work_queue))
        t.start()
        threads.add(t)  # shutdown() joins it


def round_trips_us(executors: list[Executor], n: int, block: int = 50) -> list[float]:
    """Median µs of ``submit(noop).result()`` for each executor, taking turns every ``block``
    calls (so each runs warm, and a burst of outside load hits them alike)."""
    samples: list[list[float]] = [[] for _ in executors]
    clock = time.perf_counter
    for _ in range(max(1, n // block)):
        for ex, out in zip(executors, samples, strict=True):
            for _ in range(block):
                t0 = clock()
                ex.submit(noop).result()
                out.append(clock() - t0)
    return [statistics.median(s) * 1e6 for s in samples]


def pin_to_one_cpu(executors: dict[str, Executor]) -> Callable[[], None] | None:
    """Pin this thread and the executors' threads to one CPU; return what undoes it."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    ids = {threading.get_native_id()}
    for ex in executors.values():
        ids |= {t.native_id for t in getattr(ex, "_threads", ()) if t.native_id is not None}
    before = {tid: os.sched_getaffinity(tid) for tid in ids}
    cpu = min(before[threading.get_native_id()])
    for tid in ids:
        os.sched_setaffinity(tid, {cpu})

    def restore() -> None:
        for tid, mask in before.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:  # the thread has exited
                pass

    return restore


def throughput(executor: Executor, n: int) -> tuple[float, float]:
    """Wall seconds, and process CPU µs per task, for ``n`` no-op tasks submitted from this
    thread and all waited for."""
    gc.collect()
    gc.freeze()  # the survivors of earlier runs are not traversed again during this one
    c0, t0 = time.process_time(), time.perf_counter()
    futures = [executor.submit(noop) for _ in range(n)]
    wait(futures)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    del futures
    gc.unfreeze()
    return elapsed, cpu / n * 1e6


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark, print the table and the three ratios; return the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--round-trips", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--repeats", type=int, default=3,
        help="throughput runs of each executor per round, taking turns; the round keeps the median",
    )
    parser.add_argument(
        "--own-cost", action="store_true",
        help="also run the stdlib pool with the full-pool skip and no monitoring, as the baseline "
             "of what monitoring itself costs",
    )
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false",
        help="do not pin the round-trip threads to one CPU (Linux only anyway)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    w = args.workers
    from taskflow import MonitoredExecutor, ThreadPool

    base = "ThreadPoolExecutor"
    factories: dict[str, Callable[[], Executor]] = {
        base: lambda: ThreadPoolExecutor(w),
        "ThreadPool": lambda: ThreadPool(w),
        "MonitoredExecutor(TPE)": lambda: MonitoredExecutor(ThreadPoolExecutor(w)),
    }
    if args.own_cost:
        factories["TPE, full-pool skip"] = lambda: FullPoolSkip(w)
    executors = {name: make() for name, make in factories.items()}
    tight = {base: ThreadPoolExecutor(w), "ThreadPool": ThreadPool(w)}  # round trips only
    names = list(executors)
    secs: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    rt: dict[str, list[float]] = {name: [] for name in (base, "ThreadPool")}
    ratios: dict[str, list[float]] = {name: [] for name in GOALS}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in GOALS if name != "round trip"}
    own: list[float] = []  # --own-cost: monitored / the same skip unmonitored, per round
    med = statistics.median
    try:
        for ex in executors.values():  # warm up: start the threads, grow the heap
            throughput(ex, args.tasks)
        round_trips_us(list(tight.values()), 200)
        turn = 0
        for _ in range(args.rounds):
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
            for _ in range(args.repeats):
                k = turn % len(names)
                turn += 1
                for name in names[k:] + names[:k]:
                    runs[name].append(throughput(executors[name], args.tasks))
            for name in names:
                secs[name].append(med(e for e, _ in runs[name]))
                cpu[name].append(med(c for _, c in runs[name]))
            for goal, who in (("throughput", "ThreadPool"), ("monitoring overhead", "MonitoredExecutor(TPE)")):
                ratios[goal].append(secs[who][-1] / secs[base][-1])
                cpu_ratios[goal].append(cpu[who][-1] / cpu[base][-1])
            if args.own_cost:
                own.append(secs["MonitoredExecutor(TPE)"][-1] / secs["TPE, full-pool skip"][-1])
        # The round trips in a phase of their own, every thread involved pinned to one CPU: a
        # round trip is two thread wake-ups, and where the OS places a woken thread is sticky
        # and arbitrary (on this 2-vCPU VM a wake-up on the idle vCPU costs ~65 µs more, so a
        # round trip is ~11 or ~75 µs whatever the pool). One CPU measures the pools' own cost.
        restore = pin_to_one_cpu(tight) if args.pin else None
        for r in range(args.rounds):
            pair = [base, "ThreadPool"] if r % 2 == 0 else ["ThreadPool", base]
            for name, us in zip(pair, round_trips_us([tight[n] for n in pair], args.round_trips), strict=True):
                rt[name].append(us)
            ratios["round trip"].append(rt["ThreadPool"][-1] / rt[base][-1])
        if restore is not None:
            restore()
    finally:
        for ex in [*executors.values(), *tight.values()]:
            ex.shutdown()

    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, {w} workers, "
        f"{args.tasks:,} no-op tasks (median of {args.repeats} runs per round), "
        f"{args.round_trips:,} round trips, median of {args.rounds} rounds"
    )
    header = f"{'executor':<24} {'round trip µs':>13} {'tasks/s':>9} {'CPU µs/task':>11}"
    print(header)
    print("-" * len(header))
    for name in names:
        trip = f"{med(rt[name]):>13.1f}" if name in rt else f"{'':>13}"
        print(f"{name:<24} {trip} {args.tasks / med(secs[name]):>9,.0f} {med(cpu[name]):>11.1f}")
    print()
    result = {name: med(values) for name, values in ratios.items()}
    for name, value in result.items():
        who = "MonitoredExecutor(TPE)" if name == "monitoring overhead" else "ThreadPool"
        verdict = "ok" if value <= GOALS[name] else "MISSED"
        print(
            f"{name:<20} {who} / ThreadPoolExecutor = {value:.3f}  (goal <= {GOALS[name]:.2f}, "
            f"{verdict}; {spread(ratios[name])})"
        )
        if name in cpu_ratios:
            print(f"{'':<20} CPU per task ratio = {med(cpu_ratios[name]):.3f}  ({spread(cpu_ratios[name])})")
        print(f"{'':<20} rounds: {', '.join(f'{v:.2f}' for v in ratios[name])}")
    if own:
        result["monitoring own cost"] = med(own)
        print(f"{'monitoring own cost':<20} MonitoredExecutor(TPE) / TPE, full-pool skip = "
              f"{med(own):.3f}  (no goal: counting and timing, the skip aside; {spread(own)})")
    return result


def spread(values: list[float]) -> str:
    """The interquartile range and the range of per-round ratios, as text."""
    if len(values) < 2:
        return f"one round: {values[0]:.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"IQR {q1:.3f}-{q3:.3f}, range {min(values):.2f}-{max(values):.2f}"


if __name__ == "__main__":
    main()
