"""Pool metrics models: the immutable snapshots ``ThreadPool`` and ``MonitoredExecutor`` return.

``PoolMetrics`` follows ``java.util.concurrent.ThreadPoolExecutor``'s getters and the fields
dynamic-tp and hippo4j collect; ``Percentiles`` summarises the most
recent queue-wait or run-time samples. Both are frozen pydantic models, built only when a
snapshot is taken, never on the task path.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict

__all__ = ["SAMPLES_KEPT", "InflightMetrics", "LoopMetrics", "Percentiles", "PoolMetrics"]

SAMPLES_KEPT: Final = 1024
"""Queue-wait and run-time samples kept per pool (or per thread) in a ring buffer; a power of
two so the ring index is a mask."""


class Percentiles(BaseModel):
    """Distribution of the most recent samples (up to 1024), all figures in seconds."""

    model_config = ConfigDict(frozen=True)

    count: int
    min: float
    max: float
    avg: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, samples: list[float]) -> Percentiles | None:
        """Nearest-rank percentiles of ``samples``; ``None`` when there are none."""
        if not samples:
            return None
        s = sorted(samples)
        n = len(s)

        def rank(q: float) -> float:
            return s[min(n - 1, max(0, int(q * n + 0.999999) - 1))]

        return cls(
            count=n, min=s[0], max=s[-1], avg=sum(s) / n, p50=rank(0.50), p90=rank(0.90),
            p99=rank(0.99),
        )


class PoolMetrics(BaseModel):
    """An immutable snapshot of a pool: configuration, gauges, counters and recent timings.

    Counters (``*_count``, ``*_total``) never decrease. Each task submitted while the pool was
    open ends in exactly one of completed, cancelled or rejected, so at every snapshot
    ``task_count == completed_task_count + cancelled_task_count + rejected_count + active_count
    + queue_size`` (when the gauges are known). ``None`` means the figure cannot be known for
    this executor. ``active_count <= pool_size <= max_size`` holds except right after
    ``set_max_size`` lowered the maximum: busy threads above it exit when their task ends.
    """

    model_config = ConfigDict(frozen=True)

    # identity and configuration
    pool_name: str
    executor_type: str
    core_size: int | None
    max_size: int | None
    queue_capacity: int | None
    """``None``: unbounded (or unknown); ``0``: direct hand-off."""
    keep_alive_s: float | None
    rejection_policy: str | None
    # gauges
    pool_size: int | None
    largest_pool_size: int | None
    active_count: int | None
    queue_size: int | None
    queue_remaining_capacity: int | None
    abandoned_running: int
    """Tasks still running after the flow that submitted them gave up on them."""
    is_shutdown: bool
    is_terminated: bool | None
    # counters
    task_count: int
    """Tasks submitted while the pool was open, rejected ones included."""
    completed_task_count: int
    """Tasks that ran to the end on a pool thread, successfully or not."""
    failed_task_count: int
    """Completed tasks whose callable raised."""
    cancelled_task_count: int
    """Tasks cancelled before they started (by their Future, shutdown or ``DISCARD_OLDEST``)."""
    rejected_count: int
    """Tasks refused because the pool was saturated: raised (``ABORT``), run by the caller,
    dropped, or evicted by ``DISCARD_OLDEST``. ``ThreadPool`` does not count a submit after
    shutdown (it raises before the task is taken in); ``MonitoredExecutor`` counts every
    exception the inner ``submit`` raised."""
    abandoned_total: int
    # derived, percent; None when the denominator is unknown or unbounded
    liveness_pct: float | None
    """``active_count / max_size * 100`` (dynamic-tp liveness, hippo4j current load)."""
    peak_load_pct: float | None
    """``largest_pool_size / max_size * 100`` (hippo4j peak load)."""
    queue_usage_pct: float | None
    """``queue_size / queue_capacity * 100``; ``None`` for an unbounded queue."""
    # timings of the most recent tasks (seconds), plus cumulative sums over completed tasks
    queue_wait_s: Percentiles | None
    run_time_s: Percentiles | None
    queue_wait_total_s: float | None
    run_time_total_s: float | None
    retired_worker_cpu_s: float | None = None
    """CPU seconds (user + system) used by the pool's threads that have exited, so that a
    worker-CPU counter does not go down when threads retire; ``None`` when unknown. ``0`` for
    pools whose threads never exit (the standard ``ThreadPoolExecutor``)."""
    # when
    timestamp: float
    """``time.time()`` of the snapshot."""
    monotonic: float
    """Monotonic seconds of the snapshot (``taskflow.clock.real_now()``: ``time.monotonic()``
    unless a ``FakeClock`` that ran ahead was used in this process, then ``clock.offset`` ahead)."""

    def __str__(self) -> str:
        state = "Terminated" if self.is_terminated else "Shutting down" if self.is_shutdown else "Running"
        return (
            f"{self.pool_name} [{state}, pool size = {_fmt(self.pool_size)}, "
            f"active threads = {_fmt(self.active_count)}, queued tasks = {_fmt(self.queue_size)}, "
            f"completed tasks = {self.completed_task_count}, failed = {self.failed_task_count}, "
            f"cancelled = {self.cancelled_task_count}, rejected = {self.rejected_count}, "
            f"abandoned running = {self.abandoned_running}]"
        )


class InflightMetrics(BaseModel):
    """What is running now in this process (``taskflow.observe.inflight``): counts only."""

    model_config = ConfigDict(frozen=True)

    name: str
    runs: int
    """Runs in progress."""
    abandoned: dict[str, int]
    """Attempts given up whose thread is still in the task, by node name."""


class LoopMetrics(BaseModel):
    """The event loops async nodes run on in this process (taskflow's loop thread, an
    application's loop, a loop awaiting ``run_async``), by the name of the loop's thread."""

    model_config = ConfigDict(frozen=True)

    name: str
    lag_s: dict[str, float]
    """How late a callback scheduled on the loop runs: the last probe's delay, or how long the
    pending probe has waited when longer (a loop blocked now), by loop."""
    attempts: dict[str, int]
    """Async attempts in flight (their asyncio task begun, not ended), by loop."""
    blocked_steps: dict[str, int]
    """Steps of an async task that held their loop past the threshold (0.1 s), by node name,
    since the process started."""


def _fmt(value: int | None) -> str:
    return "?" if value is None else str(value)


def pct(part: int | None, whole: int | None) -> float | None:
    """``part / whole * 100``; ``None`` when either is unknown or ``whole`` is 0."""
    if part is None or not whole:
        return None
    return part * 100.0 / whole
