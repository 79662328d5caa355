"""Primitives carried by a node to another process pickle as fresh objects with their options."""

from __future__ import annotations

import pickle

import pytest

from taskflow.resilience import Bulkhead, CircuitBreaker, Hedge, RateLimit, SingleFlight


def test_bulkhead_pickles_with_its_options_and_empty_state() -> None:
    bh = Bulkhead("inventory", max_concurrent=3, max_waiting=7)
    held = bh.try_acquire()
    assert held is not None
    copy = pickle.loads(pickle.dumps(bh))
    assert (copy.name, copy.max_concurrent, copy.max_waiting) == ("inventory", 3, 7)
    assert copy.metrics().in_use == 0 and bh.metrics().in_use == 1


@pytest.mark.parametrize(
    ("obj", "fields"),
    [
        (RateLimit("r", per_second=20, burst=4), ("name", "per_second", "burst")),
        (CircuitBreaker("c", failure_ratio=0.25, window=8, min_calls=4, open_for=2.0,
                        half_open_calls=2),
         ("name", "failure_ratio", "window", "min_calls", "open_for", "half_open_calls")),
        (SingleFlight("s", cache_ttl=3.0, cache_size=9), ("name", "cache_ttl", "cache_size")),
        (Hedge(after="p90", max_extra=2, min_samples=5),
         ("after", "max_extra", "min_samples", "quantile")),
    ],
)
def test_primitives_pickle_with_their_options(obj: object, fields: tuple[str, ...]) -> None:
    copy = pickle.loads(pickle.dumps(obj))
    assert type(copy) is type(obj)
    assert [getattr(copy, f) for f in fields] == [getattr(obj, f) for f in fields]
