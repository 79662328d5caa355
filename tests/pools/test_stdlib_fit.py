"""The gate on MonitoredExecutor's copy of the stdlib worker loop: on exactly where the probe
finds this interpreter's loop to behave as the copy in one of its shapes, off (and still
counting) elsewhere."""

from __future__ import annotations

import concurrent.futures.thread as cft
import gc
import logging
import platform
import queue
import sys
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow.pools.monitored import MonitoredExecutor, stdlib_copy_fits, stdlib_copy_shape
from taskflow.pools.stdlib_fit import stdlib_pool_matches, worker_loop_matches

pytestmark = pytest.mark.timeout(60)


def loop_that_polls_first(
    executor_reference: Any, work_queue: Any, initializer: Any, initargs: tuple[Any, ...],
) -> None:
    """A worker loop that releases an idle token only when it finds the queue empty (the
    shape of CPython 3.12's and 3.13's loop); it runs a pool correctly."""
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException:  # noqa: BLE001 - as the stdlib worker
            cft._base.LOGGER.critical("Exception in initializer:", exc_info=True)
            executor = executor_reference()
            if executor is not None:
                executor._initializer_failed()
            return
    try:
        while True:
            try:
                item = work_queue.get_nowait()
            except queue.Empty:
                executor = executor_reference()
                if executor is not None:
                    executor._idle_semaphore.release()
                del executor
                item = work_queue.get(block=True)
            if item is not None:
                item.run()
                del item
                continue
            executor = executor_reference()
            if cft._shutdown or executor is None or executor._shutdown:
                if executor is not None:
                    executor._shutdown = True
                work_queue.put(None)
                return
            del executor
    except BaseException:  # noqa: BLE001 - as the stdlib worker
        cft._base.LOGGER.critical("Exception in worker", exc_info=True)


def loop_that_releases_before_each_get(
    executor_reference: Any, work_queue: Any, initializer: Any, initargs: tuple[Any, ...],
) -> None:
    """A worker loop of neither shape the copy takes: it releases an idle token before every
    blocking get (so the pool starts fewer threads); it runs a pool correctly."""
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException:  # noqa: BLE001 - as the stdlib worker
            cft._base.LOGGER.critical("Exception in initializer:", exc_info=True)
            executor = executor_reference()
            if executor is not None:
                executor._initializer_failed()
            return
    try:
        while True:
            executor = executor_reference()
            if executor is not None:
                executor._idle_semaphore.release()
            del executor
            item = work_queue.get(block=True)
            if item is not None:
                item.run()
                del item
                continue
            executor = executor_reference()
            if cft._shutdown or executor is None or executor._shutdown:
                if executor is not None:
                    executor._shutdown = True
                work_queue.put(None)
                return
            del executor
    except BaseException:  # noqa: BLE001 - as the stdlib worker
        cft._base.LOGGER.critical("Exception in worker", exc_info=True)


@pytest.fixture
def fresh_gate() -> Iterator[None]:
    """The gate decided anew in the test, and again (unpatched) after it."""
    stdlib_copy_shape.cache_clear()
    yield
    stdlib_copy_shape.cache_clear()


def wrapped_pool_uses_the_copy(pool: ThreadPoolExecutor) -> bool:
    """Whether a MonitoredExecutor took over the pool's thread starts (the copy is on)."""
    return "_adjust_thread_count" in vars(pool)


def test_the_decision_by_cpython_version() -> None:
    """On for 3.10 to 3.13: 3.10 and 3.11 release an idle token after each task, 3.12 and
    3.13 poll the queue first and release one only when it is empty."""
    if platform.python_implementation() != "CPython" or sys.version_info[:2] > (3, 13):
        pytest.skip("decided for CPython 3.10 to 3.13")
    assert stdlib_pool_matches()
    assert stdlib_copy_fits()
    shape = stdlib_copy_shape()
    assert shape is not None
    assert shape.startswith("polls") is (sys.version_info[:2] >= (3, 12))


def test_the_copy_is_on_exactly_where_the_gate_says() -> None:
    pool = ThreadPoolExecutor(2)
    mon = MonitoredExecutor(pool)
    try:
        assert wrapped_pool_uses_the_copy(pool) is stdlib_copy_fits()
        assert mon.submit(abs, -3).result(timeout=LONG) == 3
        targets = {t._target for t in pool._threads}  # type: ignore[attr-defined]
        assert (cft._worker not in targets) is stdlib_copy_fits()
    finally:
        mon.shutdown(wait=True)


def test_the_probe_tells_the_two_loop_shapes_apart() -> None:
    if platform.python_implementation() != "CPython" or sys.version_info[:2] > (3, 13):
        pytest.skip("decided for CPython 3.10 to 3.13")
    assert worker_loop_matches(cft._worker)
    assert worker_loop_matches(loop_that_polls_first) is (sys.version_info[:2] >= (3, 12))


def test_a_loop_of_another_signature_does_not_match() -> None:
    def takes_other_arguments(context: object) -> None:
        raise AssertionError("never called with four arguments")

    assert not worker_loop_matches(takes_other_arguments)


def test_a_mismatched_stdlib_loop_turns_the_copy_off_and_metrics_still_count(
    monkeypatch: pytest.MonkeyPatch, fresh_gate: None,
) -> None:
    monkeypatch.setattr(cft, "_worker", loop_that_releases_before_each_get)
    assert not stdlib_copy_fits()
    pool = ThreadPoolExecutor(2)
    mon = MonitoredExecutor(pool)
    try:
        assert not wrapped_pool_uses_the_copy(pool)

        def boom() -> None:
            raise KeyError("task")

        assert [mon.submit(pow, 2, i).result(timeout=LONG) for i in range(5)] == [
            1, 2, 4, 8, 16,
        ]
        assert isinstance(mon.submit(boom).exception(timeout=LONG), KeyError)
        assert {t._target for t in pool._threads} == {  # type: ignore[attr-defined]
            loop_that_releases_before_each_get,
        }
        m = mon.metrics()
        assert (m.task_count, m.completed_task_count, m.failed_task_count) == (6, 6, 1)
        assert (m.active_count, m.queue_size, m.max_size) == (0, 0, 2)
        assert m.run_time_s is not None and m.run_time_s.count == 6
        assert m.queue_wait_total_s is not None and m.run_time_total_s is not None
    finally:
        mon.shutdown(wait=True)


def test_deciding_logs_nothing(
    caplog: pytest.LogCaptureFixture, fresh_gate: None,
) -> None:
    """The probe's failing initializer and ended loops log to the concurrent.futures logger;
    those records reach no handler."""
    with caplog.at_level(logging.DEBUG):
        stdlib_copy_fits()
    assert caplog.records == []


class _Caller:
    """Stands for the MonitoredExecutor whose constructor runs the probes first."""


def _probe_for(caller: _Caller) -> bool:
    from taskflow.pools.monitored import _monitored_worker, _no_monitor

    return stdlib_pool_matches() and any(
        worker_loop_matches(_monitored_worker, _no_monitor(), polls) for polls in (False, True)
    )


def test_probing_leaves_no_cycle_that_holds_the_callers_frame() -> None:
    # the probes raise and catch errors; a cycle through a traceback would keep the frames
    # of the probe's callers (the first MonitoredExecutor of the process, its pool and that
    # pool's threads) alive until the cycle collector ran
    caller = _Caller()
    held = weakref.ref(caller)
    gc.disable()
    try:
        _probe_for(caller)
        del caller
        assert held() is None
    finally:
        gc.enable()
