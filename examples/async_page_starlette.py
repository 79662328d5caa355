"""The async page (``examples/async_page.py``) from an ``async def`` Starlette route, under uvicorn.

The route awaits ``taskflow.run_async``: the event loop serves other requests meanwhile. In the
run, the async nodes (``price``, ``stock``, ``reviews``) run on that same loop, uvicorn's, and
the sync nodes (``product``, ``shipping``, ``page``) on ``POOL``, the application's
``ThreadPoolExecutor``. When the backend hangs, the calls are cancelled at the ``backend``
section's deadline and the page comes back without them; a client that goes away cancels the
whole run. Nothing is left on the loop or in the pool (``GET /debug/inflight`` says so).
FastAPI is Starlette underneath: the same ``await run_async(...)`` in an ``@app.get`` route.

Run it from the repository's root, with the stand-in backend beside it::

    python examples/async_page.py --port 8100 &       # add --hang for a backend that hangs
    ASYNC_PAGE_BACKEND=127.0.0.1:8100 uvicorn --port 8000 examples.async_page_starlette:app
    curl 'localhost:8000/products/sku-1'               # "complete": true, or the missing parts
    curl 'localhost:8000/debug/inflight'
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.async_page import BUDGET, PAGE, debug, render
from taskflow import TaskContext, run_async

POOL = ThreadPoolExecutor(16, thread_name_prefix="page-pool")  # the sync nodes of every request


async def product_page(request: Request) -> JSONResponse:
    result = await run_async(PAGE, executor=POOL, timeout=BUDGET,
                             context=TaskContext(sku=request.path_params["sku"]),
                             name="async_page")
    status, body = render(result)
    return JSONResponse(body, status_code=status)


async def inflight(request: Request) -> JSONResponse:
    return JSONResponse(debug("page-pool"))


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    POOL.shutdown(wait=False)


app = Starlette(routes=[Route("/products/{sku}", product_page),
                        Route("/debug/inflight", inflight)], lifespan=lifespan)
