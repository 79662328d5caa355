"""``CircuitBreaker``: stop calling a backend that keeps failing, then probe it.

States and moves (the only place they change is ``_move``)::

    CLOSED    --(over the last `window` finished calls, at least `min_calls`,
                 failures / calls >= failure_ratio)-->                      OPEN
    OPEN      --(open_for seconds passed; checked lazily by allow/state)--> HALF_OPEN
    HALF_OPEN --(all `half_open_calls` trial calls succeeded)-->            CLOSED
    HALF_OPEN --(a trial call failed)-->                                    OPEN

How the engine uses it (non-blocking, any thread)::

    permit = breaker.allow()            # raises CircuitOpenError: the node ends at once
    ...                                 # the attempt runs
    permit = breaker.renew(permit)      # as the attempt starts (it may have waited for a slot
                                        # or a token): the same permit while the breaker has not
                                        # moved since, else a fresh one (or CircuitOpenError)
    breaker.record(permit, success)     # EXCEPTION/TIMEOUT -> False, SUCCESS -> True
    breaker.discard(permit)             # the call did not happen or says nothing about the
                                        # backend (cancelled, never started): frees a trial slot

A permit counts once: recording it again (a node timed out, then its abandoned attempt
returned) is ignored. A permit issued before a transition is ignored after it, so results of
calls started while the backend was bad do not close a breaker that was reopened meanwhile.
Every transition is logged with loguru (outside the lock) and counted in ``metrics()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import Enum
from threading import Lock

from pydantic import BaseModel, ConfigDict

from taskflow import clock as seam
from taskflow.errors import FlowDefinitionError
from taskflow.exposition import Sample
from taskflow.logs import logger
from taskflow.resilience.errors import CircuitOpenError
from taskflow.resilience.export import register, render_prometheus
from taskflow.resilience.options import check_int, check_name, check_ratio, check_seconds, rebuild
from taskflow.resilience.process import track

__all__ = ["BreakerMetrics", "BreakerPermit", "BreakerState", "CircuitBreaker"]


class BreakerState(str, Enum):
    """A circuit breaker's state; ``str()`` is the value (``"open"``), as metrics and JSON
    write it."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return str(self.value)


_CLOSED, _OPEN, _HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
_MOVES = {(_CLOSED, _OPEN), (_OPEN, _HALF_OPEN), (_HALF_OPEN, _CLOSED), (_HALF_OPEN, _OPEN)}


class BreakerMetrics(BaseModel):
    """A snapshot of one circuit breaker."""

    model_config = ConfigDict(frozen=True)

    name: str
    state: BreakerState
    window_calls: int  # finished calls in the sliding window (CLOSED only)
    window_failures: int
    successes: int  # recorded successes (total)
    failures: int  # recorded failures (total)
    rejected: int  # calls refused with CircuitOpenError (total)
    ignored: int  # results of stale or already-recorded permits (total)
    transitions: dict[str, int]  # "closed->open" etc. -> count
    retry_in: float  # seconds until OPEN lets a trial through (0 unless OPEN)
    trials_running: int = 0  # HALF_OPEN: trial permits out, neither recorded nor discarded


class BreakerPermit:
    """Leave to make one call; give it back with ``record`` or ``discard``."""

    __slots__ = ("done", "generation", "trial")

    def __init__(self, generation: int, trial: bool) -> None:
        self.generation = generation  # the breaker's generation when issued
        self.trial = trial  # a HALF_OPEN trial call
        self.done = False  # guarded by the breaker's lock

    def __repr__(self) -> str:
        kind = "trial" if self.trial else "call"
        return f"<BreakerPermit {kind} gen={self.generation}{' done' if self.done else ''}>"


class CircuitBreaker:
    """Fail calls at once while a backend is failing; let trial calls probe its recovery.

    Args:
        name: Names the breaker in errors, logs and metrics.
        failure_ratio: Share of failed calls in the window that opens the breaker, in (0, 1].
        window: Number of most recent finished calls considered (>= 1).
        min_calls: Calls the window must hold before it can open (1 <= min_calls <= window).
        open_for: Seconds the breaker stays OPEN before a trial (> 0).
        half_open_calls: Trial calls let through in HALF_OPEN (>= 1); all must succeed to close.
        clock: Monotonic clock in seconds. Default ``None``: taskflow's clock
            (``taskflow.clock.now``), read at each call, so a fake clock installed later
            is followed. An explicit one (a test's) stays this object's.

    Raises:
        FlowDefinitionError: An option is invalid (the message names the breaker).
    """

    def __init__(
        self,
        name: str,
        *,
        failure_ratio: float = 0.5,
        window: int = 20,
        min_calls: int = 10,
        open_for: float = 5.0,
        half_open_calls: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = check_name("circuit breaker", name)
        owner = f"circuit breaker {name!r}"
        self.failure_ratio = check_ratio(owner, "failure_ratio", failure_ratio)
        self.window = check_int(owner, "window", window, minimum=1)
        self.min_calls = check_int(owner, "min_calls", min_calls, minimum=1)
        if self.min_calls > self.window:
            raise FlowDefinitionError(
                f"{owner}: min_calls ({min_calls}) must not exceed window ({window})"
            )
        self.open_for = check_seconds(owner, "open_for", open_for, allow_zero=False)
        self.half_open_calls = check_int(owner, "half_open_calls", half_open_calls, minimum=1)
        self._clock = clock
        self._start_fresh()
        track(self)
        register(self, "breaker")  # PoolMonitor exports it

    def _start_fresh(self) -> None:
        # _lock guards every field below and BreakerPermit.done of this breaker's permits
        self._lock = Lock()
        self._state = _CLOSED
        # +1 at every transition (and fork); permits of older generations are stale
        self._generation: int = getattr(self, "_generation", -1) + 1
        self._calls: deque[bool] = deque(maxlen=self.window)  # CLOSED: True = failure
        self._failures_in_window = 0
        self._opened_at = 0.0  # clock time of the last move to OPEN
        self._trials_out = 0  # HALF_OPEN: trial permits issued and not discarded
        self._trial_successes = 0
        self._successes = 0
        self._failures = 0
        self._rejected = 0
        self._ignored = 0
        self._transitions: dict[str, int] = {}
        self._log: list[tuple[BreakerState, BreakerState, str]] = []  # moves to log, drained
        # by the caller after the lock is released

    def _after_fork(self) -> None:
        self._start_fresh()  # closed: the child has made no calls yet

    # -- the one place state changes ------------------------------------------------------

    def _move(self, to: BreakerState, why: str) -> None:
        # caller holds _lock
        frm = self._state
        if (frm, to) not in _MOVES:
            raise RuntimeError(f"circuit breaker {self.name!r}: illegal move {frm.value} -> "
                               f"{to.value} (a taskflow bug)")
        self._state = to
        self._generation += 1
        key = f"{frm.value}->{to.value}"
        self._transitions[key] = self._transitions.get(key, 0) + 1
        self._calls.clear()
        self._failures_in_window = 0
        self._trials_out = 0
        self._trial_successes = 0
        if to is _OPEN:
            self._opened_at = (self._clock or seam.now)()
        self._log.append((frm, to, why))

    def _tick(self) -> None:
        # caller holds _lock: OPEN becomes HALF_OPEN once open_for has passed
        if self._state is _OPEN and (self._clock or seam.now)() - self._opened_at >= self.open_for:
            self._move(_HALF_OPEN, f"{self.open_for:g}s passed")

    def _flush_log(self) -> None:
        # called without the lock: loguru sinks are user code
        if not self._log:
            return
        with self._lock:
            moves, self._log = self._log, []
        for frm, to, why in moves:
            level = "WARNING" if to is _OPEN else "INFO"
            logger.bind(breaker=self.name).log(
                level, "circuit breaker {!r}: {} -> {} ({})", self.name, frm.value, to.value, why
            )

    # -- the engine's calls ----------------------------------------------------------------

    def allow(self) -> BreakerPermit:
        """Leave to make one call.

        Raises:
            CircuitOpenError: The breaker is OPEN, or HALF_OPEN with all trial calls taken.
        """
        with self._lock:
            got = self._issue()
        self._flush_log()
        if isinstance(got, CircuitOpenError):
            raise got
        return got

    def renew(self, permit: BreakerPermit) -> BreakerPermit:
        """Check ``permit`` again just before its call starts (the engine does so after the
        node waited for a bulkhead slot or a rate-limit token).

        Returns:
            ``permit`` itself while the breaker has not moved since it was issued; else (it
            moved, or the permit was recorded or discarded meanwhile) a fresh permit, the old
            one counting for nothing.

        Raises:
            CircuitOpenError: The permit is stale and the breaker refuses a new call now.
        """
        with self._lock:
            if not permit.done and permit.generation == self._generation:
                return permit  # (an OPEN generation issues no permit: nothing to tick)
            permit.done = True  # stale: the move since already reset the trials it counted
            got = self._issue()
        self._flush_log()
        if isinstance(got, CircuitOpenError):
            raise got
        return got

    def _issue(self) -> BreakerPermit | CircuitOpenError:
        # caller holds _lock: a permit for one call now, or the error refusing it
        self._tick()
        if self._state is _CLOSED:
            return BreakerPermit(self._generation, trial=False)
        if self._state is _HALF_OPEN and self._trials_out < self.half_open_calls:
            self._trials_out += 1
            return BreakerPermit(self._generation, trial=True)
        self._rejected += 1
        retry_in = (
            max(0.0, self._opened_at + self.open_for - (self._clock or seam.now)())
            if self._state is _OPEN else 0.0
        )
        return CircuitOpenError(self.name, self._state.value, retry_in)

    def record(self, permit: BreakerPermit, success: bool) -> bool:
        """Count the outcome of the call ``permit`` allowed.

        Args:
            permit: From ``allow()``.
            success: False for a call that ended ``EXCEPTION`` or ``TIMEOUT``.

        Returns:
            True when the outcome was counted; False when ignored (already recorded or
            discarded, or issued before the last transition).
        """
        with self._lock:
            counted = self._record(permit, success)
        self._flush_log()
        return counted

    def _record(self, permit: BreakerPermit, success: bool) -> bool:
        # caller holds _lock
        if permit.done or permit.generation != self._generation:
            permit.done = True
            self._ignored += 1
            return False
        permit.done = True
        if success:
            self._successes += 1
        else:
            self._failures += 1
        if self._state is _CLOSED:
            if len(self._calls) == self.window and self._calls[0]:
                self._failures_in_window -= 1
            self._calls.append(not success)
            self._failures_in_window += not success
            calls = len(self._calls)
            if (calls >= self.min_calls
                    and self._failures_in_window >= self.failure_ratio * calls - 1e-12):
                self._move(_OPEN, f"{self._failures_in_window} of the last {calls} calls failed")
        elif self._state is _HALF_OPEN:
            if not success:
                self._move(_OPEN, "a trial call failed")
            else:
                self._trial_successes += 1
                if self._trial_successes >= self.half_open_calls:
                    self._move(_CLOSED, f"{self._trial_successes} trial call(s) succeeded")
        # OPEN cannot be reached here: every permit of an OPEN generation is stale
        return True

    def discard(self, permit: BreakerPermit) -> None:
        """Return a permit whose call did not happen or says nothing about the backend."""
        with self._lock:
            if permit.done:
                return
            permit.done = True
            if (permit.trial and self._state is _HALF_OPEN
                    and permit.generation == self._generation):
                self._trials_out -= 1

    # -- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state (an OPEN breaker past ``open_for`` reads HALF_OPEN)."""
        with self._lock:
            self._tick()
            state = self._state
        self._flush_log()
        return state

    def metrics(self) -> BreakerMetrics:
        """A consistent snapshot of the breaker's figures."""
        with self._lock:
            self._tick()
            retry_in = (
                max(0.0, self._opened_at + self.open_for - (self._clock or seam.now)())
                if self._state is _OPEN else 0.0
            )
            snap = BreakerMetrics(
                name=self.name, state=self._state, window_calls=len(self._calls),
                window_failures=self._failures_in_window, successes=self._successes,
                failures=self._failures, rejected=self._rejected, ignored=self._ignored,
                transitions=dict(self._transitions), retry_in=retry_in,
                trials_running=(self._trials_out - self._trial_successes
                                if self._state is _HALF_OPEN else 0),
            )
        self._flush_log()
        return snap

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("breaker", self.name),)
        out = [
            Sample("breaker_state", "gauge", "1 for the breaker's current state, else 0.",
                   (*lab, ("state", s.value)), float(m.state is s))
            for s in BreakerState
        ]
        out += [
            Sample("breaker_calls_total", "counter", "Calls recorded, by outcome.",
                   (*lab, ("outcome", "success")), m.successes),
            Sample("breaker_calls_total", "counter", "Calls recorded, by outcome.",
                   (*lab, ("outcome", "failure")), m.failures),
            Sample("breaker_rejected_total", "counter", "Calls refused while open.", lab,
                   m.rejected),
        ]
        out += [
            Sample("breaker_transitions_total", "counter", "State transitions.",
                   (*lab, ("from", frm.value), ("to", to.value)),
                   m.transitions.get(f"{frm.value}->{to.value}", 0))
            for frm, to in sorted(_MOVES)
        ]
        return out

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """This breaker's metrics in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "failure_ratio": self.failure_ratio,
            "window": self.window,
            "min_calls": self.min_calls,
            "open_for": self.open_for,
            "half_open_calls": self.half_open_calls,
            "clock": self._clock,
        }))

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.name!r}, state={self._state.value})"

