"""``GradientLimit``: a concurrency limit that follows a backend's latency (gradient style).

The arithmetic behind ``Bulkhead(..., adaptive=True)``, kept apart so it can be tested with
exact inputs. It follows the gradient algorithm of Netflix's concurrency-limits (Gradient2),
which Envoy's adaptive concurrency filter also uses:

- every attempt that returns gives one latency sample; ``short`` is a fast moving average of
  the samples (the latency now), ``long`` a slow one (the latency the backend normally has;
  a plain mean while it has fewer samples than its window);
- ``gradient = clamp(tolerance * long / short, 0.5, 1.0)``: 1.0 while the latency now is within
  ``tolerance`` of the usual one, down to 0.5 when it has grown much more;
- ``new = limit * gradient + sqrt(limit)``: at gradient 1 the limit grows by a queue's worth
  (the probe for more capacity), below it shrinks; the step is smoothed
  (``limit += smoothing * (new - limit)``) and kept between ``minimum`` and ``maximum``;
- while fewer than half the slots are used the limit is not moved (the backend is not what
  limits the callers, so their latency says nothing about its capacity);
- when the latency falls to under half the usual one, ``long`` decays towards it (5% a sample),
  so a recovered backend gets its limit back instead of being held to its slow past.

Not thread-safe on its own: the bulkhead calls ``update`` under its lock.
"""

from __future__ import annotations

import math

__all__ = ["GradientLimit"]


class GradientLimit:
    """A limit in ``[minimum, maximum]`` moved by each latency sample (see the module)."""

    __slots__ = ("_limit", "long", "long_window", "maximum", "minimum", "samples", "short",
                 "short_window", "smoothing", "tolerance")

    def __init__(self, initial: int, minimum: int, maximum: int, *, short_window: int = 10,
                 long_window: int = 600, tolerance: float = 1.5,
                 smoothing: float = 0.2) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum}, {maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self._limit = float(min(max(initial, minimum), maximum))
        self.short_window = short_window
        self.long_window = long_window
        self.tolerance = tolerance
        self.smoothing = smoothing
        self.short: float | None = None  # seconds; None until the first sample
        self.long: float | None = None
        self.samples = 0

    @property
    def limit(self) -> int:
        """The current limit, a whole number of slots."""
        return int(round(self._limit))

    def set_bounds(self, minimum: int, maximum: int) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum}, {maximum}")
        self.minimum, self.maximum = minimum, maximum
        self._limit = min(max(self._limit, minimum), maximum)

    def update(self, latency: float, inflight: int) -> int:
        """Take one sample (``latency`` seconds, ``inflight`` attempts running when it ended)
        and return the new limit."""
        if not latency >= 0 or math.isinf(latency):  # NaN, negative or infinite: no sample
            return self.limit
        self.samples += 1
        short, long = self.short, self.long
        if short is None or long is None:
            short = long = latency
        else:
            short += (latency - short) * (2.0 / (self.short_window + 1))
            # a plain mean while warming up, then an exponential average over the window
            long += (latency - long) * max(2.0 / (self.long_window + 1), 1.0 / self.samples)
        if short > 0 and long / short > 2.0:
            long *= 0.95
        self.short, self.long = short, long
        limit = self._limit
        if inflight < limit / 2:
            return self.limit
        gradient = 1.0 if short <= 0 else max(0.5, min(1.0, self.tolerance * long / short))
        target = limit * gradient + math.sqrt(limit)
        limit += (target - limit) * self.smoothing
        self._limit = min(max(limit, float(self.minimum)), float(self.maximum))
        return self.limit

    def __repr__(self) -> str:
        return (f"GradientLimit(limit={self.limit}, bounds=[{self.minimum}, {self.maximum}], "
                f"short={self.short}, long={self.long})")
