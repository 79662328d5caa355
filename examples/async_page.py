"""The product page of the async server examples, and a backend to run them against.

``examples/async_page_flask.py`` (a sync Flask view, under gunicorn) and
``examples/async_page_starlette.py`` (an ``async def`` Starlette route, under uvicorn) serve
this page. It mixes both kinds of node in one graph with one budget::

    product (sync) -> shipping (sync)          \\
                   -> price, stock, reviews (async) -> page (sync, best effort)

``product``, ``shipping`` and ``page`` are plain functions: they run on the application's
``ThreadPoolExecutor``. ``price``, ``stock`` and ``reviews`` are ``async def``: each makes one
HTTP call to the backend with ``asyncio.open_connection`` and holds no thread while it waits.
The three calls are the section ``backend``, whose deadline (0.25 s from the run's start) comes
before the page's budget (0.5 s): a call the backend has not answered by then is cancelled for
real (``CancelledError`` at its ``await``, its socket closed), and ``page`` renders what
arrived, listing the rest under ``missing``. A backend that hangs costs each page 0.25 s, no
thread and no socket left behind.

``debug()`` (``GET /debug/inflight`` in both apps) says what is left in the process: backend
calls whose asyncio task has not ended, calls cancelled so far, attempts abandoned on a
thread (``taskflow.observe.abandoned()``) and the process's threads.

The backend: ``ASYNC_PAGE_BACKEND`` (``host:port``, default ``127.0.0.1:8100``). This file
runs a stand-in for it, which answers every call, or none with ``--hang``::

    python examples/async_page.py --port 8100            # answers
    python examples/async_page.py --port 8100 --hang     # accepts calls, never answers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import threading
from collections import Counter
from typing import Any

from taskflow import (
    FlowResult,
    FunctionNode,
    Join,
    ResultNotAvailableError,
    Section,
    TaskContext,
)
from taskflow.observe import abandoned

BUDGET = 0.5  # seconds a page may take, everything included
BACKEND_DEADLINE = 0.25  # seconds from the run's start the backend calls may take
PARTS = ("price", "stock", "reviews")
host, _, port = os.environ.get("ASYNC_PAGE_BACKEND", "127.0.0.1:8100").rpartition(":")
BACKEND = (host, int(port))


# -- the backend calls: async nodes ---------------------------------------------------------------


class Calls:
    """The backend calls whose asyncio task has not ended, and how many were cancelled. Written
    on the event loop the calls run on, read by ``debug()`` from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[asyncio.Task[Any]] = set()
        self.cancelled = 0

    def enter(self) -> asyncio.Task[Any] | None:
        task = asyncio.current_task()
        if task is not None:
            with self.lock:
                self.running.add(task)
        return task

    def leave(self, task: asyncio.Task[Any] | None, cancelled: bool) -> None:
        with self.lock:
            if task is not None:
                self.running.discard(task)
            self.cancelled += cancelled

    def pending(self) -> int:
        with self.lock:
            return sum(not task.done() for task in self.running)


CALLS = Calls()


async def get(path: str) -> Any:
    """``GET path`` from the backend (HTTP/1.0: the backend closes the connection after its
    answer), the JSON body decoded."""
    task = CALLS.enter()
    cancelled = False
    try:
        reader, writer = await asyncio.open_connection(*BACKEND)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: backend\r\n\r\n".encode())
            await writer.drain()
            answer = await reader.read()  # the whole answer, until the backend closes
        finally:
            writer.close()  # at once, cancelled or not: the backend sees the call end
        head, _, body = answer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.0 200"):
            raise ConnectionError(f"backend {path}: {head[:60]!r}")
        return json.loads(body)
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        CALLS.leave(task, cancelled)


async def price(ctx: TaskContext, _: Any) -> float:
    return float((await get(f"/price/{ctx['sku']}"))["amount"])


async def stock(ctx: TaskContext, _: Any) -> int:
    return int((await get(f"/stock/{ctx['sku']}"))["units"])


async def reviews(ctx: TaskContext, _: Any) -> dict[str, Any]:
    answer: dict[str, Any] = await get(f"/reviews/{ctx['sku']}")
    return answer


# -- the rest of the page: sync nodes -------------------------------------------------------------


def product(ctx: TaskContext, _: Any) -> dict[str, Any]:
    sku = ctx["sku"]
    return {"sku": sku, "title": f"Mechanical keyboard {sku.upper()}", "weight_g": 820}


def shipping(ctx: TaskContext, _: Any) -> dict[str, Any]:
    weight = ctx.result_of("product")["weight_g"]
    return {"days": 2, "cost": round(4.9 + weight / 1000, 2)}


def page(ctx: TaskContext, _: Any) -> dict[str, Any]:
    """The page from what arrived: a part the backend did not give in time is ``missing``."""
    out: dict[str, Any] = {"product": ctx.result_of("product"),
                           "shipping": ctx.result_of("shipping")}
    missing = []
    for name in PARTS:
        try:
            out[name] = ctx.result_of(name)
        except ResultNotAvailableError:
            out[name] = None
            missing.append(name)
    return {**out, "missing": missing}


PAGE = FunctionNode(page, join=Join.BEST_EFFORT)  # runs once every father has ended, any way
_product = FunctionNode(product)
_calls = [FunctionNode(price), FunctionNode(stock), FunctionNode(reviews)]
_product >> [FunctionNode(shipping), *_calls] >> PAGE
Section("backend", _calls, deadline=BACKEND_DEADLINE)


def render(result: FlowResult) -> tuple[int, dict[str, Any]]:
    """The response to a run of ``PAGE``: a page, complete or degraded, or a 504."""
    body: dict[str, Any] = {"flow_id": result.flow_id,
                            "elapsed_ms": round(result.elapsed * 1000, 1)}
    if not result.ok or "page" not in result.outputs:
        return 504, {**body, "error": "budget exceeded", "failed": sorted(result.failed)}
    shown = result.outputs["page"]
    return 200, {**body, **shown, "complete": not shown["missing"]}


def debug(pool_prefix: str) -> dict[str, Any]:
    """What is left in this process (see the module docstring); ``pool_threads``: the threads
    whose name starts with ``pool_prefix``, the application pool's; ``thread_names``: how many
    threads of each name (numbers left out)."""
    names = [t.name for t in threading.enumerate()]
    kinds = Counter(re.sub(r"[-_]?\d+", "", n) for n in names)
    return {"pending_calls": CALLS.pending(), "cancelled_calls": CALLS.cancelled,
            "abandoned": len(abandoned()), "threads": len(names),
            "pool_threads": sum(n.startswith(pool_prefix) for n in names),
            "thread_names": dict(sorted(kinds.items()))}


# -- a stand-in backend ---------------------------------------------------------------------------


async def serve_backend(port: int, hang: bool) -> None:
    """Answer ``GET /price|stock|reviews/<sku>`` with JSON, or (``hang``) never answer."""
    answers = {"price": {"amount": 79.0}, "stock": {"units": 42},
               "reviews": {"rating": 4.7, "count": 1284}}

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode()
            if hang:
                await reader.read()  # until the caller gives up and closes
                return
            part = line.split(" ")[1].split("/")[1] if line.count(" ") >= 2 else ""
            body = json.dumps(answers.get(part, {})).encode()
            status = "200 OK" if part in answers else "404 Not Found"
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="a stand-in backend for the async page")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--hang", action="store_true", help="accept calls, answer none")
    args = parser.parse_args()
    print(f"backend on 127.0.0.1:{args.port}{' (hanging)' if args.hang else ''}", flush=True)
    asyncio.run(serve_backend(args.port, args.hang))


if __name__ == "__main__":
    main()
