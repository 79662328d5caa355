"""Join policies (docs/concepts/joins.md: the join table and the partial-failure table).

ALL / ANY / quorum(k) / BEST_EFFORT, optional edges, cancellation of fathers a join no longer
needs (queued ones never run, running ones see ``ctx.cancelled``), late results that never change
what the join saw, and the parameter checks that happen before anything runs.
"""

from __future__ import annotations

import threading

import pytest
from conftest import LONG, SHORT

from taskflow import (
    FlowDefinitionError,
    FunctionNode,
    Join,
    NodeCancelledError,
    NodeTimeoutError,
    ResultState,
    SchedulingNode,
    TaskScheduling,
    UpstreamFailedError,
)
from taskflow.kinds.forkjoin import JoinNode, JoinOutput
from taskflow.kinds.switch import SwitchNode
from taskflow.model.result import FlowStatus

SUCCESS, EXCEPTION, TIMEOUT = ResultState.SUCCESS, ResultState.EXCEPTION, ResultState.TIMEOUT
CANCELLED, SKIPPED = ResultState.CANCELLED, ResultState.SKIPPED


class Trace:
    """Task starts/ends and hook calls of one flow, in the order they happened."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []  # list.append is atomic

    def at(self, name: str, kind: str) -> int:
        return self.events.index((name, kind))

    def kinds(self, name: str) -> list[str]:
        return [k for n, k in self.events if n == name]

    def node_class(self) -> type[SchedulingNode]:
        trace = self

        class Node(SchedulingNode):
            """task = ``param(ctx)``; every step is traced."""

            def task(self, ctx, param):
                trace.events.append((self.name, "start"))
                try:
                    return param(ctx) if callable(param) else param
                finally:
                    trace.events.append((self.name, "end"))

            def on_success(self, support):
                trace.events.append((self.name, "success"))

            def on_fail(self, support):
                trace.events.append((self.name, "fail"))

        return Node


def raiser(exc):
    def fn(ctx, param=None):
        raise exc

    return fn


def wait_then(event: threading.Event, value, seen: dict | None = None,
              done: threading.Event | None = None, started: threading.Event | None = None):
    """A task that blocks until ``event`` (at most LONG), notes ``ctx.cancelled``, returns value;
    it sets ``started`` first and ``done`` last."""

    def fn(ctx, param=None):
        if started is not None:
            started.set()
        try:
            if seen is not None:
                seen["event"] = event.wait(LONG)
                seen["cancelled"] = ctx.cancelled
            else:
                event.wait(LONG)
            return value
        finally:
            if done is not None:
                done.set()

    return fn


def states(result, *names):
    return {n: result[n].work_result.state for n in names}


# --- ALL (the default) ---------------------------------------------------------------------------


def test_all_runs_when_every_father_succeeded_and_sees_every_value(make_executor):
    a = FunctionNode(lambda c, p: 1, name="a")
    b = FunctionNode(lambda c, p: 2, name="b")
    son = FunctionNode(lambda c, p: c.result_of("a") + c.result_of("b"), name="son")
    [a, b] >> son
    assert son.join == Join.ALL

    result = TaskScheduling.start([a, b], executor=make_executor(2), timeout=LONG)

    assert result.outputs == {"a": 1, "b": 2, "son": 3}
    assert result.ok


def test_all_son_takes_a_timed_out_fathers_kind_of_failure(make_executor, gate):
    release = gate()
    slow = FunctionNode(wait_then(release, "late"), name="slow", timeout=SHORT)
    ok = FunctionNode(lambda c, p: 1, name="ok")
    son = FunctionNode(lambda c, p: "ran", name="son")
    [slow, ok] >> son

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    wr = result["son"].work_result
    assert wr.state is TIMEOUT and wr.attempts == 0
    assert isinstance(wr.exception, UpstreamFailedError)
    assert isinstance(wr.exception.__cause__, NodeTimeoutError)


def test_optional_father_is_waited_for_before_the_son_runs(make_executor):
    trace = Trace()
    Node = trace.node_class()
    opt = Node(param=raiser(ValueError("optional")), name="opt")
    req = Node(param=1, name="req")
    son = Node(param=lambda c: "ran", name="son")
    son.depends_on(req).depends_on(opt, optional=True)

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    assert states(result, "opt", "req", "son") == {"opt": EXCEPTION, "req": SUCCESS, "son": SUCCESS}
    assert trace.at("opt", "fail") < trace.at("son", "start"), "an optional father is waited for"
    assert set(result.failed) == {"opt"}, "a tolerated failure is still reported"
    assert result.ok and result.status is FlowStatus.COMPLETED_WITH_ERRORS


def test_optional_only_changes_its_own_edge(make_executor):
    opt = FunctionNode(lambda c, p: 1, name="opt")
    req = FunctionNode(raiser(ValueError("required")), name="req")
    son = FunctionNode(lambda c, p: "ran", name="son")
    son.depends_on(opt, optional=True).depends_on(req)

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    assert result["son"].work_result.state is EXCEPTION
    assert result["son"].work_result.exception.father == "req"


def test_depends_on_again_without_optional_makes_the_edge_required(make_executor):
    bad = FunctionNode(raiser(ValueError("x")), name="bad")
    son = FunctionNode(lambda c, p: "ran", name="son")
    son.depends_on(bad, optional=True)
    son.depends_on(bad)

    result = TaskScheduling.start(son, executor=make_executor(1), timeout=LONG)

    assert result["son"].work_result.state is EXCEPTION


# --- ANY: first success -------------------------------------------------------------------------


def test_any_runs_on_the_first_success_and_cancels_a_running_father(make_executor):
    trace = Trace()
    Node = trace.node_class()
    son_ran, slow_done, slow_started = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    fast = Node(param=lambda c: slow_started.wait(LONG) and "fast", name="fast")
    slow = Node(param=wait_then(son_ran, "slow", seen, slow_done, slow_started), name="slow")
    son = Node(param=lambda c: son_ran.set() or sorted(c.result_of(n) for n in ("fast",)),
               name="son", join=Join.ANY)
    [fast, slow] >> son

    try:
        result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)
    finally:
        son_ran.set()
    assert slow_done.wait(LONG)

    assert seen == {"event": True, "cancelled": True}, "the running father sees ctx.cancelled"
    assert states(result, "fast", "slow", "son") == {"fast": SUCCESS, "slow": CANCELLED, "son": SUCCESS}
    slow_wr = result["slow"].work_result
    assert isinstance(slow_wr.exception, NodeCancelledError)
    assert "son" in str(slow_wr.exception), "the reason names the join that no longer needs it"
    assert slow_wr.result is None, "its late result is dropped"
    assert result.ok, "a father cancelled by a join is not a failure"
    assert "slow" not in result.outputs
    assert trace.kinds("slow") == ["start", "fail", "end"], "on_fail once, nothing after the late end"


def test_any_late_result_is_logged_as_late_and_never_reaches_the_son(make_executor, taskflow_logs):
    pool = make_executor(2)
    son_ran, slow_started = threading.Event(), threading.Event()
    seen_by_son: list[dict] = []

    class Quote(JoinNode):
        def merge(self, ctx, output):
            seen_by_son.append(dict(output.results))
            son_ran.set()
            return output

    fast = FunctionNode(lambda c, p: slow_started.wait(LONG) and 100, name="provider_a")
    slow = FunctionNode(wait_then(son_ran, 90, started=slow_started), name="provider_b")
    quote = Quote(name="quote", join=Join.ANY)
    [fast, slow] >> quote

    try:
        result = TaskScheduling.start(quote, executor=pool, timeout=LONG)
    finally:
        son_ran.set()
    pool.shutdown(wait=True)  # the cancelled father has returned its late value

    output = result["quote"].work_result.result
    assert output.results == {"provider_a": 100}
    assert output.missing == ["provider_b"] and not output.complete
    assert seen_by_son == [{"provider_a": 100}]
    assert result["provider_b"].work_result.state is CANCELLED
    assert result["provider_b"].work_result.result is None
    assert result.outputs["quote"] is output, "the join's result is unchanged by the late value"
    late = [r for r in taskflow_logs if "late result" in str(r["message"])]
    assert [r["extra"].get("node") for r in late] == ["provider_b"]


def test_any_cancels_queued_fathers_which_never_run(make_executor):
    trace = Trace()
    Node = trace.node_class()
    fathers = [Node(param=i, name=f"f{i}") for i in range(3)]
    son = Node(param=lambda c: "ran", name="son", join=Join.ANY)
    fathers >> son

    result = TaskScheduling.start(son, executor=make_executor(1), timeout=LONG)

    ran = [f.name for f in fathers if result[f.name].work_result.attempts]
    assert len(ran) == 1, "on one worker the first father fires the join; the rest were queued"
    for f in fathers:
        wr = result[f.name].work_result
        if f.name in ran:
            assert wr.state is SUCCESS
        else:
            assert wr.state is CANCELLED
            assert wr.started_at is None and wr.attempts == 0
            assert trace.kinds(f.name) == ["fail"], "on_fail once, the task never runs"
    assert result["son"].work_result.state is SUCCESS
    assert result.ok


def test_any_keeps_a_father_that_another_node_still_waits_for(make_executor):
    son_ran = threading.Event()
    fast = FunctionNode(lambda c, p: "fast", name="fast")
    shared = FunctionNode(wait_then(son_ran, "shared"), name="shared")
    son = FunctionNode(lambda c, p: son_ran.set(), name="son", join=Join.ANY)
    other = FunctionNode(lambda c, p: c.result_of("shared") + "!", name="other")
    [fast, shared] >> son
    shared >> other

    try:
        result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)
    finally:
        son_ran.set()

    assert states(result, "fast", "shared", "son", "other") == dict.fromkeys(
        ("fast", "shared", "son", "other"), SUCCESS)
    assert result.outputs["other"] == "shared!"


def test_any_cancellation_reaches_the_fathers_of_a_cancelled_father(make_executor):
    son_ran, upstream_done, upstream_started = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    fast = FunctionNode(lambda c, p: upstream_started.wait(LONG) and "fast", name="fast")
    upstream = FunctionNode(wait_then(son_ran, "u", seen, upstream_done, upstream_started),
                            name="upstream")
    middle = FunctionNode(lambda c, p: "m", name="middle")
    son = FunctionNode(lambda c, p: son_ran.set(), name="son", join=Join.ANY)
    upstream >> middle >> son
    fast >> son

    try:
        result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)
    finally:
        son_ran.set()
    assert upstream_done.wait(LONG)

    assert states(result, "upstream", "middle", "son") == {
        "upstream": CANCELLED, "middle": CANCELLED, "son": SUCCESS}
    assert result["middle"].work_result.attempts == 0
    assert seen["cancelled"], "the running grand-father sees its own cancellation"


def test_any_returns_without_waiting_for_a_cancelled_running_father(make_executor, gate):
    release, stuck_started = gate(), threading.Event()
    fast = FunctionNode(lambda c, p: stuck_started.wait(LONG) and 1, name="fast")
    stuck = FunctionNode(wait_then(release, 2, started=stuck_started), name="stuck")
    son = FunctionNode(lambda c, p: "ran", name="son", join=Join.ANY)
    [fast, stuck] >> son

    try:
        result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)
        assert not release.is_set()
        assert states(result, "stuck", "son") == {"stuck": CANCELLED, "son": SUCCESS}
    finally:
        release.set()


def test_any_runs_when_one_father_succeeds_after_the_others_failed(make_executor):
    trace = Trace()
    Node = trace.node_class()
    failed = [threading.Event(), threading.Event()]

    class Failing(SchedulingNode):
        def task(self, ctx, param):
            raise ValueError(self.name)

        def on_fail(self, support):
            failed[self.param].set()

    bad = [Failing(param=i, name=f"bad{i}") for i in range(2)]
    good = Node(param=lambda c: all(e.wait(LONG) for e in failed) and "good", name="good")
    son = Node(param=lambda c: c.result_of("good"), name="son", join=Join.ANY)
    [*bad, good] >> son

    result = TaskScheduling.start(son, executor=make_executor(3), timeout=LONG)

    assert result.outputs["son"] == "good"
    assert set(result.failed) == {"bad0", "bad1"}, "the tolerated failures are still reported"


def test_any_fails_when_every_father_failed(make_executor):
    errors = [ValueError(f"e{i}") for i in range(3)]
    fathers = [FunctionNode(raiser(e), name=f"f{i}") for i, e in enumerate(errors)]
    ran = threading.Event()
    son = FunctionNode(lambda c, p: ran.set(), name="son", join=Join.ANY)
    fathers >> son

    result = TaskScheduling.start(son, executor=make_executor(3), timeout=LONG)

    wr = result["son"].work_result
    assert not ran.is_set() and wr.attempts == 0
    assert wr.state is EXCEPTION and isinstance(wr.exception, UpstreamFailedError)
    assert any(wr.exception.__cause__ is e for e in errors)


def test_any_times_out_when_every_father_timed_out(make_executor, gate):
    release = gate()
    fathers = [FunctionNode(wait_then(release, i), name=f"f{i}", timeout=SHORT) for i in range(2)]
    son = FunctionNode(lambda c, p: "ran", name="son", join=Join.ANY)
    fathers >> son

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    assert states(result, "f0", "f1", "son") == {"f0": TIMEOUT, "f1": TIMEOUT, "son": TIMEOUT}


# --- quorum(k) ----------------------------------------------------------------------------------


def test_quorum_runs_at_k_successes_and_cancels_the_rest(make_executor):
    son_ran = threading.Event()
    done = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]
    seen: list[dict[str, bool]] = [{}, {}]
    fast = [FunctionNode(lambda c, p, i=i: all(e.wait(LONG) for e in started) and i,
                         name=f"fast{i}") for i in range(2)]
    slow = [FunctionNode(wait_then(son_ran, "late", seen[i], done[i], started[i]), name=f"slow{i}")
            for i in range(2)]

    class Son(JoinNode):
        def merge(self, ctx, output):
            son_ran.set()
            return output

    son = Son(name="son", join=Join.quorum(2))
    [*fast, *slow] >> son

    try:
        result = TaskScheduling.start(son, executor=make_executor(4), timeout=LONG)
    finally:
        son_ran.set()
    assert all(d.wait(LONG) for d in done)

    output = result["son"].work_result.result
    assert output.results == {"fast0": 0, "fast1": 1}
    assert sorted(output.missing) == ["slow0", "slow1"] and not output.complete
    assert states(result, "slow0", "slow1") == {"slow0": CANCELLED, "slow1": CANCELLED}
    assert all(s["cancelled"] for s in seen)
    assert result.ok


def test_quorum_counts_successes_not_finished_fathers(make_executor):
    trace = Trace()
    Node = trace.node_class()
    bad = Node(param=raiser(ValueError("bad")), name="bad")
    first = Node(param=1, name="first")
    # "second" finishes last, after the failure, so two fathers finishing is not enough
    second = Node(param=lambda c: 2, name="second")
    son = Node(param=lambda c: "ran", name="son", join=Join.quorum(2))
    [bad, first, second] >> son

    result = TaskScheduling.start(son, executor=make_executor(1), timeout=LONG)

    assert result["son"].work_result.state is SUCCESS
    ends = sorted(trace.at(n, "end") for n in ("bad", "first", "second"))
    assert trace.at("son", "start") > ends[-1]


def test_quorum_fails_as_soon_as_k_is_out_of_reach(make_executor):
    son_failed = threading.Event()
    seen: dict[str, bool] = {}

    class Son(SchedulingNode):
        def task(self, ctx, param):
            return "ran"

        def on_fail(self, support):
            son_failed.set()

    bad = [FunctionNode(raiser(ValueError(f"b{i}")), name=f"bad{i}") for i in range(2)]
    slow = FunctionNode(wait_then(son_failed, "slow", seen), name="slow")
    son = Son(name="son", join=Join.quorum(2))
    [*bad, slow] >> son

    try:
        result = TaskScheduling.start(son, executor=make_executor(3), timeout=LONG)
    finally:
        son_failed.set()

    assert seen["event"], "the son failed while the third father was still running"
    wr = result["son"].work_result
    assert wr.state is EXCEPTION and wr.attempts == 0
    assert isinstance(wr.exception, UpstreamFailedError)
    assert wr.exception.__cause__ is result[wr.exception.father].work_result.exception
    assert result["slow"].work_result.state is SUCCESS, "a failed join cancels nobody"
    assert not seen["cancelled"]


def test_quorum_of_all_fathers_waits_for_every_one(make_executor):
    a = FunctionNode(lambda c, p: 1, name="a")
    b = FunctionNode(lambda c, p: 2, name="b")
    son = JoinNode(name="son", join=Join.quorum(2))
    [a, b] >> son

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    assert result.outputs["son"] == JoinOutput({"a": 1, "b": 2}, {}, [], True)


# --- BEST_EFFORT --------------------------------------------------------------------------------


def test_best_effort_runs_once_every_father_is_terminal_whatever_the_outcome(make_executor, gate):
    trace = Trace()
    Node = trace.node_class()
    release = gate()
    error = ValueError("broken")
    ok = Node(param="fine", name="ok")
    bad = Node(param=raiser(error), name="bad")
    hung = Node(param=wait_then(release, "late"), name="hung", timeout=SHORT)
    son = JoinNode(name="son", join=Join.BEST_EFFORT)
    [ok, bad, hung] >> son

    result = TaskScheduling.start(son, executor=make_executor(3), timeout=LONG)

    output = result["son"].work_result.result
    assert result["son"].work_result.state is SUCCESS
    assert output.results == {"ok": "fine"}
    assert output.failed["bad"] is error
    assert isinstance(output.failed["hung"], NodeTimeoutError)
    assert output.missing == [] and output.complete is False, "it never pretends to be complete"
    assert set(result.failed) == {"bad", "hung"}


def test_best_effort_waits_for_the_slowest_father(make_executor):
    trace = Trace()
    Node = trace.node_class()
    fast_done = threading.Event()

    class Fast(SchedulingNode):
        def task(self, ctx, param):
            return "fast"

        def on_success(self, support):
            fast_done.set()

    fast = Fast(name="fast")
    slow = Node(param=lambda c: fast_done.wait(LONG) and "slow", name="slow")
    son = Node(param=lambda c: (c.result_of("fast"), c.result_of("slow")), name="son",
               join=Join.BEST_EFFORT)
    [fast, slow] >> son

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    assert result.outputs["son"] == ("fast", "slow")
    assert trace.at("slow", "success") < trace.at("son", "start")


def test_best_effort_runs_even_when_every_father_failed(make_executor):
    fathers = [FunctionNode(raiser(ValueError(f"e{i}")), name=f"f{i}") for i in range(2)]
    son = JoinNode(name="son", join=Join.BEST_EFFORT)
    fathers >> son

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    output = result.outputs["son"]
    assert output.results == {} and sorted(output.failed) == ["f0", "f1"]
    assert not output.complete
    assert set(result.failed) == {"f0", "f1"}


def test_join_output_lists_fathers_in_wiring_order(make_executor):
    names = ["zeta", "alpha", "mid", "beta"]
    fathers = [FunctionNode(lambda c, p, n=n: n.upper(), name=n) for n in names]
    son = JoinNode(name="son", join=Join.BEST_EFFORT)
    son.set_father_handler(fathers)

    result = TaskScheduling.start(son, executor=make_executor(4), timeout=LONG)

    assert list(result.outputs["son"].results) == names, "stable definition order, not finish order"


def test_a_join_with_no_fathers_reports_an_empty_complete_output(make_executor):
    result = TaskScheduling.start(JoinNode(name="lonely"), executor=make_executor(1), timeout=LONG)

    assert result.outputs["lonely"] == JoinOutput({}, {}, [], True)


def test_join_output_cannot_claim_to_be_complete_with_failures_or_missing_fathers():
    with pytest.raises(ValueError, match="complete"):
        JoinOutput({}, {"a": ValueError()}, [], True)
    with pytest.raises(ValueError, match="complete"):
        JoinOutput({}, {}, ["a"], True)
    assert JoinOutput({"a": 1}, {}, [], True).complete


def test_merge_can_reject_an_incomplete_output(make_executor):
    class Strict(JoinNode):
        def merge(self, ctx, output):
            if not output.complete:
                raise RuntimeError(f"missing {output.missing}, failed {sorted(output.failed)}")
            return sum(output.results.values())

    fathers = [FunctionNode(lambda c, p: 1, name="a"), FunctionNode(raiser(KeyError("b")), name="b")]
    strict = Strict(name="strict", join=Join.BEST_EFFORT)
    fathers >> strict

    result = TaskScheduling.start(strict, executor=make_executor(2), timeout=LONG)

    wr = result["strict"].work_result
    assert wr.state is EXCEPTION and "failed ['b']" in str(wr.exception)


# --- skipped fathers (see test_switch.py for the switch itself) ---------------------------------


@pytest.mark.parametrize("policy", [Join.ALL, Join.ANY, Join.quorum(1), Join.BEST_EFFORT],
                         ids=repr)
def test_skipped_fathers_are_ignored_by_every_policy(make_executor, policy):
    ran, skipped = FunctionNode(lambda c, p: "ran", name="ran"), FunctionNode(lambda c, p: 0, name="skipped")
    switch = SwitchNode.of(lambda c, p: "go", name="switch", cases={"go": ran, "stop": skipped})
    merge = JoinNode(name="merge", join=policy)
    [ran, skipped] >> merge

    result = TaskScheduling.start(switch, executor=make_executor(2), timeout=LONG)

    assert result["skipped"].work_result.state is SKIPPED
    output = result.outputs["merge"]
    assert output.results == {"ran": "ran"} and output.missing == ["skipped"]
    assert result.ok


# --- parameters are checked before anything runs -----------------------------------------------


@pytest.mark.parametrize("k, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                      (True, TypeError), ("2", TypeError)])
def test_quorum_size_must_be_a_positive_int(k, error):
    with pytest.raises(error, match="quorum"):
        Join.quorum(k)


def test_quorum_larger_than_the_fathers_is_rejected_before_anything_runs(make_executor):
    ran = []
    a = FunctionNode(lambda c, p: ran.append("a"), name="a")
    b = FunctionNode(lambda c, p: ran.append("b"), name="b")
    son = FunctionNode(lambda c, p: ran.append("son"), name="picky", join=Join.quorum(3))
    [a, b] >> son

    with pytest.raises(FlowDefinitionError, match=r"'picky'.*quorum\(3\).*2 father"):
        TaskScheduling.start(son, executor=make_executor(1), timeout=LONG)
    assert ran == []


@pytest.mark.parametrize("policy", [Join.ANY, Join.quorum(1)], ids=repr)
def test_any_or_quorum_without_fathers_is_rejected_before_anything_runs(make_executor, policy):
    ran = []
    root = FunctionNode(lambda c, p: ran.append("root"), name="root", join=policy)
    other = FunctionNode(lambda c, p: ran.append("other"), name="other")
    root >> other

    with pytest.raises(FlowDefinitionError, match="'root'.*no fathers"):
        TaskScheduling.start(root, executor=make_executor(1), timeout=LONG)
    assert ran == []


@pytest.mark.parametrize("options, error", [
    ({"retries": -1}, ValueError), ({"retries": 1.5}, TypeError),
    ({"retry_backoff": -0.1}, ValueError), ({"retry_backoff": float("inf")}, ValueError),
    ({"join": "any"}, TypeError),
])
def test_bad_node_options_are_rejected_where_they_are_given(options, error):
    with pytest.raises(error):
        FunctionNode(lambda c, p: None, name="n", **options)


def test_join_policies_are_immutable_values():
    assert Join.quorum(2) == Join.quorum(2) and Join.quorum(2) != Join.quorum(3)
    assert repr(Join.quorum(2)) == "Join.quorum(2)" and repr(Join.ANY) == "Join.ANY"
    with pytest.raises(AttributeError):
        Join.ALL.k = 3  # type: ignore[misc]


# --- the partial-failure table (the fan-out row lives with FanOutNode) -------------------------
#
# An order: risk check and inventory check in parallel; charging needs both.


class OutOfStock(Exception):
    """Inventory permanently insufficient: a business rejection, not retried."""


def order_flow(risk, inventory, *, risk_retries=0, charge=None):
    risk_node = FunctionNode(risk, name="risk_check", retries=risk_retries)
    inventory_node = FunctionNode(inventory, name="inventory_check")
    charge = FunctionNode(charge or (lambda c, p: {"charged": c.result_of("risk_check")["amount"]}),
                          name="charge")
    [risk_node, inventory_node] >> charge
    return charge


def test_table_risk_check_timing_out_once_is_retried_and_the_attempt_is_visible(make_executor):
    calls = []

    def risk(ctx, param):
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("risk service: read timed out")
        return {"decision": "approve", "amount": 42}

    result = TaskScheduling.start(order_flow(risk, lambda c, p: 3, risk_retries=2),
                                  executor=make_executor(2), timeout=LONG)

    assert result.ok and result.outputs["charge"] == {"charged": 42}
    assert result["risk_check"].work_result.attempts == 2, "attempt count is the evidence"


def test_table_permanently_out_of_stock_never_charges_and_keeps_the_reason(make_executor):
    charged = []

    def inventory(ctx, param):
        raise OutOfStock("sku-1: 0 left, 2 requested")

    charge = order_flow(lambda c, p: {"amount": 42}, inventory,
                        charge=lambda c, p: charged.append(1))

    result = TaskScheduling.start(charge, executor=make_executor(2), timeout=LONG)

    wr = result["charge"].work_result
    assert charged == [] and wr.attempts == 0 and wr.state is EXCEPTION
    assert isinstance(wr.exception.__cause__, OutOfStock)
    node = {n.name: n for n in result.report().nodes}["charge"]
    assert node.cause == "OutOfStock: sku-1: 0 left, 2 requested", "the reason is visible"


def test_table_risk_passed_inventory_unknown_goes_to_reconciliation(make_executor, gate):
    release = gate()
    risk = FunctionNode(lambda c, p: {"decision": "approve"}, name="risk_check")
    inventory = FunctionNode(wait_then(release, 3), name="inventory_check", timeout=SHORT)
    checks = JoinNode(name="checks", join=Join.BEST_EFFORT)
    charge = FunctionNode(lambda c, p: "charged", name="charge")
    reconcile = FunctionNode(lambda c, p: {"query": sorted(c.result_of("checks").failed)},
                             name="reconcile")
    route = SwitchNode.of(lambda c, p: c.result_of("checks").complete, name="route",
                          cases={True: charge, False: reconcile})
    [risk, inventory] >> checks >> route

    result = TaskScheduling.start(checks, executor=make_executor(2), timeout=LONG)

    assert states(result, "charge", "reconcile") == {"charge": SKIPPED, "reconcile": SUCCESS}
    assert result.outputs["reconcile"] == {"query": ["inventory_check"]}
    assert result.outputs["checks"].results == {"risk_check": {"decision": "approve"}}


def test_table_a_late_result_after_the_join_leaves_the_outcome_unchanged(make_executor):
    # first success wins; the other provider's answer arrives after the join and is dropped
    pool = make_executor(2)
    joined = threading.Event()
    primary = FunctionNode(lambda c, p: {"receipt": "p-1"}, name="primary")
    backup = FunctionNode(wait_then(joined, {"receipt": "b-9"}), name="backup")

    class Commit(JoinNode):
        def merge(self, ctx, output):
            joined.set()
            (receipt,) = output.results.values()
            return receipt

    commit = Commit(name="commit", join=Join.ANY)
    [primary, backup] >> commit

    try:
        result = TaskScheduling.start(commit, executor=pool, timeout=LONG)
    finally:
        joined.set()
    before = result.outputs["commit"]
    pool.shutdown(wait=True)

    assert before == {"receipt": "p-1"}
    assert result.outputs["commit"] == {"receipt": "p-1"}
    assert result["backup"].work_result.state is CANCELLED
    assert result["backup"].work_result.result is None


# --- regressions of engine defects found by these tests ------------------------------------------


def test_a_father_cancelled_before_its_attempt_began_never_runs_its_task(make_executor):
    other_started, hook_started, son_ran = threading.Event(), threading.Event(), threading.Event()
    ran = []

    class FailedFast(SchedulingNode):
        def task(self, ctx, param):
            return "never"

        def on_fail(self, support):
            # runs on the loop that just popped "victim" as its next node
            hook_started.set()
            son_ran.wait(LONG)

    def bad(ctx, param):
        other_started.wait(LONG)  # both loops are busy: "victim" is queued behind us
        raise ValueError("bad")

    first = FunctionNode(bad, name="bad")
    first >> FailedFast(name="failed_fast")
    other = FunctionNode(lambda c, p: other_started.set() or hook_started.wait(LONG) and "other",
                         name="other")
    victim = FunctionNode(lambda c, p: ran.append("victim"), name="victim")
    son = FunctionNode(lambda c, p: son_ran.set(), name="son", join=Join.ANY)
    [victim, other] >> son

    try:
        result = TaskScheduling.start([first, other, victim], executor=make_executor(2), timeout=LONG)
    finally:
        son_ran.set()

    assert result["victim"].work_result.state is CANCELLED
    assert ran == [] and result["victim"].work_result.attempts == 0, (
        "cancelled before its attempt began: its task must never run")


def test_best_effort_son_starts_after_the_on_fail_hook_of_a_father_that_failed_fast(make_executor, gate):
    release, hook_started, son_ran = gate(), threading.Event(), threading.Event()
    seen = {}

    class FailedFast(SchedulingNode):
        def task(self, ctx, param):
            return "never"

        def on_fail(self, support):
            hook_started.set()
            seen["son_ran_during_hook"] = son_ran.wait(4 * SHORT)

    stuck = FunctionNode(lambda c, p: release.wait(LONG), name="stuck", timeout=SHORT)
    busy = FunctionNode(lambda c, p: hook_started.wait(LONG) and "busy", name="busy")
    stuck >> FailedFast(name="failed_fast") >> FunctionNode(
        lambda c, p: son_ran.set(), name="son", join=Join.BEST_EFFORT)

    result = TaskScheduling.start([busy, stuck], executor=make_executor(3), timeout=LONG)

    assert result["son"].work_result.state is SUCCESS
    assert seen == {"son_ran_during_hook": False}, "a node's hook runs before its sons start"
