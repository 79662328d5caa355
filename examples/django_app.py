"""A product-detail endpoint in Django, as a single-file project: settings, URLs and views below.

Same page as ``flask_app.py``: six backend calls, two of them waiting for a third::

    product_info -> price, stock            \\
                                              -> page
    category     -> reviews, recommendations /

The graph is built once at import and shared by every request thread; each request starts it on
the shared pool with its own ``TaskContext``. Django's request is not a contextvar, so the view
passes it through the context (``ctx["request"]``): any node can read the query string, headers
or session from there (on a thread pool; on a process pool or dask only picklable values can
travel, so pass the fields you need instead). A middleware binds a trace id with loguru's
``contextualize``; taskflow copies the view's ``contextvars`` into every node, so the id is on
taskflow's log lines and the nodes' own lines.

A budget overrun is a ``504`` naming the nodes that timed out, a failed backend call a ``502``
naming it, except recommendations: optional, with a fallback (the page renders without them and
lists them under ``degraded``). ``GET /pool`` returns the pool's metrics as JSON; ``GET /metrics`` the pool monitor's
latest sample for Prometheus.

Run it from the repository's root with Django's development server::

    python examples/django_app.py runserver 8000
    curl -H 'X-User: ann' 'localhost:8000/products/sku-10086'
    curl 'localhost:8000/products/sku-1?slow=reviews'     # a 504 naming reviews and page
    curl 'localhost:8000/products/sku-1?fail=stock'       # a 502 naming stock
    curl 'localhost:8000/products/sku-1?fail=recommendations'  # 200, without recommendations
    curl 'localhost:8000/pool'
    curl 'localhost:8000/metrics'
    curl -N 'localhost:8000/products/sku-1/page'   # streamed HTML: the slow reviews come last

(``slow`` and ``fail`` inject a fault into one backend call, to try the error paths.)

The module is also a WSGI application (``application``, as in a project's ``wsgi.py``), so any
WSGI server runs it; under gunicorn's threaded worker (``examples/gunicorn.conf.py`` explains the
pool sizing and what ``--preload`` changes)::

    gunicorn -c examples/gunicorn.conf.py --bind 127.0.0.1:8000 examples.django_app:application
"""

from __future__ import annotations

import html
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import django
from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from loguru import logger

from taskflow import (
    FlowResult,
    FunctionNode,
    PoolMonitor,
    ResultState,
    TaskContext,
    TaskScheduling,
    ThreadPool,
    UpstreamFailedError,
    WorkResult,
)

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="taskflow-example-not-a-secret",
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["localhost", "127.0.0.1", "testserver"],
        MIDDLEWARE=[f"{__name__}.trace_middleware"],
        INSTALLED_APPS=[],
        DATABASES={},
    )
    django.setup()

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


class BackendError(RuntimeError):
    """A backend call failed."""


def backend(ctx: TaskContext, call: str, seconds: float) -> None:
    """Stand in for one remote call of ``seconds``; ``?slow=`` and ``?fail=`` inject faults."""
    query = ctx["request"].GET
    if query.get("fail") == call:
        raise BackendError(f"{call} backend answered 500")
    if query.get("slow") == call:
        while not ctx.cancelled:  # a slow call that gives up when the budget is spent
            time.sleep(0.01)
        return
    time.sleep(seconds)


# -- the nodes: plain functions of (ctx, param); the request is ctx["request"] -------------------


def product_info(ctx: TaskContext, _: Any) -> dict[str, Any]:
    backend(ctx, "product_info", 0.030)
    logger.info("loaded product {}", ctx["sku"])  # carries trace_id, like taskflow's own lines
    return {"sku": ctx["sku"], "title": "Mechanical keyboard K8"}


def price(ctx: TaskContext, _: Any) -> dict[str, Any]:
    product = ctx.result_of("product_info")
    backend(ctx, "price", 0.020)
    member = ctx["request"].headers.get("X-User") is not None
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
    n = int(ctx["request"].GET.get("n", 3))
    return [f"{ctx.result_of('category')}/sku-{10087 + i}" for i in range(n)]


def page(ctx: TaskContext, _: Any) -> dict[str, Any]:
    parts = ("product_info", "price", "stock", "reviews", "recommendations")
    return {name: ctx.result_of(name) for name in parts}


# -- the graph, built once at import ------------------------------------------------------------

PAGE = FunctionNode(page)
FunctionNode(product_info) >> [FunctionNode(price), FunctionNode(stock)] >> PAGE
# recommendations are optional: cut at 0.2 s, and on any failure the page renders without them
# (``flask_app.py`` adds a bulkhead and a circuit breaker; docs/guides/resilience.md)
FunctionNode(category) >> [
    FunctionNode(reviews),
    FunctionNode(recommendations, timeout=0.2, fallback=lambda ctx, error: []),
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
    FunctionNode(recommendations, timeout=0.2, fallback=lambda ctx, error: []),
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


Handler = Callable[[HttpRequest], HttpResponse]


def trace_middleware(get_response: Handler) -> Handler:
    """Give every request a trace id, bound to every log line written while it is served."""

    def middleware(request: HttpRequest) -> HttpResponse:
        trace_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
        request.trace_id = trace_id  # type: ignore[attr-defined]
        with logger.contextualize(trace_id=trace_id):
            response = get_response(request)
        response["X-Request-Id"] = trace_id
        return response

    return middleware


def product_detail(request: HttpRequest, sku: str) -> JsonResponse:
    ctx = TaskContext(request=request, sku=sku)
    result = TaskScheduling.start(PAGE, executor=POOL, timeout=BUDGET, name="product_detail",
                                  context=ctx)
    return render(request, result, sku)


def render(request: HttpRequest, result: FlowResult, sku: str) -> JsonResponse:
    """200 with the page; 504 naming the nodes the budget cut; 502 naming the failed calls."""
    body: dict[str, Any] = {
        "sku": sku,
        "trace_id": request.trace_id,  # type: ignore[attr-defined]
        "flow_id": result.flow_id,
        "elapsed_ms": round(result.elapsed * 1000, 1),
    }
    if result.ok:
        body.update(page=result.outputs["page"], user=request.headers.get("X-User"),
                    degraded=sorted(result.degraded))
        return JsonResponse(body)
    failed = result.failed  # name -> WorkResult, EXCEPTION or TIMEOUT
    timed_out = sorted(name for name, wr in failed.items() if wr.state is ResultState.TIMEOUT)
    if timed_out:
        body.update(error="budget exceeded", budget_s=BUDGET, timed_out=timed_out)
        return JsonResponse(body, status=504)
    # the calls that failed, not the nodes that were skipped because of them
    body.update(error="backend call failed", failed={
        name: repr(wr.exception) for name, wr in failed.items()
        if not isinstance(wr.exception, UpstreamFailedError)
    })
    return JsonResponse(body, status=502)


def product_page(request: HttpRequest, sku: str) -> StreamingHttpResponse:
    """The product page as streamed HTML (``TaskScheduling.stream``): each part is sent as its
    node settles. The run starts here, inside the trace middleware (its nodes carry the trace
    id; they read the request from the context as in ``product_detail``). When the client goes
    away the server closes the response, which closes the generator and the stream: the run
    is cancelled (its nodes see ``ctx.cancelled``)."""
    parts = TaskScheduling.stream(STREAMED_PAGE, executor=POOL, timeout=STREAM_BUDGET,
                                  name="product_page",
                                  context=TaskContext(request=request, sku=sku))

    def body() -> Iterator[str]:
        with parts:  # leaving it early (the client went away) cancels the run
            yield PAGE_TOP.format(sku=html.escape(sku))
            for name, wr in parts:
                part = page_part(name, wr)
                if part:
                    yield part
        yield PAGE_END

    return StreamingHttpResponse(body(), content_type="text/html; charset=utf-8")


def pool_metrics(request: HttpRequest) -> JsonResponse:
    """The shared pool's metrics (``taskflow.PoolMetrics``) as JSON, taken now."""
    return JsonResponse(POOL.metrics().model_dump(mode="json"))


def prometheus(request: HttpRequest) -> HttpResponse:
    """The monitor's latest sample of the pool and the process, for a Prometheus scrape."""
    return HttpResponse(MONITOR.to_prometheus(),
                        content_type="text/plain; version=0.0.4; charset=utf-8")


urlpatterns = [
    path("products/<str:sku>", product_detail),
    path("products/<str:sku>/page", product_page),
    path("pool", pool_metrics),
    path("metrics", prometheus),
]

# what a project's wsgi.py exposes: gunicorn, uWSGI and mod_wsgi serve this
application = get_wsgi_application()


if __name__ == "__main__":
    from django.core.management import execute_from_command_line

    production_logging()
    execute_from_command_line(sys.argv)
