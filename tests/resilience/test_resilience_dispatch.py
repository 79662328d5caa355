"""Dispatch order: priority, then the longest remaining path weighted by recent medians."""

from __future__ import annotations

import graphlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resilience_helpers import run_threads

from taskflow.resilience import ReadyQueue, fits_budget, node_weights, remaining_paths


def test_remaining_path_is_the_heaviest_route_to_a_sink() -> None:
    #  a -> b -> d
    #  a -> c -> d ; c is slow
    sons = {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}
    weights = {"a": 1.0, "b": 1.0, "c": 5.0, "d": 2.0}
    assert remaining_paths(sons, weights) == {"d": 2.0, "b": 3.0, "c": 7.0, "a": 8.0}


def test_remaining_paths_refuses_a_cycle() -> None:
    with pytest.raises(graphlib.CycleError):
        remaining_paths({"a": ["b"], "b": ["a"]}, {})


def test_unmeasured_nodes_weigh_as_much_as_a_typical_node() -> None:
    medians = {"a": 0.1, "b": 0.3, "c": None}
    assert node_weights("abc", medians.get) == {"a": 0.1, "b": 0.3, "c": pytest.approx(0.2)}
    assert node_weights("xy", lambda n: None, default=0.5) == {"x": 0.5, "y": 0.5}


def test_queue_pops_priority_then_longest_path_then_arrival() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("short", path=1.0)
    q.push("long", path=9.0)
    q.push("urgent", priority=5, path=0.1)
    q.push("long-twin", path=9.0)
    assert [q.pop() for _ in range(5)] == ["urgent", "long", "long-twin", "short", None]


def test_remove_if_drops_a_finished_runs_items() -> None:
    q: ReadyQueue[tuple[int, str]] = ReadyQueue()
    for run in (1, 2):
        for node in "ab":
            q.push((run, node), path=1.0 if node == "a" else 2.0)
    assert sorted(q.remove_if(lambda item: item[0] == 1)) == [(1, "a"), (1, "b")]
    assert len(q) == 2
    assert [q.pop(), q.pop()] == [(2, "b"), (2, "a")]


def test_min_budget() -> None:
    assert fits_budget(0.3, None)
    assert fits_budget(0.3, 0.3)
    assert not fits_budget(0.29, 0.3)
    assert fits_budget(float("inf"), 10.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2), st.floats(0, 10, allow_nan=False)), max_size=30))
def test_pop_order_is_sorted_by_priority_then_path_then_arrival(
    items: list[tuple[int, float]],
) -> None:
    q: ReadyQueue[int] = ReadyQueue()
    for i, (priority, path) in enumerate(items):
        q.push(i, priority=priority, path=path)
    popped = [q.pop() for _ in items]
    assert popped == sorted(range(len(items)), key=lambda i: (-items[i][0], -items[i][1], i))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=30),
    st.lists(st.floats(0, 5, allow_nan=False), min_size=n, max_size=n),
)))
def test_a_father_always_ranks_above_each_of_its_sons(
    case: tuple[int, list[tuple[int, int]], list[float]],
) -> None:
    n, edges, w = case
    sons: dict[int, list[int]] = {i: [] for i in range(n)}
    for a, b in edges:
        if a < b:  # keep it acyclic
            sons[a].append(b)
    paths = remaining_paths(sons, dict(enumerate(w)))
    for a, bs in sons.items():
        for b in bs:
            assert paths[a] >= paths[b] + w[a] - 1e-9


def test_queue_under_many_threads_loses_nothing() -> None:
    q: ReadyQueue[int] = ReadyQueue()
    got: list[list[int]] = [[] for _ in range(8)]

    def body(i: int) -> None:
        for j in range(200):
            q.push(i * 1000 + j, priority=j % 3)
            item = q.pop()
            if item is not None:
                got[i].append(item)

    run_threads(8, body)
    rest = []
    while (item := q.pop()) is not None:
        rest.append(item)
    everything = sorted(x for g in got for x in g) + rest
    assert sorted(everything) == sorted(i * 1000 + j for i in range(8) for j in range(200))


def test_remove_if_calls_its_check_without_the_lock_held() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.push("a")
    q.push("b")

    def drop(item: str) -> bool:
        return len(q) >= 0 and q.pop() is not None and item == "b"  # re-enters the queue

    gone = q.remove_if(drop)
    assert len(q) == 0 and set(gone) <= {"b"}
