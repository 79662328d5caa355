"""``RedisCache`` against a real ``redis-server`` started on a free port for this module.

Without the binary these tests skip saying so, unless ``TASKFLOW_REQUIRE_REDIS=1`` (CI sets it):
then they fail.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from loguru import logger

from taskflow.cache import RedisCache
from taskflow.resilience.cache import EXPIRED, FRESH, STALE

if os.environ.get("TASKFLOW_REQUIRE_REDIS") == "1":
    import redis  # required: a missing client fails the module
else:
    redis = pytest.importorskip("redis", reason="the redis client is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="taskflow-redis-")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        end = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > end or self.proc.poll() is not None:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("TASKFLOW_REQUIRE_REDIS") == "1":
            pytest.fail(f"TASKFLOW_REQUIRE_REDIS=1 but {message}")
        pytest.skip(message)
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    if redis_server.proc is None:
        redis_server.start()
    redis.Redis.from_url(redis_server.url).flushdb()
    return redis_server.url


def _worker(url: str, start: Any, values: Any) -> None:
    # one "gunicorn worker": look the key up, call the backend (an INCR the test reads) on a
    # miss, under the cross-process lock so the other worker waits for the stored value
    cache = RedisCache(url, prefix="t:")
    backend = redis.Redis.from_url(url)
    assert start.wait(10)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        state, value = cache.lookup("page", 60)
        if state == FRESH:
            values.put(value)
            return
        if cache.begin_refresh("page", 5):
            value = {"n": int(backend.incr("backend_calls"))}
            cache.set("page", value, keep=60)
            cache.end_refresh("page")
            values.put(value)
            return
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_two_processes_share_one_backend_call(url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, values = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, start, values)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    got = [values.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got == [{"n": 1}, {"n": 1}]
    assert int(redis.Redis.from_url(url).get("backend_calls")) == 1


def test_values_round_trip_and_age(url: str) -> None:
    cache = RedisCache(url, prefix="rt:")
    cache.set("k", {"a": [1, 2]}, keep=30)
    entry = cache.get("k")
    assert entry is not None and entry.value == {"a": [1, 2]} and 0 <= entry.age < 30
    assert redis.Redis.from_url(url).pttl("rt:k") > 0  # Redis drops it after keep


def test_pickle_opt_in_across_the_wire(url: str) -> None:
    RedisCache(url, prefix="p:", codec="pickle").set("k", {1, 2}, keep=30)
    entry = RedisCache(url, prefix="p:", codec="pickle").get("k")
    assert entry is not None and entry.value == {1, 2}
    assert not RedisCache(url, prefix="p:").set("s", {1, 2}, keep=30)  # json: not a set


def test_corrupt_value_is_a_logged_miss(url: str) -> None:
    redis.Redis.from_url(url).set("c:k", b"not-a-float\n{}")
    redis.Redis.from_url(url).set("c:j", b"1.0\n{broken")
    cache = RedisCache(url, prefix="c:")
    assert cache.lookup("k", 60) == (EXPIRED, None)
    assert cache.lookup("j", 60) == (EXPIRED, None)
    assert cache.metrics().errors == 2


def test_cross_process_lock_lets_one_refresher_through(url: str) -> None:
    a, b = RedisCache(url, prefix="l:"), RedisCache(url, prefix="l:")
    assert a.begin_refresh("k", 5)
    assert not b.begin_refresh("k", 5)  # another process holds the lock
    a.end_refresh("k")
    assert b.begin_refresh("k", 5)
    b.end_refresh("k")


def test_stale_served_while_one_refresh_runs(url: str) -> None:
    now = [1000.0]
    cache = RedisCache(url, prefix="s:", clock=lambda: now[0])
    cache.set("k", "old", keep=100)
    now[0] += 20
    started, release = threading.Event(), threading.Event()

    def backend() -> str:
        started.set()
        assert release.wait(10)
        return "new"

    with ThreadPoolExecutor(1) as pool:
        assert cache.lookup("k", 10, 50) == (STALE, "old")
        done = cache.refresh("k", backend, keep=100, executor=pool, timeout=10)
        assert done is not None and started.wait(10)
        assert cache.lookup("k", 10, 50) == (STALE, "old")
        assert cache.refresh("k", backend, keep=100, executor=pool) is None
        release.set()
        assert done.result(10) is True
    assert cache.lookup("k", 10, 50) == (FRESH, "new")


def test_redis_stopped_mid_test_is_a_logged_miss(url: str, redis_server: RedisServer) -> None:
    lines: list[str] = []
    logger.enable("taskflow")
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        cache = RedisCache(url, prefix="d:")
        assert cache.set("k", 1, keep=30)
        redis_server.stop()
        assert cache.lookup("k", 60) == (EXPIRED, None)
        assert cache.set("k", 2, keep=30) is False
        assert cache.begin_refresh("k", 5)  # best effort: this process still refreshes
        cache.end_refresh("k")
    finally:
        logger.remove(sink)
        logger.disable("taskflow")
    assert cache.metrics().errors >= 2 and cache.metrics().misses == 1
    assert any("treated as a miss" in line for line in lines)
