"""``JSON_JQ_TRANSFORM``: a jq program over the task's input, run by the ``jq`` binding.

As in Conductor, the program is ``inputParameters.queryExpression`` and its input is the whole
task input; the output is ``{"result": first value, "resultList": [every value]}``.

The jq binding holds the GIL while it runs, so a runaway program run in this process would stop
every thread, the budget's timer included. Programs therefore run in worker processes (plain
``python -c`` children that import only ``jq``, one request at a time each, reused): a program
still running at ``jq_time_limit`` (capped by the run's budget) has its worker killed, and a
worker's address space is capped at ``jq_memory_limit`` bytes. A worker costs about 50 ms to
start, once; later programs pay a pipe round trip.
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import threading
from typing import Any

from taskflow import clock
from taskflow.declare.conductor.boundaries import Limits
from taskflow.declare.conductor.compiling import CompileContext, Site, Step
from taskflow.declare.conductor.tasks.base import TaskFailedError, TaskMixin
from taskflow.errors import TaskflowError
from taskflow.model.context import TaskContext
from taskflow.model.node import SchedulingNode

__all__ = ["JqError", "JqTask", "compile_jq", "run_jq"]

_WORKER = r"""
import json, sys
limit = int(sys.argv[1])
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
except (ImportError, ValueError, OSError):
    pass
import jq
programs = {}
for line in sys.stdin:
    try:
        req = json.loads(line)
        prog = programs.get(req["p"])
        if prog is None:
            prog = programs[req["p"]] = jq.compile(req["p"])
            if len(programs) > 256:
                programs.clear()
        reply = {"r": prog.input_value(req["i"]).all()}
    except MemoryError:
        reply = {"e": "out of memory"}
    except Exception as exc:
        reply = {"e": str(exc) or type(exc).__name__}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""


class JqError(TaskflowError, RuntimeError):
    """A jq program failed: it did not compile, raised, ran out of time or memory."""


class _Worker:
    """One ``python -c`` child evaluating jq programs, one at a time."""

    def __init__(self, memory_limit: int) -> None:
        self.memory_limit = memory_limit
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(memory_limit)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, encoding="utf-8", bufsize=1,
        )

    def ask(self, program: str, value: Any, seconds: float) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"p": program, "i": value}, default=str) + "\n")
        self.proc.stdin.flush()
        deadline = clock.real_now() + seconds  # real time: the child is another process
        fd = self.proc.stdout.fileno()
        while True:
            left = deadline - clock.real_now()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                break
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError
        return json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


_idle: list[_Worker] = []  # guarded by _idle_lock: workers waiting for a request
_idle_lock = threading.Lock()


@atexit.register
def _close_workers() -> None:
    with _idle_lock:
        workers = list(_idle)
        _idle.clear()
    for w in workers:
        w.kill()


def run_jq(task: str, program: str, value: Any, limits: Limits, remaining: float) -> list[Any]:
    """Every value ``program`` outputs for ``value``.

    Raises:
        JqError: the program did not compile, raised, or ran out of time or memory.
    """
    seconds = min(limits.jq_time_limit, remaining)
    if seconds <= 0:
        raise JqError(f"jq program of task {task!r}: no time left in the run's budget")
    worker = None
    with _idle_lock:
        for i, w in enumerate(_idle):
            if w.memory_limit == limits.jq_memory_limit:
                worker = _idle.pop(i)
                break
    if worker is None:
        worker = _Worker(limits.jq_memory_limit)
    try:
        reply = worker.ask(program, value, seconds)
    except TimeoutError:
        worker.kill()
        raise JqError(f"jq program of task {task!r} stopped after its time limit of "
                      f"{seconds:.3g} s") from None
    except (EOFError, OSError, ValueError):
        worker.kill()
        raise JqError(f"jq program of task {task!r}: its worker process died "
                      "(out of memory?)") from None
    with _idle_lock:
        _idle.append(worker)
    if "e" in reply:
        raise JqError(f"jq program of task {task!r}: {reply['e']}")
    return reply["r"]  # type: ignore[no-any-return]


class JqTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``JSON_JQ_TRANSFORM``: see the module docstring."""

    draw_as = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        program = task_input.get("queryExpression")
        if not isinstance(program, str) or not program.strip():
            raise ValueError(f"task {self.ref!r}: inputParameters.queryExpression must be a jq "
                             "program")
        try:
            values = run_jq(self.ref, program, task_input, self.limits, ctx.remaining())
        except JqError as exc:
            raise TaskFailedError(str(exc), {"error": str(exc)}) from exc
        return {"result": values[0] if values else None, "resultList": values}


def compile_jq(ctx: CompileContext, site: Site) -> Step:
    """``JSON_JQ_TRANSFORM``: a jq ``queryExpression``."""
    if not isinstance(ctx.params(site).get("queryExpression"), str):
        raise ctx.fail(f"json_jq_transform {site.label} has no inputParameters.queryExpression")
    return ctx.single(site, ctx.new_node(JqTask, site))
