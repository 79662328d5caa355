"""``ClampedClient``: an ``httpx.Client`` that clamps requests made from a node.

Its first ``request`` event hook (kept first when ``event_hooks`` is replaced) runs on the
calling thread before every request goes out, redirect hops included: inside an attempt the
request's connect, read, write and pool timeouts become at most the attempt's time left and
the deadline headers are set; elsewhere the request is left as it is.
"""

from __future__ import annotations

from typing import Any

import httpx

from taskflow.http import clamp

__all__ = ["ClampedClient"]

_PHASES = ("connect", "read", "write", "pool")


def clamp_request(request: httpx.Request) -> None:
    """The client's first request hook: clamp ``request`` when it is made from a node.

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


class ClampedClient(httpx.Client):
    """An ``httpx.Client`` whose requests from a node keep to its deadline
    (``taskflow.http``)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.event_hooks = super().event_hooks  # through the setter: the clamp goes first

    @property
    def event_hooks(self) -> dict[str, list[Any]]:
        return super().event_hooks

    @event_hooks.setter
    def event_hooks(self, event_hooks: dict[str, list[Any]]) -> None:
        mine = [h for h in event_hooks.get("request", []) if h is not clamp_request]
        httpx.Client.event_hooks.fset(  # type: ignore[attr-defined]
            self, {"request": [clamp_request, *mine],
                   "response": list(event_hooks.get("response", []))})
