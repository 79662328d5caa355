"""The product-detail aggregation of the JUC orchestration article, run two ways.

A product-detail page gathers data from two independent sides, each a small DAG of I/O calls::

    product side:  product_info (30 ms) -> price (20 ms), stock (25 ms)
    item side:     category (15 ms)     -> reviews (40 ms), recommendations (35 ms)
    then:          price, stock, reviews, recommendations -> aggregate (5 ms)

The article's hand-written code runs the product side as one stage (``submit`` each task, then
``future.get`` each), then the item side as a second stage, then aggregates: the item side waits
for the whole product side although it needs nothing from it. As a taskflow DAG both sides run
at once and the page is ready after the slower side, not after both.

``run_demo`` runs the flow, then the same step functions the staged way, on one executor.
The step functions take ``(ctx, sku)`` and read their fathers' results with ``ctx.result_of``, so
the taskflow run and the hand-written run execute exactly the same code. The CLI
(``python -m taskflow demo``) prints what ``run_demo`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from taskflow import clock
from taskflow.model.context import TaskContext, TaskSupport
from taskflow.model.node import FunctionNode
from taskflow.model.result import FlowResult
from taskflow.scheduling import TaskScheduling

__all__ = [
    "DEFAULT_SKU",
    "NODE_NAMES",
    "DemoFailure",
    "DemoNode",
    "DemoRun",
    "StagedContext",
    "build_flow",
    "run_demo",
    "run_staged",
]

DEFAULT_SKU = "sku-10086"

PRODUCT_SIDE = ("product_info", "price", "stock")
ITEM_SIDE = ("category", "reviews", "recommendations")
NODE_NAMES = (*PRODUCT_SIDE, *ITEM_SIDE, "aggregate")
# The run's flow name (``start(..., name=...)``): in its report, HTML page, logs and traces.
FLOW_NAME = "product_detail"

# The context key naming the node that the demo makes raise (``--fail NODE``).
FAIL_KEY = "fail_node"
# The context key holding the stream that on_fail hooks write to (stdout, or stderr with --json).
ECHO_KEY = "echo"


class DemoFailure(RuntimeError):
    """The error a step raises when the demo is told to fail it (``--fail NODE``)."""

    def __init__(self, node: str) -> None:
        self.node = node
        super().__init__(f"backend call of node {node!r} failed (injected by --fail)")


class Bus(Protocol):
    """What a step reads: request entries by key and its fathers' results by node name.

    A [`TaskContext`][taskflow.TaskContext] is one; ``StagedContext`` is the hand-written stand-in.
    """

    def __getitem__(self, key: str) -> Any: ...

    def __contains__(self, key: object) -> bool: ...

    def result_of(self, name: str) -> Any: ...


class StagedContext(dict[str, Any]):
    """The hand-written code's data context: request entries plus results stored by name.

    Mirrors the article's ``DataContext``: the staged code stores each future's result under the
    task's name, so a step reads its fathers the same way in both runs.
    """

    def result_of(self, name: str) -> Any:
        """Return the result the staged code stored for node ``name``."""
        return self[name]


def _backend_call(ctx: Bus, node: str, seconds: float) -> None:
    """Stand in for one remote call: block for ``seconds``, or raise if the demo fails ``node``."""
    clock.sleep(seconds)
    if FAIL_KEY in ctx and ctx[FAIL_KEY] == node:
        raise DemoFailure(node)


# -- the steps: product side ------------------------------------------------------------------


def product_info(ctx: Bus, sku: str) -> dict[str, Any]:
    """Load the product's base record (30 ms)."""
    _backend_call(ctx, "product_info", 0.030)
    return {"sku": sku, "title": "Mechanical keyboard K8", "brand": "Keychron"}


def price(ctx: Bus, sku: str) -> dict[str, Any]:
    """Price the product for the requesting user (20 ms); needs ``product_info``."""
    product = ctx.result_of("product_info")
    _backend_call(ctx, "price", 0.020)
    return {"sku": product["sku"], "list": 89.0, "sale": 79.0, "currency": "USD"}


def stock(ctx: Bus, sku: str) -> dict[str, Any]:
    """Read the stock level of the product (25 ms); needs ``product_info``."""
    product = ctx.result_of("product_info")
    _backend_call(ctx, "stock", 0.025)
    return {"sku": product["sku"], "available": 42, "warehouse": "SHA-3"}


# -- the steps: item side ---------------------------------------------------------------------


def category(ctx: Bus, sku: str) -> str:
    """Resolve the item's category (15 ms)."""
    _backend_call(ctx, "category", 0.015)
    return "keyboards/mechanical"


def reviews(ctx: Bus, sku: str) -> dict[str, Any]:
    """Load the review summary of the item within its category (40 ms); needs ``category``."""
    cat = ctx.result_of("category")
    _backend_call(ctx, "reviews", 0.040)
    return {"category": cat, "count": 1284, "rating": 4.7}


def recommendations(ctx: Bus, sku: str) -> list[str]:
    """Recommend items of the same category (35 ms); needs ``category``."""
    cat = ctx.result_of("category")
    _backend_call(ctx, "recommendations", 0.035)
    return [f"{cat}/sku-10087", f"{cat}/sku-10090", f"{cat}/sku-20001"]


# -- the aggregation --------------------------------------------------------------------------


def aggregate(ctx: Bus, sku: str) -> dict[str, Any]:
    """Assemble the page from both sides (5 ms)."""
    page = {name: ctx.result_of(name) for name in (*PRODUCT_SIDE, *ITEM_SIDE)}
    _backend_call(ctx, "aggregate", 0.005)
    return page


STEPS: dict[str, Callable[[Bus, str], Any]] = {
    "product_info": product_info,
    "price": price,
    "stock": stock,
    "category": category,
    "reviews": reviews,
    "recommendations": recommendations,
    "aggregate": aggregate,
}


class DemoNode(FunctionNode):
    """A step of the demo: a [`FunctionNode`][taskflow.FunctionNode] whose ``on_fail`` hook prints one line."""

    def on_fail(self, support: TaskSupport) -> None:
        """Print the failure and, for a node failed fast, the father's error it carries."""
        work_result = support.work_result
        exc = work_result.exception
        line = f"on_fail  {self.name}: {work_result.state.name}: {exc!r}"
        if exc is not None and exc.__cause__ is not None:
            line += f" (cause: {exc.__cause__!r})"
        echo = support.context.get(ECHO_KEY)
        if echo is not None:
            # one write per line, so lines from concurrent hooks do not interleave
            echo.write(line + "\n")


def build_flow(sku: str = DEFAULT_SKU) -> list[DemoNode]:
    """Build the product-detail DAG and return its two roots (``product_info``, ``category``).

    Args:
        sku: The product the page is for; every step gets it as its ``param``.

    Returns:
        The root nodes; ``TaskScheduling.start`` finds the rest by following the edges.
    """
    nodes = {name: DemoNode(fn, sku, name=name) for name, fn in STEPS.items()}
    nodes["product_info"] >> [nodes["price"], nodes["stock"]]
    nodes["category"] >> [nodes["reviews"], nodes["recommendations"]]
    [nodes[name] for name in ("price", "stock", "reviews", "recommendations")] >> nodes["aggregate"]
    return [nodes["product_info"], nodes["category"]]


def run_staged(
    executor: Executor, sku: str = DEFAULT_SKU, *, timeout: float | None = None
) -> tuple[dict[str, Any], float]:
    """Run the same steps the article's hand-written way: product stage, item stage, aggregate.

    Each stage submits its tasks and waits for all of them (the dependencies inside a stage are
    kept: ``product_info`` before ``price`` and ``stock``); the second stage starts only after
    the first has finished. The aggregation runs in the calling thread, as in the article.

    Args:
        executor: Runs the tasks.
        sku: The product the page is for.
        timeout: Seconds the whole run may take; None waits as long as it takes.

    Returns:
        The aggregated page and the seconds the run took.

    Raises:
        TimeoutError: ``timeout`` passed before a stage finished.
        Exception: The first error a step raised.
    """
    data = StagedContext(sku=sku)
    start = clock.now()
    deadline = None if timeout is None else start + timeout

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - clock.now())

    # stage 1: the product side; product_info first, since price and stock need it
    data["product_info"] = clock.result(executor.submit(product_info, data, sku), left())
    futures = {name: executor.submit(STEPS[name], data, sku) for name in ("price", "stock")}
    for name, future in futures.items():
        data[name] = clock.result(future, left())

    # stage 2: the item side, which has waited for the whole product side
    data["category"] = clock.result(executor.submit(category, data, sku), left())
    futures = {
        name: executor.submit(STEPS[name], data, sku) for name in ("reviews", "recommendations")
    }
    for name, future in futures.items():
        data[name] = clock.result(future, left())

    page = aggregate(data, sku)
    return page, clock.now() - start


@dataclass
class DemoRun:
    """What one demo run produced.

    Attributes:
        result: The taskflow run.
        staged_elapsed: Seconds the hand-written staged run took; None when it was not run
            (a node was made to fail) or did not finish.
        staged_timed_out: The staged run was attempted and passed the budget.
    """

    result: FlowResult
    staged_elapsed: float | None = None
    staged_timed_out: bool = False


def run_demo(
    executor: Executor,
    *,
    timeout: float | None = 1.0,
    fail: str | None = None,
    echo: TextIO | None = None,
    sku: str = DEFAULT_SKU,
) -> DemoRun:
    """Run the product-detail flow with taskflow, then (if it may succeed) the staged way.

    Args:
        executor: Runs both versions, one after the other.
        timeout: The global budget of each run, in seconds; None for no budget.
        fail: Name of a node made to raise ``DemoFailure``; the staged run is skipped.
        echo: A text stream the ``on_fail`` hooks write a line to; None keeps them quiet.
        sku: The product the page is for.

    Returns:
        The taskflow result and the staged run's time.

    Raises:
        ValueError: ``fail`` is not one of ``NODE_NAMES``.
    """
    if fail is not None and fail not in NODE_NAMES:
        raise ValueError(f"unknown node {fail!r}; nodes are: {', '.join(NODE_NAMES)}")
    ctx = TaskContext(sku=sku)
    if fail is not None:
        ctx[FAIL_KEY] = fail
    if echo is not None:
        ctx[ECHO_KEY] = echo
    result = TaskScheduling.start(build_flow(sku), executor=executor, timeout=timeout, context=ctx,
                                  name=FLOW_NAME)
    run = DemoRun(result)
    if fail is None:
        try:
            _, run.staged_elapsed = run_staged(executor, sku, timeout=timeout)
        except TimeoutError:
            run.staged_timed_out = True
    return run
