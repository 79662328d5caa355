"""``RetryBudget``: the retries of every node that shares it stay a fraction of the calls.

A per-node ``retries=3`` multiplies the load on a backend that is down by four. A budget
(Finagle's ``RetryBudget``) caps the retries of everyone who shares it instead: each first
attempt *deposits*, each retry *withdraws*, and a retry is granted only if, counting it, over
the last ``window`` seconds

    retries <= ratio * first attempts + min_per_second * window

(``min_per_second * window`` is a reserve, so a node that calls rarely can still retry). A
retry past the budget is not made: the node ends with its last error. Over a longer time the
retries so stay about ``ratio`` x the first attempts plus ``min_per_second`` a second.

How the engine uses it (all calls are non-blocking)::

    budget.deposit()                 # a first attempt starts
    token = budget.withdraw()        # before scheduling a retry: None -> refused, no retry
    token.use()                      # the retry's attempt starts
    token.give_back()                # or the node ended before it (its run closed, a timeout)

Deposits and withdrawals are counted in ``SLICES`` slices of the window, so they expire about
``window`` seconds after they were made (a slice late at most). A token given back takes its
withdrawal out of the slice it was counted in, if that slice is still in the window.

The lock guards the slices, the counters and every token's state; nothing is called under it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from threading import Lock

from pydantic import BaseModel, ConfigDict

from taskflow import clock as seam
from taskflow.errors import FlowDefinitionError
from taskflow.exposition import Sample
from taskflow.resilience.export import register, render_prometheus
from taskflow.resilience.options import check_name, check_seconds, rebuild
from taskflow.resilience.process import track

__all__ = ["SLICES", "RetryBudget", "RetryBudgetMetrics", "RetryToken"]

# how many slices a window is counted in
SLICES = 10

_HELD, _USED, _RETURNED = 0, 1, 2


class RetryBudgetMetrics(BaseModel):
    """A snapshot of one retry budget."""

    model_config = ConfigDict(frozen=True)

    name: str
    ratio: float
    min_per_second: float
    window: float
    attempts: int  # first attempts deposited (total)
    retries: int  # retries granted (total; given-back ones included)
    refused: int  # retries refused: the budget was spent (total)
    returned: int  # granted retries given back unmade: their node ended first (total)
    balance: float  # retries the budget would grant now


class RetryToken:
    """One granted retry: ``use()`` when its attempt starts, or ``give_back()`` if it never
    does. Either happens once in effect."""

    __slots__ = ("_budget", "_epoch", "_slice", "_state")

    def __init__(self, budget: RetryBudget, slice_no: int) -> None:
        self._budget = budget
        self._epoch = budget._epoch
        self._slice = slice_no  # the absolute slice its withdrawal was counted in
        self._state = _HELD  # guarded by the budget's lock

    def use(self) -> None:
        """The retry's attempt started: the withdrawal stands."""
        self._budget._use(self)

    def give_back(self) -> bool:
        """The retry will not be made: its withdrawal is undone (if still in the window).

        Returns:
            True the first time, for a token not used yet.
        """
        return self._budget._give_back(self)

    def __repr__(self) -> str:
        state = ("held", "used", "returned")[self._state]
        return f"<RetryToken of retry budget {self._budget.name!r} {state}>"


class RetryBudget:
    """A process-wide budget of retries, shared by every node that names it, across runs.

    Args:
        name: Names the budget in errors, reports and metrics.
        ratio: Retries allowed per first attempt (>= 0; 0.2: one retry per five calls).
        min_per_second: Retries allowed per second whatever the traffic (>= 0): a reserve of
            ``min_per_second * window`` for nodes that call rarely.
        window: Seconds deposits and withdrawals count for (> 0).
        clock: Monotonic clock in seconds. Default ``None``: taskflow's clock
            (``taskflow.clock.now``), read at each call, so a fake clock installed later
            is followed. An explicit one (a test's) stays this object's.

    Raises:
        FlowDefinitionError: An option is invalid, or both ``ratio`` and ``min_per_second`` are
            0 (no retry could ever be made); the message names the budget.
    """

    def __init__(self, name: str, *, ratio: float, min_per_second: float,
                 window: float = 10.0, clock: Callable[[], float] | None = None) -> None:
        self.name = check_name("retry budget", name)
        owner = f"retry budget {name!r}"
        self.ratio = _check_rate(owner, "ratio", ratio)
        self.min_per_second = _check_rate(owner, "min_per_second", min_per_second)
        if self.ratio == 0.0 and self.min_per_second == 0.0:
            raise FlowDefinitionError(
                f"{owner}: ratio and min_per_second are both 0, so no retry could ever be "
                "made; give one of them a value > 0 (or use retries=0)")
        self.window = check_seconds(owner, "window", window, allow_zero=False)
        self._slice_s = self.window / SLICES
        self._clock = clock
        self._epoch = 0  # +1 at each fork: tokens of an older epoch are ignored
        self._start_fresh()
        track(self)
        register(self, "retry_budget")  # PoolMonitor exports it

    def _start_fresh(self) -> None:
        # _lock guards the slices, the counters and every token's _state
        self._lock = Lock()
        # deposits and withdrawals per slice of the window; slot n % SLICES holds absolute
        # slice n, for the last SLICES slices up to _now_slice
        self._dep = [0] * SLICES
        self._wd = [0] * SLICES
        self._now_slice = self._slice_of((self._clock or seam.now)())
        self._attempts = 0
        self._retries = 0
        self._refused = 0
        self._returned = 0

    def _after_fork(self) -> None:
        self._epoch += 1
        self._start_fresh()  # the parent's calls were not this process's

    def _slice_of(self, now: float) -> int:
        return math.floor(now / self._slice_s)

    def _advance_locked(self) -> int:
        """Under the lock: expire the slices that left the window; the current slice."""
        n = self._slice_of((self._clock or seam.now)())
        old = self._now_slice
        if n > old:
            for s in range(old + 1, min(n, old + SLICES) + 1):
                self._dep[s % SLICES] = 0
                self._wd[s % SLICES] = 0
            self._now_slice = n
        return self._now_slice

    def _balance_locked(self) -> float:
        return (self.min_per_second * self.window + self.ratio * sum(self._dep)
                - sum(self._wd))

    # -- the engine's side ----------------------------------------------------------------------

    def deposit(self) -> None:
        """A first attempt of a node that uses the budget starts."""
        with self._lock:
            n = self._advance_locked()
            self._dep[n % SLICES] += 1
            self._attempts += 1

    def withdraw(self) -> RetryToken | None:
        """A token for one retry, or None (counted as refused) when the budget is spent."""
        with self._lock:
            n = self._advance_locked()
            if self._balance_locked() < 1.0:
                self._refused += 1
                return None
            self._wd[n % SLICES] += 1
            self._retries += 1
            return RetryToken(self, n)

    def _use(self, token: RetryToken) -> None:
        with self._lock:
            if token._state == _HELD:
                token._state = _USED

    def _give_back(self, token: RetryToken) -> bool:
        with self._lock:
            if token._state != _HELD or token._epoch != self._epoch:
                return False
            token._state = _RETURNED
            self._returned += 1
            n = self._advance_locked()
            if n - token._slice < SLICES:  # its withdrawal still counts: undo it
                self._wd[token._slice % SLICES] -= 1
            return True

    # -- metrics ----------------------------------------------------------------------------------

    def metrics(self) -> RetryBudgetMetrics:
        """A consistent snapshot of the budget's figures."""
        with self._lock:
            self._advance_locked()
            return RetryBudgetMetrics(
                name=self.name, ratio=self.ratio, min_per_second=self.min_per_second,
                window=self.window, attempts=self._attempts, retries=self._retries,
                refused=self._refused, returned=self._returned,
                balance=max(0.0, self._balance_locked()),
            )

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("retry_budget", self.name),)
        return [
            Sample("retry_budget_attempts_total", "counter",
                   "First attempts deposited in the retry budget.", lab, m.attempts),
            Sample("retry_budget_retries_total", "counter", "Retries the budget granted.", lab,
                   m.retries),
            Sample("retry_budget_refused_total", "counter",
                   "Retries refused: the budget was spent.", lab, m.refused),
            Sample("retry_budget_returned_total", "counter",
                   "Granted retries given back unmade (their node ended first).", lab,
                   m.returned),
            Sample("retry_budget_balance", "gauge", "Retries the budget would grant now.", lab,
                   m.balance),
        ]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """This budget's metrics in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "ratio": self.ratio, "min_per_second": self.min_per_second,
            "window": self.window, "clock": self._clock,
        }))

    def __repr__(self) -> str:
        return (f"RetryBudget({self.name!r}, ratio={self.ratio:g}, "
                f"min_per_second={self.min_per_second:g}, window={self.window:g})")


def _check_rate(owner: str, option: str, value: object) -> float:
    """A finite number >= 0."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value >= 0)
    if not ok:
        raise FlowDefinitionError(f"{owner}: {option} must be a finite number >= 0, "
                                  f"got {value!r}")
    return float(value)  # type: ignore[arg-type]
