"""``taskflow.observe.stats``: counts, windowed percentiles, critical path, Prometheus, run log."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostile_flow import NAME_A, NAME_B, NAME_C, hostile_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskflow.observe.stats
from taskflow import FlowResult, FunctionNode, Join, TaskContext, TaskScheduling
from taskflow.observe.stats import FlowStats, RunLog, critical_path

prometheus_client = pytest.importorskip("prometheus_client")
parser = pytest.importorskip("prometheus_client.parser")
text_string_to_metric_families = parser.text_string_to_metric_families


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="stats-test") as ex:
        yield ex


def _ok(ctx: TaskContext, param: object) -> int:
    return 1


def _bad(ctx: TaskContext, param: object) -> None:
    raise ValueError("no")


def _run_mixed(pool: ThreadPoolExecutor) -> FlowResult:
    root = FunctionNode(_ok, name="root")
    root >> [FunctionNode(_ok, name="ok"), FunctionNode(_bad, name="bad")]
    return TaskScheduling.start(root, executor=pool, timeout=30)


def test_counts_by_state_and_percentiles(pool: ThreadPoolExecutor) -> None:
    stats = FlowStats()
    for _ in range(20):
        stats.record_run(_run_mixed(pool), flow="mixed")
    snap = stats.snapshot()
    (flow,) = snap.flows
    assert (flow.flow, flow.runs, flow.by_status) == ("mixed", 20, {"FAILED": 20})
    nodes = {n.node: n for n in flow.nodes}
    assert nodes["ok"].counts == {"SUCCESS": 20} and nodes["bad"].counts == {"EXCEPTION": 20}
    for n in nodes.values():
        assert n.runs == 20
        assert n.duration is not None and n.duration.count == 20
        assert n.duration.p50 <= n.duration.p90 <= n.duration.p99 <= n.duration.max
        assert n.queue_wait is not None and n.queue_wait.count == 20
    assert flow.elapsed is not None and flow.elapsed.count == 20
    assert snap.model_dump_json()  # JSON-ready


def test_window_keeps_only_the_last_samples(pool: ThreadPoolExecutor) -> None:
    stats = FlowStats(window=5, runs=None)
    durations = []
    for _ in range(12):
        result = _run_mixed(pool)
        durations.append(result.result_of("ok").duration)
        stats.record_run(result, flow="w")
    node = next(n for n in stats.snapshot().flows[0].nodes if n.node == "ok")
    assert node.counts == {"SUCCESS": 12}  # counts are not windowed
    assert node.duration is not None and node.duration.count == 5
    last = sorted(d for d in durations[-5:] if d is not None)
    assert (node.duration.min, node.duration.max) == (last[0], last[-1])


def test_flow_name_defaults_to_the_first_node(pool: ThreadPoolExecutor) -> None:
    stats = FlowStats()
    stats.record_run(_run_mixed(pool))
    assert [f.flow for f in stats.snapshot().flows] == ["root"]


def test_critical_path_follows_the_father_that_was_waited_for(pool: ThreadPoolExecutor) -> None:
    c_done = threading.Event()

    def fast(ctx: TaskContext, param: object) -> None:
        c_done.set()

    def slow(ctx: TaskContext, param: object) -> None:
        assert c_done.wait(10)  # b ends after c

    a = FunctionNode(_ok, name="a")
    b = FunctionNode(slow, name="b")
    c = FunctionNode(fast, name="c")
    d = FunctionNode(_ok, name="d")
    a >> [b, c]
    [b, c] >> d
    stats = FlowStats()
    for _ in range(3):
        result = TaskScheduling.start(a, executor=pool, timeout=30)
        c_done.clear()
        assert critical_path(result) == ["a", "b", "d"]
        stats.record_run(result, flow="diamond")
    nodes = {n.node: n for n in stats.snapshot().flows[0].nodes}
    assert {k: v.critical for k, v in nodes.items()} == {"a": 3, "b": 3, "c": 0, "d": 3}
    assert nodes["c"].critical_share == 0.0 and nodes["d"].critical_share == 1.0


def test_critical_path_of_join_any_goes_through_the_father_that_fired_it(
    pool: ThreadPoolExecutor,
) -> None:
    gate = threading.Event()

    def slow(ctx: TaskContext, param: object) -> None:
        gate.wait(10)

    fast = FunctionNode(_ok, name="fast")
    slowpoke = FunctionNode(slow, name="slow")
    son = FunctionNode(lambda ctx, p: gate.set(), name="son", join=Join.ANY)
    [fast, slowpoke] >> son
    result = TaskScheduling.start([fast, slowpoke], executor=pool, timeout=30)
    gate.set()
    assert critical_path(result) == ["fast", "son"]


@st.composite
def dags(draw: st.DrawFn) -> list[list[int]]:
    n = draw(st.integers(1, 8))
    return [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
            for i in range(n)]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dags(), st.sets(st.integers(0, 7), max_size=2))
def test_critical_path_is_a_chain_ending_at_the_last_node(
    pool: ThreadPoolExecutor, fathers: list[list[int]], failing: set[int]
) -> None:
    nodes = [FunctionNode(_bad if i in failing else _ok, name=f"n{i}")
             for i in range(len(fathers))]
    for i, fs in enumerate(fathers):
        for f in fs:
            nodes[f] >> nodes[i]
    result = TaskScheduling.start(nodes, executor=pool, timeout=30)
    path = critical_path(result)
    assert path  # roots always run
    ran = {n: result.result_of(n) for n in result if result.result_of(n).started_at is not None}
    assert set(path) <= set(ran)
    last = max(wr.finished_at or 0.0 for wr in ran.values())
    assert result.result_of(path[-1]).finished_at == last
    for father, son in itertools.pairwise(path):
        assert father in {f.name for f in result[son].father_handler}


def test_max_series_bounds_memory(pool: ThreadPoolExecutor) -> None:
    stats = FlowStats(max_series=2, runs=None)
    for _ in range(3):
        stats.record_run(_run_mixed(pool), flow="f")
    snap = stats.snapshot()
    assert len(snap.flows[0].nodes) == 2
    assert snap.dropped_results == 3  # one untracked node in each of 3 runs
    assert all(n.runs == 3 for n in snap.flows[0].nodes)


def test_concurrent_recording_loses_nothing(pool: ThreadPoolExecutor) -> None:
    results = [_run_mixed(pool) for _ in range(5)]
    stats = FlowStats(window=16)
    threads_n, per_thread = 8, 25
    barrier = threading.Barrier(threads_n)

    def record() -> None:
        barrier.wait()
        for i in range(per_thread):
            stats.record_run(results[i % len(results)], flow=f"flow{i % 2}")

    threads = [threading.Thread(target=record, name=f"stats-recorder-{i}")
               for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = stats.snapshot()
    assert sum(f.runs for f in snap.flows) == threads_n * per_thread
    for f in snap.flows:
        for n in f.nodes:
            assert sum(n.counts.values()) == f.runs
            assert n.duration is not None and n.duration.count == 16


def _samples(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def test_prometheus_text_escapes_labels_and_histograms_are_cumulative(
    pool: ThreadPoolExecutor,
) -> None:
    stats = FlowStats()
    for _ in range(3):
        stats.record_run(hostile_run(pool), flow='shop"\n\\')
    text = stats.to_prometheus()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    hist = families["taskflow_node_duration_seconds"]
    assert hist.type == "histogram"
    names = {s.labels["node"] for s in hist.samples}
    assert names == {NAME_A, NAME_B, NAME_C}  # labels round-trip exactly
    assert {s.labels["flow"] for s in hist.samples} == {'shop"\n\\'}
    for node in names:
        for state in {s.labels["state"] for s in hist.samples if s.labels["node"] == node}:
            series = [s for s in hist.samples
                      if s.labels["node"] == node and s.labels["state"] == state]
            buckets = [s.value for s in series if s.name.endswith("_bucket")]
            count = next(s.value for s in series if s.name.endswith("_count"))
            assert buckets == sorted(buckets) and buckets[-1] == count == 3
    results = families["taskflow_node_results"]
    states = {(s.labels["node"], s.labels["state"]): s.value for s in results.samples
              if s.name == "taskflow_node_results_total"}
    assert states[(NAME_C, "EXCEPTION")] == 3 and states[(NAME_B, "SUCCESS")] == 3
    assert "taskflow_flow_runs" in families and "taskflow_node_critical_path" in families


def test_prometheus_client_collector_matches_the_text(pool: ThreadPoolExecutor) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    stats = FlowStats()
    for _ in range(2):
        stats.record_run(hostile_run(pool), flow="shop")
    registry = CollectorRegistry()
    registry.register(stats.collector())
    scraped = generate_latest(registry).decode()
    assert _samples(scraped) == _samples(stats.to_prometheus())


def test_run_log_keeps_recent_and_slowest(pool: ThreadPoolExecutor) -> None:
    log = RunLog(recent=3, slowest=2)
    results = [_run_mixed(pool) for _ in range(7)]
    for r in results:
        log.add(r, "f")
    assert [k.flow_id for k in log.recent()] == [r.flow_id for r in results[::-1][:3]]
    slowest = sorted(results, key=lambda r: r.elapsed, reverse=True)[:2]
    assert [k.flow_id for k in log.slowest()] == [r.flow_id for r in slowest]
    kept = log.get(slowest[0].flow_id)
    assert kept is not None and kept.result is slowest[0] and kept.status == "FAILED"
    gone = [r for r in results[:4] if r not in slowest]
    assert gone and all(log.get(r.flow_id) is None for r in gone)
    log.clear()
    assert log.recent() == [] and log.slowest() == []


def test_process_wide_stats(pool: ThreadPoolExecutor) -> None:
    taskflow.observe.stats.STATS.reset()
    try:
        taskflow.observe.stats.record_run(_run_mixed(pool), flow="global")
        assert [f.flow for f in taskflow.observe.stats.snapshot().flows] == ["global"]
        assert 'flow="global"' in taskflow.observe.stats.to_prometheus()
        assert taskflow.observe.stats.STATS.runs is not None and len(taskflow.observe.stats.STATS.runs.recent()) == 1
    finally:
        taskflow.observe.stats.STATS.reset()


@pytest.mark.parametrize(
    "kwargs",
    [{"window": 0}, {"buckets": (0.1, 0.05)}, {"buckets": ()}, {"buckets": (0, 1)},
     {"max_series": 0}],
)
def test_bad_options_raise(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        FlowStats(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RunLog(recent=-1)


def test_readme_section_runs_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Seeing what happened"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    taskflow.observe.stats.STATS.reset()
    try:
        exec(compile(code.group(1), "README: Seeing what happened", "exec"), {})
    finally:
        taskflow.observe.stats.disable()
        taskflow.observe.stats.STATS.reset()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["price", "product", "stock"]
    assert lines[2].startswith("stock {'EXCEPTION': 20} p99 ")
    assert lines[1].endswith("on the critical path in 100% of runs")


def test_enabled_stats_record_every_run_as_it_ends(pool: ThreadPoolExecutor) -> None:
    stats = FlowStats()
    assert not stats.enabled
    stats.enable()
    stats.enable()  # idempotent
    try:
        assert stats.enabled
        for i in range(3):
            root = FunctionNode(_ok, name="root")
            root >> [FunctionNode(_ok, name="ok"), FunctionNode(_bad, name="bad")]
            result = TaskScheduling.start(root, executor=pool, timeout=30, name="mixed")
            # recorded before start returned
            (flow,) = stats.snapshot().flows
            assert (flow.flow, flow.runs) == ("mixed", i + 1)
        future = TaskScheduling.submit(FunctionNode(_ok, name="solo"), executor=pool, timeout=30)
        solo = future.result(30)
        assert stats.runs is not None and stats.runs.recent()[0].flow_id == solo.flow_id
    finally:
        stats.disable()
    assert not stats.enabled
    TaskScheduling.start(FunctionNode(_ok, name="solo"), executor=pool, timeout=30)
    flows = {f.flow: f for f in stats.snapshot().flows}
    assert set(flows) == {"mixed", "solo"} and flows["solo"].runs == 1
    nodes = {n.node: n for n in flows["mixed"].nodes}
    assert nodes["bad"].counts == {"EXCEPTION": 3}
    assert nodes["root"].queue_wait is not None and nodes["root"].queue_wait.count == 3
    assert nodes["root"].critical == 3  # every run waited for root
    assert result.flow_name == "mixed"


def test_nested_runs_are_recorded_under_their_own_names() -> None:
    stats = FlowStats(runs=None)
    stats.enable()
    try:
        with ThreadPoolExecutor(1) as one:
            def outer(ctx: TaskContext, param: object) -> object:
                inner = FunctionNode(_ok, name="inner")
                return TaskScheduling.start(inner, executor=one, timeout=30,
                                            name="inner_flow").outputs
            TaskScheduling.start(FunctionNode(outer, name="outer"), executor=one, timeout=30)
    finally:
        stats.disable()
    assert [(f.flow, f.runs) for f in stats.snapshot().flows] == [("inner_flow", 1), ("outer", 1)]


def test_the_process_wide_statistics_are_off_until_enabled(pool: ThreadPoolExecutor) -> None:
    assert not taskflow.observe.stats.STATS.enabled
    taskflow.observe.stats.enable()
    try:
        assert taskflow.observe.stats.STATS.enabled
    finally:
        taskflow.observe.stats.disable()
    assert not taskflow.observe.stats.STATS.enabled
