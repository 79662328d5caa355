"""What a Conductor definition may make this process do (its trust boundaries).

A definition is data that may come from a UI or another team's repository, yet HTTP tasks,
JavaScript, jq and sub-workflows run in the application's process. [`Limits`][taskflow.declare.conductor.boundaries.Limits] holds the
boundaries ``load`` was given; every system task reads them from its node, so a definition can
never widen them:

* HTTP tasks reach only ``allow_hosts`` (``None``: any host), checked before connecting and again
  for every redirect; responses larger than ``max_response_bytes`` fail the task.
* JavaScript (INLINE, LAMBDA, SWITCH/DECISION/DO_WHILE conditions) runs in a fresh V8 isolate per
  evaluation with no host access (no files, network, or Python objects), at most
  ``js_time_limit`` seconds and ``js_memory_limit`` bytes.
* jq runs in a separate worker process, killed after ``jq_time_limit`` seconds (the jq binding
  holds the GIL, so a runaway program in-process would stop every thread), with its address
  space capped at ``jq_memory_limit`` bytes.
* A DO_WHILE runs at most ``max_loop_iterations`` iterations. A SUB_WORKFLOW that names itself
  is refused at load; one whose name is an expression is refused at run time when it would run
  a workflow of its chain again with the same input, or nest deeper than
  ``max_workflow_depth`` workflows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from taskflow.errors import TaskflowError

__all__ = ["HostNotAllowedError", "Limits", "check_url"]

#: An EVENT task's sink: ``fn(sink, payload)``; its return value (a mapping or None) is merged
#: into the task's output.
EventSink = Callable[[str, dict[str, Any]], Any]


class HostNotAllowedError(TaskflowError, PermissionError):
    """An HTTP task (or a redirect it received) named a host outside ``allow_hosts``.

    Attributes:
        url: the URL refused.
        host: its host (``host`` or ``host:port``).
    """

    def __init__(self, task: str, url: str, host: str, allowed: Sequence[str],
                 redirect: bool = False) -> None:
        self.url = url
        self.host = host
        what = "redirect to" if redirect else "request to"
        super().__init__(
            f"http task {task!r}: {what} host {host!r} refused; allow_hosts: "
            + (", ".join(repr(h) for h in allowed) or "none")
        )


@dataclass(frozen=True)
class Limits:
    """The trust boundaries of one loaded workflow (see the module docstring).

    Durations are seconds; a task's limit is also capped by what remains of the run's budget.
    """

    allow_hosts: tuple[str, ...] | None = None
    max_response_bytes: int = 10 * 1024 * 1024
    js_time_limit: float = 5.0
    js_memory_limit: int = 64 * 1024 * 1024
    jq_time_limit: float = 5.0
    jq_memory_limit: int = 1024 * 1024 * 1024
    max_loop_iterations: int = 1000
    max_workflow_depth: int = 32
    event_sink: EventSink | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("js_time_limit", "jq_time_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or math.isnan(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("max_response_bytes", "js_memory_limit", "jq_memory_limit",
                     "max_loop_iterations", "max_workflow_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.allow_hosts is not None:
            if isinstance(self.allow_hosts, str):
                raise TypeError("allow_hosts must be a sequence of host names, not one string")
            hosts = tuple(self.allow_hosts)
            for h in hosts:
                if not isinstance(h, str) or not h or "/" in h:
                    raise ValueError(f"allow_hosts entries must be host or host:port, got {h!r}")
            object.__setattr__(self, "allow_hosts", tuple(h.lower() for h in hosts))
        if self.event_sink is not None and not callable(self.event_sink):
            raise TypeError(f"event_sink must be callable, got {type(self.event_sink).__name__}")


def check_url(task: str, url: str, limits: Limits, *, redirect: bool = False) -> None:
    """Refuse ``url`` unless its scheme is http(s) and its host is allowed.

    Raises:
        HostNotAllowedError: the host (or ``host:port``) is not in ``limits.allow_hosts``.
        ValueError: not an http or https URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"http task {task!r}: {url!r} is not an http or https URL")
    allowed = limits.allow_hosts
    if allowed is None:
        return
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if host in allowed or f"{host}:{port}" in allowed:
        return
    raise HostNotAllowedError(task, url, f"{host}:{port}", allowed, redirect)
