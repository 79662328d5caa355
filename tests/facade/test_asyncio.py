"""``await taskflow.run_async(...)`` for asyncio and ASGI apps (and examples/asgi_app.py).

Each test drives its own event loop with ``asyncio.run``: no plugin needed.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import json
import multiprocessing
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import conftest
import pytest
import remote_tasks as rt
from conftest import EPS, LONG, SCALE, SHORT
from loguru import logger

from taskflow import FunctionNode, ResultState, TaskContext, TaskSupport, run_async

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


@pytest.fixture(scope="module", autouse=True)
def allow_coordinator_thread() -> Iterator[None]:
    # run_async on a process pool starts taskflow's shared coordinator thread, once per process
    saved = conftest._ALLOWED_PREFIXES
    conftest._ALLOWED_PREFIXES = saved + ("taskflow-coordinator",)
    yield
    conftest._ALLOWED_PREFIXES = saved


def diamond() -> FunctionNode:
    src = FunctionNode(rt.const, 2, name="src")
    left = FunctionNode(rt.total, ("src",), name="left")
    right = FunctionNode(rt.total, ("src",), name="right")
    sink = FunctionNode(rt.total, ("left", "right"), name="sink")
    src >> [left, right] >> sink
    return src


def test_run_async_returns_the_flow_result(make_executor):
    pool = make_executor(4)

    result = asyncio.run(run_async(diamond(), executor=pool, timeout=LONG,
                                   context=TaskContext(offset=1)))

    assert result.ok
    assert result.outputs == {"src": 2, "left": 3, "right": 3, "sink": 7}


def test_the_event_loop_keeps_running_while_nodes_work(make_executor):
    pool = make_executor(2)
    work = 0.3 * SCALE

    async def main() -> tuple[Any, int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        result = await run_async(FunctionNode(rt.sleep_for, work, name="work"), executor=pool,
                                 timeout=LONG)
        stop.set()
        await ticking
        return result, ticks

    result, ticks = asyncio.run(main())

    assert result.ok
    assert ticks >= work / 0.01 / 3  # the loop was free while the node slept in a pool thread


def test_many_flows_awaited_at_once_share_one_graph_and_pool_without_cross_talk(make_executor):
    pool = make_executor(8)
    graph = diamond()

    async def main() -> list[Any]:
        return await asyncio.gather(*(
            run_async(graph, executor=pool, timeout=LONG, context=TaskContext(offset=i))
            for i in range(50)
        ))

    results = asyncio.run(main())

    assert [r.outputs["sink"] for r in results] == [3 * i + 4 for i in range(50)]
    assert len({r.flow_id for r in results}) == 50


def test_the_budget_ends_the_await_on_time(make_executor):
    pool = make_executor(2)
    budget = 0.3 * SCALE
    src = FunctionNode(rt.const, 1, name="src")
    slow = FunctionNode(rt.wait_for_cancel, (LONG, 0.0), name="slow")
    src >> slow

    t0 = time.monotonic()
    result = asyncio.run(run_async(src, executor=pool, timeout=budget))
    elapsed = time.monotonic() - t0

    assert budget <= elapsed < budget + EPS
    assert result["src"].work_result.state is ResultState.SUCCESS
    assert result["slow"].work_result.state is ResultState.TIMEOUT


def test_cancelling_the_awaiting_task_cancels_the_run(make_executor):
    pool = make_executor(2)
    started, saw_cancel = threading.Event(), threading.Event()
    ctx = TaskContext()

    def long_call(c: TaskContext, _: Any) -> str:
        started.set()
        while not c.cancelled:
            time.sleep(0.005)
        saw_cancel.set()
        return "too late"

    never = FunctionNode(rt.const, "never", name="never")
    FunctionNode(long_call, name="long_call") >> never

    async def main() -> None:
        task = asyncio.create_task(run_async(never, executor=pool, timeout=LONG, context=ctx))
        while not started.is_set():
            await asyncio.sleep(SHORT / 5)
        task.cancel()  # what an ASGI server does when the client goes away
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())

    assert saw_cancel.wait(LONG)  # the node saw ctx.cancelled and gave its thread back
    assert ctx.cancelled


def test_contextvars_and_log_context_of_the_awaiting_task_reach_the_nodes(
    make_executor, taskflow_logs
):
    from loguru import logger

    pool = make_executor(2)

    def read(ctx: TaskContext, _: Any) -> str | None:
        return REQUEST_ID.get()

    async def handler(request_id: str) -> Any:
        REQUEST_ID.set(request_id)
        with logger.contextualize(trace_id=request_id):
            flow = FunctionNode(read, name="read") >> FunctionNode(rt.fail, "x", name="bad")
            return await run_async(flow, executor=pool, timeout=LONG)

    async def main() -> list[Any]:
        return await asyncio.gather(*(handler(f"req-{i}") for i in range(10)))

    results = asyncio.run(main())

    assert [r.outputs["read"] for r in results] == [f"req-{i}" for i in range(10)]
    trace_of_flow = {r.flow_id: f"req-{i}" for i, r in enumerate(results)}
    warnings = [r for r in taskflow_logs if r["level"].name == "WARNING"]
    assert len(warnings) == 10
    for record in warnings:
        assert record["extra"]["trace_id"] == trace_of_flow[record["extra"]["flow_id"]]


class RecordsContext(FunctionNode):
    """Records the request id it sees in its on_fail hook."""

    def on_fail(self, support: TaskSupport) -> None:
        support.context.setdefault("hook_saw", []).append((self.name, REQUEST_ID.get()))


def test_timeout_hooks_and_log_lines_keep_the_awaiting_tasks_context(make_executor, taskflow_logs):
    from loguru import logger

    pool = make_executor(2)
    ctx = TaskContext()
    slow = RecordsContext(rt.wait_for_cancel, (LONG, 0.0), name="slow")

    async def handler() -> Any:
        REQUEST_ID.set("req-timeout")
        with logger.contextualize(trace_id="req-timeout"):
            return await run_async(slow, executor=pool, timeout=0.1 * SCALE, context=ctx)

    result = asyncio.run(handler())

    assert result["slow"].work_result.state is ResultState.TIMEOUT
    assert ctx["hook_saw"] == [("slow", "req-timeout")]
    warning = [r for r in taskflow_logs if r["level"].name == "WARNING"]
    assert [r["extra"].get("trace_id") for r in warning] == ["req-timeout"]


@pytest.fixture(scope="module")
def process_pool() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(rt.const, None, None).result(LONG)  # its manager thread, before any snapshot
        yield pool


def test_run_async_on_a_process_pool(process_pool):
    async def main() -> list[Any]:
        return await asyncio.gather(*(
            run_async(diamond(), executor=process_pool, timeout=LONG, context=TaskContext(offset=i))
            for i in range(4)
        ))

    results = asyncio.run(main())

    assert [r.outputs["sink"] for r in results] == [3 * i + 4 for i in range(4)]


# -- examples/asgi_app.py, driven as an ASGI server would ---------------------------------------


@pytest.fixture(scope="module")
def asgi() -> Iterator[Any]:
    path = Path(__file__).resolve().parents[2] / "examples" / "asgi_app.py"
    spec = importlib.util.spec_from_file_location("asgi_app_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["asgi_app_example"] = module
    spec.loader.exec_module(module)
    module.POOL.prestart_core_threads()
    yield module
    module.POOL.shutdown(wait=True)
    logger.disable("taskflow")  # the app enabled taskflow's logs; other suites expect them off
    sys.modules.pop("asgi_app_example", None)


async def asgi_get(app: Any, path: str, query: str = "") -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode()}
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_asgi_app_serves_50_concurrent_requests_on_one_loop(asgi):
    async def main() -> list[tuple[int, dict[str, Any]]]:
        return await asyncio.gather(*(asgi_get(asgi.app, f"/products/sku-{i}") for i in range(50)))

    t0 = time.monotonic()
    responses = asyncio.run(main())
    elapsed = time.monotonic() - t0

    assert [status for status, _ in responses] == [200] * 50
    skus = [body["page"]["price"]["sku"] for _, body in responses]
    assert skus == [f"sku-{i}" for i in range(50)]
    assert elapsed < 50 * 0.060 / 2  # overlapped: far less than 50 pages one after the other


def test_asgi_app_maps_the_budget_to_504_and_failures_to_502(asgi):
    async def main() -> list[tuple[int, dict[str, Any]]]:
        return await asyncio.gather(asgi_get(asgi.app, "/products/a", "slow=reviews"),
                                    asgi_get(asgi.app, "/products/b", "fail=stock"))

    (slow_status, slow), (fail_status, failed) = asyncio.run(main())

    assert slow_status == 504 and slow["timed_out"] == ["page", "reviews"]
    assert fail_status == 502 and list(failed["failed"]) == ["stock"]


def test_asgi_app_logs_a_failed_node_under_its_flow_name(asgi):
    """Regression: the ASGI example logged nothing (taskflow's lines were never enabled) and ran
    as flow 'page'; now a failed backend is one WARNING line with flow, flow_id and node."""
    records: list[Any] = []
    sink = logger.add(records.append, level="INFO", format="{message}")
    try:
        status, body = asyncio.run(asgi_get(asgi.app, "/products/c", "fail=stock"))
    finally:
        logger.remove(sink)
    assert status == 502
    mine = [m.record for m in records if m.record["extra"].get("flow_id") == body["flow_id"]]
    assert [(r["level"].name, r["extra"]["flow"], r["extra"]["node"]) for r in mine
            if r["extra"]["node"] == "stock"] == [("WARNING", "product_detail", "stock")]
