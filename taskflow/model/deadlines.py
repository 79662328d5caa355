"""Deadlines that travel between services: the headers a caller's deadline arrives in, and the
ones a node's deadline leaves in.

Three request headers carry a deadline over HTTP, and both directions use all three:

``grpc-timeout``
    gRPC's wire format: at most 8 ASCII digits, then a unit: ``H`` hours, ``M`` minutes, ``S``
    seconds, ``m`` milliseconds, ``u`` microseconds, ``n`` nanoseconds (``250m``, ``1S``). The
    unit is case-sensitive (``M`` is minutes, ``m`` milliseconds).
``x-envoy-expected-rq-timeout-ms``
    The time the gateway (Envoy) gives the whole request, in whole milliseconds.
``X-Request-Deadline``
    The absolute deadline in Unix epoch milliseconds (a wall clock: the two machines' clocks
    must agree). A value before 2001-09-09 (fewer than 13 digits) is refused as malformed: it
    is almost certainly epoch *seconds*, which would read as a deadline long past.

Reading (``budget_from_headers``): header names are case-insensitive; a dict, Flask/Werkzeug
``Headers``, Django's ``request.headers``, ``requests``/``httpx`` headers and a WSGI
``environ`` (``HTTP_GRPC_TIMEOUT``, ...) all work. The caller's budget is the smallest one the
headers give; a malformed value is ignored and logged once per header name in the process
(WARNING, through the library's loguru logger). Writing (``deadline_headers_for``): each
header is rounded up to its unit, as gRPC does, so a small positive budget never reads as 0
(which some proxies take as "no limit"); the epoch deadline is rounded down.

Thread safety: the functions are pure but for the process-wide set of header names already
reported malformed (``_WARNED``, guarded by ``_WARNED_LOCK``).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from typing import Any

from taskflow import clock
from taskflow.errors import FlowDefinitionError, InvalidArgumentError, InvalidNodeError
from taskflow.logs import logger

__all__ = ["DEADLINE", "ENVOY", "GRPC", "budget_from_headers", "check_seconds",
           "deadline_headers_for", "parse_header"]

GRPC = "grpc-timeout"
ENVOY = "x-envoy-expected-rq-timeout-ms"
DEADLINE = "X-Request-Deadline"

# lower-cased header name -> the name as written out
_NAMES = {GRPC: GRPC, ENVOY: ENVOY, DEADLINE.lower(): DEADLINE}
# the WSGI environ keys of the same headers (PEP 3333: HTTP_ and the name upper-cased, - as _)
_ENVIRON = {"HTTP_" + name.upper().replace("-", "_"): name for name in _NAMES}

_GRPC_VALUE = re.compile(r"(\d{1,8})([HMSmun])")
_GRPC_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# the units written out, finest first, as nanoseconds each
_GRPC_OUT = (("n", 1), ("u", 1_000), ("m", 1_000_000), ("S", 1_000_000_000),
             ("M", 60_000_000_000), ("H", 3_600_000_000_000))
_GRPC_MAX = 99_999_999
_DIGITS = re.compile(r"\d{1,16}")
# epoch milliseconds of 2001-09-09: any real deadline in epoch ms is larger
_EPOCH_MS_FLOOR = 10**12

_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def parse_header(name: str, value: str, now: float | None = None) -> float:
    """Seconds of budget one deadline header gives (0.0 when its deadline has passed).

    Args:
        name: one of the three header names, any case.
        value: the header's value (surrounding spaces are ignored).
        now: ``time.time()`` to read ``X-Request-Deadline`` against (default: now).

    Raises:
        ValueError: the value is malformed (the message says how), or ``name`` is not one of
            the three headers.
    """
    key = name.lower()
    text = value.strip()
    if key == GRPC:
        match = _GRPC_VALUE.fullmatch(text)
        if match is None:
            raise ValueError("expected up to 8 digits and a unit H, M, S, m, u or n, as 250m")
        return int(match.group(1)) * _GRPC_UNITS[match.group(2)]
    if key not in _NAMES:
        raise ValueError(f"{name!r} is not a deadline header")
    if _DIGITS.fullmatch(text) is None:
        raise ValueError("expected a whole number of milliseconds")
    ms = int(text)
    if key == ENVOY:
        return ms / 1000.0
    if ms < _EPOCH_MS_FLOOR:
        raise ValueError("expected Unix epoch milliseconds (13 digits); this looks like seconds")
    return max(0.0, ms / 1000.0 - (clock.wall() if now is None else now))


def _items(headers: object) -> Any:
    """The (name, value) pairs of a mapping of headers, names as the three headers are
    spelled in lower case (a WSGI environ's ``HTTP_...`` keys translated)."""
    if isinstance(headers, (str, bytes, bytearray)) or not callable(
            getattr(headers, "items", None)):
        raise InvalidArgumentError(
            "budget_from_headers needs a mapping of request headers (a dict, Flask's "
            "request.headers, Django's request.headers or a WSGI environ), got "
            f"{type(headers).__name__}")
    environ = isinstance(headers, Mapping) and (
        "wsgi.version" in headers or "REQUEST_METHOD" in headers)
    for key, value in headers.items():  # type: ignore[attr-defined]
        if not isinstance(key, str):
            continue
        name = _ENVIRON.get(key) if environ else key.lower()
        if name in _NAMES:
            yield name, value


def _warn_once(name: str, value: object, why: str) -> None:
    with _WARNED_LOCK:
        if name in _WARNED:
            return
        _WARNED.add(name)
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    logger.warning("ignoring malformed {} header {}: {} (said once per process)",
                   _NAMES[name], text, why)


def budget_from_headers(headers: object, default: float | None, *,
                        reserve: float = 0.0) -> float | None:
    """The budget to start a run with: the smaller of ``default`` and the caller's deadline.

    The caller's deadline is read from ``grpc-timeout``, ``x-envoy-expected-rq-timeout-ms`` and
    ``X-Request-Deadline`` (the smallest when several are present; see the module docstring
    for their formats), then ``reserve`` is taken off (time kept back to write the response).
    A malformed header is ignored (logged once per header name in the process). A deadline
    already past gives ``0.0``: ``TaskScheduling.start(..., timeout=0)`` then returns at once
    with every node ``TIMEOUT`` and nothing submitted (status ``TIMED_OUT``), so answer the
    caller (504) without running anything.

    Args:
        headers: the request's headers: any mapping of name to value (names in any case), such
            as a dict, Flask's ``request.headers``, Django's ``request.headers``, or a WSGI
            ``environ``.
        default: this service's own budget in seconds (None: none of its own).
        reserve: seconds to keep back from the budget (>= 0).

    Returns:
        Seconds (never negative), or None when neither ``default`` nor a header sets a limit.

    Raises:
        InvalidArgumentError: ``headers`` is not a mapping (also a TypeError).
        FlowDefinitionError: ``default`` or ``reserve`` is negative or NaN (also a ValueError);
            ``InvalidNodeError`` (a TypeError) when one is not a number.
    """
    limit = check_seconds(default, "default")
    keep = check_seconds(reserve, "reserve") or 0.0
    now = clock.wall()
    caller: float | None = None
    for name, value in _items(headers):
        raw = value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value
        try:
            if not isinstance(raw, str):
                raise ValueError(f"expected text, got {type(raw).__name__}")
            seconds = parse_header(name, raw, now)
        except ValueError as exc:
            _warn_once(name, value, str(exc))
            continue
        caller = seconds if caller is None else min(caller, seconds)
    if caller is not None:
        limit = caller if limit is None else min(limit, caller)
    if limit is None:
        return None
    return max(0.0, limit - keep)


def deadline_headers_for(seconds: float) -> dict[str, str]:
    """The three deadline headers for a call that may take ``seconds`` (> 0) from now.

    ``budget_from_headers`` on the other side reads back ``seconds`` (less the time the call
    took to get there, within a millisecond of rounding).
    """
    ns = max(1, round(seconds * 1e9))
    grpc = ""
    for unit, size in _GRPC_OUT:
        n = -(-ns // size)  # rounded up
        if n <= _GRPC_MAX:
            grpc = f"{n}{unit}"
            break
    else:
        grpc = f"{_GRPC_MAX}H"
    envoy = -(-ns // 1_000_000)
    epoch_ms = (clock.wall_ns() + ns) // 1_000_000
    return {GRPC: grpc, ENVOY: str(envoy), DEADLINE: str(epoch_ms)}


def check_seconds(value: object, what: str, *, positive: bool = False) -> float | None:
    """A duration argument: None, or a real number of seconds >= 0 (> 0 with ``positive``).

    Raises:
        InvalidNodeError: not a number (also a TypeError).
        FlowDefinitionError: negative, zero when ``positive``, or NaN (also a ValueError).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidNodeError(f"{what} must be a number of seconds or None, "
                               f"got {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0.0 or (positive and seconds == 0.0):
        bound = "positive" if positive else "non-negative"
        raise FlowDefinitionError(f"{what} must be {bound}, got {value!r}")
    return seconds
