"""ManualExecutor: work runs only when stepped, on the stepping thread, in a seeded order; whole
flows run to completion under ``run_until_idle`` with the same results as on a thread pool."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import (
    FunctionNode,
    RejectedExecutionError,
    ResultState,
    TaskflowError,
    TaskScheduling,
)
from taskflow.testing import ManualExecutor, StepLimitError

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)
PROFILE = {"deadline": None, "derandomize": True, "database": None,
           "suppress_health_check": [HealthCheck.too_slow]}


def test_nothing_runs_until_stepped_and_step_runs_one() -> None:
    ex = ManualExecutor()
    ran: list[int] = []
    futs = [ex.submit(ran.append, i) for i in range(3)]
    assert ran == [] and ex.pending == 3 and not any(f.done() for f in futs)
    assert ex.step() is True
    assert ran == [0] and futs[0].done() and ex.pending == 2
    assert ex.run_until_idle() == 2
    assert ran == [0, 1, 2] and ex.step() is False and ex.pending == 0


def test_results_exceptions_and_callbacks_as_the_stdlib_gives_them() -> None:
    ex = ManualExecutor()
    ok = ex.submit(pow, 2, exp=5)
    bad = ex.submit(int, "x")
    seen: list[tuple[str, str]] = []
    ok.add_done_callback(lambda f: seen.append(("ok", threading.current_thread().name)))
    ex.run_until_idle()
    assert ok.result(timeout=0) == 32
    assert isinstance(bad.exception(timeout=0), ValueError)
    assert seen == [("ok", threading.current_thread().name)]
    # added to a done future: runs at once, on the calling thread
    ok.add_done_callback(lambda f: seen.append(("late", threading.current_thread().name)))
    assert seen[-1] == ("late", threading.current_thread().name)


def test_a_future_cancelled_while_queued_never_runs_and_is_not_a_step() -> None:
    ex = ManualExecutor()
    ran: list[str] = []
    first = ex.submit(ran.append, "a")
    ex.submit(ran.append, "b")
    assert first.cancel()
    assert ex.pending == 1
    assert ex.step() is True and ran == ["b"]
    assert ex.step() is False


def test_shutdown_refuses_new_work_and_cancel_futures_cancels_the_queue() -> None:
    ex = ManualExecutor()
    queued = ex.submit(print, "never")
    cancelled: list[bool] = []
    queued.add_done_callback(lambda f: cancelled.append(f.cancelled()))
    ex.shutdown(wait=False, cancel_futures=True)
    assert cancelled == [True] and ex.pending == 0 and ex.is_shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(print, "refused")
    with pytest.raises(CancelledError):
        queued.result(timeout=0)


def test_shutdown_with_wait_runs_what_is_queued_and_refuses_what_it_submits() -> None:
    ex = ManualExecutor()
    refused: list[BaseException] = []

    def submit_more() -> None:
        try:
            ex.submit(print, "refused")
        except RuntimeError as exc:
            refused.append(exc)

    f = ex.submit(submit_more)
    ex.shutdown()
    assert f.done() and len(refused) == 1 and ex.pending == 0


def test_a_shut_down_manual_executor_is_refused_before_a_flow_submits() -> None:
    ex = ManualExecutor()
    ex.shutdown()
    with pytest.raises(RejectedExecutionError, match="ManualExecutor"):
        TaskScheduling.submit(FunctionNode(lambda c, p: 1, name="a"), executor=ex)


def test_run_until_idle_stops_work_that_keeps_submitting() -> None:
    ex = ManualExecutor()

    def again() -> None:
        ex.submit(again)

    ex.submit(again)
    with pytest.raises(StepLimitError, match="max_steps=50") as info:
        ex.run_until_idle(max_steps=50)
    assert isinstance(info.value, TaskflowError) and info.value.pending == 1
    assert ex.steps == 50


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"seed": "1"}, TypeError, "seed must be an int"),
    ({"seed": True}, TypeError, "seed must be an int"),
    ({"max_workers": 0}, ValueError, "max_workers must be at least 1"),
])
def test_bad_arguments_name_themselves(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ManualExecutor(**kwargs)


@pytest.mark.parametrize(("steps", "error"), [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_max_steps_is_refused_before_anything_runs(steps: object, error: type) -> None:
    ex = ManualExecutor()
    ex.submit(print, "kept")
    with pytest.raises(error, match="max_steps"):
        ex.run_until_idle(max_steps=steps)  # type: ignore[arg-type]
    assert ex.pending == 1


def _order(seed: int | None) -> list[str]:
    ex = ManualExecutor(seed=seed)
    order: list[str] = []

    def work(name: str, children: int) -> None:
        order.append(name)
        for k in range(children):
            ex.submit(work, f"{name}.{k}", children - 1)

    for name in "abcd":
        ex.submit(work, name, 2)
    ex.run_until_idle()
    return order


def test_a_seed_reproduces_the_order_and_seeds_explore_orders() -> None:
    assert _order(None) == _order(None)
    assert _order(None)[:4] == ["a", "b", "c", "d"]  # FIFO
    for seed in range(5):
        assert _order(seed) == _order(seed)
    assert len({tuple(_order(seed)) for seed in range(10)}) > 1
    assert all(sorted(_order(seed)) == sorted(_order(None)) for seed in range(10))


def _diamond() -> list[FunctionNode]:
    a = FunctionNode(lambda c, p: 1, name="a")
    b = FunctionNode(lambda c, p: c.result_of("a") + 1, name="b")
    c = FunctionNode(lambda c, p: 10, name="c")
    d = FunctionNode(lambda c, p: c.result_of("b") + c.result_of("c"), name="d")
    a >> b >> d
    c >> d
    return [a, c]


def test_a_submitted_flow_runs_to_completion_on_the_calling_thread_with_no_new_thread() -> None:
    ex = ManualExecutor(seed=1)
    before = set(threading.enumerate())
    future = TaskScheduling.submit(_diamond(), executor=ex)
    assert not future.done() and ex.pending > 0
    ex.run_until_idle()
    result = future.result(timeout=0)
    assert result.status.name == "COMPLETED"
    assert result.outputs == {"a": 1, "b": 2, "c": 10, "d": 12}
    me = threading.current_thread().name
    assert {node.work_result.thread for node in result.values()} == {me}
    assert set(threading.enumerate()) - before == set()


def test_a_flow_whose_executor_is_shut_down_mid_run_fails_the_refused_nodes() -> None:
    ex = ManualExecutor(max_workers=1)
    a = FunctionNode(lambda c, p: ex.shutdown(wait=False), name="a")
    b = FunctionNode(lambda c, p: 2, name="b")
    c = FunctionNode(lambda c, p: 3, name="c")
    a >> [b, c]
    future = TaskScheduling.submit(a, executor=ex)
    ex.run_until_idle()
    result = future.result(timeout=0)
    # the loop that ran a goes on with its sons: nothing had to be submitted
    assert result.outputs["b"] == 2 and result.outputs["c"] == 3


# -- random DAGs: the same results as on a thread pool, whatever the seed ---------------------------

@st.composite
def dags(draw: st.DrawFn) -> tuple[list[str], dict[str, list[str]], set[str]]:
    n = draw(st.integers(1, 10))
    names = [f"n{i}" for i in range(n)]
    deps = {name: sorted(draw(st.sets(st.sampled_from(names[:j]), max_size=3))) if j else []
            for j, name in enumerate(names)}
    failing = draw(st.sets(st.sampled_from(names), max_size=2))
    return names, deps, failing


def _build(names: list[str], deps: dict[str, list[str]], failing: set[str]) -> list[FunctionNode]:
    def task(name: str, fathers: list[str]):
        def run(ctx, param):
            if name in failing:
                raise RuntimeError(name)
            return int(name[1:]) * 7 + 1 + sum(ctx.result_of(f) for f in fathers)
        return run

    nodes = {name: FunctionNode(task(name, deps[name]), name=name) for name in names}
    for name in names:
        for f in deps[name]:
            nodes[f] >> nodes[name]
    return list(nodes.values())


def _summary(result) -> dict[str, tuple[ResultState, object]]:
    return {name: (node.work_result.state, node.work_result.result)
            for name, node in result.items()}


@settings(max_examples=40, **PROFILE)
@given(dag=dags(), seed=st.one_of(st.none(), st.integers(0, 2**32)),
       workers=st.integers(1, 4))
def test_random_dags_reach_the_thread_pools_results_whatever_the_seed(dag, seed, workers) -> None:
    with ThreadPoolExecutor(2, thread_name_prefix="manual-cmp") as pool:
        expected = _summary(TaskScheduling.start(_build(*dag), executor=pool))
    ex = ManualExecutor(seed=seed, max_workers=workers)
    future = TaskScheduling.submit(_build(*dag), executor=ex)
    ex.run_until_idle()
    assert _summary(future.result(timeout=0)) == expected
    assert ex.pending == 0


@settings(max_examples=20, **PROFILE)
@given(dag=dags(), seed=st.integers(0, 2**32))
def test_a_seed_runs_a_flow_in_the_same_order_twice(dag, seed) -> None:
    def order() -> list[str]:
        seen: list[str] = []
        nodes = _build(*dag)
        for node in nodes:
            inner = node.fn
            node.fn = lambda c, p, inner=inner, name=node.name: (seen.append(name), inner(c, p))[1]
        ex = ManualExecutor(seed=seed)
        future = TaskScheduling.submit(nodes, executor=ex)
        ex.run_until_idle()
        future.result(timeout=0)
        return seen

    assert order() == order()
