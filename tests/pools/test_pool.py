"""ThreadPool and MonitoredExecutor: JSR-166 TCK ThreadPoolExecutorTest shapes, metrics invariants.

Tasks that must stay busy wait on a gate (an Event released by the fixture at teardown) and
report that they started through a Semaphore; nothing is ordered by sleeping.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import (
    CancelledError,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from typing import Any

import pytest
from conftest import LONG, SHORT
from pydantic import ValidationError

from taskflow.errors import RejectedExecutionError, TaskflowError
from taskflow.metrics import PoolMetrics
from taskflow.pools.monitored import MonitoredExecutor, stdlib_copy_fits
from taskflow.pools.threadpool import RejectionPolicy, ThreadPool


class Gates:
    """A gate blocked tasks wait on, and a semaphore they release when they start."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Semaphore(0)

    def blocker(self, value: Any = None) -> Any:
        self.started.release()
        assert self.gate.wait(LONG), "gate never opened"
        return value

    def await_started(self, n: int) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=LONG), "task did not start"


@pytest.fixture
def gates() -> Iterator[Gates]:
    g = Gates()
    yield g
    g.gate.set()


@pytest.fixture
def make_pool(gates: Gates) -> Iterator[Callable[..., ThreadPool]]:
    """Build pools; at teardown open the gate, shut them down and require they terminate."""
    pools: list[ThreadPool] = []

    def make(*args: Any, **kwargs: Any) -> ThreadPool:
        pool = ThreadPool(*args, **kwargs)
        pools.append(pool)
        return pool

    yield make
    gates.gate.set()
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    for pool in pools:
        assert pool.await_termination(LONG), f"{pool!r} did not terminate"


def wait_until(predicate: Callable[[], bool], timeout: float = LONG) -> None:
    """Poll a condition the pool reaches on its own (a thread exiting after keep-alive)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def conserved(m: PoolMetrics) -> bool:
    assert m.active_count is not None and m.queue_size is not None
    return m.task_count == (
        m.completed_task_count + m.cancelled_task_count + m.rejected_count + m.active_count
        + m.queue_size
    )


# ---------------------------------------------------------------------- construction
@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        ((-1,), {}, "core_size"),
        ((1, 0), {}, "max_size"),
        ((3, 2), {}, "max_size (2) must be >= core_size (3)"),
        ((1,), {"queue_capacity": -1}, "queue_capacity"),
        ((1,), {"keep_alive": -0.5}, "keep_alive"),
    ],
)
def test_constructor_rejects_bad_sizes(args: tuple[int, ...], kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match="must be") as info:
        ThreadPool(*args, **kwargs)
    assert fragment in str(info.value)


def test_unknown_rejection_policy_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        ThreadPool(1, rejection="drop_everything")


def test_defaults_and_the_fields_the_engine_reads(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(3)
    assert (pool.core_size, pool.max_size, pool._max_workers) == (3, 3, 3)
    assert pool.queue_capacity is None and pool.keep_alive == 60.0
    assert pool.rejection is RejectionPolicy.ABORT
    assert make_pool(0).max_size == 1
    assert make_pool(1, rejection="caller_runs").rejection is RejectionPolicy.CALLER_RUNS
    assert isinstance(pool, Executor)


def test_rejected_execution_error_is_a_runtime_error() -> None:
    assert issubclass(RejectedExecutionError, RuntimeError)
    assert issubclass(RejectedExecutionError, TaskflowError)


# ---------------------------------------------------------------------- JUC sizing semantics
def test_below_core_every_submit_starts_a_thread(make_pool: Callable[..., ThreadPool]) -> None:
    """TCK testGetPoolSize: a new core thread per task even when the others are idle."""
    pool = make_pool(3, 3)
    for expected in (1, 2, 3):
        pool.submit(int).result(timeout=LONG)
        assert pool.metrics().pool_size == expected
    pool.submit(int).result(timeout=LONG)
    assert pool.metrics().pool_size == 3


def test_saturation_queues_then_grows_to_max_then_rejects(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    """TCK testSaturatedExecute: core threads, then the queue, then up to max, then reject."""
    pool = make_pool(2, 4, queue_capacity=2)
    futures = [pool.submit(gates.blocker, i) for i in range(2)]
    gates.await_started(2)
    m = pool.metrics()
    assert (m.pool_size, m.active_count, m.queue_size) == (2, 2, 0)

    futures += [pool.submit(gates.blocker, i) for i in range(2, 4)]
    m = pool.metrics()
    assert (m.pool_size, m.queue_size, m.queue_remaining_capacity) == (2, 2, 0)
    assert m.queue_usage_pct == 100.0

    futures += [pool.submit(gates.blocker, i) for i in range(4, 6)]
    gates.await_started(2)
    m = pool.metrics()
    assert (m.pool_size, m.active_count, m.queue_size, m.largest_pool_size) == (4, 4, 2, 4)
    assert m.liveness_pct == 100.0

    with pytest.raises(RejectedExecutionError, match="saturated"):
        pool.submit(gates.blocker, 99)
    m = pool.metrics()
    assert (m.rejected_count, m.task_count) == (1, 7)
    assert conserved(m)

    gates.gate.set()
    assert sorted(f.result(timeout=LONG) for f in futures) == list(range(6))
    m = pool.metrics()
    assert (m.completed_task_count, m.active_count, m.queue_size) == (6, 0, 0)
    assert m.task_count == m.completed_task_count + m.rejected_count


def test_unbounded_queue_never_grows_past_core(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 4)
    futures = [pool.submit(gates.blocker) for _ in range(5)]
    gates.await_started(1)
    m = pool.metrics()
    assert (m.pool_size, m.active_count, m.queue_size) == (1, 1, 4)
    assert m.queue_capacity is None and m.queue_usage_pct is None
    gates.gate.set()
    wait(futures, timeout=LONG)
    assert all(f.done() for f in futures)


def test_zero_core_keeps_one_thread_for_queued_work(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(0, 3)
    assert pool.submit(lambda: 42).result(timeout=LONG) == 42
    assert pool.metrics().largest_pool_size == 1


def test_zero_capacity_is_a_direct_hand_off(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    """queue_capacity=0 behaves like a SynchronousQueue (Executors.newCachedThreadPool)."""
    pool = make_pool(0, 2, queue_capacity=0)
    futures = [pool.submit(gates.blocker) for _ in range(2)]
    gates.await_started(2)
    assert pool.metrics().pool_size == 2
    with pytest.raises(RejectedExecutionError):
        pool.submit(gates.blocker)
    gates.gate.set()
    wait(futures, timeout=LONG)
    # both threads now wait idle (keep_alive 60 s): a hand-off reuses one instead of growing
    wait_until(lambda: len(pool._parked) == 2)  # both threads parked, ready for a hand-off
    assert pool.submit(lambda: "reused").result(timeout=LONG) == "reused"
    assert pool.metrics().largest_pool_size == 2


# ---------------------------------------------------------------------- rejection policies
def saturate(pool: ThreadPool, gates: Gates, queued: int) -> list[Future[Any]]:
    """Fill a 1-thread pool: one running blocker and ``queued`` queued ones."""
    futures = [pool.submit(gates.blocker, "running")]
    gates.await_started(1)
    futures += [pool.submit(gates.blocker, f"queued-{i}") for i in range(queued)]
    return futures


def test_abort_raises_and_counts_the_rejection(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 1, queue_capacity=1)
    saturate(pool, gates, 1)
    for _ in range(3):
        with pytest.raises(RejectedExecutionError):
            pool.submit(gates.blocker)
    assert pool.metrics().rejected_count == 3


def test_caller_runs_runs_the_task_in_the_submitting_thread(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 1, queue_capacity=1, rejection=RejectionPolicy.CALLER_RUNS)
    saturate(pool, gates, 1)
    f = pool.submit(threading.current_thread)
    assert f.done() and f.result() is threading.current_thread()

    def boom() -> None:
        raise KeyError("in caller")

    failing = pool.submit(boom)
    assert isinstance(failing.exception(timeout=0), KeyError)
    m = pool.metrics()
    assert m.rejected_count == 2 and m.completed_task_count == 0
    assert conserved(m)


def test_discard_returns_an_already_cancelled_future(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 1, queue_capacity=1, rejection=RejectionPolicy.DISCARD)
    saturate(pool, gates, 1)
    ran = threading.Event()
    f = pool.submit(ran.set)
    assert f.cancelled()
    with pytest.raises(CancelledError):
        f.result(timeout=0)
    done, _ = wait([f], timeout=0)  # notified, so wait() sees it done
    assert f in done
    gates.gate.set()
    pool.shutdown(wait=True)
    assert not ran.is_set()
    m = pool.metrics()
    assert (m.rejected_count, m.completed_task_count, m.task_count) == (1, 2, 3)


def test_discard_oldest_cancels_the_oldest_queued_task(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    """TCK testSaturatedExecute_DiscardOldestPolicy."""
    pool = make_pool(1, 1, queue_capacity=2, rejection="discard_oldest")
    running, oldest, second = saturate(pool, gates, 2)
    newest = pool.submit(gates.blocker, "newest")
    assert oldest.cancelled()
    assert oldest in wait([oldest], timeout=0).done
    m = pool.metrics()
    assert (m.queue_size, m.rejected_count, m.cancelled_task_count) == (2, 1, 0)
    assert conserved(m)
    gates.gate.set()
    assert [f.result(timeout=LONG) for f in (running, second, newest)] == [
        "running", "queued-1", "newest",
    ]


def test_discard_oldest_with_nothing_queued_drops_the_new_task(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 1, queue_capacity=0, rejection=RejectionPolicy.DISCARD_OLDEST)
    saturate(pool, gates, 0)
    assert pool.submit(gates.blocker).cancelled()
    assert pool.metrics().rejected_count == 1


# ---------------------------------------------------------------------- resizing
def test_resizing_argument_checks(make_pool: Callable[..., ThreadPool]) -> None:
    """TCK testPoolSizeInvariants / setCorePoolSize / setMaximumPoolSize IAE cases."""
    pool = make_pool(2, 4)
    with pytest.raises(ValueError, match="core_size"):
        pool.set_core_size(-1)
    with pytest.raises(ValueError, match="must be >= core_size"):
        pool.set_core_size(5)
    with pytest.raises(ValueError, match="max_size"):
        pool.set_max_size(0)
    with pytest.raises(ValueError, match="must be >= core_size"):
        pool.set_max_size(1)
    assert (pool.core_size, pool.max_size) == (2, 4)
    pool.set_max_size(6)
    pool.set_core_size(6)
    assert (pool.core_size, pool.max_size, pool._max_workers) == (6, 6, 6)


def test_growing_core_starts_threads_for_queued_work(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 4)
    futures = [pool.submit(gates.blocker) for _ in range(4)]
    gates.await_started(1)
    assert pool.metrics().queue_size == 3
    pool.set_core_size(3)
    gates.await_started(2)
    m = pool.metrics()
    assert (m.pool_size, m.active_count, m.queue_size) == (3, 3, 1)
    gates.gate.set()
    wait(futures, timeout=LONG)


def test_raising_max_lets_a_saturated_pool_grow(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 1, queue_capacity=1)
    saturate(pool, gates, 1)
    with pytest.raises(RejectedExecutionError):
        pool.submit(gates.blocker)
    pool.set_max_size(2)
    assert pool._max_workers == 2
    pool.submit(gates.blocker)
    gates.await_started(1)
    assert pool.metrics().pool_size == 2


def test_shrinking_max_retires_idle_threads(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1, 3, queue_capacity=1, keep_alive=LONG * 10)
    futures = saturate(pool, gates, 1) + [pool.submit(gates.blocker) for _ in range(2)]
    gates.await_started(2)
    assert pool.metrics().pool_size == 3
    gates.gate.set()
    wait(futures, timeout=LONG)
    pool.set_max_size(1)
    wait_until(lambda: pool.metrics().pool_size == 1)
    assert pool.submit(lambda: "still works").result(timeout=LONG) == "still works"


def test_shrinking_max_while_busy_retires_threads_as_tasks_end(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(2, 2, keep_alive=LONG * 10)
    futures = [pool.submit(gates.blocker) for _ in range(2)]
    gates.await_started(2)
    pool.set_core_size(1)
    pool.set_max_size(1)
    assert pool.metrics().pool_size == 2  # busy threads cannot be retired yet
    gates.gate.set()
    wait(futures, timeout=LONG)
    wait_until(lambda: pool.metrics().pool_size == 1)


def test_shrinking_core_lets_idle_threads_time_out(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(3, 3, keep_alive=SHORT)
    assert pool.prestart_core_threads() == 3
    pool.set_core_size(1)
    wait_until(lambda: pool.metrics().pool_size == 1)


# ---------------------------------------------------------------------- keep-alive
def test_threads_above_core_exit_after_keep_alive(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    """TCK testKeepAliveTime shape: extra threads die, core threads stay."""
    pool = make_pool(1, 3, queue_capacity=1, keep_alive=SHORT)
    futures = saturate(pool, gates, 1) + [pool.submit(gates.blocker) for _ in range(2)]
    gates.await_started(2)
    assert pool.metrics().pool_size == 3
    gates.gate.set()
    wait(futures, timeout=LONG)
    wait_until(lambda: pool.metrics().pool_size == 1)
    m = pool.metrics()
    assert (m.largest_pool_size, m.completed_task_count) == (3, 4)


# ---------------------------------------------------------------------- shutdown
def test_submit_after_shutdown_raises_runtime_error(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(1)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        pool.submit(int)
    assert pool.is_shutdown and pool.is_terminated
    pool.shutdown()  # idempotent


def test_shutdown_lets_queued_tasks_finish(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1)
    futures = saturate(pool, gates, 3)
    pool.shutdown(wait=False)
    assert not pool.is_terminated
    gates.gate.set()
    assert pool.await_termination(LONG)
    assert [f.result(timeout=0) for f in futures] == ["running", "queued-0", "queued-1", "queued-2"]


def test_shutdown_cancel_futures_cancels_the_queue(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1)
    running, *queued = saturate(pool, gates, 3)
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    assert set(wait(queued, timeout=0).done) == set(queued)
    m = pool.metrics()
    assert (m.cancelled_task_count, m.queue_size, m.is_shutdown) == (3, 0, True)
    gates.gate.set()
    assert running.result(timeout=LONG) == "running"
    assert pool.await_termination(LONG)
    assert pool.metrics().is_terminated


def test_await_termination_times_out_while_a_task_runs(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1)
    saturate(pool, gates, 0)
    pool.shutdown(wait=False)
    assert pool.await_termination(SHORT) is False
    gates.gate.set()
    assert pool.await_termination(LONG)


def test_shutdown_from_a_pool_thread_does_not_deadlock(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(2)

    def stop() -> str:
        pool.shutdown(wait=True)
        return "stopped"

    assert pool.submit(stop).result(timeout=LONG) == "stopped"
    assert pool.await_termination(LONG)


def test_context_manager_shuts_the_pool_down() -> None:
    with ThreadPool(2) as pool:
        assert pool.submit(lambda: 7).result(timeout=LONG) == 7
    assert pool.is_terminated


def test_threads_carry_the_prefix(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(1, thread_name_prefix="orders")
    name = pool.submit(lambda: threading.current_thread().name).result(timeout=LONG)
    assert name.startswith("orders-")
    assert pool.name.startswith("orders-")
    assert make_pool(1, name="billing").metrics().pool_name == "billing"


# ---------------------------------------------------------------------- metrics
def test_metrics_are_an_immutable_printable_snapshot(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(2)
    pool.submit(int).result(timeout=LONG)
    m = pool.metrics()
    with pytest.raises(ValidationError):
        m.task_count = 5  # type: ignore[misc]
    assert m.task_count == 1
    assert "pool size = 1" in str(m) and "completed tasks = 1" in str(m)
    assert "Running" in repr(pool)
    assert PoolMetrics.model_validate_json(m.model_dump_json()) == m


def test_timings_are_seconds_and_percentiles_ordered(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(2)
    for f in [pool.submit(time.sleep, SHORT / 10) for _ in range(20)]:
        f.result(timeout=LONG)
    m = pool.metrics()
    assert m.run_time_s is not None and m.queue_wait_s is not None
    r = m.run_time_s
    assert r.count == 20
    assert SHORT / 10 <= r.min <= r.p50 <= r.p90 <= r.p99 <= r.max < LONG
    assert r.min <= r.avg <= r.max
    assert m.run_time_total_s is not None and m.run_time_total_s >= 20 * SHORT / 10
    assert m.queue_wait_s.min >= 0.0


def test_failed_tasks_are_completed_and_failed(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(1)

    def boom() -> None:
        raise ValueError("boom")

    f = pool.submit(boom)
    assert isinstance(f.exception(timeout=LONG), ValueError)
    m = pool.metrics()
    assert (m.completed_task_count, m.failed_task_count) == (1, 1)


def test_counters_are_updated_before_the_future_resolves(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(2)
    for i in range(1, 50):
        pool.submit(int).result(timeout=LONG)
        assert pool.metrics().completed_task_count == i


def test_cancelling_a_queued_future_takes_it_out_of_the_queue(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1)
    running, first, second = saturate(pool, gates, 2)
    assert first.cancel()
    assert first in wait([first], timeout=0).done  # notified at once, not when a worker pops it
    m = pool.metrics()
    assert (m.queue_size, m.cancelled_task_count) == (1, 1)
    assert conserved(m)
    assert not running.cancel()
    gates.gate.set()
    assert second.result(timeout=LONG) == "queued-1"
    pool.shutdown()
    m = pool.metrics()
    assert (m.completed_task_count, m.cancelled_task_count, m.task_count) == (2, 1, 3)


def test_many_cancelled_entries_are_compacted(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1)
    saturate(pool, gates, 0)
    futures = [pool.submit(int) for _ in range(300)]
    for f in futures[:-1]:
        f.cancel()
    assert len(pool._queue) < 300
    m = pool.metrics()
    assert (m.queue_size, m.cancelled_task_count) == (1, 299)
    gates.gate.set()
    assert futures[-1].result(timeout=LONG) == 0


def test_mark_abandoned_counts_a_running_task_until_it_ends(
    make_pool: Callable[..., ThreadPool], gates: Gates
) -> None:
    pool = make_pool(1)
    running, queued = saturate(pool, gates, 1)
    pool.mark_abandoned(running)
    pool.mark_abandoned(running)  # once only
    pool.mark_abandoned(Future())  # not ours: ignored
    m = pool.metrics()
    assert (m.abandoned_running, m.abandoned_total) == (1, 1)
    pool.mark_abandoned(queued)  # counted when it starts
    assert pool.metrics().abandoned_running == 1
    gates.gate.set()
    queued.result(timeout=LONG)
    m = pool.metrics()
    assert (m.abandoned_running, m.abandoned_total) == (0, 2)
    pool.mark_abandoned(queued)  # done: ignored
    assert pool.metrics().abandoned_total == 2


def test_worker_native_ids_are_the_pool_threads(make_pool: Callable[..., ThreadPool]) -> None:
    pool = make_pool(2)
    ids = {pool.submit(threading.get_native_id).result(timeout=LONG) for _ in range(2)}
    assert ids <= set(pool.worker_native_ids())


def test_metrics_invariants_under_load_from_several_threads(
    make_pool: Callable[..., ThreadPool],
) -> None:
    """S5: snapshots in a tight loop from 4 threads while 4 threads submit, fail and cancel."""
    pool = make_pool(2, 4, queue_capacity=8, rejection=RejectionPolicy.CALLER_RUNS)
    stop = threading.Event()
    violations: list[str] = []
    per_submitter = 400

    def boom() -> None:
        raise RuntimeError("task failed")

    def submitter(k: int) -> None:
        for i in range(per_submitter):
            f = pool.submit(boom if i % 7 == 0 else int)
            if i % 5 == 0:
                f.cancel()

    def watcher() -> None:
        previous: PoolMetrics | None = None
        while not stop.is_set():
            m = pool.metrics()
            assert m.active_count is not None and m.pool_size is not None
            assert m.queue_size is not None and m.max_size is not None
            if not (0 <= m.active_count <= m.pool_size <= m.max_size):
                violations.append(f"sizes {m}")
            if not (m.largest_pool_size or 0) <= m.max_size:
                violations.append(f"largest {m}")
            if not 0 <= m.queue_size <= 8:
                violations.append(f"queue {m}")
            if not conserved(m):
                violations.append(f"conservation {m}")
            if m.failed_task_count > m.completed_task_count:
                violations.append(f"failed {m}")
            if previous is not None:
                for field in ("task_count", "completed_task_count", "failed_task_count",
                              "cancelled_task_count", "rejected_count"):
                    if getattr(m, field) < getattr(previous, field):
                        violations.append(f"{field} decreased")
            previous = m

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        watchers = [threading.Thread(target=watcher, name=f"watch-{i}") for i in range(4)]
        submitters = [threading.Thread(target=submitter, args=(i,), name=f"sub-{i}") for i in range(4)]
        for t in watchers + submitters:
            t.start()
        for t in submitters:
            t.join(LONG)
        pool.shutdown(wait=True)
        stop.set()
        for t in watchers:
            t.join(LONG)
    finally:
        sys.setswitchinterval(old_interval)
    assert not violations, violations[:5]
    m = pool.metrics()
    assert m.task_count == 4 * per_submitter
    assert m.task_count == m.completed_task_count + m.cancelled_task_count + m.rejected_count
    assert (m.active_count, m.queue_size, m.pool_size) == (0, 0, 0)


# ---------------------------------------------------------------------- MonitoredExecutor
@pytest.fixture
def monitored(gates: Gates) -> Iterator[Callable[[Executor], MonitoredExecutor]]:
    wrapped: list[MonitoredExecutor] = []

    def wrap(executor: Executor, **kwargs: Any) -> MonitoredExecutor:
        mon = MonitoredExecutor(executor, **kwargs)
        wrapped.append(mon)
        return mon

    yield wrap
    gates.gate.set()
    for mon in wrapped:
        mon.shutdown(wait=True, cancel_futures=True)


def test_monitored_thread_pool_executor_counts(
    monitored: Callable[..., MonitoredExecutor], gates: Gates
) -> None:
    mon = monitored(ThreadPoolExecutor(2, thread_name_prefix="taskflow-test"))
    assert isinstance(mon, Executor) and mon.max_size == 2 and mon._max_workers == 2
    running = [mon.submit(gates.blocker, i) for i in range(2)]
    gates.await_started(2)
    queued = [mon.submit(gates.blocker, i) for i in range(2, 5)]
    assert queued[0].cancel()
    m = mon.metrics()
    assert (m.active_count, m.queue_size, m.cancelled_task_count, m.task_count) == (2, 2, 1, 5)
    assert (m.pool_size, m.max_size, m.liveness_pct) == (2, 2, 100.0)
    assert m.core_size is None and m.queue_capacity is None
    assert conserved(m)
    mon.mark_abandoned(running[0])
    assert mon.metrics().abandoned_running == 1

    def boom() -> None:
        raise OSError("failed")

    failing = mon.submit(boom)
    gates.gate.set()
    assert isinstance(failing.exception(timeout=LONG), OSError)
    wait(running + queued, timeout=LONG)
    m = mon.metrics()
    assert (m.completed_task_count, m.failed_task_count, m.active_count, m.queue_size) == (5, 1, 0, 0)
    assert (m.abandoned_running, m.abandoned_total) == (0, 1)
    assert m.run_time_s is not None and m.run_time_s.count == 5
    assert m.task_count == m.completed_task_count + m.cancelled_task_count


def test_monitored_executor_counts_inner_rejections(monitored: Callable[..., MonitoredExecutor]) -> None:
    inner = ThreadPoolExecutor(1)
    mon = monitored(inner)
    inner.shutdown()
    with pytest.raises(RuntimeError):
        mon.submit(int)
    m = mon.metrics()
    assert (m.task_count, m.rejected_count, m.is_shutdown) == (1, 1, True)


def test_a_monitored_broken_stdlib_pool_fails_tasks_and_refuses_new_ones(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    from concurrent.futures.thread import BrokenThreadPool

    def bad_initializer() -> None:
        raise OSError("no database")

    mon = monitored(ThreadPoolExecutor(1, initializer=bad_initializer))
    first = mon.submit(int, "7")
    assert isinstance(first.exception(timeout=LONG), BrokenThreadPool)
    with pytest.raises(BrokenThreadPool):
        mon.submit(int)
    m = mon.metrics()
    assert (m.task_count, m.rejected_count, m.completed_task_count) == (2, 1, 0)


def test_a_monitored_stdlib_pool_passes_arguments_and_errors_through(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    mon = monitored(ThreadPoolExecutor(2))
    assert mon.submit(int, "ff", base=16).result(timeout=LONG) == 255
    error = mon.submit(int, "zz").exception(timeout=LONG)
    assert isinstance(error, ValueError) and error.__traceback__ is not None
    m = mon.metrics()
    assert (m.completed_task_count, m.failed_task_count) == (2, 1)
    assert m.run_time_s is not None and m.run_time_s.count == 2


def test_monitored_thread_pool_reports_its_configuration(
    monitored: Callable[..., MonitoredExecutor], make_pool: Callable[..., ThreadPool]
) -> None:
    pool = make_pool(1, 3, queue_capacity=4, rejection="discard")
    mon = monitored(pool, name="api")
    assert mon.submit(lambda: 1).result(timeout=LONG) == 1
    m = mon.metrics()
    assert (m.pool_name, m.core_size, m.max_size, m.queue_capacity) == ("api", 1, 3, 4)
    assert m.rejection_policy == "discard" and m.completed_task_count == 1
    assert set(mon.worker_native_ids()) == set(pool.worker_native_ids())


def _square(x: int) -> int:
    return x * x


@pytest.mark.allow_thread_leak  # ProcessPoolExecutor's management thread ends asynchronously
def test_monitored_process_pool_passes_the_callable_through(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    mon = monitored(ProcessPoolExecutor(1))
    futures = [mon.submit(_square, i) for i in range(4)]
    assert [f.result(timeout=LONG) for f in futures] == [0, 1, 4, 9]
    m = mon.metrics()
    assert (m.completed_task_count, m.task_count) == (4, 4)
    assert m.run_time_s is None and m.queue_wait_s is None  # cannot be timed out of process
    assert m.executor_type == "ProcessPoolExecutor"
    assert (m.active_count, m.queue_size) == (0, 0)


def test_monitored_executor_invariants_under_load(monitored: Callable[..., MonitoredExecutor]) -> None:
    mon = monitored(ThreadPoolExecutor(4))
    stop = threading.Event()
    violations: list[str] = []

    def watcher() -> None:
        previous: PoolMetrics | None = None
        while not stop.is_set():
            m = mon.metrics()
            assert m.active_count is not None and m.queue_size is not None
            if not 0 <= m.active_count <= 4:
                violations.append(f"active {m}")
            if m.queue_size < 0 or not conserved(m):
                violations.append(f"conservation {m}")
            if previous is not None:
                for field in ("task_count", "completed_task_count", "failed_task_count",
                              "cancelled_task_count"):
                    if getattr(m, field) < getattr(previous, field):
                        violations.append(f"{field} decreased")
            previous = m

    def submitter() -> None:
        for i in range(400):
            f = mon.submit(int)
            if i % 9 == 0:
                f.cancel()

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=watcher) for _ in range(2)]
        threads += [threading.Thread(target=submitter) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads[2:]:
            t.join(LONG)
        mon.shutdown(wait=True)
        stop.set()
        for t in threads[:2]:
            t.join(LONG)
    finally:
        sys.setswitchinterval(old_interval)
    assert not violations, violations[:5]
    m = mon.metrics()
    assert m.task_count == 1600 == m.completed_task_count + m.cancelled_task_count
    assert (m.active_count, m.queue_size) == (0, 0)


def test_pool_names_come_from_the_module_that_defines_them() -> None:
    import taskflow
    import taskflow.metrics
    import taskflow.pools.monitored
    import taskflow.pools.threadpool

    assert taskflow.MonitoredExecutor is taskflow.pools.monitored.MonitoredExecutor
    assert taskflow.ThreadPool is taskflow.pools.threadpool.ThreadPool
    assert taskflow.PoolMetrics is taskflow.metrics.PoolMetrics
    assert taskflow.Percentiles is taskflow.metrics.Percentiles
    # no re-exports through the pool module: each name has one home
    assert not hasattr(taskflow.pools.threadpool, "__getattr__")
    assert not hasattr(taskflow.pools.threadpool, "MonitoredExecutor")
    for name in ("MonitoredExecutor", "PoolMetrics", "Percentiles"):
        assert name not in taskflow.pools.threadpool.__all__


@pytest.mark.parametrize("keep_alive", [0.0, 1e12, float("inf")])
def test_any_keep_alive_parks_idle_threads_safely(
    make_pool: Callable[..., ThreadPool], keep_alive: float
) -> None:
    """A keep-alive longer than a lock wait can be (``threading.TIMEOUT_MAX``) means no limit."""
    pool = make_pool(1, 2, queue_capacity=0, keep_alive=keep_alive)
    for n in range(3):  # each task after the first finds the thread parked
        assert pool.submit(int, str(n)).result(timeout=LONG) == n
    assert pool.metrics().pool_size == 1


def test_a_monitored_stdlib_pool_counts_each_cancellation_once(
    monitored: Callable[..., MonitoredExecutor], gates: Gates
) -> None:
    mon = monitored(ThreadPoolExecutor(1))
    running = mon.submit(gates.blocker)
    gates.await_started(1)
    queued = [mon.submit(gates.blocker) for _ in range(4)]
    assert queued[0].cancel() and queued[0].cancel()  # the second cancel is not a new one
    assert not running.cancel()
    m = mon.metrics()
    assert (m.cancelled_task_count, m.queue_size, m.active_count) == (1, 3, 1)
    mon.shutdown(wait=False, cancel_futures=True)  # the pool cancels the three still queued
    m = mon.metrics()
    assert (m.cancelled_task_count, m.queue_size) == (4, 0)
    gates.gate.set()
    running.result(timeout=LONG)
    m = mon.metrics()
    assert conserved(m) and (m.completed_task_count, m.active_count) == (1, 0)


class _StepClock:
    """A fake ``time.monotonic`` for the monitor: it moves only when a task moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("inner", ["stdlib", "ThreadPool"])
def test_monitored_timings_add_up_exactly_across_ring_laps(
    monitored: Callable[..., MonitoredExecutor], gates: Gates, monkeypatch: pytest.MonkeyPatch,
    inner: str,
) -> None:
    """Queue-wait and run totals count every task, and the percentiles the latest 1024 of one
    thread, however many times its ring of samples went round; failures are timed too."""
    import taskflow.pools.monitored

    clock = _StepClock()
    monkeypatch.setattr(taskflow.pools.monitored, "_monotonic", clock)
    pool = ThreadPoolExecutor(1) if inner == "stdlib" else ThreadPool(1)
    mon = monitored(pool)
    blocker = mon.submit(gates.blocker)  # submitted at 0, starts at 0
    gates.await_started(1)
    clock.now = 1.0
    n = 2500  # more than two laps of the 1024-sample ring
    durations = [(i % 7 + 1) / 1024 for i in range(n)]  # binary fractions: sums are exact

    def task(i: int) -> int:
        clock.now += durations[i]
        if i % 10 == 3:
            raise ValueError(i)
        return i

    futures = [mon.submit(task, i) for i in range(n)]  # all submitted at 1.0
    clock.now = 10.0
    gates.gate.set()  # the blocker ends at 10.0: ran 10 s; task 0 starts at 10.0
    wait([blocker, *futures], timeout=LONG)
    assert sum(f.exception() is not None for f in futures) == n // 10

    starts = [10.0 + sum(durations[:i]) for i in range(n)]
    m = mon.metrics()
    assert (m.completed_task_count, m.failed_task_count) == (n + 1, n // 10)
    assert m.queue_wait_total_s == pytest.approx(sum(s - 1.0 for s in starts), rel=1e-12)
    assert m.run_time_total_s == pytest.approx(10.0 + sum(durations), rel=1e-12)
    recent_runs = durations[-1024:]
    recent_waits = [s - 1.0 for s in starts[-1024:]]
    assert m.run_time_s is not None and m.queue_wait_s is not None
    assert (m.run_time_s.count, m.queue_wait_s.count) == (1024, 1024)
    assert m.run_time_s.avg == pytest.approx(sum(recent_runs) / 1024, rel=1e-9)
    assert (m.run_time_s.min, m.run_time_s.max) == (1 / 1024, 7 / 1024)
    assert m.queue_wait_s.min == pytest.approx(min(recent_waits), rel=1e-12)
    assert m.queue_wait_s.max == pytest.approx(max(recent_waits), rel=1e-12)


# ------------------------------------------- MonitoredExecutor's own worker loop on a stdlib pool
@pytest.mark.skipif(
    not stdlib_copy_fits(), reason="this Python's stdlib worker loop is not the one copied",
)
def test_a_wrapped_stdlib_pool_starts_its_threads_on_the_monitored_worker(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    """Threads started before wrapping keep the stdlib worker and still count the monitor's
    tasks; threads started after run the monitored loop, which also runs work submitted to the
    pool directly (not counted) and tasks of a second monitor (counted by that one)."""
    import concurrent.futures.thread as cft

    from taskflow.pools import monitored as monitor_module

    inner = ThreadPoolExecutor(2, thread_name_prefix="wrapped")
    assert inner.submit(int, "1").result(timeout=LONG) == 1  # one stdlib thread, now idle
    mon = monitored(inner)
    other = monitored(inner)  # the last wrapper's hook starts the pool's new threads
    gate = threading.Event()
    both_running = threading.Barrier(2, timeout=LONG)

    def hold() -> str:
        both_running.wait()  # two tasks at once: the pool must have started its 2nd thread
        gate.wait(LONG)
        return threading.current_thread().name

    held = [mon.submit(hold), mon.submit(hold)]
    gate.set()
    names = sorted(f.result(timeout=LONG) for f in held)
    assert names == ["wrapped_0", "wrapped_1"]
    assert {t._target for t in inner._threads} == {  # type: ignore[attr-defined]
        cft._worker, monitor_module._monitored_worker,
    }
    results = [mon.submit(pow, 2, i) for i in range(50)]
    direct = [inner.submit(pow, 3, i) for i in range(50)]
    theirs = [other.submit(abs, -i) for i in range(50)]
    assert [f.result(timeout=LONG) for f in results] == [2**i for i in range(50)]
    assert [f.result(timeout=LONG) for f in direct] == [3**i for i in range(50)]
    assert [f.result(timeout=LONG) for f in theirs] == list(range(50))
    m, o = mon.metrics(), other.metrics()
    assert (m.task_count, m.completed_task_count, m.active_count, m.queue_size) == (52, 52, 0, 0)
    assert (o.task_count, o.completed_task_count, o.active_count, o.queue_size) == (50, 50, 0, 0)
    assert m.run_time_s is not None and m.run_time_s.count == 52


def _wait_until(cond: Callable[[], bool], what: str) -> None:
    """Poll ``cond`` (every millisecond, up to LONG seconds); fail naming ``what``."""
    tick = threading.Event()
    deadline = time.monotonic() + LONG
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        tick.wait(0.001)


def test_a_monitored_stdlib_pool_below_its_size_reuses_an_idle_thread(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    """Below its size the wrapped pool keeps the stdlib's idle-thread accounting: a worker that
    finished says it is idle, and the next task goes to it instead of to a new thread."""
    inner = ThreadPoolExecutor(8)
    mon = monitored(inner)
    idle = inner._idle_semaphore  # type: ignore[attr-defined]
    for i in range(20):
        assert mon.submit(abs, -i).result(timeout=LONG) == i
        _wait_until(lambda: idle._value == 1, "the worker reported itself idle")
        assert len(inner._threads) == 1  # type: ignore[attr-defined]
    assert mon.metrics().pool_size == 1


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_a_full_monitored_stdlib_pool_runs_every_burst_as_wide_as_the_pool(
    monitored: Callable[..., MonitoredExecutor], size: int,
) -> None:
    """Once the wrapped pool has all its threads, its submit and workers skip the idle-thread
    semaphore (it only decides whether to start a thread): no worker may idle while a task
    waits, burst after burst, nor may a quick task wait behind a blocked one."""
    inner = ThreadPoolExecutor(size)
    mon = monitored(inner)
    for _ in range(6):
        barrier = threading.Barrier(size, timeout=LONG)
        futures = [mon.submit(barrier.wait) for _ in range(size)]
        for f in futures:
            f.result(timeout=2 * LONG)  # BrokenBarrierError if one never started
        assert len(inner._threads) == size  # type: ignore[attr-defined]
    if size > 1:
        release = threading.Event()
        blocked = [mon.submit(release.wait, LONG) for _ in range(size - 1)]
        try:
            assert mon.submit(abs, -7).result(timeout=LONG) == 7
        finally:
            release.set()
        assert all(f.result(timeout=LONG) for f in blocked)
    m = mon.metrics()
    assert (m.pool_size, m.active_count, m.queue_size) == (size, 0, 0)


def test_the_monitored_worker_fails_a_task_and_carries_on(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    mon = monitored(ThreadPoolExecutor(1))

    def boom(i: int) -> None:
        raise KeyError(i)

    errors = [mon.submit(boom, i).exception(timeout=LONG) for i in range(3)]
    assert [type(e) for e in errors] == [KeyError] * 3
    assert mon.submit(int, "5").result(timeout=LONG) == 5
    m = mon.metrics()
    assert (m.completed_task_count, m.failed_task_count, m.pool_size) == (4, 3, 1)


@pytest.mark.skipif(
    not stdlib_copy_fits(), reason="this Python's stdlib worker loop is not the one copied",
)
def test_the_monitored_worker_drops_its_last_task(
    monitored: Callable[..., MonitoredExecutor],
) -> None:
    """An idle monitored worker holds neither its last task's arguments, result nor Future,
    whether the task returned or raised (the stdlib worker holds none either)."""
    import gc
    import weakref

    class Payload:
        pass

    mon = monitored(ThreadPoolExecutor(1))

    def gone_soon(refs: list[weakref.ref[Any]]) -> bool:
        deadline = time.monotonic() + LONG
        while time.monotonic() < deadline:  # the worker drops them just after set_result
            gc.collect()
            if all(r() is None for r in refs):
                return True
            threading.Event().wait(0.001)
        return False

    arg = Payload()
    future = mon.submit(lambda a: Payload(), arg)
    result = future.result(timeout=LONG)
    assert isinstance(result, Payload)
    refs = [weakref.ref(x) for x in (arg, result, future)]
    del arg, result, future
    assert gone_soon(refs)

    failing = mon.submit(operator_error)
    assert failing.exception(timeout=LONG) is not None
    refs = [weakref.ref(failing)]
    del failing
    assert gone_soon(refs)


def operator_error() -> None:
    raise ArithmeticError("failed on purpose")


def test_a_dropped_monitored_stdlib_pool_lets_its_threads_exit() -> None:
    """Like the stdlib worker, the monitored one holds the pool and the monitor weakly: drop
    both without ``shutdown`` and the threads exit."""
    import gc

    inner = ThreadPoolExecutor(2)
    mon = MonitoredExecutor(inner)
    assert mon.submit(int, "3").result(timeout=LONG) == 3
    threads = list(inner._threads)  # type: ignore[attr-defined]
    assert threads
    del mon, inner
    gc.collect()
    for t in threads:
        t.join(LONG)
        assert not t.is_alive()


@pytest.mark.parametrize("inner", ["stdlib", "ThreadPool"])
def test_monitored_timings_read_while_tasks_run_are_whole_and_consistent(
    monitored: Callable[..., MonitoredExecutor], gates: Gates, monkeypatch: pytest.MonkeyPatch,
    inner: str,
) -> None:
    """Snapshots taken while a worker laps its ring of samples many times see only whole
    samples and totals that match the completed count exactly (workers take no lock)."""
    import taskflow.pools.monitored

    clock = _StepClock()
    monkeypatch.setattr(taskflow.pools.monitored, "_monotonic", clock)
    mon = monitored(ThreadPoolExecutor(1) if inner == "stdlib" else ThreadPool(1))
    d = 1 / 1024  # every task runs d; task k (after the blocker) starts at (k - 1) * d

    def task() -> None:
        clock.now += d

    blocker = mon.submit(gates.blocker)  # runs 0 s at 0
    gates.await_started(1)
    n = 6000
    futures = [mon.submit(task) for _ in range(n)]  # all submitted at 0
    violations: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            m = mon.metrics()
            c = m.completed_task_count - 1  # timed tasks finished, blocker aside
            if c < 0:
                continue
            if m.run_time_total_s != c * d or m.queue_wait_total_s != d * c * (c - 1) / 2:
                violations.append(f"totals {c} {m.run_time_total_s} {m.queue_wait_total_s}")
            if m.run_time_s is not None and (m.run_time_s.max > d or m.run_time_s.min < 0):
                violations.append(f"torn run sample {m.run_time_s}")
            if m.queue_wait_s is not None and c and m.queue_wait_s.max != (c - 1) * d:
                violations.append(f"torn wait sample {c} {m.queue_wait_s}")

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    watcher = threading.Thread(target=reader, name="reader")
    try:
        watcher.start()
        gates.gate.set()
        wait([blocker, *futures], timeout=LONG)
    finally:
        done.set()
        watcher.join(LONG)
        sys.setswitchinterval(old_interval)
    assert not violations, violations[:5]
    m = mon.metrics()
    assert m.completed_task_count == n + 1
    assert m.run_time_total_s == n * d
    assert m.run_time_s is not None and m.run_time_s.count == 1024


def test_thread_stats_leave_out_the_sample_being_written() -> None:
    """A reader that runs while a worker is between its three stores of a sample (the entry of
    the task ``SAMPLES_KEPT`` earlier half overwritten) leaves that entry out; the totals are
    those of the completed tasks."""
    from taskflow.pools.monitored import _ThreadStats

    st = _ThreadStats(threading.current_thread())
    n = 1500
    for k in range(n):  # task k: submitted at k, started at k + 1/4, ended at k + 3/4
        st.started = k + 1
        st.finish(k, float(k), k + 0.25, k + 0.75)
    st.started = n + 1  # task n runs, then has written one of its three readings
    st.subs[n % 1024] = 1e9
    waits: list[float] = []
    runs: list[float] = []
    failed, done, started, wait_total, run_total = st.read(waits, runs)
    assert (failed, done, started) == (0, n, n + 1)
    assert (wait_total, run_total) == (n * 0.25, n * 0.5)
    assert len(waits) == len(runs) == 1023  # tasks n - 1023 .. n - 1
    assert set(waits) == {0.25} and set(runs) == {0.5}
