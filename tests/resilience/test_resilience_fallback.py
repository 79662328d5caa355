"""Fallback: a stand-in value or callable, refused early when it cannot take (ctx, error)."""

from __future__ import annotations

import pickle
import traceback

import pytest

from taskflow.errors import FlowDefinitionError, TaskflowError
from taskflow.model.result import ResultState
from taskflow.resilience import Fallback, FallbackError


def test_a_plain_value_stands_in_as_it_is() -> None:
    fb = Fallback({"in_stock": None}, node="stock")
    assert fb.value({}, TimeoutError()) == {"in_stock": None}


def test_a_callable_gets_ctx_and_the_error() -> None:
    seen: list[tuple[object, BaseException]] = []

    def stand_in(ctx: object, error: BaseException) -> str:
        seen.append((ctx, error))
        return "cached page"

    error = ConnectionError("down")
    ctx = {"sku": 1}
    assert Fallback(stand_in, node="stock").value(ctx, error) == "cached page"
    assert seen == [(ctx, error)]


@pytest.mark.parametrize("bad", [lambda: 1, lambda ctx: 1, lambda a, b, c: 1])
def test_a_callable_that_cannot_take_ctx_and_error_is_refused_naming_the_node(bad: object) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        Fallback(bad, node="stock")
    assert str(info.value).startswith("node 'stock': fallback <function")
    assert "cannot be called as fallback(ctx, error)" in str(info.value)


def test_a_fallback_that_raises_chains_both_errors() -> None:
    original = ConnectionError("backend down")

    def broken(ctx: object, error: BaseException) -> object:
        raise ValueError("no cached copy")

    with pytest.raises(FallbackError) as info:
        Fallback(broken, node="stock").value({}, original)
    err = info.value
    assert isinstance(err, TaskflowError) and isinstance(err, RuntimeError)
    assert err.error is original and isinstance(err.fallback_error, ValueError)
    assert err.__cause__ is err.fallback_error
    assert err.fallback_error.__context__ is original
    assert str(err) == (
        "node 'stock': fallback raised ValueError: no cached copy while standing in for"
        " ConnectionError: backend down"
    )
    text = "".join(traceback.format_exception(err))
    assert "backend down" in text and "no cached copy" in text


def test_it_covers_exception_and_timeout_only() -> None:
    assert [s.name for s in ResultState if Fallback.covers(s)] == ["TIMEOUT", "EXCEPTION"]
    assert Fallback.covers("TIMEOUT") and not Fallback.covers("CANCELLED")


def test_a_value_fallback_pickles() -> None:
    copy = pickle.loads(pickle.dumps(Fallback([1, 2], node="n")))
    assert copy.value(None, ValueError()) == [1, 2] and copy.node == "n"
