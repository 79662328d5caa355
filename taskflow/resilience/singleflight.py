"""``SingleFlight``: concurrent runs that need the same thing share one attempt.

The first run to ``join`` a key becomes the leader: it runs the attempt and resolves the shared
call with ``call.set_result`` / ``call.set_exception``. Later joiners of the key get
``leader=False`` and a callback when the call resolves; nobody holds a worker while waiting. Each
joiner waits only as long as its own run wants: ``member.leave()`` (at its deadline) drops its
callback and affects nobody else. The leader's attempt, once started, resolves the call even if
the leader's run gave up on it, so joiners with budget left still get the value.

How the engine uses it::

    member = flight.join((node_key, user_key), on_done)   # raises UnhashableKeyError
    if member.cached:               # a cached success: use member.call.result() now
    elif member.leader:             # run the attempt; on completion call.set_result(v) or
        ...                         # call.set_exception(e)
    else:                           # wait: on_done(outcome) comes later
        ...
    member.withdraw()               # the run gives up without running an attempt for the
                                    # call (its deadline, a wait it lost): a leader resigns,
                                    # a waiter leaves, decided under the flight's lock

``on_done(outcome)`` reaches every member that has not left, the leader included (so the
leader's run learns its value the same way as the others); it runs on the thread that resolved
the call, outside the lock, and must be quick. ``outcome.promoted`` means the previous leader
resigned and this member now leads: it must run the attempt (or resign in turn). The same
exception object reaches every joiner.

With ``cache_ttl`` a success is kept for that many seconds in a cache (``taskflow.cache``):
the in-process ``LruCache`` of ``cache_size`` keys by default, or the one passed as ``cache=``
(``RedisCache`` shares values across processes). Errors are never cached. The cache is read and
written outside the flight's lock (a shared cache does I/O); a cache that is down is a miss,
logged, never the join's error. ``stale_value(key)`` reads a value kept up to ``cache_ttl +
stale_if_error`` seconds, for a call that failed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from threading import Lock
from types import CoroutineType
from typing import Any

from pydantic import BaseModel, ConfigDict

from taskflow.errors import FlowDefinitionError, returned_coroutine
from taskflow.exposition import Sample
from taskflow.resilience.cache import (
    FRESH,
    STALE,
    STALE_IF_ERROR,
    Cache,
    LruCache,
    Runner,
    key_text,
)
from taskflow.resilience.callbacks import Callback, run_callbacks
from taskflow.resilience.errors import UnhashableKeyError
from taskflow.resilience.export import render_prometheus
from taskflow.resilience.options import (
    check_callable,
    check_int,
    check_name,
    check_seconds,
    is_async,
    rebuild,
)
from taskflow.resilience.process import track

__all__ = [
    "Member",
    "Outcome",
    "SharedCall",
    "SingleFlight",
    "SingleFlightMetrics",
    "check_share_key",
    "share_key_of",
]

_PENDING, _OK, _ERROR = 0, 1, 2


class SingleFlightMetrics(BaseModel):
    """A snapshot of one single flight."""

    model_config = ConfigDict(frozen=True)

    name: str
    in_flight: int  # keys with a call running
    waiting: int  # joiners (not leaders) waiting for a call
    calls: int  # calls started (leaders, total)
    shared: int  # joins served by another's call or the cache (total)
    cache_hits: int
    cached: int  # keys in the cache now (expired ones included until touched)
    left: int  # joiners that left before the call resolved (total)


class Outcome:
    """What reaches a member: a value, an error, or the lead (``promoted``)."""

    __slots__ = ("error", "promoted", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None,
                 promoted: bool = False) -> None:
        self.value = value
        self.error = error
        self.promoted = promoted

    @property
    def ok(self) -> bool:
        return self.error is None and not self.promoted

    def __repr__(self) -> str:
        if self.promoted:
            return "<Outcome promoted>"
        if self.error is not None:
            return f"<Outcome error={self.error!r}>"
        return f"<Outcome value={self.value!r}>"


class SharedCall:
    """One in-flight (or finished) call shared by the members of a key."""

    __slots__ = ("_error", "_flight", "_members", "_state", "_value", "key", "leader")

    def __init__(self, flight: SingleFlight, key: Hashable) -> None:
        self._flight = flight
        self.key = key
        # guarded by the flight's lock:
        self._state = _PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._members: list[Member] = []  # waiting members in join order, leader excluded
        self.leader: Member | None = None

    def done(self) -> bool:
        return self._state != _PENDING

    def result(self) -> Any:
        """The value; raises the shared error; ``RuntimeError`` while still running."""
        if self._state == _PENDING:
            raise RuntimeError(f"single flight {self._flight.name!r}: call {self.key!r} not done")
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self) -> BaseException | None:
        if self._state == _PENDING:
            raise RuntimeError(f"single flight {self._flight.name!r}: call {self.key!r} not done")
        return self._error

    def set_result(self, value: Any) -> bool:
        """Resolve with a value; False when already resolved (a late duplicate)."""
        return self._flight._resolve(self, _OK, value, None)

    def set_exception(self, error: BaseException) -> bool:
        """Resolve with an error shared by every member; False when already resolved."""
        return self._flight._resolve(self, _ERROR, None, error)

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _OK: "ok", _ERROR: "error"}[self._state]
        return f"<SharedCall {self.key!r} {state} members={len(self._members)}>"


class Member:
    """One run's place in a shared call."""

    __slots__ = ("_on_done", "cached", "call", "leader", "stale")

    def __init__(self, call: SharedCall, on_done: Callable[[Outcome], Any] | None,
                 leader: bool, cached: bool = False, stale: bool = False) -> None:
        self.call = call
        self.leader = leader  # guarded by the flight's lock (a promotion sets it)
        self.cached = cached  # served from the cache at join: no outcome will be delivered
        self.stale = stale  # the cached value is stale: the run starts a ``refresh``
        self._on_done = on_done  # None once delivered or left

    def leave(self) -> bool:
        """Stop waiting (the run's deadline passed); nobody else is affected.

        Returns:
            True when the member left before an outcome reached it.
        """
        return self.call._flight._leave(self)

    def resign(self) -> None:
        """The leader gives up before its attempt started; the oldest waiter is promoted (its
        ``on_done`` gets ``Outcome(promoted=True)``), or the call is dropped if nobody waits."""
        self.call._flight._resign(self)

    def withdraw(self) -> None:
        """The member's run no longer wants the call and will run no attempt for it: a leader
        resigns, a waiter leaves. Which one is decided under the flight's lock, so a promotion
        racing this call cannot leave the call with a leader nobody runs."""
        self.call._flight._withdraw(self)

    def __iter__(self) -> Any:  # ``leader, call = flight.join(...)``
        return iter((self.leader, self.call))


class SingleFlight:
    """One call per key among concurrent callers, with an optional TTL cache of successes.

    Args:
        name: Names the single flight in errors and metrics.
        cache_ttl: Seconds a success is served from the cache (> 0); None: no cache.
        cache_size: Keys kept in the default cache at most (>= 1), least recently used out.
        clock: Monotonic clock in seconds of the default cache. Default ``None``: taskflow's
            clock (``taskflow.clock.now``), read at each call, so a fake clock installed
            later is followed. An explicit one (a test's) stays this object's.
        cache: Where successes are kept (``taskflow.cache``); None: a private ``LruCache``.
        stale_for: Seconds after ``cache_ttl`` a value is still kept and servable stale.
        stale_if_error: Seconds after ``cache_ttl`` a value is served when the call fails.

    Raises:
        FlowDefinitionError: An option is invalid (the message names the single flight).
    """

    def __init__(self, name: str = "shared", *, cache_ttl: float | None = None,
                 cache_size: int = 1024, clock: Callable[[], float] | None = None,
                 cache: Cache | None = None, stale_for: float | None = None,
                 stale_if_error: float | None = None) -> None:
        self.name = check_name("single flight", name)
        owner = f"single flight {name!r}"
        self.cache_ttl = (None if cache_ttl is None
                          else check_seconds(owner, "cache_ttl", cache_ttl, allow_zero=False))
        self.cache_size = check_int(owner, "cache_size", cache_size, minimum=1)
        self.stale_for = (0.0 if stale_for is None
                          else check_seconds(owner, "stale_for", stale_for, allow_zero=True))
        self.stale_if_error = (0.0 if stale_if_error is None else check_seconds(
            owner, "stale_if_error", stale_if_error, allow_zero=True))
        if cache is not None and not isinstance(cache, Cache):
            raise FlowDefinitionError(f"{owner}: cache must implement taskflow.cache.Cache "
                                      f"(get/set/try_lock/metrics), got {cache!r}")
        if cache is not None:
            _check_sync_cache(owner, cache)
        self._user_cache = cache
        self._clock = clock
        self._start_fresh()
        track(self)

    def _start_fresh(self) -> None:
        # _lock guards: _calls, _cache, the counters, and every SharedCall/Member field of
        # this flight that its comments mark as guarded
        self._lock = Lock()
        self._calls: dict[Hashable, SharedCall] = {}  # keys in flight
        self.cache: Cache | None = self._user_cache
        if self.cache is None and self.cache_ttl is not None:
            self.cache = LruCache(self.name, size=self.cache_size, clock=self._clock)
        self._started = 0
        self._shared = 0
        self._hits = 0
        self._left = 0

    def _after_fork(self) -> None:
        self._start_fresh()  # the parent's calls will never resolve here

    def join(self, key: Hashable, on_done: Callable[[Outcome], Any]) -> Member:
        """Join the call for ``key``, starting it (as leader) when there is none.

        Returns:
            The member. ``member.call.done()`` already: a cached value, read it now (``on_done``
            is not called). ``member.leader``: run the attempt. Either way, unless the member
            leaves first, ``on_done`` gets the outcome once the call resolves.

        Raises:
            UnhashableKeyError: ``key`` cannot be hashed.
        """
        try:
            hash(key)
        except TypeError as exc:
            raise UnhashableKeyError(f"single flight {self.name!r}", key) from exc
        if self.cache is not None and self.cache_ttl is not None:
            state, value = _lookup(self.cache, key_text(self.name, key), self.cache_ttl,
                                   stale_for=self.stale_for)
            if state in (FRESH, STALE):
                with self._lock:
                    self._hits += 1
                    self._shared += 1
                cached = SharedCall(self, key)
                cached._state, cached._value = _OK, value
                return Member(cached, None, leader=False, cached=True, stale=state == STALE)
        with self._lock:
            call = self._calls.get(key)
            if call is None:
                call = self._calls[key] = SharedCall(self, key)
                member = call.leader = Member(call, on_done, leader=True)
                self._started += 1
                return member
            member = Member(call, on_done, leader=False)
            call._members.append(member)
            self._shared += 1
            return member

    def _resolve(self, call: SharedCall, state: int, value: Any,
                 error: BaseException | None) -> bool:
        with self._lock:
            if call._state != _PENDING:
                return False
            call._state, call._value, call._error = state, value, error
            if self._calls.get(call.key) is call:
                del self._calls[call.key]
            outcome = Outcome(value, error)
            deliveries: list[Callback] = []
            members = ([call.leader] if call.leader is not None else []) + call._members
            call._members = []
            for member in members:
                if member._on_done is not None:
                    deliveries.append((member._on_done, (outcome,)))
                    member._on_done = None
        if state == _OK and self.cache is not None and self.cache_ttl is not None:
            self.cache.set(key_text(self.name, call.key), value, keep=self.keep)
        run_callbacks(deliveries)
        return True

    @property
    def keep(self) -> float:
        """Seconds a success is kept: ``cache_ttl`` plus the longer stale window."""
        return (self.cache_ttl or 0.0) + max(self.stale_for, self.stale_if_error)

    def refresh(self, key: Hashable, runner: Runner, *, timeout: float | None) -> bool:
        """Stale-while-revalidate: refresh ``key`` detached, ``runner(limit, finish)`` starting
        its work (one per key at a time, see ``CacheBase.refresh_with``); False when not
        started (another runs, no slot, or a protocol-only cache that cannot refresh)."""
        refresh = getattr(self.cache, "refresh_with", None)
        if not callable(refresh):
            return False
        return refresh(key_text(self.name, key), runner, keep=self.keep,
                       timeout=timeout) is not None

    def stale_value(self, key: Hashable) -> tuple[bool, Any]:
        """``(True, value)`` when a value up to ``cache_ttl + stale_if_error`` old is kept for
        ``key`` (the call failed: the node serves it ``DEGRADED``), else ``(False, None)``."""
        if self.cache is None or self.cache_ttl is None or not self.stale_if_error:
            return False, None
        state, value = _lookup(self.cache, key_text(self.name, key), self.cache_ttl,
                               stale_if_error=self.stale_if_error)
        if state in (FRESH, STALE, STALE_IF_ERROR):
            served = getattr(self.cache, "served_on_error", None)
            if callable(served):
                served()
            return True, value
        return False, None

    def _leave(self, member: Member) -> bool:
        with self._lock:
            return self._drop(member)

    def _drop(self, member: Member) -> bool:
        # caller holds _lock: the member hears of nothing any more (a leader still leads)
        if member._on_done is None:
            return False
        member._on_done = None
        call = member.call
        if member in call._members:
            call._members.remove(member)
        self._left += 1
        return True

    def _resign(self, member: Member) -> None:
        with self._lock:
            delivery = self._pass_lead(member)
        run_callbacks(delivery)

    def _withdraw(self, member: Member) -> None:
        with self._lock:
            if member.call.leader is member:
                delivery = self._pass_lead(member)
            else:
                self._drop(member)
                delivery = []
        run_callbacks(delivery)

    def _pass_lead(self, member: Member) -> list[Callback]:
        # caller holds _lock: a pending call's leader hands the lead to the oldest waiter, or
        # the call is dropped; the promotion to deliver (outside the lock)
        delivery: list[Callback] = []
        call = member.call
        if call._state != _PENDING or call.leader is not member:
            return delivery
        member._on_done = None
        member.leader = False
        call.leader = None
        while call._members:
            heir = call._members.pop(0)
            if heir._on_done is not None:
                heir.leader = True
                call.leader = heir
                delivery.append((heir._on_done, (Outcome(promoted=True),)))
                break
        if call.leader is None and self._calls.get(call.key) is call:
            del self._calls[call.key]  # nobody waits: the next join starts afresh
        elif call.leader is not None:
            self._started += 1
        return delivery

    def forget(self, key: Hashable) -> None:
        """Drop ``key`` from the cache (an in-flight call is not affected)."""
        if isinstance(self.cache, LruCache):
            self.cache.delete(key_text(self.name, key))

    def metrics(self) -> SingleFlightMetrics:
        with self._lock:
            return SingleFlightMetrics(
                name=self.name, in_flight=len(self._calls),
                waiting=sum(len(c._members) for c in self._calls.values()),
                calls=self._started, shared=self._shared, cache_hits=self._hits,
                cached=len(self.cache) if isinstance(self.cache, LruCache) else 0,
                left=self._left,
            )

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("single_flight", self.name),)
        return [
            Sample("single_flight_in_flight", "gauge", "Keys with a shared call running.", lab,
                   m.in_flight),
            Sample("single_flight_waiting", "gauge", "Joiners waiting for a shared call.", lab,
                   m.waiting),
            Sample("single_flight_calls_total", "counter", "Shared calls started.", lab,
                   m.calls),
            Sample("single_flight_shared_total", "counter",
                   "Joins served by another run's call or the cache.", lab, m.shared),
            Sample("single_flight_cache_hits_total", "counter", "Joins served by the cache.",
                   lab, m.cache_hits),
        ]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "cache_ttl": self.cache_ttl,
            "cache_size": self.cache_size,
            "clock": self._clock,
            "cache": self._user_cache,
            "stale_for": self.stale_for or None,
            "stale_if_error": self.stale_if_error or None,
        }))

    def __repr__(self) -> str:
        return (f"SingleFlight({self.name!r}, cache_ttl={self.cache_ttl}, "
                f"in_flight={len(self._calls)})")


# what taskflow calls of a cache, on its own threads, never awaiting what it returns
_CACHE_CALLS = ("get", "set", "try_lock", "lookup", "end_refresh", "_get_raw", "_set_raw")


def _check_sync_cache(owner: str, cache: Cache) -> None:
    """A cache whose methods are ``async def`` (a cache over an asyncio client) is refused: its
    calls would be coroutines nobody awaits, every read a miss and every write lost."""
    for method in _CACHE_CALLS:
        if is_async(getattr(cache, method, None)):
            raise FlowDefinitionError(
                f"{owner}: cache {cache!r} has an async {method}(): taskflow calls its cache on "
                "its own threads and never awaits it; implement the cache with a sync client "
                "(redis.Redis, not redis.asyncio.Redis)")


def _lookup(cache: Cache, key: str, ttl: float, *, stale_for: float = 0.0,
            stale_if_error: float = 0.0) -> tuple[str, Any]:
    # a protocol-only cache (no ``lookup``): read the entry and judge its age here
    lookup = getattr(cache, "lookup", None)
    if callable(lookup):
        return lookup(key, ttl, stale_for, stale_if_error)  # type: ignore[no-any-return]
    from taskflow.resilience.cache import freshness

    entry = cache.get(key)
    if entry is None:
        return "expired", None
    return freshness(entry.age, ttl, stale_for, stale_if_error), entry.value


def check_share_key(share_key: object, *, node: str) -> None:
    """At definition time: ``share_key`` must be callable as ``share_key(ctx, param)``.

    Raises:
        FlowDefinitionError: It is not (the message names the node).
    """
    check_callable(f"node {node!r}", "share_key", share_key, "(ctx, param)")


_KEY_FIX = ("a key is computed on the run's threads and never awaited: return it from a plain "
            "def (the key of the node's param, not a call to the backend)")


def share_key_of(share_key: Callable[[Any, Any], Hashable], ctx: Any, param: Any, *,
                 node: str) -> Hashable:
    """The run's key for a node: ``share_key(ctx, param)``, checked to be hashable.

    Exceptions raised by ``share_key`` itself propagate (the node's own failure).

    Raises:
        UnhashableKeyError: The key cannot be hashed (the message names the node).
        TypeError: ``share_key`` is a plain def that returned a coroutine (closed, never a
            key: each would be a key of its own), naming the node.
    """
    key = share_key(ctx, param)
    if type(key) is CoroutineType:
        raise returned_coroutine(f"node {node!r}", key, "its share_key", _KEY_FIX)
    try:
        hash(key)
    except TypeError as exc:
        raise UnhashableKeyError(f"node {node!r}", key) from exc
    return key
