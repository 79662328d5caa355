"""Bounded dynamic fan-out: ``FanOutNode`` runs ``work(ctx, item)`` for every item that
``items(ctx, param)`` yields, at most ``max_concurrency`` at a time, and fans in to a
[`FanInResult`][taskflow.FanInResult] (stable item ids, dedupe, all / quorum / best-effort at the end).

How it runs (thread executors): the engine starts the fan-out from the loop that dispatched the
node and returns that worker to the run at once. Up to ``max_concurrency`` *item loops* run on the
flow's executor; each pulls the next item from the (lazily advanced) iterator, runs ``work`` and
pulls again, so 100,000 items never exist as 100,000 futures and no worker waits for another. When
the executor runs a task inside ``submit`` (a saturated pool's caller-runs policy) the new item
loop is queued behind the one on that thread (``loops.py``), which goes on pulling items; while it
waits there, that thread starts no more item loops (each would only queue too). On
executors that run tasks in other processes each item is its own submission (at most
``max_concurrency`` in flight), and outcomes come back through the run's coordinator.

An item id seen twice is counted in ``duplicates`` and run once. Dedupe keeps no id set of its
own: a new item is put in flight (``inflight``) in the same critical section that checks its id,
so an id already in ``succeeded``, ``failed`` or ``inflight`` is a duplicate, and beyond the
FanInResult it hands over a fan-out holds only its items in flight, whatever the item count.
``item_timeout`` fails a slow item (its thread is abandoned, its late result dropped, its
``ctx.on_cancel`` callbacks handed to a coordinator thread) and a new item loop takes its place.
When the node's own ``timeout`` passes, items still in flight are ``missing`` and the policy
decides: ``best_effort`` (or a quorum already reached) succeeds with ``complete=False``;
otherwise the node is TIMEOUT. The run's budget ending makes the node TIMEOUT with the partial FanInResult as its
``work_result.result``.

With ``batch=`` (thread executors) an item loop pulls up to the batch's ``max_size`` items at
once and seats them in a call of the batch (``taskflow.engine.batching.seat_items``) instead of
calling ``work``: a call it closed runs on that loop's worker, an open one is answered later
(``items_answered``, on the thread that resolved it, which only settles items and hands the
rest to the run's owner). A loop that pulled a full chunk starts another, at most
``max_concurrency`` (calls in flight); a loop that finds ``max_concurrency * max_size`` items in
flight exits, and an answer starts one again. The items of a fan-out that ends leave their
seats (``seal``, ``abort``).

Locks: ``_FanOut.lock`` guards the counters and maps; ``pull_lock`` only serialises ``next()`` on
the user's iterator (a generator cannot run in two threads at once); a loop that finds it held
waits through ``clock.acquire`` (under a fake clock a source that sleeps in the clock while the
others wait for it leaves them blocked, not busy, so time still moves). Lock order: the run's lock
may be held when taking ``_FanOut.lock`` (to snapshot at the budget), never the reverse.
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Executor, Future
from contextvars import Context
from functools import partial
from types import CoroutineType
from typing import Any, ClassVar, NoReturn, Protocol, TypeVar

from taskflow import clock
from taskflow.engine import attempts, batching, events, executors, loops, remote, timer
from taskflow.errors import (
    FlowDefinitionError,
    NodeTimeoutError,
    TaskflowError,
    returned_coroutine,
)
from taskflow.model.callables import is_coroutine_function
from taskflow.model.context import TaskContext, current
from taskflow.model.joins import Join
from taskflow.model.node import NodeKind, SchedulingNode, check_node_timeout, refuse_options

__all__ = ["FanHost", "FanInResult", "FanOutNode", "FanOutPolicyError", "ItemTimeoutError"]

T = TypeVar("T")


class FanInResult:
    """The fan-in of a FanOutNode.

    Attributes:
        complete: every item pulled succeeded and none is missing.
        succeeded: item id -> value of ``work``.
        failed: item id -> exception (``ItemTimeoutError`` for a slow item).
        missing: ids of items pulled but unfinished when the fan-in ended (deadline).
        duplicates: how many times an already-seen id was yielded again (run once).
    """

    __slots__ = ("complete", "duplicates", "failed", "missing", "succeeded")

    def __init__(self, complete: bool, succeeded: dict[Hashable, Any],
                 failed: dict[Hashable, BaseException], missing: list[Hashable],
                 duplicates: int) -> None:
        self.complete = complete
        self.succeeded = succeeded
        self.failed = failed
        self.missing = missing
        self.duplicates = duplicates

    @property
    def total(self) -> int:
        """Distinct items pulled."""
        return len(self.succeeded) + len(self.failed) + len(self.missing)

    def __repr__(self) -> str:
        return (f"FanInResult(complete={self.complete}, succeeded={len(self.succeeded)}, "
                f"failed={len(self.failed)}, missing={len(self.missing)}, "
                f"duplicates={self.duplicates})")


class ItemTimeoutError(TaskflowError, TimeoutError):
    """An item's ``work`` did not finish within ``item_timeout``."""

    def __init__(self, node: str, item_id: Hashable, timeout: float) -> None:
        self.node = node
        self.item_id = item_id
        super().__init__(f"item {item_id!r} of node {node!r} did not finish within {timeout:g}s")


class FanOutPolicyError(TaskflowError, RuntimeError):
    """The fan-in did not meet the node's policy; ``result`` is the FanInResult."""

    def __init__(self, node: str, policy: str | float, result: FanInResult) -> None:
        self.node = node
        self.policy = policy
        self.result = result
        super().__init__(
            f"fan-out {node!r} did not meet policy {policy!r}: {len(result.succeeded)} of "
            f"{result.total} item(s) succeeded, {len(result.failed)} failed, "
            f"{len(result.missing)} missing"
        )


def _check_policy(policy: object) -> str | float:
    if policy == "all" or policy == "best_effort":
        return str(policy)
    if isinstance(policy, bool) or not isinstance(policy, (int, float)):
        raise TypeError(
            f"policy must be 'all', 'best_effort' or a quorum fraction in (0, 1], got {policy!r}"
        )
    if math.isnan(policy) or not 0.0 < policy <= 1.0:
        raise ValueError(f"quorum fraction must be in (0, 1], got {policy!r}")
    return float(policy)


_FAN_OPTIONS = frozenset({"max_concurrency", "item_timeout", "policy"})


def _check_concurrency(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"max_concurrency must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {n}")
    return n


def _check_batched_items(node: str, item_timeout: float | None, batch: object) -> None:
    """A batched fan-out's items share calls: one item's own time limit cannot be kept."""
    if batch is not None and item_timeout is not None:
        raise FlowDefinitionError(
            f"node {node!r}: item_timeout does not apply to batched items (they share calls); "
            "bound them with the node's timeout, or drop batch")


def policy_met(policy: str | float, succeeded: int, total: int, failed: int, missing: int,
               exhausted: bool = True) -> bool:
    """Whether a fan-in with these counts satisfies ``policy``. A source not read to its end
    meets only ``best_effort``: the items never pulled are unknown, so neither "all" nor a
    fraction of them can be claimed."""
    if policy == "best_effort":
        return True
    if not exhausted:
        return False
    if policy == "all":
        return failed == 0 and missing == 0
    assert isinstance(policy, float)
    return succeeded >= math.ceil(policy * total - 1e-9)


class FanHost(attempts.WatchedRun, Protocol):
    """What a fan-out needs from the run it belongs to (the engine's run satisfies it): what
    the attempts' watch needs (an item timeout abandons the item's attempt), and more."""

    executor: Executor
    caps: executors.Capabilities
    ctx: TaskContext
    cv: Context
    closed: bool
    deadline: float
    flow_id: str
    flow_name: str
    observers: tuple[events.RunObserver, ...]

    @property
    def log(self) -> Any:
        """The run's logger."""

    def fan_in(self, i: int, value: Any, error: BaseException | None) -> None:
        """The node's fan-in is complete: record ``value`` or ``error`` as its outcome."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread."""

    def mark_abandoned(self, futs: list[Future[Any]]) -> None:
        """Report futures whose work is no longer waited for."""


class FanOutNode(SchedulingNode[T, FanInResult]):
    """A dynamic fork: override [`items`][taskflow.kinds.fanout.FanOutNode.items] and [`work`][taskflow.kinds.fanout.FanOutNode.work].

    Args:
        param: passed to ``items``.
        name: defaults to the class name.
        max_concurrency: items in flight at most (>= 1).
        item_timeout: seconds one item may take (None: no limit).
        policy: ``"all"`` (every item must succeed), a quorum fraction in (0, 1] of the distinct
            items pulled, or ``"best_effort"`` (always succeeds, listing what failed/is missing).
        timeout: the node's own deadline for the whole fan-out (None: the run's budget).
        join: the join policy over the node's fathers.
        batch: a [`Batch`][taskflow.Batch] that answers the items instead of ``work`` (each
            item's key: the item, or the batch's ``key(ctx, item)``); ``max_concurrency`` then
            bounds the batch calls in flight. Not with ``item_timeout``.
    """

    node_kind: ClassVar[NodeKind] = NodeKind.FANOUT
    _called_as: ClassVar[dict[str, str]] = {
        "task": "(ctx, param)", "items": "(ctx, param)", "work": "(ctx, item)"}
    max_concurrency: int
    item_timeout: float | None
    policy: str | float

    def __init__(self, param: T | None = None, *, name: str | None = None,
                 max_concurrency: int = 8, item_timeout: float | None = None,
                 policy: str | float = "all", timeout: float | None = None,
                 join: Join = Join.ALL, batch: Any = None,
                 **unknown: NoReturn) -> None:
        if unknown:
            refuse_options(name if name is not None else type(self).__name__, type(self),
                           unknown, upto=FanOutNode)
        super().__init__(param, name=name, timeout=timeout, join=join, batch=batch)
        d = self.__dict__
        d["max_concurrency"] = _check_concurrency(max_concurrency)
        d["item_timeout"] = check_node_timeout(item_timeout, self.name, "item_timeout")
        d["policy"] = _check_policy(policy)
        _check_batched_items(self.name, d["item_timeout"], batch)

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "retries" and value != 0 and self.__dict__.get("_run", 1) is None:
            raise ValueError(
                f"node {self.name!r}: a FanOutNode does not retry (its items ran or are running); "
                "handle transient item failures in work() or re-run the failed ids"
            )
        if key in _FAN_OPTIONS and self.__dict__.get("_run", 1) is None:
            if key == "max_concurrency":
                value = _check_concurrency(value)
            elif key == "item_timeout":
                value = check_node_timeout(value, self.name, "item_timeout")
            else:
                value = _check_policy(value)
            if key == "item_timeout":
                _check_batched_items(self.name, value, self.__dict__.get("batch"))
            self.__dict__[key] = value
            self._touch()
            return
        if key == "batch" and self.__dict__.get("_run", 1) is None:
            _check_batched_items(self.name, self.__dict__.get("item_timeout"), value)
        super().__setattr__(key, value)

    def items(self, ctx: TaskContext, param: T) -> Iterable[tuple[Hashable, Any]]:
        """Yield ``(item_id, item)`` pairs; pulled lazily, ids must be hashable and stable."""
        raise NotImplementedError

    def work(self, ctx: TaskContext, item: Any) -> Any:
        """Process one item (on an executor worker, or in another process)."""
        raise NotImplementedError

    def task(self, ctx: TaskContext, param: T) -> FanInResult:
        """Not called by the engine (it schedules ``work`` per item); runs the items one after
        another, for calling a fan-out directly outside a flow."""
        succeeded: dict[Hashable, Any] = {}
        failed: dict[Hashable, BaseException] = {}
        dup = 0
        for item_id, item in self.items(ctx, param):
            if item_id in succeeded or item_id in failed:
                dup += 1
                continue
            try:
                succeeded[item_id] = self.work(ctx, item)
            except Exception as exc:  # noqa: BLE001 - an item's failure is recorded
                failed[item_id] = exc
        return FanInResult(not failed, succeeded, failed, [], dup)

    def open_fan_out(self, host: FanHost, i: int) -> FanOut:
        """The engine's entry (``NodeKind.FANOUT``): this node's fan-out in run ``host``, as node
        ``i``; the engine calls its ``start()`` outside the run's lock."""
        return FanOut(host, i, self)

    def _check_definition(self) -> None:
        cls = type(self)
        for method in ("items", "work") if self.__dict__.get("batch") is None else ("items",):
            if getattr(cls, method) is getattr(FanOutNode, method):
                raise FlowDefinitionError(
                    f"node {self.name!r}: {cls.__name__} does not implement {method}()"
                )
            if _is_async(getattr(cls, method)):
                raise FlowDefinitionError(
                    f"node {self.name!r}: {cls.__name__}.{method} cannot be async def: a "
                    f"fan-out calls it on the executor and never awaits it; {_NO_AWAIT}")


def _is_async(fn: object) -> bool:
    """Whether ``fn`` is written ``async def``: a coroutine function, or an async generator
    function (``async def`` with ``yield``: its call makes an object nothing iterates)."""
    flags = getattr(getattr(fn, "__code__", None), "co_flags", 0)
    return is_coroutine_function(fn) or bool(flags & _CO_ASYNC_GENERATOR)


_CO_ASYNC_GENERATOR = 0x200  # inspect.CO_ASYNC_GENERATOR

# what a fan-out whose items would be coroutines can do instead
_NO_AWAIT = ("write it as a plain def that makes the call itself (asyncio.run(...) for an async "
             "client), or make each item an async node of the flow")


def work_returned_coroutine(name: str, coro: Any) -> TypeError:
    """The error of an item whose ``work`` (a plain def) returned coroutine ``coro``, which
    nothing would await; the coroutine is closed."""
    return returned_coroutine(f"node {name!r}", coro, "its work()",
                              "a fan-out's items run on the executor: " + _NO_AWAIT)


class FanOut:
    """One fan-out in one run (see the module docstring); a ``loops.LoopOwner`` of its item
    loops."""

    def __init__(self, run: FanHost, i: int, node: FanOutNode[Any]) -> None:
        self.run = run
        # items (and the items() generator) run in the contextvars the node's attempt has (the
        # caller's, and what observers set there, such as the node's trace span)
        self.cv = contextvars.copy_context()
        self.executor = run.executor
        self.i = i
        self.node = node
        self.name = node.name
        self.max_c: int = node.max_concurrency
        self.item_timeout: float | None = node.item_timeout
        self.policy: str | float = node.policy
        self.lock = threading.Lock()  # guards everything below but `it`
        self.pull_lock = threading.Lock()  # serialises next(it)
        self.it: Iterator[tuple[Hashable, Any]] | None = None
        self.exhausted = False
        self.done = False
        self.duplicates = 0
        self.succeeded: dict[Hashable, Any] = {}
        self.failed: dict[Hashable, BaseException] = {}
        self.inflight: dict[Hashable, int] = {}  # item id -> loop token (remote: 0)
        self.timers: dict[Hashable, timer.Timer] = {}
        self.started: dict[Hashable, float] = {}  # item id -> when its work started
        self.loop_futs: dict[int, Future[Any]] = {}  # item-loop token -> its future
        self.remote_futs: dict[Hashable, Future[Any]] = {}
        self.loops = 0
        self.tokens = 0
        self.abandoned: set[int] = set()
        self.unstarted: set[int] = set()  # item-loop tokens submitted but not started
        self.live: set[int] = set()  # item-loop tokens submitted and not exited
        self.remote = run.caps.remote
        self.entries: dict[str, Any] = {}
        self.reserved = 0  # remote: slots taken by a pump while it pulls (then the item's, in flight)
        self.blob: bytes | None = None  # remote: the node pickled once, without its param
        self.error: BaseException | None = None
        self.batch: Any = node.__dict__.get("batch")  # a taskflow.Batch, or None
        self.seats: dict[Hashable, Any] = {}  # batched: item id -> its seat, until answered

    # -- start and finish -----------------------------------------------------------------------

    def describe(self) -> str:
        return f"fan-out {self.name!r}"

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        self.run.post(fn, *args)

    def start(self) -> None:
        """On the thread that dispatched the node: open the iterator, start pulling."""
        run = self.run
        try:
            self.it = iter(self.node.items(run.ctx, self.node.param))
        except BaseException as exc:  # noqa: BLE001 - items() failing fails the node
            self.error = exc
            self.finish()
            return
        if self.remote:
            self.pump_remote()
        else:
            with self.lock:
                self.loops += 1
            loops.spawn(self, 1)

    def snapshot_locked(self) -> FanInResult:
        """Under ``lock``, with ``done`` set: the final fan-in, in-flight items missing. The maps
        are handed over, not copied: nothing writes them once ``done`` is set."""
        missing = list(self.inflight)
        complete = (not self.failed and not missing and self.exhausted and self.error is None)
        return FanInResult(complete, self.succeeded, self.failed, missing, self.duplicates)

    def abort(self) -> tuple[FanInResult, list[Future[Any]]]:
        """The run closed (budget or cancel) or a join cancelled the node: stop pulling and return
        the partial fan-in, with the futures of the items still running, for the caller to report
        to ``executor.mark_abandoned`` once it holds no lock."""
        with self.lock:
            self.done = True
            result = self.snapshot_locked()
            timers = list(self.timers.values())
            self.timers.clear()
            running = [self.loop_futs[t] for t in set(self.inflight.values())
                       if t in self.loop_futs]
            running += list(self.remote_futs.values())
            seats = self._take_seats_locked()
        for t in timers:
            t.cancel()
        self._leave(seats)
        return result, [f for f in running if not f.done()]

    def item_deadline(self, item_id: Hashable) -> float:
        """The deadline (``clock.now()``) of an item in flight (``inf`` without
        ``item_timeout``), ``-inf`` once it is not in flight (timed out, or the fan-in ended).
        Single dict reads, without ``lock``: the attempts' watch asks under its own lock."""
        if self.done or item_id not in self.inflight:
            return -math.inf
        began = self.started.get(item_id)
        if began is None or self.item_timeout is None:
            return math.inf
        return began + self.item_timeout

    def finish(self, timed_out: bool = False) -> None:
        """Fan in once: evaluate the policy and complete the node (never on the timer thread)."""
        sealed = self.seal(timed_out)
        if sealed is not None:
            self.deliver(*sealed)

    def seal(self, timed_out: bool = False
             ) -> tuple[FanInResult, list[Future[Any]], list[timer.Timer], bool] | None:
        """End the fan-in (state only, safe on the timer thread): what ``deliver`` needs, or
        None if it had already ended."""
        with self.lock:
            if self.done:
                return None
            self.done = True
            result = self.snapshot_locked()
            timers = list(self.timers.values())
            self.timers.clear()
            abandon = [self.loop_futs[t] for t in set(self.inflight.values())
                       if t in self.loop_futs]
            abandon += list(self.remote_futs.values())
            self.inflight.clear()
            seats = self._take_seats_locked()
        self._leave(seats)
        return result, abandon, timers, timed_out

    def deliver(self, result: FanInResult, abandon: list[Future[Any]], timers: list[timer.Timer],
                timed_out: bool) -> None:
        """Complete the node with a sealed fan-in (its hooks run here)."""
        for t in timers:
            t.cancel()
        if abandon:
            self.run.mark_abandoned([f for f in abandon if not f.done()])
        error: BaseException | None = self.error
        if error is None:
            met = policy_met(self.policy, len(result.succeeded), result.total,
                             len(result.failed), len(result.missing), self.exhausted)
            if not met and timed_out:
                error = NodeTimeoutError(self.name, self.node.timeout)
            elif not met:
                error = FanOutPolicyError(self.name, self.policy, result)
        self.run.fan_in(self.i, result, error)

    # -- pulling --------------------------------------------------------------------------------

    def _take_seats_locked(self) -> list[Any]:
        """Under ``lock``, the fan-in ending: the seats of items still waiting for their batch."""
        seats = list(self.seats.values())
        self.seats.clear()
        return seats

    def _leave(self, seats: list[Any]) -> None:
        """The items of those seats no longer want an answer (no lock of the fan-out held)."""
        if seats:
            assert self.batch is not None
            for seat in seats:
                batching.release(self.batch, seat)

    def _pull(self, token: int, spawning: bool = True) -> tuple[Hashable, Any, bool] | None:
        """Next new item, put in flight for loop ``token`` (remote: 0), and whether that item loop
        should start another (then counted in ``loops``); None when the iterator is exhausted or
        failed (recorded) or the fan-in ended. Every id seen is in ``succeeded``, ``failed`` or
        ``inflight`` from the critical section that checks it on."""
        cv = self.cv
        while True:
            if self.done or self.run.closed:
                return None
            pull_lock = self.pull_lock
            if not pull_lock.acquire(False):  # its holder may be in the source, in clock.sleep
                clock.acquire(pull_lock)
            try:
                if self.exhausted:
                    return None
                try:
                    assert self.it is not None
                    # the generator's body runs in the caller's contextvars too
                    item_id, item = cv.copy().run(next, self.it)
                except StopIteration:
                    self.exhausted = True
                    return None
                except BaseException as exc:  # noqa: BLE001 - items() failing fails the node
                    self.exhausted = True
                    self.error = exc
                    return None
            finally:
                pull_lock.release()
            with self.lock:
                try:
                    if (item_id in self.succeeded or item_id in self.failed
                            or item_id in self.inflight):
                        self.duplicates += 1
                        continue
                except TypeError as exc:
                    self.error = TypeError(f"node {self.name!r}: item id {item_id!r} is not hashable")
                    self.error.__cause__ = exc
                    self.exhausted = True
                    return None
                if not self._register(item_id, token):
                    return None
                # a loop already queued behind this one on this thread (the executor ran it in
                # ``submit``) will find what is left: do not queue one per item
                spawn = (spawning and token > 0 and self.loops < self.max_c
                         and not self.exhausted and not loops.queued_here(self))
                if spawn:
                    self.loops += 1
                return item_id, item, spawn

    def _register(self, item_id: Hashable, token: int) -> bool:
        """Under ``lock``: mark the item in flight; False if the fan-in already ended."""
        if self.done:
            return False
        self.inflight[item_id] = token
        if self.item_timeout is not None:
            now = clock.now()
            self.started[item_id] = now
            if not math.isinf(self.item_timeout):
                self.timers[item_id] = timer.schedule(
                    now + self.item_timeout, self._item_timeout, item_id, token)
        return True

    def _settle_item(self, item_id: Hashable, token: int, ok: bool, value: Any) -> bool | None:
        """Record an item's outcome. None: dropped (late); True: the fan-in is complete. An item
        that ran past ``item_timeout`` fails with ItemTimeoutError, whoever notices first."""
        with self.lock:
            if self.inflight.get(item_id) != token or self.done:
                return None
            del self.inflight[item_id]
            t = self.timers.pop(item_id, None)
            began = self.started.pop(item_id, None)
            limit = self.item_timeout
            if limit is not None and began is not None and clock.now() - began >= limit:
                ok, value = False, ItemTimeoutError(self.name, item_id, limit)
            if ok:
                self.succeeded[item_id] = value
            else:
                self.failed[item_id] = value
            fin = self.exhausted and not self.inflight and (self.loops == 0 or self.remote)
        if t is not None:
            t.cancel()
        return fin

    # -- thread executors: item loops (loops.LoopOwner) -------------------------------------------

    def loop_refused(self, exc: BaseException) -> None:
        """An item loop was refused or dropped (owner thread): the others carry on at lower
        concurrency; with none left and nothing in flight, the fan-out fails with the executor's
        error."""
        with self.lock:
            self.loops -= 1
            if self.loops > 0 or self.inflight or self.done:
                return
            if self.error is None and not self.exhausted:  # items left that no loop will pull
                self.error = exc
        self.finish()

    def loop_body(self, token: int) -> None:
        """One item loop, in a copy of the caller's contextvars. An exception in taskflow's own
        code here fails the fan-out (and says so) rather than leaving it RUNNING."""
        try:
            self.cv.copy().run(self._item_loop, token)
        except BaseException as exc:  # noqa: BLE001 - a bug must fail the node, not vanish
            self.run.log.opt(exception=True).error("taskflow failed in fan-out {}", self.name)
            with self.lock:
                if self.error is None:
                    self.error = exc
            self.finish()

    def _item_loop(self, token: int) -> None:
        run = self.run
        cur = current
        prev = cur.__dict__.get("run"), cur.__dict__.get("idx")
        cur.run, cur.idx = run, self.i
        node, ctx, cv = self.node, run.ctx, self.cv
        try:
            if self.batch is not None:
                self._batch_loop(token)
                return
            while True:
                nxt = self._pull(token)
                if nxt is None:
                    with self.lock:
                        self.loops -= 1
                        fin = (self.exhausted or self.error is not None) and not self.inflight \
                            and self.loops == 0
                    if fin:
                        self.finish()
                    return
                item_id, item, spawn = nxt
                if spawn:
                    loops.spawn(self, 1)
                cur.item = item_id  # ctx.operation_id tells the items apart
                try:
                    value = cv.copy().run(node.work, ctx, item)
                    if type(value) is CoroutineType:  # nothing would await it
                        raise work_returned_coroutine(self.name, value)
                    ok = True
                except BaseException as exc:  # noqa: BLE001 - an item's failure is recorded
                    value, ok = exc, False
                finally:
                    cur.item = None
                done = self._settle_item(item_id, token, ok, value)
                if not ok and done is not None and run.observers:
                    self._item_failed(item_id, value)
                if done is None:
                    self._late(item_id, ok, value)
                    with self.lock:
                        if token in self.abandoned:  # timed out: a new loop took our place
                            self.abandoned.discard(token)
                            return
        finally:
            cur.run, cur.idx = prev

    # -- batched items ------------------------------------------------------------------------------

    def _batch_loop(self, token: int) -> None:
        """``_item_loop`` when a batch answers the items: chunks of up to its ``max_size``
        items take seats in its calls (see the module docstring)."""
        assert self.batch is not None
        size = self.batch.max_size
        while True:
            chunk = self._pull_chunk(token, size)
            if chunk:
                self._seat_chunk(token, chunk)
            with self.lock:
                stop = not chunk or self.done or len(self.inflight) >= self.max_c * size
                if stop:
                    self.loops -= 1
                    fin = (self.exhausted or self.error is not None) and not self.inflight \
                        and self.loops == 0
            if stop:
                if fin:
                    self.finish()
                return

    def _pull_chunk(self, token: int, size: int) -> list[tuple[Hashable, Any]]:
        """Up to ``size`` new items, in flight for loop ``token``; after a full chunk another
        loop starts (at most ``max_concurrency``) for the next one."""
        chunk: list[tuple[Hashable, Any]] = []
        while len(chunk) < size:
            nxt = self._pull(token, spawning=False)
            if nxt is None:
                break
            chunk.append((nxt[0], nxt[1]))
        if len(chunk) == size:
            with self.lock:
                spawn = (not self.exhausted and not self.done and self.loops < self.max_c
                         and not loops.queued_here(self))
                if spawn:
                    self.loops += 1
            if spawn:
                loops.spawn(self, 1)
        return chunk

    def _seat_chunk(self, token: int, chunk: list[tuple[Hashable, Any]]) -> None:
        """Seat a chunk's items in the batch's calls; run the call this loop closed."""
        batch = self.batch
        assert batch is not None
        ctx = self.run.ctx
        entries: list[tuple[Hashable, Any]] = []
        for item_id, item in chunk:
            try:
                key = batch.key_of(ctx, item, owner=f"item {item_id!r} of node {self.name!r}")
            except Exception as exc:  # noqa: BLE001 - the key function's error is the item's
                self._settle_item(item_id, token, False, exc)
                continue
            entries.append((key, (item_id, token)))
        if not entries:
            return
        seats, call = batching.seat_items(self, batch, entries)
        gone = []
        with self.lock:
            for seat in seats:
                item_id = seat.tag[0]
                if not self.done and self.inflight.get(item_id) == token:
                    self.seats[item_id] = seat
                else:
                    gone.append(seat)  # answered already, or the fan-in ended
        self._leave(gone)
        if call is not None:
            batch.execute(call)

    def items_answered(self, answers: list[Any]) -> None:
        """A batch call answered some of the items (the thread that resolved it, which may be
        one that must not run user code): settle them; the fan-in or a new item loop goes to
        the run's owner."""
        fin = False
        failed = []
        for seat, value, error in answers:
            item_id, token = seat.tag
            with self.lock:
                self.seats.pop(item_id, None)
            done = self._settle_item(item_id, token, error is None,
                                     value if error is None else error)
            fin = fin or bool(done)
            if error is not None and done is not None:
                failed.append((item_id, error))
        with self.lock:
            respawn = (not fin and not self.done and not self.exhausted and self.loops == 0
                       and self.error is None)
            if respawn:
                self.loops += 1
        if failed and self.run.observers:
            for item_id, error in failed:
                self.run.post(self._item_failed, item_id, error)
        if fin:
            self.run.post(self.finish)
        elif respawn:
            self.run.post(loops.spawn, self, 1)

    def _item_failed(self, item_id: Hashable, error: BaseException) -> None:
        """Tell the run's observers that an item raised."""
        events.event(self.run.observers, self.i, "item_failed", {"item": item_id, "error": error})

    def _late(self, item_id: Hashable, ok: bool, value: Any) -> None:
        """An item's outcome arrived after its timeout or the fan-in: dropped, but audited."""
        self.run.log.bind(node=self.name).warning(
            "late {} of item {!r} of fan-out {} dropped: {!r}",
            "result" if ok else "exception", item_id, self.name, value)

    def _item_timeout(self, item_id: Hashable, token: int) -> None:
        """Timer thread: an item overran ``item_timeout``: record it, abandon its loop, and hand
        the replacement loop (or the fan-in) to the run's owner."""
        with self.lock:
            if self.inflight.get(item_id) != token or self.done:
                return
            del self.inflight[item_id]
            self.timers.pop(item_id, None)
            self.started.pop(item_id, None)
            assert self.item_timeout is not None
            self.failed[item_id] = ItemTimeoutError(self.name, item_id, self.item_timeout)
            fut = None
            if not self.remote:
                self.abandoned.add(token)
                self.loops -= 1
                fut = self.loop_futs.get(token)
                replace = not self.exhausted
                if replace:
                    self.loops += 1
            else:
                fut = self.remote_futs.pop(item_id, None)
                replace = False
            fin = self.exhausted and not self.inflight and (self.loops == 0 or self.remote)
        if self.run.watch is not None:  # the item's attempt is abandoned (its on_cancel)
            attempts.abandon(self.run, (self.i,), item=item_id)
        self.run.post(self._after_item_timeout, fut, fin, replace)

    def _after_item_timeout(self, fut: Future[Any] | None, fin: bool, replace: bool) -> None:
        """Owner thread: what an item timeout leaves to do."""
        if fut is not None and not fut.done():
            self.run.mark_abandoned([fut])
        if fin:
            self.finish()
        elif replace:
            loops.spawn(self, 1)
        elif self.remote:
            self.pump_remote()

    # -- remote executors: one submission per item --------------------------------------------------

    def pump_remote(self) -> None:
        """Owner thread: keep up to ``max_concurrency`` items submitted."""
        run = self.run
        pickler = executors.pickler(run.caps)
        ename = type(run.executor).__name__
        while True:
            with self.lock:
                if self.done or len(self.inflight) + self.reserved >= self.max_c:
                    return
                self.reserved += 1
            nxt: tuple[Hashable, Any, bool] | None = None
            try:
                nxt = self._pull(0)
            finally:
                with self.lock:
                    self.reserved -= 1  # the slot is the item's now (in flight), or nobody's
                    fin = nxt is None and not self.inflight and not self.reserved
            if nxt is None:
                if fin:
                    self.finish()
                return
            item_id, item, _ = nxt
            error: BaseException | None = None
            if self.blob is None:
                travel = object.__new__(type(self.node))
                travel.__dict__.update(self.node.__getstate__())
                travel.__dict__["param"] = None  # the manifest stays here: items travel one by one
                error = remote.preflight_pickle(pickler, ename, self.name,
                                                (travel, None, run.ctx.snapshot(), {}))
                if error is None:
                    self.blob = pickler.dumps(travel)
                    self.entries = run.ctx.snapshot()
            if error is None:
                error = remote.preflight_pickle(pickler, ename, self.name, (None, item, {}, {}))
                if error is not None:
                    error = TypeError(str(error).replace("its param", f"item {item_id!r}"))
            args: tuple[Any, ...] = (self.blob, item, self.entries, {},
                                     run.deadline - clock.now(), run.flow_id, run.flow_name,
                                     run.caps.cloudpickle)
            fut: Any = None
            if error is None:
                try:
                    fut = run.executor.submit(remote.remote_work, *args)
                    if not isinstance(fut, Future):
                        raise TypeError(
                            f"{ename}.submit returned {type(fut).__name__}, not a Future")
                except BaseException as exc:  # noqa: BLE001
                    error = exc
                    fut = None
            with self.lock:
                if self.done:
                    return
                if fut is not None and self.inflight.get(item_id) == 0:
                    self.remote_futs[item_id] = fut
            if fut is None:
                assert error is not None
                if self._settle_item(item_id, 0, False, error):
                    self.finish()
                    return
                continue
            fut.add_done_callback(partial(self._post_remote_done, item_id))

    def _post_remote_done(self, item_id: Hashable, fut: Future[Any]) -> None:
        """Done-callback of a remote item (the executor's thread): hand it to the owner."""
        self.run.post(self._remote_done, item_id, fut)

    def _remote_done(self, item_id: Hashable, fut: Future[Any]) -> None:
        """Owner thread: a remote item ended."""
        with self.lock:
            if self.remote_futs.get(item_id) is fut:
                del self.remote_futs[item_id]
        value: Any
        if fut.cancelled():
            ok, value = False, TimeoutError("cancelled by the executor")
        else:
            exc = fut.exception()
            ok, value = (True, fut.result()) if exc is None else (False, exc)
        done = self._settle_item(item_id, 0, ok, value)
        if not ok and done is not None and self.run.observers:
            self._item_failed(item_id, value)
        if done is None:
            self._late(item_id, ok, value)
        if done:
            self.finish()
        else:
            self.pump_remote()
