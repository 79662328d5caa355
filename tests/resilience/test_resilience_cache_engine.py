"""``cache=``, ``stale_if_error`` on a node: a failed call served from the cache, DEGRADED."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from taskflow import FunctionNode, ResultState, TaskScheduling
from taskflow.cache import LruCache
from taskflow.errors import FlowDefinitionError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(node: Any, pool: ThreadPoolExecutor) -> Any:
    result = TaskScheduling.start(node, executor=pool, timeout=10)
    return {node.name: result.result_of(node.name)}


def test_stale_if_error_serves_the_kept_value_degraded_with_the_cause() -> None:
    clock = Clock()
    cache = LruCache("price", clock=clock)
    answers: list[Any] = [{"p": 1}, RuntimeError("backend down")]

    def price(ctx: Any, param: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    node = FunctionNode(price, name="price", share_key=lambda ctx, p: "k", cache_ttl=10,
                           cache=cache, stale_if_error=60, fallback={"p": 0})
    with ThreadPoolExecutor(2) as pool:
        first = _run(node, pool)
        assert first["price"].state is ResultState.SUCCESS
        clock.now += 30  # past the ttl, within ttl + stale_if_error
        second = _run(node, pool)
    wr = second["price"]
    assert wr.state is ResultState.DEGRADED
    assert wr.result == {"p": 1}  # the stale value first, the fallback not used
    assert isinstance(wr.exception, RuntimeError)
    assert cache.metrics().stale_served == 1


def test_past_stale_if_error_the_fallback_stands_in() -> None:
    clock = Clock()
    cache = LruCache("q", clock=clock)
    calls = iter([1])

    def q(ctx: Any, param: Any) -> Any:
        return next(calls)  # the second call raises StopIteration

    node = FunctionNode(q, name="q", share_key=lambda ctx, p: "k", cache_ttl=10,
                           cache=cache, stale_if_error=5, fallback=-1)
    with ThreadPoolExecutor(2) as pool:
        assert _run(node, pool)["q"].result == 1
        clock.now += 15  # age == ttl + stale_if_error: expired
        wr = _run(node, pool)["q"]
    assert wr.state is ResultState.DEGRADED and wr.result == -1


def test_cache_options_need_share_key_and_ttl() -> None:
    with pytest.raises(FlowDefinitionError, match="need share_key and cache_ttl"):
        FunctionNode(lambda ctx, p: 1, name="n", stale_for=5)
    with pytest.raises(FlowDefinitionError, match="must implement"):
        FunctionNode(lambda ctx, p: 1, name="m", share_key=lambda c, p: 1, cache_ttl=1,
                        cache=object())  # type: ignore[arg-type]


def test_stale_for_serves_at_once_while_one_refresh_runs() -> None:
    import threading

    clock = Clock()
    cache = LruCache("swr", clock=clock)
    started, release, stored = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def page(ctx: Any, param: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the refresh
            started.set()
            assert release.wait(10)
        return len(calls)

    node = FunctionNode(page, name="page", share_key=lambda ctx, p: "k", cache_ttl=10,
                        cache=cache, stale_for=60, timeout=5)
    with ThreadPoolExecutor(4) as pool:
        assert _run(node, pool)["page"].result == 1
        clock.now += 20
        served = _run(node, pool)["page"]  # returns while the refresh is still running
        assert served.state is ResultState.SUCCESS and served.result == 1
        assert started.wait(10)
        again = _run(node, pool)["page"]  # a second stale page: no second refresh
        assert again.result == 1
        real_set = cache.set

        def spy(*a: Any, **k: Any) -> bool:
            ok = real_set(*a, **k)
            stored.set()
            return ok

        cache.set = spy  # type: ignore[method-assign]
        release.set()
        assert stored.wait(10)
        assert _run(node, pool)["page"].result == 2  # the refreshed value, fresh
    assert len(calls) == 2
    m = cache.metrics()
    assert (m.refreshes, m.stale_served) == (1, 2)


def test_a_monitor_exports_the_cache_with_its_pool() -> None:
    from conftest import parse_prometheus

    from taskflow.observe.monitor import PoolMonitor

    cache = LruCache("pages-monitor")
    node = FunctionNode(lambda ctx, p: 1, name="n", share_key=lambda ctx, p: "k",
                        cache_ttl=60, cache=cache)
    with ThreadPoolExecutor(1) as pool:
        _run(node, pool)
        _run(node, pool)
        with PoolMonitor(pool, interval=60, resilience=[cache]) as monitor:
            snap = monitor.sample()
            text = monitor.to_prometheus()
    (metrics,) = snap.resilience
    assert metrics.name == "pages-monitor" and (metrics.hits, metrics.misses) == (1, 1)
    _, series = parse_prometheus(text)
    assert series[("taskflow_cache_hits_total", (("cache", "pages-monitor"),))] == 1
