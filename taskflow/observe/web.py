"""A small read-only web view of runs, statistics and pools: a pure WSGI app.

``make_app(stats=..., monitor=...)`` serves, relative to where it is mounted (``SCRIPT_NAME``
is respected, so it works under a prefix: werkzeug's ``DispatcherMiddleware`` beside a Flask app
or Django's ``get_wsgi_application()``, or any WSGI server):

* ``/``: recent and slowest runs (links to their pages), per-node statistics, pool metrics;
* ``/runs/<flow_id>``: one kept run as the ``taskflow.observe.html`` page;
* ``/metrics``: the statistics and the pools in the Prometheus text format;
* ``/stats.json``: ``stats.snapshot()`` as JSON;
* ``/now``: what is running now (the runs in progress with their nodes, the abandoned attempts
  still holding a thread with their stacks), reloaded by the browser every few seconds;
* ``/now.json``: the same as JSON (``taskflow.observe.nowpage``).

It shows what one process recorded: ``stats`` (``taskflow.stats.STATS`` by default) records
nothing until ``enable()`` is called, which the page says, and under a server with several worker
processes each worker shows its own runs. A ``stats`` that is not a ``FlowStats`` (the module
``taskflow.stats`` itself) is refused when the app is made.

What it shows is safe to show by default: every name and message is escaped; node results only
with ``show_values=True``; context entries only with ``show_context=True``. It answers only
``GET`` and ``HEAD`` (``405`` with an ``Allow`` header otherwise), sets a Content-Security-Policy
that forbids scripts, and changes nothing. Put it behind the application's own authentication:
error messages and timings are still internal information.
"""

from __future__ import annotations

import html
import os
import time
import types
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from taskflow import clock
from taskflow.errors import InvalidArgumentError
from taskflow.observe.html import render_html
from taskflow.observe.nowpage import now_html, now_json
from taskflow.observe.stats import STATS, FlowStats, KeptRun

if TYPE_CHECKING:
    from taskflow.observe.monitor import PoolMonitor
    from taskflow.observe.snapshots import PoolSnapshot

__all__ = ["make_app"]

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:24px;color:#1b1b1b;background:#fff}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;font-size:13px;margin-bottom:8px}
th,td{border-bottom:1px solid #e5e5e5;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.note{color:#777;font-size:12px}.bad{color:#c62828}
nav a{margin-right:12px}table.pool th{background:none;white-space:nowrap}
summary{cursor:pointer;color:#555;font-size:12px;margin:4px 0}
"""
_HEADERS = [
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]
_ALLOWED = "GET, HEAD"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _text(path: str) -> str:
    """A PATH_INFO segment as text: the server has %-decoded it into latin-1 (PEP 3333)."""
    try:
        return path.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return path


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


class _App:
    """The WSGI callable (see [`make_app`][taskflow.observe.web.make_app])."""

    def __init__(self, stats: FlowStats, monitors: Sequence[PoolMonitor], show_values: bool,
                 show_context: bool, title: str) -> None:
        self.stats = stats
        self.monitors = monitors
        self.show_values = show_values
        self.show_context = show_context
        self.title = title

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        if method not in ("GET", "HEAD"):
            return self._send(start_response, "405 Method Not Allowed",
                              b"method not allowed\n", "text/plain; charset=utf-8",
                              head=False, extra=[("Allow", _ALLOWED)])
        base = environ.get("SCRIPT_NAME", "").rstrip("/")
        path = environ.get("PATH_INFO", "") or "/"
        head = method == "HEAD"
        if path == "/":
            return self._send(start_response, "200 OK", self._index(base).encode(),
                              "text/html; charset=utf-8", head)
        if path == "/metrics":
            return self._send(start_response, "200 OK", self._metrics().encode(),
                              "text/plain; version=0.0.4; charset=utf-8", head)
        if path == "/stats.json":
            return self._send(start_response, "200 OK",
                              self.stats.snapshot().model_dump_json().encode(),
                              "application/json", head)
        if path == "/now":
            return self._send(start_response, "200 OK",
                              now_html(base, self.title, _CSS).encode(),
                              "text/html; charset=utf-8", head)
        if path == "/now.json":
            return self._send(start_response, "200 OK", now_json().encode(),
                              "application/json", head)
        if path.startswith("/runs/"):
            kept = self._run(_text(path[len("/runs/"):]))
            if kept is not None:
                page = render_html(kept.result, flow=kept.flow, show_values=self.show_values,
                                   show_context=self.show_context)
                return self._send(start_response, "200 OK", page.encode(),
                                  "text/html; charset=utf-8", head)
        return self._send(start_response, "404 Not Found", b"not found\n",
                          "text/plain; charset=utf-8", head)

    @staticmethod
    def _send(start_response: StartResponse, status: str, body: bytes, content_type: str,
              head: bool, extra: list[tuple[str, str]] | None = None) -> list[bytes]:
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))),
                   *_HEADERS, *(extra or [])]
        start_response(status, headers)
        return [] if head else [body]

    def _run(self, flow_id: str) -> KeptRun | None:
        runs = self.stats.runs
        return None if runs is None else runs.get(flow_id)

    def _metrics(self) -> str:
        from taskflow.observe.prometheus import render_prometheus

        text = self.stats.to_prometheus()
        snaps = [s for s in (m.latest() for m in self.monitors) if s is not None]
        return text + render_prometheus(snaps)

    # -- the index page ----------------------------------------------------------------------

    def _index(self, base: str) -> str:
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(self.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(self.title)}</h1>",
            (f'<nav><a href="{_e(base)}/now">running now</a>'
            f'<a href="{_e(base)}/metrics">Prometheus metrics</a>'
            f'<a href="{_e(base)}/stats.json">statistics as JSON</a></nav>'),
        ]
        parts += self._recording_notes()
        runs = self.stats.runs
        none = ("none yet: no run has ended since recording started" if self.stats.enabled
                else "none: recording is off (see above)")
        if runs is not None:
            parts += ["<h2>Recent runs</h2>", self._runs_table(runs.recent(), base, none),
                      "<h2>Slowest runs</h2>", self._runs_table(runs.slowest(), base, none)]
        parts += ["<h2>Nodes</h2>", self._nodes_table(none)]
        if self.monitors:
            parts.append("<h2>Pools</h2>")
            for monitor in self.monitors:
                parts.append(self._pool_table(monitor.latest()))
        rendered = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock.wall()))
        parts.append(f'<p class="note">rendered {_e(rendered)}</p>')
        parts.append("</body></html>\n")
        return "\n".join(parts)

    def _recording_notes(self) -> list[str]:
        """Whether runs are being recorded (and how to start), and whose runs these are."""
        notes = []
        if not self.stats.enabled:
            how = ("<code>taskflow.stats.enable()</code>" if self.stats is STATS
                   else "<code>enable()</code> on the <code>FlowStats</code> given to "
                   "<code>make_app</code>")
            notes.append(f'<p class="bad">Recording is off: runs are recorded only once {how} '
                         "has been called (once, at start-up; it costs about 1 \u00b5s per "
                         "node). Runs recorded by hand with <code>record_run</code> still "
                         "show.</p>")
        notes.append(f'<p class="note">Runs of this process only (pid {os.getpid()}): under a '
                     "server with several worker processes (gunicorn, uWSGI) each worker "
                     "records and shows its own runs, and each request lands on one of "
                     "them.</p>")
        return notes

    @staticmethod
    def _runs_table(kept: list[KeptRun], base: str, none: str) -> str:
        if not kept:
            return f'<p class="note">{_e(none)}</p>'
        rows = []
        for k in kept:
            href = f"{base}/runs/{quote(k.flow_id, safe='')}"
            when = time.strftime("%H:%M:%S", time.localtime(k.finished_at))
            cls = "" if k.status.startswith("COMPLETED") else ' class="bad"'
            rows.append(
                f'<tr><td><a href="{_e(href)}">{_e(k.flow_id)}</a></td><td>{_e(k.flow)}</td>'
                f"<td{cls}>{_e(k.status)}</td><td class=num>{_ms(k.elapsed)}</td>"
                f"<td class=num>{_e(when)}</td></tr>"
            )
        return ("<table><thead><tr><th>run</th><th>flow</th><th>status</th>"
                "<th>elapsed ms</th><th>finished</th></tr></thead><tbody>"
                + "".join(rows) + "</tbody></table>")

    def _nodes_table(self, none: str) -> str:
        snap = self.stats.snapshot()
        if not snap.flows:
            return f'<p class="note">{_e(none)}</p>'
        rows = []
        for flow in snap.flows:
            el = flow.elapsed
            rows.append(
                f"<tr><th colspan=10>{_e(flow.flow)}: {flow.runs} runs"
                + (f", elapsed p50 {_ms(el.p50)} / p90 {_ms(el.p90)} / p99 {_ms(el.p99)} ms"
                   if el is not None else "")
                + f" ({_e(', '.join(f'{k} {v}' for k, v in sorted(flow.by_status.items())))})"
                "</th></tr>"
            )
            for n in flow.nodes:
                d, w = n.duration, n.queue_wait
                counts = ", ".join(f"{k} {v}" for k, v in sorted(n.counts.items()))
                rows.append(
                    f"<tr><td>{_e(n.node)}</td><td>{_e(counts)}</td>"
                    f"<td class=num>{_ms(d.p50 if d else None)}</td>"
                    f"<td class=num>{_ms(d.p90 if d else None)}</td>"
                    f"<td class=num>{_ms(d.p99 if d else None)}</td>"
                    f"<td class=num>{_ms(w.p50 if w else None)}</td>"
                    f"<td class=num>{_ms(w.p99 if w else None)}</td>"
                    f"<td class=num>{n.critical_share * 100:.0f}%</td></tr>"
                )
        return ("<table><thead><tr><th>node</th><th>outcomes</th><th>p50 ms</th><th>p90 ms</th>"
                "<th>p99 ms</th><th>wait p50 ms</th><th>wait p99 ms</th>"
                "<th>on critical path</th></tr></thead><tbody>" + "".join(rows)
                + f"</tbody></table><p class=note>percentiles over the last {snap.window} runs "
                "of each node</p>")

    @staticmethod
    def _pool_table(snap: PoolSnapshot | None) -> str:
        """One pool: its alarms, then its figures grouped, those that matter under load first
        (how busy, how much queues and waits, what was refused or abandoned), and every field
        behind a ``<details>``."""
        if snap is None:
            return '<p class="note">no sample yet</p>'
        m = snap.pool
        title = _e(snap.pool_name)
        if m is not None:
            state = ("terminated" if m.is_terminated else "shutting down" if m.is_shutdown
                     else "running")
            title += f' <span class="note">{_e(m.executor_type)}, {state}</span>'
        alarms = "".join(f"<li class=bad>{_e(a.message)}</li>" for a in snap.alarms)
        groups = _pool_groups(snap)
        body = "".join(
            f"<tr><th>{_e(group)}</th><td>"
            + " \u00b7 ".join(f'<span class="note">{_e(k)}</span> '
                               + (f'<span class="bad">{_e(v)}</span>' if bad else _e(v))
                               for k, v, bad in items)
            + "</td></tr>" for group, items in groups)
        return (f"<h3>{title}</h3>" + (f"<ul>{alarms}</ul>" if alarms else "")
                + f'<table class="pool"><tbody>{body}</tbody></table>'
                + _all_fields(snap))


# one figure of a pool: label, value as text, whether it is bad news
_Figure = tuple[str, str, bool]


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f} %"


def _pcts(p: Any) -> str | None:
    return None if p is None else f"{_ms(p.p50)} / {_ms(p.p90)} / {_ms(p.p99)} ms"


def _mb(n: int | None) -> str | None:
    return None if n is None else f"{n / 1e6:.1f} MB"


def _figures(*items: tuple[str, object, bool]) -> list[_Figure]:
    return [(k, str(v), bad) for k, v, bad in items if v is not None]


def _pool_groups(snap: PoolSnapshot) -> list[tuple[str, list[_Figure]]]:
    """The figures of one sample, grouped, most telling first; empty groups left out."""
    m, proc = snap.pool, snap.process
    groups: list[tuple[str, list[_Figure]]] = []
    if m is not None:
        busy = (None if m.active_count is None else f"{m.active_count} of {m.max_size}"
                if m.max_size is not None else str(m.active_count))
        groups += [
            ("load", _figures(("busy threads", busy, False),
                              ("liveness", _pct(m.liveness_pct), False),
                              ("threads", m.pool_size, False), ("core", m.core_size, False),
                              ("largest", m.largest_pool_size, False),
                              ("peak load", _pct(m.peak_load_pct), False))),
            ("queue", _figures(
                ("queued", m.queue_size, False),
                ("capacity", "unbounded" if m.queue_capacity is None else m.queue_capacity,
                 False),
                ("usage", _pct(m.queue_usage_pct), False),
                ("wait p50/p90/p99", _pcts(m.queue_wait_s), False))),
            ("refused and abandoned", _figures(
                ("rejected", m.rejected_count, m.rejected_count > 0),
                ("abandoned, still running", m.abandoned_running, m.abandoned_running > 0),
                ("abandoned in all", m.abandoned_total, False))),
            ("tasks", _figures(
                ("per second", None if snap.tps is None else f"{snap.tps:.1f}", False),
                ("submitted", m.task_count, False), ("completed", m.completed_task_count, False),
                ("failed", m.failed_task_count, False),
                ("cancelled", m.cancelled_task_count, False),
                ("run time p50/p90/p99", _pcts(m.run_time_s), False))),
            ("configuration", _figures(
                ("keep alive", None if m.keep_alive_s is None else f"{m.keep_alive_s:g} s", False),
                ("rejection policy", m.rejection_policy, False))),
        ]
    elif snap.tps is not None:
        groups.append(("tasks", _figures(("per second", f"{snap.tps:.1f}", False))))
    groups.append(("process", _figures(
        ("pid", proc.pid, False),
        ("cpu", None if proc.cpu_percent is None else f"{proc.cpu_percent:.0f} %", False),
        ("rss", _mb(proc.rss_bytes), False), ("threads", proc.num_threads, False),
        ("open files", proc.num_fds, False),
        ("context switches (involuntary)", proc.ctx_switches_involuntary, False),
        ("pool threads' cpu", None if snap.worker_cpu_s is None else f"{snap.worker_cpu_s:.2f} s",
         False))))
    return [(name, items) for name, items in groups if items]


def _all_fields(snap: PoolSnapshot) -> str:
    """Every field of the sample, as ``pool.metrics()`` and psutil give them, folded away."""
    figures: list[tuple[str, object]] = []
    if snap.pool is not None:
        for key, value in snap.pool.model_dump().items():
            if isinstance(value, dict):
                if {"p50", "p90", "p99"} <= value.keys():
                    figures.append((f"{key} p50/p90/p99 ms", " / ".join(
                        _ms(value[q]) for q in ("p50", "p90", "p99"))))
            elif value is not None:
                figures.append((key, value))
    for key, value in snap.process.model_dump().items():
        if value is not None:
            figures.append((f"process {key}", value))
    body = "".join(f"<tr><td>{_e(k)}</td><td class=num>{_e(v)}</td></tr>" for k, v in figures)
    return (f"<details><summary>all {len(figures)} fields</summary><table><tbody>{body}"
            "</tbody></table></details>")


def make_app(
    stats: FlowStats | None = None,
    monitor: PoolMonitor | Sequence[PoolMonitor] | None = None,
    *,
    show_values: bool = False,
    show_context: bool = False,
    title: str = "taskflow",
) -> WSGIApp:
    """A read-only WSGI app showing runs, per-node statistics and pool metrics, and at
    ``/now`` (``/now.json``) what is running now: the runs in progress and the abandoned
    attempts still holding a thread (``taskflow.observe.inflight()``, ``abandoned()``).

    It shows what this process recorded: under a server with several worker processes
    (gunicorn's ``--workers``, uWSGI's ``processes``) each worker records and shows only its
    own runs, and a request lands on one worker. Nothing is recorded until
    ``taskflow.stats.enable()`` (or ``stats.enable()`` on the ``FlowStats`` given) is called;
    the page says so while recording is off.

    Args:
        stats: Where runs are recorded: a [`FlowStats`][taskflow.observe.stats.FlowStats]
            (default: the process-wide ``taskflow.stats.STATS``). Run pages need ``stats.runs``
            (a [`RunLog`][taskflow.observe.stats.RunLog]).
        monitor: One ``PoolMonitor`` or several; the page shows each one's ``latest()``.
        show_values: Show node results on run pages (they may carry user data).
        show_context: Show context entries on run pages (they often carry the request).
        title: The index page's heading.

    Returns:
        A WSGI application. Mount it anywhere; links are built from ``SCRIPT_NAME``.

    Raises:
        InvalidArgumentError: ``stats`` is not a ``FlowStats`` (the module ``taskflow.stats``
            is named, with what to pass instead), a monitor has no ``latest()``, or ``title``
            is not a string (also a ``TypeError``).
    """
    if monitor is None:
        monitors: Sequence[PoolMonitor] = ()
    elif isinstance(monitor, Sequence) and not isinstance(monitor, (str, bytes)):
        monitors = tuple(monitor)
    else:
        monitors = (monitor,)
    for m in monitors:
        if not callable(getattr(m, "latest", None)):
            raise InvalidArgumentError(
                f"monitor must be a taskflow.PoolMonitor or a sequence of them, got {_kind(m)}")
    if not isinstance(title, str):
        raise InvalidArgumentError(f"title must be a str, got {_kind(title)}")
    return _App(_check_stats(stats), monitors, bool(show_values), bool(show_context), title)


def _kind(value: object) -> str:
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}"
    return f"{type(value).__name__} {value!r}"[:120]


def _check_stats(stats: object) -> FlowStats:
    """``make_app``'s ``stats``, or the culprit named with what to pass instead."""
    if stats is None:
        return STATS
    if isinstance(stats, FlowStats):
        return stats
    if isinstance(stats, types.ModuleType) and isinstance(getattr(stats, "STATS", None),
                                                          FlowStats):
        name = "taskflow.stats" if stats.STATS is STATS else stats.__name__
        raise InvalidArgumentError(
            f"stats must be a FlowStats, got the module {name}; pass its process-wide "
            f"instance, stats={name}.STATS, or leave stats out (that is the default)")
    raise InvalidArgumentError(
        f"stats must be a taskflow.observe.stats.FlowStats or None, got {_kind(stats)}")
