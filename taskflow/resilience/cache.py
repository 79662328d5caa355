"""Caches for ``share_key`` nodes: the protocol, the in-process LRU, Redis, codecs and freshness.

A node with ``share_key`` and ``cache_ttl`` keeps its successes in a *cache*: the in-process
``LruCache`` by default, or one the user passes with ``cache=``, such as ``RedisCache``, which
shares values across the processes of a server (8 gunicorn workers do one backend call, not 8).

The protocol (what a user implements to plug in memcached or anything else)::

    class Cache(Protocol):
        name: str
        def get(self, key: str) -> Entry | None       # the value and its age in seconds
        def set(self, key: str, value, *, keep: float) -> bool   # kept `keep` seconds at most
        def try_lock(self, key: str, seconds: float) -> bool     # best effort, one refresher
        def metrics(self) -> CacheMetrics
        def prometheus_samples(self) -> list[Sample]

``CacheBase`` implements the counting, the codec and the freshness rules on top of two raw
methods, ``_get_raw(key) -> (stored_at, payload) | None`` and ``_set_raw(key, stored_at,
payload, keep)``; a subclass provides those (and optionally ``try_lock``).

Freshness, with ``age`` the seconds since the value was stored (``freshness``):

* fresh while ``age < ttl``; the boundary itself is expired (``age == ttl`` is not fresh);
* stale-servable while ``age < ttl + stale_for``: served at once, one refresh runs detached;
* error-servable while ``age < ttl + stale_if_error``: served only when the call fails (the node
  ends ``DEGRADED``, the cause kept). With a fallback too, the stale value is tried first.

A cache that is down is a miss, logged, never a failed page: every backend error of ``get`` /
``set`` / ``try_lock`` is caught, counted in ``errors`` and logged at WARNING.

Values go through a codec: JSON by default. A shared cache is a trust boundary: anyone who can
write to the Redis can run code in every process that unpickles, so ``codec="pickle"`` is an
explicit opt-in. A value the codec cannot encode is logged and not cached (the page succeeds);
a stored value that cannot be decoded is a miss, logged.

Refreshes: ``begin_refresh(key)`` is the single flight of refreshes, exactly one per key at a
time in this process (a set guarded by the lock), and across processes best effort through
``try_lock`` (Redis: ``SET NX PX``). A refresh is detached work: it takes a slot of
``taskflow.resilience.detached`` (refused when full: counted, the stale value still served)
and holds it, with the key's single flight, until its work reports its end once
(``finish(value, error)``: the value is stored, a failure counted, never raised).
``refresh_with(key, runner)`` has a runner start that work: the engine's runs the node's task
as an attempt of its own (``taskflow.engine.detached.Refresh``: its deadline, ``ctx.on_cancel``,
the caller's contextvars, its outcome logged). ``refresh(key, call, executor=)`` is the
stand-alone form: ``call()`` on the executor, the cache giving up on it at its timeout.

Invariants: the lock of a cache guards its counters and its set of refreshing keys only (and
the LRU's dict); the backend, the codec and user code are never called under it.
"""

from __future__ import annotations

import json
import math
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from taskflow import clock as seam
from taskflow.errors import FlowDefinitionError
from taskflow.exposition import Sample
from taskflow.logs import logger
from taskflow.resilience import detached
from taskflow.resilience.export import render_prometheus
from taskflow.resilience.options import check_int, check_name

__all__ = [
    "DEFAULT_REFRESH_TIMEOUT",
    "EXPIRED",
    "FRESH",
    "STALE",
    "STALE_IF_ERROR",
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
    "key_text",
]

FRESH, STALE, STALE_IF_ERROR, EXPIRED = "fresh", "stale", "stale_if_error", "expired"
DEFAULT_REFRESH_TIMEOUT = 30.0  # a refresh's own timeout when the node has none


Finish = Callable[[Any, BaseException | None], None]
"""How a refresh's work reports its end: ``finish(value, error)``, once."""
Runner = Callable[[float, Finish], None]
"""What starts a refresh's work: ``runner(limit_seconds, finish)`` (``CacheBase.refresh_with``)."""


class Entry(NamedTuple):
    """A value read from a cache and its age in seconds."""

    value: Any
    age: float


def freshness(age: float, ttl: float, stale_for: float = 0.0,
              stale_if_error: float = 0.0) -> str:
    """``FRESH`` (age < ttl), ``STALE`` (< ttl + stale_for), ``STALE_IF_ERROR``
    (< ttl + stale_if_error: servable only when the call fails) or ``EXPIRED``."""
    if age < ttl:
        return FRESH
    if age < ttl + stale_for:
        return STALE
    if age < ttl + stale_if_error:
        return STALE_IF_ERROR
    return EXPIRED


def key_text(node: str, key: Hashable) -> str:
    """The text key a node's ``share_key`` value is stored under."""
    return f"{node}:{key!r}"


class Codec(Protocol):
    """Turns values into bytes and back."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """JSON (the default): only data travels, nothing stored can run code."""

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


class PickleCodec:
    """Pickle, opt-in only: whoever can write to the cache can run code where it is read."""

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


def _codec_of(owner: str, codec: object) -> Codec:
    if codec == "json":
        return JsonCodec()
    if codec == "pickle":
        return PickleCodec()
    if callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None)):
        return codec  # type: ignore[return-value]
    raise FlowDefinitionError(
        f"{owner}: codec must be 'json', 'pickle' or an object with encode/decode, "
        f"got {codec!r}")


class CacheMetrics(BaseModel):
    """A snapshot of one cache."""

    model_config = ConfigDict(frozen=True)

    name: str
    hits: int  # fresh values served
    misses: int  # nothing servable (absent, expired, undecodable, backend down)
    stale_served: int  # stale values served (while revalidating or on a failed call)
    refreshes: int  # refreshes started
    refused: int  # refreshes refused: no detached slot
    errors: int  # backend errors, values the codec could not encode or decode, failed refreshes


@runtime_checkable
class Cache(Protocol):
    """What ``cache=`` accepts."""

    name: str

    def get(self, key: str) -> Entry | None: ...

    def set(self, key: str, value: Any, *, keep: float) -> bool: ...

    def try_lock(self, key: str, seconds: float) -> bool: ...

    def metrics(self) -> CacheMetrics: ...

    def prometheus_samples(self) -> list[Sample]: ...


class CacheBase:
    """Counting, codec, refresh single flight; subclasses store ``(stored_at, payload)``."""

    def __init__(self, name: str, *, codec: object = "json",
                 clock: Callable[[], float] | None = None) -> None:
        self.name = check_name("cache", name)
        self.codec = _codec_of(f"cache {name!r}", codec)
        self._clock = clock
        self._lock = threading.Lock()  # guards the counters and _refreshing
        self._refreshing: set[str] = set()
        self._counts = dict.fromkeys(
            ("hits", "misses", "stale_served", "refreshes", "refused", "errors"), 0)

    @staticmethod
    def _seam() -> float:
        """The clock without one of its own (``clock=None``), read at each call: wall time,
        since ages are compared across processes."""
        return seam.wall()

    # -- what a subclass provides ------------------------------------------------------------
    def _get_raw(self, key: str) -> tuple[float, bytes] | None:
        raise NotImplementedError

    def _set_raw(self, key: str, stored_at: float, payload: bytes, keep: float) -> None:
        raise NotImplementedError

    def try_lock(self, key: str, seconds: float) -> bool:
        """Best effort across processes that this one refreshes ``key``; True here."""
        return True

    # -- the protocol --------------------------------------------------------------------------
    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._counts[what] += n

    def _error(self, what: str, key: str, exc: BaseException) -> None:
        self.count("errors")
        logger.warning("cache {!r}: {} {!r} failed ({}: {}); treated as a miss",
                       self.name, what, key, type(exc).__name__, exc)

    def get(self, key: str) -> Entry | None:
        """The entry, or None (absent, backend down, undecodable: logged). Counts nothing:
        ``lookup`` counts what it serves."""
        try:
            raw = self._get_raw(key)
        except Exception as exc:  # noqa: BLE001 - a cache that is down is a miss
            self._error("get", key, exc)
            return None
        if raw is None:
            return None
        stored_at, payload = raw
        try:
            value = self.codec.decode(payload)
        except Exception as exc:  # noqa: BLE001 - a corrupt value is a miss
            self._error("decode", key, exc)
            return None
        return Entry(value, max(0.0, (self._clock or self._seam)() - stored_at))

    def set(self, key: str, value: Any, *, keep: float) -> bool:
        """Store ``value`` for ``keep`` seconds at most; False (logged) when it could not be."""
        try:
            payload = self.codec.encode(value)
        except Exception as exc:  # noqa: BLE001 - not cached, the page still succeeds
            self._error("encode", key, exc)
            return False
        try:
            self._set_raw(key, (self._clock or self._seam)(), payload, keep)
        except Exception as exc:  # noqa: BLE001
            self._error("set", key, exc)
            return False
        return True

    def lookup(self, key: str, ttl: float, stale_for: float = 0.0,
               stale_if_error: float = 0.0) -> tuple[str, Any]:
        """``(state, value)`` of ``freshness``; counts a hit, a stale serve or a miss
        (``STALE_IF_ERROR`` counts nothing yet: ``served_on_error`` does when it is used)."""
        entry = self.get(key)
        state = EXPIRED if entry is None else freshness(entry.age, ttl, stale_for,
                                                        stale_if_error)
        self.count({FRESH: "hits", STALE: "stale_served", EXPIRED: "misses"}.get(state,
                                                                                  "misses"))
        return state, (None if entry is None else entry.value)

    def served_on_error(self) -> None:
        self.count("stale_served")

    # -- stale-while-revalidate ------------------------------------------------------------
    def begin_refresh(self, key: str, lock_seconds: float) -> bool:
        """True when this caller should refresh ``key``: no refresh of it runs in this process
        and (best effort) none in another. Pair with ``end_refresh(key)``."""
        with self._lock:
            if key in self._refreshing:
                return False
            self._refreshing.add(key)
        try:
            won = self.try_lock(key, lock_seconds)
        except Exception as exc:  # noqa: BLE001
            self._error("lock", key, exc)
            won = True  # the lock is best effort: this process still refreshes once
        if not won:
            self.end_refresh(key)
        return won

    def end_refresh(self, key: str) -> None:
        with self._lock:
            self._refreshing.discard(key)

    def refresh(self, key: str, call: Callable[[], Any], *, keep: float, executor: Executor,
                timeout: float | None = None) -> Future[bool] | None:
        """Run ``call`` detached to store a new value under ``key``: one per key at a time;
        None when another refresh runs or no detached slot was free (counted ``refused``).
        ``call`` runs on ``executor``, bounded by ``timeout`` (the cache stops waiting for it
        then: a thread cannot be cut); a failure is logged and counted. The returned future
        resolves True when a new value was stored and never raises for the caller. A node's
        refresh (``stale_for``) goes through ``refresh_with``: the engine runs it as an attempt.
        """

        def run(limit: float, finish: Finish) -> None:
            def work() -> None:
                try:
                    value, error = call(), None
                except BaseException as exc:  # noqa: BLE001 - never reaches the served page
                    value, error = None, exc
                timer.cancel()
                finish(value, error)

            timer = seam.call_later(limit, finish, None,
                                    TimeoutError(f"refresh timed out after {limit}s"))
            try:
                executor.submit(work)
            except BaseException:
                timer.cancel()
                raise

        return self._refresh(key, run, keep, timeout, logged=False)

    def refresh_with(self, key: str, runner: Runner, *, keep: float,
                     timeout: float | None = None) -> Future[bool] | None:
        """Refresh ``key`` with ``runner(limit, finish)``: it starts the work (bounded by
        ``limit`` seconds: ``timeout``, or ``DEFAULT_REFRESH_TIMEOUT`` without one) and calls
        ``finish(value, error)`` once when it ends, ``error`` set when it failed or timed out;
        the runner logs that outcome. One per key at a time, a detached slot held from here to
        ``finish`` (None when not started, as ``refresh``); the new value is stored on success.
        """
        return self._refresh(key, runner, keep, timeout, logged=True)

    def _refresh(self, key: str, runner: Runner, keep: float, timeout: float | None,
                 logged: bool) -> Future[bool] | None:
        limit = (DEFAULT_REFRESH_TIMEOUT if timeout is None or not math.isfinite(timeout)
                 or timeout <= 0 else timeout)
        if not self.begin_refresh(key, limit):
            return None
        if not detached.try_enter():
            self.end_refresh(key)
            self.count("refused")
            return None
        self.count("refreshes")
        done: Future[bool] = Future()
        finish = partial(self._finish, key, done, keep, logged)
        try:
            runner(limit, finish)
        except BaseException as exc:  # noqa: BLE001 - a closed executor: the refresh failed
            finish(None, exc)
        return done

    def _finish(self, key: str, done: Future[bool], keep: float, logged: bool, value: Any,
                error: BaseException | None) -> None:
        # the first to claim ``done`` finishes the refresh once (``refresh``'s work and its
        # timer race; a later claim is dropped)
        with self._lock:
            if done.running() or done.done():
                return
            done.set_running_or_notify_cancel()
        ok = error is None and self.set(key, value, keep=keep)
        if error is not None:
            self.count("errors")
            if not logged:
                logger.warning("cache {!r}: refresh of {!r} failed ({}: {}); the stale value "
                               "stays", self.name, key, type(error).__name__, error)
        self.end_refresh(key)
        detached.leave(ok)
        done.set_result(ok)

    # -- metrics -----------------------------------------------------------------------------
    def metrics(self) -> CacheMetrics:
        with self._lock:
            return CacheMetrics(name=self.name, **self._counts)

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("cache", self.name),)
        return [Sample(f"cache_{field}_total", "counter", help_, lab, getattr(m, field))
                for field, help_ in (
                    ("hits", "Fresh values served from the cache."),
                    ("misses", "Lookups with nothing servable."),
                    ("stale_served", "Stale values served."),
                    ("refreshes", "Background refreshes started."),
                    ("refused", "Refreshes refused for want of a detached slot."),
                    ("errors", "Cache backend, codec and refresh errors."))]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        return render_prometheus([self], prefix=prefix)


class LruCache(CacheBase):
    """The in-process cache: at most ``size`` keys, least recently used out.

    Values are kept as objects (no codec round trip: nothing leaves the process) unless a
    ``codec`` is given.
    """

    def __init__(self, name: str = "lru", *, size: int = 1024, codec: object = None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(name, codec="json" if codec is None else codec, clock=clock)
        self.size = check_int(f"cache {name!r}", "size", size, minimum=1)
        self._raw = codec is None
        self._data: OrderedDict[str, tuple[float, float, Any]] = OrderedDict()  # stored, end, v

    @staticmethod
    def _seam() -> float:
        """The clock without one of its own: monotonic time (nothing leaves the process)."""
        return seam.now()

    def get(self, key: str) -> Entry | None:
        if not self._raw:
            return super().get(key)
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            now = (self._clock or self._seam)()
            if now >= hit[1]:
                del self._data[key]
                return None
            self._data.move_to_end(key)
        return Entry(hit[2], max(0.0, now - hit[0]))

    def set(self, key: str, value: Any, *, keep: float) -> bool:
        if not self._raw:
            return super().set(key, value, keep=keep)
        self._put(key, (self._clock or self._seam)(), value, keep)
        return True

    def _put(self, key: str, stored_at: float, value: Any, keep: float) -> None:
        with self._lock:
            self._data[key] = (stored_at, stored_at + keep, value)
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def _get_raw(self, key: str) -> tuple[float, bytes] | None:
        with self._lock:
            hit = self._data.get(key)
        if hit is None or (self._clock or self._seam)() >= hit[1]:
            return None
        return hit[0], hit[2]

    def _set_raw(self, key: str, stored_at: float, payload: bytes, keep: float) -> None:
        self._put(key, stored_at, payload, keep)

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


class RedisCache(CacheBase):
    """Values shared by every process that points at the same Redis (extra ``[redis]``).

    Args:
        url: ``redis://host:port/db``.
        prefix: Prepended to every key (several apps can share one Redis).
        codec: ``"json"`` (default), ``"pickle"`` (opt-in: a trust boundary, see the module
            docstring) or an object with ``encode(value) -> bytes`` / ``decode(bytes)``.
        timeout: Socket timeout in seconds: a Redis that hangs costs a page at most this.
        name: Names the cache in logs and metrics.

    Ages use the wall clock (``time.time``) since they are compared across processes.
    """

    def __init__(self, url: str, *, prefix: str = "taskflow:", codec: object = "json",
                 timeout: float = 0.25, name: str = "redis",
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(name, codec=codec, clock=clock)
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise FlowDefinitionError(
                "RedisCache needs the redis client: pip install 'taskflow-juc[redis]'") from exc
        self.url, self.prefix = url, prefix
        self._client = redis.Redis.from_url(url, socket_timeout=timeout,
                                            socket_connect_timeout=timeout)

    def _get_raw(self, key: str) -> tuple[float, bytes] | None:
        data = self._client.get(self.prefix + key)
        if data is None:
            return None
        raw = data if isinstance(data, bytes) else str(data).encode()
        head, _, payload = raw.partition(b"\n")
        return float(head), payload

    def _set_raw(self, key: str, stored_at: float, payload: bytes, keep: float) -> None:
        self._client.set(self.prefix + key, f"{stored_at!r}\n".encode() + payload,
                         px=max(1, int(keep * 1000)))

    def try_lock(self, key: str, seconds: float) -> bool:
        return bool(self._client.set(f"{self.prefix}lock:{key}", b"1", nx=True,
                                     px=max(1, int(seconds * 1000))))

    def end_refresh(self, key: str) -> None:
        super().end_refresh(key)
        try:
            self._client.delete(f"{self.prefix}lock:{key}")
        except Exception as exc:  # noqa: BLE001
            self._error("unlock", key, exc)

    def __repr__(self) -> str:
        return f"RedisCache({self.url!r}, prefix={self.prefix!r})"
