"""``start(..., overrides=...)``: named nodes do the override's work in this run only; hooks
and options stay; bad names are refused before anything runs."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from taskflow import (
    FanOutNode,
    FlowDefinitionError,
    FunctionNode,
    ResultState,
    SchedulingNode,
    SwitchNode,
    TaskScheduling,
    run_async,
)
from taskflow.testing import ManualExecutor


class Inventory(SchedulingNode[str, int]):
    calls = 0

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.hooks: list[str] = []

    def task(self, ctx, param):
        Inventory.calls += 1
        return 5

    def on_success(self, support) -> None:
        support.context["hook"] = ("success", support.work_result.result)

    def on_fail(self, support) -> None:
        support.context["hook"] = ("fail", type(support.work_result.exception).__name__)


def _page() -> tuple[FunctionNode, Inventory, FunctionNode]:
    product = FunctionNode(lambda c, p: {"sku": p}, param="sku-1", name="product")
    stock = Inventory(param="sku-1", name="inventory")
    page = FunctionNode(lambda c, p: (c.result_of("product")["sku"], c.result_of("inventory")),
                        name="page")
    product >> page
    stock >> page
    return product, stock, page


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2, thread_name_prefix="overrides") as ex:
        yield ex


def test_a_constant_override_is_the_nodes_value_and_its_hooks_still_run(pool) -> None:
    product, stock, page = _page()
    before = Inventory.calls
    result = TaskScheduling.start([product, stock], executor=pool, overrides={"inventory": 0})
    assert result.outputs["page"] == ("sku-1", 0)
    assert result["inventory"].work_result.state is ResultState.SUCCESS
    assert result.context["hook"] == ("success", 0)
    assert Inventory.calls == before


def test_a_callable_override_gets_ctx_and_param_and_its_failure_is_the_nodes(pool) -> None:
    product, stock, page = _page()
    seen: list[object] = []

    def down(ctx, param):
        seen.append((param, ctx.flow_id is not None))
        raise ConnectionError("inventory is down")

    result = TaskScheduling.start([product, stock], executor=pool, overrides={"inventory": down})
    assert seen == [("sku-1", True)]
    assert isinstance(result.failed["inventory"].exception, ConnectionError)
    assert result["page"].work_result.state is ResultState.EXCEPTION
    assert result.context["hook"] == ("fail", "ConnectionError")


def test_the_nodes_built_are_never_changed_and_the_next_run_is_real(pool) -> None:
    product, stock, page = _page()
    fn = product.fn
    TaskScheduling.start([product, stock], executor=pool,
                         overrides={"inventory": 1, "product": lambda c, p: {"sku": "x"}})
    assert "task" not in stock.__dict__ and "task" not in product.__dict__
    assert product.fn is fn and stock.hooks == []
    assert TaskScheduling.start([product, stock], executor=pool).outputs["page"] == ("sku-1", 5)


def test_an_overridden_plain_function_node_takes_the_override(pool) -> None:
    a = FunctionNode(lambda c, p: 1, name="a")
    b = FunctionNode(lambda c, p: c.result_of("a") * 10, name="b")
    a >> b
    assert TaskScheduling.start(a, executor=pool, overrides={"a": 4}).outputs == {"a": 4, "b": 40}
    assert TaskScheduling.start(a, executor=pool).outputs == {"a": 1, "b": 10}


def test_a_switch_routes_on_its_overridden_value(pool) -> None:
    yes = FunctionNode(lambda c, p: "approved", name="yes")
    no = FunctionNode(lambda c, p: "rejected", name="no")
    route = SwitchNode.of(lambda c, p: "approve", name="route",
                          cases={"approve": yes, "reject": no})
    result = TaskScheduling.start(route, executor=pool, overrides={"route": "reject"})
    assert result.outputs.get("no") == "rejected" and "yes" not in result.outputs


def test_the_node_options_still_apply_to_the_override(pool) -> None:
    attempts: list[int] = []

    def flaky(ctx, param):
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError("again")
        return "ok"

    node = FunctionNode(lambda c, p: "real", name="call", retries=2)
    result = TaskScheduling.start(node, executor=pool, overrides={"call": flaky})
    assert result.outputs == {"call": "ok"} and result["call"].work_result.attempts == 3


def test_overrides_with_targets_and_submit_on_a_manual_executor() -> None:
    product, stock, page = _page()
    ex = ManualExecutor(seed=2)
    future = TaskScheduling.submit([product, stock], executor=ex, targets=["page"],
                                   overrides={"inventory": 7})
    ex.run_until_idle()
    assert future.result(timeout=0).outputs["page"] == ("sku-1", 7)


def test_run_async_takes_overrides(pool) -> None:
    product, stock, page = _page()
    result = asyncio.run(run_async([product, stock], executor=pool, overrides={"inventory": 3}))
    assert result.outputs["page"] == ("sku-1", 3)


def test_unknown_names_are_refused_before_anything_runs_with_close_names() -> None:
    product, stock, page = _page()
    ex = ManualExecutor()
    with pytest.raises(FlowDefinitionError, match=r"'inventry' \(did you mean 'inventory'\?\)"):
        TaskScheduling.submit([product, stock], executor=ex, overrides={"inventry": 0})
    with pytest.raises(FlowDefinitionError, match=r"names 'zz', 'inventri'.*its nodes are"):
        TaskScheduling.submit([product, stock], executor=ex, overrides={"zz": 0, "inventri": 0})
    assert ex.pending == 0


def test_a_node_left_out_by_targets_cannot_be_overridden() -> None:
    product, stock, page = _page()
    with pytest.raises(FlowDefinitionError, match="'page'"):
        TaskScheduling.submit([product, stock], executor=ManualExecutor(), targets=["product"],
                              overrides={"page": 0})


@pytest.mark.parametrize(("overrides", "error", "match"), [
    (["inventory"], TypeError, "overrides must be a mapping"),
    ({1: 0}, TypeError, "keys must be node names"),
    ({"inventory": lambda ctx: 0}, FlowDefinitionError, r"override of node 'inventory'.*fn\(ctx, param\)"),
])
def test_bad_overrides_name_the_culprit(overrides: object, error: type, match: str) -> None:
    product, stock, page = _page()
    ex = ManualExecutor()
    with pytest.raises(error, match=match):
        TaskScheduling.submit([product, stock], executor=ex, overrides=overrides)  # type: ignore[arg-type]
    assert ex.pending == 0


def test_an_empty_mapping_runs_the_flow_as_built(pool) -> None:
    product, stock, page = _page()
    assert TaskScheduling.start([product, stock], executor=pool,
                                overrides={}).outputs["page"] == ("sku-1", 5)


class Sizes(FanOutNode[None]):
    def items(self, ctx, param):
        return [(k, k) for k in range(3)]

    def work(self, ctx, item):
        return item * 2


def test_a_fan_out_node_runs_its_override_once_instead_of_fanning_out() -> None:
    calls: list[int] = []
    node = Sizes(name="sizes")
    ex = ManualExecutor(seed=4)
    future = TaskScheduling.submit(node, executor=ex,
                                   overrides={"sizes": lambda c, p: calls.append(1) or "stub"})
    ex.run_until_idle()
    assert future.result(timeout=0).outputs == {"sizes": "stub"} and calls == [1]
    real = TaskScheduling.submit(node, executor=ex)
    ex.run_until_idle()
    assert real.result(timeout=0)["sizes"].work_result.state is ResultState.SUCCESS


def test_hooks_of_an_overridden_node_run_in_order() -> None:
    seen: list[str] = []

    class Hooked(SchedulingNode[None, int]):
        def task(self, ctx, param):
            return 1

        def on_begin(self, support) -> None:
            seen.append("begin")

        def on_success(self, support) -> None:
            seen.append(f"success {support.work_result.result}")

    ex = ManualExecutor()
    future = TaskScheduling.submit(Hooked(name="h"), executor=ex,
                                   overrides={"h": lambda c, p: seen.append("override") or 9})
    ex.run_until_idle()
    assert future.result(timeout=0).outputs == {"h": 9}
    assert seen == ["begin", "override", "success 9"]
