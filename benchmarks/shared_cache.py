"""N worker processes (as gunicorn workers) serving the same keys: the in-process LRU against
``RedisCache``. Prints the backend calls of each (expect about N times fewer with Redis) and the
cost of one cache hit, Redis over the LRU, measured in the same run.

    python benchmarks/shared_cache.py                       # 4 workers, 20 keys, 400 pages each
    python benchmarks/shared_cache.py --workers 8 --keys 50 --pages 1000

Needs ``redis-server`` on PATH (a private one is started on a free port) and the ``redis``
client (``pip install 'taskflow-juc[redis]'``). The backend is a Redis ``INCR`` per call, so
its count is exact across processes. The workers start together (a shared event) and each
page is one ``TaskScheduling.start`` of a ``share_key`` node with ``cache_ttl=60``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(url: str, backend_key: str, shared: bool, keys: int, pages: int, start: Any,
            out: Any) -> None:
    import redis

    from taskflow import FunctionNode, TaskContext, TaskScheduling
    from taskflow.cache import LruCache, RedisCache

    counter = redis.Redis.from_url(url)
    cache = (RedisCache(url, prefix=f"bench:{backend_key}:") if shared
             else LruCache("bench"))

    def backend(ctx: Any, param: Any) -> Any:
        counter.incr(backend_key)
        return {"key": ctx["key"]}

    node = FunctionNode(backend, name="page", share_key=lambda ctx, p: ctx["key"],
                        cache_ttl=60, cache=cache)
    start.wait(30)
    with ThreadPoolExecutor(2) as pool:
        t0 = time.perf_counter()
        for n in range(pages):
            TaskScheduling.start(node, executor=pool, timeout=10,
                                 context=TaskContext(key=n % keys))
        elapsed = time.perf_counter() - t0
    out.put(elapsed / pages)


def scenario(url: str, shared: bool, workers: int, keys: int, pages: int) -> tuple[int, float]:
    import redis

    key = "calls-redis" if shared else "calls-lru"
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, key, shared, keys, pages, start, out))
             for _ in range(workers)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let the workers import before the common start
    start.set()
    per_page = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    calls = int(redis.Redis.from_url(url).get(key) or 0)
    return calls, per_page[len(per_page) // 2]


def hit_cost(url: str, n: int = 20000) -> tuple[float, float]:
    from taskflow.cache import LruCache, RedisCache

    costs = []
    for cache in (LruCache("hit"), RedisCache(url, prefix="hit:")):
        cache.set("k", {"a": 1}, keep=60)
        t0 = time.perf_counter()
        for _ in range(n):
            cache.lookup("k", 60)
        costs.append((time.perf_counter() - t0) / n)
    return costs[0], costs[1]


def parser() -> argparse.ArgumentParser:
    """The command line; its defaults are the ones the module docstring states."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--pages", type=int, default=400)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not on PATH")
    port, tmp = _free_port(), tempfile.mkdtemp(prefix="bench-redis-")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", tmp],
                              stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        client = redis.Redis.from_url(url)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        lru_calls, lru_page = scenario(url, False, args.workers, args.keys, args.pages)
        redis_calls, redis_page = scenario(url, True, args.workers, args.keys, args.pages)
        lru_hit, redis_hit = hit_cost(url)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.workers} workers, {args.keys} keys, {args.pages} pages each")
    print(f"backend calls: LRU {lru_calls}, Redis {redis_calls} "
          f"({lru_calls / max(1, redis_calls):.1f}x fewer with Redis)")
    print(f"median page: LRU {lru_page * 1e6:.0f} us, Redis {redis_page * 1e6:.0f} us")
    print(f"one hit: LRU {lru_hit * 1e6:.2f} us, Redis {redis_hit * 1e6:.1f} us "
          f"(ratio {redis_hit / lru_hit:.0f}x)")


if __name__ == "__main__":
    main()
