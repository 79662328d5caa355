"""SwitchNode (docs/concepts/joins.md, the questions every switch must answer): the chosen branch runs, the others and
everything only they feed are SKIPPED, merges run on the branch that ran, unknown values fail
the switch naming the value and the known cases."""

from __future__ import annotations

import enum
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from conftest import LONG

from taskflow import (
    FlowDefinitionError,
    FunctionNode,
    Join,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    UpstreamFailedError,
)
from taskflow.kinds.switch import SwitchNode, UnknownCaseError

SUCCESS, EXCEPTION, SKIPPED = ResultState.SUCCESS, ResultState.EXCEPTION, ResultState.SKIPPED


class Decision(str, enum.Enum):
    APPROVE = "approve"
    MANUAL_REVIEW = "manual_review"
    REJECT = "reject"


class Counting(SchedulingNode):
    """Returns its name; counts task and hook calls in ``calls`` (passed as param)."""

    def task(self, ctx, param):
        param.append((self.name, "task"))
        return self.name

    def on_success(self, support):
        self.param.append((self.name, "success"))

    def on_fail(self, support):
        self.param.append((self.name, "fail"))


class FromContext(SwitchNode):
    """Decides ``ctx["decision"]``."""

    def task(self, ctx, param):
        return ctx["decision"]


def leaf(name, value=None):
    return FunctionNode(lambda c, p: name if value is None else value, name=name)


def state_of(result, *names):
    return {n: result[n].work_result.state for n in names}


def run(top, *, workers=2, **ctx):
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="switch") as pool:
        return TaskScheduling.start(top, executor=pool, timeout=LONG, context=TaskContext(ctx))


# --- choosing -------------------------------------------------------------------------------


def test_chosen_case_runs_and_the_other_cases_are_skipped_without_running():
    calls: list[tuple[str, str]] = []
    cases = {d: Counting(param=calls, name=d.value) for d in Decision}
    switch = FromContext(name="route", cases=cases)

    result = run(switch, decision=Decision.MANUAL_REVIEW)

    assert state_of(result, "approve", "manual_review", "reject") == {
        "approve": SKIPPED, "manual_review": SUCCESS, "reject": SKIPPED}
    assert sorted(calls) == [("manual_review", "success"), ("manual_review", "task")], (
        "skipped nodes run no task and no hook")
    for name in ("approve", "reject"):
        wr = result[name].work_result
        assert wr.attempts == 0 and wr.started_at is None and wr.exception is None
    assert result.ok and set(result.outputs) == {"route", "manual_review"}


def test_the_decision_is_the_switchs_recorded_result():
    switch = FromContext(name="route", cases={"a": leaf("a"), "b": leaf("b")})

    result = run(switch, decision="b")

    assert result.outputs["route"] == "b"
    assert {n.name: n.result for n in result.report().nodes}["route"] == "b"  # a JSON value


def test_everything_only_an_unchosen_branch_feeds_is_skipped():
    a1, a2, a3 = leaf("a1"), leaf("a2"), leaf("a3")
    b1, b2 = leaf("b1"), leaf("b2")
    a1 >> a2 >> a3
    b1 >> b2
    switch = FromContext(name="route", cases={"a": a1, "b": b1})

    result = run(switch, decision="b")

    assert state_of(result, "a1", "a2", "a3", "b1", "b2") == {
        "a1": SKIPPED, "a2": SKIPPED, "a3": SKIPPED, "b1": SUCCESS, "b2": SUCCESS}


@pytest.mark.parametrize("policy", [Join.ALL, Join.ANY, Join.quorum(1), Join.BEST_EFFORT],
                         ids=repr)
def test_merge_after_a_switch_runs_on_the_branch_that_ran(policy):
    approve, review, reject = leaf("approve"), leaf("review"), leaf("reject")
    review_2 = leaf("review_2")
    review >> review_2
    merge = FunctionNode(lambda c, p: [n for n in ("approve", "review_2", "reject") if _has(c, n)],
                         name="merge", join=policy)
    [approve, review_2, reject] >> merge
    switch = FromContext(name="route", cases={"approve": approve, "review": review,
                                               "reject": reject})

    result = run(switch, decision="review")

    assert state_of(result, "approve", "reject", "review_2", "merge") == {
        "approve": SKIPPED, "reject": SKIPPED, "review_2": SUCCESS, "merge": SUCCESS}
    assert result.outputs["merge"] == ["review_2"], "the merge sees only the branch that ran"


def _has(ctx, name):
    try:
        ctx.result_of(name)
    except LookupError:
        return False
    return True


def test_merge_fails_fast_when_the_chosen_branch_failed():
    def broken(ctx, param):
        raise ValueError("review service down")

    review = FunctionNode(broken, name="review")
    approve = leaf("approve")
    merge = leaf("merge")
    [approve, review] >> merge
    switch = FromContext(name="route", cases={"approve": approve, "review": review})

    result = run(switch, decision="review")

    wr = result["merge"].work_result
    assert wr.state is EXCEPTION and isinstance(wr.exception, UpstreamFailedError)
    assert wr.exception.father == "review"
    assert result["approve"].work_result.state is SKIPPED
    assert set(result.failed) == {"review", "merge"}


def test_a_case_can_start_several_nodes():
    fraud, notify, refund = leaf("fraud"), leaf("notify"), leaf("refund")
    ok = leaf("ok")
    switch = FromContext(name="route", cases={"reject": [fraud, notify, refund], "approve": ok})

    result = run(switch, decision="reject")

    assert state_of(result, "fraud", "notify", "refund", "ok") == {
        "fraud": SUCCESS, "notify": SUCCESS, "refund": SUCCESS, "ok": SKIPPED}


def test_one_node_may_serve_several_cases():
    shared, other = leaf("shared"), leaf("other")
    switch = FromContext(name="route", cases={"a": shared, "b": shared, "c": other})

    assert state_of(run(switch, decision="b"), "shared", "other") == {
        "shared": SUCCESS, "other": SKIPPED}


def test_sons_wired_outside_the_cases_always_run():
    audit = leaf("audit")
    yes, no = leaf("yes"), leaf("no")
    switch = FromContext(name="route", cases={True: yes, False: no})
    switch >> audit

    result = run(switch, decision=False)

    assert state_of(result, "audit", "yes", "no") == {"audit": SUCCESS, "yes": SKIPPED, "no": SUCCESS}


@pytest.mark.parametrize("decision", [None, "escalate", 3], ids=repr)
def test_default_takes_every_value_without_a_case(decision):
    approve, review = leaf("approve"), leaf("manual_review")
    switch = FromContext(name="route", cases={"approve": approve}, default=review)

    result = run(switch, decision=decision)

    assert state_of(result, "approve", "manual_review") == {
        "approve": SKIPPED, "manual_review": SUCCESS}


def test_none_can_be_a_case_of_its_own():
    empty, other, fallback = leaf("empty"), leaf("other"), leaf("fallback")
    switch = FromContext(name="route", cases={None: empty, "x": other}, default=fallback)

    assert state_of(run(switch, decision=None), "empty", "other", "fallback") == {
        "empty": SUCCESS, "other": SKIPPED, "fallback": SKIPPED}


def test_a_value_with_no_case_and_no_default_fails_the_switch_naming_value_and_cases():
    cases = {d: leaf(d.value) for d in (Decision.APPROVE, Decision.REJECT)}
    after = leaf("after")
    cases[Decision.APPROVE] >> after
    switch = FromContext(name="route", cases=cases)

    result = run(switch, decision="escalate")

    wr = result["route"].work_result
    assert wr.state is EXCEPTION
    error = wr.exception
    assert isinstance(error, UnknownCaseError) and isinstance(error, LookupError)
    assert error.switch == "route" and error.value == "escalate"
    assert error.cases == [Decision.APPROVE, Decision.REJECT]
    message = str(error)
    assert "'route'" in message and "'escalate'" in message
    assert repr(Decision.APPROVE) in message and repr(Decision.REJECT) in message
    # nothing runs by accident: the case nodes fail fast like any son of a failed node
    for name in ("approve", "reject", "after"):
        assert result[name].work_result.state is EXCEPTION
        assert result[name].work_result.attempts == 0
    assert not result.ok
    with pytest.raises(UnknownCaseError):
        result.raise_for_failure()


def test_an_unhashable_decision_fails_the_switch_with_a_clear_error():
    switch = FromContext(name="route", cases={"a": leaf("a")}, default=leaf("b"))

    result = run(switch, decision={"decision": "a"})

    error = result["route"].work_result.exception
    assert isinstance(error, TypeError)
    assert "'route'" in str(error) and "not hashable" in str(error)


def test_a_switch_that_raises_is_retried_like_any_node():
    calls = []

    def decide(ctx, param):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("rules service blip")
        return "b"

    switch = SwitchNode.of(decide, cases={"a": leaf("a"), "b": leaf("b")}, retries=1)

    result = run(switch)

    assert switch.name == "decide", "SwitchNode.of names the node after the function"
    assert state_of(result, "decide", "a", "b") == {"decide": SUCCESS, "a": SKIPPED, "b": SUCCESS}
    assert result["decide"].work_result.attempts == 2


def test_a_switch_of_an_async_function_awaits_its_decision():
    seen = []

    async def decide(ctx, param):
        seen.append(param)
        return "b"

    switch = SwitchNode.of(decide, "order-1", cases={"a": leaf("a"), "b": leaf("b")})

    result = run(switch)

    assert state_of(result, "decide", "a", "b") == {"decide": SUCCESS, "a": SKIPPED, "b": SUCCESS}
    assert result["decide"].work_result.result == "b" and seen == ["order-1"]


def test_a_switch_can_wait_for_fathers_and_read_their_results():
    risk = leaf("risk", {"decision": "reject", "score": 0.97})
    inventory = leaf("inventory", 3)
    charge, reject = leaf("charge"), leaf("reject")
    switch = SwitchNode.of(lambda c, p: c.result_of("risk")["decision"], name="route",
                           cases={"approve": charge, "reject": reject})
    [risk, inventory] >> switch

    result = run([risk, inventory])

    assert state_of(result, "charge", "reject") == {"charge": SKIPPED, "reject": SUCCESS}


def test_nested_switches_skip_the_inner_switch_with_its_branch():
    inner_a, inner_b = leaf("inner_a"), leaf("inner_b")
    inner = SwitchNode.of(lambda c, p: "a", name="inner", cases={"a": inner_a, "b": inner_b})
    other = leaf("other")
    outer = FromContext(name="outer", cases={"in": inner, "out": other})

    taken = run(outer, decision="in")
    not_taken = run(outer, decision="out")

    assert state_of(taken, "inner", "inner_a", "inner_b", "other") == {
        "inner": SUCCESS, "inner_a": SUCCESS, "inner_b": SKIPPED, "other": SKIPPED}
    assert state_of(not_taken, "inner", "inner_a", "inner_b", "other") == {
        "inner": SKIPPED, "inner_a": SKIPPED, "inner_b": SKIPPED, "other": SUCCESS}


def test_one_switch_graph_serves_concurrent_runs_with_different_decisions():
    a, b = leaf("a"), leaf("b")
    switch = FromContext(name="route", cases={"a": a, "b": b})
    barrier = threading.Barrier(2)
    outcomes: dict[str, dict[str, ResultState]] = {}

    def request(decision):
        barrier.wait(LONG)
        result = TaskScheduling.start(switch, executor=pool, timeout=LONG,
                                      context=TaskContext(decision=decision))
        outcomes[decision] = state_of(result, "a", "b")

    with ThreadPoolExecutor(4, thread_name_prefix="switch") as pool:
        threads = [threading.Thread(target=request, args=(d,), name=f"req-{d}") for d in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LONG)

    assert outcomes == {"a": {"a": SUCCESS, "b": SKIPPED}, "b": {"a": SKIPPED, "b": SUCCESS}}
    assert switch.cases["a"] == (a,), "the definition is not changed by its runs"


# --- construction -------------------------------------------------------------------------------


def test_cases_and_default_are_wired_as_sons_at_construction():
    a, b, d = leaf("a"), leaf("b"), leaf("d")
    switch = FromContext(name="route", cases={"a": a, "b": [b]}, default=d)

    assert switch.son_handler == [a, b, d]
    assert a.father_handler == [switch]
    assert dict(switch.cases) == {"a": (a,), "b": (b,)} and switch.default == (d,)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"cases": [("a", None)]}, TypeError, "mapping"),
    ({"cases": {"a": "not a node"}}, TypeError, "case 'a' of switch 'route'"),
    ({"cases": {"a": [FunctionNode(lambda c, p: 1, name="x"), 3]}}, TypeError, r"\[1\]"),
    ({"cases": {"a": []}}, FlowDefinitionError, "empty"),
    ({"cases": {}}, FlowDefinitionError, "no cases and no default"),
    ({}, FlowDefinitionError, "no cases and no default"),
    ({"cases": {"a": FunctionNode(lambda c, p: 1, name="x")}, "default": 5}, TypeError, "default"),
])
def test_bad_cases_are_rejected_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        FromContext(name="route", **kwargs)


def test_a_switch_cannot_be_its_own_case():
    class Loop(SwitchNode):
        def __init__(self):
            super().__init__(name="loop", cases={"again": self})

        def task(self, ctx, param):
            return "again"

    with pytest.raises(FlowDefinitionError, match="own cases"):
        Loop()


def test_a_switch_without_a_task_is_rejected_before_anything_runs():
    ran = []
    switch = SwitchNode(name="bare", cases={"a": FunctionNode(lambda c, p: ran.append(1), name="a")})

    with ThreadPoolExecutor(1) as pool, pytest.raises(FlowDefinitionError, match="'bare'.*task"):
        TaskScheduling.start(switch, executor=pool, timeout=LONG)
    assert ran == []


def test_switch_of_rejects_a_non_callable():
    with pytest.raises(TypeError, match="callable"):
        SwitchNode.of("approve", cases={"approve": leaf("a")})


# --- process pools: the decision travels back, the branches stay here ----------------------------


def decide_reject(ctx, param):
    return "reject"


class Unpicklable(SchedulingNode):
    """A branch node holding a lock: it can never travel to another process."""

    def __init__(self, name):
        super().__init__(name=name)
        self.lock = threading.Lock()

    def task(self, ctx, param):
        return self.name


def test_switch_on_a_process_pool_chooses_in_the_caller():
    approve, reject = Unpicklable("approve"), FunctionNode(decide_reject, name="reject")
    switch = SwitchNode.of(decide_reject, name="route", cases={"approve": approve, "reject": reject})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = TaskScheduling.start(switch, executor=pool, timeout=LONG)

    assert result.ok, result.failed
    assert state_of(result, "route", "approve", "reject") == {
        "route": SUCCESS, "approve": SKIPPED, "reject": SUCCESS}


# --- regressions of engine defects found by these tests ------------------------------------------


def test_unchosen_case_node_is_skipped_even_when_it_has_another_father():
    charged = []
    inventory = leaf("inventory", 3)
    charge = FunctionNode(lambda c, p: charged.append("charged"), name="charge")
    reject = leaf("reject")
    inventory >> charge
    switch = FromContext(name="route", cases={"approve": charge, "reject": reject})

    result = run([switch, inventory], decision="reject")

    assert charged == [], "a rejected order must never be charged"
    assert result["charge"].work_result.state is SKIPPED


@pytest.mark.parametrize("policy", [Join.ANY, Join.quorum(1)], ids=repr)
def test_join_failing_after_a_skipped_father_names_the_father_that_failed(policy):
    error = ValueError("real failure")

    def broken(ctx, param):
        raise error

    failed = FunctionNode(broken, name="failed")
    chosen, unchosen = leaf("chosen"), leaf("unchosen")
    switch = SwitchNode.of(lambda c, p: "x", name="route", cases={"x": chosen, "y": unchosen})
    switch.depends_on(failed, optional=True)  # the failure settles before the skip, always
    son = FunctionNode(lambda c, p: "ran", name="son", join=policy)
    son.set_father_handler([failed, unchosen])

    result = run(failed, workers=1)

    wr = result["son"].work_result
    assert wr.state is EXCEPTION
    assert wr.exception.father == "failed" and wr.exception.__cause__ is error
