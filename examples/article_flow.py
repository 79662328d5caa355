"""Figure 7 of the JUC orchestration article, written the article's way.

Five nodes::

    node1 -> node2 ------------> node5
    node1 -> node3 -> node4 ---> node5

Each node is a ``SchedulingNode`` subclass with a ``task`` and ``on_success`` / ``on_fail``
hooks; the graph is wired with ``set_son_handler`` / ``set_father_handler`` exactly as in the
article (declaring an edge from both ends is harmless: it is recorded once), and the run is
started from the top node with a 5 s budget, like ``TaskScheduling.start(5000L, taskContext,
node1)``. Run it with ``python examples/article_flow.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from taskflow import FlowResult, SchedulingNode, TaskContext, TaskScheduling, TaskSupport

T = TypeVar("T")
V = TypeVar("V")


class ArticleNode(SchedulingNode[T, V]):
    """The hooks every node of the article has: tell the business side how the node ended."""

    def on_success(self, support: TaskSupport) -> None:
        wr = support.work_result
        ms = (wr.duration or 0.0) * 1000
        print(f"  on_success  {self.name:<6} {ms:5.1f} ms  on {wr.thread}")

    def on_fail(self, support: TaskSupport) -> None:
        wr = support.work_result
        print(f"  on_fail     {self.name:<6} {wr.state.name}: {wr.exception!r}")


class Node1(ArticleNode[str, dict[str, Any]]):
    """Load the item the page is about (the article's ``sampleService.findItemById``)."""

    def task(self, ctx: TaskContext, param: str) -> dict[str, Any]:
        time.sleep(0.020)  # a database read
        return {"item_id": param, "title": "Mechanical keyboard K8", "seller_id": "s-77"}


class Node2(ArticleNode[None, dict[str, Any]]):
    """Price the item; needs node1."""

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        item = ctx.result_of("Node1")
        time.sleep(0.015)  # the pricing service
        return {"item_id": item["item_id"], "price": 79.0, "currency": "USD"}


class Node3(ArticleNode[None, dict[str, Any]]):
    """Load the item's seller; needs node1."""

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        item = ctx.result_of("Node1")
        time.sleep(0.010)  # the seller service
        return {"seller_id": item["seller_id"], "shop": "Keyboard Corner"}


class Node4(ArticleNode[None, float]):
    """Load the seller's shop rating; needs node3."""

    def task(self, ctx: TaskContext, param: None) -> float:
        seller = ctx.result_of("Node3")
        time.sleep(0.015)  # the rating service
        return 4.8 if seller["seller_id"] == "s-77" else 3.0


class Node5(ArticleNode[None, dict[str, Any]]):
    """Assemble the page from node2 and node4 (and what they read)."""

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        time.sleep(0.005)
        return {
            "item": ctx.result_of("Node1"),
            "price": ctx.result_of("Node2"),
            "seller": ctx.result_of("Node3"),
            "rating": ctx.result_of("Node4"),
            "user": ctx["user"],
            # the article's remainTime: what is left of the run's budget
            "budget_left_s": round(ctx.remaining(), 3),
        }


def main() -> FlowResult:
    """Run figure 7 on a 4-thread pool and print how each node ended."""
    node1, node2, node3, node4, node5 = Node1("item-42"), Node2(), Node3(), Node4(), Node5()

    # the article's wiring, line for line
    node1.set_son_handler(node2, node3)
    node2.set_son_handler(node5).set_father_handler(node1)
    node3.set_son_handler(node4).set_father_handler(node1)
    node4.set_son_handler(node5).set_father_handler(node3)
    node5.set_father_handler(node2, node4)

    ctx = TaskContext(user="u-7")
    print("figure 7: node1 -> node2, node3; node2 -> node5; node3 -> node4; node4 -> node5")
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="article") as pool:
        results = TaskScheduling.start(node1, executor=pool, timeout=5.0, context=ctx)

    for name, node in results.items():
        print(f"  {name:<6} {node.state.name:<7} {node.work_result.state.name}")
    print(f"ok={results.ok} in {results.elapsed * 1000:.1f} ms")
    if results.ok:
        page = results.outputs["Node5"]
        print(
            f"page: {page['item']['title']} at {page['price']['price']} USD, "
            f"shop {page['seller']['shop']!r} rated {page['rating']}, "
            f"{page['budget_left_s']} s of the budget left"
        )
    return results


if __name__ == "__main__":
    main()
