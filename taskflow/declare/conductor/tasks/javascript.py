"""JavaScript for INLINE, LAMBDA and the ``javascript``/``graaljs`` evaluators, run by V8.

Conductor evaluates these scripts with Nashorn or GraalJS, binding the task's input as ``$``.
Here each evaluation gets a fresh V8 isolate from ``mini-racer`` (extra ``[conductor]``): the
script sees ``$`` (the input, as JSON data) and nothing of the host: no files, no network, no
Python objects, no state left by another evaluation. It runs at most ``js_time_limit`` seconds
(capped by the run's remaining budget) and ``js_memory_limit`` bytes of heap; past either it is
stopped and the task fails with [`ScriptError`][taskflow.declare.conductor.tasks.javascript.ScriptError].

The script's completion value is the result (``$.a + 1``, or the value of the last statement);
LAMBDA wraps its ``scriptExpression`` in a function, as Conductor does, so it may ``return``.
The value crosses back as JSON (``undefined`` becomes ``None``).

Start-up cost, measured on the shared 2-core machine: importing mini-racer about 50 ms once per
process, then a fresh isolate and one evaluation about 3 ms.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from taskflow.declare.conductor.boundaries import Limits
from taskflow.declare.conductor.compiling import CompileContext, Site, Step
from taskflow.declare.conductor.tasks.base import TaskMixin
from taskflow.errors import TaskflowError
from taskflow.model.context import TaskContext
from taskflow.model.node import SchedulingNode

__all__ = ["InlineTask", "LambdaTask", "ScriptError", "compile_inline", "compile_lambda",
           "evaluate", "syntax_error"]


class ScriptError(TaskflowError, RuntimeError):
    """A script failed: it threw, ran past its time limit, or past its memory limit.

    Attributes:
        task: the reference name of the task whose script failed.
        kind: ``"error"``, ``"timeout"`` or ``"memory"``.
    """

    def __init__(self, task: str, kind: str, detail: str) -> None:
        self.task = task
        self.kind = kind
        super().__init__(f"script of task {task!r}: {detail}")


_loop_lock = threading.Lock()  # guards _loop
_loop: asyncio.AbstractEventLoop | None = None  # mini-racer >= 0.14: one loop for every isolate


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop mini-racer (0.14 and later) delivers V8's callbacks to.

    mini-racer otherwise starts a loop thread per isolate and closes it before freeing the
    isolate, so a callback V8 sends after a timeout lands on a closed loop. One loop, started
    once and never closed (a daemon thread), receives them all.
    """
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True,
                             name="asyncio_taskflow-javascript").start()
            _loop = loop
        return _loop


@contextmanager
def _isolate() -> Iterator[Any]:
    """A fresh V8 isolate, closed on exit."""
    try:
        import py_mini_racer
    except ImportError as exc:  # pragma: no cover - the extra is part of dev
        raise ImportError(
            "JavaScript in Conductor tasks needs mini-racer: pip install 'taskflow-juc[conductor]'"
        ) from exc
    factory = getattr(py_mini_racer, "mini_racer", None)
    if factory is not None:
        with factory(_shared_loop()) as racer:
            yield racer
        return
    racer = py_mini_racer.MiniRacer()  # 0.12: no event loop
    try:
        yield racer
    finally:
        racer.close()


def evaluate(task: str, script: str, bindings: Any, limits: Limits,
             remaining: float = math.inf) -> Any:
    """Run ``script`` with ``$`` bound to ``bindings`` in a fresh isolate; its value as data.

    Args:
        task: the task's reference name (for error messages).
        script: JavaScript source; its completion value is the result.
        bindings: JSON-ready data bound to ``$``.
        limits: the workflow's limits (time and memory).
        remaining: the run's remaining budget; the time limit never exceeds it.

    Raises:
        ScriptError: the script threw, or ran out of time or memory.
    """
    from py_mini_racer import JSEvalException, JSOOMException, JSTimeoutException

    try:
        data = json.dumps(bindings, default=str)
    except (TypeError, ValueError) as exc:
        raise ScriptError(task, "error", f"its input cannot be given to JavaScript: {exc}") from exc
    seconds = min(limits.js_time_limit, remaining)
    if seconds <= 0:
        raise ScriptError(task, "timeout", "no time left in the run's budget")
    source = (f"var $ = {data};\n"
              f"(function(){{ var __r = (0, eval)({json.dumps(script)});"
              " return __r === undefined ? 'null' : JSON.stringify(__r); })()")
    try:
        with _isolate() as racer:
            text = racer.eval(source, timeout_sec=seconds, max_memory=limits.js_memory_limit)
    except JSTimeoutException:
        raise ScriptError(task, "timeout",
                          f"stopped after its time limit of {seconds:.3g} s") from None
    except JSOOMException:
        raise ScriptError(task, "memory", f"stopped at its memory limit of "
                          f"{limits.js_memory_limit} bytes") from None
    except JSEvalException as exc:
        first = str(exc).strip().splitlines()
        raise ScriptError(task, "error", first[0] if first else type(exc).__name__) from None
    if not isinstance(text, str):
        return None  # JSON.stringify gave undefined (a function, a symbol)
    return json.loads(text)


def syntax_error(script: str, limits: Limits) -> str | None:
    """The SyntaxError of ``script`` (parsed, never run), or None when it parses or when no
    JavaScript engine is installed (running the script then says what to install)."""
    try:
        from py_mini_racer import JSEvalException, JSTimeoutException
    except ImportError:  # pragma: no cover - the extra is part of dev
        return None
    source = (f"(function(){{ try {{ new Function({json.dumps(script)}); return ''; }}"
              " catch (e) { return String(e); } })()")
    try:
        with _isolate() as racer:
            found = racer.eval(source, timeout_sec=limits.js_time_limit,
                               max_memory=limits.js_memory_limit)
    except (JSEvalException, JSTimeoutException) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return found or None


def truthy(value: Any) -> bool:
    """JavaScript's truthiness of a value that crossed back as JSON."""
    if isinstance(value, str):
        return value != ""
    if isinstance(value, float) and math.isnan(value):
        return False
    return bool(value) or isinstance(value, (dict, list))


class InlineTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``INLINE``: ``inputParameters.expression`` evaluated by ``evaluatorType``
    (``javascript``/``graaljs``, or ``value-param``); output ``{"result": value}``."""

    draw_as = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        evaluator = task_input.get("evaluatorType") or "javascript"
        expression = task_input.get("expression")
        if evaluator == "value-param":
            return {"result": task_input.get(expression) if isinstance(expression, str) else None}
        if not isinstance(expression, str):
            raise ScriptError(self.ref, "error", "inputParameters.expression is not a string")
        return {"result": evaluate(self.ref, expression, task_input, self.limits,
                                   ctx.remaining())}


class LambdaTask(TaskMixin, SchedulingNode[None, dict[str, Any]]):
    """``LAMBDA``: ``inputParameters.scriptExpression`` run as a function body (it may
    ``return``) with ``$`` the input; output ``{"result": value}``."""

    draw_as = "task"

    def execute(self, ctx: TaskContext, task_input: dict[str, Any]) -> dict[str, Any]:
        script = task_input.get("scriptExpression")
        if not isinstance(script, str):
            raise ScriptError(self.ref, "error", "inputParameters.scriptExpression is not a string")
        wrapped = f"(function scriptFun(){{{script}\n}})()"
        return {"result": evaluate(self.ref, wrapped, task_input, self.limits, ctx.remaining())}


def compile_inline(ctx: CompileContext, site: Site) -> Step:
    """``INLINE``: a javascript (or graaljs, or value-param) ``expression``."""
    params = ctx.params(site)
    evaluator = params.get("evaluatorType") or "javascript"
    if evaluator not in ("javascript", "graaljs", "value-param"):
        raise ctx.fail(f"inline {site.label}: evaluatorType {evaluator!r} is not "
                       "'javascript', 'graaljs' or 'value-param'")
    if not isinstance(params.get("expression"), str):
        raise ctx.fail(f"inline {site.label} has no inputParameters.expression")
    return ctx.single(site, ctx.new_node(InlineTask, site))


def compile_lambda(ctx: CompileContext, site: Site) -> Step:
    """``LAMBDA``: a javascript ``scriptExpression``."""
    if not isinstance(ctx.params(site).get("scriptExpression"), str):
        raise ctx.fail(f"lambda {site.label} has no inputParameters.scriptExpression")
    return ctx.single(site, ctx.new_node(LambdaTask, site))
