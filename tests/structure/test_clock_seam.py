"""All time goes through ``taskflow.clock``, read from the sources with ``ast``.

No module of ``taskflow`` but ``clock.py`` reads a clock of the ``time`` module (``monotonic``,
``time``, ``sleep``, ``perf_counter``, the ``_ns`` forms, CPU clocks), reads "now" implicitly
(``datetime.now()``, ``time.strftime(fmt)``, ``time.localtime()``), starts a ``threading.Timer``
or waits with a timeout: ``.wait(t)``, ``.wait_for(pred, t)``, ``.get(timeout=t)``,
``.put(..., timeout=t)``, ``.join(t)``, ``.acquire(timeout=t)``/``.acquire(True, t)``,
``.result(t)``. A zero timeout is a poll, not a wait, and is allowed; a ``.join`` of one
argument is a string's unless its receiver could be a thread (not a string constant nor a
module-level name bound to one).
"""

from __future__ import annotations

import ast
import pathlib

import taskflow

ROOT = pathlib.Path(taskflow.__file__).parent
SEAM = ROOT / "clock.py"

# clocks of the ``time`` module: reading one (or naming it, to call later) is reading time
TIME_CLOCKS = {
    "monotonic", "monotonic_ns", "time", "time_ns", "sleep", "perf_counter", "perf_counter_ns",
    "process_time", "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime",
    "clock_gettime_ns",
}
# functions of ``time`` that read the current time when given no time of their own
IMPLICIT_NOW = {"localtime": 0, "gmtime": 0, "ctime": 0, "asctime": 0, "strftime": 1}
DATETIME_NOW = {"now", "utcnow", "today"}
ASYNCIO_TIMED = {"sleep", "timeout", "timeout_at"}
LOOP_TIMED = {"call_later", "call_at"}


def _is_poll(value: ast.expr) -> bool:
    """A timeout that does not wait: ``None`` waits forever (not timed), ``0`` polls."""
    return isinstance(value, ast.Constant) and (value.value is None or value.value == 0)


def _timeout_kw(call: ast.Call) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "timeout":
            return kw.value
    return None


def _string_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to a string constant (``_SEP = " | "``)."""
    names: set[str] = set()
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return names


def _taskflow_names(tree: ast.Module) -> set[str]:
    """Names bound to what a module imports from taskflow (``clock``, ``closing``): their
    functions named ``wait`` or ``get`` are the seam's or the engine's, not a stdlib wait."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0]
                                                 == "taskflow"):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _timed_wait(call: ast.Call, strings: set[str], ours: set[str]) -> str | None:
    """What kind of timed wait ``call`` is (``None``: none)."""
    if not isinstance(call.func, ast.Attribute) or (
            isinstance(call.func.value, ast.Name) and call.func.value.id in ours):
        return None
    attr, args, kw = call.func.attr, call.args, _timeout_kw(call)
    timed = kw is not None and not _is_poll(kw)
    if attr == "wait":
        timed = timed or (len(args) >= 1 and not _is_poll(args[-1]))
    elif attr == "wait_for":
        timed = timed or (len(args) >= 2 and not _is_poll(args[1]))
    elif attr == "get":
        timed = timed or (len(args) == 2 and isinstance(args[0], ast.Constant)
                          and args[0].value is True and not _is_poll(args[1]))
    elif attr == "put":
        pass  # ``put(item, block, timeout)`` is rare beside ``put(a, b, c)`` of other objects
    elif attr == "join":
        receiver = call.func.value
        stringy = (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)) or (
            isinstance(receiver, ast.Name) and receiver.id in strings)
        timed = timed or (len(args) == 1 and not stringy and not _is_poll(args[0]))
    elif attr == "acquire":
        timed = timed or (len(args) == 2 and not _is_poll(args[1]))
    elif attr == "result":
        timed = timed or (len(args) == 1 and not _is_poll(args[0]))
    elif attr in LOOP_TIMED:
        timed = True
    else:
        return None
    return f".{attr}() with a timeout" if timed else None


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Every reading of time or timed wait in ``source`` (``file:line: what``)."""
    tree = ast.parse(source, filename)
    time_names: set[str] = set()  # names bound to the time module
    dt_names: set[str] = {"datetime", "date"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    time_names.add(alias.asname or "time")
    strings, ours = _string_names(tree), _taskflow_names(tree)
    found: list[str] = []

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time" and node.level == 0:
            for alias in node.names:
                if alias.name in TIME_CLOCKS or alias.name in IMPLICIT_NOW or alias.name == "*":
                    report(node, f"from time import {alias.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in time_names and node.attr in TIME_CLOCKS:
                report(node, f"time.{node.attr}")
            elif node.value.id == "asyncio" and node.attr in ASYNCIO_TIMED:
                report(node, f"asyncio.{node.attr}")
            elif node.value.id == "threading" and node.attr == "Timer":
                report(node, "threading.Timer")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if isinstance(func.value, ast.Name) and func.value.id in time_names:
            given = IMPLICIT_NOW.get(func.attr)
            if given is not None and len(node.args) <= given:
                report(node, f"time.{func.attr}() of the current time")
        receiver = func.value
        if isinstance(receiver, ast.Attribute):  # datetime.datetime.now()
            receiver = ast.Name(id=receiver.attr)
        if (func.attr in DATETIME_NOW and isinstance(receiver, ast.Name)
                and receiver.id in dt_names):
            report(node, f"{receiver.id}.{func.attr}()")
        what = _timed_wait(node, strings, ours)
        if what is not None:
            report(node, what)
    return found


def test_no_module_but_the_seam_reads_time_or_waits_with_a_timeout() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        if path != SEAM:
            bad += violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not bad, "time read or waited for outside taskflow.clock:\n" + "\n".join(bad)


def test_the_seam_itself_is_where_time_is_read() -> None:
    # the check finds what the seam does: it would find the same anywhere else
    assert violations(SEAM.read_text(encoding="utf-8"))


def test_the_check_reports_each_kind_of_reading_and_timed_wait() -> None:
    source = '''
import time
import time as t
import threading
import asyncio
from time import monotonic
from datetime import datetime
_now = time.monotonic
def f(event, cond, q, thread, lock, fut, loop):
    time.time(); t.sleep(1); time.perf_counter(); time.monotonic_ns(); time.time_ns()
    event.wait(0.5); event.wait(timeout=x); cond.wait_for(pred, 2); q.get(timeout=1)
    q.get(True, 1); q.put(item, timeout=1); thread.join(3); thread.join(timeout=3)
    lock.acquire(timeout=1); lock.acquire(True, 1); fut.result(5); fut.result(timeout=5)
    threading.Timer(1, f); asyncio.sleep(1); loop.call_later(1, f)
    datetime.now(); time.strftime("%H"); time.localtime()
'''
    found = violations(source)
    assert len(found) == 25, "\n".join(found)
    assert any(":6: from time import monotonic" in v for v in found)
    assert any(":8: time.monotonic" in v for v in found)


def test_the_check_leaves_untimed_waits_polls_and_string_joins_alone() -> None:
    source = '''
import time
import threading
from taskflow import clock
from taskflow.engine import closing
_SEP = ", "
def f(event, cond, q, thread, lock, fut, proc, parts, d, run):
    event.wait(); event.wait(None); cond.wait_for(pred); q.get(); q.get(timeout=None)
    lock.acquire(); lock.acquire(False); lock.acquire(timeout=0); fut.result(); fut.result(0)
    thread.join(); ", ".join(parts); _SEP.join(parts); proc.wait(); d.get("k", 1)
    clock.now(); clock.wait(event, 1); time.strftime("%H", time.localtime(clock.wall()))
    threading.Event(); closing.wait(run); time.thread_time
'''
    found = violations(source)
    assert found == ["<source>:12: time.thread_time"], found
