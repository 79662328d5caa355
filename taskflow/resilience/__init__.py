"""Request-path resilience: process-wide primitives shared by every run that uses them.

Each object is thread-safe (one lock, no user code or callbacks under it), never blocks, and
offers callback-style calls the engine makes from its scheduler, so a node that waits for a
slot, a token or another run's call holds no worker. See ``docs/resilience-design.md``.
"""

from __future__ import annotations

from taskflow.exposition import Sample
from taskflow.resilience.breaker import BreakerMetrics, BreakerPermit, BreakerState, CircuitBreaker
from taskflow.resilience.bulkhead import Bulkhead, BulkheadMetrics, Permit, Ticket
from taskflow.resilience.dispatch import ReadyQueue, fits_budget, node_weights, remaining_paths
from taskflow.resilience.errors import (
    BulkheadFullError,
    CircuitOpenError,
    FallbackError,
    UnhashableKeyError,
)
from taskflow.resilience.export import render_prometheus
from taskflow.resilience.fallback import Fallback
from taskflow.resilience.hedge import Hedge, HedgeRace, Verdict
from taskflow.resilience.latency import LatencyRegistry, LatencyTracker, latencies
from taskflow.resilience.ratelimit import RateLimit, RateLimitMetrics, Reservation
from taskflow.resilience.singleflight import (
    Member,
    Outcome,
    SharedCall,
    SingleFlight,
    SingleFlightMetrics,
    check_share_key,
    share_key_of,
)

__all__ = [
    "BreakerMetrics",
    "BreakerPermit",
    "BreakerState",
    "Bulkhead",
    "BulkheadFullError",
    "BulkheadMetrics",
    "CircuitBreaker",
    "CircuitOpenError",
    "Fallback",
    "FallbackError",
    "Hedge",
    "HedgeRace",
    "LatencyRegistry",
    "LatencyTracker",
    "Member",
    "Outcome",
    "Permit",
    "RateLimit",
    "RateLimitMetrics",
    "ReadyQueue",
    "Reservation",
    "Sample",
    "SharedCall",
    "SingleFlight",
    "SingleFlightMetrics",
    "Ticket",
    "UnhashableKeyError",
    "Verdict",
    "check_share_key",
    "fits_budget",
    "latencies",
    "node_weights",
    "remaining_paths",
    "render_prometheus",
    "share_key_of",
]
