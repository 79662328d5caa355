"""``Batch``: nodes that each need one backend call share one call ``fn(keys) -> {key: value}``.

A node (or a fan-out item) with ``batch=`` does not run a task of its own: it takes a *seat*
in a *call* of its batch, with its key, and the call's answer for that key is its value. How
the engine fills calls (``taskflow.engine.batching``): within a run, the first node of a batch
to be dispatched takes with it every node of that batch already ready in its run; a call then
stays open ``window`` seconds for more seats of its run (``across_runs=False``) or of any run
(``across_runs=True``), and closes early once it holds ``max_size`` keys (more seats: more
calls).

A call moves ``OPEN -> CLOSED -> RUNNING -> DONE`` (or ``CLOSED -> DONE`` when nobody is left
to answer, or when it could not be run), each move once, under the batch's lock:

* ``join`` adds seats, opening calls as needed; it closes the calls it fills (and, with
  ``window == 0``, every call it touched). Whoever receives a closed call from ``join`` or
  ``close`` owns the duty to run it: it calls ``execute`` on a thread that may run user code
  (a worker), or ``fail`` when it cannot.
* ``close`` is the window's end (the engine's timer): OPEN -> CLOSED.
* ``execute`` (RUNNING) calls ``fn`` once, outside the lock, with the keys of the seats still
  waiting; the time limit is the earliest of their deadlines (``BatchKeys.timeout``). Then
  every seat still waiting is answered: its value, ``BatchKeyError`` for a key the answer
  lacks, ``BatchResultError`` when ``fn`` returned something that is not a mapping, and
  ``BatchCallError`` (the cause chained) when ``fn`` raised.
* An ``async def`` fn (``is_async``) is never called by ``execute``: the engine awaits it on an
  event loop (``taskflow.engine.aio``) in three steps: ``begin`` (CLOSED -> RUNNING, the keys),
  ``running`` (how to cancel the task: ``leave`` calls it once no seat waits any more, so a
  call nobody wants is cancelled for real) and ``resolve`` (the task's outcome, answered as
  ``execute`` answers ``fn``'s; a call cancelled because every seat left counts in
  ``cancelled``, not in ``failed``).

Each seat is answered or leaves exactly once (``leave``: its run ended; it never sees a value,
and a key no seat waits for any more is not sent). Answers reach each seat's ``party`` — one
callable per ``join`` — as one list per party, on the thread that resolved the call, outside
the lock (``callbacks.run_callbacks``); a party must be quick (move state, hand work over).

The lock guards every call's and seat's state, the open calls and the counters. Nothing is
called under it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from threading import Lock
from types import CoroutineType
from typing import Any

from pydantic import BaseModel, ConfigDict

from taskflow import clock as seam
from taskflow.errors import (
    BatchCallError,
    BatchKeyError,
    BatchResultError,
    FlowDefinitionError,
    UnhashableKeyError,
    returned_coroutine,
)
from taskflow.exposition import Sample
from taskflow.resilience.callbacks import Callback, run_callbacks
from taskflow.resilience.export import register, render_prometheus
from taskflow.resilience.options import (
    check_callable,
    check_int,
    check_name,
    check_not_coroutine,
    check_seconds,
    is_async,
    rebuild,
)
from taskflow.resilience.process import track

__all__ = ["Answer", "Batch", "BatchCall", "BatchKeys", "BatchMetrics", "Seat"]

# call states; each move happens once, under the batch's lock
OPEN, CLOSED, RUNNING, DONE = "open", "closed", "running", "done"
# seat states
_WAITING, _ANSWERED, _LEFT = 0, 1, 2

Answer = tuple["Seat", Any, "BaseException | None"]
"""What a party receives per seat: ``(seat, value, error)``."""


class BatchMetrics(BaseModel):
    """A snapshot of one batch."""

    model_config = ConfigDict(frozen=True)

    name: str
    max_size: int
    window: float
    across_runs: bool
    calls: int  # calls made: fn called (total)
    keys: int  # keys sent to fn (total)
    largest: int  # the most keys one call was given
    waiting: int  # seats not answered yet (their call is open, closed or running)
    failed: int  # calls whose fn raised or answered with no mapping, or that could not run
    cancelled: int = 0  # calls of an async fn cancelled: every seat left while it ran (total)
    left: int  # seats that left before their answer: their run ended (total)
    dropped: int  # calls never made: every seat had left (total)


class BatchKeys(list[Any]):
    """The keys ``fn`` receives: a list, in the order the seats joined, each key once.

    Attributes:
        timeout: seconds left until the earliest deadline among the call's seats when the call
            started (its time limit: bound the backend request by it); None: no limit.
        deadline: that deadline, a stamp of taskflow's monotonic clock (``taskflow.clock.now()``;
            None: no limit).
        label: the call's name in reports, ``"<batch>#<n>"``.
    """

    timeout: float | None
    deadline: float | None
    label: str


class Seat:
    """One node's (or one fan-out item's) place in a call. ``tag`` is the engine's; ``label``
    names the call. Once answered or left, a seat drops its call and its party (a seat kept
    in a finished run's bookkeeping holds no other run)."""

    __slots__ = ("call", "deadline", "key", "label", "party", "state", "tag")

    def __init__(self, call: BatchCall, key: Hashable, deadline: float,
                 party: Callable[[list[Answer]], Any], tag: Any) -> None:
        self.call: BatchCall | None = call
        self.key = key
        self.deadline = deadline
        self.party: Callable[[list[Answer]], Any] | None = party
        self.tag = tag
        self.label = call.label
        self.state = _WAITING  # guarded by the batch's lock

    def __repr__(self) -> str:
        return f"<Seat {self.key!r} of {self.label}>"


class BatchCall:
    """One call of a batch: its seats and its keys (with how many waiting seats hold each),
    how many seats wait, and how to cancel it while an async fn runs (``stop``)."""

    __slots__ = ("keys", "label", "opened_at", "scope", "seats", "state", "stop", "waiting")

    def __init__(self, label: str, scope: Hashable, opened_at: float) -> None:
        self.label = label
        self.scope = scope
        self.opened_at = opened_at
        # guarded by the batch's lock:
        self.state = OPEN
        self.seats: list[Seat] = []
        self.keys: dict[Hashable, int] = {}  # key -> waiting seats holding it
        self.waiting = 0  # seats not answered and not left
        self.stop: Callable[[], Any] | None = None  # cancels the running task (async fn)

    def __repr__(self) -> str:
        return f"<BatchCall {self.label} {self.state} keys={len(self.keys)}>"


class Batch:
    """One backend call for many nodes: ``fn(keys)`` answers each with ``{key: value}``.

    Args:
        name: Names the batch in errors, reports and metrics.
        fn: Called as ``fn(keys)`` with a [`BatchKeys`][taskflow.resilience.batch.BatchKeys]
            (a list; ``keys.timeout`` is the call's time limit); returns a mapping with a value
            for each key. A plain function runs on a worker of the flow's executor; an
            ``async def`` one (or an object with ``async def __call__``, or a partial of
            either) is awaited on the event loop async nodes run on, holding no worker, and is
            cancelled (``CancelledError`` inside it) once every node waiting for the call has
            given up.
        max_size: The most keys in one call (>= 1); more seats make more calls.
        window: Seconds a call waits for more seats after the first (>= 0). 0: a call holds
            the nodes of one run that were ready together, and goes at once.
        across_runs: Seats of concurrent runs may share a call (needs ``window > 0``).
        key: ``key(ctx, param)`` -> a node's key (for a fan-out item, ``key(ctx, item)``);
            None: the node's ``param`` (the item) is its key. Keys must be hashable.
        clock: Monotonic clock in seconds. Default ``None``: taskflow's clock
            (``taskflow.clock.now``), read at each call, so a fake clock installed later
            is followed. An explicit one (a test's) stays this object's.

    Raises:
        FlowDefinitionError: An option is invalid (the message names the batch).
    """

    def __init__(self, name: str,
                 fn: Callable[[BatchKeys], Mapping[Any, Any] | Awaitable[Mapping[Any, Any]]], *,
                 max_size: int = 100, window: float = 0.0, across_runs: bool = False,
                 key: Callable[[Any, Any], Hashable] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.name = check_name("batch", name)
        owner = f"batch {name!r}"
        _check_fn(owner, fn)
        self.fn = fn
        self.is_async = is_async(fn)  # awaited on an event loop, never called by ``execute``
        if self.is_async:
            import asyncio  # noqa: F401 - loaded with the batch, not inside its first call's run
        self.max_size = check_int(owner, "max_size", max_size, minimum=1)
        self.window = check_seconds(owner, "window", window, allow_zero=True)
        if not isinstance(across_runs, bool):
            raise FlowDefinitionError(f"{owner}: across_runs must be True or False, "
                                      f"got {across_runs!r}")
        if across_runs and self.window == 0.0:
            raise FlowDefinitionError(
                f"{owner}: across_runs=True needs a window > 0 (how long a call waits for the "
                "nodes of other runs)")
        self.across_runs = across_runs
        if key is not None:
            check_callable(owner, "key", key, "(ctx, param)")
        self.key = key
        self._clock = clock
        self._start_fresh()
        track(self)
        register(self, "batch")  # PoolMonitor exports it

    def _start_fresh(self) -> None:
        # _lock guards: _open, every BatchCall's state/seats/keys and Seat.state of this
        # batch, and the counters below
        self._lock = Lock()
        self._open: dict[Hashable, BatchCall] = {}  # scope -> its call open for seats
        self._made = 0  # calls created (numbers their labels)
        self._calls = 0
        self._keys = 0
        self._largest = 0
        self._waiting = 0
        self._failed = 0
        self._left = 0
        self._dropped = 0
        self._cancelled = 0

    def _after_fork(self) -> None:
        self._start_fresh()  # the parent's calls will never be answered here

    # -- the engine's side ----------------------------------------------------------------------

    def key_of(self, ctx: Any, param: Any, *, owner: str) -> Hashable:
        """A node's (or an item's) key: ``key(ctx, param)``, or ``param``; checked hashable.

        Raises:
            UnhashableKeyError: The key cannot be hashed (the message names ``owner``).
            TypeError: ``key`` is a plain def that returned a coroutine (closed), naming
                ``owner`` and the batch.
        """
        k = param if self.key is None else self.key(ctx, param)
        if type(k) is CoroutineType:
            raise returned_coroutine(
                f"{owner} (batch {self.name!r})", k, "its batch's key",
                "a batch's key is computed on the run's threads and never awaited: return it "
                "from a plain def")
        try:
            hash(k)
        except TypeError as exc:
            raise UnhashableKeyError(f"{owner} (batch {self.name!r})", k) from exc
        return k

    def join(self, scope: Hashable, entries: Sequence[tuple[Hashable, float, Any]],
             party: Callable[[list[Answer]], Any]
             ) -> tuple[list[Seat], list[BatchCall], list[BatchCall]]:
        """Seat ``entries`` (``(key, deadline, tag)`` each) in calls of ``scope`` (a run's id,
        or one scope for every run with ``across_runs``), in order.

        Returns:
            The seats (one per entry), the calls this join closed (their owner is now the
            caller: run each with ``execute`` or ``fail`` it) and the calls it opened that are
            still open (the caller closes each with ``close`` once ``window`` has passed).
        """
        closed: list[BatchCall] = []
        opened: list[BatchCall] = []
        seats: list[Seat] = []
        windowed = self.window > 0.0
        with self._lock:
            call = self._open.get(scope) if windowed else None
            for key, deadline, tag in entries:
                if call is None or call.state is not OPEN:
                    self._made += 1
                    call = BatchCall(f"{self.name}#{self._made}", scope, (self._clock or seam.now)())
                    opened.append(call)
                    if windowed:
                        self._open[scope] = call
                seat = Seat(call, key, deadline, party, tag)
                seats.append(seat)
                call.seats.append(seat)
                call.keys[key] = call.keys.get(key, 0) + 1
                call.waiting += 1
                self._waiting += 1
                if len(call.keys) >= self.max_size:
                    self._close_locked(call)
                    closed.append(call)
            if not windowed:
                for c in opened:
                    if c.state is OPEN:
                        self._close_locked(c)
                        closed.append(c)
        return seats, closed, [c for c in opened if c.state is OPEN]

    def _close_locked(self, call: BatchCall) -> None:
        call.state = CLOSED
        if self._open.get(call.scope) is call:
            del self._open[call.scope]

    def close(self, call: BatchCall) -> bool:
        """The window of ``call`` has passed: OPEN -> CLOSED. True when this closed it (the
        caller now owns the duty to run it); False when it had closed already."""
        with self._lock:
            if call.state is not OPEN:
                return False
            self._close_locked(call)
            return True

    def leave(self, seat: Seat) -> bool:
        """The seat's run no longer wants an answer (it ended). True when it left before
        being answered; its key is not sent unless another waiting seat holds it. The last
        seat to leave a running call of an async fn cancels it (its ``stop``, outside the
        lock)."""
        stop = None
        with self._lock:
            if seat.state != _WAITING:
                return False
            seat.state = _LEFT
            self._waiting -= 1
            self._left += 1
            call = seat.call
            assert call is not None
            seat.call = seat.party = None
            call.waiting -= 1
            if call.state is OPEN or call.state is CLOSED:
                n = call.keys[seat.key] - 1
                if n:
                    call.keys[seat.key] = n
                else:
                    del call.keys[seat.key]
            elif call.state is RUNNING and not call.waiting:
                stop, call.stop = call.stop, None
        if stop is not None:
            stop()
        return True

    def execute(self, call: BatchCall, own: Seat | None = None
                ) -> tuple[Any, BaseException | None] | None:
        """Run closed ``call`` on this thread (it must be one that may run user code): ``fn``
        once with the keys still wanted, then every waiting seat is answered.

        Returns:
            The answer of ``own`` (not delivered to its party), or None when ``own`` is None
            or had left.
        """
        keys = self._start(call)
        if keys is None:
            return None
        if self.is_async:  # the engine awaits it (``begin``); calling it here awaits nothing
            return self._resolve(call, None, TypeError(
                f"batch {self.name!r}: an async batch function cannot run on a worker"), own)
        try:
            answer = self.fn(keys)
            error: BaseException | None = None
            if type(answer) is CoroutineType:  # nothing would await it: closed, the call fails
                raise returned_coroutine(
                    f"batch {self.name!r}", answer, "its function",
                    "pass the async function itself, Batch(name, {fn}), so that it is awaited "
                    "on the event loop async nodes run on")
        except BaseException as exc:  # noqa: BLE001 - the call's failure is every seat's
            answer, error = None, exc
        return self._resolve(call, answer, error, own)

    def fail(self, call: BatchCall, error: BaseException) -> None:
        """Closed ``call`` cannot be run (its executor refused it): every waiting seat fails
        with ``error`` as the cause."""
        with self._lock:
            if call.state is not CLOSED:
                return
            call.state = RUNNING  # a call that failed to run still counts as one that failed
        self._resolve(call, None, error, None)

    def begin(self, call: BatchCall) -> BatchKeys | None:
        """Closed ``call`` of an async fn starts (the engine awaits ``fn(keys)``): the keys
        still wanted, or None when the call is not to be made (nobody waits, or it ran)."""
        return self._start(call)

    def running(self, call: BatchCall, stop: Callable[[], Any]) -> bool:
        """``stop()`` cancels ``call``'s task from now on (``leave`` calls it once no seat
        waits). False, and ``stop`` is not kept, when no seat waits already."""
        with self._lock:
            if call.state is not RUNNING or not call.waiting:
                return False
            call.stop = stop
            return True

    def resolve(self, call: BatchCall, answer: Any, error: BaseException | None,
                cancelled: bool = False) -> None:
        """The task of running ``call`` ended: ``answer`` (``fn``'s) or ``error`` answers every
        seat still waiting, as ``execute`` does; ``cancelled``: taskflow cancelled it (every
        seat had left), counted in ``cancelled``."""
        self._resolve(call, answer, error, None, cancelled)

    def _start(self, call: BatchCall) -> BatchKeys | None:
        """CLOSED -> RUNNING with the keys still wanted, or -> DONE when none is."""
        with self._lock:
            if call.state is not CLOSED:
                return None
            if not call.keys:
                call.state = DONE
                self._dropped += 1
                return None
            call.state = RUNNING
            keys = BatchKeys(call.keys)
            n = len(keys)
            self._calls += 1
            self._keys += n
            self._largest = max(self._largest, n)
            deadline = min(s.deadline for s in call.seats if s.state == _WAITING)
        finite = not math.isinf(deadline)
        keys.deadline = deadline if finite else None
        keys.timeout = max(0.0, deadline - (self._clock or seam.now)()) if finite else None
        keys.label = call.label
        return keys

    def _resolve(self, call: BatchCall, answer: Any, error: BaseException | None,
                 own: Seat | None, cancelled: bool = False
                 ) -> tuple[Any, BaseException | None] | None:
        """RUNNING -> DONE: answer every seat still waiting, each party once (outside the lock)."""
        mapping = error is None and isinstance(answer, Mapping)
        mine: tuple[Any, BaseException | None] | None = None
        parties: dict[int, tuple[Callable[[list[Answer]], Any], list[Answer]]] = {}
        with self._lock:
            call.state = DONE
            call.stop = None
            if cancelled:
                self._cancelled += 1
            elif not mapping:
                self._failed += 1
            waiting = [s for s in call.seats if s.state == _WAITING]
            call.seats = []
            call.waiting = 0
            for s in waiting:
                s.state = _ANSWERED
            self._waiting -= len(waiting)
        for s in waiting:
            value, err = self._answer(s.key, answer, error, mapping)
            party, s.party, s.call = s.party, None, None
            if s is own:
                mine = (value, err)
                continue
            assert party is not None
            entry = parties.get(id(party))
            if entry is None:
                entry = parties[id(party)] = (party, [])
            entry[1].append((s, value, err))
        deliveries: list[Callback] = [(party, (answers,)) for party, answers in parties.values()]
        run_callbacks(deliveries)
        return mine

    def _answer(self, key: Hashable, answer: Any, error: BaseException | None,
                mapping: bool) -> tuple[Any, BaseException | None]:
        """One seat's ``(value, error)`` from the call's outcome (outside the lock: a user
        mapping's lookup runs here)."""
        if error is not None:
            return None, BatchCallError(self.name, key, error)
        if not mapping:
            return None, BatchResultError(self.name, type(answer).__name__)
        try:
            if key in answer:
                return answer[key], None
        except Exception as exc:  # noqa: BLE001 - a mapping whose lookup raises fails the key
            return None, BatchCallError(self.name, key, exc)
        return None, BatchKeyError(self.name, key)

    # -- metrics ----------------------------------------------------------------------------------

    def metrics(self) -> BatchMetrics:
        """A consistent snapshot of the batch's figures."""
        with self._lock:
            return BatchMetrics(
                name=self.name, max_size=self.max_size, window=self.window,
                across_runs=self.across_runs, calls=self._calls, keys=self._keys,
                largest=self._largest, waiting=self._waiting, failed=self._failed,
                left=self._left, dropped=self._dropped, cancelled=self._cancelled,
            )

    def prometheus_samples(self) -> list[Sample]:
        m = self.metrics()
        lab = (("batch", self.name),)
        return [
            Sample("batch_calls_total", "counter", "Batch calls made (fn called).", lab,
                   m.calls),
            Sample("batch_keys_total", "counter", "Keys sent in batch calls.", lab, m.keys),
            Sample("batch_largest", "gauge", "The most keys one batch call was given.", lab,
                   m.largest),
            Sample("batch_waiting", "gauge", "Nodes waiting for a batch call (no worker held).",
                   lab, m.waiting),
            Sample("batch_failed_total", "counter", "Batch calls that failed.", lab, m.failed),
            Sample("batch_left_total", "counter",
                   "Nodes that left a batch call before its answer (their run ended).", lab,
                   m.left),
            Sample("batch_cancelled_total", "counter",
                   "Calls of an async batch function cancelled: every node waiting had left.",
                   lab, m.cancelled),
            Sample("batch_max_size", "gauge", "The most keys a batch call may hold.", lab,
                   m.max_size),
        ]

    def prometheus_lines(self, *, prefix: str = "taskflow") -> str:
        """This batch's metrics in the Prometheus text format."""
        return render_prometheus([self], prefix=prefix)

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as a fresh object with the same options (see ``options.rebuild``)."""
        return (rebuild, (type(self), self.name, {
            "fn": self.fn, "max_size": self.max_size, "window": self.window,
            "across_runs": self.across_runs, "key": self.key, "clock": self._clock,
        }))

    def __repr__(self) -> str:
        return (f"Batch({self.name!r}, max_size={self.max_size}, window={self.window:g}, "
                f"across_runs={self.across_runs}, waiting={self._waiting})")


def _check_fn(owner: str, fn: object) -> None:
    """``fn`` must be callable with one positional argument (the keys); async or not."""
    check_not_coroutine(owner, "fn", fn, "(keys)")
    if not callable(fn):
        raise FlowDefinitionError(f"{owner}: fn must be callable as fn(keys), got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        raise FlowDefinitionError(f"{owner}: fn {fn!r} cannot be called as fn(keys): {exc}"
                                  ) from None
