"""PoolMonitor: snapshots, psutil figures, thresholds and alarms, Prometheus text."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, SHORT
from loguru import logger
from pydantic import ValidationError

from taskflow.metrics import PoolMetrics
from taskflow.observe.monitor import PoolMonitor
from taskflow.observe.prometheus import render_prometheus
from taskflow.observe.snapshots import Alarm, PoolSnapshot, Thresholds
from taskflow.pools.monitored import MonitoredExecutor
from taskflow.pools.threadpool import ThreadPool


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()


@pytest.fixture
def pool(gate: threading.Event) -> Iterator[ThreadPool]:
    p = ThreadPool(1, 2, queue_capacity=2, name="orders")
    yield p
    gate.set()
    p.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Messages taskflow logs at WARNING and above while the test runs."""
    lines: list[str] = []
    logger.enable("taskflow")
    sink = logger.add(lambda m: lines.append(str(m).rstrip()), level="WARNING", format="{message}")
    yield lines
    logger.remove(sink)
    logger.disable("taskflow")


def saturate(pool: ThreadPool, gate: threading.Event) -> list[Future[Any]]:
    """Both threads busy, the queue full, one task rejected."""
    started = threading.Semaphore(0)

    def blocker() -> None:
        started.release()
        assert gate.wait(LONG)

    futures = [pool.submit(blocker) for _ in range(4)]
    for _ in range(2):
        assert started.acquire(timeout=LONG)
    with pytest.raises(RuntimeError):
        pool.submit(blocker)
    return futures


def wait_until(predicate: Callable[[], bool], timeout: float = LONG) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# ---------------------------------------------------------------------- configuration
def test_thresholds_override_defaults_one_by_one(pool: ThreadPool) -> None:
    monitor = PoolMonitor(pool, thresholds={"liveness_pct": 90, "rejected": None})
    t = monitor.thresholds
    assert (t.liveness_pct, t.rejected) == (90, None)
    assert (t.queue_usage_pct, t.abandoned_running, t.silence_s) == (70.0, 1, 120.0)
    assert PoolMonitor(pool).thresholds == Thresholds()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval": 0},
        {"history_size": 0},
        {"thresholds": {"livenes_pct": 90}},  # misspelt: refused, not ignored
        {"thresholds": {"queue_usage_pct": -1}},
        {"thresholds": {"silence_s": -5}},
    ],
)
def test_bad_monitor_arguments_raise_value_error(pool: ThreadPool, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PoolMonitor(pool, **kwargs)


# ---------------------------------------------------------------------- snapshots
def test_sample_has_pool_and_process_figures(pool: ThreadPool) -> None:
    pool.submit(int).result(timeout=LONG)
    snap = PoolMonitor(pool).sample()
    assert isinstance(snap.pool, PoolMetrics) and snap.pool.completed_task_count == 1
    assert snap.pool_name == "orders"
    p = snap.process
    assert p.pid == os.getpid()
    assert p.rss_bytes and p.rss_bytes > 0 and p.vms_bytes and p.vms_bytes >= p.rss_bytes
    assert p.num_threads and p.num_threads >= 2  # this thread and the pool's
    assert p.cpu_percent is not None and p.cpu_percent >= 0
    assert p.ctx_switches_voluntary is not None and p.ctx_switches_involuntary is not None
    assert p.cpu_user_s is not None and p.cpu_user_s > 0
    if os.name == "posix":
        assert p.num_fds and p.num_fds > 0
    assert snap.worker_cpu_s is not None and snap.worker_cpu_s >= 0
    with pytest.raises(ValidationError):
        snap.tps = 1.0  # type: ignore[misc]
    assert PoolSnapshot.model_validate_json(snap.model_dump_json()) == snap


def test_any_executor_gets_process_figures_only() -> None:
    with ThreadPoolExecutor(1) as executor:
        snap = PoolMonitor(executor).sample()
    assert snap.pool is None and snap.alarms == () and snap.tps is None
    assert snap.process.rss_bytes
    assert snap.pool_name == "ThreadPoolExecutor"


def test_monitored_executor_gives_pool_figures() -> None:
    with ThreadPoolExecutor(2) as inner:
        mon = MonitoredExecutor(inner, name="wrapped")
        mon.submit(int).result(timeout=LONG)
        snap = PoolMonitor(mon).sample()
    assert snap.pool is not None and snap.pool.completed_task_count == 1
    assert snap.pool_name == "wrapped" and snap.worker_cpu_s is not None


def test_tps_is_computed_between_samples(pool: ThreadPool) -> None:
    monitor = PoolMonitor(pool)
    first = monitor.sample()
    assert first.tps is None
    for f in [pool.submit(int) for _ in range(2)]:
        f.result(timeout=LONG)
    second = monitor.sample()
    assert second.tps is not None and second.tps > 0


def test_history_is_bounded_and_latest_is_last(pool: ThreadPool) -> None:
    monitor = PoolMonitor(pool, history_size=3)
    assert monitor.latest() is None and monitor.history() == []
    snaps = [monitor.sample() for _ in range(5)]
    assert monitor.history() == snaps[-3:]
    assert monitor.latest() is snaps[-1]


def test_background_thread_samples_until_stopped(pool: ThreadPool) -> None:
    with PoolMonitor(pool, interval=SHORT / 5, history_size=4) as monitor:
        thread = monitor._thread
        assert thread is not None and thread.daemon
        assert thread.name == "taskflow-monitor-orders"
        assert monitor.latest() is not None  # start() samples once at once
        wait_until(lambda: len(monitor.history()) == 4)
        with pytest.raises(RuntimeError, match="already running"):
            monitor.start()
    assert not thread.is_alive()


def test_a_failing_sample_does_not_kill_the_monitor(log_lines: list[str]) -> None:
    calls = 0

    class Flaky(ThreadPoolExecutor):
        def metrics(self) -> PoolMetrics:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise OSError("metrics unavailable")
            return base.metrics()

    with Flaky(1) as executor:
        base = MonitoredExecutor(executor)
        with PoolMonitor(executor, interval=SHORT / 5):
            wait_until(lambda: calls >= 4)
    assert any("sampling failed" in line for line in log_lines)


# ---------------------------------------------------------------------- alarms
def test_default_alarms_fire_then_stay_silent(
    pool: ThreadPool, gate: threading.Event, log_lines: list[str]
) -> None:
    futures = saturate(pool, gate)
    pool.mark_abandoned(futures[0])
    alarms: list[Alarm] = []
    monitor = PoolMonitor(pool, on_alarm=alarms.append)
    snap = monitor.sample()
    assert {a.kind for a in snap.alarms} == {"liveness", "queue_usage", "rejected", "abandoned"}
    assert list(snap.alarms) == alarms
    by_kind = {a.kind: a for a in alarms}
    assert (by_kind["liveness"].value, by_kind["liveness"].threshold) == (100.0, 70.0)
    assert by_kind["rejected"].value == 1 and by_kind["abandoned"].value == 1
    assert all(a.pool_name == "orders" for a in alarms)
    assert sum("alarm" in line and "'orders'" in line for line in log_lines) == 4

    assert monitor.sample().alarms == ()  # silenced for silence_s
    assert len(alarms) == 4


def test_alarms_repeat_after_the_silence_period(pool: ThreadPool, gate: threading.Event) -> None:
    saturate(pool, gate)
    monitor = PoolMonitor(pool, thresholds={"silence_s": 0})
    assert len(monitor.sample().alarms) == 3
    # no new rejection since the previous sample: the rejection alarm does not repeat
    assert {a.kind for a in monitor.sample().alarms} == {"liveness", "queue_usage"}


def test_thresholds_can_be_raised_or_turned_off(pool: ThreadPool, gate: threading.Event) -> None:
    saturate(pool, gate)
    monitor = PoolMonitor(
        pool, thresholds=Thresholds(liveness_pct=None, queue_usage_pct=101, rejected=2)
    )
    assert monitor.sample().alarms == ()


def test_queue_alarm_needs_a_bounded_queue(gate: threading.Event) -> None:
    started = threading.Event()

    def blocker() -> None:
        started.set()
        assert gate.wait(LONG)

    with ThreadPool(1) as unbounded:
        unbounded.submit(blocker)
        assert started.wait(LONG)
        unbounded.submit(int)
        kinds = {a.kind for a in PoolMonitor(unbounded).sample().alarms}
        gate.set()
    assert kinds == {"liveness"}


def queued_behind_a_slow_task(executor: Executor, n: int) -> None:
    """One task that works 50 ms, then n quick tasks queued behind it on a 1-thread pool."""
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.05)  # stands in for 50 ms of work

    futures = [executor.submit(slow)]
    assert started.wait(LONG)
    futures += [executor.submit(int) for _ in range(n)]
    for f in futures:
        f.result(timeout=LONG)


@pytest.mark.parametrize("kind", ["ThreadPool", "MonitoredExecutor"])
def test_queue_wait_alarm_says_what_to_resize(kind: str) -> None:
    """Tasks that wait longer than they run: the pool is too small, and the alarm says so."""
    with ThreadPool(1, name="small") if kind == "ThreadPool" else MonitoredExecutor(
        ThreadPoolExecutor(1), name="small"
    ) as executor:
        monitor = PoolMonitor(executor, thresholds={"liveness_pct": None})
        assert monitor.sample().alarms == ()  # the first sample only sets the baseline
        queued_behind_a_slow_task(executor, 4)
        alarms = monitor.sample().alarms
    assert [a.kind for a in alarms] == ["queue_wait"]
    alarm = alarms[0]
    assert alarm.value >= 3 and alarm.threshold == 1.0  # 4 tasks waited ~50 ms each: 200 / 50
    assert "the pool is the bottleneck" in alarm.message
    if kind == "ThreadPool":
        assert "Raise core_size (now 1; with an unbounded queue" in alarm.message
    else:
        assert "Raise max_size (now 1)" in alarm.message


def test_no_queue_wait_alarm_when_tasks_do_not_wait() -> None:
    with ThreadPool(2) as pool:
        monitor = PoolMonitor(pool)
        monitor.sample()
        for _ in range(20):
            pool.submit(time.sleep, 0.001).result(timeout=LONG)  # one at a time: no queue
        assert [a.kind for a in monitor.sample().alarms if a.kind == "queue_wait"] == []
    assert PoolMonitor(pool, thresholds={"queue_wait_ratio": None}).thresholds.queue_wait_ratio is None


def test_on_alarm_errors_are_logged_and_ignored(
    pool: ThreadPool, gate: threading.Event, log_lines: list[str]
) -> None:
    saturate(pool, gate)

    def broken(alarm: Alarm) -> None:
        raise ValueError("callback broke")

    snap = PoolMonitor(pool, on_alarm=broken).sample()
    assert len(snap.alarms) == 3
    assert sum("on_alarm callback raised" in line for line in log_lines) == 3


def test_on_alarm_errors_are_logged_as_text_not_as_a_record_exception(
    pool: ThreadPool, gate: threading.Event, taskflow_logs: list[dict[str, Any]]
) -> None:
    # a record's exception lets a diagnose=True sink print the callback's variables
    saturate(pool, gate)

    def broken(alarm: Alarm) -> None:
        raise ValueError("callback broke")

    PoolMonitor(pool, on_alarm=broken).sample()
    records = [r for r in taskflow_logs if "on_alarm callback raised" in str(r["message"])]
    assert len(records) == 3
    for record in records:
        assert record["exception"] is None
        assert "ValueError: callback broke" in str(record["message"])


# ---------------------------------------------------------------------- Prometheus
_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>[a-zA-Z_]\w*="(?:[^"\\]|\\.)*"'
    r'(?:,[a-zA-Z_]\w*="(?:[^"\\]|\\.)*")*)\})? (?P<value>[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|NaN|Inf))$'
)


def parse_exposition(text: str) -> dict[str, str]:
    """Check the text format line by line; return each family's TYPE."""
    types: dict[str, str] = {}
    helps: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in helps, f"HELP twice for {name}"
            helps.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in types, f"TYPE twice for {name}"
            assert kind in {"gauge", "counter", "summary"}
            types[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"bad sample line: {line!r}"
            name = match["name"]
            family = re.sub(r"_(sum|count)$", "", name) if name not in types else name
            assert family in types, f"sample before its TYPE: {line!r}"
    assert helps == set(types)
    return types


def test_to_prometheus_renders_the_text_exposition_format(pool: ThreadPool) -> None:
    for f in [pool.submit(int) for _ in range(3)]:
        f.result(timeout=LONG)
    monitor = PoolMonitor(pool)
    text = monitor.to_prometheus()  # samples at call time
    types = parse_exposition(text)
    assert types["taskflow_pool_tasks_total"] == "counter"
    assert types["taskflow_pool_active"] == "gauge"
    assert types["taskflow_pool_run_seconds"] == "summary"
    assert 'taskflow_pool_completed_total{pool="orders"} 3\n' in text
    assert 'taskflow_pool_queue_capacity{pool="orders"} 2\n' in text
    assert 'taskflow_pool_run_seconds{pool="orders",quantile="0.99"} ' in text
    assert 'taskflow_pool_run_seconds_count{pool="orders"} 3\n' in text
    assert "taskflow_process_resident_memory_bytes " in text
    assert 'taskflow_process_context_switches_total{kind="voluntary"} ' in text
    assert monitor.latest() is None  # a scrape is not recorded in the history


def test_a_scrape_is_fresh_even_when_the_last_sample_is_old(pool: ThreadPool) -> None:
    monitor = PoolMonitor(pool, interval=3600)
    monitor.sample()
    for f in [pool.submit(int) for _ in range(2)]:
        f.result(timeout=LONG)
    assert 'taskflow_pool_completed_total{pool="orders"} 2\n' in monitor.to_prometheus()
    assert len(monitor.history()) == 1


def test_prometheus_of_several_pools_names_each_family_once() -> None:
    with ThreadPool(1, name='say "hi"\\now') as odd, ThreadPool(1, name="plain") as plain:
        snaps = [PoolMonitor(p).sample() for p in (odd, plain)]
    text = render_prometheus(snaps)
    parse_exposition(text)
    assert 'taskflow_pool_max_size{pool="say \\"hi\\"\\\\now"} 1\n' in text
    assert 'taskflow_pool_max_size{pool="plain"} 1\n' in text
    # an unbounded queue has no capacity series; the process is rendered once
    assert "taskflow_pool_queue_capacity{" not in text
    assert text.count("\ntaskflow_process_threads ") == 1


def test_prometheus_of_a_plain_executor_has_process_figures_only() -> None:
    with ThreadPoolExecutor(1) as executor:
        text = PoolMonitor(executor).to_prometheus()
    assert "taskflow_pool_" not in text
    parse_exposition(text)
    assert render_prometheus([]) == ""
