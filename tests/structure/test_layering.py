"""The house rules of the package, read from its sources with ``ast``.

Every module of ``taskflow`` belongs to one *part*, named by its folder (a top-level module is a
leaf of the base, the facade, the root or the command line's entry). A part may import only the
parts its row of ``ALLOWED`` names, whatever the kind of import: at module level, under ``if
TYPE_CHECKING:`` or inside a function. The only lazy upward import allowed is
``FlowResult.to_html``/``to_mermaid`` loading the observability modules that draw a run. No import
cycle exists between modules, counting all three kinds, and no module takes another module's
private name.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import taskflow

ROOT = pathlib.Path(taskflow.__file__).parent

BASE, ROOT_PART, FACADE, CLI = "base", "root", "facade", "cli"
MODEL, KINDS, ENGINE, POOLS = "model", "kinds", "engine", "pools"
RESILIENCE, OBSERVE, DECLARE = "resilience", "observe", "declare"
HTTP = "http"
TESTING = "testing"
CACHE = "cache"

# top-level modules: the leaves, the facade, the root and ``python -m taskflow``
TOP_LEVEL = {
    "taskflow": ROOT_PART,
    "taskflow.__main__": CLI,
    "taskflow._fork": BASE,
    "taskflow._version": BASE,
    "taskflow.clock": BASE,
    "taskflow.errors": BASE,
    "taskflow.exposition": BASE,
    "taskflow.logs": BASE,
    "taskflow.metrics": BASE,
    "taskflow.scheduling": FACADE,
}
FOLDERS = {CLI, MODEL, KINDS, ENGINE, POOLS, RESILIENCE, OBSERVE, DECLARE, HTTP, TESTING, CACHE}

# part -> the parts it may import (its own always allowed)
ALLOWED: dict[str, set[str]] = {
    CLI: {ROOT_PART, FACADE, DECLARE, MODEL, POOLS, OBSERVE, BASE},
    ROOT_PART: {FACADE, MODEL, KINDS, BASE, POOLS, RESILIENCE, OBSERVE, DECLARE, HTTP},
    DECLARE: {FACADE, MODEL, KINDS, OBSERVE, BASE},
    # the test kit: an executor that declares its capabilities, the facade it drives
    TESTING: {FACADE, ENGINE, MODEL, BASE},
    OBSERVE: {MODEL, KINDS, ENGINE, POOLS, RESILIENCE, BASE},
    FACADE: {ENGINE, MODEL, BASE},
    KINDS: {MODEL, ENGINE, BASE},
    ENGINE: {MODEL, RESILIENCE, BASE},
    MODEL: {RESILIENCE, BASE},
    # clients that clamp a node's calls to its deadline: they read the asking context only
    HTTP: {MODEL, BASE},
    POOLS: {BASE},
    RESILIENCE: {BASE},
    # the public home of the caches: a re-export of the resilience part
    CACHE: {RESILIENCE},
    BASE: set(),
}
# the root imports these parts only lazily (inside functions or for type checkers), so that
# ``import taskflow`` stays light
LAZY_ONLY: dict[str, set[str]] = {ROOT_PART: {KINDS, POOLS, RESILIENCE, OBSERVE, DECLARE, HTTP}}
# observability sees the engine through its instrumentation points only
ENGINE_FOR_OBSERVE = {"taskflow.engine.events", "taskflow.engine.inflight",
                      "taskflow.engine.looplag"}
# (importer, function) -> modules it may import lazily against the table
LAZY_EXCEPTIONS = {
    ("taskflow.model.result", "to_html"): {"taskflow.observe.html"},
    ("taskflow.model.result", "to_mermaid"): {"taskflow.observe.viz"},
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, tuple[pathlib.Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(encoding="utf-8"), str(p)))
            for p in sorted(ROOT.rglob("*.py"))}


def part_of(name: str) -> str:
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    folder = name.split(".")[1]
    assert folder in FOLDERS, f"module {name!r} is in no part: add its folder to FOLDERS"
    return folder


class Import:
    """One import of a taskflow module by another: where, what, and how."""

    def __init__(self, source: str, target: str, names: list[str], line: int, kind: str,
                 function: str | None) -> None:
        self.source, self.target, self.names = source, target, names
        self.line, self.kind, self.function = line, kind, function

    def __repr__(self) -> str:
        where = f" in {self.function}()" if self.function else ""
        return f"{self.source}:{self.line} ({self.kind}{where}) -> {self.target}"


def imports(name: str, path: pathlib.Path, tree: ast.Module, known: set[str]) -> Iterator[Import]:
    """Every import of a taskflow module in ``tree``: ``kind`` is "module" (runs at import),
    "typing" (under ``if TYPE_CHECKING:``) or "function" (inside a function body)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(node: ast.AST, kind: str, function: str | None) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(child, "function", function or child.name)
                continue
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "typing", function)
                yield from walk(ast.Module(body=child.orelse, type_ignores=[]), kind, function)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "taskflow":
                        yield Import(name, alias.name, [], child.lineno, kind, function)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")
                    up = up[:len(up) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] != "taskflow":
                    continue
                taken: list[str] = []
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:  # ``from taskflow.engine import events``: the module
                        yield Import(name, sub, [], child.lineno, kind, function)
                    else:
                        taken.append(alias.name)
                if taken:
                    yield Import(name, base, taken, child.lineno, kind, function)
            yield from walk(child, kind, function)

    yield from walk(tree, "module", None)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def all_imports() -> list[Import]:
    mods = modules()
    known = set(mods)
    found = [imp for name, (path, tree) in mods.items() for imp in imports(name, path, tree, known)]
    unknown = [imp for imp in found if imp.target not in known]
    assert not unknown, f"imports of modules that do not exist: {unknown}"
    return found


def is_exception(imp: Import) -> bool:
    return imp.function is not None and imp.target in LAZY_EXCEPTIONS.get(
        (imp.source, imp.function), set())


def test_every_module_belongs_to_a_part() -> None:
    assert {part_of(name) for name in modules()} == set(ALLOWED)


def test_top_level_holds_leaves_the_facade_and_the_root_only() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 10, top
    assert {module_name(ROOT / n) for n in top} == set(TOP_LEVEL)
    packages = [p for p in ROOT.iterdir() if (p / "__init__.py").exists()]
    assert len(packages) >= 6


def test_imports_follow_the_allowed_arrows() -> None:
    bad = []
    for imp in all_imports():
        src, dst = part_of(imp.source), part_of(imp.target)
        if src == dst or is_exception(imp):
            continue
        if dst not in ALLOWED[src]:
            bad.append(f"{imp}: {src} may not import {dst}")
        elif dst in LAZY_ONLY.get(src, set()) and imp.kind == "module":
            bad.append(f"{imp}: {src} imports {dst} only lazily")
        elif src == OBSERVE and dst == ENGINE and imp.target not in ENGINE_FOR_OBSERVE:
            bad.append(f"{imp}: observability sees the engine through its events only")
    assert not bad, "\n".join(bad)


def test_the_allowed_lazy_imports_are_lazy_and_still_there() -> None:
    # the exceptions name real function-level imports (a stale entry would hide a new one)
    used = {(imp.source, imp.function, imp.target) for imp in all_imports() if is_exception(imp)}
    listed = {(src, fn, t) for (src, fn), targets in LAZY_EXCEPTIONS.items() for t in targets}
    assert used == listed


def test_no_import_cycle_of_any_kind() -> None:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for imp in all_imports():
        if imp.target != imp.source and not is_exception(imp):
            graph[imp.source].add(imp.target)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_takes_another_modules_private_names() -> None:
    bad = [f"{imp}: {n}" for imp in all_imports() for n in imp.names
           if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_the_checker_sees_all_three_kinds_of_import() -> None:
    # the table is only as good as the reader: a sample module with one import of each kind
    source = (
        "from typing import TYPE_CHECKING\n"
        "from taskflow.model import node\n"
        "if TYPE_CHECKING:\n"
        "    from taskflow.engine.run import Run\n"
        "def f():\n"
        "    from taskflow.observe.viz import to_dot\n"
        "    import taskflow.pools.threadpool\n"
    )
    known = set(modules())
    found = list(imports("taskflow.model.sample", ROOT / "model" / "sample.py",
                         ast.parse(source), known))
    assert [(i.target, i.kind, i.function) for i in found] == [
        ("taskflow.model.node", "module", None),
        ("taskflow.engine.run", "typing", None),
        ("taskflow.observe.viz", "function", "f"),
        ("taskflow.pools.threadpool", "function", "f"),
    ]


# -- nothing is imported inside a run ------------------------------------------------------------
# A run's modules (the engine, the facade, the kinds) import what they need at module level. The
# function-level imports they keep load modules that are in ``sys.modules`` before any run that
# reaches them: the resilience modules of a node's options (imported with its ``NodePolicy``
# when the node is built, see ``test_what_a_run_imports_lazily_is_loaded_with_the_node_policy``)
# and, off the thread-pool path, what a process pool or an event loop has loaded already.
RUN_PARTS = {ENGINE, FACADE, KINDS}
LAZY_IN_A_RUN_OUTSIDE_TASKFLOW = {
    # (module, function) -> modules: the caller's event loop has asyncio; the run's clock starts
    # after the import
    ("taskflow.scheduling", "run_async"): {"asyncio"},
    # async nodes: building an async node (or compiling a plan with one) loads asyncio
    # (``model.node.load_asyncio``); a program that gives its loop has it loaded
    ("taskflow.engine.aio", "get"): {"asyncio"},
    ("taskflow.engine.aio", "serve"): {"asyncio"},
    ("taskflow.engine.aio", "set_event_loop"): {"asyncio"},
    ("taskflow.engine.aio", "task_ended"): {"asyncio"},  # an async batch call's end
    # process pools: multiprocessing has pickle; loky and dask ship and load cloudpickle
    ("taskflow.engine.executors", "pickler"): {"pickle", "cloudpickle"},
    ("taskflow.engine.remote", "_round_trip"): {"pickle", "cloudpickle"},
    ("taskflow.engine.remote", "remote_work"): {"pickle"},
}


def _function_level_imports_outside_taskflow() -> set[tuple[str, str, str]]:
    found = set()
    for name, (_, tree) in modules().items():
        if part_of(name) not in RUN_PARTS:
            continue

        def walk(node: ast.AST, function: str | None, module: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    walk(child, function or child.name)
                    continue
                if function and isinstance(child, ast.Import):
                    found.update((module, function, a.name) for a in child.names
                                 if a.name.split(".")[0] != "taskflow")
                elif (function and isinstance(child, ast.ImportFrom) and not child.level
                      and (child.module or "").split(".")[0] != "taskflow"):
                    found.add((module, function, child.module or ""))
                walk(child, function)

        walk(tree, None)
    return found


def test_a_runs_modules_import_no_other_library_inside_functions_but_the_listed() -> None:
    listed = {(m, f, t) for (m, f), targets in LAZY_IN_A_RUN_OUTSIDE_TASKFLOW.items()
              for t in targets}
    assert _function_level_imports_outside_taskflow() == listed


def test_what_a_run_imports_lazily_is_loaded_with_the_node_policy() -> None:
    # every taskflow module a run's module imports inside a function is one that building a
    # node with options has loaded (``resilience.policy``'s module-level imports, transitively)
    found = all_imports()
    eager: dict[str, set[str]] = {}
    for imp in found:
        if imp.kind == "module":
            eager.setdefault(imp.source, set()).add(imp.target)
    loaded, todo = set(), ["taskflow.resilience.policy"]
    while todo:
        mod = todo.pop()
        if mod not in loaded:
            loaded.add(mod)
            todo.extend(eager.get(mod, ()))
    lazy = {imp for imp in found if imp.kind == "function" and part_of(imp.source) in RUN_PARTS}
    assert lazy, "the checker found no function-level import in a run's modules"
    assert [imp for imp in lazy if imp.target not in loaded] == []
