"""Core scheduling contract (docs/concepts/run.md): runs, discovery, wiring, results, context, isolation."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping, MutableMapping
from concurrent.futures import Future

import pytest
from conftest import EPS, LONG, MEDIUM, SHORT

import taskflow
from taskflow import (
    FlowResult,
    FunctionNode,
    NodeState,
    ResultNotAvailableError,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
)


def const(value):
    return lambda ctx, param: value


def hooked_class(log):
    """A node class whose task is ``param(ctx)`` and whose hooks append to ``log``."""

    class Hooked(SchedulingNode):
        def task(self, ctx, param):
            return param(ctx)

        def on_begin(self, support):
            log.append((support.node.name, "begin", support))

        def on_success(self, support):
            log.append((support.node.name, "success", support))

        def on_fail(self, support):
            log.append((support.node.name, "fail", support))

    return Hooked


def diamond():
    """a -> (b, c) -> d, each adding its fathers' values."""
    a = FunctionNode(const(1), name="a")
    b = FunctionNode(lambda ctx, p: ctx.result_of("a") + 10, name="b")
    c = FunctionNode(lambda ctx, p: ctx.result_of("a") + 100, name="c")
    d = FunctionNode(lambda ctx, p: ctx.result_of("b") + ctx.result_of("c"), name="d")
    a >> [b, c] >> d
    return a, b, c, d


DIAMOND_VALUES = {"a": 1, "b": 11, "c": 101, "d": 112}


# --- basic runs ---------------------------------------------------------------------------------


def test_public_names_are_exported():
    for name in (
        "TaskScheduling",
        "SchedulingNode",
        "FunctionNode",
        "TaskContext",
        "TaskSupport",
        "NodeState",
        "ResultState",
        "WorkResult",
        "FlowResult",
        "Join",
        "run_async",
        "FlowDefinitionError",
        "CycleError",
        "DuplicateNameError",
        "FlowTimeoutError",
        "NodeCancelledError",
        "UpstreamFailedError",
        "RejectedExecutionError",
        "ResultNotAvailableError",
    ):
        assert name in taskflow.__all__, name
        assert hasattr(taskflow, name), name


def test_single_node_runs_and_returns_its_value(make_executor):
    pool = make_executor(2, prefix="tfpool")
    node = FunctionNode(lambda ctx, param: param * 2, param=21, name="double")

    result = TaskScheduling.start(node, executor=pool)

    assert isinstance(result, FlowResult)
    assert result.ok
    assert result.outputs == {"double": 42}
    assert dict(result.failed) == {}
    run = result["double"]
    assert run.state is NodeState.FINISH
    wr = run.work_result
    assert wr.state is ResultState.SUCCESS
    assert wr.result == 42
    assert wr.exception is None
    assert wr.attempts == 1
    assert wr.queued_at <= wr.started_at <= wr.finished_at
    assert wr.duration == pytest.approx(wr.finished_at - wr.started_at, abs=1e-3)
    assert wr.thread.startswith("tfpool")
    assert result.elapsed >= 0


def test_diamond_runs_every_node_once_in_dependency_order(make_executor):
    pool = make_executor(4)
    order: list[str] = []

    def step(ctx, name):
        order.append(name)
        return name

    nodes = {n: FunctionNode(step, param=n, name=n) for n in "abcd"}
    nodes["a"] >> [nodes["b"], nodes["c"]] >> nodes["d"]

    result = TaskScheduling.start(nodes["a"], executor=pool, timeout=LONG)

    assert result.ok
    assert sorted(order) == ["a", "b", "c", "d"]
    assert order[0] == "a" and order[-1] == "d"
    assert result.outputs == {n: n for n in "abcd"}


def test_independent_roots_run_in_parallel(make_executor):
    pool = make_executor(2)
    barrier = threading.Barrier(2)

    def meet(ctx, param):
        barrier.wait(timeout=LONG)  # breaks (-> EXCEPTION) unless both run at once
        return param

    try:
        result = TaskScheduling.start(
            [FunctionNode(meet, param=1, name="x"), FunctionNode(meet, param=2, name="y")],
            executor=pool,
            timeout=LONG,
        )
    finally:
        barrier.abort()
    assert result.ok, result.failed
    assert result.outputs == {"x": 1, "y": 2}


def test_task_receives_its_param(make_executor):
    pool = make_executor(1)

    class Echo(SchedulingNode):
        def task(self, ctx, param):
            return ("echo", param)

    result = TaskScheduling.start(Echo(param={"sku": 1}), executor=pool)

    assert result.outputs == {"Echo": ("echo", {"sku": 1})}


def test_node_name_defaults_to_the_class_name(make_executor):
    class FetchPrice(SchedulingNode):
        def task(self, ctx, param):
            return 9.5

    node = FetchPrice()
    assert node.name == "FetchPrice"
    result = TaskScheduling.start(node, executor=make_executor(1))
    assert result.outputs == {"FetchPrice": 9.5}


def test_function_node_calls_fn_with_ctx_and_param_and_is_named_after_it(make_executor):
    seen = []

    def load_user(ctx, param):
        seen.append((isinstance(ctx, TaskContext), param))
        return f"user-{param}"

    node = FunctionNode(load_user, param=7)
    assert node.name == "load_user"

    result = TaskScheduling.start(node, executor=make_executor(1))

    assert seen == [(True, 7)]
    assert result.outputs == {"load_user": "user-7"}


def test_function_node_passes_options_through(make_executor):
    calls = []

    def flaky(ctx, param):
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("not yet")
        return "done"

    result = TaskScheduling.start(
        FunctionNode(flaky, name="flaky", retries=2), executor=make_executor(1), timeout=LONG
    )

    assert result.outputs == {"flaky": "done"}
    assert result["flaky"].work_result.attempts == 3


def test_empty_node_list_returns_an_empty_ok_result(make_executor):
    result = TaskScheduling.start([], executor=make_executor(1))
    assert result.ok
    assert len(result) == 0
    assert dict(result.outputs) == {}
    assert dict(result.failed) == {}


def test_submit_returns_a_future_of_the_flow_result(make_executor):
    a, *_ = diamond()
    future = TaskScheduling.submit(a, executor=make_executor(2), timeout=LONG)
    assert isinstance(future, Future)
    result = future.result(timeout=LONG)
    assert isinstance(result, FlowResult)
    assert result.outputs == DIAMOND_VALUES


def test_run_async_awaits_the_flow(make_executor):
    a, *_ = diamond()
    pool = make_executor(2)

    async def main():
        return await taskflow.run_async(a, executor=pool, timeout=LONG)

    result = asyncio.run(main())
    assert result.ok
    assert result.outputs == DIAMOND_VALUES


@pytest.mark.parametrize("entry", ["start", "submit"])
def test_run_ends_only_after_every_hook_has_returned(make_executor, entry):
    finished_hooks = []

    class SlowHooks(SchedulingNode):
        def task(self, ctx, param):
            if param == "bad":
                raise ValueError(param)
            return param

        def on_success(self, support):
            time.sleep(SHORT)  # stands in for a hook's work
            finished_hooks.append((self.name, "success"))

        def on_fail(self, support):
            time.sleep(SHORT)
            finished_hooks.append((self.name, "fail"))

    a = SlowHooks(param="a", name="a")
    bad = SlowHooks(param="bad", name="bad")
    son = SlowHooks(param="son", name="son")
    a >> bad >> son
    pool = make_executor(2)

    if entry == "start":
        TaskScheduling.start(a, executor=pool, timeout=LONG)
    else:
        TaskScheduling.submit(a, executor=pool, timeout=LONG).result(timeout=LONG)

    assert sorted(finished_hooks) == [("a", "success"), ("bad", "fail"), ("son", "fail")]


# --- discovery and wiring -----------------------------------------------------------------------


@pytest.mark.parametrize("start_from", ["a", "b", "c", "d", "e", "a+d"])
def test_whole_connected_graph_is_found_from_any_node(make_executor, start_from):
    # a -> b -> d, c -> b, e -> d : starting anywhere reaches the others through both directions
    ran = []

    def mark(ctx, name):
        ran.append(name)
        return name

    n = {k: FunctionNode(mark, param=k, name=k) for k in "abcde"}
    n["a"] >> n["b"] >> n["d"]
    n["c"] >> n["b"]
    n["e"] >> n["d"]
    given = [n[k] for k in start_from.split("+")]

    result = TaskScheduling.start(given if len(given) > 1 else given[0], executor=make_executor(2))

    assert sorted(ran) == list("abcde")
    assert set(result) == set("abcde")
    assert ran.index("d") > max(ran.index("a"), ran.index("b"), ran.index("c"), ran.index("e"))


def test_listing_a_discovered_node_again_runs_it_once(make_executor):
    a, b, c, d = diamond()
    result = TaskScheduling.start([d, a, c, b, a], executor=make_executor(2))
    assert result.outputs == DIAMOND_VALUES


def _wire_son(a, b):
    return a.set_son_handler(b)


def _wire_son_list(a, b):
    return a.set_son_handler([b])


def _wire_father(a, b):
    return b.set_father_handler(a)


def _wire_father_list(a, b):
    return b.set_father_handler([a])


def _wire_depends(a, b):
    return b.depends_on(a)


def _wire_rshift(a, b):
    return a >> b


@pytest.mark.parametrize(
    "wire",
    [_wire_son, _wire_son_list, _wire_father, _wire_father_list, _wire_depends, _wire_rshift],
)
def test_edge_declared_from_either_end_is_recorded_on_both_nodes(make_executor, wire):
    a = FunctionNode(const(5), name="a")
    b = FunctionNode(lambda ctx, p: ctx.result_of("a") * 2, name="b")

    wire(a, b)

    assert b in a.son_handler
    assert a in b.father_handler
    assert not a.father_handler
    assert not b.son_handler
    result = TaskScheduling.start(a, executor=make_executor(1))
    assert result.outputs == {"a": 5, "b": 10}


def test_wiring_methods_return_self_and_take_several_nodes():
    a, b, c, d = (FunctionNode(const(i), name=n) for i, n in enumerate("abcd"))

    assert a.set_son_handler(b, c) is a
    assert d.set_father_handler(b, c) is d
    assert d.depends_on(a, optional=True) is d

    assert set(map(id, a.son_handler)) == {id(b), id(c), id(d)}
    assert set(map(id, d.father_handler)) == {id(a), id(b), id(c)}
    assert a in b.father_handler and a in c.father_handler


def test_edge_declared_from_both_ends_is_one_edge(make_executor):
    runs = []
    a = FunctionNode(const("A"), name="a")
    b = FunctionNode(lambda ctx, p: runs.append(ctx.result_of("a")), name="b")
    a.set_son_handler(b)
    b.set_father_handler(a)
    b.depends_on(a)
    a >> b

    result = TaskScheduling.start(a, executor=make_executor(2))

    assert result.ok
    assert runs == ["A"]
    assert len(result) == 2


def test_rshift_returns_its_right_operand_and_builds_fan_out_and_fan_in():
    a, b, c, d = (FunctionNode(const(i), name=n) for i, n in enumerate("abcd"))

    assert (a >> b) is b
    assert ([b, c] >> d) is d
    a >> [c]

    assert set(map(id, a.son_handler)) == {id(b), id(c)}
    assert set(map(id, d.father_handler)) == {id(b), id(c)}


def test_rshift_chain_expression_builds_a_diamond(make_executor):
    a, b, c, d = diamond()  # built with `a >> [b, c] >> d`
    result = TaskScheduling.start(a, executor=make_executor(2))
    assert result.outputs == DIAMOND_VALUES
    assert set(map(id, d.father_handler)) == {id(b), id(c)}


# --- results, report, gantt -------------------------------------------------------------------


def test_flow_result_is_a_mapping_of_the_runs_nodes(make_executor):
    a, _b, _c, _d = diamond()
    result = TaskScheduling.start(a, executor=make_executor(2))

    assert isinstance(result, Mapping)
    assert len(result) == 4
    assert set(result) == {"a", "b", "c", "d"}
    assert "a" in result and "zzz" not in result
    with pytest.raises(KeyError):
        result["zzz"]
    for name, node in result.items():
        assert isinstance(node, SchedulingNode)
        assert node.name == name
        assert node.state is NodeState.FINISH
        assert node.work_result.state is ResultState.SUCCESS
    assert result.outputs == DIAMOND_VALUES
    assert isinstance(result.flow_id, str) and result.flow_id


def test_values_and_failed_split_successes_from_failures(make_executor):
    def boom(ctx, p):
        raise ValueError("boom")

    ok = FunctionNode(const("fine"), name="ok")
    bad = FunctionNode(boom, name="bad")
    son = FunctionNode(const("never"), name="son")
    bad >> son

    result = TaskScheduling.start([ok, bad], executor=make_executor(2))

    assert not result.ok
    assert result.outputs == {"ok": "fine"}
    assert set(result.failed) == {"bad", "son"}
    assert result.failed["bad"].state is ResultState.EXCEPTION
    assert result.failed["bad"].exception is result["bad"].work_result.exception
    assert result["bad"].state is NodeState.ERROR


def test_each_run_gets_a_new_flow_id(make_executor):
    pool = make_executor(1)
    node = FunctionNode(const(1), name="n")
    ids = {TaskScheduling.start(node, executor=pool).flow_id for _ in range(5)}
    assert len(ids) == 5


def test_report_is_json_ready_and_names_every_node(make_executor):
    a, *_ = diamond()
    result = TaskScheduling.start(a, executor=make_executor(2))

    report = result.report()
    text = report.model_dump_json()
    data = json.loads(text)

    assert isinstance(data, dict)
    for name in "abcd":
        assert f'"{name}"' in text
    assert result.flow_id in text


def test_to_mermaid_is_a_gantt_chart_naming_every_node(make_executor):
    a, *_ = diamond()
    result = TaskScheduling.start(a, executor=make_executor(2))

    chart = result.to_mermaid()

    assert isinstance(chart, str)
    assert chart.lstrip().startswith("gantt")
    for name in "abcd":
        assert name in chart


def test_report_and_gantt_cover_failed_timed_out_and_never_started_nodes(make_executor, gate):
    release = gate()

    def boom(ctx, p):
        raise ValueError('boom <b> & "quotes"')

    ok = FunctionNode(const(1), name="ok")
    bad = FunctionNode(boom, name="bad")
    son = FunctionNode(const(2), name="son")
    stuck = FunctionNode(lambda c, p: release.wait(LONG), name="stuck")
    after = FunctionNode(const(3), name="after")
    ok >> [bad, stuck]
    bad >> son
    stuck >> after

    result = TaskScheduling.start(ok, executor=make_executor(2), timeout=4 * SHORT)
    release.set()

    assert {n: result[n].work_result.state for n in result} == {
        "ok": ResultState.SUCCESS,
        "bad": ResultState.EXCEPTION,
        "son": ResultState.EXCEPTION,
        "stuck": ResultState.TIMEOUT,
        "after": ResultState.TIMEOUT,
    }
    text = result.report().model_dump_json()
    data = json.loads(text)
    assert isinstance(data, dict)
    for name in ("ok", "bad", "son", "stuck", "after"):
        assert f'"{name}"' in text
    assert "boom" in text, "the report carries the failure"
    chart = result.to_mermaid()
    assert chart.lstrip().startswith("gantt")
    for name in ("ok", "bad", "stuck"):
        assert name in chart


def test_context_can_serve_one_run_after_another(make_executor):
    pool = make_executor(1)
    ctx = TaskContext()
    node = FunctionNode(lambda c, p: c.incr("runs"), name="n")

    first = TaskScheduling.start(node, executor=pool, context=ctx, timeout=LONG)
    first_id = ctx.flow_id
    second = TaskScheduling.start(node, executor=pool, context=ctx, timeout=LONG)

    assert first.ok and second.ok
    assert first.flow_id == first_id
    assert ctx.flow_id == second.flow_id != first.flow_id
    assert second.outputs == {"n": 2}


# --- context --------------------------------------------------------------------------------------


def test_sons_see_their_fathers_results_through_the_context(make_executor):
    a, *_ = diamond()
    result = TaskScheduling.start(a, executor=make_executor(2))
    assert result.outputs == DIAMOND_VALUES


def test_context_writes_are_seen_by_sons_and_by_the_caller(make_executor):
    ctx = TaskContext()

    def writer(c, p):
        c["token"] = "t-1"

    def reader(c, p):
        return c["token"] + "!"

    w = FunctionNode(writer, name="writer")
    r = FunctionNode(reader, name="reader")
    w >> r

    result = TaskScheduling.start(w, executor=make_executor(2), context=ctx)

    assert result.outputs["reader"] == "t-1!"
    assert ctx["token"] == "t-1"
    assert ctx.flow_id == result.flow_id


def test_context_is_a_mutable_mapping_built_from_a_mapping_or_kwargs():
    from_mapping = TaskContext({"a": 1, "b": 2})
    from_kwargs = TaskContext(a=1, b=2)
    for ctx in (from_mapping, from_kwargs):
        assert isinstance(ctx, MutableMapping)
        assert len(ctx) == 2
        assert sorted(ctx) == ["a", "b"]
        assert "a" in ctx and "z" not in ctx
        assert ctx.get("z") is None and ctx.get("z", 3) == 3
        ctx["c"] = 3
        ctx["d"] = 4
        assert ctx["c"] == 3 and ctx.get("d") == 4
        del ctx["a"]
        assert "a" not in ctx and len(ctx) == 3
    assert TaskContext().cancelled is False
    assert TaskContext().remaining() == math.inf


def test_context_incr_is_atomic_across_100_parallel_nodes(make_executor):
    ctx = TaskContext()
    nodes = [FunctionNode(lambda c, p: c.incr("hits"), name=f"n{i}") for i in range(100)]

    result = TaskScheduling.start(nodes, executor=make_executor(8), context=ctx, timeout=LONG)

    assert result.ok
    assert ctx["hits"] == 100
    assert sorted(result.outputs.values()) == list(range(1, 101))


def test_incr_adds_n_and_returns_the_new_value():
    ctx = TaskContext({"k": 5})
    assert ctx.incr("k") == 6
    assert ctx.incr("k", 10) == 16
    assert ctx.incr("new", 2) == 2
    assert ctx["k"] == 16


def test_result_of_a_failed_or_unfinished_node_is_a_clear_lookup_error(make_executor):
    errors = {}

    def boom(ctx, p):
        raise ValueError("no")

    def probe(ctx, p):
        for name in ("bad", "later", "nonexistent"):
            try:
                ctx.result_of(name)
            except LookupError as exc:
                errors[name] = exc
        return ctx.result_of("good")

    good = FunctionNode(const("G"), name="good")
    bad = FunctionNode(boom, name="bad")
    checker = FunctionNode(probe, name="checker")
    later = FunctionNode(const("L"), name="later")
    # checker waits for good and (optionally) bad; later runs after checker
    checker.depends_on(good).depends_on(bad, optional=True)
    checker >> later

    result = TaskScheduling.start(checker, executor=make_executor(2), timeout=LONG)

    assert result.outputs["checker"] == "G"
    assert set(errors) == {"bad", "later", "nonexistent"}
    assert isinstance(errors["bad"], ResultNotAvailableError)
    assert isinstance(errors["later"], ResultNotAvailableError)
    assert "bad" in str(errors["bad"]) and "later" in str(errors["later"])


def test_remaining_is_inf_without_budget_and_bounded_with_one(make_executor):
    pool = make_executor(1)
    seen = []
    node = FunctionNode(lambda ctx, p: seen.append(ctx.remaining()), name="n")

    TaskScheduling.start(node, executor=pool)
    TaskScheduling.start(node, executor=pool, timeout=math.inf)
    TaskScheduling.start(node, executor=pool, timeout=LONG)

    assert seen[0] == math.inf and seen[1] == math.inf
    assert 0 < seen[2] <= LONG


def test_support_given_to_hooks_describes_the_run(make_executor):
    log = []
    Hooked = hooked_class(log)
    ctx = TaskContext()
    a = Hooked(param=lambda c: "A", name="a")
    b = Hooked(param=lambda c: c.result_of("a") + "B", name="b")
    a >> b

    result = TaskScheduling.start(a, executor=make_executor(2), context=ctx)

    assert result.outputs == {"a": "A", "b": "AB"}
    kinds = [(name, kind) for name, kind, _ in log]
    assert kinds.count(("a", "begin")) == 1 and kinds.count(("a", "success")) == 1
    assert kinds.count(("b", "begin")) == 1 and kinds.count(("b", "success")) == 1
    assert not [k for k in kinds if k[1] == "fail"]
    begin_b = next(s for n, k, s in log if (n, k) == ("b", "begin"))
    success_b = next(s for n, k, s in log if (n, k) == ("b", "success"))
    assert begin_b.attempt == 1
    assert success_b.node is result["b"]
    assert success_b.work_result is result["b"].work_result
    assert success_b.work_result.result == "AB"
    assert success_b.context is ctx
    assert set(success_b.fathers) == {"a"}
    assert success_b.fathers["a"].result == "A"
    assert success_b.fathers["a"].state is ResultState.SUCCESS


# --- isolation: the nodes passed in are a definition, never run state ----------------------------


def _public_snapshot(node):
    wr = node.work_result
    return (
        node.state,
        wr.state,
        wr.result,
        wr.exception,
        wr.attempts,
        [id(n) for n in node.father_handler],
        [id(n) for n in node.son_handler],
    )


def test_start_never_mutates_the_nodes_passed_in(make_executor, gate):
    pool = make_executor(2)
    release = gate()

    def boom(ctx, p):
        raise ValueError("x")

    a = FunctionNode(const(1), name="a")
    bad = FunctionNode(boom, name="bad")
    slow = FunctionNode(lambda c, p: release.wait(LONG), name="slow")
    son = FunctionNode(const(2), name="son")
    a >> [bad, slow]
    bad >> son
    nodes = [a, bad, slow, son]
    before = [_public_snapshot(n) for n in nodes]
    assert all(n.state is NodeState.INIT for n in nodes)
    assert all(n.work_result.state is ResultState.DEFAULT for n in nodes)

    results = [TaskScheduling.start(a, executor=pool, timeout=4 * SHORT) for _ in range(2)]
    release.set()

    assert [_public_snapshot(n) for n in nodes] == before
    for result in results:
        assert result["a"] is not a
        assert result["a"].work_result.state is ResultState.SUCCESS
        assert result["bad"].work_result.state is ResultState.EXCEPTION
        assert result["slow"].work_result.state is ResultState.TIMEOUT
    assert results[0]["a"] is not results[1]["a"]


def test_task_and_hooks_run_on_the_runs_copy_of_the_node(make_executor):
    selves = {}

    class Probe(SchedulingNode):
        def task(self, ctx, param):
            selves["task"] = self
            return 1

        def on_success(self, support):
            selves["hook"] = self
            selves["support.node"] = support.node

    original = Probe(name="p")
    result = TaskScheduling.start(original, executor=make_executor(1))

    assert selves["task"] is result["p"]
    assert selves["hook"] is result["p"]
    assert selves["support.node"] is result["p"]
    assert result["p"] is not original
    assert original.state is NodeState.INIT


def test_64_threads_share_one_graph_without_cross_talk(make_executor):
    pool = make_executor(8)
    runs_per_thread = 5
    executions = []

    def source(ctx, p):
        executions.append(1)
        return ctx["run_id"] * 1000

    def left(ctx, p):
        executions.append(1)
        return ctx.result_of("source") + 1

    def right(ctx, p):
        executions.append(1)
        return ctx.result_of("source") + 2

    def sink(ctx, p):
        executions.append(1)
        return (ctx["run_id"], ctx.result_of("left") + ctx.result_of("right"))

    src = FunctionNode(source, name="source")
    (
        src
        >> [FunctionNode(left, name="left"), FunctionNode(right, name="right")]
        >> FunctionNode(sink, name="sink")
    )
    barrier = threading.Barrier(64)
    problems: list[str] = []

    def caller(tid):
        try:
            barrier.wait(timeout=LONG)
            for i in range(runs_per_thread):
                run_id = tid * 100 + i
                ctx = TaskContext({"run_id": run_id})
                result = TaskScheduling.start(src, executor=pool, context=ctx, timeout=LONG)
                expected = {
                    "source": run_id * 1000,
                    "left": run_id * 1000 + 1,
                    "right": run_id * 1000 + 2,
                    "sink": (run_id, 2 * run_id * 1000 + 3),
                }
                if not result.ok or dict(result.outputs) != expected:
                    problems.append(
                        f"run {run_id}: {dict(result.outputs)} failed={dict(result.failed)}"
                    )
        except BaseException as exc:  # noqa: BLE001 - report it, never leave it unseen
            problems.append(f"thread {tid}: {exc!r}")
            barrier.abort()

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # amplify races
    threads = [threading.Thread(target=caller, args=(t,), name=f"caller-{t}") for t in range(64)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=2 * LONG)
    finally:
        sys.setswitchinterval(old_interval)
        barrier.abort()
    assert not any(t.is_alive() for t in threads)
    assert problems == []
    assert len(executions) == 64 * runs_per_thread * 4
    assert src.state is NodeState.INIT


# --- contextvars ------------------------------------------------------------------------------


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def test_caller_contextvars_are_visible_in_tasks_and_hooks(make_executor):
    seen = []

    class Traced(SchedulingNode):
        def task(self, ctx, param):
            seen.append(("task", self.name, REQUEST_ID.get()))

        def on_begin(self, support):
            seen.append(("begin", self.name, REQUEST_ID.get()))

        def on_success(self, support):
            seen.append(("success", self.name, REQUEST_ID.get()))

    a, b = Traced(name="a"), Traced(name="b")
    a >> b
    pool = make_executor(2)
    pool.submit(REQUEST_ID.set, "polluted-worker").result()  # a worker's own context must not win

    token = REQUEST_ID.set("req-42")
    try:
        TaskScheduling.start(a, executor=pool, timeout=LONG)
    finally:
        REQUEST_ID.reset(token)

    assert len(seen) == 6
    assert {value for _, _, value in seen} == {"req-42"}


def test_concurrent_callers_each_see_their_own_contextvars(make_executor):
    pool = make_executor(2)
    seen: dict[str, list[str]] = {"r1": [], "r2": []}
    barrier = threading.Barrier(2)

    def record(ctx, param):
        seen[ctx["caller"]].append(REQUEST_ID.get())

    nodes = [FunctionNode(record, name=f"n{i}") for i in range(6)]
    for x, y in itertools.pairwise(nodes):
        x >> y

    def caller(name):
        REQUEST_ID.set(name)
        barrier.wait(timeout=LONG)
        TaskScheduling.start(nodes[0], executor=pool, context=TaskContext({"caller": name}))

    threads = [threading.Thread(target=caller, args=(n,)) for n in ("r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG)
    assert seen == {"r1": ["r1"] * 6, "r2": ["r2"] * 6}


# --- logging ------------------------------------------------------------------------------------


def test_logs_are_bound_with_flow_id_and_node(make_executor, taskflow_logs):
    def boom(ctx, p):
        raise ValueError("boom")

    ok = FunctionNode(const(1), name="fine")
    bad = FunctionNode(boom, name="broken")

    result = TaskScheduling.start([ok, bad], executor=make_executor(2))

    mine = [r for r in taskflow_logs if r["extra"].get("flow_id") == result.flow_id]
    assert mine, "no record bound with the run's flow_id"
    assert any(r["extra"].get("node") == "fine" for r in mine)
    assert any(
        r["extra"].get("node") == "broken" and r["level"].no >= 30
        for r in mine  # WARNING+
    ), "a node ending EXCEPTION is logged at WARNING with its name bound"
    assert any(r["level"].name == "DEBUG" for r in mine), "transitions are logged at DEBUG"


def test_library_logs_are_disabled_until_enabled():
    script = textwrap.dedent(
        """
        from concurrent.futures import ThreadPoolExecutor
        from loguru import logger
        import taskflow
        records = []
        logger.remove()
        logger.add(records.append, level="TRACE")
        def boom(ctx, p):
            raise ValueError("boom")
        with ThreadPoolExecutor(1) as pool:
            taskflow.TaskScheduling.start(taskflow.FunctionNode(boom, name="b"), executor=pool)
            assert records == [], records
            logger.enable("taskflow")
            taskflow.TaskScheduling.start(taskflow.FunctionNode(boom, name="b"), executor=pool)
            assert records, "enabled logs produced nothing"
        print("OK")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OK"


def test_fast_flow_returns_promptly(make_executor):
    a, *_ = diamond()
    t0 = time.monotonic()
    result = TaskScheduling.start(a, executor=make_executor(2), timeout=LONG)
    assert time.monotonic() - t0 < min(LONG / 2, MEDIUM + EPS)
    assert result.ok
