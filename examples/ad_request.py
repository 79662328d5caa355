"""The article's ad-request flow: anti-fraud first, four enrichments in parallel, then aggregation.

::

                      -> request_colouring  -
                     /  -> search_tokenising -\\
    anti_fraud ------                          -> aggregate
                     \\  -> ip_tokenising     -/
                      -> user_profile       -

The ``TaskContext`` is the task bus: the incoming request sits in ``ctx["request"]``, each
enrichment reads it and returns its own piece, and ``aggregate`` reads the pieces with
``ctx.result_of``. When anti-fraud rejects the traffic the four enrichments and the aggregation
are failed fast: they never run, and each carries the rejection as its error's ``__cause__``.
Run it with ``python examples/ad_request.py`` (a clean request, then a bot).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import FlowResult, FunctionNode, TaskContext, TaskScheduling

CLEAN_REQUEST: Mapping[str, Any] = {
    "request_id": "r-1001",
    "user_id": "u-7",
    "ip": "198.51.100.23",
    "query": "Mechanical Keyboard red switch",
    "clicks_per_minute": 3,
}
BOT_REQUEST: Mapping[str, Any] = {
    "request_id": "r-1002",
    "user_id": "u-666",
    "ip": "203.0.113.66",
    "query": "keyboard",
    "clicks_per_minute": 480,
}


class FraudRejected(Exception):
    """Anti-fraud refused the traffic; nothing downstream may run."""

    def __init__(self, request_id: str, reason: str) -> None:
        self.request_id = request_id
        self.reason = reason
        super().__init__(f"request {request_id!r} rejected: {reason}")


def anti_fraud(ctx: TaskContext, param: Any) -> float:
    """Score the traffic; raise :class:`FraudRejected` for a bot. Returns the risk score."""
    request = ctx["request"]
    time.sleep(0.010)  # the risk service
    if request["clicks_per_minute"] > 100:
        raise FraudRejected(request["request_id"], f"{request['clicks_per_minute']} clicks/min")
    return 0.02


def request_colouring(ctx: TaskContext, param: Any) -> str:
    """Colour the request: the experiment bucket its ads are served from."""
    time.sleep(0.008)
    return "exp-B" if int(ctx["request"]["user_id"].split("-")[1]) % 2 else "exp-A"


def search_tokenising(ctx: TaskContext, param: Any) -> list[str]:
    """Split the search query into the tokens ads are matched on."""
    time.sleep(0.015)  # the tokeniser service
    query: str = ctx["request"]["query"]
    return query.lower().split()


def ip_tokenising(ctx: TaskContext, param: Any) -> dict[str, str]:
    """Turn the IP into region tokens."""
    time.sleep(0.012)  # the IP library
    return {"country": "CN", "city": "Beijing"}


def user_profile(ctx: TaskContext, param: Any) -> list[str]:
    """Load the user's interest tags."""
    time.sleep(0.020)  # the profile store
    return ["gamer", "keyboards", "night-owl"]


def aggregate(ctx: TaskContext, param: Any) -> dict[str, Any]:
    """Build the ad request the ad engine can recall ads for."""
    return {
        "request_id": ctx["request"]["request_id"],
        "risk": ctx.result_of("anti_fraud"),
        "bucket": ctx.result_of("request_colouring"),
        "tokens": ctx.result_of("search_tokenising"),
        "region": ctx.result_of("ip_tokenising"),
        "interests": ctx.result_of("user_profile"),
    }


ENRICHMENTS = (request_colouring, search_tokenising, ip_tokenising, user_profile)

# built once; every request starts it with its own context
ANTI_FRAUD = FunctionNode(anti_fraud)
ANTI_FRAUD >> [FunctionNode(fn) for fn in ENRICHMENTS] >> FunctionNode(aggregate)


def main(request: Mapping[str, Any] = CLEAN_REQUEST) -> FlowResult:
    """Turn one request into an ad request; print it, or what failed and what was failed fast."""
    ctx = TaskContext(request=dict(request))
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="ad") as pool:
        result = TaskScheduling.start(ANTI_FRAUD, executor=pool, timeout=0.5, context=ctx)

    print(f"request {request['request_id']}: ok={result.ok} in {result.elapsed * 1000:.1f} ms")
    if result.ok:
        for key, value in result.outputs["aggregate"].items():
            print(f"  {key:<10} {value}")
        return result
    for name, wr in result.failed.items():
        ran = "ran" if wr.started_at is not None else "not run"
        error = f"{type(wr.exception).__name__}: {wr.exception}"
        print(f"  {name:<18} {wr.state.name:<9} {ran:<7}  {error}")
    return result


if __name__ == "__main__":
    main()
    print()
    main(BOT_REQUEST)
