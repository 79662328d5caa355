"""Prometheus export checked with prometheus_client's own parser and registry.

The families (names, types, labels) of the text endpoint and of the collector; counters that
never decrease, also while the pool resizes and its threads retire; scrape-time sampling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import LONG, PrometheusSeries, parse_prometheus
from prometheus_client import CollectorRegistry, generate_latest

from taskflow.observe.monitor import PoolMonitor
from taskflow.observe.prometheus import PoolCollector
from taskflow.pools.monitored import MonitoredExecutor
from taskflow.pools.threadpool import ThreadPool

COUNTERS = {
    "taskflow_pool_tasks", "taskflow_pool_completed", "taskflow_pool_failed",
    "taskflow_pool_cancelled", "taskflow_pool_rejected", "taskflow_pool_abandoned",
    "taskflow_pool_worker_cpu_seconds", "taskflow_process_cpu_seconds",
    "taskflow_process_context_switches",
}
GAUGES = {
    "taskflow_pool_core_size", "taskflow_pool_max_size", "taskflow_pool_size",
    "taskflow_pool_largest_size", "taskflow_pool_active", "taskflow_pool_queue_size",
    "taskflow_pool_liveness_percent", "taskflow_pool_abandoned_running", "taskflow_pool_tps",
    "taskflow_process_cpu_percent", "taskflow_process_resident_memory_bytes",
    "taskflow_process_virtual_memory_bytes", "taskflow_process_threads",
    "taskflow_process_open_fds",
}
SUMMARIES = {"taskflow_pool_queue_wait_seconds", "taskflow_pool_run_seconds"}

Series = PrometheusSeries


def counter_series(types: dict[str, str], series: Series) -> Series:
    counters = {name for name, kind in types.items() if kind == "counter"}
    return {
        key: value for key, value in series.items()
        if key[0].removesuffix("_total") in counters
        or key[0].removesuffix("_sum").removesuffix("_count") in SUMMARIES
        and not key[0].endswith("_seconds")
    }


def burn(seconds: float) -> None:
    """Use CPU (of this thread) for ``seconds``: work that psutil can see."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


@pytest.fixture
def pool() -> Iterator[ThreadPool]:
    p = ThreadPool(1, 6, queue_capacity=0, keep_alive=0.05, name="api")
    yield p
    p.shutdown(wait=False, cancel_futures=True)
    assert p.await_termination(LONG)


def fill(pool: ThreadPool, n: int, cpu: float) -> None:
    """Run n tasks at once (each on its own thread: a hand-off pool grows), each burning cpu."""
    barrier = threading.Barrier(n, timeout=LONG)

    def task() -> None:
        barrier.wait()
        burn(cpu)

    for f in [pool.submit(task) for _ in range(n)]:
        f.result(timeout=LONG)


def test_the_text_endpoint_parses_with_the_expected_types(pool: ThreadPool) -> None:
    fill(pool, 3, 0.0)
    monitor = PoolMonitor(pool)
    monitor.sample()
    types, series = parse_prometheus(monitor.to_prometheus())
    for name in COUNTERS:
        assert types.get(name) == "counter", name
    for name in GAUGES:
        assert types.get(name) == "gauge", name
    for name in SUMMARIES:
        assert types.get(name) == "summary", name
    assert series[("taskflow_pool_completed_total", (("pool", "api"),))] == 3
    assert series[("taskflow_pool_run_seconds_count", (("pool", "api"),))] == 3
    assert ("taskflow_pool_run_seconds", (("pool", "api"), ("quantile", "0.99"))) in series


def test_counters_never_decrease_while_the_pool_resizes(pool: ThreadPool) -> None:
    """Threads above core retire after keep_alive; the worker CPU counter keeps their CPU."""
    monitor = PoolMonitor(pool, interval=3600)
    seen: list[Series] = []

    def scrape() -> None:
        types, series = parse_prometheus(monitor.to_prometheus())
        counters = counter_series(types, series)
        assert ("taskflow_pool_worker_cpu_seconds_total", (("pool", "api"),)) in counters
        if seen:
            for key, value in seen[-1].items():
                assert counters.get(key, 0.0) >= value, f"{key} went down: {value} -> {counters.get(key)}"
        seen.append(counters)

    fill(pool, 6, 0.05)  # six threads, 50 ms of CPU each
    scrape()
    deadline = time.monotonic() + LONG
    while pool.metrics().pool_size != 1:  # the five above core retire
        assert time.monotonic() < deadline, "threads above core never retired"
        time.sleep(0.01)
    scrape()
    pool.set_max_size(3)
    pool.set_core_size(3)
    fill(pool, 3, 0.02)
    scrape()
    pool.set_core_size(0)
    pool.set_max_size(1)
    scrape()
    fill(pool, 1, 0.0)
    scrape()
    cpu = [s[("taskflow_pool_worker_cpu_seconds_total", (("pool", "api"),))] for s in seen]
    assert cpu[1] >= 0.2, cpu  # the retired threads' 250 ms are still counted
    assert pool.metrics().retired_worker_cpu_s is not None
    assert pool.metrics().retired_worker_cpu_s >= 0.2


def test_the_collector_samples_at_scrape_time_with_the_same_families(pool: ThreadPool) -> None:
    # resilience=(): no other test's bulkhead, collected between two scrapes, changes the families
    monitor = PoolMonitor(pool, interval=3600, resilience=())
    registry = CollectorRegistry()
    registry.register(PoolCollector(monitor))
    fill(pool, 2, 0.0)
    types, series = parse_prometheus(generate_latest(registry).decode())
    assert series[("taskflow_pool_completed_total", (("pool", "api"),))] == 2
    fill(pool, 2, 0.0)
    types2, series2 = parse_prometheus(generate_latest(registry).decode())
    assert series2[("taskflow_pool_completed_total", (("pool", "api"),))] == 4  # not stale
    text_types, _ = parse_prometheus(monitor.to_prometheus())
    assert types2 == text_types == types
    assert monitor.history() == []  # scrapes are not recorded


def test_a_monitored_stdlib_pool_exports_the_same_counters() -> None:
    with ThreadPoolExecutor(2) as inner:
        mon = MonitoredExecutor(inner, name="stdlib")
        for f in [mon.submit(burn, 0.0) for _ in range(5)]:
            f.result(timeout=LONG)
        types, series = parse_prometheus(PoolMonitor(mon).to_prometheus())
    assert types["taskflow_pool_worker_cpu_seconds"] == "counter"
    assert series[("taskflow_pool_completed_total", (("pool", "stdlib"),))] == 5
    assert series[("taskflow_pool_tasks_total", (("pool", "stdlib"),))] == 5
