"""FanOutNode: bounded lazy fan-out, dedupe by item id, item timeouts, all / quorum / best-effort
fan-in (docs/concepts/joins.md: the partial-failure table and the 100-file exercise).

Semantics pinned here (taskflow/kinds/fanout.py's module docstring):

* ``missing`` = items pulled and still in flight when the fan-in ends (the node's ``timeout``, or
  the run's budget, which makes the node TIMEOUT with the partial FanInResult as its result).
* At the node's ``timeout`` a met policy (best_effort, or a quorum already reached) succeeds with
  ``complete=False``; an unmet one is TIMEOUT. When all items ended and the policy is not met the
  node is EXCEPTION (FanOutPolicyError); ``work_result.result`` holds the FanInResult either way.
* An item over ``item_timeout`` is in ``failed`` as ItemTimeoutError and a new item loop takes the
  place of the stuck one.
* A source not read to its end when the fan-in ends is never ``complete`` and meets only
  ``best_effort`` (the quorum is a fraction of the distinct items of the whole source).

The tests at the end pin defects found while writing this suite (all fixed).

The tests about when items and fan-outs are given up (item timeouts, the node's timeout, the run's
budget) run on virtual time (the ``fake_clock`` fixture) and assert the exact virtual time the
run ended; a stuck item waits with ``clock.wait``, the plain wait outside a fake clock. The tests
whose source itself waits (the 100-file exercise, a slow listing page) stay on the real clock: a
source waits holding the fan-out's pull lock, and the item loops blocked on that lock are work
the fake clock sees as running, so autojump would never move.
"""

from __future__ import annotations

import contextvars
import math
import multiprocessing
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import EPS, LONG, SHORT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import (
    FlowDefinitionError,
    FunctionNode,
    Join,
    NodeTimeoutError,
    RejectedExecutionError,
    ResultState,
    TaskContext,
    TaskScheduling,
    UpstreamFailedError,
    clock,
)
from taskflow.kinds.fanout import FanInResult, FanOutNode, FanOutPolicyError, ItemTimeoutError

SUCCESS, EXCEPTION, TIMEOUT, CANCELLED = (
    ResultState.SUCCESS, ResultState.EXCEPTION, ResultState.TIMEOUT, ResultState.CANCELLED)


# --- helpers -------------------------------------------------------------------------------------


class Fan(FanOutNode[Any]):
    """A fan-out over ``source`` (an iterable of ``(id, item)``, or a function returning one, called
    once per run); ``work`` is ``fn(item)``."""

    def __init__(self, source: Iterable[tuple[Any, Any]] | Callable[[], Iterable[tuple[Any, Any]]],
                 fn: Callable[[Any], Any] = lambda item: item, **options: Any) -> None:
        options.setdefault("name", "fan")
        super().__init__(None, **options)
        self.source = source
        self.fn = fn

    def items(self, ctx: TaskContext, param: Any) -> Iterable[tuple[Any, Any]]:
        return self.source() if callable(self.source) else self.source

    def work(self, ctx: TaskContext, item: Any) -> Any:
        return self.fn(item)


def numbered(n: int, start: int = 0) -> Callable[[], Iterator[tuple[int, int]]]:
    """Items ``(i, i)`` for i in ``start..start+n-1``, as a fresh generator per run."""
    return lambda: ((i, i) for i in range(start, start + n))


def fail_on(bad: Iterable[Any], exc_type: type[Exception] = ValueError) -> Callable[[Any], Any]:
    """``work`` that raises ``exc_type`` for the items in ``bad`` and returns ``item * 10``."""
    bad = set(bad)

    def fn(item: Any) -> Any:
        if item in bad:
            raise exc_type(f"item {item} is bad")
        return item * 10

    return fn


def fan_in(result: Any, name: str = "fan") -> FanInResult:
    fi = result[name].work_result.result
    assert isinstance(fi, FanInResult), fi
    return fi


def start(nodes: Any, executor: Any, timeout: float | None = LONG) -> Any:
    return TaskScheduling.start(nodes, executor=executor, timeout=timeout)


class AbandonSignallingExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor that implements taskflow's ``mark_abandoned`` protocol (as
    MonitoredExecutor does) and sets ``abandoned`` when taskflow gives up on a running task:
    the test's way of ordering events after an item timeout without sleeping."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.abandoned = threading.Event()

    def mark_abandoned(self, fut: Future[Any]) -> None:
        self.abandoned.set()


class CountingExecutor(ThreadPoolExecutor):
    """Counts ``submit`` calls. Submissions numbered in ``refuse`` (1-based), or any after
    ``refuse_after``, raise RejectedExecutionError; those in ``drop`` return an already cancelled
    Future (what a DISCARD rejection policy does); those in ``defer`` return a pending Future that
    never runs (kept in ``deferred``: cancel it to drop the task later, as DISCARD_OLDEST or
    ``shutdown(cancel_futures=True)`` do). ``returned[n]`` is set when submission n returned."""

    def __init__(self, *args: Any, refuse_after: int | None = None,
                 refuse: frozenset[int] = frozenset(), drop: frozenset[int] = frozenset(),
                 defer: frozenset[int] = frozenset(), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submits = 0
        self.refuse_after = refuse_after
        self.refuse = refuse
        self.drop = drop
        self.defer = defer
        self.deferred: dict[int, Future[Any]] = {}
        self.returned: defaultdict[int, threading.Event] = defaultdict(threading.Event)
        self._count_lock = threading.Lock()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._count_lock:
            self.submits += 1
            n = self.submits
            done = self.returned[n]
        if n in self.refuse or (self.refuse_after is not None and n > self.refuse_after):
            raise RejectedExecutionError(f"test executor refuses submission {n}")
        if n in self.drop or n in self.defer:
            fut: Future[Any] = Future()
            if n in self.drop:
                fut.cancel()
            self.deferred[n] = fut
            return fut

        def task() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                done.set()

        return super().submit(task)


@pytest.fixture
def own_executor() -> Iterator[Callable[..., Any]]:
    """Factory for the executor subclasses above, shut down at teardown (after the gates)."""
    created: list[ThreadPoolExecutor] = []

    def make(cls: type[ThreadPoolExecutor], workers: int, **kwargs: Any) -> Any:
        ex = cls(workers, thread_name_prefix="tfown", **kwargs)
        created.append(ex)
        return ex

    yield make
    for ex in created:
        ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def released(own_executor: Callable[..., Any]) -> Iterator[Callable[[], threading.Event]]:
    """Like conftest's ``gate`` for ``own_executor``: Events all set at teardown, before the
    executors are shut down (it depends on ``own_executor``, so pytest tears it down first)."""
    events: list[threading.Event] = []

    def make() -> threading.Event:
        events.append(threading.Event())
        return events[-1]

    yield make
    for event in events:
        event.set()


# --- the basic contract ----------------------------------------------------------------------------


def test_every_item_runs_once_and_the_fan_in_is_keyed_by_item_id(make_executor):
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def work(i):
        with lock:
            calls[f"id{i}"] += 1
        return i * i

    fan = Fan(lambda: ((f"id{i}", i) for i in range(200)), work, max_concurrency=4)
    result = start(fan, make_executor(4))

    wr = result["fan"].work_result
    assert wr.state is SUCCESS and wr.exception is None
    fi = wr.result
    assert isinstance(fi, FanInResult)
    assert fi.complete is True
    assert fi.succeeded == {f"id{i}": i * i for i in range(200)}
    assert fi.failed == {} and fi.missing == [] and fi.duplicates == 0 and fi.total == 200
    assert calls == Counter({f"id{i}": 1 for i in range(200)})
    assert result.ok and result.outputs["fan"] is fi


def test_items_run_on_the_flows_executor_and_see_the_callers_contextvars(make_executor):
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    token = request_id.set("req-42")
    try:
        fan = Fan(numbered(20), lambda i: (threading.current_thread().name, request_id.get()),
                  max_concurrency=3)
        result = start(fan, make_executor(3, prefix="flowpool"))
    finally:
        request_id.reset(token)

    seen = fan_in(result).succeeded.values()
    assert len(seen) == 20
    assert {var for _, var in seen} == {"req-42"}
    assert all(name.startswith("flowpool") for name, _ in seen), seen


def test_max_concurrency_is_reached_and_never_exceeded(make_executor):
    limit = 3
    running = [0]
    peak = [0]
    lock = threading.Lock()
    # the first `limit` items meet at a barrier: they can only pass it if all run at once
    together = threading.Barrier(limit, timeout=LONG)

    def work(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if i < limit:
                together.wait()
            time.sleep(0.001)  # stands in for work, so items overlap
            return i
        finally:
            with lock:
                running[0] -= 1

    result = start(Fan(numbered(60), work, max_concurrency=limit), make_executor(8))

    assert result["fan"].work_result.state is SUCCESS, result["fan"].work_result.exception
    assert len(fan_in(result).succeeded) == 60
    assert peak[0] == limit


def test_items_are_pulled_lazily_and_never_all_submitted(own_executor):
    n, limit = 20_000, 4
    pulled = [0]
    done = [0]
    ahead = [0]
    lock = threading.Lock()

    def source():
        for i in range(n):
            with lock:
                pulled[0] += 1
            yield i, i

    def work(i):
        with lock:
            ahead[0] = max(ahead[0], pulled[0] - done[0])
        with lock:
            done[0] += 1

    ex = own_executor(CountingExecutor, 8)
    result = start(Fan(source, work, max_concurrency=limit), ex)

    assert result["fan"].work_result.state is SUCCESS
    assert len(fan_in(result).succeeded) == n
    # pulled ahead of completion: only the items in flight (+1 being handed over)
    assert ahead[0] <= limit + 1, ahead[0]
    # one loop for the flow plus at most one per concurrent item: never a future per item
    assert ex.submits <= limit + 2, ex.submits


def test_a_fan_out_completes_on_a_one_worker_pool_next_to_other_nodes(make_executor):
    seen = []
    root = FunctionNode(lambda ctx, p: 5, name="root")
    fan = Fan(numbered(100), lambda i: i + 1, max_concurrency=8)
    other = FunctionNode(lambda ctx, p: "other", name="other")
    sink = FunctionNode(lambda ctx, p: seen.append(len(ctx.result_of("fan").succeeded)), name="sink")
    root >> [fan, other]
    [fan, other] >> sink

    result = start(root, make_executor(1))

    assert result.ok, {n: wr.exception for n, wr in result.failed.items()}
    assert seen == [100]
    assert fan_in(result).succeeded == {i: i + 1 for i in range(100)}


def test_a_fan_out_with_no_items_succeeds_complete_under_every_policy(make_executor):
    ex = make_executor(2)
    for policy in ("all", 0.5, "best_effort"):
        result = start(Fan([], policy=policy), ex)
        fi = fan_in(result)
        assert result["fan"].work_result.state is SUCCESS
        assert (fi.complete, fi.total, fi.succeeded, fi.failed, fi.missing) == (True, 0, {}, {}, [])


def test_hooks_run_once_and_sons_read_the_fan_in(make_executor):
    calls = []

    class Hooked(Fan):
        def on_begin(self, support):
            calls.append(("begin", support.attempt))

        def on_success(self, support):
            calls.append(("success", support.work_result.result.total))

    fan = Hooked(numbered(10), fail_on({3}), policy="best_effort")
    son = FunctionNode(lambda ctx, p: sorted(ctx.result_of("fan").failed), name="son")
    fan >> son
    result = start(fan, make_executor(3))

    assert calls == [("begin", 1), ("success", 10)]
    assert result["son"].work_result.result == [3]
    assert result["fan"].work_result.attempts == 1


def test_submit_returns_a_future_of_the_fan_out(make_executor):
    fut = TaskScheduling.submit(Fan(numbered(50), lambda i: -i), executor=make_executor(2),
                                timeout=LONG)
    result = fut.result(timeout=LONG)
    assert fan_in(result).succeeded == {i: -i for i in range(50)}


# --- dedupe ----------------------------------------------------------------------------------------


def test_duplicate_ids_run_once_and_are_counted_as_duplicates(make_executor, gate):
    a_started, release_a, a_finished = gate(), gate(), gate()
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def source():
        yield "a", "a-first"
        yield "b", "b-first"
        assert a_started.wait(LONG)
        yield "a", "a-while-in-flight"  # redelivered while the first is still running
        release_a.set()
        assert a_finished.wait(LONG)
        yield "a", "a-after-success"  # redelivered after it succeeded
        yield "b", "b-again"
        yield "c", "c-first"

    def work(item):
        with lock:
            calls[item] += 1
        if item == "a-first":
            a_started.set()
            assert release_a.wait(LONG)
            a_finished.set()
        return item

    result = start(Fan(source, work, max_concurrency=2), make_executor(3))

    fi = fan_in(result)
    assert result["fan"].work_result.state is SUCCESS
    assert fi.succeeded == {"a": "a-first", "b": "b-first", "c": "c-first"}
    assert fi.duplicates == 3 and fi.total == 3 and fi.complete
    assert calls == Counter({"a-first": 1, "b-first": 1, "c-first": 1})


def test_a_duplicate_success_never_counts_twice_towards_the_quorum(make_executor):
    # "fan-in 计数不能简单 count += 1": A's success delivered twice must not make 2 of 3
    source = [("A", "ok"), ("A", "ok"), ("B", "bad")]
    fan = Fan(source, fail_on({"bad"}), policy=0.6)
    result = start(fan, make_executor(2))

    wr = result["fan"].work_result
    fi = fan_in(result)
    assert (len(fi.succeeded), len(fi.failed), fi.duplicates, fi.total) == (1, 1, 1, 2)
    # 1 of 2 distinct items is 50 % < 60 %; counting messages (2 of 3) would have passed
    assert wr.state is EXCEPTION
    assert isinstance(wr.exception, FanOutPolicyError)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ids=st.lists(st.integers(0, 12), max_size=40), bad=st.sets(st.integers(0, 12)),
       concurrency=st.integers(1, 4), workers=st.integers(1, 3))
def test_any_id_sequence_runs_each_distinct_id_once_and_counts_the_rest(ids, bad, concurrency,
                                                                       workers):
    # an id comes back while its first delivery is in flight, after it succeeded or after it
    # failed, from item loops racing each other: each distinct id runs exactly once
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def work(item: int) -> int:
        with lock:
            calls[item] += 1
        if item in bad:
            raise ValueError(item)
        return item

    with ThreadPoolExecutor(workers, thread_name_prefix="tfdedupe") as pool:
        fan = Fan(lambda: ((i, i) for i in ids), work, max_concurrency=concurrency,
                  policy="best_effort")
        fi = fan_in(start(fan, pool))

    distinct = set(ids)
    assert calls == Counter(distinct)
    assert fi.succeeded == {i: i for i in distinct - bad}
    assert set(fi.failed) == distinct & bad and fi.missing == []
    assert fi.duplicates == len(ids) - len(distinct)


# --- item timeouts -----------------------------------------------------------------------------------


def test_item_timeout_fails_stuck_items_and_new_loops_keep_max_concurrency(make_executor, gate, fake_clock):
    hung = gate()
    item_timeout = 4 * SHORT
    # items 0 and 1 hang forever: with max_concurrency=2 nothing else could run unless each stuck
    # loop is replaced; items 29 and 30 meet at a barrier, so two live loops must exist at the end
    pair = threading.Barrier(2, timeout=LONG)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def work(i):
        if i in (0, 1):
            clock.wait(hung, None)
            return "late"
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if i in (29, 30):
                pair.wait()
            return i
        finally:
            with lock:
                running[0] -= 1

    fan = Fan(numbered(31), work, max_concurrency=2, item_timeout=item_timeout)
    result = start(fan, make_executor(6))

    wr = result["fan"].work_result
    fi = fan_in(result)
    assert fi.succeeded == {i: i for i in range(2, 31)}
    assert set(fi.failed) == {0, 1} and fi.missing == []
    for item_id, exc in fi.failed.items():
        assert isinstance(exc, ItemTimeoutError) and isinstance(exc, TimeoutError)
        assert (exc.item_id, exc.node) == (item_id, "fan")
        assert f"{item_timeout:g}s" in str(exc)
    assert peak[0] == 2
    assert wr.state is EXCEPTION and isinstance(wr.exception, FanOutPolicyError)
    assert result.elapsed == pytest.approx(item_timeout)  # both stuck items, at their timeout


def test_one_stuck_item_with_max_concurrency_one_does_not_stop_the_others(make_executor, gate, fake_clock):
    hung = gate()
    fan = Fan(numbered(20), lambda i: clock.wait(hung, None) if i == 0 else i, max_concurrency=1,
              item_timeout=4 * SHORT, policy="best_effort")
    result = start(fan, make_executor(3))

    fi = fan_in(result)
    assert result["fan"].work_result.state is SUCCESS
    assert fi.succeeded == {i: i for i in range(1, 20)}
    assert list(fi.failed) == [0] and not fi.complete
    assert result.elapsed == pytest.approx(4 * SHORT)


def test_a_late_result_after_the_fan_in_changes_nothing(make_executor, gate, fake_clock):
    # a stale result after the fan-in -> unchanged
    release, returned = gate(), gate()

    def work(i):
        if i == 0:
            clock.wait(release, None)
            returned.set()
            return "late success"
        return i

    ex = make_executor(3)
    fan = Fan(numbered(5), work, max_concurrency=2, item_timeout=4 * SHORT, policy="best_effort")
    result = start(fan, ex)
    assert result.elapsed == pytest.approx(4 * SHORT)
    wr = result["fan"].work_result
    before = (wr.state, dict(fan_in(result).succeeded), dict(fan_in(result).failed))

    release.set()
    assert returned.wait(LONG)
    ex.shutdown(wait=True)  # the stuck loop has returned and tried to record its result

    fi = fan_in(result)
    assert (wr.state, fi.succeeded, fi.failed) == before
    assert 0 not in fi.succeeded and isinstance(fi.failed[0], ItemTimeoutError)


# --- policies --------------------------------------------------------------------------------------


def test_policy_all_fails_the_node_listing_failed_item_ids_and_sons_fail_fast(make_executor):
    # one batch item fails -> failed/partial, with the failed item ids
    ran = []
    fan = Fan(lambda: ((f"f{i:02d}", i) for i in range(20)), fail_on({3, 11}))
    publish = FunctionNode(lambda ctx, p: ran.append("published"), name="publish")
    fan >> publish
    result = start(fan, make_executor(4))

    wr = result["fan"].work_result
    assert wr.state is EXCEPTION
    err = wr.exception
    assert isinstance(err, FanOutPolicyError) and isinstance(err, RuntimeError)
    assert err.result is wr.result and err.policy == "all" and err.node == "fan"
    assert "18 of 20" in str(err)
    fi = wr.result
    assert sorted(fi.failed) == ["f03", "f11"]
    assert all(isinstance(e, ValueError) for e in fi.failed.values())
    assert len(fi.succeeded) == 18 and not fi.complete
    assert ran == []
    pub = result["publish"].work_result
    assert pub.state is EXCEPTION and isinstance(pub.exception, UpstreamFailedError)
    assert pub.exception.__cause__ is err
    assert not result.ok and "fan" in result.failed


@pytest.mark.parametrize(("failures", "met"), [(2, True), (3, False)])
def test_quorum_fraction_of_distinct_items_decides(make_executor, failures, met):
    fan = Fan(numbered(20), fail_on(range(failures)), policy=0.9)
    son = FunctionNode(lambda ctx, p: sorted(ctx.result_of("fan").failed), name="son")
    fan >> son
    result = start(fan, make_executor(4))

    wr = result["fan"].work_result
    fi = fan_in(result)
    assert len(fi.failed) == failures and not fi.complete
    if met:  # 18 of 20 >= 90 %
        assert wr.state is SUCCESS
        assert result["son"].work_result.result == list(range(failures))
    else:  # 17 of 20 < 90 %
        assert wr.state is EXCEPTION and isinstance(wr.exception, FanOutPolicyError)
        assert result["son"].work_result.state is EXCEPTION


@pytest.mark.parametrize(("failures", "met"), [(93, True), (94, False)])
def test_quorum_threshold_is_exact_when_the_fraction_is_not_exact_in_binary(
        make_executor, failures, met):
    # 0.07 * 100 == 7.000000000000001: 7 successes of 100 meet a 7 % quorum
    assert 0.07 * 100 > 7
    result = start(Fan(numbered(100), fail_on(range(failures)), policy=0.07), make_executor(4))
    assert (result["fan"].work_result.state is SUCCESS) is met


def test_policy_one_is_a_quorum_of_every_item(make_executor):
    ex = make_executor(2)
    assert start(Fan(numbered(10), policy=1), ex)["fan"].work_result.state is SUCCESS
    assert start(Fan(numbered(10), fail_on({4}), policy=1.0), ex)["fan"].work_result.state \
        is EXCEPTION


def test_best_effort_succeeds_even_when_every_item_fails(make_executor):
    result = start(Fan(numbered(6), fail_on(range(6)), policy="best_effort"), make_executor(2))
    wr = result["fan"].work_result
    assert wr.state is SUCCESS and wr.exception is None
    assert sorted(wr.result.failed) == list(range(6)) and not wr.result.complete


@pytest.mark.parametrize(("policy", "state"), [
    ("all", TIMEOUT), (0.95, TIMEOUT), (0.5, SUCCESS), ("best_effort", SUCCESS)])
def test_node_timeout_lists_in_flight_items_as_missing_and_the_policy_decides(
        make_executor, gate, fake_clock, policy, state):
    hung = gate()
    ran = []
    fan = Fan(numbered(10), lambda i: clock.wait(hung, None) if i == 3 else i, max_concurrency=4,
              timeout=4 * SHORT, policy=policy)
    son = FunctionNode(lambda ctx, p: ran.append(ctx.result_of("fan").missing), name="son")
    fan >> son
    result = start(fan, make_executor(5))

    assert result.elapsed == pytest.approx(4 * SHORT)  # at the fan-out's timeout
    wr = result["fan"].work_result
    fi = wr.result
    assert isinstance(fi, FanInResult)
    assert fi.missing == [3] and len(fi.succeeded) == 9 and not fi.complete
    assert wr.state is state
    if state is TIMEOUT:  # 9 of 10 does not meet 95 %
        assert isinstance(wr.exception, NodeTimeoutError) and ran == []
    else:
        assert ran == [[3]]


def test_run_budget_ends_the_fan_out_with_its_partial_fan_in(make_executor, gate, fake_clock):
    hung = gate()
    pulled = [0]

    def source():
        for i in range(1000):
            pulled[0] += 1
            yield i, i

    def work(i):
        if i == 2:
            clock.wait(hung, None)
        return i

    ex = make_executor(4)
    fan = Fan(source, work, max_concurrency=2, policy="best_effort")
    result = start(fan, ex, timeout=4 * SHORT)

    assert result.elapsed == pytest.approx(4 * SHORT)
    wr = result["fan"].work_result
    assert wr.state is TIMEOUT
    assert isinstance(wr.exception, NodeTimeoutError) and "budget" in str(wr.exception)
    fi = wr.result
    assert isinstance(fi, FanInResult) and 2 in fi.missing and not fi.complete
    pulled_at_end = pulled[0]
    hung.set()
    ex.shutdown(wait=True)  # every item loop has returned
    assert pulled[0] <= pulled_at_end + 1  # a loop mid-pull may take one more, never the rest
    assert 2 not in fi.succeeded


# --- bad parameters and bad sources -------------------------------------------------------------


@pytest.mark.parametrize(("options", "exc_type", "message"), [
    ({"policy": 0}, ValueError, "quorum fraction must be in (0, 1]"),
    ({"policy": 0.0}, ValueError, "quorum fraction must be in (0, 1]"),
    ({"policy": -0.5}, ValueError, "quorum fraction must be in (0, 1]"),
    ({"policy": 1.5}, ValueError, "quorum fraction must be in (0, 1]"),
    ({"policy": math.nan}, ValueError, "quorum fraction must be in (0, 1]"),
    ({"policy": math.inf}, ValueError, "quorum fraction must be in (0, 1]"),
    ({"policy": "most"}, TypeError, "policy must be 'all', 'best_effort' or a quorum fraction"),
    ({"policy": True}, TypeError, "policy must be 'all', 'best_effort' or a quorum fraction"),
    ({"policy": None}, TypeError, "policy must be 'all', 'best_effort' or a quorum fraction"),
    ({"max_concurrency": 0}, ValueError, "max_concurrency must be at least 1"),
    ({"max_concurrency": -3}, ValueError, "max_concurrency must be at least 1"),
    ({"max_concurrency": 2.0}, TypeError, "max_concurrency must be an int"),
    ({"max_concurrency": True}, TypeError, "max_concurrency must be an int"),
    ({"item_timeout": -1}, ValueError, "item_timeout of node 'fan' must be non-negative"),
    ({"item_timeout": math.nan}, ValueError, "item_timeout of node 'fan' must not be NaN"),
    ({"item_timeout": "1s"}, TypeError, "item_timeout of node 'fan' must be a number"),
    ({"timeout": -1}, ValueError, "timeout of node 'fan' must be non-negative"),
])
def test_bad_parameters_raise_before_anything_runs(options, exc_type, message):
    pulled = []
    with pytest.raises(exc_type) as info:
        Fan(lambda: pulled.append("items() called") or [], **options)
    assert message in str(info.value)
    assert pulled == []


def test_a_fan_out_without_items_or_work_is_a_definition_error(own_executor):
    class NoWork(FanOutNode):
        def items(self, ctx, param):
            raise AssertionError("must not be called")

    ex = own_executor(CountingExecutor, 2)
    with pytest.raises(FlowDefinitionError, match=r"NoWork does not implement work\(\)"):
        TaskScheduling.start(NoWork(), executor=ex)
    assert ex.submits == 0


@pytest.mark.parametrize("policy", ["all", 0.5, "best_effort"])
def test_a_source_that_raises_fails_the_node_whatever_the_policy(make_executor, policy):
    # a manifest that cannot be read must block publication, even under best_effort
    def source():
        yield from ((i, i) for i in range(5))
        raise OSError("listing page 2 failed")

    def broken_at_once():
        raise OSError("no listing")

    ex = make_executor(3)
    result = start(Fan(source, policy=policy), ex)
    wr = result["fan"].work_result
    assert wr.state is EXCEPTION
    assert isinstance(wr.exception, OSError) and "page 2" in str(wr.exception)
    assert wr.result.succeeded == {i: i for i in range(5)}  # what did run is still reported

    result = start(Fan(broken_at_once, policy=policy), ex)
    wr = result["fan"].work_result
    assert wr.state is EXCEPTION and isinstance(wr.exception, OSError)


@pytest.mark.parametrize(("source", "exc_type", "fragment"), [
    ([(["unhashable"], 1)], TypeError, "is not hashable"),
    ([("just-an-id",)], ValueError, ""),
    (42, TypeError, "not iterable"),
])
def test_a_malformed_source_fails_the_node_with_a_clear_error(make_executor, source, exc_type,
                                                              fragment):
    result = start(Fan(source), make_executor(2))
    wr = result["fan"].work_result
    assert wr.state is EXCEPTION
    assert isinstance(wr.exception, exc_type), repr(wr.exception)
    assert fragment in str(wr.exception)


def test_an_executor_refusing_every_item_loop_fails_the_fan_out_without_a_hang(own_executor):
    ex = own_executor(CountingExecutor, 2, refuse_after=1)  # the flow's own loop only
    result = start(Fan(numbered(10)), ex)
    wr = result["fan"].work_result
    assert wr.state is EXCEPTION and isinstance(wr.exception, RejectedExecutionError)


# --- process pools -------------------------------------------------------------------------------


def test_a_fan_out_on_a_process_pool_runs_items_in_other_processes():
    from fanout_tasks import RemoteSquares

    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = TaskScheduling.start(
            RemoteSquares(30, name="fan", max_concurrency=3, policy="best_effort"),
            executor=pool, timeout=LONG * 3)

    wr = result["fan"].work_result
    assert wr.state is SUCCESS, wr.exception
    fi = wr.result
    assert sorted(fi.failed) == ["item-007", "item-014", "item-021", "item-028"]
    assert all(isinstance(e, ValueError) for e in fi.failed.values())
    assert {k: v[1] for k, v in fi.succeeded.items()} == {
        f"item-{i:03d}": i * i for i in range(30) if i == 0 or i % 7}
    pids = {pid for pid, _ in fi.succeeded.values()}
    assert os.getpid() not in pids


# --- the 100-file exercise: all, then a 95 % quorum ------------------------------------------

FILES = [f"file-{i:03d}" for i in range(1, 101)]
ITEM_TIMEOUT = 2 * EPS  # file-099 hangs past it
DEADLINE = 4 * EPS  # the fan-out's overall deadline (node timeout)


class Exercise:
    """The 100-file check: file-099 hangs (times out), file-050's success is delivered twice, and
    file-100 is handed out only after file-099 timed out, so it is still being checked at the
    deadline and its result arrives after the fan-in ("late")."""

    def __init__(self, executor: AbandonSignallingExecutor, gate: Callable[[], threading.Event]):
        self.executor = executor
        self.hung = gate()
        self.late = gate()
        self.late_returned = gate()
        self.done_050 = gate()
        self.calls: Counter[str] = Counter()
        self.published: list[FanInResult] = []
        self.lock = threading.Lock()

    def source(self) -> Iterator[tuple[str, str]]:
        for name in FILES[:99]:
            yield name, name
            if name == "file-060":
                assert clock.wait(self.done_050, LONG)
                yield "file-050", "file-050 (redelivered)"
        # file-100's listing page arrives after file-099 was given up on
        assert clock.wait(self.executor.abandoned, LONG)
        yield "file-100", "file-100"

    def check(self, name: str) -> str:
        with self.lock:
            self.calls[name] += 1
        if name == "file-099":
            clock.wait(self.hung, None)
        elif name == "file-100":
            clock.wait(self.late, None)
            self.late_returned.set()
        elif name == "file-050":
            self.done_050.set()
        return f"{name}: ok"

    def flow(self, policy: str | float) -> Any:
        fan = Fan(self.source, self.check, name="check_files", max_concurrency=8,
                  item_timeout=ITEM_TIMEOUT, timeout=DEADLINE, policy=policy)
        publish = FunctionNode(lambda ctx, p: self.published.append(ctx.result_of("check_files")),
                               name="publish")
        fan >> publish
        return TaskScheduling.start(fan, executor=self.executor, timeout=LONG)

    def assert_fan_in(self, fi: FanInResult) -> None:
        assert set(fi.succeeded) == set(FILES[:98])
        assert list(fi.failed) == ["file-099"]
        assert isinstance(fi.failed["file-099"], ItemTimeoutError)
        assert fi.missing == ["file-100"]
        assert fi.duplicates == 1 and fi.total == 100 and not fi.complete
        assert self.calls["file-050"] == 1 and "file-050 (redelivered)" not in self.calls

    def arrive_late(self, fi: FanInResult) -> None:
        """Let file-100's check finish after the fan-in: its result must change nothing."""
        before = (dict(fi.succeeded), dict(fi.failed), list(fi.missing))
        self.late.set()
        self.hung.set()  # file-099 returns too, long after its item timeout
        assert self.late_returned.wait(LONG)
        self.executor.shutdown(wait=True)  # their loops returned and tried to record them
        assert (fi.succeeded, fi.failed, fi.missing) == before


@pytest.fixture
def exercise(released, own_executor) -> Exercise:
    return Exercise(own_executor(AbandonSignallingExecutor, 12), released)


def test_exercise_policy_all_blocks_publication_of_the_100_files(exercise):
    result = exercise.flow("all")

    wr = result["check_files"].work_result
    assert wr.state is TIMEOUT and isinstance(wr.exception, NodeTimeoutError)
    exercise.assert_fan_in(wr.result)
    pub = result["publish"].work_result
    assert pub.state is TIMEOUT and isinstance(pub.exception, UpstreamFailedError)
    assert exercise.published == []

    exercise.arrive_late(wr.result)
    assert wr.state is TIMEOUT and exercise.published == []


def test_exercise_95_percent_quorum_publishes_98_files_listing_the_rest(exercise):
    result = exercise.flow(0.95)

    wr = result["check_files"].work_result
    assert wr.state is SUCCESS and wr.exception is None
    exercise.assert_fan_in(wr.result)
    assert result["publish"].work_result.state is SUCCESS
    assert exercise.published == [wr.result]  # once, with what failed and what is missing

    exercise.arrive_late(wr.result)
    assert len(exercise.published) == 1


def _six_failed(ex):
    return Fan(lambda: ((n, n) for n in FILES), fail_on({f"file-{i:03d}" for i in range(90, 96)}),
               policy=0.95)


def _listing_fails(ex):
    def source():
        yield from ((n, n) for n in FILES)
        raise OSError("listing cursor expired")
    return Fan(source, policy=0.95)


def _listing_stalls(ex):
    page2 = ex.hung

    def source():
        yield from ((n, n) for n in FILES[:97])
        clock.wait(page2, None)  # the listing's last page never comes before the deadline
        yield from ((n, n) for n in FILES[97:])
    return Fan(source, policy=0.95, timeout=4 * SHORT)


def _budget_ends(ex):
    hung = ex.hung

    def check(n):
        if n == "file-100":
            clock.wait(hung, None)
        return n
    return Fan(lambda: ((n, n) for n in FILES), check, policy=0.95)


@pytest.mark.parametrize(("make_fan", "state", "exc_type"), [
    (_six_failed, EXCEPTION, FanOutPolicyError),  # 94 of 100 < 95 %
    (_listing_fails, EXCEPTION, OSError),  # every listed file passed, but the list is unknown
    (_listing_stalls, TIMEOUT, NodeTimeoutError),  # 97 of 97 read passed; 100 % of what?
    (_budget_ends, TIMEOUT, NodeTimeoutError),  # the run's budget, not the node's deadline
], ids=["six-files-fail", "listing-fails", "listing-stalls", "run-budget-ends"])
def test_exercise_95_percent_quorum_still_blocks_publication_when(exercise, make_fan, state,
                                                                  exc_type):
    fan = make_fan(exercise)
    fan.name = "check_files"
    publish = FunctionNode(lambda ctx, p: exercise.published.append(True), name="publish")
    fan >> publish
    budget = 4 * SHORT if make_fan is _budget_ends else LONG
    result = TaskScheduling.start(fan, executor=exercise.executor, timeout=budget)

    wr = result["check_files"].work_result
    assert wr.state is state and isinstance(wr.exception, exc_type), repr(wr.exception)
    assert isinstance(wr.result, FanInResult)
    assert result["publish"].work_result.state is state
    assert exercise.published == []


def test_transient_item_failures_are_listed_by_id_and_a_retry_of_those_ids_succeeds(
        make_executor):
    # a transient timeout -> bounded retries, attempt and error code visible. FanOutNode has no per-item retry:
    # the stable ids of the failed items are what a retry (here: a second fan-out) runs again.
    attempts: Counter[str] = Counter()
    lock = threading.Lock()

    def flaky(name):
        with lock:
            attempts[name] += 1
            attempt = attempts[name]
        if name in ("file-004", "file-009") and attempt == 1:
            raise ConnectionError(f"{name}: storage timeout (attempt {attempt})")
        return f"{name}: ok on attempt {attempt}"

    ex = make_executor(4)
    first = fan_in(start(Fan(lambda: ((n, n) for n in FILES[:20]), flaky,
                             policy="best_effort"), ex))
    assert sorted(first.failed) == ["file-004", "file-009"]
    assert all(isinstance(e, ConnectionError) and "attempt 1" in str(e)
               for e in first.failed.values())

    retry = fan_in(start(Fan(lambda: ((n, n) for n in first.failed), flaky), ex))
    assert retry.complete and sorted(retry.succeeded) == ["file-004", "file-009"]
    merged = {**first.succeeded, **retry.succeeded}
    assert sorted(merged) == FILES[:20]
    assert merged["file-009"] == "file-009: ok on attempt 2"
    assert attempts == Counter({n: (2 if n in ("file-004", "file-009") else 1) for n in FILES[:20]})


# --- defects found with this suite (regression tests) -----------------------------------------------


def test_a_source_not_exhausted_at_the_deadline_is_never_complete(make_executor, gate):
    # "item 100 arrives late" in the listing itself; also "the fan-in ends early ... check the expected set"
    next_page = gate()
    published = []

    def source():
        yield from ((n, n) for n in FILES[:3])
        clock.wait(next_page, None)  # page 2 of the listing is slow
        yield from ((n, n) for n in FILES[3:])

    fan = Fan(source, name="check_files", max_concurrency=2, timeout=4 * SHORT, policy="all")
    publish = FunctionNode(lambda ctx, p: published.append(True), name="publish")
    fan >> publish
    result = start(fan, make_executor(4))

    wr = result["check_files"].work_result
    assert isinstance(wr.result, FanInResult)
    assert wr.result.complete is False
    assert wr.state is TIMEOUT
    assert published == []


def test_a_fan_out_cancelled_by_a_join_stops_pulling_items(make_executor, gate):
    fan_started = gate()
    pulled = [0]
    at_hold = []

    def source():
        for i in range(100_000):
            pulled[0] += 1
            yield i, i

    def work(i):
        fan_started.set()
        time.sleep(0.0005)  # stands in for work
        return i

    def hold(ctx, p):
        at_hold.append(pulled[0])
        time.sleep(2 * EPS)  # a long downstream step; the cancelled fan-out must be idle
        at_hold.append(pulled[0])

    fan = Fan(source, work, max_concurrency=2)
    fast = FunctionNode(lambda ctx, p: fan_started.wait(LONG), name="fast")
    first = FunctionNode(lambda ctx, p: "first", name="first", join=Join.ANY)
    later = FunctionNode(hold, name="later")
    [fan, fast] >> first
    first >> later
    result = start([fan, fast], make_executor(4))

    assert result["fan"].work_result.state is CANCELLED
    assert at_hold[1] - at_hold[0] <= 2 + 1, at_hold


def test_item_timeouts_leave_no_timer_entries_behind(make_executor):
    from taskflow.engine import timer

    def live() -> int:
        # white box: the process-wide timer's entries still to fire (cancelled ones stay in the
        # heap until it compacts, which depends on what earlier tests of the process left)
        return sum(1 for entry in list(timer.timer_thread.heap) if entry[2].fn is not None)

    before = live()
    result = start(Fan(numbered(2000), max_concurrency=4, item_timeout=6 * LONG), make_executor(4))
    assert result["fan"].work_result.state is SUCCESS
    assert live() - before < 200, live() - before


def test_an_item_loop_dropped_by_the_executor_does_not_hang_the_fan_out(own_executor):
    # submissions: 1 = the flow's loop, 2 = the first item loop, 3 = the second one (dropped)
    ex = own_executor(CountingExecutor, 4, drop=frozenset({3}))
    result = start(Fan(numbered(10), max_concurrency=4), ex, timeout=4 * EPS)
    wr = result["fan"].work_result
    assert len(wr.result.succeeded) == 10
    assert wr.state is SUCCESS, repr(wr.exception)


def test_a_refused_extra_item_loop_only_lowers_concurrency(own_executor):
    ex = own_executor(CountingExecutor, 4, refuse=frozenset({3}))
    result = start(Fan(numbered(10), max_concurrency=4), ex)
    wr = result["fan"].work_result
    assert wr.result.complete and len(wr.result.succeeded) == 10
    assert wr.state is SUCCESS, repr(wr.exception)


def test_a_dropped_first_item_loop_fails_the_fan_out_without_a_hang(own_executor):
    ex = own_executor(CountingExecutor, 2, drop=frozenset({2}))
    result = start(Fan(numbered(10), max_concurrency=4), ex, timeout=4 * EPS)
    wr = result["fan"].work_result
    assert wr.state is EXCEPTION, repr(wr.exception)  # not TIMEOUT at the budget
    assert isinstance(wr.exception, RejectedExecutionError)


def test_a_loop_dropped_after_the_source_ran_dry_does_not_fail_the_fan_out(own_executor):
    # submissions: 1 = the flow's loop, 2 = the first item loop, 3 = the second (queued, and
    # dropped by the executor only after the first loop ran every item and exited)
    ex = own_executor(CountingExecutor, 4, defer=frozenset({3}))
    fut = TaskScheduling.submit(Fan(numbered(10), max_concurrency=2), executor=ex, timeout=LONG)
    try:
        assert ex.returned[2].wait(LONG)
        assert not fut.done()  # a queued item loop still counts
    finally:
        ex.deferred[3].cancel()  # what DISCARD_OLDEST or shutdown(cancel_futures=True) do
    wr = fut.result(timeout=LONG)["fan"].work_result
    assert wr.result.complete and len(wr.result.succeeded) == 10
    assert wr.state is SUCCESS, repr(wr.exception)


def test_items_running_when_the_budget_ends_are_reported_abandoned(released, own_executor, fake_clock):
    hung = released()
    ex = own_executor(AbandonSignallingExecutor, 4)
    fan = Fan(numbered(5), lambda i: clock.wait(hung, None) if i == 1 else i, max_concurrency=2)
    result = start(fan, ex, timeout=4 * SHORT)
    assert result["fan"].work_result.state is TIMEOUT
    assert result.elapsed == pytest.approx(4 * SHORT)
    assert ex.abandoned.is_set()


def test_retries_on_a_fan_out_are_not_silently_ignored(make_executor):
    calls = []

    def source():
        calls.append("items")
        if len(calls) == 1:
            raise ConnectionError("listing service busy")  # transient
        return ((i, i) for i in range(3))

    fan = Fan(source)
    try:
        fan.retries = 1
    except (TypeError, ValueError):
        return  # rejected with a clear error: fine
    result = start(fan, make_executor(2))  # accepted: then the transient failure is retried
    wr = result["fan"].work_result
    assert (wr.state, wr.attempts, calls) == (SUCCESS, 2, ["items", "items"]), \
        (wr.state, wr.attempts, calls, wr.exception)


def test_remote_items_do_not_pickle_the_manifest_per_item():
    from fanout_tasks import CountedPickles, ManifestFanOut

    CountedPickles.pickled = 0
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = TaskScheduling.start(
            ManifestFanOut(CountedPickles(40), name="fan", max_concurrency=2),
            executor=pool, timeout=LONG * 3)
    assert fan_in(result).succeeded == {i: i + 1 for i in range(40)}
    assert CountedPickles.pickled <= 2, CountedPickles.pickled


@pytest.mark.parametrize(("attr", "value"), [
    ("max_concurrency", 0), ("policy", 1.5), ("item_timeout", -1.0)])
def test_setting_a_bad_fan_out_option_after_construction_raises(attr, value):
    fan = Fan(numbered(3))
    with pytest.raises((TypeError, ValueError)):
        setattr(fan, attr, value)


def test_a_late_item_result_is_logged(make_executor, gate, taskflow_logs, fake_clock):
    release, returned = gate(), gate()

    def work(i):
        if i == 0:
            clock.wait(release, None)
            returned.set()
            return "late"
        return i

    ex = make_executor(3)
    start(Fan(numbered(3), work, item_timeout=4 * SHORT, policy="best_effort"), ex)
    release.set()
    assert returned.wait(LONG)
    ex.shutdown(wait=True)
    late = [r for r in taskflow_logs if "late" in str(r["message"]) and "fan" in str(r["message"])]
    assert late and any("0" in str(r["message"]) for r in late), \
        [r["message"] for r in taskflow_logs]
