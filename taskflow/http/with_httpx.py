"""``ClampedClient`` and ``ClampedAsyncClient``: an ``httpx.Client`` and an
``httpx.AsyncClient`` that clamp requests made from a node.

Their first ``request`` event hook (kept first when ``event_hooks`` is replaced) runs before
every request goes out, redirect hops included: inside an attempt the request's connect, read,
write and pool timeouts become at most the attempt's time left and the deadline headers are
set; elsewhere the request is left as it is. The sync client's hook runs on the calling thread;
the async client's runs in the awaiting task, on the loop thread, where an async node's
attempt is the one ``taskflow.http.clamp`` sees (the engine writes it around each step of the
node's coroutine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from taskflow.http import clamp

__all__ = ["ClampedAsyncClient", "ClampedClient"]

_PHASES = ("connect", "read", "write", "pool")


def clamp_request(request: httpx.Request) -> None:
    """The sync client's first request hook: clamp ``request`` when it is made from a node.

    Raises:
        BudgetExhaustedError: the node has no time left; the request is not sent.
    """
    timeout = dict(request.extensions.get("timeout") or {})
    read = timeout.get("read")
    limit = clamp.for_call(read if isinstance(read, (int, float)) else None)
    if limit is None:
        return
    s = limit.seconds
    request.extensions["timeout"] = {k: clamp.smaller(timeout.get(k), s) for k in _PHASES}
    request.headers.update(limit.headers)


async def clamp_async_request(request: httpx.Request) -> None:
    """The async client's first request hook: ``clamp_request``, awaited in the caller's task
    (it does not suspend, so it runs in the same step as the call).

    Raises:
        BudgetExhaustedError: the node has no time left; the request is not sent.
    """
    clamp_request(request)


def _first(hook: Callable[..., Any], event_hooks: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``event_hooks`` with ``hook`` first among the request hooks (and only there)."""
    mine = [h for h in event_hooks.get("request", []) if h is not hook]
    return {"request": [hook, *mine], "response": list(event_hooks.get("response", []))}


def _hooks_with(base: type, hook: Callable[..., Any]) -> Any:
    """``base``'s ``event_hooks`` property, whose setter keeps ``hook`` first."""
    plain = base.event_hooks  # type: ignore[attr-defined]
    return property(plain.fget, lambda self, hooks: plain.fset(self, _first(hook, hooks)))


class ClampedClient(httpx.Client):
    """An ``httpx.Client`` whose requests from a node keep to its deadline
    (``taskflow.http``)."""

    event_hooks = _hooks_with(httpx.Client, clamp_request)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.event_hooks = super().event_hooks  # through the setter: the clamp goes first


class ClampedAsyncClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose requests from a node keep to its deadline
    (``taskflow.http``)."""

    event_hooks = _hooks_with(httpx.AsyncClient, clamp_async_request)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.event_hooks = super().event_hooks  # through the setter: the clamp goes first
