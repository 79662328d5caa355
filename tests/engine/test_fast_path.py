"""The engine's fast path for plain nodes of quiet runs (``Plan.plain``, a loop's step in
``engine/plainloop.py``): which nodes take it, that it records exactly what the general path
records, and that anything it does not handle (observers, failures, retries, late outcomes)
still goes the general way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow import FunctionNode, Join, ResultState, TaskScheduling
from taskflow.engine import events
from taskflow.engine import run as engine_run
from taskflow.model.graph import compile_plan


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as ex:
        yield ex


def add(ctx: Any, param: Any) -> Any:
    return param + 1


class WithHook(FunctionNode):
    def on_success(self, support: Any) -> None:
        pass


def test_plain_nodes_are_stateless_function_nodes_without_timeout_or_policy() -> None:
    from taskflow.kinds.switch import SwitchNode

    plain = FunctionNode(add, 1, name="plain")
    timed = FunctionNode(add, 1, name="timed", timeout=LONG)
    hooked = WithHook(add, 1, name="hooked")
    guarded = FunctionNode(add, 1, name="guarded", fallback=0)
    retried = FunctionNode(add, 1, name="retried", retries=2)  # retries alone: still plain
    plain >> timed >> hooked >> guarded >> retried
    plan = compile_plan((plain,))
    assert dict(zip(plan.names, plan.plain, strict=True)) == {
        "plain": True, "timed": False, "hooked": False, "guarded": False, "retried": True}

    class Pick(SwitchNode[Any]):
        def task(self, ctx: Any, param: Any) -> Any:
            return "x"

    case = FunctionNode(add, 1, name="case")
    sw = Pick(name="switch", cases={"x": case})
    assert compile_plan((sw,)).plain == (False, True)


def test_a_changed_node_recompiles_its_plainness(pool: ThreadPoolExecutor) -> None:
    a = FunctionNode(add, 1, name="a")
    assert compile_plan((a,)).plain == (True,)
    a.timeout = LONG
    assert compile_plan((a,)).plain == (False,)


def _diamond() -> FunctionNode:
    a = FunctionNode(add, 0, name="a")
    b = FunctionNode(add, 10, name="b")
    c = FunctionNode(add, 20, name="c")
    d = FunctionNode(lambda ctx, p: ctx.result_of("b") + ctx.result_of("c"), name="d")
    a >> b >> d
    a >> c >> d
    return a


def test_quiet_runs_take_the_fast_path_and_record_what_the_general_path_does(
        pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    general = []
    execute = engine_run.Run.execute

    def counted(self: Any, i: int, token: int, tname: str) -> int:
        general.append(self.names[i])
        return execute(self, i, token, tname)

    monkeypatch.setattr(engine_run.Run, "execute", counted)
    top = _diamond()
    quiet = TaskScheduling.start(top, executor=pool, timeout=LONG)
    assert general == []  # every node went through a loop's plain step

    class Watch(events.RunObserver):
        pass

    class Listener:
        def run_started(self, run: Any) -> events.RunObserver:
            return Watch()

    listener = Listener()
    events.add_listener(listener)
    try:
        watched = TaskScheduling.start(top, executor=pool, timeout=LONG)
    finally:
        events.remove_listener(listener)
    assert sorted(general) == ["a", "b", "c", "d"]  # an observed run: the general path
    for result in (quiet, watched):
        assert result.ok
        assert result.outputs == {"a": 1, "b": 11, "c": 21, "d": 32}
        for name in "abcd":
            wr = result[name].work_result
            assert wr.state is ResultState.SUCCESS
            assert wr.attempts == 1
            assert wr.exception is None
            assert wr.thread is not None and wr.thread != threading.current_thread().name
            assert wr.queued_at is not None and wr.started_at is not None
            assert wr.finished_at is not None
            assert wr.queued_at <= wr.started_at <= wr.finished_at
    plan = compile_plan((top,))
    assert all(e >= 0.0 for e in plan.est)  # typical durations measured on the fast path too


def test_a_plain_node_that_fails_then_succeeds_is_retried(pool: ThreadPoolExecutor) -> None:
    calls = []

    def flaky(ctx: Any, param: Any) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("not yet")
        return "ok"

    node = FunctionNode(flaky, name="flaky", retries=3)
    after = FunctionNode(lambda ctx, p: ctx.result_of("flaky") * 2, name="after")
    node >> after
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok
    assert result["flaky"].work_result.attempts == 3
    assert result.outputs["after"] == "okok"


def test_a_plain_node_that_fails_fails_its_sons_fast(pool: ThreadPoolExecutor) -> None:
    def boom(ctx: Any, param: Any) -> None:
        raise KeyError("boom")

    bad = FunctionNode(boom, name="bad")
    son = FunctionNode(add, 1, name="son")
    bad >> son
    result = TaskScheduling.start(bad, executor=pool, timeout=LONG)
    assert result["bad"].work_result.state is ResultState.EXCEPTION
    assert result["son"].work_result.state is ResultState.EXCEPTION
    assert result["son"].work_result.attempts == 0


@pytest.mark.parametrize("join", [Join.ALL, Join.ANY, Join.quorum(2), Join.BEST_EFFORT])
def test_joins_fire_the_same_on_the_fast_path(pool: ThreadPoolExecutor, join: Join) -> None:
    fathers = [FunctionNode(add, k, name=f"f{k}") for k in range(3)]
    son = FunctionNode(lambda ctx, p: "ran", name="son", join=join)
    for f in fathers:
        f >> son
    result = TaskScheduling.start(fathers, executor=pool, timeout=LONG)
    assert result["son"].work_result.state is ResultState.SUCCESS
    assert result.outputs["son"] == "ran"


def test_a_plain_node_finishing_after_the_run_closed_is_dropped(
        pool: ThreadPoolExecutor) -> None:
    entered = threading.Event()
    release = threading.Event()

    def slow(ctx: Any, param: Any) -> str:
        entered.set()
        release.wait(LONG)
        return "late"

    node = FunctionNode(slow, name="slow")
    son = FunctionNode(add, 1, name="son")
    node >> son
    ctx_holder: list[Any] = []

    def cancel_when_entered() -> None:
        entered.wait(LONG)
        ctx_holder[0].cancel("stop")
        release.set()

    from taskflow import TaskContext

    ctx = TaskContext()
    ctx_holder.append(ctx)
    t = threading.Thread(target=cancel_when_entered)
    t.start()
    result = TaskScheduling.start(node, executor=pool, timeout=LONG, context=ctx)
    t.join(LONG)
    assert result["slow"].work_result.state is ResultState.CANCELLED
    assert result["slow"].work_result.result is None  # the late value never overwrote it
    assert result["son"].work_result.state is ResultState.CANCELLED


def test_an_early_join_on_the_fast_path_cancels_the_father_it_no_longer_needs() -> None:
    # the father that fires an ANY join settles it in its own step; the other father, still
    # running, is cancelled there (settled outside the lock) and its late value is dropped
    entered, release = threading.Event(), threading.Event()

    def slow(ctx: Any, param: Any) -> str:
        entered.set()
        release.wait(LONG)
        return "late"

    def fast(ctx: Any, param: Any) -> str:
        entered.wait(LONG)  # the slow father is RUNNING when this one ends
        return "first"

    slow_node = FunctionNode(slow, name="slow")
    fast_node = FunctionNode(fast, name="fast")
    son = FunctionNode(lambda ctx, p: ctx.result_of("fast"), name="son", join=Join.ANY)
    slow_node >> son
    fast_node >> son
    ex = ThreadPoolExecutor(4)
    try:
        result = TaskScheduling.start([slow_node, fast_node], executor=ex, timeout=LONG)
    finally:
        release.set()
        ex.shutdown(wait=True)  # the slow father's loop has handed its late value over
    assert result.outputs["son"] == "first"
    wr = result["slow"].work_result
    assert wr.state is ResultState.CANCELLED
    assert wr.result is None  # the late value never overwrote it
    assert result["fast"].work_result.state is ResultState.SUCCESS
