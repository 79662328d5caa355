"""Detached nodes (``detach=True``): the run returns without them, they run under their own
timeout holding one slot of the process's bound, their hooks run once when they end, and every
other node keeps its guarantees (hooks exactly once, none after ``start`` returns)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import remote_tasks
from conftest import LONG, PROMPT, SHORT, HookLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskflow
from taskflow import (
    Bulkhead,
    DetachedRefusedError,
    FanOutNode,
    FlowDefinitionError,
    FlowStatus,
    FunctionNode,
    InvalidNodeError,
    NodeState,
    NodeTimeoutError,
    ResultNotAvailableError,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    ThreadPool,
)
from taskflow.resilience import detached

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings(
        "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"),
]


@pytest.fixture
def bound() -> Iterator[Callable[[int], None]]:
    """``set_max_detached`` for one test, the process's bound restored after it."""
    before = detached.max_detached()
    yield taskflow.set_max_detached
    taskflow.set_max_detached(before)


@pytest.fixture(autouse=True)
def no_slot_left_held() -> Iterator[None]:
    """Every detached node of a test has given its slot back when the test ends."""
    before = detached.metrics().running
    yield
    assert detached.metrics().running == before


def hooked(log: HookLog, task: Callable[[TaskContext, Any], Any]) -> type[SchedulingNode[Any, Any]]:
    """A node class whose hooks write to ``log`` and whose task is ``task``."""

    class Hooked(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            return task(ctx, param)

        def on_success(self, support: Any) -> None:
            log.record(self.name, "success")

        def on_fail(self, support: Any) -> None:
            log.record(self.name, "fail")

    return Hooked


def blocked_until(started: threading.Event, release: threading.Event,
                  value: Any = "written") -> Callable[[TaskContext, Any], Any]:
    def task(ctx: TaskContext, param: Any) -> Any:
        started.set()
        assert release.wait(LONG)
        return value
    return task


# -- the run does not wait ---------------------------------------------------------------------

def test_start_returns_while_the_detached_node_is_still_blocked(make_executor, gate) -> None:
    started, release = gate(), gate()
    log = HookLog()
    render = hooked(log, lambda ctx, p: "html")(name="render")
    audit = hooked(log, blocked_until(started, release))(name="audit", detach=True,
                                                         timeout=LONG)
    render >> audit
    pool = make_executor(2)

    result = TaskScheduling.start(render, executor=pool, timeout=LONG)
    log.returned = True

    assert result.status is FlowStatus.COMPLETED and result.ok
    assert result.result_of("audit").state is ResultState.DETACHED
    assert result["audit"].state is NodeState.WORKING
    assert "audit" not in result.outputs and "audit" not in result.failed
    future = result.detached("audit")
    assert started.wait(LONG)
    assert not future.done()
    assert log.count("audit", "success") == 0
    release.set()
    final = future.result(LONG)
    assert final.state is ResultState.SUCCESS and final.result == "written"
    assert final.attempts == 1 and final.duration is not None
    assert log.count("audit", "success") == 1 and log.count("audit", "fail") == 0
    assert log.count("render", "success") == 1
    assert log.late == [("audit", "success")]  # only the detached node's hook after return
    # the run's own record keeps saying "handed off"
    assert result.result_of("audit").state is ResultState.DETACHED


def test_a_detached_node_runs_once_its_fathers_succeed_and_reads_them(make_executor) -> None:
    seen: list[Any] = []

    def audit(ctx: TaskContext, param: Any) -> str:
        seen.append((ctx.result_of("a"), ctx.result_of("b"), ctx["user"], ctx.cancelled))
        ctx["audited"] = True
        return "ok"

    a = FunctionNode(lambda ctx, p: 1, name="a")
    b = FunctionNode(lambda ctx, p: 2, name="b")
    node = FunctionNode(audit, name="audit", detach=True, timeout=LONG)
    [a, b] >> node
    ctx = TaskContext(user="u1")
    result = TaskScheduling.start([a, b], executor=make_executor(2), timeout=LONG, context=ctx)
    assert result.detached("audit").result(LONG).state is ResultState.SUCCESS
    assert seen == [(1, 2, "u1", False)]
    assert result.context["audited"] is True


def test_a_failed_father_fails_the_detached_node_fast_without_starting_it(make_executor) -> None:
    calls: list[int] = []

    def boom(ctx: TaskContext, p: Any) -> None:
        raise ValueError("no page")

    a = FunctionNode(boom, name="a")
    audit = FunctionNode(lambda ctx, p: calls.append(1), name="audit", detach=True,
                         timeout=LONG)
    a >> audit
    result = TaskScheduling.start(a, executor=make_executor(2), timeout=LONG)
    assert result.result_of("audit").state is ResultState.EXCEPTION
    assert result.detached("audit").result(0).state is ResultState.EXCEPTION
    assert calls == []


def test_a_detached_node_retries_within_its_own_timeout(make_executor) -> None:
    attempts: list[int] = []

    def flaky(ctx: TaskContext, p: Any) -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError(f"attempt {len(attempts)} refused")
        return "stored"

    audit = FunctionNode(flaky, name="audit", detach=True, timeout=LONG, retries=3,
                         retry_backoff=SHORT / 5)
    result = TaskScheduling.start(audit, executor=make_executor(2), timeout=LONG)
    final = result.detached("audit").result(LONG)
    assert final.state is ResultState.SUCCESS and final.result == "stored"
    assert final.attempts == 3 and len(attempts) == 3


def test_a_detached_node_that_raises_ends_exception_and_its_on_fail_is_told(
        make_executor) -> None:
    told: list[Any] = []

    class Audit(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            raise OSError("disk full")

        def on_fail(self, support: Any) -> None:
            told.append((support.work_result.state, support.work_result.exception))

    result = TaskScheduling.start(Audit(name="audit", detach=True, timeout=LONG),
                                  executor=make_executor(2), timeout=LONG)
    final = result.detached("audit").result(LONG)
    assert final.state is ResultState.EXCEPTION and isinstance(final.exception, OSError)
    assert told == [(ResultState.EXCEPTION, final.exception)]
    assert result.ok  # the run had returned COMPLETED: it did not wait for the audit


def test_a_raising_hook_of_a_detached_node_is_logged_and_changes_nothing(
        make_executor, taskflow_logs) -> None:
    class Audit(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            return 1

        def on_success(self, support: Any) -> None:
            raise RuntimeError("hook broke")

    result = TaskScheduling.start(Audit(name="audit", detach=True, timeout=LONG),
                                  executor=make_executor(2), timeout=LONG)
    assert result.detached("audit").result(LONG).state is ResultState.SUCCESS
    assert any("hook on_success of detached node audit raised" in str(r["message"])
               for r in taskflow_logs)


# -- the bound -----------------------------------------------------------------------------

def test_a_detached_node_is_refused_when_every_slot_is_taken(make_executor, gate,
                                                             bound) -> None:
    bound(1)
    before = detached.metrics()
    started, release = gate(), gate()
    told: list[Any] = []

    class Audit(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            return blocked_until(started, release)(ctx, param)

        def on_fail(self, support: Any) -> None:
            told.append(support.work_result.exception)

    pool = make_executor(3)
    first = TaskScheduling.start(Audit(name="audit", detach=True, timeout=LONG), executor=pool,
                                 timeout=LONG)
    assert started.wait(LONG)
    assert detached.metrics().running == before.running + 1
    second = TaskScheduling.start(Audit(name="audit", detach=True, timeout=LONG),
                                  executor=pool, timeout=LONG)
    wr = second.result_of("audit")
    assert wr.state is ResultState.EXCEPTION
    assert isinstance(wr.exception, DetachedRefusedError)
    assert wr.exception.node == "audit" and wr.exception.limit == 1
    assert "set_max_detached" in str(wr.exception)
    assert told == [wr.exception]  # on_fail ran before start returned, told why
    assert second.status is FlowStatus.COMPLETED_WITH_ERRORS and second.ok
    assert second.detached("audit").result(0) is wr
    assert detached.metrics().refused == before.refused + 1
    release.set()
    assert first.detached("audit").result(LONG).state is ResultState.SUCCESS
    after = detached.metrics()
    assert after.running == before.running and after.succeeded == before.succeeded + 1


def test_the_timeout_of_a_detached_node_ends_it_and_frees_its_slot(make_executor, gate,
                                                                  bound) -> None:
    bound(1)
    started, release = gate(), gate()
    cancelled = threading.Event()
    log = HookLog()

    def hang(ctx: TaskContext, p: Any) -> str:
        ctx.on_cancel(cancelled.set)
        started.set()
        release.wait(LONG)
        return "late"

    Hooked = hooked(log, hang)
    before = detached.metrics()
    result = TaskScheduling.start(Hooked(name="audit", detach=True, timeout=SHORT * 4),
                                  executor=make_executor(2), timeout=LONG)
    final = result.detached("audit").result(LONG)
    assert final.state is ResultState.TIMEOUT
    assert isinstance(final.exception, NodeTimeoutError)
    assert cancelled.wait(PROMPT)  # its attempt was abandoned: on_cancel ran
    assert log.kinds("audit") == ["fail"]
    after = detached.metrics()
    assert after.running == before.running and after.failed == before.failed + 1
    # the slot is free again: another detached node is not refused
    again = TaskScheduling.start(FunctionNode(lambda ctx, p: 1, name="again", detach=True,
                                              timeout=LONG),
                                 executor=make_executor(2), timeout=LONG)
    assert again.detached("again").result(LONG).state is ResultState.SUCCESS
    release.set()  # the abandoned attempt returns: its late value is dropped
    assert log.kinds("audit") == ["fail"]


def test_a_detached_node_sees_its_own_deadline_not_the_run_s(make_executor) -> None:
    seen: list[float | None] = []
    returned = threading.Event()

    def audit(ctx: TaskContext, p: Any) -> None:
        assert returned.wait(LONG)  # after start returned, the run's budget no longer counts
        seen.append(ctx.timeout())
        seen.append(ctx.remaining())

    node = FunctionNode(audit, name="audit", detach=True, timeout=LONG)
    result = TaskScheduling.start(node, executor=make_executor(2), timeout=SHORT)
    returned.set()
    assert result.detached("audit").result(LONG).state is ResultState.SUCCESS
    t, left = seen
    assert t is not None and SHORT < t <= LONG
    assert SHORT < left <= LONG


# -- the run's end does not cancel a started detached node -----------------------------------

def test_ctx_cancel_does_not_cancel_a_started_detached_node(make_executor, gate) -> None:
    started, release = gate(), gate()
    audit = FunctionNode(blocked_until(started, release), name="audit", detach=True,
                         timeout=LONG)

    def cancel_after_audit(ctx: TaskContext, p: Any) -> None:
        assert started.wait(LONG)
        ctx.cancel("page done")

    root = FunctionNode(lambda ctx, p: 1, name="root")
    closer = FunctionNode(cancel_after_audit, name="closer")
    root >> [audit, closer]
    result = TaskScheduling.start(root, executor=make_executor(3), timeout=LONG)
    assert result.status is FlowStatus.CANCELLED
    assert result.result_of("audit").state is ResultState.DETACHED
    future = result.detached("audit")
    assert not future.done()
    release.set()
    assert future.result(LONG).state is ResultState.SUCCESS


def test_the_run_s_deadline_does_not_cancel_a_started_detached_node(make_executor,
                                                                    gate) -> None:
    started, release, hold = gate(), gate(), gate()
    audit = FunctionNode(blocked_until(started, release), name="audit", detach=True,
                         timeout=LONG)

    def slow(ctx: TaskContext, p: Any) -> None:
        assert started.wait(LONG)
        hold.wait(LONG)

    root = FunctionNode(lambda ctx, p: 1, name="root")
    root >> [audit, FunctionNode(slow, name="slow")]
    result = TaskScheduling.start(root, executor=make_executor(3), timeout=SHORT * 4)
    assert result.status is FlowStatus.TIMED_OUT
    assert result.result_of("slow").state is ResultState.TIMEOUT
    assert result.result_of("audit").state is ResultState.DETACHED
    hold.set()
    release.set()
    assert result.detached("audit").result(LONG).state is ResultState.SUCCESS


def test_a_detached_node_not_started_when_the_run_ends_never_starts(make_executor,
                                                                    gate) -> None:
    hold = gate()
    calls: list[int] = []
    log = HookLog()
    Hooked = hooked(log, lambda ctx, p: calls.append(1))
    slow = FunctionNode(lambda ctx, p: hold.wait(LONG), name="slow")
    audit = Hooked(name="audit", detach=True, timeout=LONG)
    slow >> audit
    result = TaskScheduling.start(slow, executor=make_executor(2), timeout=SHORT * 2)
    log.returned = True
    assert result.status is FlowStatus.TIMED_OUT
    wr = result.result_of("audit")
    assert wr.state is ResultState.TIMEOUT
    assert result.detached("audit").result(0) is wr
    assert log.kinds("audit") == ["fail"] and log.late == []  # hooked before start returned
    hold.set()
    assert calls == []


# -- executors -----------------------------------------------------------------------------

def test_a_one_worker_pool_runs_the_page_and_then_the_detached_node(gate) -> None:
    order: list[str] = []
    with ThreadPool(1, name="one") as pool:
        root = FunctionNode(lambda ctx, p: order.append("root"), name="root")
        page = FunctionNode(lambda ctx, p: order.append("page"), name="page")
        audit = FunctionNode(lambda ctx, p: order.append("audit"), name="audit", detach=True,
                             timeout=LONG)
        root >> [page, audit]
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
        assert result.ok
        assert result.detached("audit").result(LONG).state is ResultState.SUCCESS
    assert sorted(order) == ["audit", "page", "root"]


def test_a_nested_run_on_the_same_pool_hands_its_detached_node_off(make_executor) -> None:
    pool = make_executor(1)
    inner_audit = FunctionNode(lambda ctx, p: "in", name="inner_audit", detach=True,
                               timeout=LONG)
    futures: list[Any] = []

    def outer(ctx: TaskContext, p: Any) -> None:
        inner = TaskScheduling.start(inner_audit, executor=pool, timeout=LONG)
        futures.append(inner.detached("inner_audit"))

    TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool, timeout=LONG)
    assert futures[0].result(LONG).state is ResultState.SUCCESS


def test_submit_hands_off_a_detached_node_too(make_executor) -> None:
    node = FunctionNode(lambda ctx, p: 5, name="audit", detach=True, timeout=LONG)
    result = TaskScheduling.submit(node, executor=make_executor(2), timeout=LONG).result(LONG)
    assert result.detached("audit").result(LONG).result == 5


def test_detached_on_a_process_executor_is_refused_naming_it() -> None:
    pool = ProcessPoolExecutor(1)
    try:
        node = FunctionNode(remote_tasks.const, name="audit", detach=True, timeout=1.0)
        with pytest.raises(FlowDefinitionError,
                           match="node 'audit': detach is not supported on ProcessPoolExecutor"):
            TaskScheduling.start(node, executor=pool, timeout=LONG)
    finally:
        pool.shutdown()


# -- bad input, before anything runs -----------------------------------------------------------

@pytest.mark.parametrize("timeout", [None, math.inf, 1e12])
def test_detach_without_a_finite_timeout_is_refused_naming_the_node(timeout: Any) -> None:
    with pytest.raises(FlowDefinitionError, match="node 'audit': detach=True needs a finite "
                                                  "timeout"):
        FunctionNode(lambda ctx, p: None, name="audit", detach=True, timeout=timeout)


def test_clearing_the_timeout_of_a_detached_node_is_refused() -> None:
    node = FunctionNode(lambda ctx, p: None, name="audit", detach=True, timeout=1.0)
    with pytest.raises(FlowDefinitionError, match="'audit'.*finite timeout"):
        node.timeout = None
    assert node.timeout == 1.0


def test_detaching_a_node_without_timeout_later_is_refused() -> None:
    node = FunctionNode(lambda ctx, p: None, name="audit")
    with pytest.raises(FlowDefinitionError, match="'audit'.*finite timeout"):
        node.detach = True
    node.timeout = 1.0
    node.detach = True
    assert node.detach is True


def test_detach_must_be_a_bool() -> None:
    with pytest.raises(FlowDefinitionError, match="node 'audit': detach must be True or False"):
        FunctionNode(lambda ctx, p: None, name="audit", detach=1, timeout=1.0)  # type: ignore[arg-type]


def test_a_detached_node_with_sons_is_refused_before_anything_runs(make_executor) -> None:
    calls: list[str] = []
    audit = FunctionNode(lambda ctx, p: calls.append("audit"), name="audit", detach=True,
                         timeout=1.0)
    after = FunctionNode(lambda ctx, p: calls.append("after"), name="after")
    audit >> after
    with pytest.raises(FlowDefinitionError,
                       match="node 'audit' is detached .* but has sons \\('after'\\)"):
        TaskScheduling.start(audit, executor=make_executor(1), timeout=LONG)
    assert calls == []


@pytest.mark.parametrize("option", [
    {"bulkhead": Bulkhead("detached-bulkhead", max_concurrent=1)},
    {"fallback": 0},
    {"min_budget": 0.1},
])
def test_options_that_act_within_a_run_are_refused_with_detach(option: dict[str, Any]) -> None:
    (name,) = option
    with pytest.raises(FlowDefinitionError, match=f"node 'audit': detach=True .*{name}"):
        FunctionNode(lambda ctx, p: None, name="audit", detach=True, timeout=1.0, **option)


def test_a_fan_out_cannot_be_detached() -> None:
    class Fan(FanOutNode[Any]):
        def items(self, ctx: TaskContext, param: Any) -> list[int]:
            return [1]

        def work(self, ctx: TaskContext, item: Any) -> Any:
            return item

    with pytest.raises(InvalidNodeError, match="unknown option 'detach'"):
        Fan(name="fan", detach=True, timeout=1.0)  # type: ignore[call-arg]
    fan = Fan(name="fan", timeout=1.0)
    with pytest.raises(FlowDefinitionError, match="'fan': a fanout node cannot be detached"):
        fan.detach = True


def test_detached_of_a_node_that_is_not_detached_is_refused(make_executor) -> None:
    result = TaskScheduling.start(FunctionNode(lambda ctx, p: 1, name="page"),
                                  executor=make_executor(1), timeout=LONG)
    with pytest.raises(ResultNotAvailableError, match="not a detached node"):
        result.detached("page")
    with pytest.raises(KeyError):
        result.detached("nope")


# -- the guarantees of the other nodes, on random graphs ----------------------------------------

@st.composite
def graphs_with_a_detached_sink(draw: Any) -> tuple[list[list[int]], list[str], list[int]]:
    n = draw(st.integers(1, 8))
    fathers = [sorted(draw(st.sets(st.integers(0, j - 1), max_size=3))) if j else []
               for j in range(n)]
    kinds = [draw(st.sampled_from(["ok", "ok", "raise"])) for _ in range(n)]
    detached_fathers = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3)))
    return fathers, kinds, detached_fathers


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(graphs_with_a_detached_sink())
def test_every_other_node_s_hooks_run_once_before_start_returns(
        make_executor: Any, graph: tuple[list[list[int]], list[str], list[int]]) -> None:
    fathers, kinds, detached_fathers = graph
    log = HookLog()

    def task_of(kind: str) -> Callable[[TaskContext, Any], Any]:
        def task(ctx: TaskContext, p: Any) -> Any:
            if kind == "raise":
                raise ValueError("boom")
            return 1
        return task

    nodes = [hooked(log, task_of(k))(name=f"n{j}") for j, k in enumerate(kinds)]
    for j, fs in enumerate(fathers):
        for f in fs:
            nodes[f] >> nodes[j]
    sink = hooked(log, lambda ctx, p: "audited")(name="audit", detach=True, timeout=LONG)
    for f in detached_fathers:
        nodes[f] >> sink
    pool = make_executor(2)
    result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    log.returned = True
    for node in nodes:
        assert len(log.kinds(node.name)) == 1, node.name
    assert all(name == "audit" for name, _ in log.late)
    final = result.detached("audit").result(LONG)
    assert log.kinds("audit") == ["success" if final.state is ResultState.SUCCESS else "fail"]
    handed_off = result.result_of("audit").state is ResultState.DETACHED
    assert handed_off == all(kinds[f] == "ok" and result.result_of(f"n{f}").state
                             is ResultState.SUCCESS for f in detached_fathers)


def test_an_override_answers_a_detached_node_in_its_hand_off(make_executor) -> None:
    audit = FunctionNode(lambda ctx, p: 1 / 0, name="audit", detach=True, timeout=LONG)
    result = TaskScheduling.start(audit, executor=make_executor(1), timeout=LONG,
                                  overrides={"audit": "stub"})
    assert result.result_of("audit").state is ResultState.DETACHED
    assert result.detached("audit").result(LONG).result == "stub"


def test_many_pages_leave_no_thread_and_no_slot_behind(bound) -> None:
    bound(4)
    before = {t for t in threading.enumerate() if t.is_alive()}
    results = []
    with ThreadPool(4, name="pages") as pool:
        page = FunctionNode(lambda ctx, p: "html", name="page")
        page >> FunctionNode(lambda ctx, p: "audited", name="audit", detach=True,
                             timeout=LONG)
        for _ in range(40):
            results.append(TaskScheduling.start(page, executor=pool, timeout=LONG))
        finals = [r.detached("audit").result(LONG) for r in results]
    refused = [r for r in results if r.result_of("audit").state is ResultState.EXCEPTION]
    assert all(isinstance(r.result_of("audit").exception, DetachedRefusedError)
               for r in refused)
    handed = [f for f, r in zip(finals, results, strict=True) if r not in refused]
    assert handed and all(f.state is ResultState.SUCCESS for f in handed)
    assert detached.metrics().running == 0
    left = {t for t in threading.enumerate() if t.is_alive()} - before
    assert not [t.name for t in left if not t.name.startswith(("taskflow-timer",
                                                                "taskflow-coordinator"))]


def test_a_deadline_from_the_run_s_start_is_refused_with_detach() -> None:
    with pytest.raises(FlowDefinitionError, match="node 'audit': detach=True .* deadline"):
        FunctionNode(lambda ctx, p: None, name="audit", detach=True, timeout=1.0, deadline=0.5)
    node = FunctionNode(lambda ctx, p: None, name="audit", detach=True, timeout=1.0)
    with pytest.raises(FlowDefinitionError, match="deadline"):
        node.deadline = 0.5


def test_a_section_holds_a_detached_node_only_until_its_hand_off(make_executor, gate) -> None:
    started, release = gate(), gate()
    audit = FunctionNode(blocked_until(started, release), name="audit", detach=True,
                         timeout=LONG)
    taskflow.Section("below-fold", [audit], deadline=SHORT)
    result = TaskScheduling.start(audit, executor=make_executor(2), timeout=LONG)
    assert started.wait(LONG)
    assert result.result_of("audit").state is ResultState.DETACHED
    threading.Event().wait(SHORT * 2)  # stands in for work: past the section's deadline
    release.set()
    assert result.detached("audit").result(LONG).state is ResultState.SUCCESS


def test_a_run_and_its_ended_detached_node_are_freed_without_the_cycle_collector(
        make_executor) -> None:
    import gc
    import weakref

    from taskflow.model.context import current

    pool = make_executor(2)
    runs: list[Any] = []

    def audit(ctx: Any, p: Any) -> str:
        runs.append(weakref.ref(current.run))  # the run itself, not what its result keeps
        return "audited"

    node = FunctionNode(audit, name="audit", detach=True, timeout=LONG)
    gc.collect()
    gc.disable()
    try:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
        final = result.detached("audit").result(LONG)
        run = runs[0]
        pool.submit(int).result(LONG)  # the worker that ended it has let go of it
        del result
        assert run() is None
        assert final.state is ResultState.SUCCESS
    finally:
        gc.enable()
