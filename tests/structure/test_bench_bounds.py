"""The benchmarks' arithmetic and plumbing: the physical bounds of ``benchmarks/concurrency.py``,
a tiny run of ``benchmarks/pool_throughput.py`` (no timing asserted) and the defaults of
``benchmarks/shared_cache.py``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark(name: str) -> ModuleType:
    """The module ``benchmarks/<name>.py``, imported as a script imports its siblings."""
    sys.path.insert(0, str(BENCH))  # concurrency.py and hot_path.py import overhead.py
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def conc() -> ModuleType:
    return _benchmark("concurrency")


def test_critical_path_takes_the_longest_chain(conc: ModuleType) -> None:
    graph = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    service = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 0.5}
    assert conc.critical_path(graph, service) == pytest.approx(6.5)
    assert conc.critical_path({}, {}) == 0.0


def test_product_detail_bounds(conc: ModuleType) -> None:
    """The issue's figures: 71.3 ms of sleeps per flow, a 27.3 ms critical path, 64 workers."""
    sleeps = conc.backend_sleeps(conc.PRODUCT_DETAIL)
    work = sum(sleeps.values())
    crit = conc.critical_path(conc.PRODUCT_DETAIL, sleeps)
    assert work == pytest.approx(0.0713, abs=5e-5)
    assert crit == pytest.approx(0.02726, abs=5e-5)

    b16 = conc.bounds(conc.PRODUCT_DETAIL, sleeps, 64, 16)
    assert b16["limited_by"] == "critical path"
    assert b16["max_flows_per_s"] == pytest.approx(16 / crit)
    assert b16["max_flows_per_s_pool"] == pytest.approx(64 / work)
    assert b16["mean_latency_floor_ms"] == pytest.approx(crit * 1e3)

    b64 = conc.bounds(conc.PRODUCT_DETAIL, sleeps, 64, 64)
    assert b64["limited_by"] == "pool"
    assert b64["max_flows_per_s"] == pytest.approx(64 / work)  # about 898 flows/s
    assert 895 < b64["max_flows_per_s"] < 900
    # Little's law: 64 callers at most 898 flows/s -> a mean latency of at least 71.3 ms
    assert b64["mean_latency_floor_ms"] == pytest.approx(work * 1e3)


def test_no_op_graph_has_no_physical_bound(conc: ModuleType) -> None:
    graph = conc.layers(depth=4, width=5, max_fathers=2, seed=20)
    b = conc.bounds(graph, dict.fromkeys(graph, 0.0), 64, 16)
    assert b["max_flows_per_s"] is None and b["limited_by"] is None
    assert b["mean_latency_floor_ms"] is None
    assert conc.reachable(b, 5000.0, 10.0) == {
        "flows_per_s": None, "p99": None, "p99_target_ms": None, "tail_mean_ms": None}


def test_reachable_targets(conc: ModuleType) -> None:
    graph = {"a": [], "b": ["a"]}
    service = {"a": 0.010, "b": 0.010}  # work 20 ms, critical path 20 ms
    b = conc.bounds(graph, service, 4, 4)  # pool 200/s, path 200/s, floor 20 ms
    assert b["max_flows_per_s"] == pytest.approx(200.0)
    assert b["mean_latency_floor_ms"] == pytest.approx(20.0)
    # the hand-written runner at 190 flows/s: 1.1x = 209 > 200, unreachable
    r = conc.reachable(b, 190.0, 40.0)
    assert r["flows_per_s"] is False
    assert r["p99"] is True and r["p99_target_ms"] == pytest.approx(32.0)
    assert conc.reachable(b, 150.0, 40.0)["flows_per_s"] is True
    # a target under the critical path: no flow can be that fast
    below = conc.reachable(b, 150.0, 24.0)
    assert below["p99"] is False and below["tail_mean_ms"] is None
    # between the critical path and the mean-latency floor: only by starving the slowest 1 %
    b8 = conc.bounds(graph, service, 4, 8)  # pool-bound: 200/s, floor 40 ms
    r8 = conc.reachable(b8, 150.0, 45.0)  # target 36 ms
    assert r8["p99"] is False
    assert r8["tail_mean_ms"] == pytest.approx((40.0 - 0.99 * 36.0) / 0.01)


def test_against_bounds_adds_efficiency(conc: ModuleType) -> None:
    row = {
        "bounds": {"max_flows_per_s": 200.0, "mean_latency_floor_ms": 20.0,
                   "critical_path_ms": 20.0},
        "taskflow": {"flows_per_s": 180.0, "mean_ms": 22.0, "p99_ms": 30.0},
        "hand": {"flows_per_s": 190.0, "mean_ms": 21.0, "p99_ms": 28.0},
    }
    conc._against_bounds(row)
    assert row["taskflow"]["efficiency"] == pytest.approx(0.9)
    assert row["hand"]["mean_vs_floor"] == pytest.approx(1.05)
    assert row["targets_reachable"]["flows_per_s"] is False


@pytest.fixture(scope="module")
def pool_bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("pool_throughput")
    finally:
        sys.path.remove(str(BENCH))


def test_the_pool_benchmark_runs_every_ratio_it_prints(
    pool_bench: ModuleType, capsys: pytest.CaptureFixture[str],
) -> None:
    """A tiny run (no timing asserted): every ratio is computed, ``--own-cost`` included."""
    result = pool_bench.main(["--tasks", "500", "--round-trips", "100", "--rounds", "1",
                              "--repeats", "1", "--own-cost", "--no-pin"])
    assert set(result) == {"round trip", "throughput", "monitoring overhead",
                           "monitoring own cost"}
    assert all(value > 0 for value in result.values())
    assert "TPE, full-pool skip" in capsys.readouterr().out


def test_the_own_cost_baseline_is_a_working_pool_that_bursts_full_width(
    pool_bench: ModuleType,
) -> None:
    import threading

    from conftest import LONG

    pool = pool_bench.FullPoolSkip(3)
    try:
        for _ in range(4):
            barrier = threading.Barrier(3, timeout=LONG)
            futures = [pool.submit(barrier.wait) for _ in range(3)]
            for f in futures:
                f.result(timeout=2 * LONG)
        assert [pool.submit(pow, 2, i).result(timeout=LONG) for i in range(5)] == [1, 2, 4, 8, 16]
    finally:
        pool.shutdown(wait=True)


def test_open_loop_measures_every_flow_from_its_arrival(conc: ModuleType) -> None:
    """``measure`` with a rate: every flow runs once, at or after its arrival (no timing
    asserted beyond order)."""
    import threading
    import time

    starts: list[float] = []
    lock = threading.Lock()

    def run() -> bool:
        with lock:
            starts.append(time.perf_counter())
        return True

    t0 = time.perf_counter()
    m = conc.measure(run, 3, 12, rate=2000.0)
    assert (m["flows"], m["failed"]) == (12, 0)
    assert m["p50_ms"] >= 0 and m["p99_ms"] >= m["p50_ms"]
    assert len(starts) == 12
    assert max(starts) - t0 >= 11 / 2000.0  # the last arrival is 11 intervals after the first


@pytest.fixture(scope="module")
def hot() -> ModuleType:
    return _benchmark("hot_path")


def test_the_page_shape_is_nineteen_backends_into_one_assembly(hot: ModuleType) -> None:
    graph = hot.fan()
    assert list(graph) == [f"b{i}" for i in range(19)] + ["page"]
    assert graph["page"] == [f"b{i}" for i in range(19)]
    assert all(graph[f"b{i}"] == [] for i in range(19))


@pytest.mark.timeout(120)
def test_the_hot_path_benchmark_runs_every_measurement_in_smoke_mode(
    hot: ModuleType, capsys: pytest.CaptureFixture[str],
) -> None:
    # a regression that breaks a measurement (a nested run that cannot run inline, a baseline
    # that deadlocks) shows here; no figure is asserted
    assert hot.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    for shape in ("fan 19->1", "chain 20"):
        assert out.count(shape) == 3, out
    assert "us per node more" in out and "KiB" in out


def test_the_shared_cache_benchmark_runs_the_four_workers_its_docstring_states() -> None:
    shared_cache = _benchmark("shared_cache")
    args = shared_cache.parser().parse_args([])
    assert (args.workers, args.keys, args.pages) == (4, 20, 400)
    default_line = next(line for line in shared_cache.__doc__.splitlines()
                        if line.strip().startswith("python benchmarks/shared_cache.py  "))
    assert default_line.endswith("# 4 workers, 20 keys, 400 pages each")


@pytest.mark.timeout(120)
def test_the_async_nodes_benchmark_runs_every_section_in_smoke_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # every section completes: the sync and async page, one open-loop step of each of the four
    # systems with both ratios, and the three memory measurements; no figure is asserted
    out = _benchmark("async_nodes").main(["--smoke"])
    assert set(out) == {"page", "capacity", "memory"}
    assert set(out["page"]) == {"async", "sync"} and all(s > 0 for s in out["page"].values())
    rows = out["capacity"]["rows"]
    assert set(rows) == {"sync-16", "sync-64", "async", "gather"}
    assert all(row["steps"] and row["steps"][0]["flows"] > 0 for row in rows.values())
    assert set(out["memory"]) == {"async", "gather", "sync"}
    printed = capsys.readouterr().out
    for line in ("sync / async", "async / sync-16", "async / gather", "memory:", "KiB heap"):
        assert line in printed, printed


def test_the_async_nodes_capacity_is_the_highest_rate_that_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rising rates and the bisection, on a fake step that passes up to 100 pages/s."""
    bench = _benchmark("async_nodes")
    tried: list[float] = []

    def fake_step(system: object, rate: float, duration: float, min_pages: int) -> dict:
        tried.append(rate)
        return {"rate": rate, "passed": rate <= 100.0, "failed": 0, "flows": 1,
                "p50_ms": 1.0, "p99_ms": 1.0, "cpu_ms_per_flow": 1.0}

    class Idle:
        name = "fake"

        def open(self) -> None: ...

        def close(self) -> None: ...

        def run(self) -> bool:
            return True

    monkeypatch.setattr(bench, "step", fake_step)
    row = bench.capacity(Idle(), 1.0, 1, lambda line: None, first=8.0, refine=3)
    assert tried[:6] == pytest.approx([8.0, 12.0, 18.0, 27.0, 40.5, 60.75])
    assert tried[6] == pytest.approx(91.125) and tried[7] == pytest.approx(136.6875)
    assert len(tried) == 8 + 3
    assert 91.125 <= row["capacity"] <= 100.0 < row["first_failed"] <= 136.6875
    assert row["at_capacity"]["rate"] == row["capacity"]
    # a system failing at the first rate is tried lower until one passes
    tried.clear()
    low = bench.capacity(Idle(), 1.0, 1, lambda line: None, first=400.0, refine=0)
    assert tried == pytest.approx([400.0, 400 / 1.5, 400 / 1.5**2, 400 / 1.5**3, 400 / 1.5**4])
    assert low["capacity"] == pytest.approx(400 / 1.5**4)
