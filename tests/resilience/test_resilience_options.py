"""Resilience options on nodes: checked at definition, naming the node; ``ctx.operation_id``."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

import taskflow
from taskflow import (
    Bulkhead,
    CircuitBreaker,
    FanOutNode,
    FlowDefinitionError,
    FunctionNode,
    Hedge,
    RateLimit,
    TaskScheduling,
)
from taskflow.model.graph import compile_plan


def task(ctx, param):
    return param


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bulkhead": 3}, "bulkhead must be a taskflow.Bulkhead"),
        ({"breaker": "x"}, "breaker must be a taskflow.CircuitBreaker"),
        ({"rate_limit": 1.0}, "rate_limit must be a taskflow.RateLimit"),
        ({"hedge": 0.1, "idempotent": True}, "hedge must be a taskflow.Hedge"),
        ({"hedge": Hedge(after=0.1)}, "must be declared idempotent=True"),
        ({"idempotent": "yes"}, "idempotent must be True or False"),
        ({"fallback": lambda ctx: 1}, r"cannot be called as fallback\(ctx, error\)"),
        ({"share_key": lambda ctx: 1}, r"cannot be called as share_key\(ctx, param\)"),
        ({"cache_ttl": 5.0}, "cache_ttl needs a share_key"),
        ({"share_key": lambda c, p: p, "cache_ttl": -1}, "cache_ttl must be"),
        ({"share_key": lambda c, p: p, "cache_size": 0}, "cache_size must be"),
        ({"priority": float("nan")}, "priority must be a finite number"),
        ({"priority": True}, "priority must be a finite number"),
        ({"min_budget": -0.5}, "min_budget must be"),
    ],
)
def test_bad_option_names_the_node(options, message):
    with pytest.raises(FlowDefinitionError, match=message) as info:
        FunctionNode(task, name="stock", **options)
    assert "'stock'" in str(info.value)


def test_option_changed_after_definition_is_checked_and_recompiles():
    node = FunctionNode(task, name="stock")
    plan = compile_plan((node,))
    assert plan.policy == (None,) and not plan.any_policy
    with pytest.raises(FlowDefinitionError, match="'stock'"):
        node.min_budget = -1
    node.priority = 5
    plan2 = compile_plan((node,))
    assert plan2 is not plan and plan2.policy[0].priority == 5.0


def test_nodes_without_options_carry_no_policy():
    assert FunctionNode(task)._policy is None
    assert FunctionNode(task, fallback=None)._policy is not None  # None is a stand-in value


def test_node_with_options_still_pickles_without_them():
    node = FunctionNode(task, param=3, name="p", bulkhead=Bulkhead("b", max_concurrent=1),
                        breaker=CircuitBreaker("c"), rate_limit=RateLimit("r", per_second=5),
                        fallback=lambda ctx, error: 0, share_key=lambda c, p: p)
    copy = pickle.loads(pickle.dumps(node))
    assert copy.param == 3 and copy._policy is None


def test_errors_and_primitives_are_public():
    for name in ("Bulkhead", "RateLimit", "CircuitBreaker", "Hedge", "BulkheadFullError",
                 "CircuitOpenError", "FallbackError", "UnhashableKeyError"):
        assert name in taskflow.__all__
    from taskflow.resilience import errors

    assert errors.BulkheadFullError is taskflow.BulkheadFullError
    assert issubclass(taskflow.CircuitOpenError, taskflow.TaskflowError)


def test_operation_id_is_stable_across_retries():
    seen = []

    def flaky(ctx, param):
        seen.append(ctx.operation_id)
        if len(seen) < 3:
            raise ValueError("again")
        return ctx.operation_id

    node = FunctionNode(flaky, name="charge", retries=3)
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=5)
    assert result.ok
    assert seen == [f"{result.flow_id}:charge"] * 3
    with ThreadPoolExecutor(2) as pool:
        other = TaskScheduling.start(node, executor=pool, timeout=5)
    assert other.outputs["charge"] != result.outputs["charge"]


def test_operation_id_tells_fan_out_items_apart():
    class Items(FanOutNode):
        def items(self, ctx, param):
            return [(k, k) for k in ("a", "b")]

        def work(self, ctx, item):
            return ctx.operation_id

    node = Items(name="items")
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=5)
    fan = result.outputs["items"]
    assert fan.succeeded == {"a": f"{result.flow_id}:items:a", "b": f"{result.flow_id}:items:b"}


def test_operation_id_outside_a_run_is_none():
    assert taskflow.TaskContext().operation_id is None
