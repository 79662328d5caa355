"""One run as one self-contained HTML page (``FlowResult.to_html``).

The page needs nothing but a browser: no scripts, no fonts, no style sheets or images from
elsewhere (a Content-Security-Policy meta tag forbids them, so it opens offline and a string that
escaped into markup still could not run). It shows

* a header: flow id, status, elapsed time, budget, counts by state, and (when something failed
  or degraded) one line saying what failed and why, above a short table of the nodes that
  failed themselves with their errors, so both are seen without scrolling;
* the graph as inline SVG, nodes coloured by state, laid out in layers: a node's layer is the
  longest path from a root to it, and within a layer nodes are ordered by the mean position of
  their fathers (one barycentre pass, enough for the DAGs a request fans out to);
* the Gantt chart as inline SVG: per node a pale bar for the queue wait and a bar for the run,
  the run's critical path outlined;
* a table of every node: state, error (and the error of a hook that raised), attempts, times,
  thread, fathers and (unless ``show_values=False``) result;
* the run's context, only with ``show_context=True``.

A node that never ran because a father it needed failed is shown as "not run: upstream failed"
(pale, dashed) rather than by its state (``EXCEPTION`` or ``TIMEOUT``, its father's kind of
failure), so that it is not mistaken for a node that failed; likewise "not run: budget ran out".
A detached node (``detach=True``, the run did not wait for it) is shown ``DETACHED``, with how
it ended when the page was made ("detached: ended SUCCESS in 12.0 ms", "detached: ended
TIMEOUT: ...") or "detached: still running".

Hovering a node or a bar shows its timings and error (SVG ``<title>``); clicking it jumps to its
row. Every name, value and message comes from user data and is escaped with
``html.escape`` (quotes included) wherever it lands: text, attributes or SVG.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from taskflow.model.result import failure_summary, not_run_reason

if TYPE_CHECKING:
    from taskflow.model.result import FlowResult, WorkResult

__all__ = ["render_html"]

# fill, stroke, text colour by state name (DEGRADED is the resilience issue's state)
_COLOURS = {
    "SUCCESS": ("#d4edda", "#2e7d32", "#1b1b1b"),
    "DEGRADED": ("#e1f5fe", "#0277bd", "#1b1b1b"),
    "EXCEPTION": ("#f8d7da", "#c62828", "#1b1b1b"),
    "TIMEOUT": ("#ffe0b2", "#ef6c00", "#1b1b1b"),
    "CANCELLED": ("#fff9c4", "#f9a825", "#1b1b1b"),
    "SKIPPED": ("#eeeeee", "#9e9e9e", "#757575"),
    "DEFAULT": ("#ffffff", "#9e9e9e", "#1b1b1b"),
    "DETACHED": ("#ede7f6", "#5e35b1", "#1b1b1b"),
    "NOT_RUN": ("#f7f2f2", "#b39c9c", "#616161"),
}
_VALUE_LIMIT = 500  # characters of a result or context value shown
_MESSAGE_LIMIT = 2000  # characters of an error message shown

# graph geometry (pixels)
_BOX_W, _BOX_H, _COL_GAP, _ROW_GAP, _PAD = 168, 40, 56, 14, 12
# Gantt geometry
_LABEL_W, _CHART_W, _BAR_H, _BAR_GAP, _AXIS_H = 190, 760, 18, 6, 24
_CHAR_W = 7.0  # rough width of one character of the 12 px sans-serif font

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:24px;color:#1b1b1b;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.meta{color:#555}.meta b{color:#1b1b1b}
.chip{display:inline-block;padding:1px 8px;border-radius:10px;border:1px solid;margin-right:4px;
font-size:12px}
.scroll{overflow:auto;border:1px solid #ddd;border-radius:4px;padding:4px;max-height:80vh}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
svg a:hover rect{stroke-width:3}
svg .crit{stroke:#111;stroke-width:2}
table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #e5e5e5;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:target{background:#fffbe6}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:48em;font-size:12px}
.note{color:#777;font-size:12px}
.summary{border-left:4px solid #c62828;background:#fdf3f3;padding:6px 10px;margin:8px 0;
max-width:80em}
.summary.degraded{border-color:#0277bd;background:#f1f8fd}
"""

_SEP = " \u00b7 "
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _e(value: object) -> str:
    """Escape for HTML text and double- or single-quoted attributes."""
    return html.escape(str(value), quote=True)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _repr(value: Any, limit: int = _VALUE_LIMIT) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a user __repr__ must not break the page
        text = f"<repr failed: {type(exc).__name__}>"
    return _clip(text, limit)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _fit(text: str, width: float) -> str:
    """``text`` on one line, cut to about ``width`` pixels."""
    flat = " ".join(text.split())
    return _clip(flat, max(3, int(width / _CHAR_W)))


def _error_text(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None:
        text += f"\ncaused by {type(cause).__name__}: {cause}"
    return _clip(text, _MESSAGE_LIMIT)


class _Row:
    """One node of the run, read once through the public API.

    ``state`` is the node's ``ResultState`` name; ``label`` what the page calls it (the state,
    or "not run: ..." for a node that never started because of its fathers or the budget) and
    ``look`` the key of its colours.
    """

    __slots__ = ("critical", "deadline", "error", "fathers", "index", "label", "look", "marks",
                 "name", "state", "wr")

    def __init__(self, index: int, name: str, wr: WorkResult[Any], fathers: list[str]) -> None:
        self.index = index
        self.name = name
        self.wr = wr
        self.state = wr.state.name
        why = not_run_reason(wr)
        self.label = self.state if why is None else f"not run: {why}"
        self.look = self.state if why is None else "NOT_RUN"
        self.fathers = fathers
        self.error = _error_text(wr.exception)
        self.critical = False
        self.marks: tuple[str, ...] = wr.marks  # and what its attempts did with the deadline
        self.deadline: float | None = None  # from the run's start (``deadline=``, a Section)


def _attempt_marks(note: Any) -> tuple[str, ...]:
    """What a node's attempts did with their deadline (``FlowResult.attempt_notes``): the first
    clamped call and how many there were, the ``on_cancel`` callbacks that ran or raised."""
    marks: tuple[str, ...] = ()
    if note.clamps:
        attempt, seconds = note.clamps[0]
        more = f", {note.clamped} calls" if note.clamped > 1 else ""
        marks += (f"clamped to {seconds * 1000:.0f} ms (attempt {attempt}{more})",)
    if note.registered:
        mark = f"on_cancel ran {note.ran} of {note.registered}"
        if note.raised:
            mark += f", {note.raised} raised"
        marks += (mark,)
    return marks


def _rows(result: FlowResult) -> list[_Row]:
    rows = []
    hook_errors = getattr(result, "hook_errors", {})
    notes = getattr(result, "attempt_notes", {})
    deadlines = getattr(result, "deadlines", {})
    for i, (name, node) in enumerate(result.items()):
        fathers = [f.name for f in node.father_handler if f.name in result]
        row = _Row(i, name, node.work_result, fathers)
        due = deadlines.get(name)
        if due is not None:
            section, row.deadline = due
            where = f"section {section} " if section is not None else ""
            row.marks += (f"{where}deadline {row.deadline * 1000:g} ms",)
        note = notes.get(name)
        if note is not None:
            row.marks += _attempt_marks(note)
        if row.state == "DETACHED":
            row.marks += (_detached_mark(result, name),)
        hook = hook_errors.get(name)
        if hook is not None:  # a hook that raised did not change the state: say so anyway
            text = _clip(f"hook {hook.hook} raised {_error_text(hook.exception)}", _MESSAGE_LIMIT)
            row.error = text if row.error is None else f"{row.error}\n{text}"
        rows.append(row)
    return rows


def _detached_mark(result: FlowResult, name: str) -> str:
    """How a detached node ended, as far as known now."""
    detached = getattr(result, "detached", None)
    fut = detached(name) if callable(detached) else None
    if fut is None or not fut.done():
        return "detached: still running"
    wr = fut.result()
    text = f"detached: ended {wr.state.name}"
    if wr.exception is not None:
        return f"{text}: {_clip(_error_text(wr.exception) or '', 200)}"
    return f"{text} in {_ms(wr.duration)}"


def _origin(result: FlowResult, rows: list[_Row]) -> float:
    t0 = getattr(result, "started_at", None)
    if isinstance(t0, (int, float)):
        return float(t0)
    stamps = [t for r in rows for t in (r.wr.queued_at, r.wr.started_at) if t is not None]
    return min(stamps, default=0.0)


def _tooltip(row: _Row, t0: float, show_values: bool) -> str:
    wr = row.wr
    lines = [f"{row.name} \u2014 {row.label}"
             + (f" ({row.state})" if row.label != row.state else "")]

    def rel(t: float | None) -> str:
        return "-" if t is None else f"{(t - t0) * 1000:.1f} ms"

    if wr.queued_at is not None and wr.started_at is not None:
        lines.append(f"queue wait {_ms(wr.started_at - wr.queued_at)}")
    lines.append(f"start {rel(wr.started_at)}, end {rel(wr.finished_at)}, "
                 f"duration {_ms(wr.duration)}")
    if wr.attempts > 1:
        lines.append(f"attempts {wr.attempts}")
    if row.marks:
        lines.append(", ".join(row.marks))
    if wr.thread:
        lines.append(f"thread {wr.thread}")
    if row.error:
        lines.append(row.error)
    if show_values and row.state in ("SUCCESS", "DEGRADED"):
        lines.append(f"result {_repr(wr.result, 200)}")
    return "\n".join(lines)


# -- the graph -----------------------------------------------------------------------------------


def _layers(rows: list[_Row]) -> list[list[_Row]]:
    """Longest-path layering, then one barycentre pass to order each layer."""
    by_name = {r.name: r for r in rows}
    layer: dict[str, int] = {}
    # rows come in the plan's order, which is topological; settle anyway for any order
    pending = list(rows)
    while pending:
        rest = []
        for r in pending:
            if all(f in layer for f in r.fathers):
                layer[r.name] = 1 + max((layer[f] for f in r.fathers), default=-1)
            else:
                rest.append(r)
        if len(rest) == len(pending):  # not a DAG: should not happen for a run; draw flat
            for r in rest:
                layer[r.name] = 0
            break
        pending = rest
    columns: list[list[_Row]] = [[] for _ in range(1 + max(layer.values(), default=0))]
    for r in rows:
        columns[layer[r.name]].append(r)
    position: dict[str, float] = {}
    for col in columns:
        def key(r: _Row) -> tuple[float, int]:
            ps = [position[f] for f in r.fathers if f in position and f in by_name]
            return (sum(ps) / len(ps) if ps else math.inf, r.index)

        col.sort(key=key)
        for p, r in enumerate(col):
            position[r.name] = float(p)
    return columns


def _graph_svg(rows: list[_Row], t0: float, show_values: bool) -> str:
    columns = _layers(rows)
    height_rows = max((len(c) for c in columns), default=1)
    width = _PAD * 2 + len(columns) * _BOX_W + (len(columns) - 1) * _COL_GAP
    height = _PAD * 2 + height_rows * _BOX_H + (height_rows - 1) * _ROW_GAP
    at: dict[str, tuple[float, float]] = {}
    for c, col in enumerate(columns):
        # centre short columns against the tallest one
        offset = (height_rows - len(col)) * (_BOX_H + _ROW_GAP) / 2
        for p, r in enumerate(col):
            at[r.name] = (_PAD + c * (_BOX_W + _COL_GAP), _PAD + offset + p * (_BOX_H + _ROW_GAP))
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="graph of the run">'),
           ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
           'fill="#888"/></marker></defs>')]
    # spread the ends of a node's edges over its side, in the order of the other ends' rows
    outs: dict[str, list[str]] = {r.name: [] for r in rows}
    for r in rows:
        for f in r.fathers:
            outs[f].append(r.name)
    for sons in outs.values():
        sons.sort(key=lambda n: at[n][1])

    def slot(k: int, n: int) -> float:
        return _BOX_H * (k + 1) / (n + 1)

    for r in rows:
        x2, y2 = at[r.name]
        fathers = sorted(r.fathers, key=lambda n: at[n][1])
        for k, f in enumerate(fathers):
            x1, y1 = at[f]
            sx, ex = x1 + _BOX_W, x2
            sy = y1 + slot(outs[f].index(r.name), len(outs[f]))
            ey = y2 + slot(k, len(fathers))
            mid = (sx + ex) / 2
            out.append(f'<path d="M{sx:.1f},{sy:.1f} C{mid:.1f},{sy:.1f} {mid:.1f},{ey:.1f} '
                       f'{ex:.1f},{ey:.1f}" fill="none" stroke="#888" '
                       f'marker-end="url(#arrow)"/>')
    for r in rows:
        x, y = at[r.name]
        fill, stroke, colour = _COLOURS.get(r.look, _COLOURS["DEFAULT"])
        dash = ' stroke-dasharray="4 3"' if r.look in ("SKIPPED", "NOT_RUN") else ""
        label = _fit(r.name, _BOX_W - 12)
        # "not run: ..." in a slightly smaller font, so that it fits the box whole
        small, room = "", float(_BOX_W - 12)
        if r.look == "NOT_RUN":
            small, room = ' style="font-size:11px"', (_BOX_W - 12) * 12 / 11
        out.append(
            f'<a href="#node-{r.index}"><title>{_e(_tooltip(r, t0, show_values))}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{_BOX_W}" height="{_BOX_H}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash}/>'
            f'<text x="{x + _BOX_W / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" '
            f'fill="{colour}" font-weight="600">{_e(label)}</text>'
            f'<text x="{x + _BOX_W / 2:.1f}" y="{y + 31:.1f}" text-anchor="middle" '
            f'fill="{colour}"{small}>{_e(_fit(_box_detail(r), room))}</text></a>'
        )
    out.append("</svg>")
    return "".join(out)


def _box_detail(row: _Row) -> str:
    """A graph box's second line: the state and duration, or the state and the node's marks
    (fallback, hedged N, shared: the duration is in its tooltip and row)."""
    marks = row.wr.marks
    if row.look == "NOT_RUN":
        return row.label
    return f"{row.state}{_SEP}{', '.join(marks) if marks else _ms(row.wr.duration)}"


# -- the Gantt chart -----------------------------------------------------------------------------


def _nice_step(span: float) -> float:
    """A 1-2-5 tick step giving 5 to 10 ticks over ``span`` seconds."""
    raw = span / 8 if span > 0 else 0.001
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * magnitude:
            return float(m * magnitude)
    return float(10 * magnitude)  # pragma: no cover - the loop always returns


def _gantt_svg(rows: list[_Row], t0: float, end: float, show_values: bool) -> str:
    order = sorted(rows, key=lambda r: (r.wr.started_at is None,
                                        r.wr.started_at if r.wr.started_at is not None else 0.0,
                                        r.index))
    span = max(end - t0, 1e-6)
    scale = _CHART_W / span
    # room right of the bars for the marks (fallback, hedged N, shared) when a node has some
    marks_w = max((len(", ".join(r.wr.marks)) * _CHAR_W + 8 for r in rows if r.wr.marks),
                  default=0.0)
    width = _LABEL_W + _CHART_W + _PAD * 2 + math.ceil(marks_w)
    height = _AXIS_H + len(order) * (_BAR_H + _BAR_GAP) + _PAD
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="Gantt chart of the run">')]
    step = _nice_step(span)
    ticks = int(span / step) + 1
    for k in range(ticks + 1):
        t = k * step
        if t > span * 1.0001:
            break
        x = _LABEL_W + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{_AXIS_H - 6}" x2="{x:.1f}" y2="{height - _PAD}" '
                   f'stroke="#eee"/><text x="{x:.1f}" y="{_AXIS_H - 10}" text-anchor="middle" '
                   f'fill="#666">{t * 1000:g} ms</text>')
    for k, r in enumerate(order):
        y = _AXIS_H + k * (_BAR_H + _BAR_GAP)
        wr = r.wr
        fill, stroke, _ = _COLOURS.get(r.look, _COLOURS["DEFAULT"])
        parts = [f'<a href="#node-{r.index}"><title>{_e(_tooltip(r, t0, show_values))}</title>',
                 (f'<text x="{_LABEL_W - 8}" y="{y + _BAR_H - 5}" text-anchor="end">'
                 f'{_e(_fit(r.name, _LABEL_W - 16))}</text>')]
        if wr.queued_at is not None and wr.started_at is not None and wr.started_at > wr.queued_at:
            qx = _LABEL_W + (wr.queued_at - t0) * scale
            qw = (wr.started_at - wr.queued_at) * scale
            parts.append(f'<rect x="{qx:.1f}" y="{y + 5}" width="{max(qw, 1):.1f}" '
                         f'height="{_BAR_H - 10}" fill="#cfd8dc"/>')
        if wr.started_at is not None:
            finish = wr.finished_at if wr.finished_at is not None else end
            bx = _LABEL_W + (wr.started_at - t0) * scale
            bw = max((finish - wr.started_at) * scale, 2.0)
            crit = ' class="crit"' if r.critical else ""
            parts.append(f'<rect{crit} x="{bx:.1f}" y="{y}" width="{bw:.1f}" height="{_BAR_H}" '
                         f'rx="3" fill="{fill}" stroke="{stroke}"/>')
        else:  # never started: a tick where it ended
            mx = _LABEL_W + ((wr.finished_at if wr.finished_at is not None else end) - t0) * scale
            parts.append(f'<path d="M{mx:.1f},{y + 2}l6,{_BAR_H / 2 - 2}l-6,{_BAR_H / 2 - 2}'
                         f'l-6,{-(_BAR_H / 2 - 2)}z" fill="{fill}" stroke="{stroke}"/>')
        if r.deadline is not None and r.deadline <= span:  # where the node had to be done by
            dx = _LABEL_W + r.deadline * scale
            parts.append(f'<line class="deadline" x1="{dx:.1f}" y1="{y - 2}" x2="{dx:.1f}" '
                         f'y2="{y + _BAR_H + 2}" stroke="#c62828" stroke-width="2" '
                         f'stroke-dasharray="3,2"/>')
        if wr.marks:
            at = _LABEL_W + ((wr.finished_at if wr.finished_at is not None else end) - t0) * scale
            parts.append(f'<text x="{at + 8:.1f}" y="{y + _BAR_H - 5}" fill="#555">'
                         f'{_e(", ".join(wr.marks))}</text>')
        parts.append("</a>")
        out.append("".join(parts))
    out.append("</svg>")
    return "".join(out)


# -- the page ------------------------------------------------------------------------------------


def _chip(row: _Row) -> str:
    fill, stroke, _ = _COLOURS.get(row.look, _COLOURS["DEFAULT"])
    dash = ";border-style:dashed" if row.look == "NOT_RUN" else ""
    return (f'<span class="chip" style="background:{fill};border-color:{stroke}{dash}">'
            f"{_e(row.label)}</span>")


def _table(rows: list[_Row], t0: float, show_values: bool) -> str:
    head = ["node", "state", "error", "attempts", "queue wait", "start", "duration", "thread",
            "fathers"]
    if show_values:
        head.append("result")
    out = ["<table><thead><tr>", *(f"<th>{h}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        wr = r.wr
        wait = (wr.started_at - wr.queued_at
                if wr.started_at is not None and wr.queued_at is not None else None)
        start = None if wr.started_at is None else wr.started_at - t0
        cells = [
            (f"<td>{_e(r.name)}{' <span class=note>(critical path)</span>' if r.critical else ''}"
            "</td>"),
            (f"<td>{_chip(r)}"
            f"{''.join(f' <span class=note>{_e(m)}</span>' for m in r.marks)}</td>"),
            f"<td><pre>{_e(r.error) if r.error else '-'}</pre></td>",
            f'<td class="num">{wr.attempts}</td>',
            f'<td class="num">{_ms(wait)}</td>',
            f'<td class="num">{_ms(start)}</td>',
            f'<td class="num">{_ms(wr.duration)}</td>',
            f"<td>{_e(wr.thread or '-')}</td>",
            f"<td>{_e(', '.join(r.fathers) or '-')}</td>",
        ]
        if show_values:
            value = _repr(wr.result) if r.state in ("SUCCESS", "DEGRADED") else "-"
            cells.append(f"<td><pre>{_e(value)}</pre></td>")
        out.append(f'<tr id="node-{r.index}">{"".join(cells)}</tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _failures(result: FlowResult, rows: list[_Row], status: str) -> list[str]:
    """The "what failed and why" line and the table of the nodes that failed themselves (or
    degraded): what a reader needs first, placed above the charts."""
    line = failure_summary([r.name for r in rows], [r.wr for r in rows], status,
                           getattr(result, "cancelled", None))
    if line is None:
        return []
    own = [r for r in rows if r.look != "NOT_RUN"
           and r.state in ("EXCEPTION", "TIMEOUT", "DEGRADED")]
    own.sort(key=lambda r: (r.wr.finished_at if r.wr.finished_at is not None else math.inf,
                            r.index))
    kind = "summary degraded" if own and all(r.state == "DEGRADED" for r in own) else "summary"
    out = [f'<p class="{kind}"><b>What failed and why:</b> {_e(line)}</p>']
    if own:
        body = "".join(
            f'<tr><td><a href="#node-{r.index}">{_e(r.name)}</a></td><td>{_chip(r)}</td>'
            f"<td><pre>{_e(r.error) if r.error else '-'}</pre></td></tr>" for r in own)
        out.append("<table><thead><tr><th>failed node</th><th>state</th><th>error</th></tr>"
                   f"</thead><tbody>{body}</tbody></table>")
    return out


def _context_section(context: Mapping[str, Any] | None) -> str:
    if context is None:
        return ""
    try:
        items = sorted(dict(context).items(), key=lambda kv: str(kv[0]))
    except Exception as exc:  # noqa: BLE001 - an unreadable context must not break the page
        return f"<h2>Context</h2><p class=note>unreadable: {_e(type(exc).__name__)}</p>"
    body = "".join(f"<tr><td>{_e(k)}</td><td><pre>{_e(_repr(v))}</pre></td></tr>"
                   for k, v in items)
    return ("<h2>Context</h2><table><thead><tr><th>key</th><th>value</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _status(result: FlowResult) -> str:
    status = getattr(result, "status", None)
    name = getattr(status, "name", None)
    if isinstance(name, str):
        return name
    return "OK" if result.ok else "FAILED"


def render_html(
    result: FlowResult,
    *,
    title: str | None = None,
    show_values: bool = True,
    show_context: bool = False,
    context: Mapping[str, Any] | None = None,
    flow: str | None = None,
    max_nodes: int = 2000,
) -> str:
    """Render one run as a self-contained HTML page.

    Args:
        result: The run.
        title: The page's heading (default: the flow's name and the run's id).
        show_values: Show each node's result (its ``repr``, cut to 500 characters).
        show_context: Show the run's context entries. They often hold the request (cookies,
            tokens), so they are left out unless asked for.
        context: The context to show with ``show_context=True`` (default: the run's own,
            ``result.context``). Ignored without ``show_context``.
        flow: The flow's name, shown in the header (default: the result's ``flow_name``, if
            any).
        max_nodes: Above this many nodes the two charts are left out (the table stays).

    Returns:
        The page, a ``str`` of UTF-8 HTML with no external references and no scripts.
    """
    from taskflow.observe.stats import critical_path

    rows = _rows(result)
    t0 = _origin(result, rows)
    end = t0 + result.elapsed
    for r in rows:
        for t in (r.wr.finished_at, r.wr.started_at):
            if t is not None and t > end:
                end = t
    on_path = set(critical_path(result))
    for r in rows:
        r.critical = r.name in on_path
    flow = flow if flow is not None else getattr(result, "flow_name", None)
    if title is not None:
        heading = title
    else:
        heading = f"{flow} \u2014 run {result.flow_id}" if flow else f"run {result.flow_id}"
    status = _status(result)
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        counts[(r.label, r.look)] = counts.get((r.label, r.look), 0) + 1
    chips = "".join(
        f'<span class="chip" style="background:{_COLOURS.get(look, _COLOURS["DEFAULT"])[0]};'
        f'border-color:{_COLOURS.get(look, _COLOURS["DEFAULT"])[1]}'
        f'{";border-style:dashed" if look == "NOT_RUN" else ""}">{_e(label)} {n}</span>'
        for (label, look), n in sorted(counts.items())
    )
    timeout = getattr(result, "timeout", None)
    meta = [f"<b>{_e(status)}</b>", f"elapsed <b>{_ms(result.elapsed)}</b>"]
    if timeout is not None:
        meta.append(f"budget {_ms(timeout)}")
    if flow:
        meta.insert(0, f"flow <b>{_e(flow)}</b>")
    meta.append(f"id <code>{_e(result.flow_id)}</code>")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(heading)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(heading)}</h1>",
        f'<p class="meta">{_SEP.join(meta)}</p>',
        f"<p>{chips}</p>",
        *_failures(result, rows, status),
    ]
    if len(rows) <= max_nodes:
        parts += [
            "<h2>Graph</h2>",
            '<p class="note">Hover a node for its timings and error; click it for its row.</p>',
            f'<div class="scroll">{_graph_svg(rows, t0, show_values)}</div>',
            "<h2>Timeline</h2>",
            ('<p class="note">Pale bar: waiting in the queue; coloured bar: running (from the first '
            "attempt's start to the end); outlined: on the run's critical path.</p>"),
            f'<div class="scroll">{_gantt_svg(rows, t0, end, show_values)}</div>',
        ]
    else:
        parts.append(f'<p class="note">{len(rows)} nodes: charts left out (more than '
                     f"{max_nodes}).</p>")
    parts += ["<h2>Nodes</h2>", _table(rows, t0, show_values)]
    if show_context:
        ctx = context if context is not None else getattr(result, "context", None)
        if isinstance(ctx, Mapping):
            parts.append(_context_section(ctx))
        else:
            parts.append('<h2>Context</h2><p class="note">this result carries no context; pass '
                         "<code>context=</code></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
