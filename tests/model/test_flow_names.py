"""Flow names: ``start/submit/run_async(..., name=...)``, ``ctx.flow_name``, ``result.flow_name``."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow import FlowDefinitionError, FunctionNode, TaskContext, TaskScheduling, run_async


def name_seen(ctx: TaskContext, param: Any) -> str | None:
    return ctx.flow_name


def test_the_default_name_is_the_first_node_passed() -> None:
    first = FunctionNode(name_seen, name="product")
    other = FunctionNode(name_seen, name="reviews")
    first >> FunctionNode(name_seen, name="page")
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start([first, other], executor=pool, timeout=LONG)
    assert result.flow_name == "product"
    assert result.outputs == {"product": "product", "reviews": "product", "page": "product"}
    assert result.report().flow == "product"


def test_start_submit_and_run_async_take_a_name() -> None:
    ctx = TaskContext()
    with ThreadPoolExecutor(2) as pool:
        started = TaskScheduling.start(FunctionNode(name_seen, name="a"), executor=pool,
                                       timeout=LONG, name="product_detail", context=ctx)
        submitted = TaskScheduling.submit(FunctionNode(name_seen, name="a"), executor=pool,
                                          timeout=LONG, name="checkout").result(LONG)
        awaited = asyncio.run(run_async(FunctionNode(name_seen, name="a"), executor=pool,
                                        timeout=LONG, name="search"))
    assert (started.flow_name, started.outputs["a"]) == ("product_detail", "product_detail")
    assert (submitted.flow_name, submitted.outputs["a"]) == ("checkout", "checkout")
    assert (awaited.flow_name, awaited.outputs["a"]) == ("search", "search")
    assert ctx.flow_name == "product_detail"  # the context remembers its last run
    assert TaskContext().flow_name is None


def test_the_html_page_and_the_statistics_use_the_name() -> None:
    from taskflow.observe.stats import FlowStats

    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(FunctionNode(name_seen, name="a"), executor=pool,
                                      timeout=LONG, name="product_detail")
    assert "product_detail" in result.to_html()
    stats = FlowStats(runs=None)
    stats.record_run(result)
    assert [f.flow for f in stats.snapshot().flows] == ["product_detail"]


@pytest.mark.parametrize(("name", "error"), [(5, TypeError), ("", FlowDefinitionError),
                                             (b"x", TypeError)])
def test_a_bad_name_is_refused_before_anything_runs(name: Any, error: type[Exception]) -> None:
    ran = []
    node = FunctionNode(lambda ctx, p: ran.append(1), name="a")
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(error, match="name"):
            TaskScheduling.start(node, executor=pool, timeout=LONG, name=name)
        with pytest.raises(error, match="name"):
            TaskScheduling.submit(node, executor=pool, timeout=LONG, name=name)
    assert ran == []


def test_a_spec_flow_and_a_conductor_workflow_run_under_their_own_name() -> None:
    """Regression: both ran under their first node's name ('user', 'my_fork_join_ref'), so a
    ``python -m taskflow run`` report, its log lines and statistics named a node, not the flow."""
    from taskflow import conductor
    from taskflow.declare.spec import load_spec

    flow = load_spec({"name": "checkout", "tasks": [
        {"name": "first", "callable": "test_flow_names:name_seen"}]})
    workflow = conductor.load({"name": "notify", "tasks": [
        {"name": "send", "taskReferenceName": "send_ref", "type": "SIMPLE"}]},
        {"send": lambda task_input: {"sent": True}})
    with ThreadPoolExecutor(2) as pool:
        ran = flow.start(executor=pool, timeout=LONG)
        run = workflow.start({}, executor=pool, timeout=LONG)
    assert (ran.flow_name, ran.outputs["first"], ran.report().flow) == ("checkout",) * 3
    assert (run.flow_name, run.report().flow) == ("notify", "notify")


def test_the_demo_runs_as_product_detail() -> None:
    """Regression: its JSON report said ``"flow": "product_info"`` (its first node)."""
    from taskflow.cli.demo import FLOW_NAME, run_demo

    with ThreadPoolExecutor(8) as pool:
        run = run_demo(pool, timeout=LONG)
    assert FLOW_NAME == "product_detail"
    assert run.result.flow_name == "product_detail"
    assert run.result.report().flow == "product_detail"
