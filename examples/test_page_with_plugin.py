"""A user's test module with taskflow's pytest plugin: the ``manual_executor`` fixture.

Run it with ``pytest examples/test_page_with_plugin.py`` once taskflow-juc is installed (the
plugin is registered through its ``pytest11`` entry point).
"""

from __future__ import annotations

import pytest

from taskflow import FunctionNode, TaskScheduling
from taskflow.testing import ManualExecutor


def build_page() -> list[FunctionNode]:
    price = FunctionNode(lambda ctx, sku: 19.5, param="sku-1", name="price")
    stock = FunctionNode(lambda ctx, sku: 3, param="sku-1", name="inventory")
    page = FunctionNode(lambda ctx, _: (ctx.result_of("price"), ctx.result_of("inventory")),
                        name="page")
    price >> page
    stock >> page
    return [price, stock]


def test_the_page_shows_price_and_stock(manual_executor: ManualExecutor) -> None:
    future = TaskScheduling.submit(build_page(), executor=manual_executor)
    manual_executor.run_until_idle()
    assert future.result(timeout=0).outputs["page"] == (19.5, 3)


@pytest.mark.manual_executor(seed=3)
def test_out_of_stock_in_a_seeded_order(manual_executor: ManualExecutor) -> None:
    future = TaskScheduling.submit(build_page(), executor=manual_executor,
                                   overrides={"inventory": 0})
    manual_executor.run_until_idle()
    assert future.result(timeout=0).outputs["page"] == (19.5, 0)
