"""A Flask page that takes its deadline from the caller and passes it on to its backends.

The gateway in front of this service says how long it will wait for the answer (gRPC's
``grpc-timeout``, Envoy's ``x-envoy-expected-rq-timeout-ms`` or ``X-Request-Deadline``). The
handler starts the page's flow with the smaller of that and its own budget
(``budget_from_headers``), and each node calls its backend through ``taskflow.http.session()``:
every call is clamped to the node's deadline and carries it on in the same three headers. A
backend that hangs gives the worker thread back at the deadline instead of keeping it after the
page gave up. The audit write that follows each page is detached (``detach=True``): the answer
does not wait for it, it runs under its own 2 s timeout, and the process runs at most
``set_max_detached`` of them at once.

Run it::

    python examples/backend_calls.py

It starts a stub backend on 127.0.0.1 (prices answer at once, stock never does) and asks the
page three times through Flask's test client: with a 400 ms deadline (200, stock left out at
its own 150 ms timeout), with a deadline already past (504 at once, nothing called) and with
100 ms (504: the run's deadline came first). For each it prints what the stock backend was
told, what the run's report says of the clamp, and how the detached audit write ended. Serve it against a real backend with
``BACKEND_URL=http://... flask --app examples/backend_calls.py run``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flask import Flask, jsonify, request

import taskflow.http
from taskflow import FlowStatus, FunctionNode, TaskContext, TaskScheduling, budget_from_headers

BACKEND = os.environ.get("BACKEND_URL", "http://127.0.0.1:8081")
POOL = ThreadPoolExecutor(8, thread_name_prefix="page")
# one client for the process (urllib3's connection pool is shared by the request threads)
SESSION = taskflow.http.session()


def get_price(ctx: TaskContext, param: Any) -> Any:
    return SESSION.get(f"{BACKEND}/price/{ctx['sku']}").json()


def get_stock(ctx: TaskContext, param: Any) -> Any:
    return SESSION.get(f"{BACKEND}/stock/{ctx['sku']}").json()


def render(ctx: TaskContext, param: Any) -> dict[str, Any]:
    return {"sku": ctx["sku"], "price": ctx.result_of("price"), "stock": ctx.result_of("stock")}


def write_audit(ctx: TaskContext, param: Any) -> Any:
    # detached: clamped to its own 2 s, not to what is left of the page's budget
    return SESSION.get(f"{BACKEND}/audit/{ctx['sku']}").json()


# the graph, built once: stock is optional for the page (its own 150 ms, then a stand-in)
price = FunctionNode(get_price, name="price")
stock = FunctionNode(get_stock, name="stock", timeout=0.15, fallback={"in_stock": None})
page = FunctionNode(render, name="page")
price >> page
stock >> page
# the audit write: after the page is rendered, but the answer does not wait for it
audit = FunctionNode(write_audit, name="audit", detach=True, timeout=2.0)
page >> audit

app = Flask(__name__)


@app.get("/product/<sku>")
def product(sku: str) -> Any:
    # the caller's deadline, less 20 ms to write the answer; 500 ms when it sends none
    budget = budget_from_headers(request.headers, default=0.5, reserve=0.02)
    result = TaskScheduling.start([price, stock], executor=POOL, timeout=budget,
                                  context=TaskContext(sku=sku), name="product_detail")
    if result.ok:
        return jsonify(result.outputs["page"])
    code = 504 if result.status is FlowStatus.TIMED_OUT else 502
    return jsonify(error=result.summary, budget=budget), code


# -- the stub backend and the three requests (python examples/backend_calls.py) --------------


class StubBackend:
    """Prices and audits at once; stock only when ``release`` is set (at exit). Records stock's
    headers and the audited SKUs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.told: list[dict[str, str]] = []
        self.audited: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for a GET
                if self.path.startswith("/stock/"):
                    stub.told.append({k.lower(): v for k, v in self.headers.items()})
                    stub.release.wait(30)
                    body = {"in_stock": 3}
                elif self.path.startswith("/audit/"):
                    stub.audited.append(self.path.rsplit("/", 1)[-1])
                    body = {"audited": True}
                else:
                    body = {"amount": 19.99, "currency": "EUR"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the page stopped waiting for stock and closed the connection

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="stub-backend",
                                       daemon=True)


def ask(client: Any, stub: StubBackend, headers: dict[str, str]) -> int:
    """One request to the page; prints what came back and what stock's backend was told."""
    told = len(stub.told)
    started = time.monotonic()
    answer = client.get("/product/sku-1", headers=headers)
    took = time.monotonic() - started
    print(f"{headers} -> {answer.status_code} in {took * 1000:.0f} ms: {answer.get_json()}")
    for seen in stub.told[told:]:
        print(f"  stock backend told: grpc-timeout={seen.get('grpc-timeout')}, "
              f"x-envoy-expected-rq-timeout-ms={seen.get('x-envoy-expected-rq-timeout-ms')}")
    return int(answer.status_code)


def main() -> int:
    global BACKEND
    stub = StubBackend()
    stub.thread.start()
    BACKEND = stub.url
    client = app.test_client()
    try:
        past = str(int((time.time() - 1) * 1000))
        codes = [ask(client, stub, {"grpc-timeout": "400m"}),
                 ask(client, stub, {"X-Request-Deadline": past}),
                 ask(client, stub, {"x-envoy-expected-rq-timeout-ms": "100"})]
        # the clamp, as the report of one more run shows it
        result = TaskScheduling.start([price, stock], executor=POOL, timeout=0.4,
                                      context=TaskContext(sku="sku-2"))
        for node in result.report().nodes:
            if node.clamps:
                print(f"report: {node.name} was clamped to {node.clamps[0].timeout * 1000:.0f} ms "
                      f"(attempt {node.clamps[0].attempt}), ended {node.state}")
        # the audit write was handed off: the run returned without it; its Future says more
        final = result.detached("audit").result(timeout=3.0)
        print(f"audit: handed off {result.states()['audit'].name}, ended {final.state.name}")
        # the stock calls hung, but no worker did: each came back at its deadline
        busy = threading.Event()
        POOL.submit(busy.set)
        print("a worker is free at once:", busy.wait(1.0))
    finally:
        stub.release.set()
        stub.server.shutdown()
        stub.server.server_close()
        SESSION.close()
        POOL.shutdown(wait=True)
    return 0 if codes == [200, 504, 504] else 1


if __name__ == "__main__":
    sys.exit(main())
