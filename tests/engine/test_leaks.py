"""Resource leaks: threads, timers, futures and pool state. Threads back to baseline is checked after every test by
the autouse ``no_thread_leaks`` fixture in conftest.py; these tests add the rest.
"""

from __future__ import annotations

import contextvars
import gc
import threading
import tracemalloc
import weakref
from concurrent.futures import Executor, ThreadPoolExecutor, wait

import pytest
from conftest import LONG, SHORT

from taskflow import FunctionNode, ResultState, SchedulingNode, TaskContext, TaskScheduling


class Payload:
    """A value whose lifetime we follow with a weakref."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.blob = bytearray(1024)


def collect() -> None:
    for _ in range(3):
        gc.collect()


# --- L1: threads ----------------------------------------------------------------------------


def test_runs_start_no_threads_of_their_own(make_executor, gate, monkeypatch):
    pool = make_executor(2, prefix="leakpool")
    # warm up: pool threads and any process-wide timer thread exist before we count
    warm_release = gate()
    TaskScheduling.start(
        FunctionNode(lambda c, p: warm_release.wait(LONG), name="warm"),
        executor=pool,
        timeout=SHORT,
    )
    warm_release.set()
    TaskScheduling.start(FunctionNode(lambda c, p: 1, name="warm2"), executor=pool, timeout=LONG)

    started: list[str] = []
    original_start = threading.Thread.start

    def counting_start(self, *args, **kwargs):
        started.append(self.name)
        return original_start(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    try:
        for i in range(30):
            release = gate()
            a = FunctionNode(lambda c, p: p, param=i, name="a")
            b = FunctionNode(lambda c, p: 1 / 0 if p % 3 == 0 else p, param=i, name="b")
            slow = FunctionNode(lambda c, p, gate=release: gate.wait(LONG), name="slow")
            a >> [b, slow]
            timeout = SHORT if i % 10 == 0 else LONG
            if timeout == LONG:
                release.set()
            TaskScheduling.start(a, executor=pool, timeout=timeout)
            release.set()
    finally:
        monkeypatch.setattr(threading.Thread, "start", original_start)

    foreign = [name for name in started if not name.startswith("leakpool")]
    assert len(foreign) <= 1, f"threads started per run: {foreign}"


# --- L3: no stale references ------------------------------------------------------------------


def _refs_after_run(make_executor, task):
    pool = make_executor(2)
    refs: dict[str, weakref.ref] = {}
    selves: weakref.WeakSet[SchedulingNode] = weakref.WeakSet()

    class Tracked(SchedulingNode):
        def task(self, ctx, param):
            selves.add(self)
            refs[f"self:{param}"] = weakref.ref(self)
            return task(ctx, param, refs)

    ctx = TaskContext()
    ctx_payload = Payload("ctx")
    ctx["payload"] = ctx_payload
    refs["ctx_payload"] = weakref.ref(ctx_payload)
    a = Tracked(param="a", name="a")
    b = Tracked(param="b", name="b")
    a >> b
    result = TaskScheduling.start(a, executor=pool, context=ctx, timeout=LONG)
    states = {n: result[n].work_result.state for n in result}
    del ctx, ctx_payload, result
    pool.shutdown(wait=True)
    collect()
    return refs, selves, states


def test_no_stale_references_after_a_successful_run(make_executor):
    def task(ctx, param, refs):
        value = Payload(param)
        refs[param] = weakref.ref(value)
        return value

    refs, selves, states = _refs_after_run(make_executor, task)

    assert states == {"a": ResultState.SUCCESS, "b": ResultState.SUCCESS}
    assert {"a", "b", "self:a", "self:b", "ctx_payload"} <= set(refs)
    alive = [name for name, ref in refs.items() if ref() is not None]
    assert alive == [], f"still referenced after the run: {alive}"
    assert len(selves) == 0, "per-run node copies outlive their run"


def test_no_stale_references_after_a_failed_run(make_executor):
    def task(ctx, param, refs):
        local = Payload(param)  # kept alive by the traceback's frame as long as the exception
        refs[param] = weakref.ref(local)
        raise ValueError(param)

    refs, selves, states = _refs_after_run(make_executor, task)

    assert states == {"a": ResultState.EXCEPTION, "b": ResultState.EXCEPTION}
    assert {"a", "self:a", "ctx_payload"} <= set(refs)
    alive = [name for name, ref in refs.items() if ref() is not None]
    assert alive == [], f"still referenced after the run: {alive}"
    assert len(selves) == 0


_held: contextvars.ContextVar[object] = contextvars.ContextVar("held")


def test_a_kept_result_keeps_what_it_reads_and_lets_its_run_go():
    """A kept FlowResult (and the context it ran with) answers everything once its run, its
    executor and the caller's context variables it ran under are gone."""
    from taskflow.model.context import current

    runs: list[weakref.ref[object]] = []

    class Copied(SchedulingNode):
        """Not a plain function node: the run makes its own copy of it while it runs."""

        def task(self, ctx, param):
            runs.append(weakref.ref(current.run))
            ctx["seen"] = param
            return param

    a = Copied(param=1, name="a")
    b = FunctionNode(lambda ctx, p: ctx.result_of("a") + 1, name="b")
    c = FunctionNode(lambda ctx, p: 3, name="c")
    a >> b
    a >> c
    held = Payload("held by the caller's context variables")
    token = _held.set(held)
    ctx = TaskContext()
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=LONG, context=ctx)
    _held.reset(token)
    pool_ref, held_ref = weakref.ref(pool), weakref.ref(held)
    del pool, held
    collect()

    assert runs and runs[0]() is None, "a kept result keeps its whole run alive"
    assert pool_ref() is None, "a kept result keeps the executor alive"
    assert held_ref() is None, "a kept result keeps the caller's context variables alive"
    assert result.ok and result.outputs == {"a": 1, "b": 2, "c": 3}
    assert result.states() == dict.fromkeys("abc", ResultState.SUCCESS)
    assert result.result_of("b").result == 2 and result.result_of("b").attempts == 1
    assert [n.name for n in result["a"].son_handler] == ["b", "c"]  # copied during the run
    assert [n.name for n in result["b"].father_handler] == ["a"]  # copied after it
    assert result["a"] is result["b"].father_handler[0]
    assert dict(result.context) == {"seen": 1}
    report = result.report()
    assert [n.name for n in report.nodes] == ["a", "b", "c"]
    assert report.nodes[1].fathers == ["a"] and report.nodes[1].node_state == "FINISH"
    page = result.to_html()
    assert result.flow_id in page and "SUCCESS" in page
    assert ctx.result_of("b") == 2 and ctx.flow_id == result.flow_id and ctx.cancelled
    with ThreadPoolExecutor(1) as pool:
        again = TaskScheduling.start(a, executor=pool, timeout=LONG, context=ctx)
    assert again.ok and result.outputs["b"] == 2, "the context is free for another run"


def test_abandoned_result_is_released_once_its_thread_finishes(make_executor, gate):
    pool = make_executor(1)
    release = gate()
    refs: dict[str, weakref.ref] = {}

    def late(ctx, p):
        release.wait(LONG)
        value = Payload("late")
        refs["late"] = weakref.ref(value)
        return value

    result = TaskScheduling.start(FunctionNode(late, name="late"), executor=pool, timeout=2 * SHORT)
    assert result["late"].work_result.state is ResultState.TIMEOUT
    release.set()
    pool.shutdown(wait=True)
    collect()

    assert refs["late"]() is None, "the dropped late result is still referenced"
    assert result["late"].work_result.state is ResultState.TIMEOUT  # the result object lives on


# --- L2: memory across thousands of runs -----------------------------------------------------


def test_memory_stays_flat_across_thousands_of_runs(make_executor):
    pool = make_executor(2)
    selves: weakref.WeakSet[SchedulingNode] = weakref.WeakSet()

    executed = []

    class Step(SchedulingNode):
        def task(self, ctx, param):
            selves.add(self)
            executed.append(1)
            if param == "fail" and ctx["i"] % 3 == 0:
                raise ValueError("x" * 200)  # ~1/3 of the runs fail, with a traceback
            return Payload(param)

    root = Step(param="root", name="root")
    left = Step(param="fail", name="left")
    right = Step(param="right", name="right")
    sink = Step(param="sink", name="sink")
    root >> [left, right] >> sink

    oks = []

    def runs(start, stop):
        for i in range(start, stop):
            result = TaskScheduling.start(
                root, executor=pool, context=TaskContext({"i": i}), timeout=LONG
            )
            oks.append(result.ok)

    runs(0, 300)  # warm-up: caches, lazily created threads, interned strings
    collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        runs(300, 2300)
        collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()

    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert growth < 512 * 1024, f"memory grew by {growth} bytes over 2000 runs"
    assert len(executed) > 3 * 2300 and 0 < oks.count(False) < len(oks)
    assert len(selves) == 0, f"{len(selves)} per-run node copies still alive"


# --- L5: the user's executor is left intact ---------------------------------------------------


def test_user_executor_is_never_shut_down_and_holds_no_pending_work(make_executor, gate):
    inner = make_executor(2)

    class Spy(Executor):
        def __init__(self):
            self.futures = []
            self.shutdowns = 0

        def submit(self, fn, /, *args, **kwargs):
            future = inner.submit(fn, *args, **kwargs)
            self.futures.append(future)
            return future

        def shutdown(self, wait=True, *, cancel_futures=False):
            self.shutdowns += 1

    spy = Spy()
    release = gate()

    def boom(c, p):
        raise ValueError("x")

    def cancel(c, p):
        c.cancel("stop")

    flows = {
        "ok": (FunctionNode(lambda c, p: 1, name="ok"), LONG),
        "failing": (FunctionNode(boom, name="failing"), LONG),
        "timed_out": (FunctionNode(lambda c, p: release.wait(LONG), name="stuck"), 2 * SHORT),
        "cancelled": (FunctionNode(cancel, name="canceller"), LONG),
    }
    for node, timeout in flows.values():
        TaskScheduling.start(node, executor=spy, timeout=timeout)
    with spy:  # the context manager protocol of Executor calls shutdown: ours, not the library's
        pass
    assert spy.shutdowns == 1, "the library must never shut the user's executor down"

    release.set()
    _done, not_done = wait(spy.futures, timeout=LONG)
    assert not not_done, "a submitted task was left pending"
    assert inner.submit(lambda: "still accepting").result(timeout=LONG) == "still accepting"


@pytest.mark.parametrize("outcome", ["ok", "failing", "timed_out"])
def test_thread_pool_stays_usable_after_each_kind_of_run(make_executor, gate, outcome):
    pool: ThreadPoolExecutor = make_executor(1)
    release = gate()

    def body(c, p):
        if outcome == "failing":
            raise RuntimeError("x")
        if outcome == "timed_out":
            release.wait(LONG)
        return 1

    TaskScheduling.start(
        FunctionNode(body, name="n"),
        executor=pool,
        timeout=2 * SHORT if outcome == "timed_out" else LONG,
    )
    release.set()
    assert pool.submit(lambda: "alive").result(timeout=LONG) == "alive"


def test_a_run_of_async_nodes_is_freed_by_refcounting():
    """The attempts of async nodes let go of their run as they end: a finished run is freed
    without the cyclic garbage collector (which would otherwise run often under load)."""
    import asyncio

    from taskflow.engine import aio
    from taskflow.model.context import current

    runs: list[weakref.ref[object]] = []

    async def call(ctx, k):
        runs.append(weakref.ref(current.run))
        await asyncio.sleep(0)
        return k

    nodes = [FunctionNode(call, k, name=f"call-{k}") for k in range(3)]
    with ThreadPoolExecutor(2) as pool:
        assert TaskScheduling.start(nodes, executor=pool, timeout=LONG).ok  # the loop started
        collect()
        gc.disable()
        try:
            result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
            assert result.ok and result.outputs == {f"call-{k}": k for k in range(3)}
            del result
            loop = aio.loop_thread.loop
            assert loop is not None
            # the loop's callbacks queued before this one (the attempts' last steps) are done
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(LONG)
            alive = [ref for ref in runs[3:] if ref() is not None]
        finally:
            gc.enable()
    assert len(runs) == 6 and alive == [], "a finished run waits for the cyclic collector"
