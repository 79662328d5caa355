"""``taskflow.http.async_httpx_client()`` against a real HTTP server on 127.0.0.1: an async node
whose backend never answers ends TIMEOUT at its deadline with its asyncio task cancelled and its
connection closed; each request's timeouts are clamped to the node's time left and carry the
deadline headers; it works the same under ``run_async``; outside a node it is the plain client."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import EPS, LONG, MEDIUM, PROMPT, SHORT
from http_backend import DEADLINE_HEADERS, Backend, lower, running_backend

import taskflow
import taskflow.http
from taskflow import (
    BudgetExhaustedError,
    FlowStatus,
    FunctionNode,
    ResultState,
    TaskContext,
    TaskScheduling,
)
from taskflow.engine import aio

BUDGET = 0.2
PHASES = {"connect", "read", "write", "pool"}


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as b:
        yield b


@pytest.fixture
def client() -> Iterator[httpx.AsyncClient]:
    """One client for the test's nodes on taskflow's loop, made once as an application would:
    making one loads the CA certificates, a blocking call that does not belong in a task."""
    c = taskflow.http.async_httpx_client()
    yield c
    asyncio.run_coroutine_threadsafe(c.aclose(), aio.loop_thread.get()).result(PROMPT)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="tfpool") as p:
        yield p



def loop_tasks() -> set[asyncio.Task[Any]]:
    """The tasks left on taskflow's own loop, read on the loop thread."""
    async def others() -> set[asyncio.Task[Any]]:
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    return asyncio.run_coroutine_threadsafe(others(), aio.loop_thread.get()).result(PROMPT)


def settles(pred: Any) -> bool:
    """``pred()`` becomes true within PROMPT (polled: the loop's end of a cancelled task)."""
    end = time.monotonic() + PROMPT
    while not pred():
        if time.monotonic() > end:
            return False
        threading.Event().wait(0.005)
    return True


class Call:
    """An async task that GETs ``path`` through ``client``, noting the timeouts each request
    went out with and whether the task was cancelled."""

    def __init__(self, client: httpx.AsyncClient, backend: Backend, path: str,
                 **options: Any) -> None:
        self.client = client
        self.url = backend.url + path
        self.options = options
        self.timeouts: list[dict[str, float]] = []
        self.cancelled = threading.Event()
        client.event_hooks = {"request": [self.note]}

    async def note(self, request: httpx.Request) -> None:
        self.timeouts.append(dict(request.extensions["timeout"]))

    async def __call__(self, ctx: TaskContext, param: Any) -> str:
        try:
            response = await self.client.get(self.url, follow_redirects=True, **self.options)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return response.text


def test_a_hung_backend_ends_the_node_timeout_on_time_and_cancels_its_request(
        backend, client, pool):
    call = Call(client, backend, "/hang")
    started = time.monotonic()
    result = TaskScheduling.start(FunctionNode(call, name="hang"), executor=pool,
                                  timeout=BUDGET)
    took = time.monotonic() - started
    assert result.status is FlowStatus.TIMED_OUT
    assert result.result_of("hang").state is ResultState.TIMEOUT
    assert took < BUDGET + EPS
    assert backend.hung.is_set()
    assert call.cancelled.wait(PROMPT)  # CancelledError inside the request, not a read timeout
    assert backend.closed.wait(PROMPT)  # the connection was closed, not left to the backend
    assert settles(lambda: not loop_tasks())


def test_each_requests_timeouts_are_clamped_to_the_nodes_time_left(backend, client, pool):
    call = Call(client, backend, "/fast", timeout=LONG * 10)
    result = TaskScheduling.start(FunctionNode(call, name="fast"), executor=pool,
                                  timeout=MEDIUM)
    assert result.outputs == {"fast": "ok"}
    [timeout] = call.timeouts
    assert set(timeout) == PHASES and all(0 < t <= MEDIUM for t in timeout.values())
    [headers] = [lower(h) for h in backend.headers_of("/fast")]
    assert DEADLINE_HEADERS <= set(headers)
    assert 0 < int(headers["x-envoy-expected-rq-timeout-ms"]) <= MEDIUM * 1000 + 1
    report = result.report().nodes[0]
    assert report.clamped == 1 and 0 < report.clamps[0].timeout <= MEDIUM


def test_a_callers_smaller_timeout_wins_and_is_not_a_clamp(backend, client, pool):
    call = Call(client, backend, "/fast", timeout=SHORT)
    result = TaskScheduling.start(FunctionNode(call, name="fast"), executor=pool, timeout=LONG)
    assert result.outputs == {"fast": "ok"}
    assert call.timeouts == [dict.fromkeys(PHASES, SHORT)]
    assert result.attempt_notes == {}


def test_every_redirect_hop_is_clamped(backend, client, pool):
    call = Call(client, backend, "/hop")
    result = TaskScheduling.start(FunctionNode(call, name="hop"), executor=pool, timeout=MEDIUM)
    assert result.outputs == {"hop": "ok"}
    assert backend.paths() == ["/hop", "/fast"] and len(call.timeouts) == 2
    assert all(DEADLINE_HEADERS <= set(lower(h)) for h in
               backend.headers_of("/hop") + backend.headers_of("/fast"))
    assert result.attempt_notes["hop"].clamped == 2


def test_under_run_async_the_client_is_clamped_and_a_hung_call_cancelled(backend, pool):
    async def page() -> tuple[Any, Any, Call, Call, str]:
        # the client of the awaiting loop, made by the application before its requests
        async with taskflow.http.async_httpx_client() as client:
            fast = Call(client, backend, "/fast")
            ok = await taskflow.run_async(FunctionNode(fast, name="fast"), executor=pool,
                                          timeout=MEDIUM)
            hang = Call(client, backend, "/hang")
            hung = await taskflow.run_async(FunctionNode(hang, name="hang"), executor=pool,
                                            timeout=BUDGET)
            # the loop's own request, outside any node: the plain client
            plain = (await client.get(backend.url + "/fast")).text
        return ok, hung, fast, hang, plain

    ok, hung, fast, hang, plain = asyncio.run(page())
    assert ok.outputs == {"fast": "ok"} and ok.attempt_notes["fast"].clamped == 1
    assert all(0 < t <= MEDIUM for t in fast.timeouts[0].values())
    assert hung.result_of("hang").state is ResultState.TIMEOUT
    assert hang.cancelled.is_set() and backend.closed.wait(PROMPT)
    assert plain == "ok"
    first, last = backend.headers_of("/fast")
    assert DEADLINE_HEADERS <= set(lower(first)) and not DEADLINE_HEADERS & set(lower(last))


def test_outside_a_node_it_is_the_plain_client(backend):
    async def get() -> tuple[str, httpx.Timeout]:
        async with taskflow.http.async_httpx_client(timeout=1.0) as client:
            assert isinstance(client, httpx.AsyncClient)
            return (await client.get(backend.url + "/fast")).text, client.timeout

    text, timeout = asyncio.run(get())
    assert text == "ok" and timeout.read == 1.0
    [headers] = backend.headers_of("/fast")
    assert not DEADLINE_HEADERS & set(lower(headers))


def test_no_request_goes_out_once_the_attempt_has_no_time_left(backend, client, pool):
    errors: list[BaseException] = []

    async def late(ctx: TaskContext, param: Any) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # until the budget ends
        except asyncio.CancelledError:
            try:  # a clean-up call made after the deadline is not sent
                await client.get(backend.url + "/fast")
            except BudgetExhaustedError as exc:
                errors.append(exc)
            raise

    result = TaskScheduling.start(FunctionNode(late, name="late"), executor=pool,
                                  timeout=SHORT)
    assert result.status is FlowStatus.TIMED_OUT
    assert settles(lambda: errors)
    assert isinstance(errors[0], TimeoutError) and backend.paths() == []


def test_replacing_event_hooks_keeps_the_clamp_first(backend, client, pool):
    seen: list[str] = []

    async def user_hook(request: httpx.Request) -> None:
        seen.append(request.headers.get("grpc-timeout", ""))

    client.event_hooks = {"request": [user_hook]}

    async def call(ctx: TaskContext, param: Any) -> str:
        return (await client.get(backend.url + "/fast")).text

    result = TaskScheduling.start(FunctionNode(call, name="n"), executor=pool, timeout=MEDIUM)
    assert result.outputs == {"n": "ok"}
    assert seen and seen[0] != ""  # the user's hook saw the request already clamped
