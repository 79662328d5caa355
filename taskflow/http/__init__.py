"""HTTP clients whose calls from a node keep to the node's deadline: ``session()`` (requests,
extra ``[http]``), ``httpx_client()`` and ``async_httpx_client()`` (httpx, extra ``[httpx]``).

A request made from a task (on the thread that runs it, or awaited in an ``async def`` task)
gets the time the attempt has left, ``ctx.timeout()``, as its connect and read timeouts (each
phase, and each redirect hop, at most that; a smaller timeout passed to the call wins) and the
deadline headers, ``ctx.deadline_headers()`` (``grpc-timeout``,
``x-envoy-expected-rq-timeout-ms``, ``X-Request-Deadline``; they replace headers of the same
names). When no time is left the
request is not sent: ``BudgetExhaustedError`` (a ``TimeoutError``) is raised. A backend that
hangs therefore gives the worker thread back at the node's deadline instead of keeping it
after the run gave up (an async node's request is cancelled with its task at the deadline
anyway: there the clamp carries the deadline to the backend, and a clean-up request made after
it is not sent). Each clamped call is noted in the run's report
(``report().nodes[].clamps``).

Outside a node (the caller's thread, a hook, a thread of your own) and in another process the
clients are the plain clients: nothing is changed. A read timeout bounds each wait for bytes,
not the whole body: a backend that trickles bytes can still outlast the deadline (close the
response from ``ctx.on_cancel`` to cut it).

One client may be shared by every request thread and node, as the libraries allow (requests
does not promise a Session is thread-safe; one per thread, or httpx, is the safe choice). An
async client belongs to the event loop it is used on: share one among the async nodes of
taskflow's loop (or of the loop given to ``set_event_loop``), and under ``run_async`` use one
made for the awaiting loop.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskflow.http.with_httpx import ClampedAsyncClient, ClampedClient
    from taskflow.http.with_requests import ClampedSession

__all__ = ["async_httpx_client", "httpx_client", "session"]


def session() -> ClampedSession:
    """A ``requests.Session`` whose requests from a node are clamped to its deadline (see the
    module).

    Raises:
        ImportError: requests is not installed (``pip install 'taskflow-juc[http]'``).
    """
    try:
        from taskflow.http.with_requests import ClampedSession
    except ImportError as exc:
        raise ImportError(
            "taskflow.http.session() needs requests: pip install 'taskflow-juc[http]'"
        ) from exc
    return ClampedSession()


def httpx_client(**options: Any) -> ClampedClient:
    """An ``httpx.Client`` (``options`` as its constructor takes them) whose requests from a node
    are clamped to its deadline (see the module). Close it when done (``with`` works).

    Raises:
        ImportError: httpx is not installed (``pip install 'taskflow-juc[httpx]'``).
    """
    client: ClampedClient = _with_httpx("httpx_client").ClampedClient(**options)
    return client


def async_httpx_client(**options: Any) -> ClampedAsyncClient:
    """An ``httpx.AsyncClient`` (``options`` as its constructor takes them) whose requests
    awaited in an ``async def`` task are clamped to the node's deadline (see the module); from
    anywhere else (a coroutine of your own, ``asyncio.run`` outside a node) it is the plain
    client. Make it once and share it on its loop (making one loads the CA certificates, a
    blocking call); close it when done (``async with`` works).

    Raises:
        ImportError: httpx is not installed (``pip install 'taskflow-juc[httpx]'``).
    """
    client: ClampedAsyncClient = _with_httpx("async_httpx_client").ClampedAsyncClient(**options)
    return client


def _with_httpx(factory: str) -> ModuleType:
    """``taskflow.http.with_httpx``, or an ImportError naming the extra to install."""
    try:
        return importlib.import_module("taskflow.http.with_httpx")
    except ImportError as exc:
        raise ImportError(
            f"taskflow.http.{factory}() needs httpx: pip install 'taskflow-juc[httpx]'"
        ) from exc
