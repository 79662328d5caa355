"""``NodePolicy``: one node's resilience options, checked once when the node is defined.

A node built with any of ``bulkhead``, ``breaker``, ``rate_limit``, ``fallback``, ``hedge``,
``share_key``/``cache_ttl``, ``priority``, ``min_budget``, ``batch``, ``retry_budget`` or
``detach`` carries a
``NodePolicy``; the
compiled plan holds it per node (``Plan.policy``) and the engine (``taskflow.engine.guards``)
reads it. A node without any of them carries None and the engine does nothing more for it.

Every check raises ``FlowDefinitionError`` naming the node, before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

from taskflow.errors import FlowDefinitionError
from taskflow.resilience.batch import Batch
from taskflow.resilience.breaker import CircuitBreaker
from taskflow.resilience.bulkhead import Bulkhead
from taskflow.resilience.cache import Cache
from taskflow.resilience.fallback import Fallback
from taskflow.resilience.hedge import Hedge
from taskflow.resilience.options import check_int, check_seconds
from taskflow.resilience.ratelimit import RateLimit
from taskflow.resilience.retrybudget import RetryBudget
from taskflow.resilience.singleflight import SingleFlight, check_share_key

__all__ = ["NodePolicy"]


def _check_type(node: str, option: str, value: object, kind: type) -> None:
    if value is not None and not isinstance(value, kind):
        raise FlowDefinitionError(
            f"node {node!r}: {option} must be a taskflow.{kind.__name__} or None, "
            f"got {type(value).__name__}"
        )


class NodePolicy:
    """The checked resilience options of one node (immutable; shared by its per-run copies).

    ``flight`` is the node's own ``SingleFlight`` (with ``share_key``): one per definition, so
    every run of the node shares it.
    """

    __slots__ = ("batch", "breaker", "bulkhead", "detach", "fallback", "flight", "hedge",
                 "idempotent",
                 "min_budget", "name", "priority", "rate_limit", "retry_budget", "share_key")

    def __init__(self, name: str, *, fanout: bool, bulkhead: Bulkhead | None,
                 breaker: CircuitBreaker | None, rate_limit: RateLimit | None,
                 fallback: Fallback | None, hedge: Hedge | None, idempotent: bool,
                 share_key: Callable[[Any, Any], Hashable] | None, cache_ttl: float | None,
                 cache_size: int, priority: float, min_budget: float | None,
                 batch: Batch | None = None, retry_budget: RetryBudget | None = None,
                 cache: Cache | None = None, stale_for: float | None = None,
                 stale_if_error: float | None = None, detach: bool = False) -> None:
        owner = f"node {name!r}"
        _check_type(name, "bulkhead", bulkhead, Bulkhead)
        _check_type(name, "breaker", breaker, CircuitBreaker)
        _check_type(name, "rate_limit", rate_limit, RateLimit)
        _check_type(name, "hedge", hedge, Hedge)
        _check_type(name, "batch", batch, Batch)
        _check_type(name, "retry_budget", retry_budget, RetryBudget)
        if not isinstance(idempotent, bool):
            raise FlowDefinitionError(f"{owner}: idempotent must be True or False, "
                                      f"got {idempotent!r}")
        if hedge is not None and not idempotent:
            raise FlowDefinitionError(
                f"{owner}: hedge runs duplicate attempts, so the node must be declared "
                "idempotent=True (pass ctx.operation_id to the backend as an idempotency key)"
            )
        if fanout and any(x is not None for x in (bulkhead, breaker, rate_limit, hedge,
                                                  share_key, retry_budget)):
            raise FlowDefinitionError(
                f"{owner}: a fan-out node takes fallback, priority, min_budget and batch (for "
                "its items) only; put bulkhead, breaker, rate_limit, hedge, share_key and "
                "retry_budget on its items' backend calls"
            )
        if batch is not None and not fanout:
            _check_batched(owner, bulkhead=bulkhead, breaker=breaker, rate_limit=rate_limit,
                           hedge=hedge, share_key=share_key, retry_budget=retry_budget)
        if not isinstance(detach, bool):
            raise FlowDefinitionError(f"{owner}: detach must be True or False, got {detach!r}")
        if detach:
            _check_detached(owner, bulkhead=bulkhead, breaker=breaker, rate_limit=rate_limit,
                            fallback=fallback, hedge=hedge, share_key=share_key,
                            min_budget=min_budget, batch=batch, retry_budget=retry_budget)
        if share_key is not None:
            check_share_key(share_key, node=name)
        elif cache_ttl is not None:
            raise FlowDefinitionError(f"{owner}: cache_ttl needs a share_key (the cache's key)")
        if cache_ttl is None and any(x is not None for x in (cache, stale_for, stale_if_error)):
            raise FlowDefinitionError(
                f"{owner}: cache, stale_for and stale_if_error need share_key and cache_ttl")
        if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not (
                math.isfinite(priority)):
            raise FlowDefinitionError(f"{owner}: priority must be a finite number, "
                                      f"got {priority!r}")
        self.name = name
        self.bulkhead = bulkhead
        self.breaker = breaker
        self.rate_limit = rate_limit
        self.fallback = fallback
        self.hedge = hedge
        self.idempotent = idempotent
        self.share_key = share_key
        self.flight = (None if share_key is None else
                       SingleFlight(name, cache_ttl=cache_ttl,
                                    cache_size=check_int(owner, "cache_size", cache_size,
                                                         minimum=1),
                                    cache=cache, stale_for=stale_for,
                                    stale_if_error=stale_if_error))
        self.priority = float(priority)
        self.min_budget = (None if min_budget is None
                           else check_seconds(owner, "min_budget", min_budget, allow_zero=True))
        self.batch = batch
        self.retry_budget = retry_budget
        self.detach = detach

    @property
    def gates(self) -> bool:
        """Whether an attempt must pass anything before it starts."""
        return (self.min_budget is not None or self.flight is not None or self.breaker is not None
                or self.rate_limit is not None or self.bulkhead is not None
                or self.batch is not None)

    def __repr__(self) -> str:
        parts = [f"{k}={getattr(self, k)!r}" for k in ("bulkhead", "breaker", "rate_limit",
                                                       "fallback", "hedge", "share_key",
                                                       "batch", "retry_budget")
                 if getattr(self, k) is not None]
        if self.detach:
            parts.append("detach=True")
        return f"<NodePolicy {self.name!r} {' '.join(parts)}>"


def _check_batched(owner: str, **options: object) -> None:
    """A batched node makes no attempt of its own: the options that act on one are refused."""
    given = [k for k, v in options.items() if v is not None]
    if given:
        raise FlowDefinitionError(
            f"{owner}: batch answers the node with a call shared by many nodes, so it makes "
            f"no attempt of its own for {', '.join(given)} to act on; keep batch with "
            "fallback, timeout, priority and min_budget, and put the rest in the batch's fn"
        )


def _check_detached(owner: str, **options: object) -> None:
    """A detached node runs outside its run (after ``start`` may have returned): the options
    that act within a run, or on a value its sons would read, are refused."""
    given = [k for k, v in options.items() if v is not None]
    if given:
        raise FlowDefinitionError(
            f"{owner}: detach=True runs the node outside its run (the run does not wait for "
            f"it and nothing reads its value), so {', '.join(given)} cannot act on it; keep "
            "detach with timeout, retries, retry_backoff and priority, or drop detach"
        )
