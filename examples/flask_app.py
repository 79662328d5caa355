"""A product-detail endpoint in Flask: one flow built at import, a shared pool, a run per request.

The page needs six backend calls; two of them wait for a third (the article's product-detail
page)::

    product_info -> price, stock            \\
                                              -> page
    category     -> reviews, recommendations /

The graph is module-level and never mutated by a run, so every request thread starts the same
graph at once, each with its own ``TaskContext``. The handler blocks (Flask handlers are
synchronous) for at most the budget; a budget overrun is a ``504`` naming the nodes that timed
out, a failed backend call a ``502`` naming it.

Inside a node on a thread pool, the request is at hand as in the handler: taskflow runs every
node in a copy of the handler's ``contextvars`` and Flask (2.2+) keeps ``request``, ``g`` and the
app context in contextvars. So does loguru's ``logger.contextualize``: the trace id the handler
binds appears on taskflow's own log lines and on the nodes' lines. (On a process pool or dask only
the task travels: put what it needs into the context, as ``sku`` here.) A node that outlives the
budget keeps running in its thread (threads cannot be killed) after the handler returned: it
should poll ``ctx.cancelled`` and leave ``request`` alone by then.

Logging: the module enables taskflow's lines; taskflow writes one only when a node fails (a
WARNING with the traceback as text) unless per-node DEBUG lines are asked for
(``taskflow.logs.log_nodes()``). ``production_logging()`` (run directly, or under gunicorn with
``examples/gunicorn.conf.py``) writes JSON lines at INFO, each with the request's ``trace_id``.

``GET /pool`` returns the shared pool's metrics as JSON (queue size, active threads, abandoned
threads still running, queue-wait and run-time percentiles, ...); ``GET /metrics`` serves the
pool monitor's latest sample (pool and process figures) and the recommendations bulkhead's and
breaker's figures for Prometheus.

Run it from the repository's root (Flask's development server serves each request in its own
thread)::

    flask --app examples/flask_app.py run --port 8000
    curl -H 'X-User: ann' 'localhost:8000/products/sku-10086'
    curl 'localhost:8000/products/sku-1?slow=reviews'     # a 504 naming reviews and page
    curl 'localhost:8000/products/sku-1?fail=stock'       # a 502 naming stock
    curl 'localhost:8000/products/sku-1?fail=recommendations'  # 200, without recommendations
    curl 'localhost:8000/products/sku-1?slow=recommendations'  # 200, without recommendations
    curl 'localhost:8000/pool'
    curl 'localhost:8000/metrics'
    curl -N 'localhost:8000/products/sku-1/page'   # streamed HTML: the slow reviews come last

(``slow`` and ``fail`` inject a fault into one backend call, to try the error paths.)

Resilience (``docs/guides/resilience.md``): recommendations are optional. A bulkhead keeps that
backend from holding more than 8 of the pool's threads however slow it gets, a circuit breaker
stops calling it while it fails, a node timeout cuts it at 0.2 s when it is slow, and a fallback
renders the page without it (the response lists it under ``degraded``). Concurrent requests for the same SKU share one stock call
(``share_key``); a price call slower than the recent 95th percentile gets a hedged duplicate.

In production, under gunicorn's threaded worker (``examples/gunicorn.conf.py`` explains the pool
sizing and what ``--preload`` changes)::

    gunicorn -c examples/gunicorn.conf.py --bind 127.0.0.1:8000 examples.flask_app:app
"""

from __future__ import annotations

import html
import json
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import flask
from flask import Flask, Response, g, request, stream_with_context
from loguru import logger

from taskflow import (
    Bulkhead,
    CircuitBreaker,
    FlowResult,
    FunctionNode,
    Hedge,
    PoolMonitor,
    ResultState,
    TaskContext,
    TaskScheduling,
    ThreadPool,
    UpstreamFailedError,
    WorkResult,
)

BUDGET = 0.5  # seconds a page may take, queueing included
POOL = ThreadPool(32, thread_name_prefix="detail")  # shared by every request
MONITOR = PoolMonitor(POOL, interval=5.0).start()  # samples every 5 s; alarms go to the log
logger.enable("taskflow")  # taskflow's lines (WARNING for failed nodes) carry the trace id


def production_logging() -> None:
    """The production setting: INFO and up, one JSON object per line (``record.extra`` holds
    ``trace_id``, and on taskflow's lines ``flow_id``, ``flow`` and ``node``). For taskflow's
    per-node DEBUG lines while debugging: ``level="DEBUG"`` and ``taskflow.logs.log_nodes()``."""
    logger.remove()
    logger.add(sys.stderr, level="INFO", serialize=True)


app = Flask(__name__)


class BackendError(RuntimeError):
    """A backend call failed."""


def backend(ctx: TaskContext, call: str, seconds: float) -> None:
    """Stand in for one remote call of ``seconds``; ``?slow=`` and ``?fail=`` inject faults."""
    if request.args.get("fail") == call:
        raise BackendError(f"{call} backend answered 500")
    if request.args.get("slow") == call:
        while not ctx.cancelled:  # a slow call that gives up when the budget is spent
            time.sleep(0.01)
        return
    time.sleep(seconds)


# -- the nodes: plain functions of (ctx, param); the request is reachable in each ----------------


def product_info(ctx: TaskContext, _: Any) -> dict[str, Any]:
    backend(ctx, "product_info", 0.030)
    logger.info("loaded product {}", ctx["sku"])  # carries trace_id, like taskflow's own lines
    return {"sku": ctx["sku"], "title": "Mechanical keyboard K8"}


def price(ctx: TaskContext, _: Any) -> dict[str, Any]:
    product = ctx.result_of("product_info")
    backend(ctx, "price", 0.020)
    member = g.user is not None  # the handler's ``g``
    return {"sku": product["sku"], "amount": 79.0 if member else 89.0, "member_price": member}


def stock(ctx: TaskContext, _: Any) -> int:
    backend(ctx, "stock", 0.025)
    return 42


def category(ctx: TaskContext, _: Any) -> str:
    backend(ctx, "category", 0.015)
    return "keyboards"


def reviews(ctx: TaskContext, _: Any) -> dict[str, Any]:
    backend(ctx, "reviews", 0.040)
    return {"category": ctx.result_of("category"), "rating": 4.7, "count": 1284}


def recommendations(ctx: TaskContext, _: Any) -> list[str]:
    backend(ctx, "recommendations", 0.035)
    n = request.args.get("n", default=3, type=int)  # the handler's ``request``
    return [f"{ctx.result_of('category')}/sku-{10087 + i}" for i in range(n)]


def page(ctx: TaskContext, _: Any) -> dict[str, Any]:
    parts = ("product_info", "price", "stock", "reviews", "recommendations")
    return {name: ctx.result_of(name) for name in parts}


# -- the graph, built once at import ------------------------------------------------------------

# process-wide guards of the recommendations backend, shared by every request
RECO_BULKHEAD = Bulkhead("recommendations", max_concurrent=8, max_waiting=64)
RECO_BREAKER = CircuitBreaker("recommendations", failure_ratio=0.5, window=20, min_calls=10,
                              open_for=5.0)
# a slow recommendations call is cut at 0.2 s (and degraded) while the page still has budget
RECO_TIMEOUT = 0.2

PAGE = FunctionNode(page)
FunctionNode(product_info) >> [
    FunctionNode(price, hedge=Hedge(after="p95"), idempotent=True),
    FunctionNode(stock, share_key=lambda ctx, _: ("stock", ctx["sku"])),
] >> PAGE
FunctionNode(category) >> [
    FunctionNode(reviews),
    FunctionNode(recommendations, bulkhead=RECO_BULKHEAD, breaker=RECO_BREAKER,
                 timeout=RECO_TIMEOUT, fallback=lambda ctx, error: []),
] >> PAGE


# -- the streamed page: its own graph, the slow reviews last ---------------------------------------

# ``GET /products/<sku>/page`` sends HTML in parts: the top of the page at once, then each part
# as soon as its node settles, the slowest (the full reviews, from a slow backend) last. A part
# the budget cut says so in its place; CSS ``order`` lays the parts out whatever order they
# arrive in. No ``page`` node here: the response itself is the join.
STREAM_BUDGET = 1.0  # seconds for the whole streamed page
REVIEWS_S = 0.25  # the full reviews backend is slow; the rest of the page does not wait for it


def full_reviews(ctx: TaskContext, _: Any) -> dict[str, Any]:
    backend(ctx, "reviews", REVIEWS_S)
    return {"rating": 4.7, "count": 1284, "top": "Great switches, a little loud."}


STREAMED_PAGE = [FunctionNode(product_info), FunctionNode(category)]  # the two top nodes
STREAMED_PAGE[0] >> [FunctionNode(price), FunctionNode(stock)]
STREAMED_PAGE[1] >> [
    FunctionNode(full_reviews, name="reviews"),
    FunctionNode(recommendations, timeout=RECO_TIMEOUT, fallback=lambda ctx, error: []),
]

PAGE_TOP = (
    "<!doctype html><html><head><meta charset=utf-8><title>{sku}</title>"
    "<style>main{{display:flex;flex-direction:column}}"
    "#product_info{{order:1}}#price{{order:2}}#stock{{order:3}}#reviews{{order:4}}"
    "#recommendations{{order:5}}</style></head><body><main>\n"
)
PAGE_END = "</main></body></html>\n"


def page_part(name: str, wr: WorkResult[Any]) -> str:
    """One settled node as an HTML section (``category`` only feeds others: no section)."""
    if name == "category":
        return ""
    if wr.state in (ResultState.SUCCESS, ResultState.DEGRADED):
        body = html.escape(json.dumps(wr.result))
        return f'<section id="{name}" data-state="{wr.state.name}">{body}</section>\n'
    return f'<section id="{name}" data-state="{wr.state.name}">unavailable</section>\n'


# -- the web layer ------------------------------------------------------------------------------


@app.before_request
def identify() -> None:
    g.user = request.headers.get("X-User")
    g.trace_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]


@app.after_request
def echo_trace_id(response: Response) -> Response:
    response.headers["X-Request-Id"] = g.trace_id
    return response


@app.get("/products/<sku>")
def product_detail(sku: str) -> tuple[Response, int]:
    with logger.contextualize(trace_id=g.trace_id):
        result = TaskScheduling.start(PAGE, executor=POOL, timeout=BUDGET, name="product_detail",
                                      context=TaskContext(sku=sku))
    return render(result, sku)


def render(result: FlowResult, sku: str) -> tuple[Response, int]:
    """200 with the page; 504 naming the nodes the budget cut; 502 naming the failed calls."""
    body = {"sku": sku, "trace_id": g.trace_id, "flow_id": result.flow_id,
            "elapsed_ms": round(result.elapsed * 1000, 1)}
    if result.ok:
        return jsonify(body, page=result.outputs["page"], user=g.user,
                       degraded=sorted(result.degraded)), 200
    failed = result.failed  # name -> WorkResult, EXCEPTION or TIMEOUT
    timed_out = sorted(name for name, wr in failed.items() if wr.state is ResultState.TIMEOUT)
    if timed_out:
        return jsonify(body, error="budget exceeded", budget_s=BUDGET, timed_out=timed_out), 504
    # the calls that failed, not the nodes that were skipped because of them
    errors = {name: repr(wr.exception) for name, wr in failed.items()
              if not isinstance(wr.exception, UpstreamFailedError)}
    return jsonify(body, error="backend call failed", failed=errors), 502


def jsonify(body: dict[str, Any], **more: Any) -> Response:
    return flask.jsonify({**body, **more})


@app.get("/products/<sku>/page")
def product_page(sku: str) -> Response:
    """The product page as streamed HTML (``TaskScheduling.stream``): each part is sent as its
    node settles. The run starts here, in the request's context (its nodes read ``request``
    and ``g`` as in ``product_detail``); ``stream_with_context`` keeps that context while
    Flask sends the body. A client that goes away closes the generator, which closes the
    stream: the run is cancelled (its nodes see ``ctx.cancelled``)."""
    with logger.contextualize(trace_id=g.trace_id):
        parts = TaskScheduling.stream(STREAMED_PAGE, executor=POOL, timeout=STREAM_BUDGET,
                                      name="product_page", context=TaskContext(sku=sku))

    @stream_with_context
    def body() -> Iterator[str]:
        with parts:  # leaving it early (the client went away) cancels the run
            yield PAGE_TOP.format(sku=html.escape(sku))
            for name, wr in parts:
                part = page_part(name, wr)
                if part:
                    yield part
        yield PAGE_END
        logger.info("page {} sent in {:.3f}s: {}", sku, parts.result.elapsed,
                    parts.result.status.name)

    return Response(body(), mimetype="text/html")


@app.get("/pool")
def pool_metrics() -> Response:
    """The shared pool's metrics (``taskflow.PoolMetrics``) as JSON, taken now."""
    return flask.jsonify(POOL.metrics().model_dump(mode="json"))


@app.get("/metrics")
def prometheus() -> Response:
    """The monitor's latest sample of the pool and the process, with the recommendations
    backend's bulkhead and breaker (slots in use, rejections, state: ``PoolMonitor`` exports
    every live bulkhead, rate limit and breaker), for a Prometheus scrape."""
    return Response(MONITOR.to_prometheus(),
                    content_type="text/plain; version=0.0.4; charset=utf-8")


if __name__ == "__main__":
    production_logging()
    app.run(port=8000, threaded=True)
