"""Resilience options on async nodes: an ``async def`` task passes the same gates as a plain one
(bulkhead, rate limit, breaker, min_budget, single flight and cache, fallback, retry budget,
priority, batch), a waiting async node parks without a worker or a task, and what a gate gave an
async attempt goes back however the attempt ends (returned, timed out, cancelled, never
started), never on the loop thread. Options async nodes do not support yet are refused by
name before anything runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, PROMPT, SHORT
from resilience_helpers import wait_until

from taskflow import (
    Batch,
    Bulkhead,
    CircuitBreaker,
    FunctionNode,
    Hedge,
    Join,
    RateLimit,
    ResultState,
    RetryBudget,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    TaskSupport,
)
from taskflow.cache import LruCache
from taskflow.engine import aio
from taskflow.errors import BulkheadFullError, CircuitOpenError
from taskflow.testing import FakeClock

KINDS = ["sync", "async"]
LOOP = aio.LOOP_THREAD


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4, thread_name_prefix="guards-pool") as p:
        yield p


class Gate:
    """Opened once from any thread; waited on by a plain task (blocking) or an async one
    (awaiting, on its loop: it holds no thread)."""

    def __init__(self) -> None:
        self.is_open = threading.Event()
        self.lock = threading.Lock()
        self.waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def open(self) -> None:
        with self.lock:
            self.is_open.set()
            waiters, self.waiters = self.waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_settle, fut)

    def wait(self) -> None:
        assert self.is_open.wait(LONG)

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self.lock:
            if self.is_open.is_set():
                return
            self.waiters.append((loop, fut))
        await fut


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Calls:
    """Counts the calls of a task body and what it saw (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0
        self.live = 0
        self.peak = 0
        self.order: list[Any] = []
        self.started = threading.Event()
        self.cancelled = threading.Event()


def task(kind: str, body: Callable[[TaskContext, Any], Any], calls: Calls,
         gate: Gate | None = None, hang: bool = False) -> Callable[..., Any]:
    """A plain or async task: it counts itself in ``calls``, waits at ``gate`` (or, ``hang``,
    for ever: an async one until cancelled), then returns ``body(ctx, p)``."""

    def enter(p: Any) -> None:
        with calls.lock:
            calls.n += 1
            calls.live += 1
            calls.peak = max(calls.peak, calls.live)
            calls.order.append(p)
        calls.started.set()

    def leave() -> None:
        with calls.lock:
            calls.live -= 1

    if kind == "sync":
        def run(ctx: TaskContext, p: Any) -> Any:
            enter(p)
            try:
                if gate is not None:
                    gate.wait()
                return body(ctx, p)
            finally:
                leave()
        return run

    async def run_async(ctx: TaskContext, p: Any) -> Any:
        enter(p)
        try:
            if hang:
                await asyncio.get_running_loop().create_future()
            if gate is not None:
                await gate.wait_async()
            else:
                await asyncio.sleep(0)  # a real await: other tasks run meanwhile
            return body(ctx, p)
        except asyncio.CancelledError:
            calls.cancelled.set()
            raise
        finally:
            leave()
    return run_async


def echo(ctx: TaskContext, p: Any) -> Any:
    return p


def boom(ctx: TaskContext, p: Any) -> Any:
    raise ConnectionError(f"backend down for {p!r}")


def states(result: Any) -> dict[str, ResultState]:
    return dict(result.states())


# -- bulkhead ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_bulkhead_lets_one_attempt_in_at_a_time_and_the_others_wait(
        kind: str, pool: ThreadPoolExecutor) -> None:
    bulkhead = Bulkhead(f"one-{kind}", max_concurrent=1)
    calls = Calls()
    nodes = [FunctionNode(task(kind, echo, calls), k, name=f"n{k}", bulkhead=bulkhead)
             for k in range(5)]
    result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert result.outputs == {f"n{k}": k for k in range(5)}
    assert calls.peak == 1
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_bulkhead_fails_the_node_without_calling_it(
        kind: str, pool: ThreadPoolExecutor) -> None:
    bulkhead = Bulkhead(f"full-{kind}", max_concurrent=1, max_waiting=0)
    held = bulkhead.try_acquire()
    assert held is not None
    calls = Calls()
    node = FunctionNode(task(kind, echo, calls), name="n", bulkhead=bulkhead)
    try:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    finally:
        held.release()
    wr = result.result_of("n")
    assert wr.state is ResultState.EXCEPTION and isinstance(wr.exception, BulkheadFullError)
    assert calls.n == 0


def test_an_async_node_parked_on_a_bulkhead_holds_no_worker() -> None:
    bulkhead = Bulkhead("parked", max_concurrent=1)
    gate, calls = Gate(), Calls()
    holder = FunctionNode(task("async", echo, calls, gate), "holder", name="holder",
                          bulkhead=bulkhead)
    waiter = FunctionNode(task("async", echo, calls), "waiter", name="waiter",
                          bulkhead=bulkhead)
    with ThreadPoolExecutor(1, thread_name_prefix="one-worker") as one:
        future = TaskScheduling.submit([holder, waiter], executor=one, timeout=LONG)
        assert calls.started.wait(PROMPT)  # the holder's task runs, holding the slot
        wait_until(lambda: bulkhead.waiting == 1)  # the waiter is parked for the slot
        # the one worker is free: another flow's plain node runs on it meanwhile
        other = TaskScheduling.start(FunctionNode(echo, "other", name="other"), executor=one,
                                     timeout=LONG)
        assert other.outputs == {"other": "other"}
        assert calls.order == ["holder"]
        gate.open()
        result = future.result(LONG)
    assert result.outputs == {"holder": "holder", "waiter": "waiter"}
    assert calls.order == ["holder", "waiter"]
    assert (bulkhead.in_use, bulkhead.waiting) == (0, 0)


def _abandoned(way: str, bulkhead: Bulkhead, breaker: CircuitBreaker | None,
               pool: ThreadPoolExecutor) -> tuple[Any, Calls]:
    """A run whose async node ``hang`` (holding a slot of ``bulkhead``) is abandoned ``way``."""
    calls = Calls()
    opts: dict[str, Any] = {"bulkhead": bulkhead, "breaker": breaker}
    budget = LONG
    if way == "node timeout":
        opts["timeout"] = SHORT
    elif way == "run budget":
        budget = SHORT
    hang = FunctionNode(task("async", echo, calls, hang=True), name="hang", **opts)
    if way == "ctx.cancel":
        def stop(ctx: TaskContext, p: Any) -> str:
            assert calls.started.wait(PROMPT)
            ctx.cancel("page closed")
            return "stopped"
        nodes = [hang, FunctionNode(stop)]
    elif way == "join":
        async def quick(ctx: TaskContext, p: Any) -> str:
            await asyncio.get_running_loop().run_in_executor(None, calls.started.wait, PROMPT)
            return "quick"
        first = FunctionNode(echo, "joined", name="first", join=Join.ANY)
        hang >> first
        FunctionNode(quick) >> first
        nodes = [first]
    else:
        nodes = [hang]
    if way == "run budget":
        # on virtual time the budget ends once the attempt hangs, never before it started (on
        # the wall clock a loaded machine may spend the whole budget before the loop runs it)
        with FakeClock(autojump=True):
            return TaskScheduling.start(nodes, executor=pool, timeout=budget), calls
    return TaskScheduling.start(nodes, executor=pool, timeout=budget), calls


WAYS = ["node timeout", "run budget", "ctx.cancel", "join"]


@pytest.mark.parametrize("way", WAYS)
def test_an_abandoned_async_attempt_gives_its_bulkhead_slot_back(
        way: str, pool: ThreadPoolExecutor) -> None:
    bulkhead = Bulkhead(f"abandoned-{way}", max_concurrent=1)
    result, calls = _abandoned(way, bulkhead, None, pool)
    assert result.result_of("hang").state in (ResultState.TIMEOUT, ResultState.CANCELLED)
    assert calls.cancelled.wait(PROMPT)  # cancelled for real
    wait_until(lambda: bulkhead.in_use == 0, PROMPT)
    assert bulkhead.waiting == 0
    again = TaskScheduling.start(FunctionNode(task("async", echo, Calls()), "ok", name="ok",
                                              bulkhead=bulkhead), executor=pool, timeout=LONG)
    assert again.outputs == {"ok": "ok"}


def test_an_async_attempt_cancelled_before_its_task_starts_gives_its_slot_back(
        pool: ThreadPoolExecutor) -> None:
    bulkhead = Bulkhead("never-started", max_concurrent=1)
    calls = Calls()
    node = FunctionNode(task("async", echo, calls, hang=True), name="hang", bulkhead=bulkhead)
    for _ in range(50):  # budgets so short that many runs end before the task is created
        TaskScheduling.start(node, executor=pool, timeout=0.0005)
    wait_until(lambda: bulkhead.in_use == 0, PROMPT)
    assert bulkhead.waiting == 0


def test_a_slot_an_async_attempt_gives_back_is_never_handed_on_on_the_loop_thread(
        pool: ThreadPoolExecutor) -> None:
    bulkhead = Bulkhead("handoff", max_concurrent=1)
    gate, calls = Gate(), Calls()
    node = FunctionNode(task("async", echo, calls, gate), "x", name="x", bulkhead=bulkhead)
    future = TaskScheduling.submit(node, executor=pool, timeout=LONG)
    assert calls.started.wait(PROMPT)
    granted: list[str] = []
    done = threading.Event()

    def on_grant(permit: Any) -> None:  # user code: must not run on the loop thread
        granted.append(threading.current_thread().name)
        permit.release()
        done.set()

    ticket = bulkhead.acquire(on_grant)
    assert ticket is not None and not done.is_set()
    gate.open()
    assert future.result(LONG).outputs == {"x": "x"}
    assert done.wait(PROMPT)
    assert granted and granted[0] != LOOP


# -- breaker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_breaker_counts_a_timed_out_attempt_as_failed_and_opens(
        kind: str, pool: ThreadPoolExecutor) -> None:
    breaker = CircuitBreaker(f"timeout-{kind}", min_calls=1, window=1, open_for=LONG)
    gate, calls = Gate(), Calls()
    body = task(kind, echo, calls, gate) if kind == "sync" else task(kind, echo, calls,
                                                                     hang=True)
    node = FunctionNode(body, name="call", timeout=SHORT, breaker=breaker)
    try:
        first = TaskScheduling.start(node, executor=pool, timeout=LONG)
    finally:
        gate.open()  # the plain task's thread cannot be stopped: let it return
    assert first.result_of("call").state is ResultState.TIMEOUT
    m = breaker.metrics()
    assert (m.failures, m.successes, breaker.state.value) == (1, 0, "open")
    second = TaskScheduling.start(node, executor=pool, timeout=LONG)
    wr = second.result_of("call")
    assert wr.state is ResultState.EXCEPTION and isinstance(wr.exception, CircuitOpenError)
    assert calls.n == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_breaker_counts_async_outcomes_as_plain_ones(
        kind: str, pool: ThreadPoolExecutor) -> None:
    breaker = CircuitBreaker(f"count-{kind}", min_calls=4, window=4)
    calls = Calls()
    good = FunctionNode(task(kind, echo, calls), name="good", breaker=breaker)
    bad = FunctionNode(task(kind, boom, calls), name="bad", breaker=breaker)
    for node in (good, bad, good):
        TaskScheduling.start(node, executor=pool, timeout=LONG)
    m = breaker.metrics()
    assert (m.successes, m.failures, breaker.state.value) == (2, 1, "closed")


@pytest.mark.parametrize(("way", "failures"), [
    ("node timeout", 1), ("run budget", 1), ("ctx.cancel", 1), ("join", 0)])
def test_a_breaker_counts_an_abandoned_async_attempt_once_by_how_it_was_abandoned(
        way: str, failures: int, pool: ThreadPoolExecutor) -> None:
    """Out of time or the run closed: a failure (a hanging backend opens the breaker); a
    join that no longer needs the node: nothing (the cancelled call said nothing)."""
    for _ in range(5):  # the slot's return and the run's release race: each order counts once
        breaker = CircuitBreaker(f"abandoned-{way}", min_calls=1, window=1)
        bulkhead = Bulkhead(f"abandoned-{way}", max_concurrent=1)
        _abandoned(way, bulkhead, breaker, pool)
        wait_until(lambda b=bulkhead: b.in_use == 0, PROMPT)  # the attempt was given back
        m = breaker.metrics()
        assert (m.failures, m.successes) == (failures, 0)
        assert breaker.state.value == ("open" if failures else "closed")


# -- rate limit, min_budget ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_limit_parks_the_node_until_its_token(
        kind: str, pool: ThreadPoolExecutor) -> None:
    limit = RateLimit(f"rate-{kind}", per_second=1 / SHORT, burst=1)
    calls = Calls()
    nodes = [FunctionNode(task(kind, echo, calls), k, name=f"n{k}", rate_limit=limit)
             for k in range(3)]
    result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    assert result.outputs == {f"n{k}": k for k in range(3)}
    assert calls.n == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_limit_with_no_token_before_the_deadline_times_the_node_out(
        kind: str, pool: ThreadPoolExecutor) -> None:
    limit = RateLimit(f"dry-{kind}", per_second=1 / (100 * LONG), burst=1)
    calls = Calls()
    nodes = [FunctionNode(task(kind, echo, calls), k, name=f"n{k}", rate_limit=limit)
             for k in range(2)]
    result = TaskScheduling.start(nodes, executor=pool, timeout=MEDIUM)
    assert sorted(states(result).values(), key=str) == sorted(
        [ResultState.SUCCESS, ResultState.TIMEOUT], key=str)
    assert calls.n == 1


@pytest.mark.parametrize("kind", KINDS)
def test_min_budget_refuses_an_attempt_the_budget_cannot_cover(
        kind: str, pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    node = FunctionNode(task(kind, echo, calls), name="n", min_budget=10 * LONG)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.result_of("n").state is ResultState.TIMEOUT
    assert calls.n == 0


# -- single flight and cache --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_runs_share_one_async_call(kind: str, pool: ThreadPoolExecutor) -> None:
    gate, calls = Gate(), Calls()
    node = FunctionNode(task(kind, echo, calls, gate), "v", name="n",
                        share_key=lambda ctx, p: "key")
    flight = node._policy.flight  # type: ignore[attr-defined]
    lead = TaskScheduling.submit(node, executor=pool, timeout=LONG)
    assert calls.started.wait(PROMPT)
    follow = TaskScheduling.submit(node, executor=pool, timeout=LONG)
    wait_until(lambda: flight.metrics().waiting == 1)  # a follower parked, holding nothing
    gate.open()
    first, second = lead.result(LONG), follow.result(LONG)
    assert first.outputs == second.outputs == {"n": "v"}
    assert calls.n == 1
    assert second.result_of("n").shared


@pytest.mark.parametrize("kind", KINDS)
def test_a_cached_value_is_served_without_a_call(kind: str, pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    node = FunctionNode(task(kind, echo, calls), "v", name="n",
                        share_key=lambda ctx, p: "key", cache_ttl=LONG)
    for _ in range(3):
        assert TaskScheduling.start(node, executor=pool, timeout=LONG).outputs == {"n": "v"}
    assert calls.n == 1


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("kind", KINDS)
def test_stale_if_error_serves_the_kept_value_degraded(
        kind: str, pool: ThreadPoolExecutor) -> None:
    clock = _Clock()
    answers: list[Any] = ["kept", ConnectionError("backend down")]

    def body(ctx: TaskContext, p: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    node = FunctionNode(task(kind, body, Calls()), name="n", share_key=lambda ctx, p: "k",
                        cache_ttl=10, cache=LruCache(f"stale-{kind}", clock=clock),
                        stale_if_error=60)
    assert TaskScheduling.start(node, executor=pool, timeout=LONG).outputs == {"n": "kept"}
    clock.now += 30  # past the ttl, within ttl + stale_if_error
    wr = TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("n")
    assert (wr.state, wr.result) == (ResultState.DEGRADED, "kept")
    assert isinstance(wr.exception, ConnectionError)


# -- fallback, retry budget, priority, batch ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_fallback_stands_in_for_a_failed_async_attempt(
        kind: str, pool: ThreadPoolExecutor) -> None:
    node = FunctionNode(task(kind, boom, Calls()), name="n", retries=1, fallback="stand-in")
    wr = TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("n")
    assert (wr.state, wr.result, wr.attempts) == (ResultState.DEGRADED, "stand-in", 2)
    assert isinstance(wr.exception, ConnectionError)


@pytest.mark.parametrize("kind", KINDS)
def test_a_fallback_stands_in_for_an_async_node_whose_father_failed(
        kind: str, pool: ThreadPoolExecutor) -> None:
    calls = Calls()
    father = FunctionNode(boom, name="father")
    son = FunctionNode(task(kind, echo, calls), name="son", fallback="stand-in")
    father >> son
    wr = TaskScheduling.start(son, executor=pool, timeout=LONG).result_of("son")
    assert (wr.state, wr.result) == (ResultState.DEGRADED, "stand-in")
    assert calls.n == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_budget_bounds_the_retries_of_an_async_node(
        kind: str, pool: ThreadPoolExecutor) -> None:
    budget = RetryBudget(f"budget-{kind}", ratio=0.0, min_per_second=0.1, window=10.0)
    calls = Calls()
    node = FunctionNode(task(kind, boom, calls), name="n", retries=3, retry_budget=budget)
    wr = TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("n")
    assert wr.state is ResultState.EXCEPTION
    assert (wr.attempts, calls.n, wr.retry_refused) == (2, 2, True)  # one token in reserve
    m = budget.metrics()
    assert (m.attempts, m.retries, m.refused) == (1, 1, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_priority_orders_async_nodes_as_plain_ones(kind: str) -> None:
    calls = Calls()
    root = FunctionNode(echo, "root", name="root")
    sons = [FunctionNode(task(kind, echo, calls), p, name=f"p{p}", priority=p)
            for p in (0, 5, 1, 3)]
    root >> sons
    with ThreadPoolExecutor(1, thread_name_prefix="priority") as one:
        result = TaskScheduling.start(root, executor=one, timeout=LONG)
    assert result.ok, result.summary
    assert calls.order == [5, 3, 1, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_answers_async_nodes_with_one_call(kind: str, pool: ThreadPoolExecutor) -> None:
    keys_seen: list[list[Any]] = []

    def get_many(keys: Any) -> dict[Any, Any]:
        keys_seen.append(sorted(keys))
        return {k: f"v-{k}" for k in keys}

    batch = Batch(f"batch-{kind}", get_many)
    calls = Calls()
    root = FunctionNode(echo, "root", name="root")
    nodes = [FunctionNode(task(kind, echo, calls), k, name=f"n{k}", batch=batch)
             for k in range(4)]
    root >> nodes
    result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert {f"n{k}": result.result_of(f"n{k}").result for k in range(4)} == {
        f"n{k}": f"v-{k}" for k in range(4)}
    assert keys_seen == [[0, 1, 2, 3]]
    assert calls.n == 0  # a batched node's own task is never called


@pytest.mark.parametrize("kind", KINDS)
def test_an_async_def_batch_function_answers_async_nodes_with_one_call(
        kind: str, pool: ThreadPoolExecutor) -> None:
    keys_seen: list[list[Any]] = []

    async def get_many(keys: Any) -> dict[Any, Any]:
        keys_seen.append(sorted(keys))
        await asyncio.sleep(0)
        return {k: f"v-{k}" for k in keys}

    batch = Batch(f"async-batch-{kind}", get_many)
    root = FunctionNode(echo, "root", name="root")
    nodes = [FunctionNode(task(kind, echo, Calls()), k, name=f"n{k}", batch=batch)
             for k in range(3)]
    root >> nodes
    result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok, result.summary
    assert [result.result_of(f"n{k}").result for k in range(3)] == ["v-0", "v-1", "v-2"]
    assert keys_seen == [[0, 1, 2]]


# -- hedge ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_hedged_duplicate_answers_for_a_slow_attempt(
        kind: str, pool: ThreadPoolExecutor) -> None:
    gate, calls = Gate(), Calls()
    bulkhead = Bulkhead(f"hedge-{kind}", max_concurrent=2)
    breaker = CircuitBreaker(f"hedge-{kind}", min_calls=1, window=1)

    def body(ctx: TaskContext, p: Any) -> Any:
        return len(calls.order)

    slow = task(kind, body, calls, gate) if kind == "sync" else task(kind, body, calls,
                                                                     hang=True)
    fast = task(kind, body, calls)
    state = {"n": 0}

    def pick() -> Callable[..., Any]:
        state["n"] += 1
        return slow if state["n"] == 1 else fast

    if kind == "sync":
        def first_slow(ctx: TaskContext, p: Any) -> Any:
            return pick()(ctx, p)
    else:
        async def first_slow(ctx: TaskContext, p: Any) -> Any:  # type: ignore[misc]
            return await pick()(ctx, p)

    node = FunctionNode(first_slow, name="n", hedge=Hedge(after=SHORT), idempotent=True,
                        bulkhead=bulkhead, breaker=breaker)
    try:
        wr = TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("n")
    finally:
        gate.open()  # the slow plain attempt's thread cannot be stopped: let it return
    assert (wr.state, wr.result, wr.hedges) == (ResultState.SUCCESS, 2, 1)
    if kind == "async":
        assert calls.cancelled.wait(PROMPT)  # the slow attempt was cancelled for real
    wait_until(lambda: bulkhead.in_use == 0, PROMPT)
    # a plain loser counts when it returns; a cancelled async one says nothing of the backend
    wait_until(lambda: breaker.metrics().successes == (2 if kind == "sync" else 1), PROMPT)
    assert breaker.metrics().failures == 0


def test_a_duplicate_that_loses_the_race_is_cancelled_for_real(
        pool: ThreadPoolExecutor) -> None:
    duplicate_started, duplicate_cancelled = Gate(), threading.Event()
    bulkhead = Bulkhead("hedge-lost", max_concurrent=2)
    state = {"n": 0}

    async def call(ctx: TaskContext, p: Any) -> str:
        state["n"] += 1
        if state["n"] == 1:
            await duplicate_started.wait_async()
            return "first"
        duplicate_started.open()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            duplicate_cancelled.set()
            raise
        return "never"  # pragma: no cover - cancelled

    node = FunctionNode(call, name="n", hedge=Hedge(after=SHORT), idempotent=True,
                        bulkhead=bulkhead)
    wr = TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("n")
    assert (wr.state, wr.result, wr.hedges) == (ResultState.SUCCESS, "first", 1)
    assert duplicate_cancelled.wait(PROMPT)
    wait_until(lambda: bulkhead.in_use == 0, PROMPT)


# -- detach=True and stale_for ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_detached_async_node_is_handed_off_and_ends_by_itself(
        kind: str, pool: ThreadPoolExecutor) -> None:
    gate, calls = Gate(), Calls()
    page = FunctionNode(echo, "page", name="page")
    audit = FunctionNode(task(kind, lambda ctx, p: ctx.result_of("page"), calls, gate),
                         name="audit", detach=True, timeout=LONG)
    page >> audit
    result = TaskScheduling.start(page, executor=pool, timeout=LONG)
    assert result.states() == {"page": ResultState.SUCCESS, "audit": ResultState.DETACHED}
    assert calls.started.wait(PROMPT)
    gate.open()
    wr = result.detached("audit").result(LONG)
    assert (wr.state, wr.result, wr.attempts) == (ResultState.SUCCESS, "page", 1)
    assert (wr.thread == LOOP) is (kind == "async")


@pytest.mark.parametrize("kind", KINDS)
def test_a_detached_async_node_retries_within_its_own_timeout(
        kind: str, pool: ThreadPoolExecutor) -> None:
    calls = Calls()

    def flaky(ctx: TaskContext, p: Any) -> str:
        if calls.n == 1:
            raise ConnectionError("first call fails")
        return "ok"

    page = FunctionNode(echo, "page", name="page")
    audit = FunctionNode(task(kind, flaky, calls), name="audit", detach=True, timeout=LONG,
                         retries=2)
    page >> audit
    result = TaskScheduling.start(page, executor=pool, timeout=LONG)
    wr = result.detached("audit").result(LONG)
    assert (wr.state, wr.result, wr.attempts) == (ResultState.SUCCESS, "ok", 2)


def test_the_timeout_of_a_detached_async_node_cancels_its_task(
        pool: ThreadPoolExecutor) -> None:
    from taskflow.resilience import detached as slots

    calls, callbacks = Calls(), threading.Event()
    seen: list[str] = []

    class Audit(SchedulingNode[Any, Any]):
        async def task(self, ctx: TaskContext, param: Any) -> Any:
            ctx.on_cancel(callbacks.set)
            return await task("async", echo, calls, hang=True)(ctx, param)

        def on_begin(self, support: TaskSupport) -> None:
            seen.append(threading.current_thread().name)

        def on_fail(self, support: TaskSupport) -> None:
            seen.append(threading.current_thread().name)

    before = slots.metrics().running
    page = FunctionNode(echo, "page", name="page")
    page >> Audit(name="audit", detach=True, timeout=SHORT)
    result = TaskScheduling.start(page, executor=pool, timeout=LONG)
    wr = result.detached("audit").result(LONG)
    assert wr.state is ResultState.TIMEOUT
    assert calls.cancelled.wait(PROMPT) and callbacks.wait(PROMPT)  # cancelled for real
    assert len(seen) == 2 and LOOP not in seen  # on_begin and on_fail, off the loop thread
    wait_until(lambda: slots.metrics().running == before, PROMPT)


@pytest.mark.parametrize("kind", KINDS)
def test_stale_for_serves_the_stale_value_while_one_async_refresh_runs(
        kind: str, pool: ThreadPoolExecutor) -> None:
    clock = _Clock()
    cache = LruCache(f"swr-{kind}", clock=clock)
    from taskflow.resilience import detached as slots

    gate, calls = Gate(), Calls()

    def body(ctx: TaskContext, p: Any) -> int:
        return calls.n

    node = FunctionNode(task(kind, body, calls, gate), name="page",
                        share_key=lambda ctx, p: "k", cache_ttl=10, cache=cache,
                        stale_for=60, timeout=LONG)
    gate.open()
    assert TaskScheduling.start(node, executor=pool, timeout=LONG).outputs == {"page": 1}
    gate = Gate()
    node = FunctionNode(task(kind, body, calls, gate), name="page",
                        share_key=lambda ctx, p: "k", cache_ttl=10, cache=cache,
                        stale_for=60, timeout=LONG)
    clock.now += 20
    calls.started.clear()
    done = slots.metrics().succeeded
    served = TaskScheduling.start(node, executor=pool, timeout=LONG).result_of("page")
    assert (served.state, served.result) == (ResultState.SUCCESS, 1)  # at once, stale
    assert calls.started.wait(PROMPT)  # the refresh runs, detached
    gate.open()
    # the refresh stored its value, then gave its detached slot back, counted succeeded
    wait_until(lambda: slots.metrics().succeeded == done + 1, PROMPT)
    assert TaskScheduling.start(node, executor=pool, timeout=LONG).outputs == {"page": 2}
    assert calls.n == 2
    assert cache.metrics().refreshes == 1


