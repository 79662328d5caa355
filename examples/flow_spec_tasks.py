"""The task functions of ``flow_spec.yaml`` (each ``fn(ctx, param)``; fan-out work ``fn(ctx, item)``).

The spec names them as ``flow_spec_tasks:function``; ``load_spec(path, import_spec_dir=True)``
finds this module beside the spec file. Run the flow with
``python -m taskflow run examples/flow_spec.yaml --import-file-dir``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from taskflow import TaskContext

_USERS = {42: {"id": 42, "name": "Ann", "tier": "gold"}}
_CARTS = {42: [{"sku": "kbd-k8", "qty": 1, "price": 79.0}, {"sku": "mouse-m2", "qty": 2, "price": 19.5}]}


def fetch_user(ctx: TaskContext, param: dict[str, Any]) -> dict[str, Any]:
    return dict(_USERS[param["user_id"]])


def fetch_cart(ctx: TaskContext, param: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(line) for line in _CARTS[param["user_id"]]]


def cart_total(ctx: TaskContext, param: Any) -> float:
    return sum(line["qty"] * line["price"] for line in ctx.result_of("cart"))


def tier(ctx: TaskContext, param: Any) -> str:
    """The switch's decision: the customer's tier."""
    return str(ctx.result_of("user")["tier"])


def discount(ctx: TaskContext, param: float) -> float:
    """The total after a ``param`` fraction off."""
    return round(ctx.result_of("total") * (1 - param), 2)


def send(ctx: TaskContext, param: str) -> str:
    return f"{param} sent to {ctx.result_of('user')['name']}"


def cart_lines(ctx: TaskContext, param: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The fan-out's items: one per cart line, keyed by sku."""
    for line in ctx.result_of("cart"):
        yield line["sku"], line


def reserve(ctx: TaskContext, line: dict[str, Any]) -> dict[str, Any]:
    return {"sku": line["sku"], "reserved": line["qty"]}
