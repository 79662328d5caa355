"""What failed and why: ``FlowResult.summary``, and ``not_run`` in reports for a node that never
started because a father failed or the budget ran out."""

from __future__ import annotations

import json
import threading

from conftest import LONG, SHORT

from taskflow import FunctionNode, ResultState, TaskScheduling


def boom(ctx, param):
    raise ValueError("db down")


def test_a_failed_chain_names_the_node_that_failed_and_the_ones_that_never_ran(make_executor):
    a = FunctionNode(boom, name="a")
    b = FunctionNode(lambda c, p: 1, name="b")
    c = FunctionNode(lambda c, p: 2, name="c")
    a >> b >> c

    result = TaskScheduling.start(a, executor=make_executor(2), timeout=LONG)

    assert result.summary == ("FAILED: 'a' raised ValueError: db down; "
                              "2 nodes not run: upstream failed ('b', 'c')")
    report = result.report()
    assert report.summary == result.summary
    assert {n.name: n.not_run for n in report.nodes} == {
        "a": None, "b": "upstream failed", "c": "upstream failed"}
    assert {n.name: n.state for n in report.nodes} == {
        "a": "EXCEPTION", "b": "EXCEPTION", "c": "EXCEPTION"}, "states are unchanged"
    assert json.loads(report.model_dump_json())["nodes"][1]["not_run"] == "upstream failed"


def test_a_timed_out_run_says_which_node_ran_out_and_which_never_started(make_executor, gate):
    release = gate()
    slow = FunctionNode(lambda c, p: release.wait(LONG), name="slow")
    after = FunctionNode(lambda c, p: 1, name="after")
    slow >> after

    result = TaskScheduling.start(slow, executor=make_executor(2), timeout=SHORT)
    release.set()

    assert result.result_of("after").state is ResultState.TIMEOUT
    assert result.summary is not None and result.summary.startswith("TIMED_OUT: 'slow' timed out")
    assert "1 node not run: budget ran out ('after')" in result.summary
    assert {n.name: n.not_run for n in result.report().nodes} == {
        "slow": None, "after": "budget ran out"}


def test_a_node_timeout_fails_its_sons_fast_as_upstream_failed(make_executor, gate):
    release = gate()
    started = threading.Event()

    def hang(ctx, param):
        started.set()
        release.wait(LONG)

    slow = FunctionNode(hang, name="slow", timeout=SHORT)
    son = FunctionNode(lambda c, p: 1, name="son")
    slow >> son

    result = TaskScheduling.start(slow, executor=make_executor(2), timeout=LONG)
    release.set()

    assert started.is_set()
    assert result.result_of("son").state is ResultState.TIMEOUT
    assert {n.name: n.not_run for n in result.report().nodes} == {
        "slow": None, "son": "upstream failed"}
    assert "1 node not run: upstream failed ('son')" in (result.summary or "")


def test_a_run_where_nothing_failed_has_no_summary(make_executor):
    result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="a"),
                                  executor=make_executor(1), timeout=LONG)
    assert result.summary is None and result.report().summary is None


def test_a_degraded_node_is_summarised_without_failing_the_run(make_executor):
    node = FunctionNode(boom, name="a", fallback="stand-in")

    result = TaskScheduling.start(node, executor=make_executor(1), timeout=LONG)

    assert result.ok
    assert result.summary == ("COMPLETED_WITH_ERRORS: 1 node degraded to a fallback ('a')")
