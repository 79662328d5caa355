"""The lifecycle the stdlib pool promises, on ThreadPool and MonitoredExecutor.

A pool dropped without ``shutdown`` lets its threads exit (its queued work still runs, a Future
kept by its holder keeps nothing alive); a thread initializer runs once per thread, and one that
raises breaks the pool; ``ThreadPool.fixed`` takes ``ThreadPoolExecutor``'s arguments; a
submit after interpreter shutdown raises the stdlib's plain ``RuntimeError``.
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import BrokenExecutor, Executor, Future, ThreadPoolExecutor, wait
from concurrent.futures.thread import BrokenThreadPool
from pathlib import Path
from typing import Any

import pytest
from conftest import LONG

import taskflow
from taskflow.errors import BrokenPoolError, RejectedExecutionError, TaskflowError
from taskflow.pools.monitored import MonitoredExecutor
from taskflow.pools.threadpool import ThreadPool


def join_all(threads: Iterable[threading.Thread]) -> list[str]:
    """Join each thread (LONG at most); the names of those still alive."""
    for t in threads:
        t.join(LONG)
    return sorted(t.name for t in threads if t.is_alive())


def test_a_thread_pool_dropped_without_shutdown_lets_its_threads_exit() -> None:
    pool = ThreadPool(4)
    assert list(pool.map(abs, range(-8, 8))) == [abs(x) for x in range(-8, 8)]
    threads = pool._threads  # read as code written for the stdlib pool reads it
    assert len(threads) == 4
    del pool
    assert join_all(threads) == []


def test_a_held_future_does_not_keep_a_dropped_thread_pool_alive() -> None:
    pool = ThreadPool(2)
    kept = [pool.submit(pow, 2, n) for n in range(6)]
    wait(kept, timeout=LONG)
    threads = pool._threads
    del pool
    assert join_all(threads) == []
    assert [f.result() for f in kept] == [2**n for n in range(6)]


def test_a_dropped_thread_pool_runs_its_queued_tasks_before_its_threads_exit() -> None:
    gate = threading.Event()
    started = threading.Event()

    def first() -> str:
        started.set()
        assert gate.wait(LONG)
        return "first"

    pool = ThreadPool(1)
    running = pool.submit(first)
    assert started.wait(LONG)
    queued = [pool.submit(str, n) for n in range(3)]
    threads = pool._threads
    del pool
    gc.collect()  # nothing may collect the pool while a task waits in its queue
    gate.set()
    assert running.result(timeout=LONG) == "first"
    assert [f.result(timeout=LONG) for f in queued] == ["0", "1", "2"]
    assert join_all(threads) == []


def _stdlib(in_process: bool) -> Callable[[], tuple[MonitoredExecutor, Any]]:
    def make() -> tuple[MonitoredExecutor, Any]:
        inner = ThreadPoolExecutor(2)
        return MonitoredExecutor(inner, in_process=in_process), inner

    return make


def _thread_pool() -> tuple[MonitoredExecutor, Any]:
    inner = ThreadPool(2)
    return MonitoredExecutor(inner), inner


@pytest.mark.parametrize(
    "make",
    [_stdlib(True), _stdlib(False), _thread_pool],
    ids=["stdlib pool", "stdlib pool counted out of process", "ThreadPool"],
)
def test_a_monitored_pool_dropped_without_shutdown_lets_its_threads_exit(
    make: Callable[[], tuple[MonitoredExecutor, Any]],
) -> None:
    mon, inner = make()
    kept = [mon.submit(abs, -n) for n in range(6)]
    wait(kept, timeout=LONG)
    threads = list(inner._threads)
    del mon, inner
    assert join_all(threads) == []  # the Futures, still held, keep neither monitor nor pool
    assert [f.result() for f in kept] == [n for n in range(6)]


def test_an_initializer_runs_once_in_each_new_thread_before_its_first_task() -> None:
    calls: list[tuple[str, str]] = []
    local = threading.local()

    def initializer(tag: str) -> None:
        calls.append((tag, threading.current_thread().name))
        local.tag = tag

    with ThreadPool(3, initializer=initializer, initargs=("ready",)) as pool:
        tags = [pool.submit(lambda: local.tag) for _ in range(12)]
        assert [f.result(timeout=LONG) for f in tags] == ["ready"] * 12
        names = {t.name for t in pool._threads}
    assert sorted(calls) == sorted(("ready", name) for name in names)


def test_a_failing_initializer_breaks_the_pool(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    entered = threading.Event()
    failure = OSError("no database")

    def initializer() -> None:
        entered.set()
        assert release.wait(LONG)
        raise failure

    pool = ThreadPool(1, initializer=initializer, name="orders")
    first = pool.submit(int, "1")
    assert entered.wait(LONG)
    queued = [pool.submit(int, "2"), pool.submit(int, "3")]
    with caplog.at_level(logging.CRITICAL, logger="concurrent.futures"):
        release.set()
        wait([first, *queued], timeout=LONG)
    for f in (first, *queued):
        error = f.exception(timeout=0)
        assert isinstance(error, BrokenPoolError) and error.__cause__ is failure
        assert isinstance(error, (BrokenThreadPool, BrokenExecutor, TaskflowError, RuntimeError))
    assert "pool 'orders' is broken: a thread initializer failed (OSError: no database)" in str(
        first.exception(timeout=0)
    )
    with pytest.raises(BrokenPoolError, match="'orders' is broken"):
        pool.submit(int, "4")
    assert [r.getMessage() for r in caplog.records] == ["Exception in initializer:"]
    assert caplog.records[0].exc_info is not None and caplog.records[0].exc_info[1] is failure
    m = pool.metrics()
    assert (m.task_count, m.rejected_count, m.completed_task_count, m.queue_size) == (3, 3, 0, 0)
    pool.shutdown()
    assert pool.is_terminated


def test_a_task_cancelled_before_its_pool_broke_stays_cancelled() -> None:
    release = threading.Event()
    entered = threading.Event()

    def initializer() -> None:
        entered.set()
        assert release.wait(LONG)
        raise LookupError("config")

    with ThreadPool(1, initializer=initializer) as pool:
        pool.submit(int)
        assert entered.wait(LONG)
        queued = pool.submit(int)
        assert queued.cancel()
        release.set()
    # shutdown(wait=True) returned: the broken thread has left, the counts are final
    m = pool.metrics()
    assert (m.task_count, m.rejected_count, m.cancelled_task_count) == (2, 1, 1)


def test_an_initializer_must_be_callable() -> None:
    with pytest.raises(TypeError, match="initializer must be callable, got 'setup'"):
        ThreadPool(1, initializer="setup")  # type: ignore[arg-type]


def test_fixed_takes_the_stdlib_pools_arguments_and_defaults() -> None:
    with ThreadPool.fixed() as pool:
        cpus = getattr(os, "process_cpu_count", os.cpu_count)() or 1
        assert (pool.core_size, pool.max_size) == (min(32, cpus + 4),) * 2
        assert pool.queue_capacity is None and pool._max_workers == pool.max_size
    with ThreadPool.fixed(3, "orders") as pool:
        assert (pool.core_size, pool.max_size) == (3, 3)
        assert pool.submit(threading.current_thread).result(timeout=LONG).name.startswith(
            "orders-"
        )
    seen: list[int] = []
    with ThreadPool.fixed(1, "", seen.append, (7,)) as pool:
        pool.submit(int).result(timeout=LONG)
    assert seen == [7]


@pytest.mark.parametrize("workers", [0, -1])
def test_fixed_refuses_a_worker_count_below_one_as_the_stdlib_does(workers: int) -> None:
    with pytest.raises(ValueError, match=f"max_workers must be greater than 0, got {workers}"):
        ThreadPool.fixed(workers)


_AT_EXIT = textwrap.dedent(
    """
    import atexit

    from taskflow import ThreadPool

    def at_exit():
        for pool in (live, ThreadPool(1)):
            try:
                pool.submit(int)
            except Exception as exc:
                print(type(exc).__module__, type(exc).__qualname__, str(exc), sep="|")
        try:
            closed.submit(int)
        except Exception as exc:
            print(type(exc).__qualname__)

    atexit.register(at_exit)  # runs after the pools were shut down for the exit
    live = ThreadPool(2)
    live.submit(int).result()
    closed = ThreadPool(1)
    closed.shutdown()
    """
)


def test_submit_after_interpreter_shutdown_raises_the_stdlibs_runtime_error() -> None:
    checkout = str(Path(taskflow.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (checkout, os.environ.get("PYTHONPATH")) if p
    )}
    out = subprocess.run(
        [sys.executable, "-c", _AT_EXIT], capture_output=True, text=True, env=env,
        timeout=LONG * 3, check=True,
    )
    assert out.stderr == ""
    plain = "builtins|RuntimeError|cannot schedule new futures after interpreter shutdown"
    # a pool live at exit and one made after it; one shut down before stays the pool's error
    assert out.stdout.splitlines() == [plain, plain, RejectedExecutionError.__qualname__]


def test_a_monitored_pool_passes_the_stdlib_pools_private_fields_through() -> None:
    def initializer() -> None:
        raise OSError("no database")

    executors: list[Executor] = [
        ThreadPoolExecutor(1, initializer=initializer), ThreadPool(1, initializer=initializer),
    ]
    for inner in executors:
        mon = MonitoredExecutor(inner)
        assert not mon._broken
        failed: Future[Any] = mon.submit(int)
        assert isinstance(failed.exception(timeout=LONG), BrokenThreadPool)
        assert mon._broken
        assert mon._threads == inner._threads  # type: ignore[attr-defined]
        mon.shutdown()
