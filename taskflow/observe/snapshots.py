"""What a [`PoolMonitor`][taskflow.observe.monitor.PoolMonitor] records: snapshots, alarms and their
thresholds.

Frozen pydantic models, built once per sample (never on the task path): a
[`PoolSnapshot`][taskflow.PoolSnapshot] holds the pool's [`PoolMetrics`][taskflow.metrics.PoolMetrics], the
[`ProcessMetrics`][taskflow.ProcessMetrics] psutil read in the same sample, the resilience primitives' metrics and
the [`Alarm`][taskflow.Alarm] s that sample fired under the monitor's [`Thresholds`][taskflow.Thresholds].
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from taskflow.exposition import Sample
from taskflow.metrics import InflightMetrics, LoopMetrics, PoolMetrics
from taskflow.resilience.batch import BatchMetrics
from taskflow.resilience.breaker import BreakerMetrics
from taskflow.resilience.bulkhead import BulkheadMetrics
from taskflow.resilience.cache import CacheMetrics
from taskflow.resilience.detached import DetachedMetrics
from taskflow.resilience.ratelimit import RateLimitMetrics
from taskflow.resilience.retrybudget import RetryBudgetMetrics
from taskflow.resilience.shedding_metrics import LoadSheddingMetrics
from taskflow.resilience.singleflight import SingleFlightMetrics

__all__ = ["Alarm", "AlarmKind", "PoolSnapshot", "ProcessMetrics", "Thresholds"]

AlarmKind = Literal["liveness", "queue_usage", "rejected", "abandoned", "queue_wait"]


class Thresholds(BaseModel):
    """When ``PoolMonitor`` raises an alarm; ``None`` turns a rule off.

    Defaults are dynamic-tp's (``NotifyItem``): liveness and queue usage at 70 %, any
    rejection; plus any abandoned task still running, the sign that a pool bleeds threads to
    work nobody waits for. Pass a mapping to ``PoolMonitor`` to override some of them and keep
    the other defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    liveness_pct: float | None = Field(default=70.0, ge=0)
    """Alarm when ``active_count / max_size * 100`` reaches this."""
    queue_usage_pct: float | None = Field(default=70.0, ge=0)
    """Alarm when ``queue_size / queue_capacity * 100`` reaches this (bounded queues only)."""
    rejected: int | None = Field(default=1, ge=1)
    """Alarm when this many tasks were rejected since the previous sample."""
    abandoned_running: int | None = Field(default=1, ge=1)
    """Alarm when this many abandoned tasks are still running."""
    queue_wait_ratio: float | None = Field(default=1.0, gt=0)
    """Alarm when, over the tasks completed since the previous sample, time spent waiting in
    the queue reaches this multiple of time spent running: requests wait for the pool, which
    is too small for the load (see "Sizing the pool" in the README)."""
    queue_wait_min_s: float = Field(default=0.005, ge=0)
    """...and the average queue wait over those tasks is at least this long (so a pool of
    microsecond tasks does not alarm on microsecond waits)."""
    silence_s: float = Field(default=120.0, ge=0)
    """After an alarm fires, the same alarm is not raised again for this many seconds."""


class Alarm(BaseModel):
    """One alarm raised by a ``PoolMonitor``."""

    model_config = ConfigDict(frozen=True)

    kind: AlarmKind
    pool_name: str
    value: float
    threshold: float
    message: str
    timestamp: float
    """``time.time()`` when the alarm fired."""


class ProcessMetrics(BaseModel):
    """psutil figures of this process, read inside one ``Process.oneshot()``.

    ``None`` where the platform does not give the figure.
    """

    model_config = ConfigDict(frozen=True)

    pid: int
    cpu_percent: float | None
    """CPU use since the previous sample; can exceed 100 with several cores."""
    cpu_user_s: float | None
    cpu_system_s: float | None
    rss_bytes: int | None
    vms_bytes: int | None
    num_threads: int | None
    ctx_switches_voluntary: int | None
    ctx_switches_involuntary: int | None
    """A fast-rising count hints at GIL or CPU contention."""
    num_fds: int | None


class PoolSnapshot(BaseModel):
    """One sample taken by a ``PoolMonitor``."""

    model_config = ConfigDict(frozen=True)

    pool_name: str
    timestamp: float
    """``time.time()`` of the sample."""
    monotonic: float
    pool: PoolMetrics | None
    """``None`` when the executor has no ``metrics()``."""
    process: ProcessMetrics
    tps: float | None
    """Tasks completed per second since the previous sample."""
    worker_cpu_s: float | None
    """CPU seconds (user + system) used so far by the pool's live threads, when known."""
    alarms: tuple[Alarm, ...] = ()
    """Alarms fired by this sample (silenced ones are left out)."""
    resilience: tuple[
        BulkheadMetrics | RateLimitMetrics | BreakerMetrics | SingleFlightMetrics
        | BatchMetrics | RetryBudgetMetrics | CacheMetrics | LoadSheddingMetrics
        | DetachedMetrics | InflightMetrics | LoopMetrics, ...
    ] = ()
    """``metrics()`` of the bulkheads, rate limits, circuit breakers, batches, retry budgets,
    load shedding, detached slots (running, refused), what is running now and the event loops
    of async nodes (lag, attempts in flight, blocked steps) the monitor exports (see ``PoolMonitor``'s ``resilience``), in their order."""
    resilience_samples: tuple[Sample, ...] = Field(default=(), repr=False)
    """The same objects' Prometheus series, read in the same sample."""
