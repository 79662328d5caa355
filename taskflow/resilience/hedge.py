"""``Hedge``: a duplicate attempt when the first one is slow ("The Tail at Scale").

``Hedge`` is the user's option; ``HedgeRace`` is the per-node-run bookkeeping the engine keeps
while attempts race. How the engine uses them::

    race = HedgeRace(hedge.max_extra)
    race.launch()                          # -> 0, the first attempt; submit it
    delay = hedge.delay(latencies.get(key))
    if delay is not None: timer.schedule(start + delay, maybe_hedge)
    # maybe_hedge (timer thread): n = race.launch(); if n is not None: submit attempt n and
    # schedule the next check after `delay` again
    # each attempt's completion (any thread): verdict = race.settle(n, ok)
    #   WON: the node succeeds with this value; race.running() are the losers: set their
    #        cancelled flag so they see ctx.cancelled; their results are dropped
    #   LOST: the race was already decided: drop this outcome
    #   PENDING: this attempt failed but another is still running: drop its error
    #   FAILED: every launched attempt failed: the node fails with this error (retries apply)

Hedging duplicates work, so it is only for idempotent nodes (the engine refuses it otherwise,
and passes ``ctx.operation_id`` as the idempotency key).
"""

from __future__ import annotations

import re
from enum import Enum
from threading import Lock

from taskflow.errors import FlowDefinitionError
from taskflow.resilience.latency import LatencyTracker
from taskflow.resilience.options import check_int, check_seconds

__all__ = ["Hedge", "HedgeRace", "Verdict"]

_PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


class Hedge:
    """When and how often to start a duplicate attempt.

    With a percentile (``after="p95"``) the delay follows the node's recent durations in this
    process, and is useful from the first calls:

    * before any duration is known, ``initial`` seconds (None: the first call is not hedged);
    * while fewer than ``min_samples`` are known, the slowest one so far (few durations say
      little about a percentile; the slowest is the cautious guess);
    * then the NN-th percentile;
    * never more than ``median_cap`` times the recent median: when more than 5 % of calls are
      slow the 95th percentile is itself a slow call, and a hedge that waits that long rescues
      nothing.

    Args:
        after: Seconds an attempt may run before a duplicate starts, or ``"pNN"`` (e.g.
            ``"p95"``): the node's recent NN-th percentile duration in this process.
        max_extra: Duplicate attempts at most (>= 1).
        min_samples: With a percentile, durations needed before the percentile is used (>= 1);
            until then the slowest duration so far.
        initial: With a percentile, seconds to wait before a duplicate while no duration is
            known (> 0), or None (default): no hedge until one is.
        median_cap: With a percentile, the delay is at most this many times the recent median
            (>= 1), or None: no cap.

    Raises:
        FlowDefinitionError: An option is invalid.
    """

    __slots__ = ("after", "initial", "max_extra", "median_cap", "min_samples", "quantile")

    def __init__(self, after: float | str = "p95", max_extra: int = 1, *,
                 min_samples: int = 20, initial: float | None = None,
                 median_cap: float | None = 3.0) -> None:
        owner = "hedge"
        if isinstance(after, str):
            match = _PERCENTILE.match(after)
            pct = float(match.group(1)) if match else -1.0
            if not 0.0 < pct < 100.0:
                raise FlowDefinitionError(
                    f"{owner}: after must be seconds > 0 or a percentile like 'p95', got {after!r}"
                )
            self.quantile: float | None = pct / 100.0
            self.after: float | str = after
        else:
            self.after = check_seconds(owner, "after", after, allow_zero=False)
            self.quantile = None
        self.max_extra = check_int(owner, "max_extra", max_extra, minimum=1)
        self.min_samples = check_int(owner, "min_samples", min_samples, minimum=1)
        self.initial = (None if initial is None
                        else check_seconds(owner, "initial", initial, allow_zero=False))
        if median_cap is not None and (isinstance(median_cap, bool)
                                       or not isinstance(median_cap, (int, float))
                                       or not median_cap >= 1.0 or median_cap == float("inf")):
            raise FlowDefinitionError(f"{owner}: median_cap must be a number >= 1 or None, got "
                                      f"{median_cap!r}")
        self.median_cap = None if median_cap is None else float(median_cap)

    def delay(self, tracker: LatencyTracker | None) -> float | None:
        """Seconds after an attempt starts to start a duplicate; None: do not hedge (yet)."""
        if self.quantile is None:
            assert isinstance(self.after, float)
            return self.after
        count = 0 if tracker is None else tracker.count
        if tracker is None or count == 0:
            return self.initial
        wait = tracker.quantile(self.quantile if count >= self.min_samples else 1.0)
        if wait is None:
            return self.initial
        if self.median_cap is not None:
            median = tracker.median()
            if median is not None:
                wait = min(wait, self.median_cap * median)
        return wait

    def __repr__(self) -> str:
        if self.quantile is None:
            return f"Hedge(after={self.after!r}, max_extra={self.max_extra})"
        return (f"Hedge(after={self.after!r}, max_extra={self.max_extra}, min_samples="
                f"{self.min_samples}, initial={self.initial!r}, median_cap={self.median_cap!r})")


class Verdict(str, Enum):
    WON = "won"
    LOST = "lost"
    PENDING = "pending"
    FAILED = "failed"


class HedgeRace:
    """The attempts of one node in one run racing each other; the first success wins."""

    __slots__ = ("_failed", "_launched", "_lock", "_running", "_winner", "max_extra")

    def __init__(self, max_extra: int) -> None:
        self.max_extra = check_int("hedge race", "max_extra", max_extra, minimum=0)
        self._lock = Lock()  # guards _launched, _running, _failed, _winner
        self._launched = 0
        self._running: set[int] = set()
        self._failed = False  # every launched attempt failed: the race is over
        self._winner: int | None = None

    def launch(self) -> int | None:
        """The number of a new attempt (0 first), or None when the race is over or all
        ``1 + max_extra`` attempts were launched."""
        with self._lock:
            if self._winner is not None or self._failed or self._launched > self.max_extra:
                return None
            n = self._launched
            self._launched += 1
            self._running.add(n)
            return n

    def settle(self, attempt: int, ok: bool) -> Verdict:
        """Report that ``attempt`` finished (``ok``: with success); says what to do with it."""
        with self._lock:
            if attempt not in self._running:
                raise RuntimeError(f"hedge race: attempt {attempt} is not running (a taskflow bug)")
            self._running.discard(attempt)
            if self._winner is not None or self._failed:
                return Verdict.LOST
            if ok:
                self._winner = attempt
                return Verdict.WON
            if self._running:
                return Verdict.PENDING
            self._failed = True
            return Verdict.FAILED

    def running(self) -> list[int]:
        """Attempts launched and not settled (after a win: the losers to cancel)."""
        with self._lock:
            return sorted(self._running)

    @property
    def hedges(self) -> int:
        """Extra attempts launched (``WorkResult.hedges``)."""
        return max(0, self._launched - 1)

    @property
    def winner(self) -> int | None:
        return self._winner
