"""The web view's ``/now`` and ``/now.json``: what is running now in this process, read from
``taskflow.observe.now`` (``inflight()`` and ``abandoned(with_stacks=True)``).

``/now`` is readable at a glance: a count of runs in progress and of abandoned attempts, one
row per run in progress (flow, id, age, budget left, priority, and its nodes as cells coloured
by state, each saying what it waits on or which thread runs it), then the abandoned attempts
(node, flow, run, how long it has run, how far past its deadline, its thread, where it is
stuck and the innermost frames of its stack). The page reloads itself every ``REFRESH_S``
seconds with ``<meta http-equiv="refresh">``: no script, so the web view's
Content-Security-Policy (no scripts at all) stays as it is.

``/now.json`` is the same reading as JSON: ``{"pid", "runs": [...], "abandoned": [...]}``, one
object per ``RunNow`` (its ``nodes`` a list of ``NodeNow`` objects) and per
``AbandonedAttempt`` (with ``stack``, outermost frame first, and ``where``, its
``frame()``); a budget of ``inf`` (none) is ``null``.

What is shown is what ``taskflow.observe.now`` shows: names, states, times, threads and code
locations, never a node's value or the run's context; every name is escaped. The reading takes
no run's lock, and the formatting works on the copies it returned.
"""

from __future__ import annotations

import html
import json
import math
import os
from typing import Any

from taskflow.observe import now

__all__ = ["MAX_CELLS", "MAX_RUNS", "REFRESH_S", "TOP_FRAMES", "now_html", "now_json"]

REFRESH_S = 5
"""Seconds between two reloads of ``/now`` by the browser."""
MAX_RUNS = 500
"""Runs shown on ``/now`` at most (the oldest; ``/now.json`` has them all)."""
MAX_CELLS = 120
"""Nodes shown per run on ``/now`` at most (those not ended first)."""
TOP_FRAMES = 6
"""Innermost frames of an abandoned attempt's stack shown unfolded (the rest folded away)."""

# background, border of a node cell by state (the run page's colours where they mean the same)
_COLOURS = {
    "RUNNING": ("#e3f2fd", "#1565c0"),
    "QUEUED": ("#fff3e0", "#ef6c00"),
    "PARKED": ("#fff9c4", "#f9a825"),
    "BACKOFF": ("#fce4ec", "#ad1457"),
    "WAITING": ("#ffffff", "#9e9e9e"),
    "TERMINAL": ("#eeeeee", "#bdbdbd"),
    "SETTLED": ("#eeeeee", "#bdbdbd"),
}
_ENDED = ("TERMINAL", "SETTLED")
_CSS = "".join(
    f".n.{state}{{background:{bg};border-color:{border}}}"
    for state, (bg, border) in _COLOURS.items()) + """
.n{display:inline-block;border:1px solid;border-left-width:4px;border-radius:3px;
padding:1px 6px;margin:0 4px 4px 0;font-size:12px;vertical-align:top}
.n.TERMINAL,.n.SETTLED{color:#757575}.n .d{display:block;color:#555;font-size:11px}
.glance{font-size:16px;margin:8px 0}.glance b{font-size:20px}
pre{margin:0;font-size:11px;white-space:pre-wrap;color:#333}
td.where{font-family:monospace;font-size:12px}tr.gone td{border-bottom:none}
tr.frames td{border-bottom:1px solid #bdbdbd}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _s(seconds: float | None) -> str:
    """Seconds for a cell: 3 decimals, ``-`` when unknown, ``none`` for an infinite budget."""
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return "none"
    return f"{seconds:.3f}"


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) or math.isnan(value) else value


def _reading() -> tuple[list[now.RunNow], list[tuple[now.AbandonedAttempt, str | None]]]:
    """One reading: the runs in progress, the abandoned attempts with where each is now."""
    runs = now.inflight()
    gone = [(a, a.frame()) for a in now.abandoned(with_stacks=True)]
    return runs, gone


def now_json() -> str:
    """``/now.json``'s body."""
    runs, gone = _reading()
    out: dict[str, Any] = {"pid": os.getpid(), "runs": [], "abandoned": []}
    for r in runs:
        d = r._asdict()
        d["budget_left_s"] = _finite(r.budget_left_s)
        d["nodes"] = [n._asdict() for n in r.nodes]
        out["runs"].append(d)
    for a, where in gone:
        d = a._asdict()
        d["stack"] = list(a.stack or ())
        d["where"] = where
        out["abandoned"].append(d)
    return json.dumps(out, allow_nan=False)


def _cell(n: now.NodeNow) -> str:
    if n.state in _ENDED:
        return f'<span class="n {n.state}" title="{_e(n.state)}">{_e(n.name)}</span>'
    return (f'<span class="n {n.state}">{_e(n.name)}<span class="d">{_e(n.describe())}</span>'
            "</span>")


def _cells(nodes: tuple[now.NodeNow, ...]) -> str:
    """The nodes not ended first (in the plan's order), then the ended ones, at most
    ``MAX_CELLS``."""
    ordered = ([n for n in nodes if n.state not in _ENDED]
               + [n for n in nodes if n.state in _ENDED])
    shown = "".join(_cell(n) for n in ordered[:MAX_CELLS])
    if len(ordered) > MAX_CELLS:
        shown += f'<span class="note">and {len(ordered) - MAX_CELLS} more</span>'
    return shown


def _runs_table(runs: list[now.RunNow]) -> str:
    if not runs:
        return '<p class="note">no run in progress in this process</p>'
    rows = []
    for r in runs[:MAX_RUNS]:
        budget = r.budget_left_s
        late = ' class="num bad"' if budget < 0 or r.closed else " class=num"
        rows.append(
            f"<tr><td>{_e(r.flow or '?')}</td><td><code>{_e(r.run_id)}</code>"
            + (' <span class="bad">closed</span>' if r.closed else "")
            + f"</td><td class=num>{_s(r.age_s)}</td><td{late}>{_s(budget)}</td>"
            f"<td>{_e(r.priority)}</td><td>{_cells(r.nodes)}</td></tr>")
    more = (f'<p class="note">and {len(runs) - MAX_RUNS} more runs (all of them are in '
            "now.json)</p>" if len(runs) > MAX_RUNS else "")
    return ("<table><thead><tr><th>flow</th><th>run</th><th>age s</th><th>budget left s</th>"
            "<th>priority</th><th>nodes</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>" + more)


def _stack(stack: tuple[str, ...] | None) -> str:
    if not stack:
        return '<span class="note">the thread has returned</span>'
    top = "".join(stack[-TOP_FRAMES:])
    shown = f"<pre>{_e(top.rstrip())}</pre>"
    if len(stack) > TOP_FRAMES:
        rest = "".join(stack[:-TOP_FRAMES])
        shown = (f"<details><summary>{len(stack) - TOP_FRAMES} outer frames</summary>"
                 f"<pre>{_e(rest.rstrip())}</pre></details>" + shown)
    return shown


def _gone_table(gone: list[tuple[now.AbandonedAttempt, str | None]]) -> str:
    if not gone:
        return '<p class="note">none: every attempt given up has returned</p>'
    rows = []
    for a, where in gone:
        rows.append(
            f'<tr class="gone"><td>{_e(a.node)}</td><td>{_e(a.flow or "?")}</td>'
            f"<td><code>{_e(a.run_id)}</code></td><td class=num>{a.attempt}</td><td class=num>{_s(a.running_s)}</td>"
            f'<td class="num bad">{_s(a.past_deadline_s)}</td><td>{_e(a.thread)}</td>'
            f'<td class="where">{_e(where or "?")}</td></tr>'
            f'<tr class="frames"><td></td><td colspan=7>{_stack(a.stack)}</td></tr>')
    return ("<table><thead><tr><th>node</th><th>flow</th><th>run</th><th>attempt</th>"
            "<th>running s</th><th>past its deadline s</th><th>thread</th><th>stuck in "
            '<span class="note">(below: the innermost frames, the last is where it is)</span>'
            "</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def now_html(base: str, title: str, style: str) -> str:
    """``/now``'s page; ``base`` the app's ``SCRIPT_NAME``, ``style`` the web view's CSS."""
    runs, gone = _reading()
    bad = ' class="bad"' if gone else ""
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        f"<title>{_e(title)}: running now</title><style>{style}{_CSS}</style></head><body>",
        f"<h1>{_e(title)}: what is running now</h1>",
        (f'<nav><a href="{_e(base)}/">runs and statistics</a>'
         f'<a href="{_e(base)}/now.json">this page as JSON</a>'
         f'<a href="{_e(base)}/metrics">Prometheus metrics</a></nav>'),
        (f'<p class="glance"><b>{len(runs)}</b> run(s) in progress \u00b7 '
         f"<b{bad}>{len(gone)}</b> abandoned attempt(s) still holding a thread</p>"),
        (f'<p class="note">Process pid {os.getpid()} only (each worker of a server shows its '
         f"own); reloaded every {REFRESH_S} s. A reading takes no lock: it may be a few "
         "microseconds stale. Names, states, times, threads and code only: no node's value, "
         "no context.</p>"),
        "<h2>Runs in progress</h2>",
        '<p class="note">' + " ".join(
            f'<span class="n {s}">{s.lower()}</span>' for s in _COLOURS if s != "SETTLED")
        + "</p>",
        _runs_table(runs),
        "<h2>Abandoned attempts still running</h2>",
        ('<p class="note">Attempts a run gave up on (a timeout, its deadline, a cancel) whose '
         "thread is still in the task: a Python thread cannot be stopped. Each leaves this "
         "list when its thread returns.</p>"),
        _gone_table(gone),
        "</body></html>\n",
    ])
