"""Timeouts and deadlines (docs/concepts/budgets.md).

``start`` returns a FlowResult whose unfinished nodes are TIMEOUT by the budget, always; threads
cannot be killed, so a timed-out task keeps running and its late result is dropped.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import threading
import time
from concurrent.futures import Executor

import pytest
from conftest import EPS, LONG, MEDIUM, SHORT, HookLog

from taskflow import (
    FlowTimeoutError,
    FunctionNode,
    NodeState,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
)
from taskflow.testing import FakeClock


def hooked_class(log: HookLog):
    class Hooked(SchedulingNode):
        def task(self, ctx, param):
            return param(ctx)

        def on_begin(self, support):
            log.record(support.node.name, "begin")

        def on_success(self, support):
            log.record(support.node.name, "success")

        def on_fail(self, support):
            log.record(support.node.name, "fail")

    return Hooked


def run_timed(nodes, **kwargs):
    t0 = time.monotonic()
    result = TaskScheduling.start(nodes, **kwargs)
    return result, time.monotonic() - t0


# --- T1: a task that never returns --------------------------------------------------------------


def test_start_returns_at_the_budget_when_a_node_never_finishes(make_executor, gate):
    pool = make_executor(2)
    release, started, exited = gate(), threading.Event(), threading.Event()
    log = HookLog()
    Hooked = hooked_class(log)

    def stuck(ctx):
        started.set()
        try:
            release.wait(LONG)
        finally:
            exited.set()
        return "late"

    ok = Hooked(param=lambda ctx: "fast", name="fast")
    node = Hooked(param=stuck, name="stuck")
    budget = 4 * SHORT
    ctx = TaskContext()

    result, elapsed = run_timed([ok, node], executor=pool, timeout=budget, context=ctx)
    log.returned = True

    assert budget - 0.01 <= elapsed < budget + EPS
    assert result.elapsed == pytest.approx(elapsed, abs=EPS)
    assert started.is_set() and not exited.is_set(), "the abandoned thread is still running"
    run = result["stuck"]
    assert run.state is NodeState.ERROR
    assert run.work_result.state is ResultState.TIMEOUT
    assert result["fast"].work_result.state is ResultState.SUCCESS
    assert not result.ok
    assert set(result.failed) == {"stuck"}
    assert ctx.cancelled
    assert ctx.remaining() == 0
    assert log.count("stuck", "fail") == 1, "on_fail of a timed-out node runs before start returns"
    with pytest.raises(FlowTimeoutError) as info:
        result.raise_for_failure()
    assert isinstance(info.value, TimeoutError)
    assert info.value.unfinished == ["stuck"]
    assert "stuck" in str(info.value)

    # the pool still serves other flows while the abandoned thread runs
    other = TaskScheduling.start(
        FunctionNode(lambda c, p: 7, name="other"), executor=pool, timeout=LONG
    )
    assert other.outputs == {"other": 7}

    # the late result is dropped and no hook fires for it
    release.set()
    pool.shutdown(wait=True)
    assert exited.is_set()
    assert result["stuck"].work_result.state is ResultState.TIMEOUT
    assert result["stuck"].work_result.result != "late"
    assert "stuck" not in result.outputs
    assert log.count("stuck", "success") == 0
    assert log.count("stuck", "fail") == 1
    assert log.late == []


def test_on_fail_of_timed_out_nodes_runs_in_the_caller_before_start_returns(make_executor, gate):
    release = gate()
    hook_threads: list[str] = []
    returned = threading.Event()

    class Stuck(SchedulingNode):
        def task(self, ctx, param):
            release.wait(LONG)

        def on_fail(self, support):
            assert not returned.is_set()
            hook_threads.append(threading.current_thread().name)

    a = Stuck(name="a")
    b = Stuck(name="b")
    a >> b

    TaskScheduling.start(a, executor=make_executor(1), timeout=2 * SHORT)
    returned.set()

    assert hook_threads == [threading.current_thread().name] * 2


def test_submitted_run_resolves_by_its_budget_with_hooks_done_before(make_executor, gate):
    release = gate()
    log = HookLog()
    Hooked = hooked_class(log)
    a = Hooked(param=lambda c: "a", name="a")
    stuck = Hooked(param=lambda c: release.wait(LONG), name="stuck")
    son = Hooked(param=lambda c: "son", name="son")
    a >> stuck >> son
    budget = 4 * SHORT

    t0 = time.monotonic()
    future = TaskScheduling.submit(a, executor=make_executor(2), timeout=budget)
    result = future.result(timeout=LONG)
    elapsed = time.monotonic() - t0
    log.returned = True
    release.set()

    assert budget - 0.01 <= elapsed < budget + EPS
    assert {n: result[n].work_result.state for n in result} == {
        "a": ResultState.SUCCESS,
        "stuck": ResultState.TIMEOUT,
        "son": ResultState.TIMEOUT,
    }
    assert log.count("stuck", "fail") == 1 and log.count("son", "fail") == 1
    assert log.late == []


# --- T2: the budget is global along the critical path -----------------------------------------


def test_budget_is_shared_along_the_critical_path(make_executor):
    # on virtual time: each node's remaining budget is exactly what its fathers left
    step = 0.6 * MEDIUM  # a, b, c each take `step`; c cannot finish by `budget`
    budget = 1.5 * MEDIUM
    remaining: dict[str, float] = {}
    with FakeClock(autojump=True) as fake:

        def work(ctx, name):
            remaining[name] = ctx.remaining()
            fake.sleep(step)
            return name

        a, b, c = (FunctionNode(work, param=n, name=n) for n in "abc")
        a >> b >> c

        result = TaskScheduling.start(a, executor=make_executor(2), timeout=budget)

    assert result.elapsed == pytest.approx(budget)
    assert result.outputs == {"a": "a", "b": "b"}
    assert result["c"].work_result.state is ResultState.TIMEOUT
    assert remaining["a"] == pytest.approx(budget)
    assert remaining["b"] == pytest.approx(budget - step)
    assert remaining["c"] == pytest.approx(budget - 2 * step)


def test_remaining_never_increases_and_is_never_negative(make_executor, gate):
    release = gate()
    samples: list[float] = []

    def sampler(ctx, p):
        while not release.is_set():
            samples.append(ctx.remaining())
            if ctx.cancelled:
                samples.append(ctx.remaining())
                return
            time.sleep(0.005)

    budget = 4 * SHORT
    _result, elapsed = run_timed(
        FunctionNode(sampler, name="sampler"), executor=make_executor(1), timeout=budget
    )
    release.set()

    assert elapsed < budget + EPS
    assert len(samples) >= 2
    assert all(x >= y for x, y in itertools.pairwise(samples))
    assert all(0 <= x <= budget for x in samples)


# --- T3: time queued behind a busy pool counts ---------------------------------------------------


def test_time_queued_behind_a_busy_pool_counts_against_the_budget(make_executor, gate):
    pool = make_executor(1)
    release = gate()
    occupied = threading.Event()

    def blocker():
        occupied.set()
        release.wait(LONG)

    pool.submit(blocker)
    assert occupied.wait(LONG)
    ran: list[str] = []
    a = FunctionNode(lambda c, p: ran.append("a"), name="a")
    b = FunctionNode(lambda c, p: ran.append("b"), name="b")
    son = FunctionNode(lambda c, p: ran.append("son"), name="son")
    [a, b] >> son
    budget = 4 * SHORT

    result, elapsed = run_timed([a, b], executor=pool, timeout=budget)

    assert budget - 0.01 <= elapsed < budget + EPS
    assert {n: result[n].work_result.state for n in result} == {
        "a": ResultState.TIMEOUT,
        "b": ResultState.TIMEOUT,
        "son": ResultState.TIMEOUT,
    }
    release.set()
    pool.shutdown(wait=True)
    assert ran == [], "queued work of a timed-out run must never run"


# --- T4: zero budget ----------------------------------------------------------------------------


def test_zero_budget_expires_at_once_without_submitting_or_starting_anything(make_executor):
    inner = make_executor(1)
    submits: list[object] = []

    class Spy(Executor):
        def submit(self, fn, /, *args, **kwargs):
            submits.append(fn)
            return inner.submit(fn, *args, **kwargs)

    log = HookLog()
    Hooked = hooked_class(log)
    a = Hooked(param=lambda c: 1, name="a")
    b = Hooked(param=lambda c: 2, name="b")
    a >> b

    result, elapsed = run_timed(a, executor=Spy(), timeout=0)

    assert elapsed < EPS
    assert submits == []
    # nothing began; on_fail of a node ending TIMEOUT runs once (docs: budgets), in the caller
    assert sorted(log.calls) == [("a", "fail"), ("b", "fail")]
    assert not result.ok
    assert {n: result[n].work_result.state for n in result} == {
        "a": ResultState.TIMEOUT,
        "b": ResultState.TIMEOUT,
    }
    with pytest.raises(TimeoutError):
        result.raise_for_failure()


@pytest.mark.parametrize("budget", [None, math.inf])
def test_none_and_inf_mean_no_budget(make_executor, budget):
    seen = []
    node = FunctionNode(lambda ctx, p: seen.append((ctx.remaining(), ctx.cancelled)), name="n")
    result = TaskScheduling.start(node, executor=make_executor(1), timeout=budget)
    assert result.ok
    assert seen == [(math.inf, False)]


# --- T5: promptness -----------------------------------------------------------------------------


def test_fast_flow_returns_long_before_a_long_budget(make_executor):
    nodes = [FunctionNode(lambda c, p: p, param=i, name=f"n{i}") for i in range(5)]
    nodes[0] >> nodes[1:4] >> nodes[4]
    result, elapsed = run_timed(nodes[0], executor=make_executor(2), timeout=LONG)
    assert result.ok
    assert elapsed < LONG / 2


# --- T6: the deadline is monotonic ------------------------------------------------------------


def test_deadline_ignores_wall_clock_jumps(make_executor, gate, monkeypatch):
    release = gate()
    real_time = time.time
    jumps = iter(range(10**9))

    def jumping_time():
        return real_time() + (3600 if next(jumps) % 2 else -3600)

    fast = FunctionNode(lambda c, p: time.sleep(SHORT) or "done", name="fast")
    stuck = FunctionNode(lambda c, p: release.wait(LONG), name="stuck")
    budget = 6 * SHORT
    try:
        with monkeypatch.context() as patch:
            patch.setattr(time, "time", jumping_time)
            result, elapsed = run_timed([fast, stuck], executor=make_executor(2), timeout=budget)
    finally:
        release.set()

    assert budget - 0.01 <= elapsed < budget + EPS
    assert result["fast"].work_result.state is ResultState.SUCCESS
    assert result["stuck"].work_result.state is ResultState.TIMEOUT


# --- per-node timeout ---------------------------------------------------------------------------


def test_node_timeout_fails_the_node_and_its_sons_but_not_other_branches(make_executor):
    log = HookLog()
    Hooked = hooked_class(log)
    son_ran = threading.Event()
    node_timeout = 4 * SHORT
    with FakeClock(autojump=True) as fake:
        slow = Hooked(param=lambda c: fake.sleep(LONG), name="slow", timeout=node_timeout,
                      retries=3)
        son = Hooked(param=lambda c: son_ran.set(), name="son")
        grandson = Hooked(param=lambda c: son_ran.set(), name="grandson")
        other = Hooked(param=lambda c: fake.sleep(node_timeout + 2 * SHORT) or "other",
                       name="other")
        slow >> son >> grandson

        result = TaskScheduling.start([slow, other], executor=make_executor(3), timeout=LONG)
        log.returned = True

    assert result.elapsed == pytest.approx(node_timeout + 2 * SHORT)
    assert result["slow"].work_result.state is ResultState.TIMEOUT
    assert isinstance(result["slow"].work_result.exception, TimeoutError)
    # a son failed fast takes its father's kind of failure
    assert result["son"].work_result.state is ResultState.TIMEOUT
    assert result["grandson"].work_result.state is ResultState.TIMEOUT
    assert result["other"].work_result.state is ResultState.SUCCESS
    assert not son_ran.is_set()
    assert log.count("slow", "fail") == 1
    assert log.count("slow", "begin") == 1, "a timed-out attempt is not retried"
    assert log.count("son", "fail") == 1 and log.count("son", "begin") == 0
    assert log.count("grandson", "fail") == 1
    assert set(result.failed) == {"slow", "son", "grandson"}


def test_node_timeout_counts_from_first_start_not_from_the_run_start(make_executor):
    # b waits 0.6*MEDIUM for a; its own timeout (MEDIUM) only starts when it starts.
    with FakeClock(autojump=True) as fake:
        a = FunctionNode(lambda c, p: fake.sleep(0.6 * MEDIUM) or "a", name="a")
        b = FunctionNode(lambda c, p: fake.sleep(0.6 * MEDIUM) or "b", name="b", timeout=MEDIUM)
        a >> b
        result = TaskScheduling.start(a, executor=make_executor(1), timeout=LONG)
    assert result.outputs == {"a": "a", "b": "b"}
    assert result.elapsed == pytest.approx(1.2 * MEDIUM)


def test_node_timeout_covers_every_attempt_and_retries_stop_when_backoff_does_not_fit(
    make_executor,
):
    log = HookLog()
    Hooked = hooked_class(log)
    attempt_times: list[float] = []
    node_timeout = MEDIUM
    backoff = SHORT
    with FakeClock(autojump=True) as fake:

        def always_fails(ctx):
            attempt_times.append(fake.now())
            raise ValueError(len(attempt_times))

        node = Hooked(param=always_fails, name="flaky", timeout=node_timeout, retries=20,
                      retry_backoff=backoff)

        result = TaskScheduling.start(node, executor=make_executor(1), timeout=LONG)

    wr = result["flaky"].work_result
    assert result.elapsed < node_timeout
    assert wr.state is ResultState.EXCEPTION, "retries stop when the next back-off would not fit"
    assert isinstance(wr.exception, ValueError)
    assert wr.exception.args == (len(attempt_times),), "the last attempt's error is kept"
    assert wr.attempts == len(attempt_times)
    assert 2 <= wr.attempts < 21
    assert attempt_times[-1] - attempt_times[0] < node_timeout
    gaps = [y - x for x, y in itertools.pairwise(attempt_times)]
    # virtual stamps are sums of floats: a gap of exactly the back-off may read 1e-14 short
    assert all(g >= backoff - 1e-9 for g in gaps)
    assert attempt_times[-1] + 2 * gaps[-1] > node_timeout, "the next back-off would not fit"
    if len(gaps) >= 2:
        assert gaps[-1] > gaps[0], "back-off grows exponentially"
    assert log.count("flaky", "begin") == wr.attempts
    assert log.count("flaky", "fail") == 1
    assert log.count("flaky", "success") == 0


def test_retries_with_backoff_stay_within_the_flow_budget(make_executor):
    attempt_times: list[float] = []
    budget = MEDIUM
    with FakeClock(autojump=True) as fake:

        def always_fails(ctx, p):
            attempt_times.append(fake.now())
            raise ValueError(len(attempt_times))

        node = FunctionNode(always_fails, name="flaky", retries=20, retry_backoff=SHORT)
        t0 = fake.now()
        result = TaskScheduling.start(node, executor=make_executor(1), timeout=budget)

    wr = result["flaky"].work_result
    assert result.elapsed <= budget
    assert wr.state in (ResultState.EXCEPTION, ResultState.TIMEOUT)
    assert 2 <= len(attempt_times) < 21
    assert all(t < t0 + budget for t in attempt_times), "no attempt starts after the deadline"
    if wr.state is ResultState.EXCEPTION:
        assert wr.exception.args == (len(attempt_times),)
    assert not result.ok


def test_retried_node_succeeds_with_one_on_success_and_no_on_fail(make_executor):
    log = HookLog()
    Hooked = hooked_class(log)
    calls = {"father": 0, "flaky": 0}

    def father(ctx):
        calls["father"] += 1
        return 10

    def flaky(ctx):
        calls["flaky"] += 1
        if calls["flaky"] <= 2:
            raise ConnectionError("try again")
        return ctx.result_of("father") + 1

    f = Hooked(param=father, name="father")
    n = Hooked(param=flaky, name="flaky", retries=2, retry_backoff=SHORT / 5)
    f >> n

    result = TaskScheduling.start(f, executor=make_executor(2), timeout=LONG)

    assert result.ok
    assert result.outputs == {"father": 10, "flaky": 11}
    assert result["flaky"].work_result.attempts == 3
    assert calls == {"father": 1, "flaky": 3}, "a retry never re-runs a successful father"
    assert log.count("flaky", "begin") == 3
    assert log.count("flaky", "success") == 1
    assert log.count("flaky", "fail") == 0


def test_exhausted_retries_keep_the_last_exception(make_executor):
    calls = []

    def fails(ctx, p):
        calls.append(1)
        raise KeyError(len(calls))

    result = TaskScheduling.start(
        FunctionNode(fails, name="n", retries=3), executor=make_executor(1), timeout=LONG
    )
    wr = result["n"].work_result
    assert wr.state is ResultState.EXCEPTION
    assert wr.attempts == 4 == len(calls)
    assert isinstance(wr.exception, KeyError) and wr.exception.args == (4,)


# --- polling ctx.cancelled ------------------------------------------------------------------


def test_long_task_polling_cancelled_stops_soon_after_the_deadline(make_executor):
    stopped = threading.Event()

    def poller(ctx, p):
        deadline = time.monotonic() + LONG
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        stopped.set()

    budget = 4 * SHORT
    result, elapsed = run_timed(
        FunctionNode(poller, name="poller"), executor=make_executor(1), timeout=budget
    )

    assert elapsed < budget + EPS
    assert result["poller"].work_result.state is ResultState.TIMEOUT
    assert stopped.wait(EPS), "ctx.cancelled turns True once the run timed out"


# --- T8: boundary race --------------------------------------------------------------------------


def test_each_run_at_the_deadline_boundary_has_exactly_one_outcome(make_executor):
    pool = make_executor(4)
    budget = SHORT / 2
    rng = random.Random(20240607)
    iterations = 80
    records = [HookLog() for _ in range(iterations)]

    class Edge(SchedulingNode):
        def task(self, ctx, param):
            time.sleep(param)
            return ("value", param)

        def on_begin(self, support):
            records[support.context["i"]].record("edge", "begin")

        def on_success(self, support):
            records[support.context["i"]].record("edge", "success")

        def on_fail(self, support):
            records[support.context["i"]].record("edge", "fail")

    outcomes = []
    for i in range(iterations):
        delay = budget * rng.uniform(0.6, 1.4)
        node = Edge(param=delay, name="edge")
        t0 = time.monotonic()
        result = TaskScheduling.start(
            node, executor=pool, timeout=budget, context=TaskContext({"i": i})
        )
        elapsed = time.monotonic() - t0
        records[i].returned = True
        wr = result["edge"].work_result
        outcomes.append((result, wr.state, wr.result, elapsed, delay, list(records[i].calls)))

    pool.shutdown(wait=True)  # let every abandoned task finish, then nothing may have changed
    counts = {ResultState.SUCCESS: 0, ResultState.TIMEOUT: 0}
    late_runs: list[tuple[int, list[tuple[str, str]]]] = []
    for i, (result, state, value, elapsed, delay, calls_at_return) in enumerate(outcomes):
        wr = result["edge"].work_result
        assert state in counts, (i, state)
        counts[state] += 1
        assert elapsed < budget + EPS, (i, elapsed)
        assert (wr.state, wr.result) == (state, value), f"run {i} changed after start returned"
        hooks = records[i].calls
        if records[i].late:  # checked last, below
            late_runs.append((i, records[i].late))
            continue
        assert hooks == calls_at_return
        if state is ResultState.SUCCESS:
            assert value == ("value", delay)
            assert result.ok and result.outputs == {"edge": value}
            assert hooks == [("edge", "begin"), ("edge", "success")], (i, hooks)
        else:
            assert value != ("value", delay)
            assert not result.ok and "edge" not in result.outputs
            assert hooks.count(("edge", "fail")) == 1 and ("edge", "success") not in hooks, (
                i,
                hooks,
            )
    # both outcomes really occurred, so the race was exercised
    assert counts[ResultState.SUCCESS] > 0 and counts[ResultState.TIMEOUT] > 0, counts
    assert not late_runs, f"a hook started after start returned (runs {late_runs[:3]})"


def test_no_hook_starts_after_start_returned_at_the_deadline(make_executor):
    """Wide flows whose budget expires while workers are between nodes: docs (budgets): no hook
    starts after ``start`` has returned (the race is between a worker deciding to call a hook
    and the caller closing the run)."""
    pool = make_executor(2)
    late: list[tuple[str, int, str]] = []
    returned: set[int] = set()

    class Busy(SchedulingNode):
        def task(self, ctx, param):
            return param

        def _check(self, kind, support):
            run = support.context["run"]
            if run in returned:
                late.append((kind, run, self.name))

        def on_begin(self, support):
            self._check("begin", support)

        def on_success(self, support):
            self._check("success", support)

    nodes = [Busy(param=j, name=f"w{j}") for j in range(300)]
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # amplify the race
    try:
        for run in range(200):
            TaskScheduling.start(
                nodes, executor=pool, timeout=0.004, context=TaskContext({"run": run})
            )
            returned.add(run)
    finally:
        sys.setswitchinterval(old_interval)
    pool.shutdown(wait=True)
    assert late == [], f"{len(late)} hooks started after start returned, e.g. {late[:5]}"


# --- S3: mixed outcomes under load -------------------------------------------------------------


def test_mixed_outcomes_under_load_settle_every_node_exactly_once(make_executor, gate):
    """8 callers x 25 flows on one pool: ~10% of nodes raise, ~5% block past the budget, random
    retries; every node of every run ends in one state with one matching terminal hook, all
    before ``start`` returns."""
    pool = make_executor(4)
    release = gate()
    budget = 3 * SHORT
    problems: list[str] = []

    class Mixed(SchedulingNode):
        def task(self, ctx, param):
            kind = ctx["plan"][self.name]
            if kind == "raise":
                raise ValueError(self.name)
            if kind == "block":
                release.wait(2 * budget)  # work that overruns the budget, then returns late
            return self.name

        def on_success(self, support):
            support.context["log"].record(self.name, "success")

        def on_fail(self, support):
            support.context["log"].record(self.name, "fail")

    names = [f"m{i}" for i in range(8)]
    nodes = {n: Mixed(name=n, retries=i % 3) for i, n in enumerate(names)}
    nodes["m0"] >> [nodes["m1"], nodes["m2"], nodes["m3"]]
    nodes["m1"] >> nodes["m4"]
    [nodes["m2"], nodes["m3"]] >> nodes["m5"]
    nodes["m6"] >> nodes["m7"]

    def caller(tid):
        try:
            calls(tid)
        except BaseException as exc:  # noqa: BLE001 - report it, never leave it unseen
            problems.append(f"caller {tid}: {exc!r}")

    def calls(tid):
        rng = random.Random(tid)
        for run in range(25):
            plan = {n: rng.choices(["ok", "raise", "block"], weights=[85, 10, 5])[0] for n in names}
            log = HookLog()
            ctx = TaskContext({"plan": plan, "log": log})
            t0 = time.monotonic()
            result = TaskScheduling.start(
                [nodes["m0"], nodes["m6"]], executor=pool, timeout=budget, context=ctx
            )
            elapsed = time.monotonic() - t0
            log.returned = True
            if elapsed >= budget + EPS:
                problems.append(f"{tid}/{run}: took {elapsed:.3f}s")
            for n in names:
                state = result[n].work_result.state
                expected_hooks = [(n, "success")] if state is ResultState.SUCCESS else [(n, "fail")]
                got = [c for c in log.calls if c[0] == n]
                if state not in (ResultState.SUCCESS, ResultState.EXCEPTION, ResultState.TIMEOUT):
                    problems.append(f"{tid}/{run}: {n} ended {state}")
                if got != expected_hooks:
                    problems.append(f"{tid}/{run}: {n} {state} hooks {got}")
                if plan[n] == "raise" and state is ResultState.SUCCESS:
                    problems.append(f"{tid}/{run}: raising {n} succeeded")
            late_log.append(log)
            outcomes.append(result.ok)

    late_log: list[HookLog] = []
    outcomes: list[bool] = []
    threads = [threading.Thread(target=caller, args=(t,), name=f"mixed-{t}") for t in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * LONG)
    finally:
        release.set()
    pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in threads)
    assert len(late_log) == 8 * 25
    assert problems == [], problems[:10]
    assert [log.late for log in late_log if log.late] == [], "hooks ran after start returned"
    assert 0 < outcomes.count(True) < len(outcomes), "both ok and failed runs were exercised"
