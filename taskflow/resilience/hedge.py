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

    Args:
        after: Seconds an attempt may run before a duplicate starts, or ``"pNN"`` (e.g.
            ``"p95"``): the node's recent NN-th percentile duration in this process.
        max_extra: Duplicate attempts at most (>= 1).
        min_samples: With a percentile, durations needed before hedging starts (>= 1); until
            then ``delay`` is None (no hedge).

    Raises:
        FlowDefinitionError: An option is invalid.
    """

    __slots__ = ("after", "max_extra", "min_samples", "quantile")

    def __init__(self, after: float | str = "p95", max_extra: int = 1, *,
                 min_samples: int = 20) -> None:
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

    def delay(self, tracker: LatencyTracker | None) -> float | None:
        """Seconds after an attempt starts to start a duplicate; None: do not hedge (yet)."""
        if self.quantile is None:
            assert isinstance(self.after, float)
            return self.after
        if tracker is None or tracker.count < self.min_samples:
            return None
        return tracker.quantile(self.quantile)

    def __repr__(self) -> str:
        return f"Hedge(after={self.after!r}, max_extra={self.max_extra})"


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
