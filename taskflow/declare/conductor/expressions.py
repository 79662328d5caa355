"""Conductor's ``${...}`` expressions: parsed once at load, resolved when a task starts.

A string that is exactly one expression becomes the value itself; an expression inside a longer
string is replaced by its text (Java's ``toString``: ``null``, ``true``, JSON for objects); ``$${``
is a literal ``${``; a path that leads nowhere gives ``None`` (Conductor's ``null``).

What an expression may read (Conductor's system parameters):

* ``${workflow.input.x}``, ``${workflow.variables.x}`` (set by SET_VARIABLE),
  ``${workflow.workflowId}``, ``${workflow.correlationId}``, ``${workflow.workflowType}``,
  ``${workflow.version}``;
* ``${ref.input.x}``, ``${ref.output.a.b[0]}``, ``${ref.taskId}``, ``${ref.status}``,
  ``${ref.retryCount}``, ``${ref.taskType}`` of any task and ``${loop.iteration}`` (also
  written ``${loop['iteration']}``) of a DO_WHILE;
  a JSONPath deep scan ``${ref.output..status}`` gives every ``status`` at any depth, as a list;
* ``${CPEWF_TASK_ID}``, the id of the task being resolved. ``${NETFLIX_ENV}`` and
  ``${NETFLIX_STACK}`` read environment variables in Conductor; in-process they resolve to
  ``None``: a definition never reads the process environment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["Ref", "Scope", "Template", "as_text", "compile_value", "walk"]

#: system parameters that are not paths (``${CPEWF_TASK_ID}``)
SYSTEM_PARAMETERS = ("CPEWF_TASK_ID", "NETFLIX_ENV", "NETFLIX_STACK")
_WORKFLOW_FIELDS_READ = ("input", "variables", "workflowId", "correlationId", "workflowType",
                         "version", "output", "status")
_TASK_FIELDS_READ = ("input", "output", "taskId", "status", "referenceTaskName", "retryCount",
                     "taskType", "iteration")


class Ref:
    """One ``${...}``: a root (``workflow``, a task reference or a system parameter), a field and
    a path below it."""

    __slots__ = ("field", "path", "root", "text")

    def __init__(self, root: str, field: str, path: tuple[str | int | Deep, ...],
                 text: str) -> None:
        self.root = root
        self.field = field
        self.path = path
        self.text = text

    @property
    def is_task(self) -> bool:
        """True when the expression reads a task (not ``workflow`` or a system parameter)."""
        return self.root != "workflow" and self.root not in SYSTEM_PARAMETERS


class Deep:
    """A JSONPath deep scan (``..key``): every value of ``key`` at any depth, as a list."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deep) and other.key == self.key

    def __hash__(self) -> int:
        return hash(("..", self.key))


class Template:
    """A string with expressions: literal text and ``Ref`` parts (``whole``: one ref, no text)."""

    __slots__ = ("parts", "whole")

    def __init__(self, parts: list[str | Ref]) -> None:
        self.parts = parts
        self.whole = len(parts) == 1 and isinstance(parts[0], Ref)


_TOKEN = re.compile(
    r"""\.\.(?P<deep>[^.\[\]'"\s]+)|\.(?P<key>[^.\[\]'"\s]+)|\[\s*(?P<idx>-?\d+)\s*\]|\[\s*'(?P<sq>[^']*)'\s*\]|\[\s*"(?P<dq>[^"]*)"\s*\]"""
)


def parse_path(text: str) -> Ref:
    """``workflow.input.a[0]`` -> Ref; ValueError with the reason if it is malformed."""
    body = text.strip().removeprefix("$.")
    if body in SYSTEM_PARAMETERS:
        return Ref(body, "", (), text)
    m = re.match(r"[^.\[\]\s]+", body)
    if m is None:
        raise ValueError("it does not start with 'workflow' or a task reference name")
    root = m.group(0)
    tokens: list[str | int | Deep] = []
    pos = m.end()
    while pos < len(body):
        t = _TOKEN.match(body, pos)
        if t is None:
            raise ValueError(f"cannot read the path at {body[pos:]!r}")
        if t.group("deep") is not None:
            if not tokens:
                raise ValueError(f"{root!r} must be followed by a field such as '.output'")
            tokens.append(Deep(t.group("deep")))
        elif t.group("idx") is not None:
            tokens.append(int(t.group("idx")))
        else:
            key = t.group("key") or t.group("sq") or t.group("dq") or ""
            if t.group("key") is not None and ("*" in key or key.startswith("?")):
                raise ValueError(f"wildcards and filters ({key!r}) are not supported")
            tokens.append(key)
        pos = t.end()
    if not tokens or not isinstance(tokens[0], str):
        raise ValueError(f"{root!r} must be followed by a field such as '.input' or '.output'")
    field = tokens[0]
    allowed = _WORKFLOW_FIELDS_READ if root == "workflow" else _TASK_FIELDS_READ
    if field not in allowed:
        raise ValueError(
            f"{root}.{field} is not supported; use "
            + ", ".join(f"{root}.{f}" for f in allowed)
        )
    return Ref(root, field, tuple(tokens[1:]), text)


def compile_string(text: str) -> str | Template:
    """Split ``text`` into literals and expressions (ValueError if an expression is malformed)."""
    if "${" not in text:
        return text
    parts: list[str | Ref] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("$${", i):
            buf.append("${")
            i += 3
            continue
        if text.startswith("${", i):
            end = text.find("}", i + 2)
            if end < 0:
                raise ValueError(f"unclosed '${{' at position {i}")
            inner = text[i + 2:end]
            if "${" in inner or "{" in inner:
                raise ValueError("nested expressions are not supported")
            if not inner.strip():
                raise ValueError("empty expression '${}'")
            if buf:
                parts.append("".join(buf))
                buf = []
            parts.append(parse_path(inner))
            i = end + 1
            continue
        buf.append(text[i])
        i += 1
    if buf:
        parts.append("".join(buf))
    if not any(isinstance(p, Ref) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    return Template(parts)


def compile_value(value: Any, where: str, refs: list[tuple[str, Ref]]) -> Any:
    """The definition value with its strings compiled; every ``Ref`` is appended to ``refs``."""
    if isinstance(value, str):
        try:
            compiled = compile_string(value)
        except ValueError as exc:
            raise ValueError(f"{where}: malformed expression {value!r}: {exc}") from None
        if isinstance(compiled, Template):
            refs.extend((where, p) for p in compiled.parts if isinstance(p, Ref))
        return compiled
    if isinstance(value, Mapping):
        return {k: compile_value(v, f"{where}.{k}", refs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compile_value(v, f"{where}[{i}]", refs) for i, v in enumerate(value)]
    return value


def _deep(value: Any, key: str) -> Iterator[Any]:
    """Every value of ``key`` in ``value``, at any depth, in document order."""
    if isinstance(value, Mapping):
        if key in value:
            yield value[key]
        for v in value.values():
            yield from _deep(v, key)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _deep(v, key)


def walk(value: Any, path: tuple[str | int | Deep, ...]) -> Any:
    """Follow ``path`` into ``value``; None where it leads nowhere. A deep scan (``..key``)
    gives the list of its matches, the rest of the path applied to each (matches where the
    rest leads nowhere are left out, as JSONPath does)."""
    for i, step in enumerate(path):
        if isinstance(step, Deep):
            found = list(_deep(value, step.key))
            rest = path[i + 1:]
            if not rest:
                return found
            return [r for r in (walk(v, rest) for v in found) if r is not None]
        if isinstance(step, int):
            if isinstance(value, (list, tuple)) and -len(value) <= step < len(value):
                value = value[step]
            else:
                return None
        elif isinstance(value, Mapping):
            value = value.get(step)
        else:
            return None
        if value is None:
            return None
    return value


def as_text(value: Any) -> str:
    """A value inside a longer string, as Conductor (Java's ``toString``) would write it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class Scope:
    """What expressions read during a run or after it.

    Args:
        workflow: the ``workflow`` object (``input``, ``variables``, ``workflowId``, ...).
        task_of: reference name -> the task's record (``input``, ``output``, ``taskId``,
            ``status``), or None if it has not run.
        task_id: the id ``${CPEWF_TASK_ID}`` gives (the task being resolved).
    """

    __slots__ = ("task_id", "task_of", "workflow")

    def __init__(self, workflow: Mapping[str, Any], task_of: Callable[[str], Any],
                 task_id: str | None = None) -> None:
        self.workflow = workflow
        self.task_of = task_of
        self.task_id = task_id

    def read(self, ref: Ref) -> Any:
        if ref.root == "CPEWF_TASK_ID":
            return self.task_id
        if ref.root in SYSTEM_PARAMETERS:
            return None  # the process environment is never read by a definition
        if ref.root == "workflow":
            base = self.workflow.get(ref.field)
        else:
            record = self.task_of(ref.root)
            if record is None:
                return None
            base = record.get(ref.field) if isinstance(record, Mapping) else None
        return walk(base, ref.path)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, Template):
            if value.whole:
                return self.read(value.parts[0])  # type: ignore[arg-type]
            return "".join(p if isinstance(p, str) else as_text(self.read(p))
                           for p in value.parts)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value
