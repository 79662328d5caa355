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
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from threading import Lock
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

from pydantic import BaseModel, ConfigDict

from taskflow.exposition import Sample
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
    max_concurrent: int
    max_waiting: int | None
    in_use: int  # slots held now, abandoned attempts included
    waiting: int  # live waiters in the queue
    rejected: int  # waiters refused with BulkheadFullError (total)
    abandoned: int  # slots held now by attempts whose run gave up on them
    granted: int  # slots given out (total)
    cancelled: int  # waiters that left the queue without a slot: cancel() or deadline (total)


class Permit:
    """One slot of a bulkhead. ``release()`` it when the attempt returns, exactly once in effect.

    Usable as a context manager for synchronous callers.
    """

    __slots__ = ("_abandoned", "_bulkhead", "_epoch", "_released")

    def __init__(self, bulkhead: Bulkhead) -> None:
        self._bulkhead = bulkhead
        self._epoch = bulkhead._epoch
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
        clock: Monotonic clock in seconds (tests pass a fake one).

    Raises:
        FlowDefinitionError: An option is invalid (the message names the bulkhead).
    """

    def __init__(
        self,
        name: str,
        *,
        max_concurrent: int,
        max_waiting: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = check_name("bulkhead", name)
        owner = f"bulkhead {name!r}"
        self.max_concurrent = check_int(owner, "max_concurrent", max_concurrent, minimum=1)
        self.max_waiting = (
            None if max_waiting is None
            else check_int(owner, "max_waiting", max_waiting, minimum=0)
        )
        self._clock = clock
        self._epoch = 0  # +1 at each fork: permits and tickets of an older epoch are ignored
        self._start_fresh()
        track(self)
        register(self, "bulkhead")  # PoolMonitor exports it

    def _start_fresh(self) -> None:
        # _lock guards: max_concurrent (after __init__), _in_use, _queue, _waiting, _dead, every Ticket.state/permit and
        # Permit._released/_abandoned of this bulkhead, and the counters below
        self._lock = Lock()
        # invariant: 0 <= _in_use <= max_concurrent, except after a shrink, until enough
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
            if self._in_use < self.max_concurrent and self._waiting == 0:
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
            if self._in_use < self.max_concurrent and self._waiting == 0:
                self._in_use += 1
                self._granted += 1
                return Permit(self)
            if self.max_waiting is None or self._waiting < self.max_waiting:
                ticket = Ticket(self, on_grant, deadline)
                self._queue.append(ticket)
                self._waiting += 1
                return ticket
            self._rejected += 1
        raise BulkheadFullError(self.name, self.max_concurrent, self.max_waiting)

    # -- called through Permit and Ticket --------------------------------------------------

    def _release(self, permit: Permit) -> bool:
        with self._lock:
            if permit._released or permit._epoch != self._epoch:
                return False
            permit._released = True
            if permit._abandoned:
                self._abandoned -= 1
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
        while queue and self._in_use < self.max_concurrent:
            ticket = queue.popleft()
            if ticket.state != WAITING:
                self._dead -= 1
                continue
            self._waiting -= 1
            if ticket.deadline is not None:
                if now is None:
                    now = self._clock()
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
        again only once fewer than the new ``max_concurrent`` are in use.

        Raises:
            FlowDefinitionError: ``max_concurrent`` is not an integer >= 1.
        """
        value = check_int(f"bulkhead {self.name!r}", "max_concurrent", max_concurrent, minimum=1)
        with self._lock:
            self.max_concurrent = value
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
    def waiting(self) -> int:
        return self._waiting

    def metrics(self) -> BulkheadMetrics:
        """A consistent snapshot of the bulkhead's figures."""
        with self._lock:
            return BulkheadMetrics(
                name=self.name, max_concurrent=self.max_concurrent, max_waiting=self.max_waiting,
                in_use=self._in_use, waiting=self._waiting, rejected=self._rejected,
                abandoned=self._abandoned, granted=self._granted, cancelled=self._cancelled,
            )

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("bulkhead", self.name),)
        return [
            Sample("bulkhead_in_use", "gauge", "Slots held by running attempts.", lab, m.in_use),
            Sample("bulkhead_max_concurrent", "gauge", "Slots of the bulkhead.", lab,
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
        ]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """This bulkhead's metrics in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "max_concurrent": self.max_concurrent,
            "max_waiting": self.max_waiting,
            "clock": self._clock,
        }))

    def __repr__(self) -> str:
        return (
            f"Bulkhead({self.name!r}, max_concurrent={self.max_concurrent}, "
            f"max_waiting={self.max_waiting}, in_use={self._in_use}, waiting={self._waiting})"
        )

