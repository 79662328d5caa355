"""``ClampedSession``: a ``requests.Session`` that clamps requests made from a node.

``send`` (which ``request``, ``get``, ``post``... and every redirect hop go through) asks
``clamp.for_call`` with the call's read timeout: inside an attempt, the connect and read
timeouts become at most the attempt's time left and the deadline headers are set on the
prepared request; elsewhere the request goes out unchanged.
"""

from __future__ import annotations

from typing import Any

import requests

from taskflow.http import clamp

__all__ = ["ClampedSession"]


def _phases(timeout: Any) -> tuple[Any, Any]:
    """(connect, read) of a requests timeout: None, a number, a pair, or urllib3's Timeout."""
    if isinstance(timeout, tuple) and len(timeout) == 2:
        return timeout[0], timeout[1]
    if timeout is None or isinstance(timeout, (int, float)):
        return timeout, timeout
    connect = getattr(timeout, "connect_timeout", None)
    read = getattr(timeout, "read_timeout", None)
    return (connect if isinstance(connect, (int, float)) else None,
            read if isinstance(read, (int, float)) else None)


class ClampedSession(requests.Session):
    """A ``requests.Session`` whose requests from a node keep to its deadline
    (``taskflow.http``)."""

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        """Send ``request``; from a node, with its timeouts clamped and the deadline headers.

        Raises:
            BudgetExhaustedError: the node has no time left; nothing was sent.
        """
        connect, read = _phases(kwargs.get("timeout"))
        limit = clamp.for_call(read if isinstance(read, (int, float)) else None)
        if limit is not None:
            s = limit.seconds
            kwargs["timeout"] = (clamp.smaller(connect, s), clamp.smaller(read, s))
            request.headers.update(limit.headers)
        return super().send(request, **kwargs)
