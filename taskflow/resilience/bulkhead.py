"""``Bulkhead``: a process-wide cap on concurrent attempts; its FIFO of waiters holds no thread.

How the engine uses it (all calls are non-blocking)::

    got = bulkhead.acquire(on_grant, deadline=run_deadline)   # raises BulkheadFullError
    if isinstance(got, Permit):      # a slot was free: start the attempt now
        ...
    else:                            # a Ticket: the node waits, holding no worker
        timer.schedule(run_deadline, got.cancel)   # cancel() -> True: never granted, TIMEOUT

    # later, when an attempt returns (even after its run gave up on it):
    permit.release()                 # hands the slot to the oldest live waiter

``on_grant(permit)`` runs on the thread that released the slot (a worker, or an executor's
completion-callback thread), after the bulkhead's lock is released; it must be quick (submit the
attempt or post to the run's inbox). A waiter whose deadline has passed is skipped at handoff, so
a slot never goes to a run that has already given up; its ``cancel()`` still returns True.

An attempt abandoned by its run (budget or node timeout) keeps its slot until it returns, because
a Python thread cannot be stopped: ``permit.abandon()`` counts it in ``metrics().abandoned``.

With ``adaptive=True`` the number of slots (``limit``) is not fixed: every permit released gives
one latency sample (from grant to release) to a ``GradientLimit``
(``taskflow.resilience.adaptive``), which moves the limit between ``min_concurrent`` and
``max_concurrent`` as the backend's latency moves: down when it slows (fewer attempts pile on a
struggling backend), up again when it recovers. The update runs under the lock (arithmetic only);
a limit that grew hands its new slots to waiters as a release does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from threading import Lock
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

from pydantic import BaseModel, ConfigDict

from taskflow import clock as seam
from taskflow.errors import FlowDefinitionError
from taskflow.exposition import Sample
from taskflow.resilience.adaptive import GradientLimit
from taskflow.resilience.callbacks import run_callbacks
from taskflow.resilience.errors import BulkheadFullError
from taskflow.resilience.export import register, render_prometheus
from taskflow.resilience.options import check_int, check_name, rebuild
from taskflow.resilience.process import track

__all__ = ["Bulkhead", "BulkheadMetrics", "Permit", "Ticket"]

# Ticket states; a ticket leaves WAITING exactly once
WAITING, GRANTED, CANCELLED, EXPIRED = "waiting", "granted", "cancelled", "expired"


class BulkheadMetrics(BaseModel):
    """A snapshot of one bulkhead."""

    model_config = ConfigDict(frozen=True)

    name: str
    max_concurrent: int  # the slots, or with adaptive=True the upper bound of the limit
    max_waiting: int | None
    in_use: int  # slots held now, abandoned attempts included
    waiting: int  # live waiters in the queue
    rejected: int  # waiters refused with BulkheadFullError (total)
    abandoned: int  # slots held now by attempts whose run gave up on them
    granted: int  # slots given out (total)
    cancelled: int  # waiters that left the queue without a slot: cancel() or deadline (total)
    limit: int = 0  # slots now: max_concurrent, or the adaptive limit
    adaptive: bool = False
    min_concurrent: int | None = None  # with adaptive=True, the lower bound of the limit
    latency_short_s: float | None = None  # with adaptive=True: the recent latency (moving average)
    latency_long_s: float | None = None  # with adaptive=True: the usual latency (slow average)


class Permit:
    """One slot of a bulkhead. ``release()`` it when the attempt returns, exactly once in effect.

    Usable as a context manager for synchronous callers.
    """

    __slots__ = ("_abandoned", "_bulkhead", "_epoch", "_released", "_t0")

    def __init__(self, bulkhead: Bulkhead) -> None:
        self._bulkhead = bulkhead
        self._epoch = bulkhead._epoch
        # when the slot was given, for an adaptive bulkhead's latency sample (else unused)
        self._t0 = (bulkhead._clock or seam.now)() if bulkhead._gradient is not None else 0.0
        self._released = False  # guarded by the bulkhead's lock
        self._abandoned = False  # guarded by the bulkhead's lock

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> bool:
        """Free the slot, handing it to the oldest live waiter (whose callback runs here).

        Returns:
            True the first time; False (and nothing happens) when already released, so a
            timeout path and a late completion may both call it.
        """
        return self._bulkhead._release(self)

    def abandon(self) -> None:
        """Mark the slot as held by an attempt its run gave up on; it stays held until released."""
        self._bulkhead._abandon(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "abandoned" if self._abandoned else "held"
        return f"<Permit of bulkhead {self._bulkhead.name!r} {state}>"


class Ticket:
    """A place in a bulkhead's queue. It ends exactly once: granted, cancelled or expired."""

    __slots__ = ("_bulkhead", "_epoch", "_on_grant", "deadline", "permit", "state")

    def __init__(
        self, bulkhead: Bulkhead, on_grant: Callable[[Permit], Any], deadline: float | None
    ) -> None:
        self._bulkhead = bulkhead
        self._epoch = bulkhead._epoch
        self._on_grant: Callable[[Permit], Any] | None = on_grant
        self.deadline = deadline
        self.state = WAITING  # guarded by the bulkhead's lock
        self.permit: Permit | None = None  # set when granted

    def done(self) -> bool:
        """True once the ticket left the queue (granted, cancelled or expired)."""
        return self.state != WAITING

    def cancel(self) -> bool:
        """Leave the queue (the engine's timer calls it at the run's deadline).

        Returns:
            True when the ticket will never be granted (it was waiting, or its deadline had
            already passed at a handoff); False when it was granted: the permit belongs to the
            ``on_grant`` callback, which must release it.
        """
        return self._bulkhead._cancel(self)

    def __repr__(self) -> str:
        return f"<Ticket of bulkhead {self._bulkhead.name!r} {self.state}>"


class Bulkhead:
    """At most ``max_concurrent`` attempts at once in the process, across every run.

    Args:
        name: Names the bulkhead in errors, logs and metrics.
        max_concurrent: Slots (>= 1).
        max_waiting: Waiters allowed in the queue (>= 0); beyond it ``acquire`` raises
            ``BulkheadFullError``. None: no limit (each waiter is still bounded by its deadline).
        clock: Monotonic clock in seconds. Default ``None``: taskflow's clock
            (``taskflow.clock.now``), read at each call, so a fake clock installed later
            is followed. An explicit one (a test's) stays this object's.
        adaptive: The number of slots follows the backend's latency (see the module), between
            ``min_concurrent`` and ``max_concurrent``; it starts at ``max_concurrent``.
        min_concurrent: With ``adaptive=True``, the fewest slots the limit goes down to
            (default 1).

    Raises:
        FlowDefinitionError: An option is invalid (the message names the bulkhead).
    """

    def __init__(
        self,
        name: str,
        *,
        max_concurrent: int,
        max_waiting: int | None = None,
        clock: Callable[[], float] | None = None,
        adaptive: bool = False,
        min_concurrent: int | None = None,
    ) -> None:
        self.name = check_name("bulkhead", name)
        owner = f"bulkhead {name!r}"
        self.max_concurrent = check_int(owner, "max_concurrent", max_concurrent, minimum=1)
        self.max_waiting = (
            None if max_waiting is None
            else check_int(owner, "max_waiting", max_waiting, minimum=0)
        )
        if not isinstance(adaptive, bool):
            raise FlowDefinitionError(f"{owner}: adaptive must be True or False, got {adaptive!r}")
        self.adaptive = adaptive
        if min_concurrent is not None and not adaptive:
            raise FlowDefinitionError(
                f"{owner}: min_concurrent is the lower bound of an adaptive limit; pass "
                "adaptive=True with it, or drop it")
        self.min_concurrent = (None if not adaptive else 1 if min_concurrent is None
                               else check_int(owner, "min_concurrent", min_concurrent, minimum=1))
        if self.min_concurrent is not None and self.min_concurrent > self.max_concurrent:
            raise FlowDefinitionError(
                f"{owner}: min_concurrent ({self.min_concurrent}) must be <= max_concurrent "
                f"({self.max_concurrent})")
        self._clock = clock
        self._epoch = 0  # +1 at each fork: permits and tickets of an older epoch are ignored
        self._start_fresh()
        track(self)
        register(self, "bulkhead")  # PoolMonitor exports it

    def _start_fresh(self) -> None:
        # _lock guards: max_concurrent (after __init__), _in_use, _queue, _waiting, _dead, every Ticket.state/permit and
        # Permit._released/_abandoned of this bulkhead, and the counters below
        self._lock = Lock()
        # the slots now: max_concurrent, or what the gradient says (also guarded by _lock)
        self._limit = self.max_concurrent
        self._gradient = (None if not self.adaptive else GradientLimit(
            self.max_concurrent, self.min_concurrent or 1, self.max_concurrent))
        # invariant: 0 <= _in_use <= _limit, except after a shrink, until enough
        # attempts return
        self._in_use = 0
        self._queue: deque[Ticket] = deque()  # FIFO; may hold tickets that already left
        self._waiting = 0  # tickets in _queue still WAITING
        self._dead = 0  # tickets in _queue that left (removed lazily)
        self._rejected = 0
        self._abandoned = 0
        self._granted = 0
        self._cancelled = 0

    def _after_fork(self) -> None:
        self._epoch += 1
        self._start_fresh()  # the parent's slots and waiters do not exist in this process

    # -- acquiring -------------------------------------------------------------------------

    def try_acquire(self) -> Permit | None:
        """A permit when a slot is free and nobody is waiting (no barging), else None."""
        with self._lock:
            if self._in_use < self._limit and self._waiting == 0:
                self._in_use += 1
                self._granted += 1
                return Permit(self)
        return None

    def acquire(
        self, on_grant: Callable[[Permit], Any], *, deadline: float | None = None
    ) -> Permit | Ticket:
        """Take a slot now, or join the queue without blocking.

        Args:
            on_grant: Called with the permit when a queued ticket gets a slot; it runs on the
                releasing thread, outside the lock, and must be quick. Not called when a
                permit is returned directly.
            deadline: Clock time after which the waiter no longer wants a slot (its run's
                deadline); a handoff skips it. None: waits until cancelled.

        Returns:
            A ``Permit`` when a slot was free (start now), else a waiting ``Ticket``.

        Raises:
            BulkheadFullError: ``max_waiting`` waiters are already queued.
        """
        with self._lock:
            if self._in_use < self._limit and self._waiting == 0:
                self._in_use += 1
                self._granted += 1
                return Permit(self)
            if self.max_waiting is None or self._waiting < self.max_waiting:
                ticket = Ticket(self, on_grant, deadline)
                self._queue.append(ticket)
                self._waiting += 1
                return ticket
            self._rejected += 1
            limit = self._limit
        raise BulkheadFullError(self.name, limit, self.max_waiting)

    # -- called through Permit and Ticket --------------------------------------------------

    def _release(self, permit: Permit) -> bool:
        with self._lock:
            if permit._released or permit._epoch != self._epoch:
                return False
            permit._released = True
            if permit._abandoned:
                self._abandoned -= 1
            gradient = self._gradient
            if gradient is not None:
                self._limit = gradient.update((self._clock or seam.now)() - permit._t0, self._in_use)
            self._in_use -= 1
            handoffs = self._fill()
        if handoffs:
            run_callbacks([(self._grant, (ticket,)) for ticket in handoffs])
        return True

    def _fill(self) -> list[Ticket]:
        # caller holds _lock: give free slots to the oldest live waiters, skipping the expired
        granted: list[Ticket] = []
        now: float | None = None
        queue = self._queue
        while queue and self._in_use < self._limit:
            ticket = queue.popleft()
            if ticket.state != WAITING:
                self._dead -= 1
                continue
            self._waiting -= 1
            if ticket.deadline is not None:
                if now is None:
                    now = (self._clock or seam.now)()
                if now >= ticket.deadline:
                    ticket.state = EXPIRED
                    self._cancelled += 1
                    continue
            ticket.state = GRANTED
            ticket.permit = Permit(self)
            self._in_use += 1
            self._granted += 1
            granted.append(ticket)
        return granted

    def set_max_concurrent(self, max_concurrent: int) -> None:
        """Change the number of slots at run time (as ``ThreadPool.set_core_size`` does).

        Growing hands the new slots to waiters at once (their callbacks run on this thread).
        Shrinking takes no slot back: attempts running keep theirs, and waiters get slots
        again only once fewer than the new ``max_concurrent`` are in use. On an adaptive
        bulkhead it moves the upper bound: the limit is brought within it, and goes on
        following the latency below it.

        Raises:
            FlowDefinitionError: ``max_concurrent`` is not an integer >= 1 (or, adaptive,
                below ``min_concurrent``).
        """
        owner = f"bulkhead {self.name!r}"
        value = check_int(owner, "max_concurrent", max_concurrent, minimum=1)
        if self.min_concurrent is not None and value < self.min_concurrent:
            raise FlowDefinitionError(f"{owner}: max_concurrent ({value}) must be >= "
                                      f"min_concurrent ({self.min_concurrent})")
        with self._lock:
            self.max_concurrent = value
            gradient = self._gradient
            if gradient is None:
                self._limit = value
            else:
                gradient.set_bounds(gradient.minimum, value)
                self._limit = gradient.limit
            handoffs = self._fill()
        if handoffs:
            run_callbacks([(self._grant, (ticket,)) for ticket in handoffs])

    def _grant(self, ticket: Ticket) -> None:
        on_grant, permit = ticket._on_grant, ticket.permit
        ticket._on_grant = None  # drop the reference: the ticket may outlive the run
        assert on_grant is not None and permit is not None
        try:
            on_grant(permit)
        except Exception:
            # the waiter cannot use the slot; give it to the next one instead of leaking it
            permit.release()
            raise

    def _cancel(self, ticket: Ticket) -> bool:
        with self._lock:
            if ticket.state == WAITING and ticket._epoch == self._epoch:
                ticket.state = CANCELLED
                ticket._on_grant = None
                self._waiting -= 1
                self._cancelled += 1
                self._dead += 1
                if self._dead > 64 and self._dead > 2 * self._waiting:
                    # most queued tickets left: drop them so the queue is as long as the wait
                    self._queue = deque(t for t in self._queue if t.state == WAITING)
                    self._dead = 0
            return ticket.state != GRANTED

    def _abandon(self, permit: Permit) -> None:
        with self._lock:
            if not permit._released and not permit._abandoned and permit._epoch == self._epoch:
                permit._abandoned = True
                self._abandoned += 1

    # -- metrics ---------------------------------------------------------------------------

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def limit(self) -> int:
        """The slots now: ``max_concurrent``, or the adaptive limit."""
        return self._limit

    def load(self) -> tuple[float, bool]:
        """How loaded the bulkhead is, read without the lock (a gauge, for load shedding):
        slots in use plus waiters over the limit, and whether a new waiter would be refused."""
        in_use, waiting, limit = self._in_use, self._waiting, self._limit
        full = (self.max_waiting is not None and waiting >= self.max_waiting
                and in_use >= limit)
        return (in_use + waiting) / limit, full

    @property
    def waiting(self) -> int:
        return self._waiting

    def metrics(self) -> BulkheadMetrics:
        """A consistent snapshot of the bulkhead's figures."""
        with self._lock:
            gradient = self._gradient
            return BulkheadMetrics(
                name=self.name, max_concurrent=self.max_concurrent, max_waiting=self.max_waiting,
                in_use=self._in_use, waiting=self._waiting, rejected=self._rejected,
                abandoned=self._abandoned, granted=self._granted, cancelled=self._cancelled,
                limit=self._limit, adaptive=self.adaptive, min_concurrent=self.min_concurrent,
                latency_short_s=None if gradient is None else gradient.short,
                latency_long_s=None if gradient is None else gradient.long,
            )

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("bulkhead", self.name),)
        samples = [
            Sample("bulkhead_in_use", "gauge", "Slots held by running attempts.", lab, m.in_use),
            Sample("bulkhead_max_concurrent", "gauge",
                   "Slots of the bulkhead (adaptive: the upper bound of its limit).", lab,
                   m.max_concurrent),
            Sample("bulkhead_waiting", "gauge", "Nodes waiting for a slot (no worker held).",
                   lab, m.waiting),
            Sample("bulkhead_abandoned", "gauge",
                   "Slots held by attempts whose run gave up on them.", lab, m.abandoned),
            Sample("bulkhead_rejected_total", "counter", "Waiters refused (queue full).", lab,
                   m.rejected),
            Sample("bulkhead_granted_total", "counter", "Slots given out.", lab, m.granted),
            Sample("bulkhead_cancelled_total", "counter",
                   "Waiters that left the queue without a slot.", lab, m.cancelled),
            Sample("bulkhead_limit", "gauge",
                   "Slots now (max_concurrent, or the adaptive limit).", lab, m.limit),
        ]
        if m.adaptive:
            samples.append(Sample("bulkhead_min_concurrent", "gauge",
                                  "Lower bound of the adaptive limit.", lab, m.min_concurrent or 1))
            for family, value, what in (
                    ("bulkhead_latency_short_seconds", m.latency_short_s, "Recent latency"),
                    ("bulkhead_latency_long_seconds", m.latency_long_s, "Usual latency")):
                if value is not None:  # no sample yet: no series
                    samples.append(Sample(family, "gauge", f"{what} of the bulkhead's attempts "
                                          "(moving average).", lab, value))
        return samples

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """This bulkhead's metrics in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "max_concurrent": self.max_concurrent,
            "max_waiting": self.max_waiting,
            "clock": self._clock,
            "adaptive": self.adaptive,
            "min_concurrent": self.min_concurrent,
        }))

    def __repr__(self) -> str:
        adaptive = f" adaptive=True, limit={self._limit}," if self.adaptive else ""
        return (
            f"Bulkhead({self.name!r}, max_concurrent={self.max_concurrent}, "
            f"max_waiting={self.max_waiting},{adaptive} in_use={self._in_use}, "
            f"waiting={self._waiting})"
        )
