"""A Conductor workflow made of system tasks, run in-process with ``taskflow.conductor``.

``order_workflow.json`` beside this file prices an order in JavaScript (INLINE), asks a
warehouse for stock over HTTP, lists what is missing with jq (JSON_JQ_TRANSFORM), keeps the
total in a workflow variable (SET_VARIABLE), routes with a JavaScript SWITCH (a TERMINATE ends
backorders early), and polls the warehouse in a DO_WHILE until the order is packed.

The warehouse here is a small HTTP server on 127.0.0.1 started by this script, and the workflow
is loaded with ``allow_hosts=["127.0.0.1"]``: its HTTP tasks may call nothing else. The only
Python callable is the SIMPLE ``review`` task.

Run it with ``python examples/conductor_orders.py`` (needs ``pip install
'taskflow-juc[conductor]'``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from taskflow import conductor

DEFINITION = Path(__file__).with_name("order_workflow.json")
STOCK = {"pen": 100, "ink": 0}
PACKED_AFTER = 3  # the warehouse answers "packed" on the third poll


class Warehouse(BaseHTTPRequestHandler):
    """``POST /stock`` and ``GET /pack/<n>``, answering JSON."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, value: Any) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        lines = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["skus"]
        self._json({"items": [{"sku": ln["sku"], "wanted": ln["qty"],
                               "available": STOCK.get(ln["sku"], 0)} for ln in lines]})

    def do_GET(self) -> None:
        poll = int(self.path.rsplit("/", 1)[-1])
        self._json({"status": "packed" if poll >= PACKED_AFTER else "picking"})


@contextmanager
def warehouse() -> Iterator[str]:
    """A warehouse server on 127.0.0.1 for the duration of the block; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Warehouse)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="example-warehouse")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


REGISTRY = {"review": lambda task_input: {"reviewed": task_input["total"]}}


def main() -> dict[str, conductor.WorkflowRun]:
    workflow = conductor.load(DEFINITION, REGISTRY, allow_hosts=["127.0.0.1"])
    orders = {
        "small": [{"sku": "pen", "qty": 3, "unit": 2.5}],
        "large": [{"sku": "pen", "qty": 50, "unit": 2.5}],
        "backorder": [{"sku": "pen", "qty": 1, "unit": 2.5}, {"sku": "ink", "qty": 2, "unit": 9}],
    }
    runs: dict[str, conductor.WorkflowRun] = {}
    with warehouse() as url, ThreadPoolExecutor(4, thread_name_prefix="orders") as pool:
        for name, lines in orders.items():
            run = workflow.run({"lines": lines, "warehouse": url}, executor=pool)
            runs[name] = run
            print(f"{name:9} {run.status:9} {json.dumps(run.output)}"
                  + (f"  ({run.reason})" if run.reason else ""))
    return runs


if __name__ == "__main__":
    main()
