"""A product-detail endpoint for ASGI servers (uvicorn, hypercorn, daphne), with no framework.

The handler ``await``s ``taskflow.run_async``: the nodes run on the shared thread pool and the
event loop keeps serving other requests meanwhile; the budget is kept by taskflow's timer thread,
and a client that disconnects (the server cancels the handler's task) cancels the run. The same
flow works unchanged under Starlette or FastAPI: ``await run_async(...)`` in an ``async def``
route.

Run it from the repository's root::

    uvicorn examples.asgi_app:app --port 8000
    curl 'localhost:8000/products/sku-10086'
    curl 'localhost:8000/products/sku-1?slow=reviews'     # a 504 naming reviews and page
    curl 'localhost:8000/products/sku-1?fail=stock'       # a 502 naming stock

(``slow`` and ``fail`` inject a fault into one backend call, to try the error paths.) Logging
is the production setting, JSON lines at INFO from the server's start-up (taskflow writes one only
for a failed node, with ``flow_id``, ``flow`` and ``node``). One
uvicorn worker is one event loop: all its requests share ``POOL``, whose size bounds how many
backend calls run at once in the process. The page runs up to 4 calls at once, so
``ThreadPool(32)`` serves 8 concurrent requests at full speed; with 16 they queue for threads
(p50 about 83 ms instead of 57 on the project's 2-core machine): size the pool as
``examples/gunicorn.conf.py`` explains.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any
from urllib.parse import parse_qs

from loguru import logger

from taskflow import (
    FunctionNode,
    ResultState,
    TaskContext,
    ThreadPool,
    UpstreamFailedError,
    run_async,
)

BUDGET = 0.5
POOL = ThreadPool(32, thread_name_prefix="detail")
logger.enable("taskflow")  # taskflow's lines: a WARNING for a failed node


def production_logging() -> None:
    """INFO and up, one JSON object per line (taskflow's carry ``flow_id``, ``flow``, ``node``)."""
    logger.remove()
    logger.add(sys.stderr, level="INFO", serialize=True)


def backend(ctx: TaskContext, call: str, seconds: float) -> None:
    """Stand in for one remote call; ``?slow=NAME`` and ``?fail=NAME`` inject faults."""
    if ctx["query"].get("fail") == call:
        raise RuntimeError(f"{call} backend answered 500")
    if ctx["query"].get("slow") == call:
        while not ctx.cancelled:
            time.sleep(0.01)
        return
    time.sleep(seconds)


def call(name: str, seconds: float, fathers: tuple[str, ...] = ()) -> FunctionNode:
    """A node that makes one backend call and returns what it read, with its fathers'."""

    def step(ctx: TaskContext, _: Any) -> dict[str, Any]:
        backend(ctx, name, seconds)
        return {"sku": ctx["sku"], "from": name, **{f: ctx.result_of(f)["from"] for f in fathers}}

    return FunctionNode(step, name=name)


PAGE = FunctionNode(lambda ctx, _: {n: ctx.result_of(n) for n in
                                    ("price", "stock", "reviews", "recommendations")}, name="page")
call("product_info", 0.030) >> [call("price", 0.020, ("product_info",)),
                                call("stock", 0.025)] >> PAGE
call("category", 0.015) >> [call("reviews", 0.040, ("category",)),
                            call("recommendations", 0.035, ("category",))] >> PAGE


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI application."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                production_logging()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                POOL.shutdown(wait=False)
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if scope["type"] != "http" or not path.startswith("/products/"):
        await respond(send, 404, {"error": "not found"})
        return
    query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
    sku = path.removeprefix("/products/")
    ctx = TaskContext(sku=sku, query=query)
    result = await run_async(PAGE, executor=POOL, timeout=BUDGET, context=ctx,
                             name="product_detail")
    body: dict[str, Any] = {"sku": sku, "flow_id": result.flow_id,
                            "elapsed_ms": round(result.elapsed * 1000, 1)}
    if result.ok:
        await respond(send, 200, {**body, "page": result.outputs["page"]})
        return
    timed_out = sorted(n for n, wr in result.failed.items() if wr.state is ResultState.TIMEOUT)
    if timed_out:
        await respond(send, 504, {**body, "error": "budget exceeded", "timed_out": timed_out})
        return
    failed = {n: repr(wr.exception) for n, wr in result.failed.items()
              if not isinstance(wr.exception, UpstreamFailedError)}
    await respond(send, 502, {**body, "error": "backend call failed", "failed": failed})


async def respond(send: Any, status: int, body: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})
