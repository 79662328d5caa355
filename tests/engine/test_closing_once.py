"""One closer per run, one stand-in per node: however a run ends (its caller at the deadline,
the timer, a stream's consumer, a worker past the deadline, ``ctx.cancel``, the last node),
every fallback runs at most once per node and run, and no ``WorkResult`` changes after it was
handed out (returned by ``start``, yielded by a stream, or in ``FlowStream.result``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import PROMPT, SHORT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loguru import logger

from taskflow import FunctionNode, ResultState, TaskContext, TaskScheduling
from taskflow.errors import NodeTimeoutError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"),
]

S = ResultState


class Calls:
    """Fallback calls per (run, node), and the threads they ran on."""

    def __init__(self) -> None:
        self.count: Counter[tuple[Any, str]] = Counter()
        self.threads: dict[tuple[Any, str], list[str]] = {}
        self.lock = threading.Lock()

    def fallback(self, name: str, delay: float = 0.0,
                 first: Callable[[], None] | None = None) -> Callable[[TaskContext, Any], Any]:
        def fb(ctx: TaskContext, error: BaseException) -> Any:
            key = (ctx["rid"], name)
            with self.lock:
                self.count[key] += 1
                self.threads.setdefault(key, []).append(threading.current_thread().name)
                n = self.count[key]
            if n == 1 and first is not None:
                first()
            if delay:
                time.sleep(delay)  # stands in for a fallback that takes a while (a log write)
            return f"stand-in of {name}"
        return fb

    def twice(self) -> dict[tuple[Any, str], list[str]]:
        with self.lock:
            return {k: self.threads[k] for k, v in self.count.items() if v > 1}


def snapshot(wr: Any) -> tuple[Any, ...]:
    return (wr.state, wr.result, wr.exception, wr.finished_at)


@pytest.fixture
def bug_lines() -> Iterator[list[str]]:
    """Lines taskflow logs when the engine breaks one of its own rules ("taskflow bug: ...")."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)) if "taskflow bug" in str(m) else None,
                      level="DEBUG")
    logger.enable("taskflow")
    try:
        yield lines
    finally:
        logger.disable("taskflow")
        logger.remove(sink)


def hangs(release: threading.Event) -> Callable[[TaskContext, Any], Any]:
    def task(ctx: TaskContext, p: Any) -> Any:
        release.wait(PROMPT * 5)
        return "late"
    return task


def test_stream_deadline_runs_each_fallback_once_while_a_second_closer_arrives(
        bug_lines: list[str]) -> None:
    # the first closer at the deadline (the timer or the consumer in next()) is held inside
    # son0's fallback until the other one has had its chance to close the run too
    calls = Calls()
    release = threading.Event()

    def hold() -> None:
        # stands in for a slow fallback: no event can say the other closer has tried, since
        # a correct engine never calls the fallback again
        time.sleep(SHORT * 4)

    root = FunctionNode(hangs(release), name="root")
    sons = [FunctionNode(lambda c, p: "real", name=f"son{k}",
                         fallback=calls.fallback(f"son{k}", first=hold if k == 0 else None))
            for k in range(3)]
    for s in sons:
        root >> s
    with ThreadPoolExecutor(4) as pool:
        try:
            handed: dict[str, tuple[Any, ...]] = {}
            stream = TaskScheduling.stream(root, executor=pool, timeout=SHORT,
                                           context=TaskContext(rid=0))
            items = list(stream)
            for name, wr in items:
                handed[name] = snapshot(wr)
            result = stream.result
            kept = {n: snapshot(result[n].work_result) for n in handed}
        finally:
            release.set()
    assert calls.twice() == {}
    assert sorted(handed) == ["root", "son0", "son1", "son2"]
    for k in range(3):
        assert handed[f"son{k}"][0] is S.DEGRADED
        assert handed[f"son{k}"][1] == f"stand-in of son{k}"
    assert kept == handed
    assert {n: snapshot(wr) for n, wr in items} == handed  # nothing rewrote them afterwards
    assert bug_lines == []


def test_min_budget_refusal_at_the_deadline_computes_its_stand_in_once() -> None:
    # the father leaves the son less than its min_budget; the son's worker computes its
    # stand-in while the run's deadline passes: the closer waits for that one, and keeps it
    calls = Calls()
    in_fallback = threading.Event()
    budget = 0.2

    def father(ctx: TaskContext, p: Any) -> int:
        time.sleep(max(0.0, ctx.remaining() - 0.03))
        return 1

    def slow_first() -> None:
        in_fallback.set()

    son = FunctionNode(lambda c, p: 2, name="son", min_budget=0.1,
                       fallback=calls.fallback("son", delay=0.08, first=slow_first))
    FunctionNode(father, name="father") >> son
    with ThreadPoolExecutor(4) as pool:
        results = [TaskScheduling.start(son, executor=pool, timeout=budget,
                                        context=TaskContext(rid=j)) for j in range(3)]
    assert in_fallback.is_set()
    assert calls.twice() == {}
    for r in results:
        wr = r["son"].work_result
        assert wr.state is S.DEGRADED
        assert wr.result == "stand-in of son"
        assert isinstance(wr.exception, NodeTimeoutError)  # the refusal it stands in for


def test_a_cancel_then_the_deadline_ends_only_the_node_that_cancelled(
        bug_lines: list[str]) -> None:
    # ctx.cancel closes the run (the others CANCELLED); the deadline then ends the cancelling
    # node, which still runs: the second close touches nothing the first one decided
    calls = Calls()
    release = threading.Event()
    cancelled = threading.Event()

    def canceller(ctx: TaskContext, p: Any) -> str:
        ctx.cancel("enough")
        cancelled.set()
        release.wait(PROMPT * 5)
        return "late"

    root = FunctionNode(const_task("r"), name="root")
    stop = FunctionNode(canceller, name="stop", fallback=calls.fallback("stop"))
    other = FunctionNode(hangs(release), name="other", fallback=calls.fallback("other"))
    root >> stop
    root >> other
    with ThreadPoolExecutor(4) as pool:
        try:
            r = TaskScheduling.start(root, executor=pool, timeout=SHORT * 2,
                                     context=TaskContext(rid=0))
            first = {n: snapshot(r[n].work_result) for n in ("root", "stop", "other")}
        finally:
            release.set()
    assert cancelled.is_set()
    assert first["other"][0] is S.CANCELLED
    assert first["stop"][0] is S.DEGRADED  # the deadline ended it, with its fallback
    assert calls.count[(0, "stop")] == 1 and calls.count[(0, "other")] == 0
    assert {n: snapshot(r[n].work_result) for n in first} == first
    assert bug_lines == []


def const_task(value: Any) -> Callable[[TaskContext, Any], Any]:
    return lambda ctx, p: value


# -- who closes the run: random races -----------------------------------------------------------

def _graph(calls: Calls, release: threading.Event, shape: dict[str, Any]) -> FunctionNode:
    """root -> (a hanging or quick middle) -> sons with fallbacks; one son may call ctx.cancel
    near the deadline, one may be refused by min_budget."""
    root = FunctionNode(const_task("r"), name="root")

    def middle(ctx: TaskContext, p: Any) -> str:
        if shape["middle_hangs"]:
            release.wait(PROMPT * 5)
        else:
            time.sleep(max(0.0, ctx.remaining() - shape["leave"]))
        return "m"

    mid = FunctionNode(middle, name="mid")
    root >> mid
    end = FunctionNode(const_task("end"), name="end")
    for k in range(shape["sons"]):
        name = f"son{k}"
        opts: dict[str, Any] = {"fallback": calls.fallback(name, delay=shape["fb_delay"])}
        if k == 0 and shape["min_budget"]:
            opts["min_budget"] = shape["leave"] * 2
        if k == 1 and shape["cancels"]:
            def task(ctx: TaskContext, p: Any) -> str:
                ctx.cancel("a son cancels")
                return "cancelled it"
            son = FunctionNode(task, name=name, **opts)
        else:
            son = FunctionNode(const_task(name), name=name, **opts)
        mid >> son
        son >> end
    return root


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.fixed_dictionaries({
    "how": st.sampled_from(["start", "stream", "stream-close", "submit"]),
    "sons": st.integers(1, 4),
    "middle_hangs": st.booleans(),
    "leave": st.sampled_from([0.0, 0.005, 0.015]),
    "fb_delay": st.sampled_from([0.0, 0.002, 0.02]),
    "min_budget": st.booleans(),
    "cancels": st.booleans(),
    "consumers": st.integers(1, 2),
}))
def test_whoever_closes_the_run_every_stand_in_is_computed_once_and_results_stay_put(
        shape: dict[str, Any], bug_lines: list[str]) -> None:
    calls = Calls()
    release = threading.Event()
    root = _graph(calls, release, shape)
    budget = 0.04
    handed: list[tuple[str, Any, tuple[Any, ...]]] = []
    handed_lock = threading.Lock()

    def keep(name: str, wr: Any) -> None:
        with handed_lock:
            handed.append((name, wr, snapshot(wr)))

    with ThreadPoolExecutor(4) as pool:
        try:
            ctx = TaskContext(rid=0)
            how = shape["how"]
            if how == "start":
                result = TaskScheduling.start(root, executor=pool, timeout=budget, context=ctx)
            elif how == "submit":
                result = TaskScheduling.submit(root, executor=pool, timeout=budget,
                                               context=ctx).result(PROMPT)
            else:
                stream = TaskScheduling.stream(root, executor=pool, timeout=budget,
                                               context=ctx)

                def consume() -> None:
                    for n, (name, wr) in enumerate(stream):
                        keep(name, wr)
                        if how == "stream-close" and n == 1:
                            stream.close()
                            return

                threads = [threading.Thread(target=consume)
                           for _ in range(shape["consumers"])]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(PROMPT)
                    assert not t.is_alive()
                stream.close()
                result = stream.result
            for name in ("root", "mid", "end", *(f"son{k}" for k in range(shape["sons"]))):
                keep(name, result[name].work_result)
        finally:
            release.set()
    assert calls.twice() == {}, calls.twice()
    for name, wr, snap in handed:
        assert snapshot(wr) == snap, name  # nothing rewrote a result after it came out
        assert wr.state is not S.DEFAULT, name
    assert bug_lines == []
