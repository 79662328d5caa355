"""A ``stale_for`` refresh is detached work of its own: an attempt with the node's timeout from
its start, ``ctx.on_cancel``, the caller's contextvars and its outcome counted and logged, even
once the run that served the stale value has ended."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM

from taskflow import FunctionNode, ResultState, SchedulingNode, TaskContext, TaskScheduling, clock
from taskflow.cache import LruCache
from taskflow.http.clamp import for_call
from taskflow.resilience import detached

pytestmark = pytest.mark.timeout(60)

caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class WatchedCache(LruCache):
    """An LRU cache that keeps the Future of each refresh it started (resolved once the
    refresh ended: its value stored or its failure counted, its key and slot given back)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__("refresh", clock=clock)
        self.refreshed: list[Future[bool]] = []

    def refresh_with(self, key: str, runner: Any, *, keep: float,
                     timeout: float | None = None) -> Future[bool] | None:
        done = super().refresh_with(key, runner, keep=keep, timeout=timeout)
        if done is not None:
            self.refreshed.append(done)
        return done

    def ended(self, n: int) -> bool:
        """Whether refresh ``n`` (from 0) stored a new value, once it ended."""
        return self.refreshed[n].result(LONG)


class Scene:
    """A node whose first call stores "old"; once that is stale, a run serves it at once and
    its refresh calls ``refresh(ctx)``."""

    def __init__(self, refresh: Callable[[TaskContext], Any], pool: ThreadPoolExecutor, *,
                 timeout: float = LONG, **options: Any) -> None:
        self.clock = Clock()
        self.cache = WatchedCache(self.clock)
        self.pool = pool
        self.calls = 0

        def task(ctx: TaskContext, param: Any) -> Any:
            self.calls += 1
            return "old" if self.calls == 1 else refresh(ctx)

        self.node = FunctionNode(task, name="page", share_key=lambda ctx, p: "k",
                                 cache=self.cache, cache_ttl=10, stale_for=60,
                                 timeout=timeout, **options)
        assert self.run().result_of("page").result == "old"
        self.clock.now += 20  # stale from here

    def run(self, **kwargs: Any) -> Any:
        return TaskScheduling.start(self.node, executor=self.pool, timeout=LONG, **kwargs)

    def serve_stale(self, **kwargs: Any) -> Any:
        """A run served the stale value at once (its refresh started), and has returned."""
        result = self.run(**kwargs)
        wr = result.result_of("page")
        assert wr.state is ResultState.SUCCESS and wr.result == "old"
        return result


def answering(*outcomes: Any) -> Callable[[TaskContext], Any]:
    """A refresh that raises or returns each of ``outcomes`` in turn, one per call."""
    left = iter(outcomes)

    def refresh(ctx: TaskContext) -> Any:
        outcome = next(left)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return refresh


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="refresh") as p:
        yield p


@pytest.fixture(autouse=True)
def no_slot_left_held() -> Iterator[None]:
    before = detached.metrics().running
    yield
    assert detached.metrics().running == before


def test_a_refresh_is_not_cancelled_when_the_run_that_served_the_stale_value_ended(
        pool: ThreadPoolExecutor) -> None:
    run_ended = threading.Event()
    seen: list[bool] = []

    def refresh(ctx: TaskContext) -> str:
        assert run_ended.wait(LONG)
        seen.append(ctx.cancelled)
        ctx.raise_if_cancelled()  # a cooperative task goes on
        return "new"

    scene = Scene(refresh, pool)
    scene.serve_stale()
    run_ended.set()
    assert scene.cache.ended(0)
    assert seen == [False]
    assert scene.run().result_of("page").result == "new"  # fresh now
    m = scene.cache.metrics()
    assert (m.refreshes, m.errors) == (1, 0)


def test_a_refresh_has_the_node_s_timeout_from_its_start_for_its_calls(
        pool: ThreadPoolExecutor) -> None:
    run_ended = threading.Event()
    seen: dict[str, Any] = {}

    def refresh(ctx: TaskContext) -> str:
        assert run_ended.wait(LONG)
        seen["timeout"] = ctx.timeout()
        seen["headers"] = ctx.deadline_headers()
        seen["clamp"] = for_call(None)  # what the taskflow.http clients apply to a call
        return "new"

    scene = Scene(refresh, pool, timeout=LONG)
    scene.serve_stale()
    run_ended.set()
    assert scene.cache.ended(0)
    assert seen["timeout"] is not None and 0 < seen["timeout"] <= LONG
    assert "grpc-timeout" in seen["headers"]
    assert seen["clamp"] is not None and 0 < seen["clamp"].seconds <= LONG


def test_a_hung_refresh_is_cut_at_its_timeout_on_cancel_runs_and_the_key_refreshes_again(
        pool: ThreadPoolExecutor, fake_clock: Any, taskflow_logs: list[dict[str, Any]]) -> None:
    started, cancelled, release = threading.Event(), threading.Event(), threading.Event()
    after_cancel: list[bool] = []

    def refresh(ctx: TaskContext) -> str:
        if started.is_set():  # the next stale serve's refresh
            return "new"
        ctx.on_cancel(cancelled.set)
        started.set()
        clock.wait(release, None)  # hangs (blocked in virtual time) until the test releases it
        after_cancel.append(ctx.cancelled)
        return "late"

    before = detached.metrics()
    try:
        scene = Scene(refresh, pool, timeout=MEDIUM)
        scene.serve_stale()
        assert started.wait(LONG)
        assert cancelled.wait(LONG)  # its timeout passed: on_cancel ran
        assert fake_clock.now() == pytest.approx(MEDIUM)  # the refresh's own timeout, virtual
        assert scene.cache.ended(0) is False
        m = scene.cache.metrics()
        assert (m.refreshes, m.errors) == (1, 1)
        assert detached.metrics().failed == before.failed + 1
        # the key's single flight and the slot are free: the next stale serve refreshes
        scene.serve_stale()
        assert scene.cache.ended(1)
        assert scene.run().result_of("page").result == "new"
    finally:
        release.set()
    pool.shutdown(wait=True)  # the hung attempt returned and its late value was dropped
    assert after_cancel == [True]  # it saw that it was given up on
    entry = scene.cache.get("page:'k'")
    assert entry is not None and entry.value == "new"
    timed_out = [r for r in taskflow_logs
                 if "refresh of node page ended TIMEOUT" in str(r["message"])]
    assert len(timed_out) == 1 and timed_out[0]["level"].name == "WARNING"
    assert timed_out[0]["extra"]["refresh"] is True
    assert any("late result from timed-out refresh of node page dropped" in str(r["message"])
               for r in taskflow_logs)


def test_a_refresh_runs_in_the_contextvars_of_the_caller_that_served_it(
        pool: ThreadPoolExecutor) -> None:
    seen: list[str] = []

    def refresh(ctx: TaskContext) -> str:
        seen.append(caller.get())
        return "new"

    scene = Scene(refresh, pool)
    token = caller.set("page-2")
    try:
        scene.serve_stale()
    finally:
        caller.reset(token)
    assert scene.cache.ended(0)
    assert seen == ["page-2"]


def test_a_refresh_s_outcome_is_counted_and_logged_bound_to_the_run(
        pool: ThreadPoolExecutor, taskflow_logs: list[dict[str, Any]]) -> None:
    refresh = answering(RuntimeError("backend down"), "new")
    before = detached.metrics()
    scene = Scene(refresh, pool)
    failed_run = scene.serve_stale()
    assert scene.cache.ended(0) is False  # failed: counted, its key and slot given back
    assert scene.cache.metrics().errors == 1
    assert detached.metrics().failed == before.failed + 1
    ok_run = scene.serve_stale()
    assert scene.cache.ended(1)
    assert scene.run().result_of("page").result == "new"
    assert detached.metrics().succeeded == before.succeeded + 1
    lines = [r for r in taskflow_logs if r["extra"].get("refresh")]
    failed = [r for r in lines if "refresh of node page ended EXCEPTION" in str(r["message"])]
    assert len(failed) == 1 and failed[0]["level"].name == "WARNING"
    assert "backend down" in str(failed[0]["message"])
    assert failed[0]["extra"]["flow_id"] == failed_run.flow_id
    assert failed[0]["extra"]["node"] == "page"
    ended = [r for r in lines if "refresh of node page ended SUCCESS" in str(r["message"])]
    assert len(ended) == 1 and ended[0]["extra"]["flow_id"] == ok_run.flow_id


def test_a_refresh_runs_no_hook_of_its_node(pool: ThreadPoolExecutor) -> None:
    hooks: list[str] = []
    calls: list[int] = []

    class Page(SchedulingNode[Any, Any]):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            calls.append(1)
            return len(calls)

        def on_begin(self, support: Any) -> None:
            hooks.append("begin")

        def on_success(self, support: Any) -> None:
            hooks.append("success")

    clock = Clock()
    cache = WatchedCache(clock)
    node = Page(name="page", share_key=lambda ctx, p: "k", cache=cache, cache_ttl=10,
                stale_for=60, timeout=LONG)
    assert TaskScheduling.start(node, executor=pool, timeout=LONG).ok
    clock.now += 20
    assert TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("page").result == 1
    assert cache.ended(0)
    assert calls == [1, 1]
    # each run's node told its hooks once; the refresh told none
    assert hooks.count("success") == 2 and hooks.count("begin") == 1


def test_a_refresh_retries_as_the_node_does_within_its_timeout(
        pool: ThreadPoolExecutor) -> None:
    refresh = answering(OSError("flaky"), "new")
    scene = Scene(refresh, pool, retries=1)
    scene.serve_stale()
    assert scene.cache.ended(0)
    assert scene.run().result_of("page").result == "new"
    assert scene.cache.metrics().errors == 0
