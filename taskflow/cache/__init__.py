"""Caches for ``share_key`` nodes: ``cache=LruCache()`` (the default) or ``RedisCache(url)``.

See ``taskflow.resilience.cache`` for the protocol a custom cache implements, the codecs and the
freshness rules (``cache_ttl``, ``stale_for``, ``stale_if_error``).
"""

from __future__ import annotations

from taskflow.resilience.cache import (
    DEFAULT_REFRESH_TIMEOUT,
    Cache,
    CacheBase,
    CacheMetrics,
    Codec,
    Entry,
    JsonCodec,
    LruCache,
    PickleCodec,
    RedisCache,
    freshness,
)

__all__ = [
    "DEFAULT_REFRESH_TIMEOUT",
    "Cache",
    "CacheBase",
    "CacheMetrics",
    "Codec",
    "Entry",
    "JsonCodec",
    "LruCache",
    "PickleCodec",
    "RedisCache",
    "freshness",
]
