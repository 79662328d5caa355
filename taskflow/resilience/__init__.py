"""Request-path resilience: process-wide primitives shared by every run that uses them.

Each object is thread-safe (one lock, no user code or callbacks under it), never blocks, and
offers callback-style calls the engine makes from its scheduler, so a node that waits for a
slot, a token or another run's call holds no worker. See ``docs/resilience-design.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskflow.resilience.batch import Batch, BatchKeys, BatchMetrics
    from taskflow.resilience.breaker import BreakerMetrics, BreakerState, CircuitBreaker
    from taskflow.resilience.bulkhead import Bulkhead, BulkheadMetrics
    from taskflow.resilience.errors import (
        BulkheadFullError,
        CircuitOpenError,
        FallbackError,
        UnhashableKeyError,
    )
    from taskflow.resilience.export import render_prometheus
    from taskflow.resilience.fallback import Fallback
    from taskflow.resilience.hedge import Hedge
    from taskflow.resilience.latency import LatencyRegistry, LatencyTracker, latencies
    from taskflow.resilience.ratelimit import RateLimit, RateLimitMetrics
    from taskflow.resilience.retrybudget import RetryBudget, RetryBudgetMetrics
    from taskflow.resilience.shedding import set_load_shedding
    from taskflow.resilience.shedding_metrics import LoadSheddingMetrics
    from taskflow.resilience.singleflight import SingleFlight, SingleFlightMetrics

# name -> the module that defines it, imported on first access: importing one primitive (or the
# engine's light modules, ``shedding``, ``dispatch``) loads only what that module needs, and the
# ones whose metrics are pydantic models stay off ``import taskflow``'s path
_WHERE = {
    "Batch": "batch", "BatchKeys": "batch", "BatchMetrics": "batch",
    "BreakerMetrics": "breaker", "BreakerState": "breaker", "CircuitBreaker": "breaker",
    "Bulkhead": "bulkhead", "BulkheadMetrics": "bulkhead",
    "BulkheadFullError": "errors", "CircuitOpenError": "errors", "FallbackError": "errors",
    "UnhashableKeyError": "errors",
    "render_prometheus": "export",
    "Fallback": "fallback",
    "Hedge": "hedge",
    "LatencyRegistry": "latency", "LatencyTracker": "latency", "latencies": "latency",
    "RateLimit": "ratelimit", "RateLimitMetrics": "ratelimit",
    "RetryBudget": "retrybudget", "RetryBudgetMetrics": "retrybudget",
    "set_load_shedding": "shedding",
    "LoadSheddingMetrics": "shedding_metrics",
    "SingleFlight": "singleflight", "SingleFlightMetrics": "singleflight",
}


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


# what a user writes (the primitives and their options), reads (their metrics and states) or
# catches (their errors); what the engine alone calls (permits, tickets, reservations, a hedge's
# race, a shared call's members, a batch's calls and seats, retry tokens, dispatch weights)
# stays in the modules that define it
__all__ = [
    "Batch",
    "BatchKeys",
    "BatchMetrics",
    "BreakerMetrics",
    "BreakerState",
    "Bulkhead",
    "BulkheadFullError",
    "BulkheadMetrics",
    "CircuitBreaker",
    "CircuitOpenError",
    "Fallback",
    "FallbackError",
    "Hedge",
    "LatencyRegistry",
    "LatencyTracker",
    "LoadSheddingMetrics",
    "RateLimit",
    "RateLimitMetrics",
    "RetryBudget",
    "RetryBudgetMetrics",
    "SingleFlight",
    "SingleFlightMetrics",
    "UnhashableKeyError",
    "latencies",
    "render_prometheus",
    "set_load_shedding",
]
