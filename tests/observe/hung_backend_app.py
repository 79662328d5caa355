"""A tiny WSGI app whose pages call a backend that hangs, for a real gunicorn started by a test
(``test_now_gunicorn.py``); gunicorn imports ``hung_backend_app:app`` with
``hung_backend_conf.py`` as its configuration.

``TASKFLOW_BACKEND_PORT`` is a socket server on 127.0.0.1 that the test controls: each backend
call connects, asks, and blocks in ``recv`` until the test answers, so the test, not the clock,
decides when the backend returns.

* ``/products/<sku>``: flow ``product_page``, ``product >> price >> page``; ``price`` calls
  ``fetch_price`` with a node timeout of 0.2 s that the call ignores: the page answers once the
  timeout passes, and the call stays behind, abandoned, holding a pool thread.
* ``/checkout/<id>``: flow ``checkout``, one node ``charge`` calling ``charge_card`` with a long
  budget: the request is in flight until the backend answers.
* ``/pid``: the worker's pid.
* ``/ops/taskflow/...``: the web view (``make_app``, with a ``PoolMonitor`` of the pool).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from typing import Any

from taskflow import FunctionNode, PoolMonitor, TaskScheduling, ThreadPool
from taskflow.observe.web import make_app

BACKEND = ("127.0.0.1", int(os.environ["TASKFLOW_BACKEND_PORT"]))
POOL = ThreadPool(16, thread_name_prefix="page")
MONITOR = PoolMonitor(POOL, interval=0.1).start()
VIEW = make_app(monitor=MONITOR)
PREFIX = "/ops/taskflow"


def _ask(question: bytes) -> str:
    with socket.create_connection(BACKEND) as conn:
        conn.sendall(question)
        return conn.recv(64).decode()  # blocks until the test answers (no timeout: the bug)


def fetch_price(ctx: Any, param: Any) -> str:
    return _ask(b"price\n")


def charge_card(ctx: Any, param: Any) -> str:
    return _ask(b"charge\n")


def _product_page() -> str:
    product = FunctionNode(lambda c, p: {"sku": 1}, name="product")
    price = FunctionNode(fetch_price, name="price", timeout=0.2)
    page = FunctionNode(lambda c, p: "page", name="page")
    product >> price >> page
    result = TaskScheduling.start(product, executor=POOL, timeout=30, name="product_page")
    return f"{result.status.name} price {result.result_of('price').state.name}\n"


def _checkout() -> str:
    result = TaskScheduling.start(FunctionNode(charge_card, name="charge"), executor=POOL,
                                  timeout=60, name="checkout")
    return f"{result.status.name} charge {result.result_of('charge').state.name}\n"


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    if path.startswith(PREFIX + "/") or path == PREFIX:
        environ = {**environ, "SCRIPT_NAME": environ.get("SCRIPT_NAME", "") + PREFIX,
                   "PATH_INFO": path[len(PREFIX):] or "/"}
        return VIEW(environ, start_response)
    if path.startswith("/products/"):
        body = _product_page()
    elif path.startswith("/checkout/"):
        body = _checkout()
    elif path == "/pid":
        body = f"{os.getpid()}\n"
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]
    data = body.encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
    return [data]
