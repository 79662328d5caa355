"""``HTTP``: one request described by ``inputParameters.http_request``, made with urllib.

Fields read (Conductor's ``http_request``): ``uri``, ``method`` (default GET), ``headers``,
``body`` (an object or list is sent as JSON), ``contentType``, ``accept``,
``connectionTimeOut`` and ``readTimeOut`` (milliseconds). Newer definitions put the same fields
directly in ``inputParameters``; both forms are read. As Conductor does, every request carries
``Accept`` and ``Content-Type`` (from ``accept`` and ``contentType``, both ``application/json``
by default) unless ``headers`` names them, in any letter case. The output is Conductor's
``{"response": {"statusCode", "reasonPhrase", "headers", "body"}}``; a JSON body is parsed and
an empty one (a 204, say) is ``None``, Conductor's ``null``. A status outside 2xx fails the task
with that output, as in Conductor.

Boundaries ([`Limits`][taskflow.declare.conductor.boundaries.Limits]): the host is checked against
``allow_hosts`` before any connection and again for every redirect; a body longer than
``max_response_bytes`` fails the task; the timeouts never exceed the run's remaining budget.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from taskflow.declare.conductor.boundaries import Limits, check_url
from taskflow.declare.conductor.compiling import CompileContext, Site, Step
from taskflow.declare.conductor.tasks.base import TaskFailedError, TaskMixin
from taskflow.model.context import TaskContext
from taskflow.model.node import SchedulingNode

__all__ = ["HttpTask", "ResponseTooLargeError", "compile_http"]

_DEFAULT_TIMEOUT = 30.0  # seconds, when the definition and the budget give none


class ResponseTooLargeError(TaskFailedError):
    """A response body longer than ``max_response_bytes``."""


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host (checked before connecting to it)."""

    def __init__(self, task: str, limits: Limits) -> None:
        self.task = task
        self.limits = limits

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        try:
            check_url(self.task, newurl, self.limits, redirect=True)
        except Exception:
            fp.close()  # urllib closes the redirect response only when it follows it
            raise
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _seconds(value: Any) -> float | None:
    """A Conductor timeout in milliseconds, as seconds (None: not given or not positive)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value) / 1000.0


def _body(raw: bytes, charset: str | None) -> Any:
    if not raw:
        return None
    text = raw.decode(charset or "utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _headers(spec: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers: the definition's, then ``Accept`` and ``Content-Type`` from
    ``accept`` and ``contentType`` (``application/json`` by default, as Conductor's
    ``HttpTask.Input``) where the definition's headers do not name them in any letter case."""
    headers = {str(k): str(v) for k, v in (spec.get("headers") or {}).items()}
    named = {k.lower() for k in headers}
    for name, field in (("Accept", "accept"), ("Content-Type", "contentType")):
        if name.lower() not in named:
            headers[name] = str(spec.get(field) or "application/json")
    return headers


class HttpTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``HTTP``: see the module docstring."""

    draw_as = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        spec = task_input.get("http_request")
        if not isinstance(spec, Mapping):
            spec = task_input
        uri = spec.get("uri") or spec.get("url")
        if not isinstance(uri, str) or not uri:
            raise ValueError(f"http task {self.ref!r}: http_request.uri is missing")
        limits = self.limits
        check_url(self.ref, uri, limits)
        method = str(spec.get("method") or "GET").upper()
        headers = _headers(spec)
        body = spec.get("body")
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode() if isinstance(body, (dict, list)) else str(body).encode()
        remaining = ctx.remaining()
        cap = remaining if not math.isinf(remaining) else _DEFAULT_TIMEOUT
        # urllib has one timeout, for the connection and for each read: the larger of the two
        # the definition gives (none given: the budget), never more than the budget
        given = [t for t in (_seconds(spec.get("connectionTimeOut")),
                             _seconds(spec.get("readTimeOut"))) if t is not None]
        timeout = min(max(given), cap) if given else cap
        if timeout <= 0:
            raise TimeoutError(f"http task {self.ref!r}: no time left in the run's budget")
        request = urllib.request.Request(uri, data=data, headers=headers, method=method)
        # no proxies from the environment: the request goes to the host that was checked
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             _CheckedRedirects(self.ref, limits))
        try:
            response = opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                output = self._output(exc.code, exc.reason, exc.headers, exc.fp, limits)
            raise TaskFailedError(
                f"http task {self.ref!r}: {method} {uri} answered {exc.code} {exc.reason}",
                output) from None
        with response:
            return self._output(response.status, response.reason, response.headers, response,
                                limits)

    def _output(self, status: int, reason: str, headers: Any, stream: Any,
                limits: Limits) -> dict[str, Any]:
        cap = limits.max_response_bytes
        raw = stream.read(cap + 1) if stream is not None else b""
        if len(raw) > cap:
            raise ResponseTooLargeError(
                f"http task {self.ref!r}: response body larger than max_response_bytes={cap}",
                {"response": {"statusCode": status, "reasonPhrase": reason}})
        header_map: dict[str, list[str]] = {}
        if headers is not None:
            for key, value in headers.items():
                header_map.setdefault(key, []).append(value)
        charset = headers.get_content_charset() if headers is not None else None
        return {"response": {"statusCode": status, "reasonPhrase": reason,
                             "headers": header_map, "body": _body(raw, charset)}}


def compile_http(ctx: CompileContext, site: Site) -> Step:
    """``HTTP``: an ``http_request`` (or the inputParameters themselves) with a uri."""
    params = ctx.params(site)
    spec = params.get("http_request", params)
    if not isinstance(spec, Mapping) or not (spec.get("uri") or spec.get("url")):
        raise ctx.fail(f"http {site.label} has no inputParameters.http_request.uri")
    return ctx.single(site, ctx.new_node(HttpTask, site))
