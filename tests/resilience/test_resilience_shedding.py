"""Load shedding at ``start``: sheddable runs lose first, then normal ones, critical ones never;
a shed run submits nothing; refusals are counted per priority and exported."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskflow
from taskflow import (
    Bulkhead,
    FunctionNode,
    LoadShedError,
    PoolMonitor,
    TaskScheduling,
    ThreadPool,
    run_async,
)
from taskflow.errors import FlowDefinitionError, InvalidArgumentError
from taskflow.resilience.errors import BulkheadFullError
from taskflow.resilience.shedding import shedder
from taskflow.resilience.shedding_metrics import LoadSheddingMetrics

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    taskflow.set_load_shedding()
    yield
    taskflow.set_load_shedding()


def _node(name: str = "page", **options: Any) -> FunctionNode[Any, Any]:
    return FunctionNode(lambda ctx, p: "ok", name=name, **options)


class LoadedExecutor(Executor):
    """Runs work on a real pool but reports the load the test sets; counts submissions."""

    def __init__(self, busy: int, queued: int, workers: int, full: bool = False) -> None:
        self.figures = (busy, queued, workers, full)
        self.submitted = 0
        self._pool = ThreadPoolExecutor(2)

    def taskflow_load(self) -> tuple[int, int, int, bool]:
        return self.figures

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


def _hold_workers(pool: Executor, n: int) -> threading.Event:
    """Occupy ``n`` workers of ``pool`` until the returned Event is set (each one started)."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(30)

    for _ in range(n):
        pool.submit(hold)
    for _ in range(n):
        assert started.acquire(timeout=10)
    return release


def test_a_sheddable_run_is_refused_before_anything_is_submitted_when_no_worker_is_free() -> None:
    pool = ThreadPool(core_size=2, max_size=2, name="web")
    release = _hold_workers(pool, 2)
    try:
        before = pool.metrics().task_count
        shed_before = shedder.metrics().shed["sheddable"]
        with pytest.raises(LoadShedError) as info:
            TaskScheduling.start(_node("prefetch"), executor=pool, timeout=5,
                                 priority="sheddable")
        err = info.value
        assert (err.flow, err.priority, err.resource) == ("prefetch", "sheddable", "pool 'web'")
        assert err.load == pytest.approx(1.0) and err.threshold == 1.0
        assert "nothing was submitted" in str(err)
        assert pool.metrics().task_count == before  # zero submissions
        assert shedder.metrics().shed["sheddable"] == shed_before + 1
    finally:
        release.set()
        pool.shutdown()


def test_by_default_normal_runs_are_never_shed_only_sheddable_ones() -> None:
    ex = LoadedExecutor(2, 9, 2)
    try:
        with pytest.raises(LoadShedError):
            TaskScheduling.start(_node(), executor=ex, timeout=5, priority="sheddable")
        assert ex.submitted == 0
        assert TaskScheduling.start(_node(), executor=ex, timeout=5).ok
        assert shedder.metrics().normal_at is None
    finally:
        ex.shutdown()


def test_normal_runs_are_shed_only_at_the_higher_load_and_critical_runs_never() -> None:
    taskflow.set_load_shedding(sheddable_at=1.0, normal_at=2.0)
    for busy, queued, normal_shed in ((2, 0, False), (2, 1, False), (2, 2, True), (2, 9, True)):
        ex = LoadedExecutor(busy, queued, 2)
        try:
            with pytest.raises(LoadShedError):
                TaskScheduling.start(_node(), executor=ex, timeout=5, priority="sheddable")
            if normal_shed:
                with pytest.raises(LoadShedError):
                    TaskScheduling.start(_node(), executor=ex, timeout=5)
                assert ex.submitted == 0
            else:
                assert TaskScheduling.start(_node(), executor=ex, timeout=5).ok
            result = TaskScheduling.start(_node(), executor=ex, timeout=5, priority="critical")
            assert result.ok and result.result_of("page").result == "ok"
        finally:
            ex.shutdown()


def test_an_idle_pool_sheds_nothing() -> None:
    ex = LoadedExecutor(1, 0, 2)
    try:
        for priority in ("sheddable", "normal", "critical"):
            assert TaskScheduling.start(_node(), executor=ex, timeout=5,
                                        priority=priority).ok
    finally:
        ex.shutdown()


def test_a_full_bounded_queue_sheds_normal_runs_whatever_the_thresholds() -> None:
    taskflow.set_load_shedding(sheddable_at=50.0, normal_at=100.0)
    ex = LoadedExecutor(2, 4, 2, full=True)
    try:
        with pytest.raises(LoadShedError) as info:
            TaskScheduling.start(_node(), executor=ex, timeout=5)
        assert info.value.load == float("inf")
        assert TaskScheduling.start(_node(), executor=ex, timeout=5,
                                    priority="critical").ok
    finally:
        ex.shutdown()


def test_the_stdlib_thread_pool_load_is_read_too() -> None:
    with ThreadPoolExecutor(1) as pool:
        release = _hold_workers(pool, 1)
        try:
            with pytest.raises(LoadShedError, match="ThreadPoolExecutor"):
                TaskScheduling.start(_node(), executor=pool, timeout=5, priority="sheddable")
        finally:
            release.set()


def test_a_saturated_bulkhead_sheds_the_runs_that_use_it_and_not_the_others() -> None:
    bulkhead = Bulkhead("inventory-shed", max_concurrent=1, max_waiting=1)
    permit = bulkhead.try_acquire()
    assert permit is not None
    with ThreadPoolExecutor(2) as pool:
        try:
            with pytest.raises(LoadShedError) as info:
                TaskScheduling.start(_node("stock", bulkhead=bulkhead), executor=pool,
                                     timeout=5, priority="sheddable")
            assert info.value.resource == "bulkhead 'inventory-shed'"
            # a run that does not use the bulkhead is not shed for it
            assert TaskScheduling.start(_node("other"), executor=pool, timeout=5,
                                        priority="sheddable").ok
            # the queue of one waiter taken: a normal run would be refused by the bulkhead
            ticket = bulkhead.acquire(lambda p: p.release())
            # by default a normal run is not shed: the bulkhead refuses it itself, as before
            refused = TaskScheduling.start(_node("stock", bulkhead=bulkhead), executor=pool,
                                           timeout=5)
            assert isinstance(refused.result_of("stock").exception, BulkheadFullError)
            taskflow.set_load_shedding(sheddable_at=1.0, normal_at=2.0)
            with pytest.raises(LoadShedError):
                TaskScheduling.start(_node("stock", bulkhead=bulkhead), executor=pool, timeout=5)
            # a critical one still runs: it waits for the slot like any other
            done = TaskScheduling.submit(_node("stock", bulkhead=bulkhead), executor=pool,
                                         timeout=10, priority="critical")
            permit.release()  # the ticket gets the slot and gives it back, then the run
            assert done.result(10).ok
            assert ticket.done()
        finally:
            permit.release()


def test_submit_and_run_async_shed_at_the_call() -> None:
    ex = LoadedExecutor(4, 0, 2)
    try:
        with pytest.raises(LoadShedError):
            TaskScheduling.submit(_node(), executor=ex, timeout=5, priority="sheddable")

        async def main() -> None:
            with pytest.raises(LoadShedError):
                await run_async(_node(), executor=ex, timeout=5, priority="sheddable")

        asyncio.run(main())
        assert ex.submitted == 0
    finally:
        ex.shutdown()


def test_a_nested_start_on_the_same_pool_runs_inline_and_is_never_shed() -> None:
    pool = ThreadPool(core_size=1, max_size=1, name="one")
    try:
        def outer(ctx: Any, p: Any) -> Any:
            # the one worker is busy (this task): the pool is saturated, but the nested run
            # submits nothing, so it is not shed
            inner = TaskScheduling.start(_node("inner"), executor=pool, timeout=5,
                                         priority="sheddable")
            return inner.result_of("inner").result

        result = TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool,
                                      timeout=10)
        assert result.result_of("outer").result == "ok"
    finally:
        pool.shutdown()


def test_shedding_counts_show_in_pool_monitor_and_prometheus() -> None:
    ex = LoadedExecutor(2, 0, 2)
    pool = ThreadPool(core_size=1, max_size=1, name="mon")
    try:
        for _ in range(3):
            with pytest.raises(LoadShedError):
                TaskScheduling.start(_node(), executor=ex, timeout=5, priority="sheddable")
        TaskScheduling.start(_node(), executor=ex, timeout=5, priority="critical")
        m = shedder.metrics()
        assert m.shed["sheddable"] >= 3 and m.shed["critical"] == 0
        assert m.admitted["critical"] >= 1
        monitor = PoolMonitor(pool, interval=60)
        snap = monitor.sample()
        mine = [r for r in snap.resilience if isinstance(r, LoadSheddingMetrics)]
        assert mine and mine[0].shed["sheddable"] == m.shed["sheddable"]
        text = monitor.to_prometheus()
        assert 'taskflow_runs_shed_total{shedding="runs",priority="sheddable"}' in text
        assert 'taskflow_runs_admitted_total{shedding="runs",priority="critical"}' in text
        explicit = PoolMonitor(pool, interval=60, resilience=[shedder])
        assert any(isinstance(r, LoadSheddingMetrics) for r in explicit.sample().resilience)
    finally:
        ex.shutdown()
        pool.shutdown()


def test_normal_at_none_never_sheds_normal_runs() -> None:
    taskflow.set_load_shedding(sheddable_at=1.0, normal_at=None)
    ex = LoadedExecutor(2, 50, 2)
    try:
        assert TaskScheduling.start(_node(), executor=ex, timeout=5).ok
        with pytest.raises(LoadShedError):
            TaskScheduling.start(_node(), executor=ex, timeout=5, priority="sheddable")
    finally:
        ex.shutdown()


@pytest.mark.parametrize("priority, error", [
    ("low", FlowDefinitionError), ("", FlowDefinitionError), (1, InvalidArgumentError),
    (None, InvalidArgumentError),
])
def test_an_unknown_priority_is_refused_before_anything_runs(priority: Any,
                                                              error: type[Exception]) -> None:
    ex = LoadedExecutor(0, 0, 2)
    try:
        with pytest.raises(error, match="priority must be 'critical', 'normal' or 'sheddable'"):
            TaskScheduling.start(_node(), executor=ex, timeout=5, priority=priority)
        assert ex.submitted == 0
    finally:
        ex.shutdown()


@pytest.mark.parametrize("kwargs, match", [
    ({"sheddable_at": 0}, "sheddable_at must be a load > 0"),
    ({"sheddable_at": -1.0}, "sheddable_at must be a load > 0"),
    ({"sheddable_at": float("nan")}, "sheddable_at"),
    ({"sheddable_at": True}, "sheddable_at"),
    ({"normal_at": "2"}, "normal_at must be a load > 0"),
    ({"sheddable_at": 3.0, "normal_at": 2.0}, "sheddable runs are shed first"),
])
def test_bad_thresholds_are_refused_naming_the_option(kwargs: dict[str, Any],
                                                      match: str) -> None:
    with pytest.raises(FlowDefinitionError, match=match):
        taskflow.set_load_shedding(**kwargs)
    m = shedder.metrics()
    assert (m.sheddable_at, m.normal_at) == (1.0, None)  # unchanged


@settings(max_examples=60, deadline=None)
@given(busy=st.integers(0, 8), queued=st.integers(0, 20), workers=st.integers(1, 8),
       full=st.booleans(), sheddable_at=st.floats(0.25, 4.0),
       extra=st.floats(0.0, 4.0) | st.none())
def test_shedding_is_ordered_by_priority_at_every_load(busy: int, queued: int, workers: int,
                                                       full: bool, sheddable_at: float,
                                                       extra: float | None) -> None:
    """Whatever the load and the thresholds: critical runs always pass; a normal run is shed
    only when a sheddable one would be; a shed run submitted nothing."""
    taskflow.set_load_shedding(sheddable_at=sheddable_at,
                               normal_at=None if extra is None else sheddable_at + extra)
    ex = LoadedExecutor(busy, queued, workers, full)
    try:
        outcomes = {}
        for priority in ("sheddable", "normal", "critical"):
            before = ex.submitted
            try:
                TaskScheduling.start(_node(), executor=ex, timeout=5, priority=priority)
                outcomes[priority] = True
            except LoadShedError:
                assert ex.submitted == before
                outcomes[priority] = False
        assert outcomes["critical"]
        assert outcomes["sheddable"] <= outcomes["normal"]
        load = float("inf") if full else (busy + queued) / workers
        assert outcomes["sheddable"] == (load < sheddable_at)
    finally:
        ex.shutdown()
