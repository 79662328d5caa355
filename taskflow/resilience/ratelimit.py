"""``RateLimit``: a process-wide token bucket whose waiters hold no thread.

Nobody sleeps for a token. ``reserve(deadline=...)`` takes the next token at once and says *when*
it may be used (``Reservation.ready_at``); the engine starts the attempt then, from its timer, so
a waiting node holds no worker. Reservations are served first come, first served: each one's
time is fixed when it is made, so a steady stream cannot starve an earlier waiter.

How the engine uses it::

    r = limit.reserve(deadline=run_deadline)
    if r is None:            # no token before the deadline: the node ends TIMEOUT (no token used)
        ...
    elif r.ready_at <= now:  # start now
        ...
    else:                    # timer.schedule(r.ready_at, start_attempt); if the run ends first,
        ...                  # r.cancel()
    r = limit.reserve_now()  # a hedge: a token now or None (never waits); r.cancel() when the
                             # hedge does not start after all

The bucket holds at most ``burst`` tokens and gains ``per_second`` tokens a second, so over any
interval of ``T`` seconds at most ``burst + per_second * T`` reservations become ready. A
cancelled reservation gives its token back only when it is the latest one (the bucket is then
exactly as if it had never been made); otherwise later reservations already counted on it and
its token is lost, which can lower the rate but never raises it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from threading import Lock

from pydantic import BaseModel, ConfigDict

from taskflow import clock as seam
from taskflow.exposition import Sample
from taskflow.resilience.export import register, render_prometheus
from taskflow.resilience.options import check_int, check_name, check_seconds, rebuild
from taskflow.resilience.process import track

__all__ = ["RateLimit", "RateLimitMetrics", "Reservation"]


class RateLimitMetrics(BaseModel):
    """A snapshot of one rate limit."""

    model_config = ConfigDict(frozen=True)

    name: str
    per_second: float
    burst: int
    tokens: float  # tokens in the bucket now (negative: owed to waiting reservations)
    granted: int  # reservations made (total)
    waiting: int  # reservations whose time has not come yet (and not cancelled)
    timed_out: int  # reserve() refused because no token came before the deadline (total)
    cancelled: int  # reservations cancelled (total)


class Reservation:
    """The right to start one attempt at ``ready_at`` (a clock time)."""

    __slots__ = ("_cancelled", "_limit", "ready_at")

    def __init__(self, limit: RateLimit, ready_at: float) -> None:
        self._limit = limit
        self.ready_at = ready_at
        self._cancelled = False  # guarded by the limit's lock

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def delay(self) -> float:
        """Seconds from now until ``ready_at`` (0 when it has come)."""
        return max(0.0, self.ready_at - (self._limit._clock or seam.now)())

    def cancel(self) -> bool:
        """Give up the reservation (its run ended before it was used).

        Returns:
            True when its token went back to the bucket (it was the latest reservation);
            False when the token is lost or it was already cancelled.
        """
        return self._limit._cancel(self)

    def __repr__(self) -> str:
        return f"<Reservation of rate limit {self._limit.name!r} at {self.ready_at:.6f}>"


class RateLimit:
    """A token bucket shared by every node that uses it, across runs.

    Args:
        name: Names the limit in errors, logs and metrics.
        per_second: Tokens added per second (> 0).
        burst: Bucket size (>= 1): how many attempts may start at once after a quiet period.
            Default: ``per_second`` rounded up, at least 1.
        clock: Monotonic clock in seconds. Default ``None``: taskflow's clock
            (``taskflow.clock.now``), read at each call, so a fake clock installed later
            is followed. An explicit one (a test's) stays this object's.

    Raises:
        FlowDefinitionError: An option is invalid (the message names the rate limit).
    """

    def __init__(
        self,
        name: str,
        *,
        per_second: float,
        burst: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = check_name("rate limit", name)
        owner = f"rate limit {name!r}"
        self.per_second = check_seconds(owner, "per_second", per_second, allow_zero=False)
        self.burst = (
            max(1, math.ceil(self.per_second)) if burst is None
            else check_int(owner, "burst", burst, minimum=1)
        )
        self._clock = clock
        self._start_fresh()
        track(self)
        register(self, "rate_limit")  # PoolMonitor exports it

    def _start_fresh(self) -> None:
        # _lock guards: _tokens, _stamp, _latest, _pending, every Reservation._cancelled of this
        # limit, and the counters
        self._lock = Lock()
        self._tokens = float(self.burst)  # invariant: _tokens <= burst
        self._stamp = (self._clock or seam.now)()  # clock time _tokens was last brought up to date
        self._latest: Reservation | None = None  # the last reservation, while it can be undone
        self._pending: deque[Reservation] = deque()  # not yet ready, in ready_at order
        self._granted = 0
        self._timed_out = 0
        self._cancelled = 0

    def _after_fork(self) -> None:
        self._start_fresh()  # a full bucket: the parent's reservations are not ours

    def _refill(self, now: float) -> None:
        # caller holds _lock; a clock that went backwards adds nothing
        if now > self._stamp:
            gained = (now - self._stamp) * self.per_second
            self._tokens = min(float(self.burst), self._tokens + gained)
            self._stamp = now

    def _ready_time(self, now: float) -> float:
        # caller holds _lock and has refilled: when one more token is available
        if self._tokens >= 1.0:
            return now
        return now + (1.0 - self._tokens) / self.per_second

    def reserve(self, *, deadline: float | None = None) -> Reservation | None:
        """Take the next token; never blocks.

        Args:
            deadline: Clock time by which the token must be usable (the run's deadline).
                None: any wait is accepted.

        Returns:
            A ``Reservation`` (start the attempt at its ``ready_at``), or None when the next
            token comes after ``deadline`` (no token is taken; counted in ``timed_out``).
        """
        with self._lock:
            now = (self._clock or seam.now)()
            self._refill(now)
            ready = self._ready_time(now)
            if deadline is not None and ready > deadline:
                self._timed_out += 1
                return None
            return self._take(now, ready)

    def try_take(self) -> bool:
        """Take a token only when one is available now (nothing is counted as timed out)."""
        return self.reserve_now() is not None

    def reserve_now(self) -> Reservation | None:
        """A reservation ready now, or None when no token is available now (nothing is counted
        as timed out). Unlike ``try_take`` its token can be given back with ``cancel()``: the
        engine takes one for a hedge before it knows the hedge will start."""
        with self._lock:
            now = (self._clock or seam.now)()
            self._refill(now)
            if self._tokens < 1.0:
                return None
            return self._take(now, now)

    def next_token_at(self) -> float:
        """Clock time at which a reservation made now would be ready (now when a token is free)."""
        with self._lock:
            now = (self._clock or seam.now)()
            self._refill(now)
            return self._ready_time(now)

    def _take(self, now: float, ready: float) -> Reservation:
        # caller holds _lock
        self._tokens -= 1.0
        self._granted += 1
        reservation = Reservation(self, ready)
        self._latest = reservation
        pending = self._pending
        while pending and (pending[0].ready_at <= now or pending[0]._cancelled):
            pending.popleft()
        if ready > now:
            pending.append(reservation)
        return reservation

    def _cancel(self, reservation: Reservation) -> bool:
        with self._lock:
            if reservation._cancelled:
                return False
            reservation._cancelled = True
            self._cancelled += 1
            if reservation is not self._latest:
                return False
            # undo it exactly: refills are linear and capped, so adding the token back now
            # gives the same bucket as never having taken it
            self._latest = None
            self._refill((self._clock or seam.now)())
            self._tokens = min(float(self.burst), self._tokens + 1.0)
            return True

    def metrics(self) -> RateLimitMetrics:
        """A consistent snapshot of the limit's figures."""
        with self._lock:
            now = (self._clock or seam.now)()
            self._refill(now)
            waiting = sum(1 for r in self._pending if r.ready_at > now and not r._cancelled)
            return RateLimitMetrics(
                name=self.name, per_second=self.per_second, burst=self.burst,
                tokens=self._tokens, granted=self._granted, waiting=waiting,
                timed_out=self._timed_out, cancelled=self._cancelled,
            )

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("rate_limit", self.name),)
        return [
            Sample("rate_limit_tokens", "gauge",
                   "Tokens in the bucket (negative: owed to waiting reservations).", lab,
                   m.tokens),
            Sample("rate_limit_waiting", "gauge", "Reservations waiting for their time.", lab,
                   m.waiting),
            Sample("rate_limit_granted_total", "counter", "Reservations made.", lab, m.granted),
            Sample("rate_limit_timed_out_total", "counter",
                   "Reservations refused: no token before the deadline.", lab, m.timed_out),
            Sample("rate_limit_cancelled_total", "counter", "Reservations cancelled.", lab,
                   m.cancelled),
        ]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """This limit's metrics in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "per_second": self.per_second,
            "burst": self.burst,
            "clock": self._clock,
        }))

    def __repr__(self) -> str:
        return f"RateLimit({self.name!r}, per_second={self.per_second:g}, burst={self.burst})"
