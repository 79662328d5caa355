"""``start(..., targets=[...])``: run only the targets and their ancestors, as dask's ``get(keys)`` and Gobrs-Async's optional mode do.

Without ``targets``, ``start`` runs everything connected to the nodes it is given, in both
directions: a backend shared by two pages brings the other page in. These tests pin both
behaviours, the validation of ``targets`` (before anything runs), the cached narrowed plans,
switches whose chosen son is left out, the three facades and a process pool, and a hypothesis
property on random DAGs: the set run is exactly targets plus ancestors, each run once.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
import remote_tasks as rt
from conftest import LONG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import (
    FlowDefinitionError,
    FlowStatus,
    FunctionNode,
    InvalidNodeError,
    ResultState,
    SchedulingNode,
    SwitchNode,
    TaskContext,
    TaskScheduling,
    TaskSupport,
    run_async,
)
from taskflow.model.graph import as_top_nodes, compile_plan, select_targets

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)


class Calls:
    """Thread-safe counts of (node name, event): ``task``, ``begin``, ``success``, ``fail``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()

    def add(self, name: str, event: str) -> None:
        with self._lock:
            self.counts[(name, event)] += 1

    def ran(self) -> set[str]:
        with self._lock:
            return {name for (name, event), n in self.counts.items() if event == "task" and n}


def counted(calls: Calls) -> type[SchedulingNode[Any, Any]]:
    """A node class whose task returns ``param(ctx)`` (or its name) and whose hooks count."""

    class Counted(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            calls.add(self.name, "task")
            return param(ctx) if callable(param) else self.name

        def on_begin(self, support: TaskSupport) -> None:
            calls.add(self.name, "begin")

        def on_success(self, support: TaskSupport) -> None:
            calls.add(self.name, "success")

        def on_fail(self, support: TaskSupport) -> None:
            calls.add(self.name, "fail")

    return Counted


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="targets") as ex:
        yield ex


def two_pages(calls: Calls) -> dict[str, SchedulingNode[Any, Any]]:
    """Page A needs product and price; page B needs product and inventory. ``product`` is the
    same node object in both pages."""
    node = counted(calls)
    n = {name: node(name=name) for name in ("product", "price", "inventory", "page_a", "page_b")}
    n["product"] >> [n["price"], n["inventory"]]
    n["price"] >> n["page_a"]
    n["product"] >> n["page_a"]
    n["inventory"] >> n["page_b"]
    n["product"] >> n["page_b"]
    return n


def test_start_without_targets_runs_the_other_page_of_a_shared_node(
        pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    result = TaskScheduling.start(n["page_a"], executor=pool, timeout=LONG)
    assert result.ok
    # the documented surprise that targets= answers: page B and its backend ran too
    assert calls.ran() == {"product", "price", "inventory", "page_a", "page_b"}


def test_targets_run_only_the_page_and_what_it_needs(pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    result = TaskScheduling.start(n["page_a"], executor=pool, timeout=LONG,
                                  targets=[n["page_a"]])
    assert result.ok and result.status is FlowStatus.COMPLETED
    assert set(result) == {"product", "price", "page_a"}
    assert result.outputs == {"product": "product", "price": "price", "page_a": "page_a"}
    for name in ("product", "price", "page_a"):
        assert calls.counts[(name, "task")] == 1
        assert calls.counts[(name, "begin")] == 1
        assert calls.counts[(name, "success")] == 1
    for name in ("inventory", "page_b"):
        assert not any(calls.counts[(name, e)] for e in ("task", "begin", "success", "fail"))


def test_targets_may_be_given_by_name_and_start_from_any_node(pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    # start from the other page: the graph is the same; only page B's side runs
    result = TaskScheduling.start(n["page_a"], executor=pool, timeout=LONG, targets="page_b")
    assert set(result) == {"product", "inventory", "page_b"} == calls.ran()


def test_several_targets_run_their_union(pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    result = TaskScheduling.start(list(n.values()), executor=pool, timeout=LONG,
                                  targets=[n["price"], "inventory"])
    assert set(result) == {"product", "price", "inventory"} == calls.ran()
    assert all(calls.counts[(name, "task")] == 1 for name in result)


def test_a_target_outside_the_graph_is_refused_by_name_before_anything_runs(
        pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    stranger = counted(calls)(name="stranger")
    twin = counted(calls)(name="price")  # same name as a node in the graph, another object
    for bad, words in ((stranger, "'stranger' is not in the graph"),
                       (twin, "'price' is not in the graph"),
                       ("nope", "'nope' names no node")):
        with pytest.raises(FlowDefinitionError, match=words):
            TaskScheduling.start(n["page_a"], executor=pool, timeout=LONG,
                                 targets=[n["page_a"], bad])
        with pytest.raises(FlowDefinitionError, match=words):
            TaskScheduling.submit(n["page_a"], executor=pool, timeout=LONG, targets=[bad])
        with pytest.raises(FlowDefinitionError, match=words):
            asyncio.run(run_async(n["page_a"], executor=pool, timeout=LONG, targets=[bad]))
    with pytest.raises(FlowDefinitionError, match="a different node has that name"):
        TaskScheduling.start(n["page_a"], executor=pool, targets=[twin])
    assert calls.counts == Counter()


def test_bad_targets_arguments_name_the_culprit(pool: ThreadPoolExecutor) -> None:
    n = two_pages(Calls())
    with pytest.raises(FlowDefinitionError, match="targets is empty"):
        TaskScheduling.start(n["page_a"], executor=pool, targets=[])
    with pytest.raises(InvalidNodeError, match=r"targets\[1\] is 3 \(int\)"):
        TaskScheduling.start(n["page_a"], executor=pool, targets=["price", 3])
    with pytest.raises(InvalidNodeError, match="got int"):
        TaskScheduling.start(n["page_a"], executor=pool, targets=3)
    with pytest.raises(TypeError):  # InvalidNodeError is also a TypeError
        TaskScheduling.start(n["page_a"], executor=pool, targets={"price": 1})


def test_submit_and_run_async_take_targets(pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    fut = TaskScheduling.submit(n["page_a"], executor=pool, timeout=LONG, targets=[n["page_a"]])
    assert set(fut.result(LONG)) == {"product", "price", "page_a"}
    result = asyncio.run(run_async(n["page_a"], executor=pool, timeout=LONG, targets=["page_b"]))
    assert set(result) == {"product", "inventory", "page_b"}
    assert calls.counts[("product", "task")] == 2 and calls.counts[("page_a", "task")] == 1
    assert calls.counts[("page_b", "task")] == 1 and calls.counts[("price", "task")] == 1


def test_narrowed_plans_are_cached_and_go_stale_with_the_graph(pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    n = two_pages(calls)
    full = compile_plan(as_top_nodes(n["page_a"]))
    sub = select_targets(full, [n["page_a"]])
    assert select_targets(full, ["page_a", n["page_a"]]) is sub  # keyed by the targets' indices
    assert sub.names == ("product", "price", "page_a") and sub is not full
    assert sub.sinks == (False, False, True)  # edges to nodes left out are dropped
    assert select_targets(full, [n["page_a"], n["page_b"]]) is full  # everything: the full plan
    # rewiring recompiles the full plan, and with it the narrowed ones
    extra = counted(calls)(name="extra")
    extra >> n["page_a"]
    result = TaskScheduling.start(n["page_a"], executor=pool, timeout=LONG, targets=[n["page_a"]])
    assert set(result) == {"product", "price", "extra", "page_a"}
    assert compile_plan(as_top_nodes(n["page_a"])) is not full


def test_a_failing_target_fails_the_run_though_its_sons_are_left_out(
        pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    node = counted(calls)

    def boom(ctx: TaskContext) -> None:
        raise ValueError("price backend down")

    product, price, page = node(name="product"), node(boom, name="price"), node(name="page")
    product >> price >> page
    result = TaskScheduling.start(product, executor=pool, timeout=LONG, targets=[price])
    assert set(result) == {"product", "price"}
    assert result.status is FlowStatus.FAILED and not result.ok  # price is this run's sink
    assert calls.counts[("price", "fail")] == 1 and calls.counts[("page", "fail")] == 0


def test_a_switch_whose_chosen_son_is_left_out_does_not_run_it(pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    node = counted(calls)
    cheap, full = node(name="cheap"), node(name="full")

    def decide(ctx: TaskContext, param: Any) -> str:
        calls.add("route", "task")
        return str(ctx["mode"])

    route = SwitchNode.of(decide, name="route", cases={"cheap": cheap, "full": full})
    result = TaskScheduling.start(route, executor=pool, timeout=LONG, targets=[cheap],
                                  context=TaskContext(mode="full"))
    assert result.ok and set(result) == {"route", "cheap"}
    assert result.states() == {"route": ResultState.SUCCESS, "cheap": ResultState.SKIPPED}
    assert calls.ran() == {"route"}
    result = TaskScheduling.start(route, executor=pool, timeout=LONG, targets=[cheap],
                                  context=TaskContext(mode="cheap"))
    assert result.states() == {"route": ResultState.SUCCESS, "cheap": ResultState.SUCCESS}


def test_targets_on_a_process_pool() -> None:
    a = FunctionNode(rt.const, 1, name="a")
    b = FunctionNode(rt.total, ("a",), name="b")
    c = FunctionNode(rt.fail, "c must not run", name="c")
    route = SwitchNode.of(rt.const, "no", name="route", cases={"yes": c, "no": b})
    a >> route
    a >> b
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        result = TaskScheduling.start(a, executor=ex, timeout=LONG * 3, targets=[b])
    assert result.ok and result.outputs == {"a": 1, "route": "no", "b": 1}


# -- property: random DAGs ------------------------------------------------------------------------


@st.composite
def dags_with_targets(draw: Callable[..., Any]) -> tuple[list[str], dict[str, list[str]],
                                                         list[str]]:
    """(names, fathers, targets) with ``names`` in a topological order."""
    size = draw(st.integers(1, 14))
    names = [f"n{i}" for i in range(size)]
    fathers = {name: sorted(draw(st.sets(st.sampled_from(names[:j]), max_size=3))) if j else []
               for j, name in enumerate(names)}
    targets = sorted(draw(st.sets(st.sampled_from(names), min_size=1, max_size=4)))
    return names, fathers, targets


def ancestors_of(names: list[str], fathers: dict[str, list[str]],
                 targets: list[str]) -> set[str]:
    """The oracle: one sweep against the topological order (a needed node needs its fathers)."""
    needed = set(targets)
    for name in reversed(names):
        if name in needed:
            needed.update(fathers[name])
    return needed


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(dags_with_targets(), st.sampled_from([1, 3]), st.booleans())
def test_the_set_run_is_the_targets_and_their_ancestors_each_once(
        case: tuple[list[str], dict[str, list[str]], list[str]], workers: int,
        by_name: bool) -> None:
    names, fathers, targets = case
    calls = Calls()
    node = counted(calls)
    nodes = {name: node(name=name) for name in names}
    for name in names:
        nodes[name].set_father_handler([nodes[f] for f in fathers[name]])
    expected = ancestors_of(names, fathers, targets)
    wanted: list[Any] = list(targets) if by_name else [nodes[t] for t in targets]
    with ThreadPoolExecutor(workers, thread_name_prefix="targets-prop") as ex:
        for _ in range(2):  # the second run takes the cached narrowed plan
            calls.counts.clear()
            result = TaskScheduling.start(list(nodes.values()), executor=ex, timeout=LONG,
                                          targets=wanted)
            assert result.ok
            assert set(result) == expected == calls.ran()
            assert set(result.outputs) == expected
            for name in expected:
                assert calls.counts[(name, "task")] == 1
                assert calls.counts[(name, "success")] == 1
