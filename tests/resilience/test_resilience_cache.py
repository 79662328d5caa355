"""The in-process cache, the freshness boundaries, the codecs and the detached refreshes."""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from loguru import logger

from taskflow.cache import Cache, JsonCodec, LruCache, PickleCodec, freshness
from taskflow.errors import FlowDefinitionError
from taskflow.resilience import detached
from taskflow.resilience.cache import EXPIRED, FRESH, STALE, STALE_IF_ERROR


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def warnings() -> Any:
    lines: list[str] = []
    logger.enable("taskflow")
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    yield lines
    logger.remove(sink)
    logger.disable("taskflow")


def test_boundaries_the_edge_itself_is_expired() -> None:
    assert freshness(0.0, 10) == FRESH
    assert freshness(9.999, 10) == FRESH
    assert freshness(10.0, 10) == EXPIRED  # age == ttl is not fresh
    assert freshness(10.0, 10, stale_for=5) == STALE
    assert freshness(14.999, 10, stale_for=5) == STALE
    assert freshness(15.0, 10, stale_for=5) == EXPIRED
    assert freshness(15.0, 10, stale_for=5, stale_if_error=20) == STALE_IF_ERROR
    assert freshness(30.0, 10, stale_for=5, stale_if_error=20) == EXPIRED


def test_lru_ages_and_keeps_at_most_size_keys() -> None:
    clock = Clock()
    cache = LruCache(size=2, clock=clock)
    assert isinstance(cache, Cache)
    cache.set("a", [1], keep=10)
    clock.now += 4
    entry = cache.get("a")
    assert entry is not None and entry.value == [1] and entry.age == 4
    cache.set("b", 2, keep=10)
    cache.get("a")  # a is now the most recent
    cache.set("c", 3, keep=10)
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 2
    clock.now += 6  # a stored 10 s ago: its keep is over
    assert cache.get("a") is None


def test_lookup_counts_hits_stale_and_misses() -> None:
    clock = Clock()
    cache = LruCache(clock=clock)
    assert cache.lookup("k", 10, 5) == (EXPIRED, None)
    cache.set("k", "v", keep=15)
    assert cache.lookup("k", 10, 5) == (FRESH, "v")
    clock.now += 10
    assert cache.lookup("k", 10, 5) == (STALE, "v")
    m = cache.metrics()
    assert (m.hits, m.stale_served, m.misses) == (1, 1, 1)
    names = {s[0] for s in cache.prometheus_samples()}
    assert {"cache_hits_total", "cache_misses_total", "cache_stale_served_total",
            "cache_refreshes_total", "cache_errors_total"} <= names
    assert "cache_hits_total" in cache.prometheus_lines()


@pytest.mark.parametrize("value", [None, 1, 2.5, "é", [1, "a"], {"a": {"b": [True, None]}}])
def test_json_codec_round_trips(value: Any) -> None:
    codec = JsonCodec()
    assert codec.decode(codec.encode(value)) == value
    cache = LruCache(codec="json")
    cache.set("k", value, keep=5)
    entry = cache.get("k")
    assert entry is not None and entry.value == value


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


def test_json_refuses_what_it_cannot_encode_logged_not_cached(warnings: list[str]) -> None:
    cache = LruCache(codec="json")
    assert cache.set("k", Point(1), keep=5) is False
    assert cache.get("k") is None
    assert cache.metrics().errors == 1
    assert any("encode" in line and "'k'" in line for line in warnings)


def test_pickle_is_an_opt_in_and_round_trips_objects() -> None:
    cache = LruCache(codec="pickle")
    assert isinstance(cache.codec, PickleCodec)
    cache.set("k", Point(7), keep=5)
    entry = cache.get("k")
    assert entry is not None and entry.value.x == 7


def test_custom_codec_and_bad_codec() -> None:
    class Upper:
        def encode(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def decode(self, data: bytes) -> Any:
            return data.decode()

    cache = LruCache(codec=Upper())
    cache.set("k", "abc", keep=5)
    entry = cache.get("k")
    assert entry is not None and entry.value == "ABC"
    with pytest.raises(FlowDefinitionError, match="codec"):
        LruCache(name="bad", codec="yaml")


def test_undecodable_value_is_a_logged_miss(warnings: list[str]) -> None:
    cache = LruCache(codec="json")
    cache._set_raw("k", 0.0, b"\x80not json", 1e9)
    assert cache.lookup("k", 1e9) == (EXPIRED, None)
    assert cache.metrics().errors == 1 and any("decode" in line for line in warnings)
    assert pickle.dumps(1)  # the module keeps pickle to the opt-in codec only


def test_one_refresh_per_key_while_stale_is_served() -> None:
    clock = Clock()
    cache = LruCache(clock=clock)
    cache.set("k", "old", keep=15)
    clock.now += 11
    started, release = threading.Event(), threading.Event()
    calls = []

    def backend() -> str:
        calls.append(1)
        started.set()
        assert release.wait(10)
        return "new"

    with ThreadPoolExecutor(2) as pool:
        assert cache.lookup("k", 10, 5) == (STALE, "old")
        first = cache.refresh("k", backend, keep=15, executor=pool, timeout=10)
        assert first is not None and started.wait(10)
        # a second page meanwhile: served stale at once, no second refresh
        assert cache.lookup("k", 10, 5) == (STALE, "old")
        assert cache.refresh("k", backend, keep=15, executor=pool, timeout=10) is None
        release.set()
        assert first.result(10) is True
    assert calls == [1]
    assert cache.lookup("k", 10, 5) == (FRESH, "new")
    m = cache.metrics()
    assert (m.refreshes, m.stale_served, m.hits) == (1, 2, 1)


def test_failed_refresh_is_logged_and_the_stale_value_stays(warnings: list[str]) -> None:
    cache = LruCache()
    cache.set("k", "old", keep=100)

    def boom() -> str:
        raise RuntimeError("backend down")

    with ThreadPoolExecutor(1) as pool:
        done = cache.refresh("k", boom, keep=100, executor=pool)
        assert done is not None and done.result(10) is False
    entry = cache.get("k")
    assert entry is not None and entry.value == "old"
    assert cache.metrics().errors == 1
    assert any("refresh" in line and "backend down" in line for line in warnings)
    assert detached.metrics().running == 0


def test_refresh_with_its_own_timeout_gives_its_slot_back() -> None:
    cache = LruCache()
    release = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        done = cache.refresh("k", lambda: release.wait(10), keep=5, executor=pool,
                             timeout=0.05)
        assert done is not None and done.result(10) is False
        assert cache.get("k") is None and detached.metrics().running == 0
        release.set()


def test_refresh_refused_when_no_detached_slot() -> None:
    cache = LruCache()
    limit = detached.max_detached()
    detached.set_max_detached(1)
    try:
        assert detached.try_enter()
        try:
            with ThreadPoolExecutor(1) as pool:
                assert cache.refresh("k", lambda: 1, keep=5, executor=pool) is None
        finally:
            detached.leave(True)
    finally:
        detached.set_max_detached(limit)
    assert cache.metrics().refused == 1
    with ThreadPoolExecutor(1) as pool:  # the key is free again: a later refresh runs
        done = cache.refresh("k", lambda: 1, keep=5, executor=pool)
        assert done is not None and done.result(10) is True
