"""Seed 002's risk switch: parallel checks, a switch on a validated decision, a merge after it.

::

    order -> risk_check ------\\                  approve       -> charge ---------\\
    order -> inventory_check --> route (switch) -> manual_review -> queue_review ----> notify_customer
                                      |          reject        -> reject_order ---/
                                      \\-> audit   (default: anything else -> queue_review)

* Risk and inventory checks are independent, so they run in parallel; charging must wait for
  both, so the switch (which decides whether to charge) joins them.
* The switch reads a *structured* verdict (``decision``, ``reason_code``, ``score``), never free
  text. ``decision`` must be one of the allowed values; anything else (an empty value, a new
  model version's ``"escalate"``) goes to the safe default, manual review. Nothing risky is ever
  chosen by default, and a decision selects exactly one case, so two conditions cannot both win.
* The unchosen branches are ``SKIPPED`` (their tasks never run: a rejected order is never
  charged); ``notify_customer`` merges the three branches and runs on whichever ran.
* ``audit`` is wired to the switch outside its cases, so it always runs and records the
  decision with its reason code: the switch's decision is its recorded result.

Run it with ``python examples/risk_switch.py``.
"""

from __future__ import annotations

import enum
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import (
    FlowResult,
    FunctionNode,
    SchedulingNode,
    SwitchNode,
    TaskContext,
    TaskScheduling,
)


class Decision(str, enum.Enum):
    """The allowed decisions; a str enum, so ``"approve"`` and ``Decision.APPROVE`` are one case."""

    APPROVE = "approve"
    MANUAL_REVIEW = "manual_review"
    REJECT = "reject"


# -- the checks ----------------------------------------------------------------------------------


def validate_order(ctx: TaskContext, param: Any) -> dict[str, Any]:
    order = dict(ctx["order"])
    if order["amount"] <= 0:
        raise ValueError(f"order {order['id']}: amount must be positive")
    return order


def risk_check(ctx: TaskContext, param: Any) -> dict[str, Any]:
    """The risk model's verdict: a structured object, whatever model version produced it."""
    order = ctx.result_of("validate_order")
    if ctx.get("risk_model") == "v2-preview":
        # a newer model emits a value this flow does not know yet
        return {"decision": "escalate", "reason_code": "MODEL_V2_ESCALATION", "score": 0.64}
    score = min(order["amount"] / 2000.0, 1.0)
    if score < 0.25:
        return {"decision": "approve", "reason_code": "LOW_AMOUNT", "score": score}
    if score < 0.75:
        return {"decision": "manual_review", "reason_code": "AMOUNT_THRESHOLD", "score": score}
    return {"decision": "reject", "reason_code": "AMOUNT_LIMIT", "score": score}


def inventory_check(ctx: TaskContext, param: Any) -> dict[str, Any]:
    order = ctx.result_of("validate_order")
    available = ctx.get("stock", 10)
    return {"sku": order["sku"], "available": available, "enough": available >= order["quantity"]}


class Route(SwitchNode[None]):
    """Decide the branch from the verdict and the stock (both fathers must have succeeded)."""

    def task(self, ctx: TaskContext, param: None) -> Any:
        if not ctx.result_of("inventory_check")["enough"]:
            return Decision.REJECT.value
        return ctx.result_of("risk_check")["decision"]


# -- the branches --------------------------------------------------------------------------------


def charge(ctx: TaskContext, param: Any) -> dict[str, Any]:
    order = ctx.result_of("validate_order")
    return {"outcome": "charged", "amount": order["amount"], "idempotency_key": f"charge-{order['id']}"}


def queue_review(ctx: TaskContext, param: Any) -> dict[str, Any]:
    return {"outcome": "in_review", "queue": "risk-ops", "reason": ctx.result_of("risk_check")["reason_code"]}


def reject_order(ctx: TaskContext, param: Any) -> dict[str, Any]:
    if not ctx.result_of("inventory_check")["enough"]:
        return {"outcome": "rejected", "reason": "OUT_OF_STOCK"}
    return {"outcome": "rejected", "reason": ctx.result_of("risk_check")["reason_code"]}


def notify_customer(ctx: TaskContext, param: Any) -> str:
    """The merge: exactly one of the branches ran."""
    for branch in ("charge", "queue_review", "reject_order"):
        try:
            outcome = ctx.result_of(branch)
        except LookupError:
            continue  # skipped: not the branch that ran
        return f"order {ctx['order']['id']}: {outcome['outcome']}"
    raise RuntimeError("no branch ran")


def audit(ctx: TaskContext, param: Any) -> dict[str, Any]:
    """Always runs: the decision taken, with the stable reason code behind it."""
    verdict = ctx.result_of("risk_check")
    in_stock = ctx.result_of("inventory_check")["enough"]
    return {"decision": ctx.result_of("route"),
            "reason_code": verdict["reason_code"] if in_stock else "OUT_OF_STOCK",
            "score": round(verdict["score"], 3)}


def build() -> SchedulingNode[Any, Any]:
    """The flow, built once; returns its top node."""
    order = FunctionNode(validate_order)
    charge_node, review, reject = FunctionNode(charge), FunctionNode(queue_review), FunctionNode(reject_order)
    route = Route(
        name="route",
        cases={Decision.APPROVE: charge_node, Decision.MANUAL_REVIEW: review, Decision.REJECT: reject},
        default=review,  # unknown or new values: the safe choice, never an automatic approval
    )
    order >> [FunctionNode(risk_check), FunctionNode(inventory_check)] >> route
    [charge_node, review, reject] >> FunctionNode(notify_customer)
    route >> FunctionNode(audit)
    return order


FLOW = build()


def main(amount: float = 120.0, *, stock: int = 10, risk_model: str = "v1") -> FlowResult:
    """Route one order and print which branch ran and why."""
    ctx = TaskContext(order={"id": "o-7", "sku": "sku-1", "quantity": 2, "amount": amount},
                      stock=stock, risk_model=risk_model)
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="risk") as pool:
        result = TaskScheduling.start(FLOW, executor=pool, timeout=1.0, context=ctx)
    result.raise_for_failure()
    states = result.states()
    skipped = [n for n in ("charge", "queue_review", "reject_order") if states[n].name == "SKIPPED"]
    print(f"amount {amount:>7.2f} stock {stock:>2} model {risk_model:<10} -> "
          f"{result.outputs['notify_customer']:<24} audit {result.outputs['audit']}  skipped {skipped}")
    return result


if __name__ == "__main__":
    main(120.0)
    main(900.0)
    main(1900.0)
    main(120.0, stock=1)
    main(120.0, risk_model="v2-preview")
