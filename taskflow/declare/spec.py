"""``FlowSpec``: taskflow's own declarative flow format (JSON, or YAML with the ``[yaml]`` extra).

A spec lists tasks by name; each names its callable as ``"package.module:function"`` and its
fathers, with the options of [`SchedulingNode`][taskflow.SchedulingNode] (``join``, ``timeout``,
``retries``, ``retry_backoff``) and ``optional`` (the task's failure does not fail its sons:
every edge out of it is ``depends_on(..., optional=True)``). A task may instead be a switch, a
fork/join or a fan-out::

    name: checkout
    timeout: 2.0                      # the run's default budget
    tasks:
      - name: user
        callable: shop.tasks:fetch_user          # fn(ctx, param)
        param: {id: 42}
        retries: 2
        retry_backoff: 0.05
      - name: route
        callable: shop.tasks:tier                # the decision: fn(ctx, param)
        fathers: [user]
        switch:
          cases: {vip: [vip_offer], standard: [std_offer]}
          default: [std_offer]
      - name: notify                             # a no-op fork node
        fathers: [{name: route, optional: true}]
        fork:
          branches: [[email_payload, email], [sms]]
          join: {name: notified, join_on: [email], policy: all}
      - name: enrich
        fathers: [notified]
        fanout:
          items: shop.tasks:lines                # fn(ctx, param) -> iterable of (id, item)
          work: shop.tasks:price_line            # fn(ctx, item)
          max_concurrency: 4
          policy: best_effort
      ...

Switch cases and fork branches name other tasks of the spec; they are wired by
[`SwitchNode`][taskflow.kinds.switch.SwitchNode] and [`fork_join`][taskflow.kinds.forkjoin.fork_join], fan-outs are
[`FanOutNode`][taskflow.kinds.fanout.FanOutNode], so a spec runs exactly like the same graph built in code.

Every error names the exact place in the document: ``tasks[2].join: ...`` (with the line when
the document was read from a file and PyYAML is installed), as ``SpecError``, a
[`FlowDefinitionError`][taskflow.FlowDefinitionError].

A spec is code: building it imports every module it names. ``allow_modules=("myapp.tasks",)``
(on [`load_spec`][taskflow.load_spec] and [`FlowSpec.build`][taskflow.FlowSpec.build]) accepts only callables from those modules and
their submodules and refuses any other callable before anything is imported; ``None`` (the
default) trusts the spec. ``sys.path`` is never changed unless asked: ``import_spec_dir=True``
also looks for task modules in the spec file's folder. See ``docs/security.md``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import reprlib
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from taskflow.errors import FlowDefinitionError, did_you_mean
from taskflow.kinds.fanout import FanOutNode
from taskflow.model.context import TaskContext
from taskflow.model.joins import Join
from taskflow.model.node import FunctionNode, SchedulingNode
from taskflow.model.result import FlowResult
from taskflow.scheduling import TaskScheduling

__all__ = [
    "FanOutSpec",
    "FatherSpec",
    "Flow",
    "FlowSpec",
    "ForkSpec",
    "JoinSpec",
    "SpecError",
    "SwitchSpec",
    "TaskSpec",
    "load_spec",
]

JoinName = Literal["all", "any", "best_effort"]


class SpecError(FlowDefinitionError):
    """A flow spec is invalid. ``errors`` lists ``(place, message)``; ``place`` is a path in the
    document such as ``tasks[2].join``, with `` (line N)`` when it is known."""

    def __init__(self, errors: list[tuple[str, str]], source: str | None = None) -> None:
        self.errors = errors
        self.source = source
        lines = [f"{place}: {message}" if place else message for place, message in errors]
        head = f"in flow spec {source!r}: " if source else ""
        if len(lines) == 1:
            super().__init__(head + lines[0])
        else:
            super().__init__(f"{head}{len(lines)} errors\n  " + "\n  ".join(lines))


def _check_join(value: Any) -> Any:
    """``all`` / ``any`` / ``best_effort`` / ``{quorum: k}`` (ValueError naming the value)."""
    if isinstance(value, str) and value in ("all", "any", "best_effort"):
        return value
    if isinstance(value, Mapping) and set(value) == {"quorum"}:
        k = value["quorum"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"quorum must be a positive integer, got {_short(k)}")
        return {"quorum": k}
    raise ValueError("join must be 'all', 'any', 'best_effort' or {quorum: k}, got "
                     + _short(value))


def _join_policy(value: Any) -> Join:
    if isinstance(value, Mapping):
        return Join.quorum(value["quorum"])
    return {"all": Join.ALL, "any": Join.ANY, "best_effort": Join.BEST_EFFORT}[value]


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 5


def _short(value: Any) -> str:
    """A bounded repr for messages: a document's value may be huge or deeply nested (YAML
    aliases can make a few lines expand to millions of items)."""
    return _REPR.repr(value)


def _dotted(text: str) -> bool:
    """``text`` is a dotted name (``a.b.c``): identifiers joined by single dots."""
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _check_callable_path(value: Any) -> str:
    if not isinstance(value, str) or value.count(":") != 1:
        raise ValueError(f"callable must be 'package.module:function', got {_short(value)}")
    module, _, attr = value.partition(":")
    if not (_dotted(module) and _dotted(attr)):
        raise ValueError(f"callable must be 'package.module:function', got {_short(value)}")
    return value


def _allow_list(allow_modules: Any) -> tuple[str, ...] | None:
    """Validate ``allow_modules``: None, or an iterable of dotted module-name prefixes."""
    if allow_modules is None:
        return None
    if isinstance(allow_modules, (str, bytes)) or not isinstance(allow_modules, Iterable):
        raise TypeError("allow_modules must be None or a sequence of module names such as "
                        f"('myapp.tasks',), got {_short(allow_modules)}")
    prefixes = tuple(allow_modules)
    for prefix in prefixes:
        if not isinstance(prefix, str) or not _dotted(prefix):
            raise FlowDefinitionError(f"allow_modules: {_short(prefix)} is not a module name "
                                      "(dotted identifiers, such as 'myapp.tasks')")
    return prefixes


def _allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    """``module`` is one of ``prefixes`` or inside one (on dotted boundaries: ``myapp.tasks``
    allows ``myapp.tasks.x``, not ``myapp.tasksevil``)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FatherSpec(_Model):
    """A father given as an object: ``{name: x, optional: true}`` (a plain ``x`` is the same
    with ``optional: false``)."""

    name: str = Field(min_length=1)
    optional: bool = False


class SwitchSpec(_Model):
    """The task's callable returns a decision; ``cases`` maps each decision to the tasks that
    start its branch, ``default`` catches other decisions (none: such a decision fails)."""

    cases: dict[Any, list[str]] = Field(default_factory=dict)
    default: list[str] | None = None

    @field_validator("cases")
    @classmethod
    def _hashable_cases(cls, value: dict[Any, list[str]]) -> dict[Any, list[str]]:
        for key, targets in value.items():
            if not targets:
                raise ValueError(f"case {_short(key)} names no task")
        return value

    @model_validator(mode="after")
    def _some_branch(self) -> SwitchSpec:
        if not self.cases and not self.default:
            raise ValueError("a switch needs cases or a default")
        return self


class JoinSpec(_Model):
    """The join node a fork creates: its ``name``, the branch tasks it waits for (``join_on``;
    default the last task of each branch, ``[]`` the fork alone) and its ``policy``."""

    name: str = Field(min_length=1)
    join_on: list[str] | None = None
    policy: Any = "all"

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, value: Any) -> Any:
        return _check_join(value)


class ForkSpec(_Model):
    """A static fork: each branch a chain of task names, all branches in parallel."""

    branches: list[list[str]] = Field(min_length=1)
    join: JoinSpec

    @field_validator("branches")
    @classmethod
    def _non_empty(cls, value: list[list[str]]) -> list[list[str]]:
        for i, branch in enumerate(value):
            if not branch:
                raise ValueError(f"branch {i} is empty")
        return value


class FanOutSpec(_Model):
    """A bounded dynamic fork ([`FanOutNode`][taskflow.kinds.fanout.FanOutNode])."""

    items: str
    work: str
    max_concurrency: int = Field(default=8, ge=1)
    item_timeout: float | None = Field(default=None, ge=0)
    policy: Any = "all"

    @field_validator("items", "work", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        return _check_callable_path(value)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, value: Any) -> Any:
        if value in ("all", "best_effort"):
            return value
        if not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= 1:
            return float(value)
        raise ValueError(f"policy must be 'all', 'best_effort' or a quorum fraction in (0, 1], "
                         f"got {_short(value)}")


class TaskSpec(_Model):
    """One task of a flow spec (see the module docstring)."""

    name: str = Field(min_length=1)
    callable: str | None = None
    param: Any = None
    fathers: list[FatherSpec] = Field(default_factory=list)
    join: Any = "all"
    optional: bool = False
    timeout: float | None = Field(default=None, ge=0)
    retries: int = Field(default=0, ge=0)
    retry_backoff: float = Field(default=0.0, ge=0)
    switch: SwitchSpec | None = None
    fork: ForkSpec | None = None
    fanout: FanOutSpec | None = None

    @field_validator("callable", mode="before")
    @classmethod
    def _callable(cls, value: Any) -> Any:
        return None if value is None else _check_callable_path(value)

    @field_validator("fathers", mode="before")
    @classmethod
    def _fathers(cls, value: Any) -> Any:
        if not isinstance(value, list):
            # pydantic reports a ValueError as this field's error (a TypeError would escape)
            raise ValueError(f"fathers must be a list of task names, got {_short(value)}")
        return [{"name": v} if isinstance(v, str) else v for v in value]

    @field_validator("join", mode="before")
    @classmethod
    def _join(cls, value: Any) -> Any:
        return _check_join(value)

    @model_validator(mode="after")
    def _kind(self) -> TaskSpec:
        blocks = [b for b in ("switch", "fork", "fanout") if getattr(self, b) is not None]
        if len(blocks) > 1:
            raise ValueError(f"a task is one of switch, fork or fanout, not {' and '.join(blocks)}")
        kind = blocks[0] if blocks else None
        if kind in ("fork", "fanout") and self.callable is not None:
            raise ValueError(f"a {kind} task has no callable")
        if kind in (None, "switch") and self.callable is None:
            raise ValueError("callable is required" + (" (the switch's decision)" if kind else ""))
        if kind == "fork" and (self.param is not None or self.retries or self.timeout is not None):
            raise ValueError("a fork task is a no-op: it takes no param, timeout or retries")
        if kind == "fanout" and (self.retries or self.retry_backoff):
            raise ValueError("a fanout task does not retry (its items fail one by one)")
        return self


class FlowSpec(_Model):
    """A whole flow: its tasks and the run's default budget."""

    name: str = "flow"
    description: str | None = None
    timeout: float | None = Field(default=None, ge=0)
    tasks: list[TaskSpec] = Field(min_length=1)

    @classmethod
    def parse(cls, data: Any, *, source: str | None = None, text: str | None = None) -> FlowSpec:
        """Validate plain data (from JSON or YAML) into a FlowSpec.

        Args:
            data: the document.
            source: where it came from, for messages.
            text: the document's text, to add line numbers to messages (needs PyYAML).

        Raises:
            SpecError: the document is invalid; every error names its place.
        """
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            lines = _line_finder(text)
            errors = []
            for err in exc.errors():
                loc = _place(err["loc"])
                line = lines(err["loc"]) if lines else None
                msg = str(err["msg"])
                msg = msg.removeprefix("Value error, ")
                errors.append((loc + (f" (line {line})" if line else ""), msg[:1].lower() + msg[1:]))
            raise SpecError(errors, source) from None

    def build(self, *, resolve: bool = True, base_dir: str | os.PathLike[str] | None = None,
              allow_modules: Iterable[str] | None = None) -> Flow:
        """Make the nodes and wire them.

        Args:
            resolve: import every callable now (False: placeholders that raise when run, for
                drawing a spec whose code is not importable here).
            base_dir: a directory tried for callables' modules that are not importable from
                ``sys.path``: it is put at the front of ``sys.path`` for that import and then
                removed (process-wide while it lasts). None (the default): ``sys.path`` is
                never touched.
            allow_modules: None trusts the spec (any importable callable). A sequence of
                module-name prefixes (``("myapp.tasks",)``) refuses, before anything is
                imported, every callable whose module is not one of them or inside one
                (``myapp.tasks.x`` is inside ``myapp.tasks``; ``myapp.tasksevil`` is not), whose
                attribute path is private (``_x``) or goes through a module
                (``myapp.tasks:os.system``), and, after the import, a function or class that
                was defined in another module (``from os import system`` in ``myapp.tasks``).

        Raises:
            SpecError: an unknown task name, a name used twice, a refused callable, a callable
                that cannot be imported, a cycle: the message names the place in the document.
            TypeError: ``allow_modules`` is a string or not iterable.
        """
        return _Builder(self, resolve, base_dir, _allow_list(allow_modules)).build()


def _place(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _yaml() -> Any:
    """PyYAML (ImportError without it; it is the optional ``[yaml]`` extra, untyped)."""
    return importlib.import_module("yaml")


def _line_finder(text: str | None) -> Callable[[tuple[Any, ...]], int | None] | None:
    """loc -> 1-based line of that place in ``text`` (PyYAML reads JSON too), or None."""
    if text is None:
        return None
    try:
        yaml = _yaml()
    except ImportError:
        return None
    try:
        root = yaml.compose(text)
    except Exception:  # noqa: BLE001 - no line numbers for a document PyYAML cannot read
        return None

    def find(loc: tuple[Any, ...]) -> int | None:
        node = root
        line = None
        for part in loc:
            if node is None:
                break
            line = node.start_mark.line + 1
            if isinstance(node, yaml.MappingNode):
                nxt = None
                for key, value in node.value:
                    if str(key.value) == str(part):
                        nxt, line = value, key.start_mark.line + 1
                        break
                node = nxt
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                node = node.value[part] if part < len(node.value) else None
                if node is not None:
                    line = node.start_mark.line + 1
            else:
                break
        return line

    return find


def _refusal(path: str, prefixes: tuple[str, ...]) -> str | None:
    """Why ``path`` is refused under the allow-list ``prefixes`` (None: it may be imported)."""
    module_name, _, attr = path.partition(":")
    if not _allowed(module_name, prefixes):
        return (f"callable {path!r} is not allowed: module {module_name!r} is not in "
                f"allow_modules {list(prefixes)!r}")
    if any(part.startswith("_") for part in attr.split(".")):
        return f"callable {path!r} is not allowed: private attributes are refused"
    return None


def _import(path: str, base_dir: str | None,
            prefixes: tuple[str, ...] | None = None) -> Callable[..., Any]:
    """``"pkg.mod:attr.sub"`` -> the object (ValueError with the reason).

    With ``prefixes`` (checked by the caller before any import), the attribute path may not go
    through a module and the object must be defined in an allowed module."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if base_dir is None or exc.name != module_name.split(".")[0]:
            raise ValueError(f"cannot import module {module_name!r}: {exc}") from None
        sys.path.insert(0, base_dir)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc2:
            raise ValueError(f"cannot import module {module_name!r}: {exc2}") from None
        finally:
            try:
                sys.path.remove(base_dir)
            except ValueError:
                pass
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
        if prefixes is not None and isinstance(obj, ModuleType):
            raise ValueError(f"callable {path!r} is not allowed: {part!r} is a module "
                             "(name the module itself before the ':')")
    if not callable(obj):
        raise ValueError(f"{path!r} is not callable: {_short(obj)}")
    if prefixes is not None and (inspect.isroutine(obj) or isinstance(obj, type)):
        # a function or class says where it was defined; a callable object made in the module
        # (a functools.partial, an instance with __call__) is the module's own
        home = getattr(obj, "__module__", None)
        if isinstance(home, str) and not _allowed(home, prefixes):
            raise ValueError(f"callable {path!r} is not allowed: it is defined in module "
                             f"{home!r}, which is not in allow_modules {list(prefixes)!r}")
    return obj  # type: ignore[no-any-return]


def _placeholder(path: str) -> Callable[..., Any]:
    def unresolved(*args: Any) -> Any:
        raise FlowDefinitionError(f"callable {path!r} was not resolved (spec built with "
                                  "resolve=False)")

    unresolved.__name__ = path
    return unresolved


class _SpecFanOut(FanOutNode[Any]):
    """A fan-out whose ``items``/``work`` are the spec's callables."""

    items_fn: Callable[[TaskContext, Any], Iterable[tuple[Hashable, Any]]]
    work_fn: Callable[[TaskContext, Any], Any]

    def items(self, ctx: TaskContext, param: Any) -> Iterator[tuple[Hashable, Any]]:
        return iter(self.items_fn(ctx, param))

    def work(self, ctx: TaskContext, item: Any) -> Any:
        return self.work_fn(ctx, item)


class _Builder:
    def __init__(self, spec: FlowSpec, resolve: bool, base_dir: Any,
                 prefixes: tuple[str, ...] | None) -> None:
        self.spec = spec
        self.resolve = resolve
        self.base_dir = None if base_dir is None else str(base_dir)
        self.prefixes = prefixes
        self.index: dict[str, int] = {}  # task name -> position
        self.nodes: dict[str, SchedulingNode[Any, Any]] = {}  # every node by name (joins too)
        self.join_of: dict[str, int] = {}  # a fork's join name -> the fork task's position
        self.building: set[str] = set()
        self.errors: list[tuple[str, str]] = []

    def error(self, place: str, message: str) -> SpecError:
        return SpecError([(place, message)])

    def callable(self, path: str, place: str) -> Callable[..., Any]:
        if not self.resolve:
            return _placeholder(path)
        try:
            return _import(path, self.base_dir, self.prefixes)
        except ValueError as exc:
            raise self.error(place, str(exc)) from None

    def callables(self) -> Iterator[tuple[str, str]]:
        """(place, "module:attr") of every callable the spec names."""
        for i, t in enumerate(self.spec.tasks):
            if t.callable is not None:
                yield f"tasks[{i}].callable", t.callable
            if t.fanout is not None:
                yield f"tasks[{i}].fanout.items", t.fanout.items
                yield f"tasks[{i}].fanout.work", t.fanout.work

    def check_allowed(self) -> None:
        """Refuse every callable outside the allow-list at once, before any import."""
        if self.prefixes is None:
            return
        refused = [(place, why) for place, path in self.callables()
                   if (why := _refusal(path, self.prefixes)) is not None]
        if refused:
            raise SpecError(refused)

    def build(self) -> Flow:
        spec = self.spec
        self.check_allowed()
        for i, t in enumerate(spec.tasks):
            if t.name in self.index:
                raise self.error(f"tasks[{i}].name", f"task name {t.name!r} is already used by "
                                 f"tasks[{self.index[t.name]}]")
            self.index[t.name] = i
        for i, t in enumerate(spec.tasks):
            if t.fork is not None:
                jn = t.fork.join.name
                if jn in self.index or jn in self.join_of:
                    raise self.error(f"tasks[{i}].fork.join.name",
                                     f"join name {jn!r} is already used by another task")
                self.join_of[jn] = i
        for t in spec.tasks:
            self.node(t.name, "")
        for i, t in enumerate(spec.tasks):
            node = self.nodes[t.name]
            for j, f in enumerate(t.fathers):
                father = self.lookup(f.name, f"tasks[{i}].fathers[{j}]")
                if father is node:
                    raise self.error(f"tasks[{i}].fathers[{j}]", f"task {t.name!r} cannot be its "
                                     "own father")
                node.depends_on(father, optional=f.optional or self.is_optional(f.name))
        # every edge out of an optional task tolerates its failure
        for t in spec.tasks:
            if t.optional:
                src = self.nodes[t.name]
                for son in list(src.son_handler):
                    son.depends_on(src, optional=True)
        from taskflow.errors import CycleError
        from taskflow.model.graph import as_top_nodes, compile_plan

        try:
            compile_plan(as_top_nodes(list(self.nodes.values())))
        except CycleError as exc:
            first = exc.cycle[0]
            raise self.error(self.place_of(first), str(exc)) from None
        except FlowDefinitionError as exc:  # e.g. join 'any' on a task with no fathers
            message = str(exc)
            named = [n for n in self.nodes if f"node {n!r}" in message]
            raise self.error(self.place_of(named[0]) if named else "tasks", message) from None
        return Flow(spec, self.nodes)

    def is_optional(self, name: str) -> bool:
        i = self.index.get(name)
        return i is not None and self.spec.tasks[i].optional

    def place_of(self, name: str) -> str:
        if name in self.index:
            return f"tasks[{self.index[name]}]"
        if name in self.join_of:
            return f"tasks[{self.join_of[name]}].fork.join"
        return ""

    def unknown(self, name: str, place: str) -> SpecError:
        """The error for a reference to task ``name``, which the spec does not define."""
        names = list(self.index) + list(self.join_of)
        known = ", ".join(repr(n) for n in names)
        return self.error(place, f"unknown task {name!r}{did_you_mean(name, names)} (tasks: {known})")

    def lookup(self, name: str, place: str) -> SchedulingNode[Any, Any]:
        node = self.nodes.get(name)
        if node is None:
            raise self.unknown(name, place)
        return node

    def node(self, name: str, place: str) -> SchedulingNode[Any, Any]:
        """The node of task ``name``, built on first use (switches and forks build the tasks they
        name first)."""
        if name in self.nodes:
            return self.nodes[name]
        if name in self.join_of:
            self.node(self.spec.tasks[self.join_of[name]].name, place)
            return self.nodes[name]
        i = self.index.get(name)
        if i is None:
            raise self.unknown(name, place)
        if name in self.building:
            raise self.error(place, f"task {name!r} is part of its own switch case or fork branch")
        self.building.add(name)
        t = self.spec.tasks[i]
        where = f"tasks[{i}]"
        options: dict[str, Any] = {"timeout": t.timeout, "join": _join_policy(t.join)}
        try:
            if t.switch is not None:
                node = self.switch_node(t, t.switch, where, options)
            elif t.fork is not None:
                node = self.fork_node(t, t.fork, where, options)
            elif t.fanout is not None:
                node = self.fanout_node(t, t.fanout, where, options)
            else:
                fn = self.callable(t.callable or "", f"{where}.callable")
                node = FunctionNode(fn, t.param, name=name, retries=t.retries,
                                    retry_backoff=t.retry_backoff, **options)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise self.error(where, str(exc)) from None
        finally:
            self.building.discard(name)
        self.nodes[name] = node
        return node

    def switch_node(self, t: TaskSpec, switch: SwitchSpec, where: str, options: dict[str, Any]
                    ) -> SchedulingNode[Any, Any]:
        """A switch task's node, its cases' tasks built first."""
        from taskflow.kinds.switch import SwitchNode

        cases = {
            value: [self.node(n, f"{where}.switch.cases[{value!r}][{k}]")
                    for k, n in enumerate(targets)]
            for value, targets in switch.cases.items()
        }
        default = None
        if switch.default:
            default = [self.node(n, f"{where}.switch.default[{k}]")
                       for k, n in enumerate(switch.default)]
        fn = self.callable(t.callable or "", f"{where}.callable")
        return SwitchNode.of(fn, t.param, name=t.name, cases=cases, default=default,
                             retries=t.retries, retry_backoff=t.retry_backoff, **options)

    def fork_node(self, t: TaskSpec, fork: ForkSpec, where: str, options: dict[str, Any]
                  ) -> SchedulingNode[Any, Any]:
        """A fork task's node, its branches' tasks built first; its join node is added to the
        nodes under the join's name."""
        from taskflow.kinds.forkjoin import JoinNode, fork_join

        branches = [[self.node(n, f"{where}.fork.branches[{b}][{k}]")
                     for k, n in enumerate(branch)]
                    for b, branch in enumerate(fork.branches)]
        jspec = fork.join
        join = JoinNode(name=jspec.name, join=_join_policy(jspec.policy))
        if jspec.join_on is not None:
            inside = {n for branch in fork.branches for n in branch}
            for k, n in enumerate(jspec.join_on):
                if n not in inside:
                    raise self.error(f"{where}.fork.join.join_on[{k}]",
                                     f"{n!r} is not a task of the fork's branches")
        try:
            node = fork_join(branches, join, jspec.join_on, fork_name=t.name)
        except (FlowDefinitionError, TypeError) as exc:
            raise self.error(f"{where}.fork", str(exc)) from None
        if options["join"] != Join.ALL:
            node.join = options["join"]
        self.nodes[jspec.name] = join
        return node

    def fanout_node(self, t: TaskSpec, fan: FanOutSpec, where: str, options: dict[str, Any]
                    ) -> SchedulingNode[Any, Any]:
        """A fan-out task's node, with its items and work callables."""
        node = _SpecFanOut(t.param, name=t.name, max_concurrency=fan.max_concurrency,
                           item_timeout=fan.item_timeout, policy=fan.policy, **options)
        node.__dict__["items_fn"] = self.callable(fan.items, f"{where}.fanout.items")
        node.__dict__["work_fn"] = self.callable(fan.work, f"{where}.fanout.work")
        return node


class Flow:
    """A built flow spec: its nodes by name, ready to run.

    Attributes:
        spec: the FlowSpec.
        nodes: name -> node (tasks, and the join nodes of forks).
        name: the spec's name.
        timeout: the spec's default budget (None: no limit).
    """

    def __init__(self, spec: FlowSpec, nodes: dict[str, SchedulingNode[Any, Any]]) -> None:
        self.spec = spec
        self.nodes = nodes
        self.name = spec.name
        self.timeout = spec.timeout

    def __getitem__(self, name: str) -> SchedulingNode[Any, Any]:
        return self.nodes[name]

    def start(self, *, executor: Executor, timeout: float | None = None,
              context: TaskContext | None = None) -> FlowResult:
        """Run the flow (``TaskScheduling.start``) under the spec's name (the run's flow name in
        its report, logs, traces and statistics); ``timeout`` None uses the spec's budget."""
        budget = self.timeout if timeout is None else timeout
        return TaskScheduling.start(list(self.nodes.values()), executor=executor, timeout=budget,
                                    context=context, name=self.name or None)

    def to_mermaid(self, result: FlowResult | None = None) -> str:
        """A Mermaid flowchart of the flow (coloured by state for a run ``result``)."""
        from taskflow.observe.viz import definition_to_mermaid

        return definition_to_mermaid(list(self.nodes.values()), result=result, title=self.name)

    def to_dot(self, result: FlowResult | None = None) -> str:
        """A Graphviz DOT graph of the flow (coloured by state for a run ``result``)."""
        from taskflow.observe.viz import to_dot

        return to_dot(list(self.nodes.values()), result=result, title=self.name)

    def __repr__(self) -> str:
        return f"<Flow {self.name!r} nodes={len(self.nodes)}>"


def load_spec(source: Any, *, build: bool = True, resolve: bool = True,
              allow_modules: Iterable[str] | None = None, import_spec_dir: bool = False) -> Any:
    """Read and validate a flow spec.

    A spec names code (``module:function``) and building it imports those modules: treat a
    spec like code, or limit it with ``allow_modules`` (``docs/security.md``).

    Args:
        source: a dict, JSON text (a str starting with ``{``), or a path to a ``.json``,
            ``.yaml`` or ``.yml`` file (YAML needs PyYAML: ``pip install taskflow-juc[yaml]``).
        build: return the built ``Flow`` (True) or the [`FlowSpec`][taskflow.FlowSpec] (False).
        resolve: import the callables (see [`FlowSpec.build`][taskflow.FlowSpec.build]).
        allow_modules: None trusts the spec; a sequence of module-name prefixes refuses every
            other callable, naming it and its place, before anything is imported (see
            [`FlowSpec.build`][taskflow.FlowSpec.build]). Checked with ``build=False`` and ``resolve=False`` too.
        import_spec_dir: when ``source`` is a file, also import task modules that are not on
            ``sys.path`` from the file's folder (put on ``sys.path`` for that import only).
            Off by default: ``sys.path`` is never changed unless asked.

    Raises:
        SpecError: the document is invalid (each error names its place); it cannot be read or
            parsed; YAML without PyYAML; a callable outside ``allow_modules``.
        TypeError: ``source`` or ``allow_modules`` of the wrong type.
    """
    prefixes = _allow_list(allow_modules)
    text: str | None = None
    origin: str | None = None
    base_dir: str | None = None
    if isinstance(source, Mapping):
        data: Any = source
    elif isinstance(source, (str, os.PathLike)):
        if isinstance(source, str) and source.lstrip().startswith("{"):
            text, origin = source, None
            data = _parse_json(text, None)
        else:
            path = Path(source)
            origin = str(path)
            try:
                text = path.read_text(encoding="utf-8")
                if import_spec_dir:
                    base_dir = str(path.resolve().parent)
            except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, not UTF-8
                raise SpecError([("", f"cannot read {_short(str(path))}: {exc}")]) from None
            if path.suffix.lower() in (".yaml", ".yml"):
                data = _parse_yaml(text, origin)
            else:
                data = _parse_json(text, origin)
    else:
        raise TypeError(f"source must be a mapping, JSON text or a path, got {type(source).__name__}")
    spec = FlowSpec.parse(data, source=origin, text=text)
    try:
        if not build:
            if prefixes is not None:
                _Builder(spec, False, None, prefixes).check_allowed()
            return spec
        return spec.build(resolve=resolve, base_dir=base_dir, allow_modules=prefixes)
    except SpecError as exc:
        if origin is None:
            raise
        finder = _line_finder(text)
        errors = exc.errors
        if not import_spec_dir:
            hint = (" (the spec's folder is searched only with import_spec_dir=True, "
                    "on the command line --import-file-dir)")
            errors = [(place, msg + hint if msg.startswith("cannot import module") else msg)
                      for place, msg in errors]
        if finder is not None:
            errors = [(_with_line(place, finder), msg) for place, msg in errors]
        raise SpecError(errors, origin) from None


def _with_line(place: str, finder: Callable[[tuple[Any, ...]], int | None]) -> str:
    loc: list[Any] = []
    for part in place.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("[") and part.endswith("]") and part[1:-1].isascii() \
                and part[1:-1].isdigit():
            loc.append(int(part[1:-1]))
        elif part.startswith("["):
            break  # a case key: stop at its block
        else:
            loc.append(part)
    line = finder(tuple(loc)) if loc else None
    return place + (f" (line {line})" if line else "")


def _parse_json(text: str, origin: str | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError([(f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}")],
                        origin) from None
    except RecursionError:
        raise SpecError([("", "invalid JSON: nested too deeply")], origin) from None
    except ValueError as exc:  # an integer too long to convert (sys.set_int_max_str_digits)
        raise SpecError([("", f"invalid JSON: {exc}")], origin) from None


def _parse_yaml(text: str, origin: str | None) -> Any:
    try:
        yaml = _yaml()
    except ImportError:
        need = ("reading YAML needs PyYAML: pip install 'taskflow-juc[yaml]' "
                "(or write the spec as JSON)")
        raise SpecError([("", need)], origin) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        place = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([(place, f"invalid YAML: {problem}")], origin) from None
    except RecursionError:
        raise SpecError([("", "invalid YAML: nested too deeply")], origin) from None
    except ValueError as exc:  # an integer too long to convert (sys.set_int_max_str_digits)
        raise SpecError([("", f"invalid YAML: {exc}")], origin) from None

