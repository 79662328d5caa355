"""Conductor-style fork_join (docs/concepts/joins.md): serial branches in parallel, a join that waits
only for ``join_on``, and a JoinOutput that reports what succeeded, failed and is missing."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor

import pytest
from conftest import LONG, SHORT

from taskflow import (
    FlowDefinitionError,
    FunctionNode,
    Join,
    NodeTimeoutError,
    ResultState,
    TaskContext,
    TaskScheduling,
    UpstreamFailedError,
)
from taskflow.kinds.forkjoin import ForkNode, JoinNode, JoinOutput, fork_join
from taskflow.kinds.switch import SwitchNode
from taskflow.model.result import FlowStatus

SUCCESS, EXCEPTION, CANCELLED, SKIPPED = (ResultState.SUCCESS, ResultState.EXCEPTION,
                                          ResultState.CANCELLED, ResultState.SKIPPED)


class Trace:
    """Task starts and ends in the order they happened."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def at(self, name: str, kind: str) -> int:
        return self.events.index((name, kind))

    def node(self, name, fn=None, **options):
        trace = self

        def task(ctx, param):
            trace.events.append((name, "start"))
            try:
                return fn(ctx) if fn is not None else name
            finally:
                trace.events.append((name, "end"))

        return FunctionNode(task, name=name, **options)


def leaf(name, fn=None, **options):
    return FunctionNode((lambda c, p: fn(c)) if fn is not None else (lambda c, p: name),
                        name=name, **options)


def states(result, *names):
    return {n: result[n].work_result.state for n in names}


def raiser(exc):
    def fn(ctx):
        raise exc

    return fn


# --- shape ------------------------------------------------------------------------------------


def test_fork_join_wires_serial_branches_between_a_fork_and_a_join():
    a1, a2, b1 = leaf("a1"), leaf("a2"), leaf("b1")

    fork = fork_join([[a1, a2], [b1]])

    assert isinstance(fork, ForkNode) and fork.name == "fork"
    assert fork.son_handler == [a1, b1]
    assert a1.son_handler == [a2]
    join = fork.join_node
    assert isinstance(join, JoinNode) and join.name == "join" and join.join == Join.ALL
    assert join.father_handler == [a2, b1], "by default the join waits for each branch's end"
    assert fork.branches == ((a1, a2), (b1,))


def test_branches_are_serial_chains_that_run_in_parallel(make_executor):
    trace = Trace()
    barrier = threading.Barrier(3)
    branches = [[trace.node(f"{b}1", lambda c: barrier.wait(LONG)), trace.node(f"{b}2")]
                for b in "xyz"]

    result = TaskScheduling.start(fork_join(branches), executor=make_executor(3), timeout=LONG)

    assert result.ok, "the three first nodes met at a barrier: the branches ran in parallel"
    for b in "xyz":
        assert trace.at(f"{b}1", "end") < trace.at(f"{b}2", "start"), "a branch is a chain"
    output = result.outputs["join"]
    assert output == JoinOutput({"x2": "x2", "y2": "y2", "z2": "z2"}, {}, [], True)
    assert result.outputs["fork"] is None, "the fork has no output"


def test_branch_left_out_of_join_on_does_not_block_the_join(make_executor, gate):
    trace = Trace()
    after_join_ran = gate()
    email = [trace.node("payload_email"), trace.node("email")]
    sms = [trace.node("payload_sms"), trace.node("sms")]
    http = [trace.node("payload_http"),
            trace.node("http", lambda c: after_join_ran.wait(LONG) and "delivered")]
    fork = fork_join([email, sms, http], join_on=["email", "sms"])
    summary = trace.node("summary", lambda c: (after_join_ran.set(),
                                               sorted(c.result_of("join").results))[1])
    fork.join_node >> summary

    result = TaskScheduling.start(fork, executor=make_executor(3), timeout=LONG)

    assert trace.at("summary", "end") < trace.at("http", "end"), (
        "the join's son ran while the http branch was still running")
    assert result.outputs["summary"] == ["email", "sms"]
    assert result["http"].work_result.state is SUCCESS, (
        "start returns only once the excluded branch finished too")
    assert result.outputs["http"] == "delivered"


def test_join_on_accepts_nodes_as_well_as_names(make_executor):
    a, b, c = leaf("a"), leaf("b"), leaf("c")

    fork = fork_join([[a], [b], [c]], join_on=[a, "c", a])

    assert fork.join_node.father_handler == [a, c], "duplicates are dropped, order kept"
    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)
    assert list(result.outputs["join"].results) == ["a", "c"]


def test_join_on_a_middle_node_lets_the_rest_of_its_branch_run_on(make_executor, gate):
    joined = gate()
    first = leaf("first")
    rest = leaf("rest", lambda c: joined.wait(LONG) and "rest")
    other = leaf("other")

    class Signal(JoinNode):
        def merge(self, ctx, output):
            joined.set()
            return output

    fork = fork_join([[first, rest], [other]], join=Signal(name="join"), join_on=["first", "other"])

    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)

    assert result.outputs["join"].results == {"first": "first", "other": "other"}
    assert result.outputs["rest"] == "rest"


def test_empty_join_on_means_the_join_waits_for_nothing_but_the_fork(make_executor, gate):
    joined = gate()
    slow = [leaf(f"slow{i}", lambda c: joined.wait(LONG) and "late") for i in range(2)]

    class Signal(JoinNode):
        def merge(self, ctx, output):
            joined.set()
            return output

    fork = fork_join([[slow[0]], [slow[1]]], join=Signal(name="join"), join_on=[])

    result = TaskScheduling.start(fork, executor=make_executor(3), timeout=LONG)

    assert fork.join_node.father_handler == [fork]
    assert result.outputs["join"] == JoinOutput({}, {}, [], True), "the fork is not reported"
    assert result.outputs["slow0"] == result.outputs["slow1"] == "late"


def test_fork_join_can_follow_and_precede_other_nodes(make_executor):
    request = leaf("request", lambda c: {"user": "u-1"})
    a = leaf("a", lambda c: c.result_of("request")["user"] + ":a")
    b = leaf("b", lambda c: c.result_of("request")["user"] + ":b")
    fork = fork_join([[a], [b]], fork_name="fan")
    request >> fork
    done = leaf("done", lambda c: sorted(c.result_of("join").results.values()))
    fork.join_node >> done

    result = TaskScheduling.start(request, executor=make_executor(2), timeout=LONG)

    assert result.outputs["done"] == ["u-1:a", "u-1:b"]
    assert result.outputs["fan"] is None


def test_a_custom_join_node_and_merge_compute_the_joined_value(make_executor):
    class Total(JoinNode):
        def merge(self, ctx, output):
            return sum(output.results.values())

    fork = fork_join([[leaf("a", lambda c: 1)], [leaf("b", lambda c: 2)]], join=Total(name="total"))

    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)

    assert result.outputs["total"] == 3


def test_any_node_can_be_the_join(make_executor):
    join = leaf("join", lambda c: c.result_of("a") + c.result_of("b"))

    fork = fork_join([[leaf("a", lambda c: 1)], [leaf("b", lambda c: 2)]], join=join)

    assert TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG).outputs["join"] == 3


# --- failures and policies ----------------------------------------------------------------------


def test_join_all_fails_fast_when_a_joined_branch_fails(make_executor):
    error = ValueError("sms gateway down")
    fork = fork_join([[leaf("email")], [leaf("sms", raiser(error))]])
    after = leaf("after")
    fork.join_node >> after

    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)

    wr = result["join"].work_result
    assert wr.state is EXCEPTION and isinstance(wr.exception, UpstreamFailedError)
    assert wr.exception.__cause__ is error
    assert result["after"].work_result.state is EXCEPTION


def test_failure_in_a_branch_outside_join_on_does_not_fail_the_join(make_executor):
    fork = fork_join([[leaf("email")], [leaf("http", raiser(OSError("webhook 503")))]],
                     join_on=["email"])

    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)

    assert result.outputs["join"] == JoinOutput({"email": "email"}, {}, [], True)
    assert set(result.failed) == {"http"}, "the failure is still reported"
    assert not result.ok and result.status is FlowStatus.FAILED, "http is a sink that failed"


def test_optional_branch_failure_is_tolerated_and_reported_by_the_join(make_executor):
    error = ValueError("sms gateway down")
    sms = leaf("sms", raiser(error))
    fork = fork_join([[leaf("email")], [sms]])
    fork.join_node.depends_on(sms, optional=True)

    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)

    output = result.outputs["join"]
    assert output.results == {"email": "email"} and output.failed == {"sms": error}
    assert not output.complete
    assert result.ok and result.status is FlowStatus.COMPLETED_WITH_ERRORS


def test_best_effort_join_reports_failed_timed_out_and_skipped_branches_honestly(make_executor, gate):
    release = gate()
    error = ValueError("broken")
    unchosen, chosen = leaf("unchosen"), leaf("chosen")
    switch = SwitchNode.of(lambda c, p: "go", name="switch", cases={"go": chosen, "no": unchosen})
    fork = fork_join(
        [[leaf("ok")], [leaf("bad", raiser(error))],
         [leaf("hung", lambda c: release.wait(LONG), timeout=SHORT)], [switch, unchosen]],
        join=JoinNode(name="join", join=Join.BEST_EFFORT),
    )

    result = TaskScheduling.start(fork, executor=make_executor(4), timeout=LONG)

    output = result.outputs["join"]
    assert output.results == {"ok": "ok"}
    assert output.failed["bad"] is error
    assert isinstance(output.failed["hung"], NodeTimeoutError)
    assert output.missing == ["unchosen"]
    assert output.complete is False


def test_any_join_takes_the_first_branch_and_cancels_the_others_whole(make_executor):
    winner_started, done, slow_returned = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def slow(ctx):
        winner_started.set()
        done.wait(LONG)
        seen["cancelled"] = ctx.cancelled
        slow_returned.set()
        return "slow"

    class First(JoinNode):
        def merge(self, ctx, output):
            done.set()
            return output

    slow_branch = [leaf("slow_1", slow), leaf("slow_2"), leaf("slow_3")]
    fast_branch = [leaf("fast_1", lambda c: winner_started.wait(LONG) and "fast")]
    fork = fork_join([slow_branch, fast_branch], join=First(name="join", join=Join.ANY))

    try:
        result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)
    finally:
        done.set()

    assert slow_returned.wait(LONG) and seen["cancelled"]
    assert result.outputs["join"].results == {"fast_1": "fast"}
    assert states(result, "slow_1", "slow_2", "slow_3") == dict.fromkeys(
        ("slow_1", "slow_2", "slow_3"), CANCELLED), "the whole losing chain is cancelled"
    assert result.ok


def test_quorum_join_over_branches(make_executor):
    fork = fork_join([[leaf("a")], [leaf("b", raiser(ValueError("b")))], [leaf("c")]],
                     join=JoinNode(name="join", join=Join.quorum(2)))

    result = TaskScheduling.start(fork, executor=make_executor(1), timeout=LONG)

    assert result["join"].work_result.state is SUCCESS
    assert set(result.outputs["join"].results) <= {"a", "c"}


# --- validation --------------------------------------------------------------------------------


def test_join_on_a_node_outside_the_branches_is_rejected_naming_it():
    with pytest.raises(FlowDefinitionError, match="'http_notification'.*'email'"):
        fork_join([[leaf("email")], [leaf("sms")]], join_on=["email", "http_notification"])
    stranger = leaf("stranger")
    with pytest.raises(FlowDefinitionError, match="'stranger'"):
        fork_join([[leaf("email")]], join_on=[stranger])


@pytest.mark.parametrize("branches, join_on, error, match", [
    ([], None, FlowDefinitionError, "at least one branch"),
    ([[]], None, FlowDefinitionError, "branch 0 .*empty"),
    ("ab", None, TypeError, "branches"),
    ([[1]], None, TypeError, r"branch 0\[0\]"),
    ([5], None, TypeError, "branch 0"),
    ([[FunctionNode(lambda c, p: 1, name="x")]], "x", TypeError, "join_on"),
])
def test_bad_fork_join_arguments_are_rejected(branches, join_on, error, match):
    with pytest.raises(error, match=match):
        fork_join(branches, join_on=join_on)


def test_a_node_in_two_branches_or_used_as_the_join_is_rejected():
    shared = leaf("shared")
    with pytest.raises(FlowDefinitionError, match="'shared' is in branches 0 and 1"):
        fork_join([[shared], [leaf("b"), shared]])
    join = JoinNode(name="j")
    with pytest.raises(FlowDefinitionError, match="'j'"):
        fork_join([[leaf("a"), join]], join=join)
    with pytest.raises(TypeError, match="join"):
        fork_join([[leaf("a")]], join="join")  # type: ignore[arg-type]


def test_a_single_node_is_a_one_node_branch(make_executor):
    fork = fork_join([leaf("a"), [leaf("b1"), leaf("b2")]])

    result = TaskScheduling.start(fork, executor=make_executor(2), timeout=LONG)

    assert list(result.outputs["join"].results) == ["a", "b2"]


def test_fork_join_graph_can_be_started_many_times(make_executor):
    fork = fork_join([[leaf("a", lambda c: c["n"])], [leaf("b", lambda c: -c["n"])]])
    pool = make_executor(2)
    outputs = [TaskScheduling.start(fork, executor=pool, timeout=LONG, context=TaskContext(n=n))
               .outputs["join"].results for n in range(3)]

    assert outputs == [{"a": n, "b": -n} for n in range(3)]


# --- process pools: the JoinOutput is built where the task runs, from what travels there --------


def one(ctx, param):
    return 1


def two(ctx, param):
    return 2


def broken(ctx, param):
    raise ValueError("broken in a worker process")


def test_fork_join_on_a_process_pool():
    a, b, bad = FunctionNode(one, name="a"), FunctionNode(two, name="b"), FunctionNode(broken, name="bad")
    fork = fork_join([[a], [b], [bad]], join=JoinNode(name="join", join=Join.BEST_EFFORT))
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = TaskScheduling.start(fork, executor=pool, timeout=LONG)

    output = result.outputs["join"]
    assert output.results == {"a": 1, "b": 2}
    # only succeeded fathers' values travel to the worker: the failed one is reported missing
    assert output.missing == ["bad"] and output.failed == {} and not output.complete
    assert set(result.failed) == {"bad"}
