"""Who waits for a ThreadPool's lock: a flow's way out at its deadline never does (marking its
running work abandoned, cancelling its queued work), and no thread is started under it.

A helper thread holds the lock for as long as a test needs; a call that waited for it would
return only when the helper gives up (after ``PROMPT``), and the test fails then.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import wait

import pytest
from conftest import LONG, PROMPT
from lock_holder import lock_held_elsewhere

from taskflow.pools.threadpool import ThreadPool


class Busy:
    """A one-thread pool whose tasks wait on a gate and say when they start."""

    def __init__(self) -> None:
        self.pool = ThreadPool(1)
        self.gate = threading.Event()
        self.started = threading.Semaphore(0)

    def blocker(self) -> str:
        self.started.release()
        assert self.gate.wait(LONG)
        return "done"

    def await_started(self) -> None:
        assert self.started.acquire(timeout=LONG), "the task did not start"


@pytest.fixture
def busy() -> Iterator[Busy]:
    b = Busy()
    yield b
    b.gate.set()
    b.pool.shutdown(wait=True, cancel_futures=True)


def test_marking_and_cancelling_never_wait_for_the_pools_lock(busy: Busy) -> None:
    pool, gate = busy.pool, busy.gate
    running = pool.submit(busy.blocker)
    queued = pool.submit(busy.blocker)
    busy.await_started()
    with lock_held_elsewhere(pool, PROMPT):
        pool.mark_abandoned(running)
        pool.mark_abandoned(queued)
        assert queued.cancel()
    m = pool.metrics()  # counts every request made before it
    assert (m.queue_size, m.cancelled_task_count) == (0, 1)
    assert (m.abandoned_running, m.abandoned_total) == (1, 1)
    assert wait([queued], timeout=LONG).done == {queued}  # its waiters were told
    gate.set()
    assert running.result(timeout=LONG) == "done"
    m = pool.metrics()
    assert (m.abandoned_running, m.abandoned_total, m.completed_task_count) == (0, 1, 1)


def test_a_mark_left_for_later_is_counted_before_its_task_finishes(busy: Busy) -> None:
    pool, gate = busy.pool, busy.gate
    running = pool.submit(busy.blocker)
    busy.await_started()
    with lock_held_elsewhere(pool, PROMPT):
        pool.mark_abandoned(running)
        gate.set()  # the worker finishes while the mark waits to be counted
    assert running.result(timeout=LONG) == "done"
    m = pool.metrics()
    assert (m.abandoned_running, m.abandoned_total, m.completed_task_count) == (0, 1, 1)


class StartWatch:
    """Records, for each thread a pool starts, whether the pool's lock was held then."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pool: ThreadPool) -> None:
        self.pool = pool
        self.held: list[bool] = []
        real_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            if thread.name.startswith(self.pool._thread_prefix):
                # the pool's other threads wait on a gate, outside any lock section: a lock
                # held now is held by the thread that starts this one
                free = self.pool._lock.acquire(False)
                if free:
                    self.pool._lock.release()
                self.held.append(not free)
            real_start(thread)

        monkeypatch.setattr(threading.Thread, "start", start)


def test_no_thread_is_started_under_the_pools_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    # starting a thread waits until it runs, i.e. (under load) until it gets the GIL
    gate = threading.Event()
    started = threading.Semaphore(0)

    def blocker() -> bool:
        started.release()
        return gate.wait(LONG)

    def await_started() -> None:
        assert started.acquire(timeout=LONG), "the task did not start"

    pool = ThreadPool(0, 3, queue_capacity=2)
    watch = StartWatch(monkeypatch, pool)
    futures = []
    try:
        futures.append(pool.submit(blocker))  # no core: one thread for the queued task
        await_started()
        futures += [pool.submit(blocker), pool.submit(blocker)]  # queued; the queue is full
        futures.append(pool.submit(blocker))  # so a thread above core
        await_started()
        pool.set_core_size(3)  # a core thread for a queued task
        await_started()
        with ThreadPool(2) as small:
            watch.pool = small
            futures.append(small.submit(blocker))  # below core: a thread per task
            await_started()
            assert small.prestart_core_threads() == 1
            gate.set()
    finally:
        gate.set()
        pool.shutdown(wait=True)
    assert all(f.result(timeout=LONG) for f in futures)
    assert watch.held == [False] * 5
