"""Batched nodes in runs: the nodes of a batch that are ready together make one call, concurrent
runs share calls within a window, waiting holds no worker (any batched flow completes on a
one-worker pool), a node whose run ended leaves its call, and every way a call fails reaches
each node with its cause."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, SHORT, parse_prometheus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resilience_helpers import wait_until

from taskflow import (
    Batch,
    BatchCallError,
    BatchKeyError,
    BatchResultError,
    FanOutNode,
    FlowDefinitionError,
    FunctionNode,
    InvalidNodeError,
    Join,
    PoolMonitor,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    ThreadPool,
    UnhashableKeyError,
)
from taskflow.testing import FakeClock

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)




class Backend:
    """A ``get_many``: records each call's keys, answers ``{key: f"v-{key}"}``; ``gate`` holds
    every call until set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[list[Any]] = []
        self.limits: list[float | None] = []
        self.threads: list[str] = []
        self.gate = gate
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, keys: Any) -> dict[Any, Any]:
        with self.lock:
            self.calls.append(list(keys))
            self.limits.append(keys.timeout)
            self.threads.append(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(LONG)
        return {k: f"v-{k}" for k in keys}


def unused(ctx: Any, param: Any) -> Any:
    raise AssertionError("a batched node's own function is never called")


def fan_of(batch: Batch, skus: list[str], **options: Any) -> tuple[FunctionNode, list[FunctionNode]]:
    """A root and one batched node per sku below it: they are ready together."""
    root = FunctionNode(lambda ctx, p: "page", name="page")
    nodes = [FunctionNode(unused, param=sku, name=f"price-{sku}", batch=batch, **options)
             for sku in skus]
    root >> nodes
    return root, nodes


@pytest.fixture(params=["stdlib", "threadpool"])
def one_worker(request: pytest.FixtureRequest) -> Iterator[Any]:
    pool: Any = (ThreadPoolExecutor(1, thread_name_prefix="batch-one") if request.param == "stdlib"
                 else ThreadPool(1, thread_name_prefix="batch-one"))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True)


SKUS = [f"sku-{n}" for n in range(30)]


# -- gathering ------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 4])
def test_the_ready_nodes_of_a_batch_make_one_call(workers: int) -> None:
    backend = Backend()
    batch = Batch("prices-gather", backend)
    root, nodes = fan_of(batch, SKUS)
    with ThreadPoolExecutor(workers, thread_name_prefix="batch-gather") as pool:
        for _ in range(20):
            result = TaskScheduling.start(root, executor=pool, timeout=LONG)
            assert result.ok, result.summary
            assert result.outputs == {"page": "page", **{f"price-{s}": f"v-{s}" for s in SKUS}}
    assert [sorted(call) for call in backend.calls] == [sorted(SKUS)] * 20
    labels = {result[f"price-{s}"].work_result.batch for s in SKUS}
    assert len(labels) == 1 and labels.pop().startswith("prices-gather#")
    assert result["page"].work_result.batch is None
    m = batch.metrics()
    assert (m.calls, m.keys, m.largest, m.waiting) == (20, 600, 30, 0)


def test_two_batches_ready_together_make_one_call_each() -> None:
    prices, stock = Backend(), Backend()
    pb, sb = Batch("prices-two", prices), Batch("stock-two", stock)
    root = FunctionNode(lambda ctx, p: None, name="page")
    for sku in SKUS:
        root >> FunctionNode(unused, param=sku, name=f"price-{sku}", batch=pb)
        root >> FunctionNode(unused, param=sku, name=f"stock-{sku}", batch=sb)
    with ThreadPoolExecutor(8, thread_name_prefix="batch-two") as pool:
        for _ in range(20):
            assert TaskScheduling.start(root, executor=pool, timeout=LONG).ok
    for backend in (prices, stock):
        assert [sorted(call) for call in backend.calls] == [sorted(SKUS)] * 20


def test_more_ready_nodes_than_max_size_make_several_calls(one_worker: Any) -> None:
    backend = Backend()
    batch = Batch("prices-split", backend, max_size=10)
    skus = SKUS[:25]
    root, _ = fan_of(batch, skus)
    result = TaskScheduling.start(root, executor=one_worker, timeout=LONG)
    assert result.ok, result.summary
    assert sorted(map(len, backend.calls)) == [5, 10, 10]
    assert sorted(k for call in backend.calls for k in call) == sorted(skus)
    assert len({result[f"price-{s}"].work_result.batch for s in skus}) == 3
    assert result.outputs[f"price-{skus[-1]}"] == f"v-{skus[-1]}"


def test_a_key_function_reads_the_key_and_nodes_with_one_key_share_it() -> None:
    backend = Backend()
    batch = Batch("prices-key", backend, key=lambda ctx, p: p["sku"])
    root = FunctionNode(lambda ctx, p: None, name="page")
    for n in range(6):
        root >> FunctionNode(unused, param={"sku": f"s{n % 3}", "slot": n}, name=f"tile-{n}",
                             batch=batch)
    with ThreadPoolExecutor(2, thread_name_prefix="batch-key") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok
    assert [sorted(call) for call in backend.calls] == [["s0", "s1", "s2"]]
    assert [result.outputs[f"tile-{n}"] for n in range(6)] == [f"v-s{n % 3}" for n in range(6)]


def sku_key(ctx: Any, p: Any) -> Any:
    """A key function that cannot read the key of the param ``"bad"``."""
    if p == "bad":
        raise LookupError("no sku in param")
    return p


def test_a_key_function_that_fails_fails_its_node_only() -> None:
    backend = Backend()

    batch = Batch("prices-badkey", backend, key=sku_key)
    root, _ = fan_of(batch, ["a", "bad", "b"])
    root >> FunctionNode(unused, param=["unhashable"], name="price-list", batch=batch)
    with ThreadPoolExecutor(1, thread_name_prefix="batch-badkey") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert [sorted(call) for call in backend.calls] == [["a", "b"]]
    assert isinstance(result["price-bad"].work_result.exception, LookupError)
    error = result["price-list"].work_result.exception
    assert isinstance(error, UnhashableKeyError)
    assert "node 'price-list' (batch 'prices-badkey')" in str(error)
    assert result.outputs["price-a"] == "v-a"


def test_a_first_node_whose_key_fails_lets_the_others_go_on_without_it() -> None:
    backend = Backend()

    batch = Batch("prices-leader", backend, key=sku_key)
    root = FunctionNode(lambda ctx, p: None, name="page")
    # popped first (highest priority), it takes the others along, then its own key fails
    bad = FunctionNode(unused, param="bad", name="bad", batch=batch, priority=10)
    root >> [bad, *[FunctionNode(unused, param=s, name=s, batch=batch) for s in "abc"]]
    with ThreadPoolExecutor(1, thread_name_prefix="batch-leader") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert isinstance(result["bad"].work_result.exception, LookupError)
    assert [sorted(call) for call in backend.calls] == [["a", "b", "c"]]
    assert {result.outputs[s] for s in "abc"} == {"v-a", "v-b", "v-c"}


def test_min_budget_refuses_a_batched_node_before_it_takes_a_seat() -> None:
    backend = Backend()
    batch = Batch("prices-min-budget", backend)
    root = FunctionNode(lambda ctx, p: None, name="page")
    greedy = FunctionNode(unused, param="greedy", name="greedy", batch=batch, priority=10,
                          min_budget=LONG * 2)
    root >> [greedy, *[FunctionNode(unused, param=s, name=s, batch=batch) for s in "ab"]]
    with ThreadPoolExecutor(1, thread_name_prefix="batch-min") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    wr = result["greedy"].work_result
    assert wr.state is ResultState.TIMEOUT and wr.batch is None
    assert [sorted(call) for call in backend.calls] == [["a", "b"]]


# -- waiting holds no worker ------------------------------------------------------------------------

@pytest.mark.parametrize("window", [0.0, SHORT])
def test_batched_flows_complete_on_a_one_worker_pool(one_worker: Any, window: float) -> None:
    prices, stock = Backend(), Backend()
    pb = Batch("prices-one", prices, window=window)
    sb = Batch("stock-one", stock, window=window, max_size=2)
    root = FunctionNode(lambda ctx, p: None, name="page")
    tiles = []
    for sku in SKUS[:5]:
        price = FunctionNode(unused, param=sku, name=f"price-{sku}", batch=pb)
        level = FunctionNode(unused, param=sku, name=f"stock-{sku}", batch=sb)
        tile = FunctionNode(lambda ctx, p: (ctx.result_of(f"price-{p}"),
                                            ctx.result_of(f"stock-{p}")), param=sku,
                            name=f"tile-{sku}")
        root >> [price, level]
        [price, level] >> tile
        tiles.append(tile)
    # a chain of batched nodes below the tiles: each one's call waits for the one before
    last = FunctionNode(unused, param="total", name="total", batch=pb)
    tiles >> last
    tail = FunctionNode(unused, param="tail", name="tail", batch=sb)
    last >> tail
    for _ in range(3):
        result = TaskScheduling.start(root, executor=one_worker, timeout=LONG)
        assert result.ok, result.summary
        assert result.outputs["tile-sku-3"] == ("v-sku-3", "v-sku-3")
        assert result.outputs["tail"] == "v-tail"
    assert all(len(call) <= 2 for call in stock.calls)


def test_a_nested_run_with_a_window_completes_on_the_pool_its_caller_holds() -> None:
    backend = Backend()
    batch = Batch("prices-nested", backend, window=SHORT)
    inner_root, _ = fan_of(batch, SKUS[:4])

    def outer(ctx: Any, p: Any) -> Any:
        inner = TaskScheduling.start(inner_root, executor=pool, timeout=LONG)
        return inner.outputs

    with ThreadPoolExecutor(1, thread_name_prefix="batch-nested") as pool:
        result = TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool,
                                      timeout=LONG)
    assert result.ok, result.summary
    assert result.outputs["outer"]["price-sku-2"] == "v-sku-2"
    assert [sorted(call) for call in backend.calls] == [sorted(SKUS[:4])]


# -- across runs ---------------------------------------------------------------------------------

def test_concurrent_runs_share_one_call_across_runs() -> None:
    backend = Backend()
    runs = 8
    batch = Batch("prices-across", backend, window=LONG, max_size=runs, across_runs=True)
    node = FunctionNode(unused, param=None, name="price", batch=batch,
                        )
    with ThreadPoolExecutor(2, thread_name_prefix="batch-across") as pool:
        futures = []
        for n in range(runs):
            node.param = f"sku-{n}"
            futures.append(TaskScheduling.submit(node, executor=pool, timeout=LONG))
            wait_until(lambda n=n: batch.metrics().waiting == n + 1 or backend.calls != [])
        results = [f.result(LONG) for f in futures]
    assert backend.calls == [[f"sku-{n}" for n in range(runs)]]  # the last one filled it
    assert [r.outputs["price"] for r in results] == [f"v-sku-{n}" for n in range(runs)]
    assert len({r["price"].work_result.batch for r in results}) == 1


def test_a_call_whose_window_passes_is_handed_to_a_worker() -> None:
    backend = Backend()
    batch = Batch("prices-window", backend, window=MEDIUM, across_runs=True)
    node = FunctionNode(unused, param="a", name="price", batch=batch)
    with ThreadPoolExecutor(1, thread_name_prefix="batch-window") as pool:
        first = TaskScheduling.submit(node, executor=pool, timeout=LONG)
        wait_until(lambda: batch.metrics().waiting == 1)
        node.param = "b"
        second = TaskScheduling.start(node, executor=pool, timeout=LONG)  # joins the open call
        assert first.result(LONG).outputs == {"price": "v-a"}
    assert second.outputs == {"price": "v-b"}
    assert backend.calls == [["a", "b"]]
    assert backend.threads[0].startswith("batch-window")  # a worker ran it, not the timer


# -- a node whose run ended ------------------------------------------------------------------------

def test_a_node_whose_run_ended_leaves_its_call_and_the_others_still_get_theirs() -> None:
    backend = Backend()
    batch = Batch("prices-leave", backend, window=LONG, max_size=2, across_runs=True)
    node = FunctionNode(unused, param="short", name="price", batch=batch)
    with ThreadPoolExecutor(2, thread_name_prefix="batch-leave") as pool, FakeClock() as fake:
        short = TaskScheduling.submit(node, executor=pool, timeout=MEDIUM)
        wait_until(lambda: batch.metrics().waiting == 1)
        fake.advance(MEDIUM)  # its budget passes while it waits for the call
        ended = short.result(LONG)
        assert batch.metrics().left == 1 and batch.metrics().waiting == 0
        node.param = "long-1"
        first = TaskScheduling.submit(node, executor=pool, timeout=LONG)
        wait_until(lambda: batch.metrics().waiting == 1)
        node.param = "long-2"
        second = TaskScheduling.start(node, executor=pool, timeout=LONG)  # fills the call
        assert first.result(LONG).outputs == {"price": "v-long-1"}
    assert second.outputs == {"price": "v-long-2"}
    assert backend.calls == [["long-1", "long-2"]]  # the key of the run that ended is not sent
    wr = ended["price"].work_result
    assert wr.state is ResultState.TIMEOUT and wr.result is None and wr.batch is None


def test_a_run_that_ends_while_its_call_runs_never_sees_the_value() -> None:
    gate = threading.Event()
    backend = Backend(gate)
    batch = Batch("prices-running", backend, window=LONG, max_size=2, across_runs=True)
    node = FunctionNode(unused, param="short", name="price", batch=batch)
    try:
        with ThreadPoolExecutor(2, thread_name_prefix="batch-running") as pool, \
                FakeClock() as fake:
            short = TaskScheduling.submit(node, executor=pool, timeout=MEDIUM)
            wait_until(lambda: batch.metrics().waiting == 1)
            node.param = "long"
            long = TaskScheduling.submit(node, executor=pool, timeout=LONG)
            assert backend.entered.wait(LONG)  # the call runs, holding both seats
            fake.advance(MEDIUM)  # the short run's budget passes meanwhile
            ended = short.result(LONG)
            gate.set()
            kept = long.result(LONG)
    finally:
        gate.set()
    assert backend.calls == [["short", "long"]]
    assert ended["price"].work_result.state is ResultState.TIMEOUT
    assert ended["price"].work_result.result is None
    assert kept.outputs == {"price": "v-long"}
    assert batch.metrics().left == 1


def test_a_node_cancelled_by_its_join_leaves_its_seat() -> None:
    backend = Backend()
    batch = Batch("prices-cancel", backend, window=LONG, across_runs=True)
    slow = FunctionNode(unused, param="never", name="slow", batch=batch)
    fast = FunctionNode(lambda ctx, p: "fast", name="fast")
    join = FunctionNode(lambda ctx, p: "joined", name="join", join=Join.ANY)
    join.depends_on(slow)
    join.depends_on(fast)
    with ThreadPoolExecutor(2, thread_name_prefix="batch-cancel") as pool:
        result = TaskScheduling.start([slow, fast], executor=pool, timeout=LONG)
    assert result.outputs["join"] == "joined"
    assert result["slow"].work_result.state is ResultState.CANCELLED
    wait_until(lambda: batch.metrics().left == 1)  # its seat is given back on the owner
    assert batch.metrics().waiting == 0 and backend.calls == []


def test_a_node_timeout_while_waiting_for_the_call_ends_only_that_node() -> None:
    backend = Backend()
    batch = Batch("prices-own-timeout", backend, window=MEDIUM)
    root = FunctionNode(lambda ctx, p: None, name="page")
    quick = FunctionNode(unused, param="quick", name="quick", batch=batch, timeout=SHORT)
    patient = FunctionNode(unused, param="patient", name="patient", batch=batch)
    root >> [quick, patient]
    with ThreadPoolExecutor(2, thread_name_prefix="batch-own") as pool, \
            FakeClock(autojump=True):
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result["quick"].work_result.finished_at - result.started_at == pytest.approx(SHORT)
    assert result["quick"].work_result.state is ResultState.TIMEOUT
    assert result.outputs["patient"] == "v-patient"
    assert backend.calls == [["patient"]]


# -- failures --------------------------------------------------------------------------------------

def test_a_key_missing_from_the_answer_fails_that_node_with_a_key_error() -> None:
    batch = Batch("prices-missing", lambda keys: {k: 1.0 for k in keys if k != "sku-9"})
    root, _ = fan_of(batch, ["sku-1", "sku-9", "sku-2"])
    with ThreadPoolExecutor(2, thread_name_prefix="batch-missing") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    wr = result["price-sku-9"].work_result
    assert wr.state is ResultState.EXCEPTION
    assert isinstance(wr.exception, KeyError) and isinstance(wr.exception, BatchKeyError)
    assert "returned no value for key 'sku-9'" in str(wr.exception)
    assert result.outputs["price-sku-1"] == 1.0 and result.outputs["price-sku-2"] == 1.0


def test_a_failed_call_fails_every_node_with_the_cause_and_fallback_applies() -> None:
    boom = ConnectionError("price backend down")
    seen: list[BaseException] = []

    def fn(keys: Any) -> Any:
        raise boom

    batch = Batch("prices-fail", fn)
    root = FunctionNode(lambda ctx, p: None, name="page")
    plain = FunctionNode(unused, param="a", name="plain", batch=batch)
    kept = FunctionNode(unused, param="b", name="kept", batch=batch,
                        fallback=lambda ctx, error: (seen.append(error), "cached")[1])
    after = FunctionNode(lambda ctx, p: ctx.result_of("kept") + "!", name="after")
    root >> [plain, kept]
    kept >> after
    with ThreadPoolExecutor(2, thread_name_prefix="batch-fail") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    error = result["plain"].work_result.exception
    assert isinstance(error, BatchCallError) and error.__cause__ is boom and error.key == "a"
    assert result["kept"].work_result.state is ResultState.DEGRADED
    assert result.outputs["after"] == "cached!"
    assert len(seen) == 1 and seen[0].__cause__ is boom
    assert batch.metrics().failed == 1 and batch.metrics().calls == 1


def test_a_function_that_returns_no_mapping_fails_its_nodes_naming_the_batch() -> None:
    batch = Batch("prices-list", lambda keys: [1.0 for _ in keys])
    root, _ = fan_of(batch, ["a", "b"])
    with ThreadPoolExecutor(2, thread_name_prefix="batch-list") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    for name in ("price-a", "price-b"):
        error = result[name].work_result.exception
        assert isinstance(error, TypeError) and isinstance(error, BatchResultError)
        assert "batch 'prices-list'" in str(error) and "returned list" in str(error)


def test_the_call_gets_the_earliest_remaining_budget_as_its_time_limit() -> None:
    backend = Backend()
    batch = Batch("prices-limit", backend)
    root, _ = fan_of(batch, ["a", "b"])
    with ThreadPoolExecutor(1, thread_name_prefix="batch-limit") as pool:
        TaskScheduling.start(root, executor=pool, timeout=LONG)
        TaskScheduling.start(root, executor=pool)  # no budget: no limit
    bounded, unbounded = backend.limits
    assert bounded is not None and 0.0 < bounded <= LONG
    assert unbounded is None


# -- fan-out items --------------------------------------------------------------------------------

class SkuFan(FanOutNode[list[str]]):
    """Items are skus; the batch answers them (no ``work``)."""

    def items(self, ctx: TaskContext, param: list[str]) -> Iterator[tuple[str, str]]:
        for sku in param:
            yield sku, sku


@pytest.mark.parametrize("workers", [1, 3])
def test_fan_out_items_are_answered_by_batch_calls(workers: int) -> None:
    backend = Backend()
    batch = Batch("prices-fan", backend, max_size=20)
    skus = [f"sku-{n}" for n in range(50)]
    fan = SkuFan(skus, name="prices", batch=batch, max_concurrency=2)
    with ThreadPoolExecutor(workers, thread_name_prefix="batch-fan") as pool:
        result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    fan_in = result.outputs["prices"]
    assert fan_in.complete and fan_in.succeeded == {s: f"v-{s}" for s in skus}
    assert sorted(map(len, backend.calls)) == [10, 20, 20]


def test_fan_out_items_share_a_windowed_call_with_the_nodes_of_their_run() -> None:
    backend = Backend()
    batch = Batch("prices-fan-window", backend, window=SHORT, max_size=100)
    root = FunctionNode(lambda ctx, p: None, name="page")
    fan = SkuFan(["a", "b", "c"], name="items", batch=batch)
    single = FunctionNode(unused, param="d", name="single", batch=batch)
    root >> [fan, single]
    with ThreadPoolExecutor(1, thread_name_prefix="batch-fan-window") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert sorted(k for call in backend.calls for k in call) == ["a", "b", "c", "d"]
    assert len(backend.calls) == 1
    assert result.outputs["items"].succeeded == {"a": "v-a", "b": "v-b", "c": "v-c"}


def test_a_fan_out_whose_run_ends_leaves_its_items_seats() -> None:
    batch = Batch("prices-fan-leave", Backend(), window=LONG, across_runs=True)
    fan = SkuFan(["a", "b"], name="items", batch=batch)
    with ThreadPoolExecutor(2, thread_name_prefix="batch-fan-leave") as pool, \
            FakeClock(autojump=True):
        result = TaskScheduling.start(fan, executor=pool, timeout=MEDIUM)
    assert result.elapsed == pytest.approx(MEDIUM)
    assert result["items"].work_result.state is ResultState.TIMEOUT
    assert result["items"].work_result.result.missing == ["a", "b"]
    m = batch.metrics()
    assert m.waiting == 0 and m.left == 2


def test_failed_batched_items_fail_the_fan_in_with_the_cause() -> None:
    batch = Batch("prices-fan-fail", lambda keys: {k: 1 for k in keys if k != "b"})
    fan = SkuFan(["a", "b"], name="items", batch=batch, policy="best_effort")
    with ThreadPoolExecutor(2, thread_name_prefix="batch-fan-fail") as pool:
        result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
    fan_in = result.outputs["items"]
    assert fan_in.succeeded == {"a": 1} and isinstance(fan_in.failed["b"], BatchKeyError)


# -- what a report and a monitor show ----------------------------------------------------------------

def test_the_report_and_the_page_say_which_nodes_one_call_answered() -> None:
    batch = Batch("prices-report", Backend())
    root, _ = fan_of(batch, ["a", "b"])
    with ThreadPoolExecutor(1, thread_name_prefix="batch-report") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    report = {n.name: n for n in result.report().nodes}
    label = report["price-a"].batch
    assert label is not None and label == report["price-b"].batch
    assert report["page"].batch is None
    assert f"batch {label}" in result["price-a"].work_result.marks
    assert f"batch {label}" in result.to_html()


def test_a_monitor_exports_the_batch_with_its_pool() -> None:
    batch = Batch("prices-monitor", Backend())
    root, _ = fan_of(batch, ["a", "b", "c"])
    with ThreadPoolExecutor(1, thread_name_prefix="batch-monitor") as pool:
        TaskScheduling.start(root, executor=pool, timeout=LONG)
        with PoolMonitor(pool, interval=LONG, resilience=[batch]) as monitor:
            snap = monitor.sample()
            text = monitor.to_prometheus()
    (metrics,) = snap.resilience
    assert metrics.name == "prices-monitor" and metrics.calls == 1 and metrics.keys == 3
    _, series = parse_prometheus(text)
    assert series[("taskflow_batch_calls_total", (("batch", "prices-monitor"),))] == 1


# -- definitions ---------------------------------------------------------------------------------------

def test_options_a_batched_node_cannot_use_are_refused_naming_the_node() -> None:
    from taskflow import Bulkhead, Hedge

    batch = Batch("prices-options", Backend())
    with pytest.raises(FlowDefinitionError, match="node 'p': a batched node does not retry"):
        FunctionNode(unused, name="p", batch=batch, retries=2)
    node = FunctionNode(unused, name="p", batch=batch)
    with pytest.raises(FlowDefinitionError, match="a batched node does not retry"):
        node.retries = 1
    with pytest.raises(FlowDefinitionError, match=r"node 'p': batch .* for bulkhead"):
        FunctionNode(unused, name="p", batch=batch,
                     bulkhead=Bulkhead("batch-options", max_concurrent=1))
    with pytest.raises(FlowDefinitionError, match="for hedge"):
        FunctionNode(unused, name="p", batch=batch, hedge=Hedge(after=0.1), idempotent=True)
    with pytest.raises(FlowDefinitionError, match="for share_key"):
        FunctionNode(unused, name="p", batch=batch, share_key=lambda ctx, p: p)
    with pytest.raises(FlowDefinitionError, match="batch must be a taskflow.Batch"):
        FunctionNode(unused, name="p", batch=lambda keys: {})  # type: ignore[arg-type]
    with pytest.raises(InvalidNodeError, match="did you mean 'batch'"):
        FunctionNode(unused, name="p", bacth=batch)  # type: ignore[call-arg]

    class Hooked(SchedulingNode[str, str]):
        def task(self, ctx: TaskContext, param: str) -> str:
            return param

        def on_begin(self, support: Any) -> None:
            pass

    with pytest.raises(InvalidNodeError, match="overrides on_begin, which a batched node"):
        Hooked("a", name="hooked", batch=batch)
    with pytest.raises(FlowDefinitionError, match="item_timeout does not apply to batched"):
        SkuFan([], name="fan", batch=batch, item_timeout=1.0)
    fan = SkuFan([], name="fan", item_timeout=1.0)
    with pytest.raises(FlowDefinitionError, match="item_timeout does not apply to batched"):
        fan.batch = batch


def test_a_batched_node_is_refused_on_a_process_pool_before_anything_runs() -> None:
    from concurrent.futures import ProcessPoolExecutor

    node = FunctionNode(unused, param="a", name="price", batch=Batch("prices-remote", Backend()))
    pool = ProcessPoolExecutor(1)
    try:
        with pytest.raises(FlowDefinitionError,
                           match="node 'price': batch is not supported on ProcessPoolExecutor"):
            TaskScheduling.start(node, executor=pool, timeout=LONG)
    finally:
        pool.shutdown()


def test_a_subclass_node_is_answered_by_its_batch_without_its_task() -> None:
    class Price(SchedulingNode[str, str]):
        def task(self, ctx: TaskContext, param: str) -> str:
            raise AssertionError("not called")

        def on_success(self, support: Any) -> None:
            hooks.append(support.work_result.result)

    hooks: list[str] = []
    node = Price("a", name="price", batch=Batch("prices-class", Backend()))
    with ThreadPoolExecutor(1, thread_name_prefix="batch-class") as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.outputs == {"price": "v-a"} and hooks == ["v-a"]
    assert result["price"].work_result.attempts == 1


def test_an_overridden_batched_node_does_the_overrides_work_and_the_others_batch() -> None:
    backend = Backend()
    batch = Batch("prices-override", backend)
    root, _ = fan_of(batch, ["a", "b", "c"])
    fan = SkuFan(["x", "y"], name="items", batch=batch)
    root >> fan
    with ThreadPoolExecutor(1, thread_name_prefix="batch-override") as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG,
                                      overrides={"price-b": 1.5, "items": "stub"})
    assert result.ok, result.summary
    assert result.outputs["price-b"] == 1.5 and result.outputs["items"] == "stub"
    assert result["price-b"].work_result.batch is None
    assert [sorted(call) for call in backend.calls] == [["a", "c"]]


# -- random flows --------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.lists(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1,
                                max_size=6), min_size=1, max_size=4),
       max_size=st.integers(1, 4), workers=st.integers(1, 3), window=st.booleans(),
       seed=st.randoms(use_true_random=False))
def test_random_batched_flows_answer_every_node_once_within_max_size(
        layers: list[list[tuple[int, bool]]], max_size: int, workers: int, window: bool,
        seed: Any) -> None:
    backends = [Backend() for _ in range(3)]
    batches = [Batch(f"random-{n}", backends[n], max_size=max_size,
                     window=SHORT / 5 if window else 0.0) for n in range(3)]
    made: list[list[Any]] = []
    expected: dict[str, Any] = {}
    for depth, layer in enumerate(layers):
        row = []
        for n, (b, batched) in enumerate(layer):
            name = f"n{depth}-{n}"
            if batched:
                node = FunctionNode(unused, param=name, name=name, batch=batches[b])
                expected[name] = f"v-{name}"
            else:
                node = FunctionNode(lambda ctx, p: p, param=name, name=name)
                expected[name] = name
            for father in made[-1] if made else []:
                if seed.random() < 0.5:
                    father >> node
            row.append(node)
        made.append(row)
    nodes = [n for row in made for n in row]
    with ThreadPoolExecutor(workers, thread_name_prefix="batch-random") as pool:
        result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert result.outputs == expected
    sent = [k for b in backends for call in b.calls for k in call]
    assert sorted(sent) == sorted(k for k, v in expected.items() if v == f"v-{k}")  # once each
    for b, backend in zip(batches, backends, strict=True):
        assert all(len(call) <= max_size for call in backend.calls)
        m = b.metrics()
        assert m.calls == len(backend.calls) <= m.keys and m.waiting == 0
