"""``ctx.result_of(name)`` inside a run reads only the asking node's upstream: a node that is
not an ancestor is refused at once, whatever its state, naming both nodes and the edge to add."""

from __future__ import annotations

import threading

import pytest
from conftest import LONG

from taskflow import (
    FunctionNode,
    ResultNotAvailableError,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
)


class Announces(SchedulingNode):
    """Returns its param and sets ``done`` once it has succeeded."""

    def __init__(self, done: threading.Event, **options):
        super().__init__(**options)
        self.__dict__["done"] = done

    def task(self, ctx, param):
        return "c value"

    def on_success(self, support):
        self.done.set()


def test_reading_a_node_that_is_not_upstream_is_refused_even_when_it_has_finished(make_executor):
    done = threading.Event()
    seen = {}

    def read_c(ctx, param):
        seen["c finished first"] = done.wait(LONG)
        return ctx.result_of("c")

    root = FunctionNode(lambda ctx, p: "root", name="root")
    c = Announces(done, name="c")
    page = FunctionNode(read_c, name="page")
    root >> [c, page]

    result = TaskScheduling.start(root, executor=make_executor(2), timeout=LONG)

    assert seen == {"c finished first": True}
    wr = result["page"].work_result
    assert wr.state is ResultState.EXCEPTION
    assert isinstance(wr.exception, ResultNotAvailableError)
    message = str(wr.exception)
    assert "'c'" in message and "'page'" in message and "not upstream" in message
    assert "depends_on" in message and ">>" in message


def test_a_name_that_is_no_node_of_the_run_says_how_to_wire_it(make_executor):
    page = FunctionNode(lambda ctx, p: ctx.result_of("price"), name="page")

    result = TaskScheduling.start(page, executor=make_executor(1), timeout=LONG)

    exc = result["page"].work_result.exception
    assert isinstance(exc, KeyError)
    assert "'page'" in str(exc) and "'price'" in str(exc) and "depends_on" in str(exc)


def test_fathers_and_farther_ancestors_can_be_read(make_executor):
    a = FunctionNode(lambda ctx, p: 1, name="a")
    b = FunctionNode(lambda ctx, p: ctx.result_of("a") + 1, name="b")
    side = FunctionNode(lambda ctx, p: 10, name="side")
    c = FunctionNode(lambda ctx, p: ctx.result_of("a") + ctx.result_of("b")
                     + ctx.result_of("side"), name="c")
    a >> b >> c
    a >> side >> c

    result = TaskScheduling.start(a, executor=make_executor(2), timeout=LONG)

    assert result.outputs == {"a": 1, "b": 2, "side": 10, "c": 13}


def test_a_hook_reads_its_own_node_and_the_caller_reads_any_node_after_the_run(make_executor):
    seen = {}

    class Own(SchedulingNode):
        def task(self, ctx, param):
            return "own"

        def on_success(self, support):
            seen["own"] = support.context.result_of("own")

    ctx = TaskContext()
    own = Own(name="own")
    other = FunctionNode(lambda c, p: "other", name="other")

    result = TaskScheduling.start([own, other], executor=make_executor(2), timeout=LONG,
                                  context=ctx)

    assert result.ok and seen == {"own": "own"}
    assert ctx.result_of("other") == "other" and ctx.result_of("own") == "own"


def test_a_hook_reading_a_node_that_is_not_upstream_is_refused(make_executor):
    class Reads(SchedulingNode):
        def task(self, ctx, param):
            return 1

        def on_success(self, support):
            support.context.result_of("other")

    root = FunctionNode(lambda c, p: 0, name="root")
    root >> [Reads(name="reads"), FunctionNode(lambda c, p: 2, name="other")]

    result = TaskScheduling.start(root, executor=make_executor(2), timeout=LONG)

    assert result.ok, "a hook that raises never changes the flow"
    error = result.hook_errors["reads"].exception
    assert isinstance(error, ResultNotAvailableError) and "not upstream" in str(error)


@pytest.mark.parametrize("targets", [None, ["b"]])
def test_the_rule_holds_in_a_run_narrowed_to_targets(make_executor, targets):
    a = FunctionNode(lambda ctx, p: 1, name="a")
    b = FunctionNode(lambda ctx, p: ctx.result_of("a") * 2, name="b")
    a >> b

    result = TaskScheduling.start(a, executor=make_executor(1), timeout=LONG, targets=targets)

    assert result.outputs["b"] == 2
