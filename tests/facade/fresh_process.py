"""Runs in a fresh interpreter (``python fresh_process.py MODE``), for ``test_first_run.py``:
what a process's first runs cost and import. Prints one JSON line.

- ``first plain`` / ``first options``: a one-node flow (a 30 ms node, ``timeout=0.1``, without
  or with the usual options: a node timeout, retries, a fallback, a bulkhead) built, then started
  twice on a stdlib pool: each run's status and wall time.
- ``imports``: every module the import system is asked for while runs are in progress on a
  thread pool (a finder first on ``sys.meta_path`` records them: a module already imported never
  reaches it). The flows are built first, as a program builds them at import; their nodes wait on
  Events, so the record spans runs that are really in flight. Each flow's first run is recorded:
  ``start``, ``submit``, ``stream`` and ``run_async``; failures, retries, fallbacks, node and run timeouts, cancellation, hooks, joins, a switch, a
  fork/join and a fan-out. ``imports options`` adds flows with every resilience option (a
  program that uses none never imports the resilience part at all); ``logged`` does the same
  with taskflow's loguru lines enabled into a sink.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import taskflow
from taskflow import FunctionNode, TaskScheduling


def wait_30ms(ctx: Any, _: Any) -> str:
    time.sleep(0.03)
    return "done"


def first(kind: str) -> dict[str, Any]:
    if kind == "plain":
        node = FunctionNode(wait_30ms, name="backend")
    else:
        node = FunctionNode(wait_30ms, name="backend", timeout=0.09, retries=1,
                            retry_backoff=0.001, fallback="stale",
                            bulkhead=taskflow.Bulkhead("backend", max_concurrent=4))
    out: dict[str, Any] = {}
    with ThreadPoolExecutor(4) as pool:
        for which in ("first", "second"):
            t0 = time.perf_counter()
            result = TaskScheduling.start(node, executor=pool, timeout=0.1)
            out[which] = {"ok": result.ok, "status": result.status.name,
                          "ms": (time.perf_counter() - t0) * 1e3}
    return out


class Recorder:
    """A finder that records every import it is asked for while ``on``, and finds nothing."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if self.on:
            self.seen.append(fullname)


def imports(options: bool, logged: bool) -> dict[str, Any]:
    import asyncio  # an asyncio program has it before it awaits run_async

    from taskflow import FanOutNode, Join, SchedulingNode, SwitchNode, TaskContext, fork_join

    if options:  # a program that uses them imports them (the plain one does not)
        from taskflow import Bulkhead, CircuitBreaker, Hedge, RateLimit, RetryBudget

    records: list[Any] = []
    if logged:
        from loguru import logger

        logger.remove()
        logger.add(records.append, level="DEBUG")
        logger.enable("taskflow")
        taskflow.logs.log_nodes(True)

    go = threading.Event()

    def held(ctx: Any, _: Any) -> str:
        go.wait(10)
        return "held"

    def quick(ctx: Any, _: Any) -> int:
        return 1

    def boom(ctx: Any, _: Any) -> int:
        raise ValueError("boom")

    tries: list[int] = []

    def flaky(ctx: Any, _: Any) -> int:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("first attempt")
        return 2

    never = threading.Event()

    def stuck(ctx: Any, _: Any) -> None:
        never.wait(1)

    def cancels(ctx: Any, _: Any) -> None:
        ctx.cancel("enough")

    class Hooked(SchedulingNode[None, int]):
        def task(self, ctx: TaskContext, param: None) -> int:
            go.wait(10)
            return 3

        def on_begin(self, support: Any) -> None:
            pass

        def on_success(self, support: Any) -> None:
            pass

    class Failing(SchedulingNode[None, int]):
        def task(self, ctx: TaskContext, param: None) -> int:
            raise KeyError("x")

        def on_fail(self, support: Any) -> None:
            raise RuntimeError("the hook fails too")

    class Pick(SwitchNode):
        def task(self, ctx: TaskContext, param: Any) -> str:
            go.wait(10)
            return "a"

    class Items(FanOutNode):
        def items(self, ctx: TaskContext, param: Any) -> Any:
            return ((k, k) for k in range(5))

        def work(self, ctx: TaskContext, item: Any) -> int:
            go.wait(10)
            return int(item)

    def flows() -> list[Any]:
        """Each flow's top node, built before any run (as a program builds them at import)."""
        out = []
        a = FunctionNode(held, name="a")
        a >> [FunctionNode(quick, name="b"), FunctionNode(boom, name="c")]
        out.append(a)
        out.append(FunctionNode(flaky, name="flaky", retries=2, retry_backoff=0.001,
                                timeout=5))
        if options:
            out.append(FunctionNode(boom, name="fallback", fallback=lambda ctx, e: 0))
            out.append(FunctionNode(
                held, name="limited", bulkhead=Bulkhead("fresh-bulkhead", max_concurrent=1),
                rate_limit=RateLimit("fresh-rate", per_second=1000, burst=10),
                breaker=CircuitBreaker("fresh-breaker"),
                retry_budget=RetryBudget("fresh-budget", ratio=0.2, min_per_second=10),
                priority=1))
            out.append(FunctionNode(held, name="hedged", hedge=Hedge(after=5.0, max_extra=1),
                                    idempotent=True))
            out.append(FunctionNode(held, name="shared", share_key=lambda ctx, p: "k",
                                    cache_ttl=10.0))
            out.append(FunctionNode(held, name="detached", detach=True, timeout=5))
        out.append(FunctionNode(stuck, name="node_timeout", timeout=0.02))
        out.append(FunctionNode(cancels, name="cancels"))
        out.append(Hooked(name="hooked"))
        out.append(Failing(name="failing"))
        x, y = FunctionNode(held, name="x"), FunctionNode(boom, name="y")
        anyone = FunctionNode(quick, name="anyone", join=Join.ANY)
        [x, y] >> anyone
        out.append(anyone)
        out.append(Pick(name="pick", cases={"a": FunctionNode(quick, name="case_a"),
                                            "b": FunctionNode(quick, name="case_b")}))
        out.append(fork_join([[FunctionNode(held, name="f1"), FunctionNode(quick, name="f2")],
                              [FunctionNode(quick, name="g1")]]))
        out.append(Items(name="items", max_concurrency=2))
        return out

    built = flows()
    run_timeout = FunctionNode(stuck, name="run_timeout")
    streamed = FunctionNode(held, name="streamed")
    submitted = FunctionNode(held, name="submitted")
    awaited = FunctionNode(held, name="awaited")
    shed = FunctionNode(quick, name="sheddable")

    recorder = Recorder()
    sys.meta_path.insert(0, recorder)
    statuses: dict[str, str] = {}
    with ThreadPoolExecutor(4) as pool:
        pool.submit(quick, None, None).result()  # the pool's first thread is the program's
        recorder.on = True
        for top in built:
            go.clear()
            releaser = threading.Timer(0.01, go.set)
            releaser.start()
            result = TaskScheduling.start(top, executor=pool, timeout=5)
            statuses[top.name] = result.status.name
            if top.name == "detached":  # its end, after the run returned
                statuses["detached"] += " " + result.detached("detached").result(10).state.name
        statuses["run_timeout"] = TaskScheduling.start(run_timeout, executor=pool,
                                                       timeout=0.02).status.name
        go.clear()
        threading.Timer(0.01, go.set).start()
        with TaskScheduling.stream(streamed, executor=pool, timeout=5) as parts:
            settled = [wr.state.name for _, wr in parts]
        statuses["streamed"] = f"{parts.result.status.name} {settled}"
        go.clear()
        future = TaskScheduling.submit(submitted, executor=pool, timeout=5)
        go.set()
        statuses["submitted"] = future.result(10).status.name
        go.clear()
        threading.Timer(0.01, go.set).start()
        awaited_result = asyncio.run(taskflow.run_async(awaited, executor=pool, timeout=5))
        statuses["awaited"] = awaited_result.status.name
        statuses["sheddable"] = TaskScheduling.start(shed, executor=pool, timeout=5,
                                                     priority="sheddable").status.name
        recorder.on = False
    never.set()
    return {"imported": recorder.seen, "statuses": statuses, "records": len(records)}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "first":
        print(json.dumps(first(sys.argv[2])))
    else:
        print(json.dumps(imports(options="options" in sys.argv[2:],
                                 logged="logged" in sys.argv[2:])))
