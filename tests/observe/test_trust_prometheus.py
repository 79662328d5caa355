"""Prometheus exposition with hostile names: a pool, flow, node,
bulkhead, breaker or rate limit named with quotes, backslashes, line breaks or anything else
comes back exactly from prometheus_client's own text parser, and adds no series or family.

Covers ``PoolMonitor.to_prometheus`` (taskflow.observe.monitor), ``FlowStats.to_prometheus``
(taskflow.observe.stats) and ``render_prometheus`` (taskflow.resilience.export).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import FunctionNode, PoolMonitor, TaskContext, TaskScheduling, ThreadPool
from taskflow.observe.stats import FlowStats
from taskflow.resilience import Bulkhead, CircuitBreaker, RateLimit, render_prometheus

parser = pytest.importorskip("prometheus_client.parser")

# what breaks a hand-made exposition: the label's quote, the escape character, a line break
# (a new sample or a fake "# TYPE" line), braces and commas (a new label), a carriage return
TRICKY = [
    'a"b', "a\\b", "a\\", "a\nb", "x\n# TYPE evil counter\nevil 1", 'p",evil="1', "}{",
    "\\n", '\\"', "\r", "tab\there", "é\u2028\u202e\x00\x1b[2J", " ", "\\\\\"\n",
]
# any text (no lone surrogates: they cannot be written as UTF-8 at all)
names = st.sampled_from(TRICKY) | st.text(
    st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _families(text: str) -> dict[str, list[dict[str, str]]]:
    """family name -> the label sets of its samples, as prometheus_client reads the text."""
    return {f.name: [dict(s.labels) for s in f.samples]
            for f in parser.text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPool]:
    p = ThreadPool(2, thread_name_prefix="trust-prom")
    try:
        yield p
    finally:
        p.shutdown(wait=True)


@SETTINGS
@given(name=names)
def test_a_pool_name_round_trips_through_the_parser(pool: ThreadPool, name: str) -> None:
    text = PoolMonitor(pool, name=name, resilience=()).to_prometheus()  # the pool alone
    families = _families(text)
    pooled = [labels for fam in families.values() for labels in fam if "pool" in labels]
    assert pooled, text
    assert {labels["pool"] for labels in pooled} == {name}
    # the name added no family of its own: every family is one the pool or process exports
    assert all(f.startswith(("taskflow_pool_", "taskflow_process_")) for f in families), families


def _ok(ctx: TaskContext, param: object) -> int:
    return 1


def _bad(ctx: TaskContext, param: object) -> None:
    raise ValueError("no")


@SETTINGS
@given(flow=names, first=names, second=names)
def test_flow_and_node_names_round_trip_through_the_parser(flow: str, first: str,
                                                         second: str) -> None:
    if first == second:
        second += "'"
    stats = FlowStats()
    with ThreadPoolExecutor(2, thread_name_prefix="trust-prom-run") as ex:
        a = FunctionNode(_ok, name=first)
        b = FunctionNode(_bad, name=second)
        a >> b
        stats.record_run(TaskScheduling.start(a, executor=ex, timeout=30), flow=flow)
    families = _families(stats.to_prometheus())
    labelled = [labels for fam in families.values() for labels in fam if "node" in labels]
    assert {labels["node"] for labels in labelled} == {first, second}
    assert {labels["flow"] for fam in families.values() for labels in fam
            if "flow" in labels} == {flow}
    assert all(f.startswith("taskflow_") for f in families)


@SETTINGS
@given(bulkhead=names, breaker=names, limit=names)
def test_resilience_names_round_trip_through_the_parser(bulkhead: str, breaker: str,
                                                        limit: str) -> None:
    objects = [Bulkhead(bulkhead, max_concurrent=2), CircuitBreaker(breaker),
               RateLimit(limit, per_second=10.0)]
    families = _families(render_prometheus(objects))
    seen: dict[str, set[str]] = {"bulkhead": set(), "breaker": set(), "rate_limit": set()}
    for fam in families.values():
        for labels in fam:
            for key, found in seen.items():
                if key in labels:
                    found.add(labels[key])
    assert seen == {"bulkhead": {bulkhead}, "breaker": {breaker}, "rate_limit": {limit}}
    assert all(f.startswith(("taskflow_bulkhead_", "taskflow_breaker_", "taskflow_rate_limit_"))
               for f in families), families
