"""The article's product-detail page, in the lightweight style: plain functions, ``>>`` wiring.

The article's hand-written version runs the product side (submit, then ``future.get`` each), then
the item side, then aggregates. Here each call is a ``FunctionNode`` and the edges say what
really depends on what, so both sides run at once::

    product_info -> price, stock          \\
                                            -> aggregate
    category     -> reviews, recommendations /

The graph is built once at import time; each request starts it with its own ``TaskContext`` (the
request's sku lives there), which is how a web handler would use it. ``python -m taskflow demo``
runs the same page against the hand-written version and prints the timings.
Run it with ``python examples/product_detail.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import FlowResult, FunctionNode, TaskContext, TaskScheduling

# -- the calls a product-detail page makes; each reads the request from ctx --------------------


def product_info(ctx: TaskContext, param: Any) -> dict[str, Any]:
    time.sleep(0.030)
    return {"sku": ctx["sku"], "title": "Mechanical keyboard K8"}


def price(ctx: TaskContext, param: Any) -> float:
    time.sleep(0.020)
    return 79.0 if ctx.result_of("product_info")["sku"] == "sku-10086" else 99.0


def stock(ctx: TaskContext, param: Any) -> int:
    time.sleep(0.025)
    return 42


def category(ctx: TaskContext, param: Any) -> str:
    time.sleep(0.015)
    return "keyboards"


def reviews(ctx: TaskContext, param: Any) -> dict[str, Any]:
    time.sleep(0.040)
    return {"category": ctx.result_of("category"), "rating": 4.7, "count": 1284}


def recommendations(ctx: TaskContext, param: Any) -> list[str]:
    time.sleep(0.035)
    return [f"{ctx.result_of('category')}/sku-{n}" for n in (10087, 10090)]


def aggregate(ctx: TaskContext, param: Any) -> dict[str, Any]:
    names = ("product_info", "price", "stock", "category", "reviews", "recommendations")
    return {name: ctx.result_of(name) for name in names}


# -- the graph, built once: each node is named after its function -----------------------------

AGGREGATE = FunctionNode(aggregate)
FunctionNode(product_info) >> [FunctionNode(price), FunctionNode(stock)] >> AGGREGATE
FunctionNode(category) >> [FunctionNode(reviews), FunctionNode(recommendations)] >> AGGREGATE


def main(sku: str = "sku-10086") -> FlowResult:
    """Serve one product-detail request and print the page and the critical path timing."""
    ctx = TaskContext(sku=sku)
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="detail") as pool:
        result = TaskScheduling.start(AGGREGATE, executor=pool, timeout=1.0, context=ctx)
    result.raise_for_failure()
    page = result.outputs["aggregate"]
    print(
        f"product-detail page for {sku} in {result.elapsed * 1000:.0f} ms "
        "(the slower side takes 55 ms; the two sides one after the other would take 110 ms):"
    )
    for key, value in page.items():
        print(f"  {key:<16} {value}")
    return result


if __name__ == "__main__":
    main()
