"""Metrics of the primitives in the Prometheus text format, many objects at once."""

from __future__ import annotations

import re

from resilience_helpers import FakeClock

from taskflow.resilience import (
    Bulkhead,
    CircuitBreaker,
    RateLimit,
    SingleFlight,
    render_prometheus,
)

_SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+]+|[+-]Inf|NaN)$')


def _check_format(text: str) -> dict[str, int]:
    """Every line is a comment or a well-formed sample; returns TYPE lines per family."""
    types: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
            types[family] = types.get(family, 0) + 1
        elif not line.startswith("# HELP "):
            assert _SAMPLE.match(line), line
    return types


def test_several_objects_share_each_family_once() -> None:
    clock = FakeClock()
    a = Bulkhead("inventory", max_concurrent=2, clock=clock)
    b = Bulkhead("pricing", max_concurrent=1, clock=clock)
    held = a.try_acquire()
    assert held is not None
    breaker = CircuitBreaker("inventory", window=1, min_calls=1, clock=clock)
    breaker.record(breaker.allow(), False)
    limit = RateLimit("inventory", per_second=5, burst=1, clock=clock)
    limit.reserve()
    limit.reserve()
    flight = SingleFlight("stock")
    flight.join("k", lambda o: None)
    text = render_prometheus([a, b, breaker, limit, flight])
    types = _check_format(text)
    assert all(n == 1 for n in types.values())
    assert 'taskflow_bulkhead_in_use{bulkhead="inventory"} 1' in text
    assert 'taskflow_bulkhead_in_use{bulkhead="pricing"} 0' in text
    assert 'taskflow_breaker_state{breaker="inventory",state="open"} 1' in text
    assert 'taskflow_breaker_state{breaker="inventory",state="closed"} 0' in text
    assert ('taskflow_breaker_transitions_total{breaker="inventory",from="closed",to="open"} 1'
            in text)
    assert 'taskflow_rate_limit_waiting{rate_limit="inventory"} 1' in text
    assert 'taskflow_single_flight_in_flight{single_flight="stock"} 1' in text


def test_label_values_are_escaped() -> None:
    bh = Bulkhead('bad"name\\\n', max_concurrent=1)
    text = bh.prometheus_lines(prefix="app")
    assert 'app_bulkhead_in_use{bulkhead="bad\\"name\\\\\\n"} 0' in text
    _check_format(text)


def test_nothing_to_export_is_empty() -> None:
    assert render_prometheus([]) == ""
