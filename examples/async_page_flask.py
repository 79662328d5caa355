"""The async page (``examples/async_page.py``) from a sync Flask view, under gunicorn.

The view is a plain ``def``: it calls ``TaskScheduling.start`` and blocks its request thread for
at most the page's budget. In the run, the sync nodes (``product``, ``shipping``, ``page``) run
on ``POOL``, the application's ``ThreadPoolExecutor``; the async nodes (``price``, ``stock``,
``reviews``) run on taskflow's own event loop thread (``taskflow-asyncio``, one per worker
process, started on the first page), where hundreds of backend calls wait at once on one
thread. When the backend hangs, the calls are cancelled at the ``backend`` section's deadline
and the page comes back without them: the request thread is free at 0.25 s, and no pool thread,
loop task or socket is left behind (``GET /debug/inflight`` says so).

Run it from the repository's root, with the stand-in backend beside it::

    python examples/async_page.py --port 8100 &       # add --hang for a backend that hangs
    ASYNC_PAGE_BACKEND=127.0.0.1:8100 gunicorn --worker-class gthread --threads 8 \\
        --bind 127.0.0.1:8000 examples.async_page_flask:app
    curl 'localhost:8000/products/sku-1'               # "complete": true, or the missing parts
    curl 'localhost:8000/debug/inflight'

``POOL`` holds only the sync nodes: 8 request threads x 2 sync nodes at once (``shipping`` and
``page`` never overlap ``product``) is well within 16 threads. The async calls need no pool
threads at all, however many are waiting.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from flask import Flask, Response, jsonify

from examples.async_page import BUDGET, PAGE, debug, render
from taskflow import TaskContext, TaskScheduling

POOL = ThreadPoolExecutor(16, thread_name_prefix="page-pool")  # the sync nodes of every request
app = Flask(__name__)


@app.get("/products/<sku>")
def product_page(sku: str) -> tuple[Response, int]:
    result = TaskScheduling.start(PAGE, executor=POOL, timeout=BUDGET,
                                  context=TaskContext(sku=sku), name="async_page")
    status, body = render(result)
    return jsonify(body), status


@app.get("/debug/inflight")
def inflight() -> Response:
    return jsonify(debug("page-pool"))
