"""The engine at run time: no garbage per run, fork safety, a light ``import taskflow``."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow import FanOutNode, FunctionNode, SchedulingNode, TaskContext, TaskScheduling


class Hooked(SchedulingNode[int, int]):
    def task(self, ctx: TaskContext, param: int) -> int:
        ctx["seen"] = param
        return param

    def on_begin(self, support: Any) -> None:
        support.context.incr("begun")

    def on_success(self, support: Any) -> None:
        support.context.incr("ok")


class Squares(FanOutNode[int]):
    def items(self, ctx: TaskContext, param: int) -> Iterable[tuple[Hashable, Any]]:
        return ((i, i) for i in range(param))

    def work(self, ctx: TaskContext, item: Any) -> Any:
        return item * item


def four_nodes() -> SchedulingNode[Any, Any]:
    a = FunctionNode(lambda c, p: 1, name="a")
    b = FunctionNode(lambda c, p: c.result_of("a") + 1, name="b")
    c = FunctionNode(lambda c, p: 3, name="c")
    d = FunctionNode(lambda c, p: c.result_of("b") + c.result_of("c"), name="d")
    a >> [b, c] >> d
    return a


def hooked_nodes() -> SchedulingNode[Any, Any]:
    a = Hooked(1, name="a", timeout=LONG)
    a >> [Hooked(2, name="b"), Hooked(3, name="c")] >> Hooked(4, name="d")
    return a


def fan_nodes() -> SchedulingNode[Any, Any]:
    fan = Squares(5, name="fan", max_concurrency=2, item_timeout=LONG)
    fan >> FunctionNode(lambda c, p: len(c.result_of("fan").succeeded), name="count")
    return fan


@pytest.mark.parametrize("shape", [four_nodes, hooked_nodes, fan_nodes])
@pytest.mark.parametrize("how", ["start", "submit"])
def test_finished_runs_leave_nothing_for_the_cycle_collector(shape, how):
    top = shape()
    with ThreadPoolExecutor(4, thread_name_prefix="gc") as pool:

        def runs(n: int) -> None:
            for _ in range(n):
                ctx = TaskContext()
                if how == "start":
                    result = TaskScheduling.start(top, executor=pool, timeout=LONG, context=ctx)
                else:
                    result = TaskScheduling.submit(top, executor=pool, timeout=LONG,
                                                   context=ctx).result(LONG)
                assert result.ok, result.failed
                assert ctx.flow_id == result.flow_id
                del result, ctx

        runs(20)  # warm-up: caches, threads, the plan
        gc.collect()
        gc.disable()
        try:
            runs(200)
            left = gc.collect()
        finally:
            gc.enable()
    assert left < 100, f"{left} objects in reference cycles after 200 runs"


def _flow_in_child() -> int:
    """In a forked child: a node timeout (timer thread) and a ``submit`` run whose budget ends
    (timer and coordinator threads); 0 if both end as they should."""
    try:
        with ThreadPoolExecutor(2) as pool:
            slow = FunctionNode(lambda c, p: c.cancelled or __import__("time").sleep(0.5),
                                name="slow", timeout=0.05)
            r1 = TaskScheduling.start(slow, executor=pool, timeout=LONG)
            if r1.result_of("slow").state.name != "TIMEOUT" or r1.elapsed > 0.45:
                return 1
            hung = FunctionNode(lambda c, p: __import__("time").sleep(0.5), name="hung")
            r2 = TaskScheduling.submit(hung, executor=pool, timeout=0.05).result(timeout=0.45)
            if r2.result_of("hung").state.name != "TIMEOUT":
                return 2
        return 0
    except BaseException:  # noqa: BLE001 - any failure is the child's exit code
        return 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_timer_and_coordinator_work_in_a_forked_child(make_executor):
    # the parent has both threads running before it forks
    pool = make_executor(2)
    slow = FunctionNode(lambda c, p: __import__("time").sleep(0.2), name="slow", timeout=0.01)
    TaskScheduling.submit(slow, executor=pool, timeout=0.05).result(LONG)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(_flow_in_child())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_import_taskflow_loads_no_pydantic():
    code = ("import sys, taskflow; "
            "heavy = [m for m in ('pydantic', 'taskflow.pools.threadpool', 'taskflow.declare.conductor', "
            "'taskflow.declare.spec', 'taskflow.observe.monitor', 'taskflow.model.report') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]"


def test_lazy_names_resolve_and_all_is_complete():
    import taskflow

    for name in taskflow.__all__:
        assert getattr(taskflow, name) is not None, name
    assert set(taskflow.__all__) <= set(dir(taskflow))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        taskflow.nope  # noqa: B018


def test_fast_nodes_share_loops_but_one_that_turns_slow_does_not_hold_up_the_rest(make_executor):
    # trained as fast, a and b share one loop; then a waits for b: the watchdog must give b a
    # loop of its own instead of leaving it behind a
    import threading

    state: dict[str, Any] = {"wait": None}

    def a_task(ctx: TaskContext, param: Any) -> str:
        ev = state["wait"]
        if ev is not None:
            assert ev.wait(LONG), "b never ran while a waited"
        return "a"

    def b_task(ctx: TaskContext, param: Any) -> str:
        ev = state["wait"]
        if ev is not None:
            ev.set()
        return "b"

    root = FunctionNode(lambda c, p: 0, name="root")
    root >> [FunctionNode(a_task, name="a"), FunctionNode(b_task, name="b")]
    pool = make_executor(4)
    for _ in range(30):
        assert TaskScheduling.start(root, executor=pool, timeout=LONG).ok
    state["wait"] = threading.Event()
    result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok and result.outputs == {"root": 0, "a": "a", "b": "b"}
    assert result.elapsed < LONG / 2
