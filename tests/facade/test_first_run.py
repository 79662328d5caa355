"""A process's first run keeps its budget: whatever a run needs is loaded at ``import taskflow``
or when the flow is built, never after a run's clock has started.

Each check runs fresh interpreters (``fresh_process.py``): in this process, other tests have
imported everything long ago.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("fresh_process.py")


def fresh(*args: str) -> Any:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["plain", "options"])
def test_the_first_run_of_a_fresh_process_keeps_its_budget_like_the_second(kind: str) -> None:
    # a 30 ms node with timeout=0.1, started twice in each of three fresh processes: the first
    # run is ok, and (median over the processes) within 20 ms of the second
    runs = [fresh("first", kind) for _ in range(3)]
    assert [r["first"]["status"] for r in runs] == ["COMPLETED"] * 3, runs
    assert [r["second"]["status"] for r in runs] == ["COMPLETED"] * 3, runs
    extra = statistics.median(r["first"]["ms"] - r["second"]["ms"] for r in runs)
    assert extra < 20, runs


@pytest.mark.parametrize("what", ["plain", "options", "options logged"])
def test_no_module_is_imported_while_a_run_is_in_progress(what: str) -> None:
    # the first runs of flows of every kind (start, submit, stream, run_async; failures,
    # retries, timeouts, cancellation, hooks, joins, switch, fork/join, fan-out; with "options"
    # every resilience option; with "logged" loguru's lines enabled into a sink) ask the import
    # system for nothing: the plain program never loads the resilience part
    out = fresh("imports", *what.split())
    assert out["imported"] == [], out
    assert out["statuses"]["run_timeout"] == "TIMED_OUT"
    assert out["statuses"]["flaky"] == "COMPLETED"
    assert (out["records"] > 0) == ("logged" in what)


def test_import_taskflow_loads_none_of_what_only_some_programs_use() -> None:
    # loguru (and the asyncio, ssl, multiprocessing it drags in), the resilience part's
    # pydantic models, process pools, importlib.resources, the node kinds: loaded by the
    # programs that use them
    heavy = ["loguru", "asyncio", "ssl", "multiprocessing", "concurrent.futures.process",
             "pydantic", "taskflow.resilience.bulkhead", "importlib.resources", "tempfile",
             "json", "psutil", "taskflow.observe", "taskflow.pools", "taskflow.declare",
             "taskflow.http", "taskflow.cli", "taskflow.kinds", "inspect", "difflib"]
    code = f"import sys\nimport taskflow\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_building_a_flow_of_plain_functions_loads_no_introspection() -> None:
    # a node's arity and coroutine checks read a plain function's code object: inspect (with
    # ast, dis, tokenize) and difflib load only for wrappers, partials or an error message
    code = ("import sys\nfrom taskflow import FunctionNode, TaskScheduling\n"
            "a = FunctionNode(lambda ctx, p: 1, name='a')\n"
            "def b(ctx, p, *rest, scale=2):\n    return p\n"
            "a >> FunctionNode(b, name='b')\n"
            "print(' '.join(m for m in ('inspect', 'difflib', 'ast', 'dis') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
