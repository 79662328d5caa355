"""A page of many backend calls as async nodes, against sync nodes and hand-written asyncio.

    python benchmarks/async_nodes.py                 # the three sections (about 4 minutes)
    python benchmarks/async_nodes.py --smoke         # seconds: what CI runs
    python benchmarks/async_nodes.py --sections page --calls 200 --workers 16
    python benchmarks/async_nodes.py --sections capacity --systems async gather
    python benchmarks/async_nodes.py --hold async 300 --seconds 10   # one rate, to profile:
    py-spy record --gil --nonblocking --threads --format raw -d 8 -o prof.txt -p PID

Three sections, measured in one process:

**page**: one page of ``calls`` calls of ``latency`` seconds on ``workers`` workers, started by one
caller, as sync and as async nodes (median time per page). A sync node holds a worker while it
waits for its backend, so the page takes about ``calls / workers * latency``; an async node waits
on the event loop and holds no worker, so the page takes about one ``latency``.

**capacity**: the same page (50 calls of 20 ms: ``time.sleep`` in a sync node, ``asyncio.sleep``
in an async one) started by 16 caller threads, open loop (``benchmarks/concurrency.py``'s
``measure``, imported: page ``n`` arrives at ``n / rate`` s, handled by caller ``n % 16``, its
latency counted from its arrival, so a system that cannot keep up falls behind and its latency
grows). The rate rises by 1.5x from 8 pages/s until a step fails, then is bisected (in log)
between the last rate that passed and the first that failed; a step passes when no page failed
and the p99 is within the page budget (0.5 s; taskflow's runs get it as ``timeout=``, the
hand-written pages as the wait on their future). The capacity is the highest rate that passed. A step is
finite (``--duration``, 4 s of arrivals): a rate a little above what a system sustains builds a
backlog that adds ``(rate / sustained - 1) x duration`` to the last pages' latency, so a step
can pass up to about ``budget / duration`` (12 %) above the sustained rate, every system alike.
Each step runs on a fresh pool (abandoned sync calls of a failed step do not slow the next).
The systems:

* ``sync-16``: sync nodes on a ``ThreadPoolExecutor(16)``. Bound: 16 thread-seconds per second
  over 1 thread-second per page (50 x 20 ms) = 16 pages/s.
* ``sync-64``: sync nodes on 64 workers: 64 pages/s at most, less if the CPU runs out first.
* ``async``: async nodes, ``TaskScheduling.start`` from the caller threads on the same 16-worker
  pool (a worker hands each coroutine to taskflow's loop thread and goes on); the calls wait on
  the loop thread together.
* ``gather``: hand-written ``asyncio.gather`` of the 50 calls on one loop thread of its own; each
  caller thread submits its page with ``asyncio.run_coroutine_threadsafe`` and waits on the
  future. This is the fair baseline for ``start`` from a sync view: the same 16 caller threads,
  the same open-loop arrivals, the same cross-thread hand-off to one loop and back, the same
  budget; driving the pages from the loop itself would drop the callers (a server whose views
  are all coroutines, i.e. ``run_async``, not ``start``) and measure another harness.

With 16 callers and a 20 ms page no system passes 16 / 20 ms = 800 pages/s; below that, the
async systems are bound by CPU (the GIL: one core's worth of Python at most), which is why each
row prints the CPU time per page at its capacity and the rate one core would allow.

**memory**: what one in-flight call costs. ``n`` calls are started and left parked (async: on
an ``asyncio.Event``; sync: on a ``threading.Event``, one worker each on an ``n``-worker pool);
once all are waiting, ``tracemalloc``'s growth since before the start over ``n`` is the Python
heap per call, and the growth of the process's resident memory (``VmRSS``) over ``n`` is what
the pages touched cost, thread stacks included: a thread reserves its stack (``ulimit -s``,
8 MiB here) as virtual memory, and only the pages it touches are committed, which RSS counts.
Hand-written ``asyncio`` tasks parked on the same event are measured as the baseline; the
nodes' figures include the run's own record of each node (one run of ``n`` nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from concurrency import measure  # the open-loop harness, a sibling: run as a script

from taskflow import FunctionNode, TaskScheduling

SECTIONS = ("page", "capacity", "memory")
SYSTEMS = ("sync-16", "sync-64", "async", "gather")
CALLERS = 16
BUDGET = 0.5  # seconds per page
FIRST_RATE, GROW, REFINE, MAX_RATE = 8.0, 1.5, 3, 3200.0
ASYNC_VS_SYNC16, ASYNC_VS_GATHER = 5.0, 0.8  # the targets


# -- one page ------------------------------------------------------------------------------------


def page(kind: str, calls: int, latency: float) -> list[FunctionNode]:
    async def async_call(ctx: Any, k: int) -> int:
        await asyncio.sleep(latency)  # a backend answering after ``latency`` seconds
        return k

    def sync_call(ctx: Any, k: int) -> int:
        time.sleep(latency)
        return k

    fn = async_call if kind == "async" else sync_call
    return [FunctionNode(fn, k, name=f"call-{k}") for k in range(calls)]


def per_page(kind: str, calls: int, latency: float, workers: int, pages: int) -> float:
    """Median seconds per page of ``kind`` nodes."""
    nodes = page(kind, calls, latency)
    times = []
    with ThreadPoolExecutor(workers) as pool:
        assert TaskScheduling.start(nodes, executor=pool, timeout=60).ok  # warm-up
        for _ in range(pages):
            t0 = time.perf_counter()
            result = TaskScheduling.start(nodes, executor=pool, timeout=60)
            times.append(time.perf_counter() - t0)
            assert result.ok, result.failed
    return statistics.median(times)


def page_section(args: argparse.Namespace) -> dict[str, float]:
    out = {kind: per_page(kind, args.calls, args.latency, args.workers, args.pages)
           for kind in ("async", "sync")}
    print(f"page: {args.calls} calls of {args.latency * 1000:.0f} ms on {args.workers} "
          f"workers, one caller, median of {args.pages} pages:")
    for kind, seconds in out.items():
        print(f"  {kind:5} nodes: {seconds * 1000:8.1f} ms per page")
    print(f"  sync / async: {out['sync'] / out['async']:.1f}x")
    return out


# -- capacity ------------------------------------------------------------------------------------


class System:
    """One way to serve the page: ``open()`` before a step, ``run()`` from each caller,
    ``close()`` after it (a fresh pool per step)."""

    def __init__(self, name: str, calls: int, latency: float, budget: float) -> None:
        self.name, self.budget = name, budget
        self.pool: ThreadPoolExecutor | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        if name == "gather":
            async def call(k: int) -> int:
                await asyncio.sleep(latency)
                return k

            async def gathered() -> list[int]:
                return await asyncio.gather(*(call(k) for k in range(calls)))

            self.gathered = gathered
            self.loop = asyncio.new_event_loop()
            self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                                name="bench-gather-loop")
            self.loop_thread.start()
        else:
            self.nodes = page("async" if name == "async" else "sync", calls, latency)
        self.workers = 64 if name == "sync-64" else 16

    def open(self) -> None:
        if self.name != "gather":
            self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix=f"bench-{self.name}")
            barrier = threading.Barrier(self.workers)  # every worker started before the step
            for f in [self.pool.submit(barrier.wait) for _ in range(self.workers)]:
                f.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)  # abandoned sync calls end here, not in the next step
            self.pool = None

    def run(self) -> bool:
        if self.loop is not None:
            future = asyncio.run_coroutine_threadsafe(self.gathered(), self.loop)
            try:
                future.result(timeout=self.budget)
            except FutureTimeout:
                future.cancel()
                return False
            return True
        assert self.pool is not None
        return TaskScheduling.start(self.nodes, executor=self.pool, timeout=self.budget).ok

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop_thread.join()
            self.loop.close()


def step(system: System, rate: float, duration: float, min_pages: int) -> dict[str, Any]:
    system.open()
    try:
        pages = max(min_pages, round(rate * duration))
        m = measure(system.run, CALLERS, pages, rate)
    finally:
        system.close()
    m["rate"] = rate
    m["passed"] = m["failed"] == 0 and m["p99_ms"] <= system.budget * 1e3
    return m


def capacity(system: System, duration: float, min_pages: int,
             progress: Callable[[str], None], first: float = FIRST_RATE,
             refine: int = REFINE, max_rate: float = MAX_RATE) -> dict[str, Any]:
    """The highest open-loop rate whose step passed (see the module's docstring)."""
    steps: list[dict[str, Any]] = []

    def at(rate: float) -> bool:
        m = step(system, rate, duration, min_pages)
        steps.append(m)
        progress(f"  {system.name} {rate:7.1f} pages/s: p50 {m['p50_ms']:6.1f} ms, p99 "
                 f"{m['p99_ms']:7.1f} ms, {m['failed']} failed of {m['flows']}, "
                 f"{m['cpu_ms_per_flow']:.2f} ms CPU/page -> "
                 f"{'pass' if m['passed'] else 'FAIL'}")
        return bool(m["passed"])

    system.open()  # warm-up: the compiled plan, the loop thread, the allocator
    try:
        for _ in range(3):
            system.run()
    finally:
        system.close()
    good: float | None = None
    bad: float | None = None
    rate = first
    while rate <= max_rate:
        if at(rate):
            good, rate = rate, rate * GROW
        else:
            bad = rate
            break
    while good is None and bad is not None and rate > first / 16:  # failed at the first rate
        rate /= GROW
        if at(rate):
            good = rate
        else:
            bad = rate
    for _ in range(refine if good is not None and bad is not None else 0):
        assert good is not None and bad is not None
        mid = math.sqrt(good * bad)
        if at(mid):
            good = mid
        else:
            bad = mid
    best = max((m for m in steps if m["passed"]), key=lambda m: m["rate"], default=None)
    return {"system": system.name, "capacity": good or 0.0, "first_failed": bad,
            "at_capacity": best, "steps": steps}


def capacity_section(args: argparse.Namespace, progress: Callable[[str], None],
                     ) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    print(f"capacity: a page of {args.cap_calls} calls of {args.latency * 1000:.0f} ms, "
          f"{CALLERS} callers, open loop, budget {args.budget * 1000:.0f} ms; capacity = the "
          "highest rate with p99 within the budget and no failed page")
    for name in args.systems:
        system = System(name, args.cap_calls, args.latency, args.budget)
        try:
            rows[name] = capacity(system, args.duration, args.min_pages, progress,
                                  args.first_rate, args.refine, args.max_rate)
        finally:
            system.stop()
    critical = CALLERS / args.latency
    print(f"| system | capacity pages/s | first failed | p50, p99 at capacity | CPU per page "
          f"| one core's bound |  (callers' bound: {critical:.0f} pages/s)")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        m = row["at_capacity"]
        # no step failed: the capacity is at least the highest rate tried
        failed = "none tried" if row["first_failed"] is None else f"{row['first_failed']:.0f}"
        at_least = ">= " if row["first_failed"] is None else ""
        if m is None:
            print(f"| {name} | 0 | {failed} | n/a | n/a | n/a |")
            continue
        cpu = m["cpu_ms_per_flow"]
        print(f"| {name} | {at_least}{row['capacity']:.0f} | {failed} | {m['p50_ms']:.1f}, "
              f"{m['p99_ms']:.1f} ms | {cpu:.2f} ms | {1000 / cpu:.0f} pages/s |")
    cap = {name: row["capacity"] for name, row in rows.items()}
    ratios = {}
    for other, target in (("sync-16", ASYNC_VS_SYNC16), ("gather", ASYNC_VS_GATHER)):
        if "async" in cap and cap.get(other):
            ratios[other] = cap["async"] / cap[other]
            verdict = "met" if ratios[other] >= target else "MISSED"
            print(f"  async / {other}: {ratios[other]:.2f}x (target >= {target:g}x: {verdict})")
    return {"rows": rows, "ratios": ratios}


# -- memory per in-flight call -----------------------------------------------------------------


def _rss() -> int:
    """The process's resident memory in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def parked(kind: str, n: int) -> dict[str, float]:
    """Bytes per call with ``n`` calls of ``kind`` parked at once (tracemalloc, RSS)."""
    arrived = threading.Event()
    count = [0]
    lock = threading.Lock()

    def one_more() -> None:
        with lock:
            count[0] += 1
            if count[0] == n:
                arrived.set()

    release: Callable[[], None]
    finish: Callable[[], None]
    if kind == "sync":
        gate = threading.Event()

        def sync_wait(ctx: Any, k: int) -> int:
            one_more()
            gate.wait()
            return k

        nodes = [FunctionNode(sync_wait, k, name=f"call-{k}") for k in range(n)]
        release = gate.set
    else:
        loop: list[asyncio.AbstractEventLoop] = []
        event: list[asyncio.Event] = []

        async def wait(k: int) -> int:
            if not loop:
                loop.append(asyncio.get_running_loop())
                event.append(asyncio.Event())
            one_more()
            await event[0].wait()
            return k

        async def async_wait(ctx: Any, k: int) -> int:
            return await wait(k)

        nodes = [FunctionNode(async_wait, k, name=f"call-{k}") for k in range(n)]

        def release() -> None:
            loop[0].call_soon_threadsafe(event[0].set)

    outcome: list[Any] = []
    if kind == "gather":
        hand_loop = asyncio.new_event_loop()
        runner = threading.Thread(target=hand_loop.run_forever, name="bench-parked-loop")
        runner.start()
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), hand_loop).result()  # warm

        def begin() -> None:
            async def all_of() -> list[int]:
                return await asyncio.gather(*(wait(k) for k in range(n)))

            outcome.append(asyncio.run_coroutine_threadsafe(all_of(), hand_loop))

        def finish() -> None:
            assert outcome[0].result(timeout=60) == list(range(n))
            hand_loop.call_soon_threadsafe(hand_loop.stop)
            runner.join()
            hand_loop.close()
    else:
        pool = ThreadPoolExecutor(n if kind == "sync" else 4, thread_name_prefix="bench-parked")
        starter = threading.Thread(target=lambda: outcome.append(
            TaskScheduling.start(nodes, executor=pool, timeout=120)), name="bench-parked-start")

        def begin() -> None:
            starter.start()

        def finish() -> None:
            starter.join()
            assert outcome[0].ok, outcome[0].failed
            pool.shutdown(wait=True)

    if kind == "async":  # warm: taskflow's loop thread and the compiled plan exist before
        warm = [FunctionNode(_nap, name="warm")]
        with ThreadPoolExecutor(1) as p:
            assert TaskScheduling.start(warm, executor=p, timeout=10).ok
    tracemalloc.start()
    try:
        heap0, rss0 = tracemalloc.get_traced_memory()[0], _rss()
        begin()
        assert arrived.wait(60), f"only {count[0]} of {n} parked"
        time.sleep(0.05)  # the last to arrive reaches its wait
        heap1, rss1 = tracemalloc.get_traced_memory()[0], _rss()
    finally:
        release()
        finish()
        tracemalloc.stop()
    return {"heap": (heap1 - heap0) / n, "rss": (rss1 - rss0) / n}


async def _nap(ctx: Any, _: Any) -> None:
    await asyncio.sleep(0)


def memory_section(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    out = {kind: parked(kind, args.parked) for kind in ("async", "gather", "sync")}
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    reserve = threading.stack_size() or stack
    labels = {"async": "async nodes", "gather": "hand-written asyncio tasks",
              "sync": "sync nodes (a thread each)"}
    print(f"memory: {args.parked} calls parked at once, per call (tracemalloc: Python heap; "
          "RSS: resident pages, thread stacks included)")
    for kind, m in out.items():
        print(f"  {labels[kind]:27}: {m['heap'] / 1024:6.1f} KiB heap, "
              f"{m['rss'] / 1024:6.1f} KiB RSS")
    if reserve > 0:
        print(f"  each thread also reserves {reserve / 2**20:.0f} MiB of virtual memory for "
              "its stack, committed only as far as it is touched (the RSS above)")
    return out


# -- holding one rate, for a profiler -------------------------------------------------------------


def hold(name: str, rate: float, seconds: float, args: argparse.Namespace) -> dict[str, Any]:
    """One open-loop step of ``seconds`` at ``rate`` (run it under ``py-spy record``)."""
    system = System(name, args.cap_calls, args.latency, args.budget)
    try:
        m = step(system, rate, seconds, 1)
    finally:
        system.stop()
    print(f"{name} at {rate:g} pages/s for {seconds:g} s: p50 {m['p50_ms']:.1f} ms, p99 "
          f"{m['p99_ms']:.1f} ms, {m['failed']} failed of {m['flows']}, "
          f"{m['cpu_ms_per_flow']:.2f} ms CPU per page")
    return m


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--calls", type=int, default=50, help="page: calls per page")
    ap.add_argument("--latency", type=float, default=0.02, help="seconds per backend call")
    ap.add_argument("--workers", type=int, default=4, help="page: workers")
    ap.add_argument("--pages", type=int, default=10, help="page: pages timed")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--cap-calls", type=int, default=50, help="capacity: calls per page")
    ap.add_argument("--budget", type=float, default=BUDGET, help="capacity: seconds per page")
    ap.add_argument("--duration", type=float, default=4.0,
                    help="capacity: seconds of arrivals per step")
    ap.add_argument("--min-pages", type=int, default=48, help="capacity: pages per step at least")
    ap.add_argument("--first-rate", type=float, default=FIRST_RATE,
                    help="capacity: the first rate tried, pages/s")
    ap.add_argument("--max-rate", type=float, default=MAX_RATE,
                    help="capacity: no rate above this is tried, pages/s")
    ap.add_argument("--refine", type=int, default=REFINE,
                    help="capacity: bisections between the last pass and the first fail")
    ap.add_argument("--parked", type=int, default=1000, help="memory: calls parked at once")
    ap.add_argument("--hold", nargs=2, metavar=("SYSTEM", "RATE"),
                    help="only run SYSTEM at RATE pages/s for --seconds (to profile it)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--smoke", action="store_true", help="every section, tiny and fast")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.smoke:
        args.calls, args.pages, args.latency = 12, 2, 0.01
        args.cap_calls, args.duration, args.min_pages, args.refine = 10, 0.25, 16, 0
        args.first_rate = args.max_rate = 64.0  # one step per system
        args.parked = 50

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.hold:
        name, rate = args.hold
        if name not in SYSTEMS:
            parser().error(f"--hold: SYSTEM must be one of {', '.join(SYSTEMS)}, not {name!r}")
        return {"hold": hold(name, float(rate), args.seconds, args)}
    load = os.getloadavg()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs (shared), load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start")
    out: dict[str, Any] = {}
    if "page" in args.sections:
        out["page"] = page_section(args)
    if "capacity" in args.sections:
        out["capacity"] = capacity_section(args, progress)
    if "memory" in args.sections:
        out["memory"] = memory_section(args)
    return out


if __name__ == "__main__":
    main()
