"""Pools and monitors in a forked child (``gunicorn --preload``, multiprocessing's fork).

The parent builds a warmed ThreadPool, a MonitoredExecutor and a running PoolMonitor (as an
application does at import time), then forks. The child must run tasks at full width, count
them from zero, and have a sampling thread that reads the child's own process. Failures in the
child are printed to its stderr and turn into its exit code; the parent waits for it with a
bound and kills it if it hangs (a pool whose threads stayed in the parent hangs forever).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Executor

import pytest
from conftest import LONG

from taskflow.observe.monitor import PoolMonitor
from taskflow.pools.monitored import MonitoredExecutor
from taskflow.pools.threadpool import ThreadPool

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12+ warns that forking a threaded process may deadlock: that is the case here
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def run_in_child(body: Callable[[], None]) -> None:
    """Fork; run ``body`` in the child; fail the test if it fails, raises or hangs."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            body()
            code = 0
        except BaseException:  # noqa: BLE001 - reported through the exit code
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 3 * LONG
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child failed (see its stderr)"


def test_a_pool_and_a_monitor_work_in_a_forked_child() -> None:
    pool = ThreadPool(4, name="preloaded")
    pool.prestart_core_threads()
    for f in [pool.submit(int) for _ in range(8)]:
        f.result(timeout=LONG)
    monitored = MonitoredExecutor(ThreadPool(2), name="monitored")
    monitored.submit(int).result(timeout=LONG)
    monitor = PoolMonitor(pool, interval=0.02).start()
    parent_pid = os.getpid()

    def child() -> None:
        assert os.getpid() != parent_pid
        # the pool runs tasks, as wide as it is (a barrier of 4 needs 4 threads at once)
        barrier = threading.Barrier(4, timeout=LONG)
        for f in [pool.submit(barrier.wait) for _ in range(4)]:
            f.result(timeout=LONG)
        m = pool.metrics()
        assert (m.task_count, m.completed_task_count, m.pool_size) == (4, 4, 4), m
        assert monitored.submit(lambda: 7).result(timeout=LONG) == 7
        assert monitored.metrics().completed_task_count == 1
        # the sampling thread runs again, and samples this process and its fresh counts
        deadline = time.monotonic() + LONG
        while True:
            snap = monitor.latest()
            if snap is not None and snap.pool is not None and snap.pool.completed_task_count == 4:
                break
            assert time.monotonic() < deadline, f"the monitor does not sample in the child: {snap}"
            time.sleep(0.01)
        assert snap.process.pid == os.getpid()
        assert all(s.process.pid == os.getpid() for s in monitor.history())
        names = {t.name for t in threading.enumerate()}
        assert "taskflow-monitor-preloaded" in names, names
        assert 'taskflow_pool_completed_total{pool="preloaded"} 4' in monitor.to_prometheus()
        monitor.stop()
        pool.shutdown()
        monitored.shutdown()

    try:
        run_in_child(child)
        # the parent is untouched: same threads, same counts, monitor still sampling
        assert pool.submit(lambda: 1).result(timeout=LONG) == 1
        assert pool.metrics().completed_task_count == 9
        first = len(monitor.history())
        deadline = time.monotonic() + LONG
        while len(monitor.history()) == first:
            assert time.monotonic() < deadline, "the parent's monitor stopped sampling"
            time.sleep(0.01)
    finally:
        monitor.stop()
        pool.shutdown()
        monitored.shutdown()


def test_a_fork_while_tasks_run_leaves_them_to_the_parent() -> None:
    pool = ThreadPool(1)
    gate, started = threading.Event(), threading.Event()

    def blocker() -> str:
        started.set()
        assert gate.wait(LONG)
        return "parent"

    running = pool.submit(blocker)
    queued = pool.submit(lambda: "queued")
    assert started.wait(LONG)

    def child() -> None:
        m = pool.metrics()
        assert (m.active_count, m.queue_size, m.pool_size) == (0, 0, 0), m
        assert pool.submit(lambda: "child").result(timeout=LONG) == "child"
        assert queued.cancel()  # the child's copy: detached from the child's pool
        m = pool.metrics()
        assert (m.queue_size, m.cancelled_task_count, m.completed_task_count) == (0, 0, 1), m
        pool.shutdown()

    try:
        run_in_child(child)
    finally:
        gate.set()
    assert running.result(timeout=LONG) == "parent"
    assert queued.result(timeout=LONG) == "queued"
    pool.shutdown()


def _flow_on(executor: Executor) -> tuple[str, str]:
    """A flow whose slow node times out (the timer thread ends it) and a run started with
    ``submit`` that the caller does not wait on (the coordinator closes it after its budget)."""
    from taskflow import FunctionNode, TaskScheduling

    slow = FunctionNode(lambda c, p: time.sleep(0.3), name="slow", timeout=0.02)
    quick = FunctionNode(lambda c, p: 7, name="quick")
    started = TaskScheduling.start([slow, quick], executor=executor, timeout=LONG)
    hung = FunctionNode(lambda c, p: time.sleep(0.3), name="hung")
    submitted = TaskScheduling.submit(hung, executor=executor, timeout=0.02).result(timeout=LONG)
    return started.result_of("slow").state.name, submitted.result_of("hung").state.name


def test_a_forked_child_uses_pool_monitor_timer_and_coordinator_together() -> None:
    """Every background thread and lock of the library at once, forked while another thread
    keeps submitting and sampling (so their locks are taken during the fork)."""
    pool = ThreadPool(4, name="shared")
    monitored = MonitoredExecutor(pool, name="shared-monitored")
    monitor = PoolMonitor(monitored, interval=0.02).start()
    assert _flow_on(monitored) == ("TIMEOUT", "TIMEOUT")  # timer and coordinator now exist
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            monitored.submit(int).result(timeout=LONG)
            monitor.sample(record=False)

    hammer = threading.Thread(target=busy, name="hammer")
    hammer.start()

    def child() -> None:
        assert _flow_on(monitored) == ("TIMEOUT", "TIMEOUT")
        m = monitored.metrics()
        assert m.task_count >= 3 and m.task_count == m.completed_task_count + (m.active_count or 0)
        deadline = time.monotonic() + LONG
        while (snap := monitor.latest()) is None or snap.pool is None or not snap.pool.task_count:
            assert time.monotonic() < deadline, f"the monitor does not sample in the child: {snap}"
            time.sleep(0.01)
        assert snap.process.pid == os.getpid()
        names = {t.name for t in threading.enumerate()}
        assert {"taskflow-timer", "taskflow-monitor-shared-monitored"} <= names, names
        assert "hammer" not in names
        monitor.stop()
        pool.shutdown(wait=False)

    try:
        run_in_child(child)
    finally:
        stop.set()
        hammer.join(LONG)
        monitor.stop()
        pool.shutdown()
    assert not hammer.is_alive()


def test_the_fork_registry_repairs_every_object_even_when_one_hook_raises() -> None:
    from taskflow import _fork

    class Repairable:
        def __init__(self, log: list[str], name: str, fail: bool = False) -> None:
            self._lock = threading.Lock()
            self.log, self.name, self.fail = log, name, fail

        def _after_fork_in_child(self) -> None:
            self._lock = threading.Lock()
            self.log.append(self.name)
            if self.fail:
                raise RuntimeError("a broken hook")

    with pytest.raises(TypeError, match="no method 'missing'"):
        _fork.register(Repairable([], "x"), after_in_child="missing")
    log: list[str] = []
    objects = [Repairable(log, "a"), Repairable(log, "b", fail=True), Repairable(log, "c")]
    for obj in objects:
        _fork.register(obj, hold="_lock")

    def child() -> None:
        assert log == ["a", "b", "c"]  # in registration order, past the one that raised
        assert not any(obj._lock.locked() for obj in objects)

    run_in_child(child)
    assert log == [] and not any(obj._lock.locked() for obj in objects)  # the parent's
