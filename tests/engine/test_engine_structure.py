"""The engine's structure: the join rule table, the state table, module boundaries, ``repr``."""

from __future__ import annotations

import pathlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from conftest import LONG

import taskflow
from taskflow import FunctionNode, TaskScheduling
from taskflow.engine import executors, run, states
from taskflow.model.joins import ALL, ANY, BEST_EFFORT, FAIL, FIRE, QUORUM, SKIP, WAIT, decide

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
    table = states.LEGAL_MOVES
    assert set(table) == set(range(len(states.STATE_NAMES)))
    assert all(t in table for moves in table.values() for t in moves)
    assert table[states.SETTLED] == frozenset()
    assert table[states.TERMINAL] == frozenset({states.SETTLED})
    for old, moves in table.items():
        assert old not in moves, f"{states.STATE_NAMES[old]} -> itself is not a move"


def test_guards_loaded_on_its_own_sees_the_real_node_codes() -> None:
    # a fresh copy of guards.py, which no run.py module initialises: it reads the same codes,
    # from the one module that defines them (no globals another module must overwrite)
    import importlib.util

    from taskflow.engine import guards

    spec = importlib.util.spec_from_file_location("guards_alone", guards.__file__)
    assert spec is not None and spec.loader is not None
    alone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alone)
    codes = [alone.QUEUED, alone.RUNNING, alone.PARKED_STATE, alone.NO_LOOP]
    assert codes == [states.QUEUED, states.RUNNING, states.PARKED, states.NO_LOOP]
    assert len(set(codes)) == len(codes)


def _a_run(executor) -> run.Run:
    node = FunctionNode(lambda c, p: 1, name="only")
    from taskflow.model.graph import compile_plan

    plan = compile_plan((node,))
    return run.Run(plan, executor, 1.0, taskflow.TaskContext(), None,
                   executors.capabilities(executor))


def test_the_fields_a_run_writes_at_creation_are_slots(make_executor):
    # the instance dict holds only the fields of the run's mode (``__init__`` makes them) and
    # those written later: building a run does not grow a dict of every field
    r = _a_run(make_executor(1))
    assert set(vars(r)) <= {"unstarted", "live", "loop_futs", "remote_futs", "outer"}
    assert len(run.Run.__slots__) < 40
    r.closed = True  # a field with a class-level default is the run's own once written
    assert vars(r)["closed"] is True and run.Run.closed is False


def test_an_illegal_move_raises_with_the_debug_switch_on(make_executor):
    r = _a_run(make_executor(1))
    with r.lock:
        r.move(0, states.QUEUED)
        with pytest.raises(states.IllegalMoveError, match="'only'.*QUEUED -> SETTLED"):
            r.move(0, states.SETTLED)


def test_an_illegal_move_is_logged_with_the_debug_switch_off(make_executor, taskflow_logs):
    r = _a_run(make_executor(1))
    run.set_strict(False)
    try:
        with r.lock:
            r.move(0, states.TERMINAL)
            r.move(0, states.RUNNING)
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


# --- module boundaries (the import rules for every module are in tests/structure/test_layering.py)

ROOT = pathlib.Path(taskflow.__file__).parent


def test_the_engine_package_imports_none_of_the_model_modules_privately():
    # the facade and the engine never reach into ThreadPool's or the executor's private state
    for name in ("taskflow.engine.run", "taskflow.scheduling", "taskflow.kinds.fanout"):
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
    from taskflow.observe.viz import to_dot

    class Gate(FunctionNode):
        draw_as = "join"

    a = FunctionNode(lambda ctx, p: 1, name="a")
    g = Gate(lambda ctx, p: 2, name="g")
    a.set_son_handler(g)
    dot = to_dot(a)
    assert 'n1 [label="g", shape=invtrapezium];' in dot  # the join shape
    assert 'n0 [label="a"];' in dot  # a task keeps the default shape


# --- the engine's size limits (measured with radon and ast) ---------------------------------------

ENGINE = ROOT / "engine"
MAX_COMPLEXITY = 25
MAX_RUN_METHODS = 45
MAX_MODULE_LINES = 1000


def test_no_engine_function_is_more_complex_than_the_limit() -> None:
    from radon.complexity import cc_visit

    def blocks(path: pathlib.Path):  # functions, and the methods inside classes
        for block in cc_visit(path.read_text(encoding="utf-8")):
            yield block
            yield from getattr(block, "methods", ())

    too_complex = sorted(
        f"{path.name}:{block.fullname} {block.complexity}"
        for path in ENGINE.glob("*.py") for block in blocks(path)
        if block.complexity > MAX_COMPLEXITY and not hasattr(block, "methods"))
    assert too_complex == []


def _methods_of_run() -> list[str]:
    import ast

    tree = ast.parse((ENGINE / "run.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Run"]
    return [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_run_has_at_most_the_limit_of_methods() -> None:
    assert len(_methods_of_run()) <= MAX_RUN_METHODS


def test_no_engine_module_is_longer_than_the_limit() -> None:
    long = {path.name: n for path in ENGINE.glob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_every_engine_module_but_run_is_within_the_line_limit() -> None:
    long = {path.name: n for path in ENGINE.glob("*.py") if path.name != "run.py"
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}
