"""The engine's structure: the join rule table, the state table, module boundaries, ``repr``."""

from __future__ import annotations

import ast
import pathlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import LONG

import taskflow
from taskflow import FunctionNode, TaskScheduling
from taskflow.engine import executors, run
from taskflow.joins import ALL, ANY, BEST_EFFORT, FAIL, FIRE, QUORUM, SKIP, WAIT, decide

# --- joins.decide: the whole join rule as a table -----------------------------------------------

# (kind, k, nfathers, left, nsucc, nskip, nfail) -> decision
JOIN_TABLE = [
    # ALL: every required father must succeed; a required failure fails at once
    ((ALL, 0, 3, 2, 1, 0, 0), WAIT),
    ((ALL, 0, 3, 0, 3, 0, 0), FIRE),
    ((ALL, 0, 3, 2, 0, 0, 1), FAIL),
    ((ALL, 0, 3, 0, 2, 1, 0), FIRE),  # a skipped father is ignored
    ((ALL, 0, 2, 0, 1, 0, 0), FIRE),  # the other one failed but was optional (nfail 0)
    ((ALL, 0, 2, 0, 0, 2, 0), SKIP),  # every father skipped
    # ANY: the first success fires; every father failing fails
    ((ANY, 0, 3, 2, 1, 0, 0), FIRE),
    ((ANY, 0, 3, 1, 0, 0, 1), WAIT),
    ((ANY, 0, 3, 0, 0, 1, 1), FAIL),
    ((ANY, 0, 3, 0, 0, 3, 0), SKIP),
    # QUORUM(k): k successes fire; k out of reach fails at once
    ((QUORUM, 2, 4, 2, 2, 0, 0), FIRE),
    ((QUORUM, 2, 4, 2, 1, 0, 1), WAIT),
    ((QUORUM, 3, 4, 1, 1, 0, 2), FAIL),
    ((QUORUM, 2, 3, 0, 1, 1, 1), FAIL),
    # BEST_EFFORT: fires once every father is terminal, whatever it was
    ((BEST_EFFORT, 0, 3, 1, 0, 0, 2), WAIT),
    ((BEST_EFFORT, 0, 3, 0, 0, 0, 3), FIRE),
    ((BEST_EFFORT, 0, 2, 0, 0, 2, 0), SKIP),
]


@pytest.mark.parametrize(("counts", "expected"), JOIN_TABLE)
def test_join_decision_table(counts, expected):
    assert decide(*counts) == expected


# --- the node state table -------------------------------------------------------------------------


def test_state_table_is_closed_and_terminal_states_are_final():
    table = run.LEGAL_MOVES
    assert set(table) == set(range(len(run.STATE_NAMES)))
    assert all(t in table for moves in table.values() for t in moves)
    assert table[run.SETTLED] == frozenset()
    assert table[run.TERMINAL] == frozenset({run.SETTLED})
    for old, moves in table.items():
        assert old not in moves, f"{run.STATE_NAMES[old]} -> itself is not a move"


def _a_run(executor) -> run.Run:
    node = FunctionNode(lambda c, p: 1, name="only")
    from taskflow.graph import compile_plan

    plan = compile_plan((node,))
    return run.Run(plan, executor, 1.0, taskflow.TaskContext(), None,
                   executors.capabilities(executor))


def test_an_illegal_move_raises_with_the_debug_switch_on(make_executor):
    r = _a_run(make_executor(1))
    with r.lock:
        r.move(0, run.QUEUED)
        with pytest.raises(run.IllegalMoveError, match="'only'.*QUEUED -> SETTLED"):
            r.move(0, run.SETTLED)


def test_an_illegal_move_is_logged_with_the_debug_switch_off(make_executor, taskflow_logs):
    r = _a_run(make_executor(1))
    run.set_strict(False)
    try:
        with r.lock:
            r.move(0, run.TERMINAL)
            r.move(0, run.RUNNING)
    finally:
        run.set_strict(True)
    assert any("illegal move" in str(rec["message"]) for rec in taskflow_logs)


def test_a_stuck_run_reads_well_in_a_log_line(make_executor, gate):
    release, started = gate(), gate()

    def slow(ctx, param):
        started.set()
        release.wait(LONG)
        return 1

    a = FunctionNode(slow, name="slow_backend")
    a >> FunctionNode(lambda c, p: 2, name="render")
    seen: list[str] = []

    def peek(ctx, param):
        started.wait(LONG)
        seen.append(repr(ctx._view()))  # white box: the run behind the context
        release.set()

    ctx = taskflow.TaskContext()
    fut = TaskScheduling.submit(a, executor=make_executor(2), timeout=LONG, context=ctx)
    threading.Thread(target=peek, args=(ctx, None), name="peek").start()
    fut.result(LONG)
    text = seen[0]
    assert text.startswith("<Run ") and "open" in text
    assert "RUNNING=1" in text and "WAITING=1" in text and "'slow_backend'" in text


# --- executor capabilities ------------------------------------------------------------------------


def test_capabilities_read_through_wrappers_and_a_declared_protocol(make_executor):
    pool = make_executor(3)
    assert executors.capabilities(pool) == executors.Capabilities(3, False)
    mon = taskflow.MonitoredExecutor(pool)
    assert executors.capabilities(mon).parallelism == 3
    assert executors.same_executor(mon, pool)

    class Declared(ThreadPoolExecutor):
        def taskflow_capabilities(self) -> executors.Capabilities:
            return executors.Capabilities(7, False)

    with Declared(1) as d:
        assert executors.capabilities(d).parallelism == 7


# --- module boundaries ----------------------------------------------------------------------------

ROOT = pathlib.Path(taskflow.__file__).parent


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return out


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements run when the module is imported, ``if TYPE_CHECKING:`` blocks included
    (not function bodies: an import there is deferred on purpose, the lazy loading of heavy or
    presentational parts such as ``FlowResult.report()`` or ``to_html()``)."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        stmt = todo.pop()
        out.append(stmt)
        if isinstance(stmt, (ast.If, ast.Try)):
            todo += stmt.body + stmt.orelse
            if isinstance(stmt, ast.Try):
                for h in stmt.handlers:
                    todo += h.body
    return out


def _imports(name: str, tree: ast.Module, known: set[str],
             everywhere: bool = False) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every module-level import, type-only ones
    included (``everywhere``: function bodies too)."""
    found = []
    stmts = list(ast.walk(tree)) if everywhere else _module_level(tree)
    for node in stmts:
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("taskflow")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("taskflow"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in known:
                    found.append((sub, []))
                else:
                    found.append((node.module, [a.name]))
    return found


ENGINE_MODULES = {"taskflow.engine", "taskflow.engine.run", "taskflow.engine.loops",
                  "taskflow.engine.inline", "taskflow.engine.remote",
                  "taskflow.engine.executors", "taskflow.engine.timer", "taskflow.context",
                  "taskflow.node", "taskflow.result", "taskflow.report", "taskflow.joins",
                  "taskflow.graph", "taskflow.scheduling", "taskflow.fanout", "taskflow.switch",
                  "taskflow.forkjoin", "taskflow.errors"}


def test_no_module_imports_another_modules_private_names():
    mods = _modules()
    bad = [(name, target, n) for name in ENGINE_MODULES for target, names in
           _imports(name, mods[name], set(mods), everywhere=True) for n in names
           if n.startswith("_") and n != "__version__"]
    assert not bad


def test_no_import_cycles_type_only_imports_included():
    # module-level imports, ``if TYPE_CHECKING:`` ones included, form no cycle
    mods = _modules()
    known = set(mods)
    graph = {name: {t for t, _ in _imports(name, tree, known) if t in known and t != name}
             for name, tree in mods.items()}
    # a package's __init__ is imported with any of its modules: count that edge too
    for name in list(graph):
        parent = name.rpartition(".")[0]
        if parent in graph and parent != "taskflow" and name != parent:
            graph[name].add(parent)
    cycles = []
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(path[path.index(m):] + [m] if m in path else [n, m])
            elif m not in state:
                visit(m, [*path, m])
        state[n] = 2

    for n in sorted(ENGINE_MODULES):
        if n not in state:
            visit(n, [n])
    assert not cycles, cycles


def test_the_engine_package_imports_none_of_the_model_modules_privately():
    # the facade and the engine never reach into ThreadPool's or the executor's private state
    for name in ("taskflow.engine.run", "taskflow.scheduling", "taskflow.fanout"):
        source = (ROOT.parent / (name.replace(".", "/") + ".py")).read_text()
        assert "_max_workers" not in source and "_Run" not in source


def test_future_protocol_of_a_loop_is_checked():
    # a submit that returns something else than a Future is a refusal, named, not an AttributeError
    class NoneExecutor(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
            return None

    with NoneExecutor(1) as ex:
        result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="n"), executor=ex,
                                      timeout=LONG)
    exc = result.result_of("n").exception
    assert isinstance(exc, TypeError) and "NoneExecutor.submit returned NoneType" in str(exc)
    assert isinstance(Future(), Future)


def test_node_kinds_are_declared_with_the_public_protocol() -> None:
    """Classes say what they are with ``node_kind``/``choose_sons``/``draw_as``, not private flags
    (only node.py keeps the mapping for user classes written before NodeKind)."""
    import pathlib

    import taskflow

    root = pathlib.Path(taskflow.__file__).parent
    offenders = [
        f"{path.relative_to(root)}: {flag}"
        for path in root.rglob("*.py") if path.name != "node.py"
        for flag in ("_routes_sons", "_fans_out", "_viz_kind", "def _choose(")
        if flag in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_draw_as_picks_the_diagram_shape() -> None:
    from taskflow import FunctionNode
    from taskflow.viz import to_dot

    class Gate(FunctionNode):
        draw_as = "join"

    a = FunctionNode(lambda ctx, p: 1, name="a")
    g = Gate(lambda ctx, p: 2, name="g")
    a.set_son_handler(g)
    dot = to_dot(a)
    assert 'n1 [label="g", shape=invtrapezium];' in dot  # the join shape
    assert 'n0 [label="a"];' in dot  # a task keeps the default shape
