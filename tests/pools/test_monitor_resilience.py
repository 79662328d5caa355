"""Bulkheads, rate limits and circuit breakers in PoolMonitor: snapshots, history, Prometheus.

The text endpoint and the prometheus_client collector are read with prometheus_client's own
parser: each family once, the breaker's state a gauge, counters that never decrease.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from conftest import PrometheusSeries, parse_prometheus
from prometheus_client import CollectorRegistry, generate_latest
from resilience_helpers import FakeClock

from taskflow.observe.monitor import PoolMonitor
from taskflow.observe.prometheus import PoolCollector
from taskflow.pools.threadpool import ThreadPool
from taskflow.resilience import (
    BreakerMetrics,
    BreakerState,
    Bulkhead,
    BulkheadFullError,
    BulkheadMetrics,
    CircuitBreaker,
    CircuitOpenError,
    RateLimit,
    RateLimitMetrics,
)
from taskflow.resilience.export import register, registered

Series = PrometheusSeries


@pytest.fixture
def pool() -> Iterator[ThreadPool]:
    p = ThreadPool(1, name="api")
    yield p
    p.shutdown(wait=True)


def test_explicit_objects_are_in_every_snapshot_and_the_prometheus_output(pool: ThreadPool) -> None:
    clock = FakeClock()
    bulkhead = Bulkhead("mon-inventory", max_concurrent=2, clock=clock)
    limit = RateLimit("mon-inventory", per_second=5, burst=1, clock=clock)
    breaker = CircuitBreaker("mon-inventory", window=2, min_calls=2, open_for=5.0, clock=clock)
    monitor = PoolMonitor(pool, interval=3600, resilience=[bulkhead, limit, breaker])
    registry = CollectorRegistry()
    registry.register(PoolCollector(monitor))

    first = monitor.sample()
    assert [type(m) for m in first.resilience] == [BulkheadMetrics, RateLimitMetrics, BreakerMetrics]
    held = bulkhead.try_acquire()
    assert held is not None
    assert limit.try_take()
    for _ in range(2):
        breaker.record(breaker.allow(), False)  # 2 failures of 2: the breaker opens
    assert breaker.state is BreakerState.OPEN
    second = monitor.sample()
    b, r, c = second.resilience
    assert isinstance(b, BulkheadMetrics) and (b.in_use, b.granted) == (1, 1)
    assert isinstance(r, RateLimitMetrics) and r.granted == 1
    assert isinstance(c, BreakerMetrics) and c.state is BreakerState.OPEN
    assert monitor.history() == [first, second]

    text_types, text = parse_prometheus(monitor.to_prometheus())
    client_types, client = parse_prometheus(generate_latest(registry).decode())
    assert text_types == client_types
    label = ("bulkhead", "mon-inventory")
    assert text_types["taskflow_bulkhead_in_use"] == "gauge"
    assert text_types["taskflow_bulkhead_granted"] == "counter"
    assert text_types["taskflow_breaker_state"] == "gauge"
    assert text_types["taskflow_breaker_calls"] == "counter"
    assert text_types["taskflow_rate_limit_granted"] == "counter"
    for series in (text, client):
        assert series[("taskflow_bulkhead_in_use", (label,))] == 1
        assert series[("taskflow_bulkhead_granted_total", (label,))] == 1
        assert series[("taskflow_rate_limit_granted_total", (("rate_limit", "mon-inventory"),))] == 1
        states = {s: series[("taskflow_breaker_state", (("breaker", "mon-inventory"), ("state", s)))]
                  for s in ("closed", "open", "half_open")}
        assert states == {"closed": 0, "open": 1, "half_open": 0}
        assert series[("taskflow_pool_tasks_total", (("pool", "api"),))] == 0  # the pool's too


def test_resilience_counters_never_decrease_across_scrapes(pool: ThreadPool) -> None:
    clock = FakeClock()
    bulkhead = Bulkhead("mono-bh", max_concurrent=1, max_waiting=1, clock=clock)
    breaker = CircuitBreaker("mono-br", window=2, min_calls=2, open_for=1.0, clock=clock)
    monitor = PoolMonitor(pool, resilience=[bulkhead, breaker])
    previous: Series = {}
    for step in range(6):
        permit = bulkhead.try_acquire()
        assert permit is not None
        bulkhead.acquire(lambda granted: granted.release())  # waits; granted on release
        if step % 2:
            with pytest.raises(BulkheadFullError):
                bulkhead.acquire(lambda granted: granted.release())  # beyond max_waiting
        permit.release()
        try:
            breaker.record(breaker.allow(), step % 3 == 0)
        except CircuitOpenError:
            pass  # open: refused, counted as rejected
        clock.advance(0.6)
        types, series = parse_prometheus(monitor.to_prometheus())
        counters = {k: v for k, v in series.items()
                    if k[0].endswith("_total") and k[0].removesuffix("_total") in types
                    and types[k[0].removesuffix("_total")] == "counter"
                    and not k[0].startswith("taskflow_process_")}
        for key, value in previous.items():
            assert counters[key] >= value, (step, key)
        previous = counters
    assert previous[("taskflow_bulkhead_granted_total", (("bulkhead", "mono-bh"),))] >= 6
    assert previous[("taskflow_bulkhead_rejected_total", (("bulkhead", "mono-bh"),))] >= 1


def test_by_default_every_live_primitive_is_exported_once(pool: ThreadPool) -> None:
    gc.collect()  # earlier tests' dead objects leave the registry
    live = Bulkhead("registry-unique-bh", max_concurrent=3)
    shadow = Bulkhead("registry-unique-bh", max_concurrent=9)  # same kind and name: not registered
    breaker = CircuitBreaker("registry-unique-br")
    assert not register(shadow, "bulkhead")
    assert live in registered() and breaker in registered() and shadow not in registered()
    monitors = [PoolMonitor(pool), PoolMonitor(pool, name="second")]
    snap = monitors[0].sample()
    names = {(type(m).__name__, m.name) for m in snap.resilience}
    assert {("BulkheadMetrics", "registry-unique-bh"), ("BreakerMetrics", "registry-unique-br")} <= names
    registry = CollectorRegistry()
    registry.register(PoolCollector(*monitors))  # both export the registry: each series once
    _, series = parse_prometheus(generate_latest(registry).decode())
    assert series[("taskflow_bulkhead_max_concurrent", (("bulkhead", "registry-unique-bh"),))] == 3
    assert series[("taskflow_breaker_state",
                   (("breaker", "registry-unique-br"), ("state", "closed")))] == 1
    del live, shadow, breaker, snap
    gc.collect()
    _, series = parse_prometheus(monitors[0].to_prometheus())
    assert not any("registry-unique" in value for key in series for _, value in key[1])
    assert PoolMonitor(pool, resilience=()).sample().resilience == ()


def test_bad_resilience_objects_are_refused_when_the_monitor_is_made(pool: ThreadPool) -> None:
    with pytest.raises(ValueError, match="two Bulkhead objects named 'twin'"):
        PoolMonitor(pool, resilience=[Bulkhead("twin", max_concurrent=1),
                                      Bulkhead("twin", max_concurrent=2)])
    with pytest.raises(TypeError, match="need metrics"):
        PoolMonitor(pool, resilience=[object()])  # type: ignore[list-item]
    # a bulkhead and a breaker may share a name: their labels differ
    PoolMonitor(pool, resilience=[Bulkhead("same", max_concurrent=1), CircuitBreaker("same")])
