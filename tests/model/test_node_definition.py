"""A node is checked when it is defined: options, the task's arity and wiring mistakes raise in
the call that made them, naming the node and saying what to write instead."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import pytest

from taskflow import (
    FanOutNode,
    FlowDefinitionError,
    FunctionNode,
    InvalidNodeError,
    SchedulingNode,
    SwitchNode,
)
from taskflow.model.callables import is_coroutine_function
from taskflow.resilience import Bulkhead, CircuitBreaker, Hedge, RateLimit


def fetch(ctx, param):
    return param


class Plain(SchedulingNode):
    def task(self, ctx, param):
        return param


# -- options -------------------------------------------------------------------------------------


def test_a_misspelt_option_suggests_the_option_it_resembles():
    with pytest.raises(InvalidNodeError) as info:
        FunctionNode(fetch, name="price", retires=2)
    message = str(info.value)
    assert "node 'price'" in message
    assert "'retires'" in message and "did you mean 'retries'?" in message
    assert "SchedulingNode.__init__" not in message
    assert isinstance(info.value, TypeError)


def test_every_misspelt_option_is_named_at_once():
    with pytest.raises(InvalidNodeError) as info:
        FunctionNode(fetch, timout=1.0, hedgee=None)
    message = str(info.value)
    assert "did you mean 'timeout'?" in message and "did you mean 'hedge'?" in message


def test_an_option_like_no_other_lists_the_options():
    with pytest.raises(InvalidNodeError) as info:
        FunctionNode(fetch, name="n", zzz=1)
    assert "'zzz'" in str(info.value) and "retry_backoff" in str(info.value)


def test_a_misspelt_option_through_a_subclass_that_forwards_its_options_is_named():
    class Fetch(SchedulingNode):
        def __init__(self, sku, **options):
            super().__init__(sku, **options)

        def task(self, ctx, param):
            return param

    with pytest.raises(InvalidNodeError, match=r"did you mean 'retries'\?"):
        Fetch("sku-1", retires=2)


def test_a_misspelt_option_of_a_switch_or_fan_out_is_named():
    with pytest.raises(InvalidNodeError, match=r"did you mean 'default'\?"):
        SwitchNode.of(fetch, cases={1: Plain(name="one")}, defualt=None)
    with pytest.raises(InvalidNodeError, match=r"did you mean 'max_concurrency'\?") as info:
        FanOutNode(max_concurency=3)
    assert "retries" not in str(info.value), "a fan-out does not take the retry options"


def test_function_node_options_are_typed_keyword_only_parameters():
    params = inspect.signature(FunctionNode.__init__).parameters
    expected = {"timeout", "retries", "retry_backoff", "join", "bulkhead", "breaker",
                "rate_limit", "fallback", "hedge", "idempotent", "share_key", "cache_ttl",
                "cache_size", "priority", "min_budget"}
    assert expected <= params.keys()
    assert all(params[o].kind is inspect.Parameter.KEYWORD_ONLY for o in expected)
    assert inspect.signature(SchedulingNode.__init__).parameters.keys() >= expected
    hints = {o: params[o].annotation for o in ("bulkhead", "breaker", "rate_limit", "hedge")}
    assert hints == {"bulkhead": "Bulkhead | None", "breaker": "CircuitBreaker | None",
                     "rate_limit": "RateLimit | None", "hedge": "Hedge | None"}


def test_typed_options_are_accepted_as_before():
    node = FunctionNode(fetch, "sku", "n", timeout=1.0, retries=1, retry_backoff=0.01,
                        bulkhead=Bulkhead("b", max_concurrent=2),
                        breaker=CircuitBreaker("c"), rate_limit=RateLimit("r", per_second=10),
                        hedge=Hedge(after=0.05), idempotent=True, fallback=None, priority=1)
    assert (node.param, node.name, node.timeout, node.retries) == ("sku", "n", 1.0, 1)


@pytest.mark.parametrize("option", ["timeout", "item_timeout"])
def test_a_zero_timeout_is_refused_naming_the_node(option):
    with pytest.raises(FlowDefinitionError) as info:
        if option == "timeout":
            FunctionNode(fetch, name="price", timeout=0)
        else:
            FanOutNode(name="price", item_timeout=0)
    assert f"{option} of node 'price'" in str(info.value) and "> 0" in str(info.value)


def test_a_zero_timeout_set_later_is_refused_too():
    node = FunctionNode(fetch, name="price", timeout=1.0)
    with pytest.raises(FlowDefinitionError, match="timeout of node 'price'"):
        node.timeout = 0
    assert node.timeout == 1.0


@pytest.mark.parametrize(("option", "value"), [
    ("retries", -1), ("retries", 1.5), ("retry_backoff", -1.0), ("retry_backoff", math.inf),
    ("timeout", -1), ("timeout", "1"),
])
def test_a_bad_number_names_the_node(option, value):
    with pytest.raises(FlowDefinitionError) as info:
        FunctionNode(fetch, name="price", **{option: value})
    assert f"{option} of node 'price'" in str(info.value)


def test_a_bad_retries_set_later_names_the_node():
    node = FunctionNode(fetch, name="price")
    with pytest.raises(FlowDefinitionError, match="retries of node 'price' must be >= 0"):
        node.retries = -1


# -- arity ---------------------------------------------------------------------------------------


def one_argument(ctx):
    return 1


@pytest.mark.parametrize("fn", [
    one_argument, lambda: 1, lambda c, p, q: 1, lambda c, p, *, key: 1,
    functools.partial(fetch, 1), functools.partial(fetch, 1, 2),
], ids=["one", "none", "three", "required-keyword", "partial-one-left", "partial-none-left"])
def test_a_function_of_the_wrong_arity_is_refused_when_the_node_is_made(fn):
    with pytest.raises(InvalidNodeError) as info:
        FunctionNode(fn, name="price")
    assert "node 'price'" in str(info.value) and "fn(ctx, param)" in str(info.value)


@pytest.mark.parametrize("fn", [
    fetch, lambda *a: 1, lambda c, p=1, q=2: 1, functools.partial(lambda a, c, p: 1, 1),
    functools.wraps(fetch)(lambda *a, **k: fetch(*a, **k)), max, type("C", (), {
        "__call__": lambda self, ctx, param: 1})(),
], ids=["plain", "varargs", "defaults", "partial", "wrapped", "builtin", "callable-object"])
def test_a_function_that_takes_ctx_and_param_is_accepted(fn):
    assert FunctionNode(fn, name="ok").fn is fn


def test_a_task_of_the_wrong_arity_is_refused_when_its_node_is_made():
    class OneArgument(SchedulingNode):
        def task(self, ctx):
            return 1

    with pytest.raises(InvalidNodeError) as info:
        OneArgument(name="price")
    assert "node 'price'" in str(info.value)
    assert "task(self, ctx, param)" in str(info.value)


def test_a_fan_out_whose_work_cannot_take_an_item_is_refused():
    class Fan(FanOutNode):
        def items(self, ctx, param):
            return []

        def work(self, item):
            return item

    with pytest.raises(InvalidNodeError, match=r"work\(self, ctx, item\)"):
        Fan(name="fan")


def test_a_subclass_fixing_an_inherited_task_is_accepted():
    class Broken(SchedulingNode):
        def task(self, ctx):
            return 1

    class Fixed(Broken):
        def task(self, ctx, param):
            return 2

    assert Fixed(name="fixed").name == "fixed"


# -- wiring --------------------------------------------------------------------------------------


def test_wiring_a_class_says_to_pass_an_instance():
    a = Plain(name="a")
    with pytest.raises(InvalidNodeError, match=r"pass an instance: Plain\(\.\.\.\)") as info:
        a >> Plain
    assert "node 'a'" in str(info.value)
    with pytest.raises(InvalidNodeError, match=r"pass an instance: Plain\(\.\.\.\)"):
        Plain >> a
    with pytest.raises(InvalidNodeError, match=r"item 1 is the class Plain"):
        a >> [Plain(name="b"), Plain]
    with pytest.raises(InvalidNodeError, match=r"pass an instance: Plain\(\.\.\.\)"):
        a.depends_on(Plain)
    assert a.son_handler == [] and a.father_handler == []


def test_wiring_a_name_says_wiring_takes_the_node():
    page = Plain(name="page")
    with pytest.raises(InvalidNodeError) as info:
        page.depends_on("price")
    assert "node 'page'" in str(info.value) and "'price'" in str(info.value)
    assert "not its name" in str(info.value)
    with pytest.raises(InvalidNodeError, match="not its name"):
        page >> "price"


def test_wiring_a_function_says_to_wrap_it():
    a = Plain(name="a")
    with pytest.raises(InvalidNodeError, match=r"FunctionNode\(fetch\)"):
        a.set_son_handler(Plain(name="b"), fetch)
    assert a.son_handler == []


def _plain(ctx: Any, param: Any) -> None:
    return None


async def _coro(ctx: Any, param: Any) -> None:
    return None


async def _agen(ctx: Any, param: Any) -> Any:
    yield None


class _CallableObject:
    def __call__(self, ctx: Any, param: Any) -> None:
        return None

    async def method(self, ctx: Any, param: Any) -> None:
        return None


@functools.wraps(_coro)
def _wrapped_sync(ctx: Any, param: Any) -> None:
    return None


@pytest.mark.parametrize("fn", [
    _plain, _coro, _agen, lambda ctx, p: None, functools.partial(_coro, None),
    functools.partial(_plain, None), _CallableObject(), _CallableObject().method,
    _CallableObject.method, _wrapped_sync, len,
], ids=lambda fn: getattr(fn, "__name__", type(fn).__name__))
def test_the_coroutine_check_from_code_flags_agrees_with_inspect(fn: Any) -> None:
    # a plain function is answered from its code object's flags (no inspect at node build);
    # everything else goes to inspect, so the answers are inspect's for every kind of callable
    assert is_coroutine_function(fn) is inspect.iscoroutinefunction(fn)


@pytest.mark.skipif(not hasattr(inspect, "markcoroutinefunction"), reason="Python 3.12+")
def test_a_function_marked_as_a_coroutine_function_is_one() -> None:
    def marked(ctx: Any, param: Any) -> None:
        return None

    inspect.markcoroutinefunction(marked)  # type: ignore[attr-defined]
    assert is_coroutine_function(marked) is True
