"""Dispatch weights: the longest remaining path to a sink, weighted by recent medians (the
engine's ready queue orders by priority, then this path; tests/resilience/test_resilience_priority.py
checks that order in runs)."""

from __future__ import annotations

import graphlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskflow.resilience.dispatch import node_weights, remaining_paths


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
