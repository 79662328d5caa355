"""Conductor workflow definitions, run in-process: ``load(definition, registry)``.

Netflix/Orkes Conductor describes a workflow as JSON: a ``tasks`` list run one after another,
with operators for parallelism, branching and loops, and system tasks (HTTP, JavaScript, jq...).
``load`` compiles such a definition into taskflow nodes (one per task, named by
``taskReferenceName``) and returns a [`Workflow`][taskflow.declare.conductor.Workflow], so a team can run and test a Conductor
workflow in a unit test or a service, on any ``concurrent.futures`` executor, with the task
workers replaced by plain Python callables from a *registry* (task ``name`` -> ``fn(input:
dict) -> dict``).

The package, one concept per module:

``loader``
    ``load``: checks a definition by Conductor's rules and compiles it, each task through the
    compile function its type maps to ([`SUPPORTED_TYPES`][taskflow.declare.conductor.SUPPORTED_TYPES]).
``compiling``
    the compile context every task type's compile function is handed.
``expressions``
    ``${workflow.input.x}``, ``${ref.output.a[0]}``, ``${workflow.variables.x}``,
    ``${CPEWF_TASK_ID}``... parsed at load, resolved when a task starts.
``state``
    a run's task records and variables, kept in its [`TaskContext`][taskflow.TaskContext].
``boundaries``
    what a definition may make the process do: hosts, response sizes, script time and memory.
``tasks``
    the node each task type becomes and the function that compiles it (``flow``,
    ``javascript``, ``jq``, ``http``, ``control``, ``nested``).
``workflow``
    [`Workflow`][taskflow.declare.conductor.Workflow] (start, run, status, output, drawings) and [`WorkflowRun`][taskflow.declare.conductor.WorkflowRun].

How the task types run in-process:

``SIMPLE``
    One node calling ``registry[name](input)``; its output is the dict the callable returns
    (``None`` counts as ``{}``; any other value as ``{"result": value}``, as Conductor's Python
    workers do). Raise [`TaskFailedError`][taskflow.declare.conductor.TaskFailedError] to fail with partial output.
``FORK_JOIN`` + ``JOIN``
    Each ``forkTasks`` branch runs in parallel; the JOIN waits for its ``joinOn`` tasks only
    and outputs ``{ref: output}`` of those whose output is not empty, as Conductor does.
``SWITCH`` / ``DECISION`` + ``EXCLUSIVE_JOIN``
    The case whose name is the value's text runs (``value-param``/``caseValueParam``, or a
    ``javascript``/``graaljs`` expression/``caseExpression``), every other case is ``SKIPPED``;
    with no match and no default no branch runs and the workflow goes on. EXCLUSIVE_JOIN outputs
    the output of the branch task that ran.
``FORK_JOIN_DYNAMIC`` + ``JOIN``, ``DYNAMIC``
    Tasks named in the input at run time, run from the registry.
``INLINE``, ``LAMBDA``, ``JSON_JQ_TRANSFORM``, ``HTTP``
    JavaScript in a fresh V8 isolate, jq in a worker process, HTTP with urllib, each within
    [`Limits`][taskflow.declare.conductor.boundaries.Limits].
``DO_WHILE``, ``SUB_WORKFLOW``
    Nested runs on the same executor, within the run's budget.
``SET_VARIABLE``, ``TERMINATE``, ``WAIT``, ``EVENT``, ``NOOP``
    Workflow variables, ending the workflow with a status and output, a wait within the
    budget, publishing to the ``event_sink`` given to ``load``.
``optional: true``
    The task's failure does not fail the JOIN, the next step or the workflow.

A required task that fails fails the workflow at once: the rest of the run is cancelled, so no
other branch starts anything afterwards (the run's FlowResult is then ``CANCELLED``;
``Workflow.status`` says ``FAILED``). Fields taskflow does not implement are reported (a
loguru warning and ``Workflow.warnings``), never silently ignored; task types that need a
Conductor server (HUMAN, a WAIT for a signal, EVENT without a sink...) are refused at load, all
of them named with their type and position.
"""

from __future__ import annotations

from taskflow.declare.conductor.boundaries import HostNotAllowedError, Limits
from taskflow.declare.conductor.loader import SUPPORTED_TYPES, load
from taskflow.declare.conductor.state import INPUT_KEY
from taskflow.declare.conductor.tasks.base import TaskFailedError
from taskflow.declare.conductor.tasks.flow import TaskFn
from taskflow.declare.conductor.tasks.javascript import ScriptError
from taskflow.declare.conductor.tasks.jq import JqError
from taskflow.declare.conductor.workflow import Workflow, WorkflowRun

__all__ = [
    "INPUT_KEY",
    "SUPPORTED_TYPES",
    "HostNotAllowedError",
    "JqError",
    "Limits",
    "ScriptError",
    "TaskFailedError",
    "TaskFn",
    "Workflow",
    "WorkflowRun",
    "load",
]
