"""``Bulkhead(..., adaptive=True)``: the limit follows the backend's latency between its bounds,
and its figures are exported."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import parse_prometheus
from hypothesis import given, settings
from hypothesis import strategies as st
from resilience_helpers import FakeClock

from taskflow import Bulkhead, FunctionNode, TaskScheduling
from taskflow.errors import FlowDefinitionError
from taskflow.observe.monitor import PoolMonitor
from taskflow.resilience.adaptive import GradientLimit

pytestmark = pytest.mark.timeout(60)


def test_a_steady_latency_keeps_the_limit_and_a_slower_backend_lowers_it_to_its_floor() -> None:
    g = GradientLimit(20, 2, 20)
    for _ in range(100):
        g.update(0.010, inflight=20)
    assert g.limit == 20
    limits = [g.update(0.100, inflight=g.limit) for _ in range(60)]
    assert limits[-1] < 10 and min(limits) >= 2
    assert max(limits) < 20


def test_a_recovered_backend_gets_its_limit_back() -> None:
    g = GradientLimit(20, 2, 20)
    for _ in range(50):
        g.update(0.010, inflight=20)
    for _ in range(60):
        g.update(0.100, inflight=g.limit)
    low = g.limit
    for _ in range(200):
        g.update(0.010, inflight=g.limit)
    assert g.limit > low and g.limit == 20


def test_an_app_limited_bulkhead_does_not_move_its_limit() -> None:
    g = GradientLimit(20, 2, 20)
    for _ in range(50):
        g.update(0.010, inflight=20)
    for _ in range(50):
        g.update(1.0, inflight=3)  # fewer than half the slots used: latency says nothing
    assert g.limit == 20


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10) | st.just(float("nan")),
                          st.integers(0, 64)), max_size=200),
       st.integers(1, 8), st.integers(0, 56))
def test_the_limit_stays_within_its_bounds_for_any_samples(samples: list[tuple[float, int]],
                                                           low: int, span: int) -> None:
    g = GradientLimit(low + span, low, low + span)
    for latency, inflight in samples:
        assert low <= g.update(latency, inflight) <= low + span


def test_an_adaptive_bulkhead_shrinks_when_its_attempts_slow_down_and_exports_it() -> None:
    clock = FakeClock()
    b = Bulkhead("adaptive-backend", max_concurrent=8, min_concurrent=2, adaptive=True,
                 clock=clock)
    assert b.limit == 8

    def round_of(latency: float) -> None:
        permits = [b.try_acquire() for _ in range(b.limit)]
        assert all(p is not None for p in permits)
        clock.advance(latency)
        for p in permits:
            assert p is not None and p.release()

    for _ in range(20):
        round_of(0.010)
    assert b.limit == 8
    for _ in range(20):
        round_of(0.200)
    m = b.metrics()
    assert 2 <= m.limit < 8 and m.adaptive and m.min_concurrent == 2 and m.max_concurrent == 8
    assert m.latency_short_s is not None and m.latency_short_s > m.latency_long_s  # type: ignore[operator]
    assert b.try_acquire() is not None  # slots still given, within the lower limit
    text = b.prometheus_lines()
    assert f'taskflow_bulkhead_limit{{bulkhead="adaptive-backend"}} {m.limit}' in text
    assert "taskflow_bulkhead_latency_short_seconds" in text
    assert "taskflow_bulkhead_min_concurrent" in text


def test_the_latency_averages_are_scraped_from_prometheus_with_the_values_of_the_calls() -> None:
    """Four calls of 0.25 s, then one of 1 s (the fake clock moves inside each task): the short
    average moves by 2/11 of the step, the long one is still a plain mean (0.4 s)."""
    clock = FakeClock(start=0.0)  # binary-exact instants: the latencies are exact
    b = Bulkhead("adaptive-scraped", max_concurrent=8, min_concurrent=2, adaptive=True,
                 clock=clock)

    def call(ctx: Any, seconds: float) -> float:
        clock.advance(seconds)
        return seconds

    lab = (("bulkhead", "adaptive-scraped"),)
    with ThreadPoolExecutor(2) as pool:
        monitor = PoolMonitor(pool, interval=3600, resilience=[b])
        _, before = parse_prometheus(monitor.to_prometheus())
        assert ("taskflow_bulkhead_latency_short_seconds", lab) not in before  # no sample yet
        for seconds in (0.25, 0.25, 0.25, 0.25, 1.0):
            node = FunctionNode(call, param=seconds, name="backend", bulkhead=b)
            assert TaskScheduling.start(node, executor=pool, timeout=30).ok
        text = monitor.to_prometheus()
    types, series = parse_prometheus(text)
    m = b.metrics()
    short = series[("taskflow_bulkhead_latency_short_seconds", lab)]
    long = series[("taskflow_bulkhead_latency_long_seconds", lab)]
    assert short == m.latency_short_s == pytest.approx(0.25 + 0.75 * 2 / 11, rel=1e-12)
    assert long == m.latency_long_s == pytest.approx(0.4, rel=1e-12)
    assert series[("taskflow_bulkhead_limit", lab)] == m.limit == 8  # one call at a time
    assert series[("taskflow_bulkhead_min_concurrent", lab)] == 2
    assert types["taskflow_bulkhead_latency_short_seconds"] == "gauge"
    assert types["taskflow_bulkhead_latency_long_seconds"] == "gauge"
    assert ("# HELP taskflow_bulkhead_latency_short_seconds Recent latency of the bulkhead's "
            "attempts (moving average).") in text
    assert ("# HELP taskflow_bulkhead_latency_long_seconds Usual latency of the bulkhead's "
            "attempts (moving average).") in text
    assert parse_prometheus(b.prometheus_lines())[1] == {
        k: v for k, v in series.items() if k[0].startswith("taskflow_bulkhead_") and k[1] == lab}


def test_a_static_bulkhead_exports_no_latency_series() -> None:
    text = Bulkhead("static-unscraped", max_concurrent=3).prometheus_lines()
    assert "taskflow_bulkhead_limit" in text and "latency" not in text
    assert "taskflow_bulkhead_min_concurrent" not in text


def test_a_static_bulkhead_reports_its_slots_as_its_limit() -> None:
    m = Bulkhead("static-limit", max_concurrent=3).metrics()
    assert (m.limit, m.adaptive, m.min_concurrent, m.latency_short_s) == (3, False, None, None)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_concurrent": 4, "min_concurrent": 2}, "pass adaptive=True"),
    ({"max_concurrent": 4, "adaptive": True, "min_concurrent": 5}, "must be <= max_concurrent"),
    ({"max_concurrent": 4, "adaptive": True, "min_concurrent": 0}, "min_concurrent must be"),
    ({"max_concurrent": 4, "adaptive": "yes"}, "adaptive must be True or False"),
])
def test_bad_adaptive_options_are_refused_naming_the_bulkhead(kwargs: dict[str, object],
                                                              match: str) -> None:
    with pytest.raises(FlowDefinitionError, match=match) as info:
        Bulkhead("bad-adaptive", **kwargs)  # type: ignore[arg-type]
    assert "bad-adaptive" in str(info.value)


def test_moving_the_upper_bound_of_an_adaptive_bulkhead() -> None:
    b = Bulkhead("adaptive-bound", max_concurrent=8, min_concurrent=2, adaptive=True)
    b.set_max_concurrent(3)
    assert b.limit == 3 and b.metrics().max_concurrent == 3
    with pytest.raises(FlowDefinitionError, match="must be >= min_concurrent"):
        b.set_max_concurrent(1)


def test_a_limit_that_grows_hands_its_new_slots_to_waiters_at_once() -> None:
    """No waiter waits while a slot is free: each release that raises the limit grants the
    waiters every slot it freed or added, on the releasing thread."""
    clock = FakeClock()
    b = Bulkhead("adaptive-grow", max_concurrent=8, min_concurrent=2, adaptive=True,
                 max_waiting=64, clock=clock)
    for latency in [0.010] * 20 + [0.200] * 20:  # the backend slowed: the limit came down
        permits = [b.try_acquire() for _ in range(b.limit)]
        clock.advance(latency)
        for p in permits:
            assert p is not None and p.release()
    low = b.limit
    assert low < 8
    held = [b.try_acquire() for _ in range(low)]
    assert all(p is not None for p in held) and b.try_acquire() is None
    granted: list = []
    for _ in range(40):
        b.acquire(granted.append)
    queue = [p for p in held if p is not None]
    grew_by_more_than_one = False
    while queue:  # the backend is fast again: each call returns in 1 ms
        clock.advance(0.001)
        before = len(granted)
        assert queue.pop(0).release()
        m = b.metrics()
        assert m.waiting == 0 or m.in_use >= m.limit, m  # no free slot beside a waiter
        grew_by_more_than_one |= len(granted) - before > 1
        queue += granted[before:]
        if len(granted) == 40:
            break
    assert b.limit > low and grew_by_more_than_one
