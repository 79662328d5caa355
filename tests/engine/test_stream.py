"""``TaskScheduling.stream``: the nodes of a run as they settle, each once, within the budget;
closing, leaving a ``with`` block, raising in the loop or dropping the stream cancels the run;
hooks, validation, shedding and nested runs as in ``start``; a hypothesis oracle against
``start`` on random DAGs."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, PROMPT, SHORT, HookLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskflow
from taskflow import (
    FlowStatus,
    FlowStream,
    FunctionNode,
    LoadShedError,
    ResultState,
    SchedulingNode,
    StreamNotFinishedError,
    TaskContext,
    TaskScheduling,
    TaskSupport,
)
from taskflow.engine import events

pytestmark = [
    pytest.mark.timeout(60),
    # a failing example is reported by hypothesis through an import that warns on this machine
    pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"),
]

S = ResultState


def const(value: Any) -> Callable[[TaskContext, Any], Any]:
    return lambda ctx, p: value


def waits_for(event: threading.Event, value: Any = "done") -> Callable[[TaskContext, Any], Any]:
    """A task that returns ``value`` once ``event`` is set (or gives up when cancelled)."""

    def task(ctx: TaskContext, p: Any) -> Any:
        while not event.wait(0.005):
            if ctx.cancelled:
                return None
        return value

    return task


class Hooked(SchedulingNode[Any, Any]):
    """A node whose task is ``fn(ctx, param)`` and whose outcome hooks are recorded."""

    def __init__(self, name: str, fn: Callable[[TaskContext, Any], Any], log: HookLog,
                 **options: Any) -> None:
        super().__init__(None, name=name, **options)
        self.__dict__["_fn"] = fn
        self.__dict__["_log"] = log

    def task(self, ctx: TaskContext, param: Any) -> Any:
        return self.__dict__["_fn"](ctx, param)

    def on_success(self, support: TaskSupport) -> None:
        self.__dict__["_log"].record(self.name, "on_success")

    def on_fail(self, support: TaskSupport) -> None:
        self.__dict__["_log"].record(self.name, "on_fail")


def states(pairs: Any) -> dict[str, ResultState]:
    return {name: wr.state for name, wr in pairs}


# --- order, once, the end ----------------------------------------------------------------------


def test_nodes_come_out_as_they_settle_before_the_slow_one_is_done(make_executor, gate) -> None:
    release = gate()
    top = FunctionNode(const("header"), name="top")
    slow = FunctionNode(waits_for(release, "reviews"), name="slow")
    fast = FunctionNode(const("price"), name="fast")
    page = FunctionNode(const("page"), name="page")
    top >> [fast, slow] >> page
    with TaskScheduling.stream(top, executor=make_executor(4), timeout=LONG) as stream:
        assert isinstance(stream, FlowStream)
        first = [next(stream), next(stream)]
        assert [name for name, _ in first] == ["top", "fast"]  # slow is still waiting
        assert first[1][1].result == "price" and first[1][1].state is S.SUCCESS
        release.set()
        rest = list(stream)
    assert [name for name, _ in rest] == ["slow", "page"]
    assert rest[0][1].result == "reviews"
    assert stream.result.status is FlowStatus.COMPLETED
    assert stream.result.outputs["page"] == "page"


def test_every_node_comes_out_once_and_the_result_is_the_run_s(make_executor) -> None:
    a = FunctionNode(const(1), name="a")
    b = FunctionNode(lambda ctx, p: ctx.result_of("a") + 1, name="b")
    c = FunctionNode(lambda ctx, p: ctx.result_of("a") * 10, name="c")
    d = FunctionNode(lambda ctx, p: ctx.result_of("b") + ctx.result_of("c"), name="d")
    boom = FunctionNode(lambda ctx, p: 1 / 0, name="boom")
    after = FunctionNode(const("never"), name="after")
    a >> [b, c] >> d
    a >> boom >> after
    stream = TaskScheduling.stream(a, executor=make_executor(3), timeout=LONG)
    items = list(stream)
    names = [name for name, _ in items]
    assert sorted(names) == sorted(["a", "b", "c", "d", "boom", "after"])
    assert names.index("a") < names.index("b") < names.index("d")
    assert names.index("boom") < names.index("after")
    got = states(items)
    assert got["d"] is S.SUCCESS and got["boom"] is S.EXCEPTION and got["after"] is S.EXCEPTION
    result = stream.result
    assert result.result_of("d").result == 12
    assert all(result.result_of(name) is wr for name, wr in items)
    assert list(stream) == []  # exhausted stays exhausted
    assert stream.done()


def test_the_budget_ends_the_stream_with_the_unfinished_nodes_timed_out(make_executor,
                                                                       gate) -> None:
    never = gate()
    log = HookLog()
    ok = Hooked("ok", const(1), log)
    stuck = Hooked("stuck", waits_for(never), log)
    son = Hooked("son", const(2), log)
    stuck >> son
    t0 = time.monotonic()
    stream = TaskScheduling.stream([ok, stuck], executor=make_executor(2), timeout=SHORT * 4)
    items = list(stream)
    assert time.monotonic() - t0 < SHORT * 4 + PROMPT  # next() never waited past the deadline
    assert [name for name, _ in items][0] == "ok"
    assert states(items) == {"ok": S.SUCCESS, "stuck": S.TIMEOUT, "son": S.TIMEOUT}
    assert stream.result.status is FlowStatus.TIMED_OUT
    assert log.count("ok", "on_success") == 1
    assert log.count("stuck", "on_fail") == 1 and log.count("son", "on_fail") == 1
    assert len(log.calls) == 3


def test_a_spent_budget_hands_out_every_node_timed_out(make_executor) -> None:
    a = FunctionNode(const(1), name="a")
    b = FunctionNode(const(2), name="b")
    a >> b
    stream = TaskScheduling.stream(a, executor=make_executor(1), timeout=0)
    assert states(stream) == {"a": S.TIMEOUT, "b": S.TIMEOUT}
    assert stream.result.status is FlowStatus.TIMED_OUT


def test_without_a_budget_the_stream_ends_when_the_run_does(make_executor) -> None:
    a = FunctionNode(const(1), name="a")
    b = FunctionNode(const(2), name="b")
    a >> b
    stream = TaskScheduling.stream(a, executor=make_executor(1))
    assert [name for name, _ in stream] == ["a", "b"]
    assert stream.result.timeout is None


def test_hooks_run_once_each_as_in_start(make_executor) -> None:
    log = HookLog()
    a = Hooked("a", const(1), log)
    bad = Hooked("bad", lambda ctx, p: 1 / 0, log)
    skipped = Hooked("skipped", const(3), log)
    a >> bad >> skipped
    stream = TaskScheduling.stream(a, executor=make_executor(2), timeout=LONG)
    list(stream)
    assert log.kinds("a") == ["on_success"]
    assert log.kinds("bad") == ["on_fail"]
    assert log.kinds("skipped") == ["on_fail"]  # failed fast: UPSTREAM


def test_result_before_the_end_raises_and_never_blocks(make_executor, gate) -> None:
    release = gate()
    stream = TaskScheduling.stream(FunctionNode(waits_for(release), name="w"),
                                   executor=make_executor(1), timeout=LONG)
    with pytest.raises(StreamNotFinishedError, match="has not ended") as info:
        stream.result  # noqa: B018 - the property raises
    assert isinstance(info.value, RuntimeError) and info.value.flow_id == stream.flow_id
    release.set()
    assert [name for name, _ in stream] == ["w"]
    assert stream.result.ok


# --- cancelling --------------------------------------------------------------------------------


def _cancellable(name: str, cancelled: threading.Event,
                 started: threading.Event | None = None) -> FunctionNode[Any, Any]:
    """A node that runs until its attempt is abandoned, and says so through ``cancelled``."""

    def task(ctx: TaskContext, p: Any) -> None:
        ctx.on_cancel(cancelled.set)
        if started is not None:
            started.set()
        while not ctx.cancelled:
            time.sleep(0.002)

    return FunctionNode(task, name=name)


def test_close_cancels_the_run_and_is_idempotent(make_executor) -> None:
    cancelled, started = threading.Event(), threading.Event()
    top = FunctionNode(const("header"), name="top")
    slow = _cancellable("slow", cancelled, started)
    son = FunctionNode(const("never"), name="son")
    top >> slow >> son
    stream = TaskScheduling.stream(top, executor=make_executor(2), timeout=LONG)
    assert next(stream)[0] == "top"
    assert started.wait(LONG)
    stream.close()
    assert cancelled.wait(LONG)  # the running attempt was abandoned
    result = stream.result  # there right after close
    assert result.status is FlowStatus.CANCELLED
    assert result.result_of("slow").state is S.CANCELLED
    assert result.result_of("son").state is S.CANCELLED
    stream.close()
    assert list(stream) == []
    with pytest.raises(StopIteration):
        next(stream)


def test_closing_runs_the_cancelled_nodes_hooks_once(make_executor, gate) -> None:
    log = HookLog()
    entered, never = threading.Event(), gate()

    def held(ctx: TaskContext, p: Any) -> None:
        entered.set()
        waits_for(never)(ctx, p)

    top = Hooked("top", const(1), log)
    running = Hooked("running", held, log)
    waiting = Hooked("waiting", const(2), log)
    top >> running >> waiting
    stream = TaskScheduling.stream(top, executor=make_executor(2), timeout=LONG)
    assert next(stream)[0] == "top"
    assert entered.wait(LONG)
    stream.close()
    stream.close()
    assert log.kinds("top") == ["on_success"]
    assert log.kinds("running") == ["on_fail"] and log.kinds("waiting") == ["on_fail"]
    assert stream.result.result_of("running").state is S.CANCELLED


def test_an_exception_in_the_with_block_cancels_the_run(make_executor) -> None:
    cancelled = threading.Event()
    top = FunctionNode(const(1), name="top")
    top >> _cancellable("slow", cancelled)
    with pytest.raises(ZeroDivisionError):
        with TaskScheduling.stream(top, executor=make_executor(2), timeout=LONG) as stream:
            for _name, _wr in stream:
                1 / 0  # noqa: B018 - the consumer fails
    assert stream.result.status is FlowStatus.CANCELLED  # close() waited for the result
    assert cancelled.wait(LONG)  # on_cancel callbacks run on a coordinator thread
    assert stream.result.status is FlowStatus.CANCELLED


def _consume_and_fail(executor: Executor, top: Any) -> None:
    for _name, _wr in TaskScheduling.stream(top, executor=executor, timeout=LONG):
        raise KeyError("the consumer failed")


def test_an_exception_in_a_bare_loop_cancels_the_run_once_the_stream_is_dropped(
        make_executor) -> None:
    cancelled = threading.Event()
    top = FunctionNode(const(1), name="top")
    top >> _cancellable("slow", cancelled)
    with pytest.raises(KeyError):
        _consume_and_fail(make_executor(2), top)
    gc.collect()
    assert cancelled.wait(LONG)


def test_a_stream_dropped_unread_cancels_its_run(make_executor) -> None:
    cancelled, started = threading.Event(), threading.Event()
    TaskScheduling.stream(_cancellable("slow", cancelled, started), executor=make_executor(1),
                          timeout=LONG)
    assert started.wait(LONG)
    gc.collect()
    assert cancelled.wait(LONG)


def test_a_node_that_cancels_the_run_ends_the_stream(make_executor) -> None:
    a = FunctionNode(lambda ctx, p: ctx.cancel("enough"), name="a")
    b = FunctionNode(const(2), name="b")
    a >> b
    stream = TaskScheduling.stream(a, executor=make_executor(1), timeout=LONG)
    got = states(stream)
    assert got["b"] is S.CANCELLED and set(got) == {"a", "b"}
    assert stream.result.status is FlowStatus.CANCELLED


def test_close_from_another_thread_wakes_a_waiting_consumer(make_executor, gate) -> None:
    never = gate()
    stream = TaskScheduling.stream(FunctionNode(waits_for(never), name="w"),
                                   executor=make_executor(1), timeout=LONG)
    got: list[Any] = []
    consumer = threading.Thread(target=lambda: got.extend(stream), name="consumer")
    consumer.start()
    stream.close()
    consumer.join(LONG)
    assert not consumer.is_alive()
    assert stream.result.result_of("w").state is S.CANCELLED
    assert [name for name, _ in got] in ([], ["w"])  # the item may have gone to either side


# --- the arguments of start ----------------------------------------------------------------------


def test_bad_arguments_raise_before_anything_runs(make_executor) -> None:
    ran = threading.Event()
    node = FunctionNode(lambda ctx, p: ran.set(), name="n")
    pool = make_executor(1)
    with pytest.raises(TypeError, match="executor must be"):
        TaskScheduling.stream(node, executor="pool", timeout=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TaskScheduling.stream(node, executor=pool, timeout=-1)
    with pytest.raises(taskflow.FlowDefinitionError):
        TaskScheduling.stream(node, executor=pool, timeout=1, priority="urgent")  # type: ignore[arg-type]
    with pytest.raises(taskflow.FlowDefinitionError):
        TaskScheduling.stream(node, executor=pool, timeout=1, targets=["missing"])
    with pytest.raises(TypeError, match="context must be"):
        TaskScheduling.stream(node, executor=pool, context={"a": 1})  # type: ignore[arg-type]
    pool.shutdown()
    with pytest.raises(taskflow.RejectedExecutionError):
        TaskScheduling.stream(node, executor=pool, timeout=1)
    assert not ran.is_set()


class _Saturated(Executor):
    """Reports a saturated load (``taskflow_load``) and counts submissions."""

    def __init__(self) -> None:
        self.submitted = 0
        self._pool = ThreadPoolExecutor(1)

    def taskflow_load(self) -> tuple[int, int, int, bool]:
        return 4, 0, 2, False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


def test_priority_sheds_a_stream_at_the_call_as_start_does() -> None:
    taskflow.set_load_shedding()
    ex = _Saturated()
    try:
        with pytest.raises(LoadShedError):
            TaskScheduling.stream(FunctionNode(const(1), name="n"), executor=ex, timeout=5,
                                  priority="sheddable")
        assert ex.submitted == 0
        stream = TaskScheduling.stream(FunctionNode(const(1), name="n"), executor=ex,
                                       timeout=5, priority="critical")
        assert states(stream) == {"n": S.SUCCESS}
    finally:
        ex.shutdown()


def test_targets_name_context_and_overrides_apply(make_executor) -> None:
    a = FunctionNode(lambda ctx, p: ctx["x"], name="a")
    b = FunctionNode(const("real"), name="b")
    other = FunctionNode(const("not needed"), name="other")
    a >> b
    a >> other
    stream = TaskScheduling.stream(a, executor=make_executor(2), timeout=LONG, targets=["b"],
                                   name="page", context=TaskContext(x=7),
                                   overrides={"b": "fake"})
    items = dict(stream)
    assert set(items) == {"a", "b"}
    assert items["a"].result == 7 and items["b"].result == "fake"
    assert stream.result.flow_name == "page"


# --- threads, pools, nesting ---------------------------------------------------------------------


def test_a_one_worker_pool_streams_a_diamond(make_executor) -> None:
    a = FunctionNode(const(1), name="a")
    b = FunctionNode(const(2), name="b")
    c = FunctionNode(const(3), name="c")
    d = FunctionNode(const(4), name="d")
    a >> [b, c] >> d
    stream = TaskScheduling.stream(a, executor=make_executor(1), timeout=LONG)
    names = [name for name, _ in stream]
    assert names[0] == "a" and names[-1] == "d" and sorted(names) == ["a", "b", "c", "d"]


def test_a_nested_stream_on_the_same_one_worker_pool_runs_inline(make_executor) -> None:
    pool = make_executor(1)
    inner_a = FunctionNode(const("x"), name="inner_a")
    inner_b = FunctionNode(lambda ctx, p: ctx.result_of("inner_a") * 2, name="inner_b")
    inner_a >> inner_b

    def outer(ctx: TaskContext, p: Any) -> list[tuple[str, Any]]:
        with TaskScheduling.stream(inner_a, executor=pool, timeout=LONG) as inner:
            seen = [(name, wr.result) for name, wr in inner]
        assert inner.result.ok
        return seen

    result = TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool,
                                  timeout=LONG)
    assert result.result_of("outer").result == [("inner_a", "x"), ("inner_b", "xx")]


def test_a_nested_stream_keeps_its_budget(make_executor, gate) -> None:
    pool = make_executor(1)
    never = gate()

    def outer(ctx: TaskContext, p: Any) -> dict[str, ResultState]:
        inner = TaskScheduling.stream(FunctionNode(waits_for(never), name="stuck"),
                                      executor=pool, timeout=SHORT)
        return states(inner)

    result = TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool,
                                  timeout=LONG)
    assert result.result_of("outer").result == {"stuck": S.TIMEOUT}


def test_two_consumers_share_the_items_each_once(make_executor) -> None:
    nodes = [FunctionNode(const(i), name=f"n{i}") for i in range(40)]
    stream = TaskScheduling.stream(nodes, executor=make_executor(4), timeout=LONG)
    got: list[list[str]] = [[], []]
    threads = [threading.Thread(target=lambda k=k: got[k].extend(n for n, _ in stream),
                                name=f"consumer-{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG)
    assert sorted(got[0] + got[1]) == sorted(f"n{i}" for i in range(40))
    assert stream.result.ok


def test_a_finished_stream_and_its_run_are_freed(make_executor) -> None:
    a = FunctionNode(const(1), name="a")
    stream = TaskScheduling.stream(a, executor=make_executor(1), timeout=LONG)
    list(stream)
    stream_ref = weakref.ref(stream)
    run_ref = weakref.ref(stream._run)
    del stream
    gc.collect()
    assert stream_ref() is None and run_ref() is None


def test_listeners_still_watch_a_streamed_run(make_executor) -> None:
    seen: list[Any] = []

    class Obs(events.RunObserver):
        def node_settled(self, i: int) -> None:
            seen.append(("settled", i))

        def run_ended(self, result: Any) -> None:
            seen.append(("ended", result.flow_id))

    class Listen:
        def run_started(self, run: Any) -> events.RunObserver:
            return Obs()

    listener = Listen()
    events.add_listener(listener)
    try:
        a = FunctionNode(const(1), name="a")
        a >> FunctionNode(const(2), name="b")
        stream = TaskScheduling.stream(a, executor=make_executor(1), timeout=LONG)
        list(stream)
    finally:
        events.remove_listener(listener)
    assert seen.count(("ended", stream.flow_id)) == 1
    assert sorted(x for x in seen if x[0] == "settled") == [("settled", 0), ("settled", 1)]


# --- random DAGs: the stream against start ---------------------------------------------------------


@st.composite
def dags(draw: Any) -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    n = draw(st.integers(1, 9))
    names = [f"n{i}" for i in range(n)]
    deps = {name: sorted(draw(st.sets(st.sampled_from(names[:j]), max_size=3))) if j else []
            for j, name in enumerate(names)}
    kinds = {name: draw(st.sampled_from(["ok", "ok", "ok", "raise"])) for name in names}
    return names, deps, kinds


def _build(names: list[str], deps: dict[str, list[str]],
           kinds: dict[str, str]) -> list[FunctionNode[Any, Any]]:
    def task(kind: str, i: int) -> Callable[[TaskContext, Any], Any]:
        def run(ctx: TaskContext, fathers: list[str]) -> int:
            if kind == "raise":
                raise ValueError(f"n{i}")
            return i + sum(ctx.result_of(f) for f in fathers)
        return run

    nodes = {name: FunctionNode(task(kinds[name], i), deps[name], name=name)
             for i, name in enumerate(names)}
    for name in names:
        for f in deps[name]:
            nodes[f] >> nodes[name]
    return [nodes[name] for name in names]


@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(dag=dags(), workers=st.sampled_from([1, 2, 4]))
def test_random_dags_stream_each_node_once_and_agree_with_start(dag: Any, workers: int) -> None:
    names, deps, kinds = dag
    nodes = _build(names, deps, kinds)
    with ThreadPoolExecutor(workers, thread_name_prefix="prop") as pool:
        expected = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
        stream = TaskScheduling.stream(nodes, executor=pool, timeout=LONG)
        items = list(stream)
    order = [name for name, _ in items]
    assert sorted(order) == sorted(names)  # each node exactly once
    got = stream.result
    for name in names:
        want, have = expected.result_of(name), got.result_of(name)
        assert have.state is want.state, name
        assert have.result == want.result, name
        if have.state is S.SUCCESS:  # it ran after every father came out
            assert all(order.index(f) < order.index(name) for f in deps[name]), name
    assert got.status is expected.status
    assert dict(items) == {name: got.result_of(name) for name in names}



def test_a_process_pool_streams_its_nodes(spawn_pool) -> None:
    import remote_tasks

    a = FunctionNode(remote_tasks.const, 1, name="a")
    b = FunctionNode(remote_tasks.const, 2, name="b")
    c = FunctionNode(remote_tasks.fail, "no", name="c")
    a >> [b, c]
    stream = TaskScheduling.stream(a, executor=spawn_pool, timeout=LONG)
    items = list(stream)
    assert items[0][0] == "a" and sorted(n for n, _ in items) == ["a", "b", "c"]
    assert states(items) == {"a": S.SUCCESS, "b": S.SUCCESS, "c": S.EXCEPTION}
    assert stream.result.result_of("b").result == 2


def test_a_section_deadline_comes_out_at_its_deadline_before_the_slow_part(make_executor,
                                                                          gate) -> None:
    release = gate()
    below = FunctionNode(waits_for(gate()), name="below", deadline=SHORT)
    slow = FunctionNode(waits_for(release), name="slow")
    stream = TaskScheduling.stream([below, slow], executor=make_executor(2), timeout=LONG)
    name, wr = next(stream)
    assert (name, wr.state) == ("below", S.TIMEOUT)  # slow still waits for the test
    release.set()
    assert [(n, w.state) for n, w in stream] == [("slow", S.SUCCESS)]
