"""Pictures of runs and graphs.

* ``run_to_mermaid(result)``: a Mermaid Gantt chart of one run (``FlowResult.to_mermaid``).
* ``definition_to_mermaid(nodes)`` / ``to_dot(nodes)``: a flowchart of a graph's wiring (Mermaid or
  Graphviz DOT). Optional edges are dotted, a switch's case edges carry the case value, and with
  ``result=`` the nodes are coloured by how they ended in that run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from taskflow.model.node import NodeKind
from taskflow.model.result import ResultState

if TYPE_CHECKING:
    from taskflow.model.graph import Plan
    from taskflow.model.result import FlowResult

__all__ = ["definition_to_mermaid", "run_to_mermaid", "to_dot"]

# Mermaid gantt task tags: done (grey), active (light), crit (red)
_TAGS = {
    ResultState.SUCCESS: "done",
    ResultState.DEGRADED: "done",
    ResultState.EXCEPTION: "crit",
    ResultState.TIMEOUT: "crit",
    ResultState.CANCELLED: "active",
    ResultState.SKIPPED: "active",
    ResultState.DEFAULT: "active",
    ResultState.DETACHED: "active",  # handed off: the run did not wait for it
}


# -- escaping: every name, title and case value comes from user data -------------------------

# Mermaid entity codes (``#quot;``) for the characters that could end or change a label; every
# other character outside _MERMAID_PLAIN is written as its decimal code (``#37;``), so a label can
# never hold a quote, a newline, ``%%`` (a comment or an ``%%{init}%%`` directive), ``:``/``;``
# (end of a gantt task), brackets, ``|`` (end of an edge label), a backtick (markdown) or HTML.
# (Mermaid turns entity codes into placeholders before it parses any diagram, gantt included.)
_MERMAID_NAMED = {'"': "#quot;", "&": "#amp;", "<": "#lt;", ">": "#gt;"}
_MERMAID_PLAIN = frozenset(" _-.,/()+=@!?'*")
# a gantt line that starts with one of these is a statement, not a task (Mermaid's gantt lexer)
_GANTT_KEYWORD = re.compile(
    r"(?i)(acc|call|click|href|gantt|dateformat|inclusiveenddates|topaxis|axisformat|"
    r"tickinterval|includes|excludes|todaymarker|title|section|weekday|weekend|\d{4}-)")


def _mermaid_text(text: str) -> str:
    """``text`` as the inside of a Mermaid label: letters, digits, a few plain punctuation
    marks and entity codes (``#quot;``, ``#10;``), nothing else."""
    out = []
    for ch in str(text):
        if ch in _MERMAID_PLAIN or (ch.isalnum() and ch.isprintable()):
            out.append(ch)
        else:
            out.append(_MERMAID_NAMED.get(ch) or f"#{ord(ch)};")
    return "".join(out)


def _gantt_task(text: str) -> str:
    """A gantt task name: ``_mermaid_text``, and never a gantt keyword at the line's start."""
    escaped = _mermaid_text(text)
    if _GANTT_KEYWORD.match(escaped):
        escaped = f"#{ord(escaped[0])};{escaped[1:]}"
    return escaped


_PLAIN_TITLE = re.compile(r"[A-Za-z_][A-Za-z0-9_ .-]*[A-Za-z0-9_.-]|[A-Za-z_]")


def _front_matter_title(title: str) -> str:
    """A YAML scalar for Mermaid's front matter: plain when it is a simple name, else a JSON string
    (valid YAML) with every non-ASCII and markup character as a ``\\uXXXX`` escape."""
    if _PLAIN_TITLE.fullmatch(title):
        return title
    quoted = json.dumps(title, ensure_ascii=True)
    return "".join(f"\\u{ord(ch):04x}" if ch in "%<>&'`#" else ch for ch in quoted)


def _dot_text(text: str) -> str:
    """``text`` as the inside of a DOT double-quoted string: backslashes doubled (so the user's
    ``\\N`` or ``\\l`` stays text), quotes escaped, line breaks as ``\\n``, other control
    characters as visible ``\\uXXXX`` text."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch in "\n\r":
            out.append("\\n")
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def run_to_mermaid(result: FlowResult) -> str:
    """A Mermaid ``gantt`` of one run: a bar per node from start to end, in milliseconds since
    the run started; nodes that never started are listed as zero-length milestones."""
    t0 = result.started_at
    end_of_run = t0 + result.elapsed
    lines = [
        "gantt",
        (f"    title flow {_mermaid_text(str(result.flow_id))} "
         f"({'ok' if result.ok else 'failed'}, {result.elapsed * 1000:.1f} ms)"),
        "    dateFormat x",
        "    axisFormat %S.%L s",
    ]
    for name in result:
        wr = result.result_of(name)
        tag = _TAGS[wr.state]
        marks = wr.marks  # fallback, hedged N, shared
        label = f"{_gantt_task(name)} {wr.state.name}{''.join(f' - {m}' for m in marks)}"
        if wr.started_at is None:
            at = round(((wr.finished_at or end_of_run) - t0) * 1000)
            lines.append(f"    {label} : milestone, {tag}, {at}, 0ms")
            continue
        start = round((wr.started_at - t0) * 1000)
        finish = wr.finished_at if wr.finished_at is not None else end_of_run
        length = max(1, round((finish - wr.started_at) * 1000))
        lines.append(f"    {label} : {tag}, {start}, {length}ms")
    return "\n".join(lines) + "\n"


# -- flowcharts of a graph's wiring --------------------------------------------------------------

# Mermaid node shapes by kind: (open, close) around the quoted label
_MERMAID_SHAPES = {
    "task": ("[", "]"),
    "switch": ("{", "}"),
    "fanout": ("{{", "}}"),
    "fork": ("[/", "\\]"),
    "join": ("[\\", "/]"),
}
_DOT_SHAPES = {
    "task": "box",
    "switch": "diamond",
    "fanout": "hexagon",
    "fork": "trapezium",
    "join": "invtrapezium",
}
# fill, stroke, text colour of a node by its state in a run
_STATE_COLOURS = {
    ResultState.SUCCESS: ("#d4edda", "#2e7d32", "#1b1b1b"),
    ResultState.DEGRADED: ("#e8f5e9", "#9e9d24", "#1b1b1b"),
    ResultState.EXCEPTION: ("#f8d7da", "#c62828", "#1b1b1b"),
    ResultState.TIMEOUT: ("#ffe0b2", "#ef6c00", "#1b1b1b"),
    ResultState.CANCELLED: ("#fff9c4", "#f9a825", "#1b1b1b"),
    ResultState.SKIPPED: ("#eeeeee", "#9e9e9e", "#757575"),
    ResultState.DEFAULT: ("#ffffff", "#9e9e9e", "#1b1b1b"),
    ResultState.DETACHED: ("#ede7f6", "#5e35b1", "#1b1b1b"),
}


def _plan(nodes: Any) -> Plan:
    """The validated graph connected to ``nodes`` (one node or an iterable, as for ``start``)."""
    from taskflow.model.graph import as_top_nodes, compile_plan

    return compile_plan(as_top_nodes(nodes))


def _kind(node: Any) -> str:
    """How a node is drawn: task, switch, fanout, fork or join."""
    cls = type(node)
    kind = getattr(cls, "draw_as", None)
    if isinstance(kind, str) and kind in _MERMAID_SHAPES:
        return kind
    node_kind = getattr(cls, "node_kind", None)
    if node_kind is NodeKind.SWITCH:
        return "switch"
    if node_kind is NodeKind.FANOUT:
        return "fanout"
    try:
        from taskflow.kinds.forkjoin import ForkNode, JoinNode
    except ImportError:  # pragma: no cover - forkjoin is part of the package
        return "task"
    if isinstance(node, ForkNode):
        return "fork"
    if isinstance(node, JoinNode):
        return "join"
    return "task"


def _case_text(value: object) -> str:
    return value if isinstance(value, str) else repr(value)


def _case_labels(node: Any) -> dict[int, str]:
    """id(son) -> the case values (or "default") that route a switch to that son."""
    if getattr(type(node), "node_kind", None) is not NodeKind.SWITCH:
        return {}
    labels: dict[int, list[str]] = {}
    cases = getattr(node, "cases", None)
    if isinstance(cases, Mapping):
        for value, branch in cases.items():
            targets = branch if isinstance(branch, (tuple, list)) else (branch,)
            for son in targets:
                labels.setdefault(id(son), []).append(_case_text(value))
    default = getattr(node, "default", None)
    if default:
        for son in default if isinstance(default, (tuple, list)) else (default,):
            labels.setdefault(id(son), []).append("default")
    return {k: " | ".join(v) for k, v in labels.items()}


def _edges(plan: Plan) -> list[tuple[int, int, bool, str | None]]:
    """(father, son, optional, case label) for every edge, fathers in plan order."""
    out = []
    for f, defn in enumerate(plan.nodes):
        labels = _case_labels(defn)
        for s in plan.sons[f]:
            out.append((f, s, f in plan.optional[s], labels.get(id(plan.nodes[s]))))
    return out


def _states(plan: Plan, result: FlowResult | None) -> list[ResultState | None]:
    if result is None:
        return [None] * len(plan.nodes)
    return [result.result_of(name).state if name in result else None for name in plan.names]


def definition_to_mermaid(nodes: Any, *, result: FlowResult | None = None,
                          title: str | None = None, direction: str = "TD") -> str:
    """A Mermaid ``flowchart`` of the graph connected to ``nodes``.

    Switches are rhombi, fan-outs hexagons, forks and joins trapezoids, other nodes boxes.
    Optional edges (``depends_on(x, optional=True)``) are dotted; a switch's edges to its case
    nodes are labelled with the case value (``default`` for the default branch).

    Args:
        nodes: one node or an iterable of nodes; the whole connected graph is drawn.
        result: a run of this graph: each node is coloured by its state and the state is added
            to its label (nodes not in the run are left plain).
        title: a title put in the chart's front matter.
        direction: ``TD`` (top down) or ``LR`` (left to right).

    Raises:
        FlowDefinitionError: the graph is invalid (the same checks as ``TaskScheduling.start``).
    """
    if direction not in ("TD", "TB", "LR", "RL", "BT"):
        raise ValueError(f"direction must be one of TD, TB, LR, RL, BT, got {direction!r}")
    plan = _plan(nodes)
    states = _states(plan, result)
    lines = []
    if title:
        lines += ["---", f"title: {_front_matter_title(title)}", "---"]
    lines.append(f"flowchart {direction}")
    for i, node in enumerate(plan.nodes):
        open_, close = _MERMAID_SHAPES[_kind(node)]
        label = _mermaid_text(plan.names[i])
        if states[i] is not None:
            label += "<br/>" + states[i].name  # type: ignore[union-attr]
        lines.append(f'    n{i}{open_}"{label}"{close}')
    for f, s, optional, case in _edges(plan):
        arrow = "-.->" if optional else "-->"
        text = f'|"{_mermaid_text(case)}"|' if case is not None else ""
        lines.append(f"    n{f} {arrow}{text} n{s}")
    if result is not None:
        used: dict[ResultState, list[str]] = {}
        for i, st in enumerate(states):
            if st is not None:
                used.setdefault(st, []).append(f"n{i}")
        for st, ids in used.items():
            fill, stroke, colour = _STATE_COLOURS[st]
            dash = ",stroke-dasharray: 4 4" if st is ResultState.SKIPPED else ""
            lines.append(f"    classDef {st.name} fill:{fill},stroke:{stroke},color:{colour}{dash}")
            lines.append(f"    class {','.join(ids)} {st.name}")
    return "\n".join(lines) + "\n"


def to_dot(nodes: Any, *, result: FlowResult | None = None, title: str | None = None,
           direction: str = "TB") -> str:
    """A Graphviz DOT ``digraph`` of the graph connected to ``nodes``.

    Same drawing rules as ``definition_to_mermaid``: optional edges dashed, case edges
    labelled, and with ``result=`` the nodes filled by their state in that run.

    Args:
        nodes: one node or an iterable of nodes; the whole connected graph is drawn.
        result: a run of this graph, to colour the nodes by state.
        title: the graph's label.
        direction: Graphviz ``rankdir`` (``TB`` or ``LR``, ...).

    Raises:
        FlowDefinitionError: the graph is invalid.
    """
    if direction not in ("TB", "LR", "BT", "RL"):
        raise ValueError(f"direction must be one of TB, LR, BT, RL, got {direction!r}")
    plan = _plan(nodes)
    states = _states(plan, result)
    lines = ["digraph taskflow {", f"    rankdir={direction};"]
    if title:
        lines.append(f'    label="{_dot_text(title)}";')
        lines.append("    labelloc=t;")
    lines.append('    node [shape=box, style="rounded", fontname="Helvetica"];')
    lines.append('    edge [fontname="Helvetica", fontsize=10];')
    for i, node in enumerate(plan.nodes):
        attrs = [f'label="{_dot_text(plan.names[i])}'
                 + (f"\\n{states[i].name}" if states[i] is not None else "") + '"']  # type: ignore[union-attr]
        shape = _DOT_SHAPES[_kind(node)]
        if shape != "box":
            attrs.append(f"shape={shape}")
        st = states[i]
        if st is not None:
            fill, stroke, colour = _STATE_COLOURS[st]
            style = "rounded,filled,dashed" if st is ResultState.SKIPPED else "rounded,filled"
            attrs += [f'style="{style}"', f'fillcolor="{fill}"', f'color="{stroke}"',
                      f'fontcolor="{colour}"']
        lines.append(f"    n{i} [{', '.join(attrs)}];")
    for f, s, optional, case in _edges(plan):
        attrs = []
        if optional:
            attrs.append("style=dashed")
        if case is not None:
            attrs.append(f'label="{_dot_text(case)}"')
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        lines.append(f"    n{f} -> n{s}{suffix};")
    lines.append("}")
    return "\n".join(lines) + "\n"
