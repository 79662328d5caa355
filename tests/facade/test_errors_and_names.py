"""Errors a newcomer meets first: a mistyped node name is answered with the closest one, the
summary keeps a message's first sentence whole, a bad argument of ``start`` (and ``stream``,
``submit``, ``run_async``) raises one family naming the argument, the status enums print their
bare names, and a node's error is ``error`` in results and reports alike."""

from __future__ import annotations

import asyncio
import contextlib
import io
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

from taskflow import (
    ArgumentError,
    FlowDefinitionError,
    FlowStatus,
    FunctionNode,
    InvalidArgumentError,
    InvalidArgumentValueError,
    NodeState,
    ResultState,
    TaskContext,
    TaskflowError,
    TaskScheduling,
    UnknownNodeError,
    run_async,
)
from taskflow.model.result import _clip
from taskflow.resilience import BreakerState


def product(ctx, param):
    return {"sku": "sku-1"}


def price_typo(ctx, param):
    return ctx.result_of("prodcut")


def price_unknown(ctx, param):
    return ctx.result_of("inventory")


def page_of(price):
    top = FunctionNode(product)
    top >> FunctionNode(price, name="price")
    return top


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2) as p:
        yield p


def test_a_mistyped_name_in_result_of_asks_did_you_mean(pool):
    """Regression: the message advised wiring a node named 'prodcut' upstream."""
    result = TaskScheduling.start(page_of(price_typo), executor=pool, timeout=5)
    err = result.result_of("price").error
    assert isinstance(err, UnknownNodeError) and isinstance(err, KeyError)
    assert err.args == ("prodcut",) and err.close == "product"
    assert str(err) == (f"node 'price' asked for the result of 'prodcut', but no node of flow "
                        f"{result.flow_id} is named 'prodcut'; did you mean 'product'?")
    assert "wire" not in str(err)
    assert result.summary == f"FAILED: 'price' raised UnknownNodeError: {err}"


def test_a_name_close_to_none_still_says_how_to_wire_it(pool):
    result = TaskScheduling.start(page_of(price_unknown), executor=pool, timeout=5)
    err = result.result_of("price").error
    assert isinstance(err, UnknownNodeError) and err.close is None
    assert "did you mean" not in str(err) and "wire the node that computes it" in str(err)


def test_flow_result_lookups_by_name_ask_did_you_mean(pool):
    top = FunctionNode(product)
    result = TaskScheduling.start(top, executor=pool, timeout=5)
    for lookup in (result.result_of, result.__getitem__, result.detached):
        with pytest.raises(KeyError) as info:
            lookup("prodcut")
        assert isinstance(info.value, UnknownNodeError) and info.value.args == ("prodcut",)
        assert str(info.value) == (f"no node named 'prodcut' in flow {result.flow_id}; "
                                   "did you mean 'product'?")
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.close == "product"


def test_targets_overrides_and_priority_ask_did_you_mean(pool):
    top = page_of(price_typo)
    with pytest.raises(InvalidArgumentValueError, match=r"target 'prise' .*did you mean 'price'"):
        TaskScheduling.start(top, executor=pool, targets=["prise"])
    with pytest.raises(InvalidArgumentValueError, match=r"'prise' \(did you mean 'price'\?\)"):
        TaskScheduling.start(top, executor=pool, overrides={"prise": 1})
    with pytest.raises(InvalidArgumentValueError, match=r"did you mean 'sheddable'"):
        TaskScheduling.start(top, executor=pool, priority="sheddble")


def test_summary_keeps_the_first_sentence_whole():
    """Regression: the message was cut at 200 characters, mid-word."""
    first = "the inventory service answered 503 Service Unavailable for " + "sku-1, " * 30
    first = first.rstrip(", ") + "."
    assert len(first) > 200
    assert _clip(first + " Retry later, or read the runbook.", 200) == first + " ..."
    endless = "word " * 200
    cut = _clip(endless, 200)
    assert cut.endswith("word ...") and len(cut) <= 200


def test_summary_quotes_a_short_message_whole():
    assert _clip("inventory answered 504", 200) == "inventory answered 504"


BAD_ARGUMENTS = [
    ({"executor": object()}, InvalidArgumentError, TypeError, "executor"),
    ({"executor": None}, InvalidArgumentError, TypeError, "executor"),
    ({"timeout": "0.2"}, InvalidArgumentError, TypeError, "timeout"),
    ({"timeout": True}, InvalidArgumentError, TypeError, "timeout"),
    ({"timeout": -1}, InvalidArgumentValueError, ValueError, "timeout"),
    ({"timeout": float("nan")}, InvalidArgumentValueError, ValueError, "timeout"),
    ({"context": {"sku": 1}}, InvalidArgumentError, TypeError, "context"),
    ({"name": 3}, InvalidArgumentError, TypeError, "name"),
    ({"name": ""}, InvalidArgumentValueError, ValueError, "name"),
    ({"priority": 1}, InvalidArgumentError, TypeError, "priority"),
    ({"priority": "low"}, InvalidArgumentValueError, ValueError, "priority"),
    ({"overrides": [1]}, InvalidArgumentError, TypeError, "overrides"),
    ({"targets": []}, InvalidArgumentValueError, ValueError, "targets"),
]
IDS = [f"{next(iter(kw))}={next(iter(kw.values()))!r}" for kw, *_ in BAD_ARGUMENTS]


def call(how, top, kwargs):
    if how == "start":
        return TaskScheduling.start(top, **kwargs)
    if how == "stream":
        return TaskScheduling.stream(top, **kwargs)
    if how == "submit":
        return TaskScheduling.submit(top, **kwargs)
    return asyncio.run(run_async(top, **kwargs))


@pytest.mark.parametrize("how", ["start", "stream", "submit", "run_async"])
@pytest.mark.parametrize(("bad", "cls", "builtin", "argument"), BAD_ARGUMENTS, ids=IDS)
def test_a_bad_argument_raises_one_family_naming_it(pool, how, bad, cls, builtin, argument):
    """Regression: a bad executor raised a plain TypeError, timeout="0.2" an InvalidNodeError,
    timeout=-1 a FlowDefinitionError."""
    ran = []
    top = FunctionNode(lambda ctx, p: ran.append(1), name="a")
    kwargs = {"executor": pool, "timeout": 5, **bad}
    with pytest.raises(cls) as info:
        call(how, top, kwargs)
    err = info.value
    assert isinstance(err, ArgumentError) and isinstance(err, TaskflowError)
    assert isinstance(err, builtin) and err.argument == argument
    assert str(err).startswith(argument)
    if builtin is ValueError:  # what these raised before: still caught the same way
        assert isinstance(err, FlowDefinitionError)
    assert ran == []


def test_the_status_enums_print_their_bare_names(pool):
    result = TaskScheduling.start(FunctionNode(product), executor=pool, timeout=5,
                                  context=TaskContext())
    assert str(result.status) == "COMPLETED" == result.report().status
    assert f"{result.result_of('product').state}" == "SUCCESS"
    assert [str(s) for s in ResultState] == [s.name for s in ResultState]
    assert [str(s) for s in FlowStatus] == [s.name for s in FlowStatus]
    assert str(NodeState.FINISH) == "FINISH" and str(BreakerState.HALF_OPEN) == "half_open"


def test_a_nodes_error_is_error_in_the_result_and_the_report(pool):
    def stock(ctx, param):
        raise ConnectionError("inventory reset the connection")

    result = TaskScheduling.start(FunctionNode(stock), executor=pool, timeout=5)
    wr = result.result_of("stock")
    assert isinstance(wr.error, ConnectionError) and wr.error is wr.exception
    node = result.report().nodes[0]
    assert (node.error_type, node.error) == ("ConnectionError", str(wr.error))


def test_demo_fail_with_a_mistyped_node_asks_did_you_mean():
    from taskflow.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["demo", "--fail", "prise"])
    assert code == 2
    assert "unknown node 'prise' (did you mean 'price'?) for --fail" in err.getvalue()
