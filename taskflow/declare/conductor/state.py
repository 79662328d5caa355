"""A Conductor run's state in its [`TaskContext`][taskflow.TaskContext]: task records, variables.

Everything a task reads about other tasks lives in the run's context, under ``RUNS_KEY``, as
plain dicts: ``{run key: {"tasks": {ref: {"input", "output", "taskId", "status"}},
"variables": {...}, "meta": {...}}}``. The run key is the flow id, or the key a nested run
(a DO_WHILE iteration, a SUB_WORKFLOW) was given, so a context reused by later runs never shows
them stale records.

Copy on write: a record already in the context is never mutated, because a snapshot of the
context taken for a task on another process may be being pickled meanwhile. Every write goes
through ``_update``, under one lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from taskflow.model.context import TaskContext

__all__ = ["CHAIN_KEY", "INPUT_KEY", "RUNS_KEY", "claim_meta", "fingerprint", "meta", "put_meta",
           "put_task", "run_key", "tasks", "variables", "workflow_object"]

#: The TaskContext key holding the workflow input (``${workflow.input...}`` reads it).
INPUT_KEY = "workflow.input"
#: The TaskContext key holding every Conductor run's record.
RUNS_KEY = "conductor.tasks"
#: Set by nested runs: the key of their record (default: the flow id).
RUN_KEY_KEY = "conductor.run_key"
#: Set by nested runs and ``Workflow.start``: ``${workflow.workflowId}`` and the correlation id.
WORKFLOW_ID_KEY = "conductor.workflow_id"
CORRELATION_KEY = "conductor.correlation_id"
#: Set by ``Workflow.start`` and every SUB_WORKFLOW: the workflows this run is nested in,
#: outermost first, itself last, each as (name, version, fingerprint of its input).
CHAIN_KEY = "conductor.chain"

_LOCK = threading.Lock()  # serialises the read-modify-write of RUNS_KEY in any context


def run_key(ctx: TaskContext) -> str:
    """The key of this run's record."""
    key = ctx.get(RUN_KEY_KEY)
    return key if isinstance(key, str) else str(ctx.flow_id)


def _record(ctx: TaskContext) -> Mapping[str, Any]:
    runs = ctx.get(RUNS_KEY) or {}
    return runs.get(run_key(ctx)) or {}


def tasks(ctx: TaskContext) -> Mapping[str, Mapping[str, Any]]:
    """This run's ref -> task record (read only)."""
    return _record(ctx).get("tasks") or {}


def variables(ctx: TaskContext) -> Mapping[str, Any]:
    """This run's workflow variables (read only)."""
    return _record(ctx).get("variables") or {}


def meta(ctx: TaskContext) -> Mapping[str, Any]:
    """This run's facts about itself (``terminated``, ``failed_by``; read only)."""
    return _record(ctx).get("meta") or {}


def _update(ctx: TaskContext, section: str, key: str | None, fields: Mapping[str, Any]) -> None:
    rk = run_key(ctx)
    with _LOCK:
        runs = dict(ctx.get(RUNS_KEY) or {})
        run = dict(runs.get(rk) or {})
        part = dict(run.get(section) or {})
        if key is None:
            part.update(fields)
        else:
            rec = dict(part.get(key) or {})
            rec.update(fields)
            part[key] = rec
        run[section] = part
        runs[rk] = run
        ctx[RUNS_KEY] = runs


def put_task(ctx: TaskContext, ref: str, **fields: Any) -> None:
    """Record ``fields`` for task ``ref`` in this run's record."""
    _update(ctx, "tasks", ref, fields)


def put_tasks(ctx: TaskContext, records: Mapping[str, Mapping[str, Any]]) -> None:
    """Record several tasks at once (a nested run's tasks, seen by the tasks after it)."""
    rk = run_key(ctx)
    with _LOCK:
        runs = dict(ctx.get(RUNS_KEY) or {})
        run = dict(runs.get(rk) or {})
        part = dict(run.get("tasks") or {})
        part.update(records)
        run["tasks"] = part
        runs[rk] = run
        ctx[RUNS_KEY] = runs


def set_variables(ctx: TaskContext, updates: Mapping[str, Any]) -> None:
    """Merge ``updates`` into this run's workflow variables (SET_VARIABLE)."""
    _update(ctx, "variables", None, updates)


def put_meta(ctx: TaskContext, **fields: Any) -> None:
    """Record facts about the run (a TERMINATE's status and output, the task that failed it)."""
    _update(ctx, "meta", None, fields)


def claim_meta(ctx: TaskContext, key: str, **fields: Any) -> bool:
    """Record ``fields`` unless ``key`` is already recorded (the first failure or termination
    wins, atomically); True if this call recorded them."""
    rk = run_key(ctx)
    with _LOCK:
        runs = dict(ctx.get(RUNS_KEY) or {})
        run = dict(runs.get(rk) or {})
        part = dict(run.get("meta") or {})
        if key in part:
            return False
        part.update(fields)
        run["meta"] = part
        runs[rk] = run
        ctx[RUNS_KEY] = runs
        return True


def seed(ctx: TaskContext, key: str, record: Mapping[str, Any]) -> None:
    """Start the record of a nested run ``key`` in a fresh context with ``record``."""
    ctx[RUN_KEY_KEY] = key
    ctx[RUNS_KEY] = {key: dict(record)}


def snapshot(ctx: TaskContext) -> dict[str, Any]:
    """This run's whole record (tasks, variables, meta), to seed a nested run with."""
    return dict(_record(ctx))


def workflow_object(ctx: TaskContext, name: str, version: Any) -> dict[str, Any]:
    """The ``workflow`` object expressions read (``${workflow.input.x}`` ...)."""
    wid = ctx.get(WORKFLOW_ID_KEY)
    return {
        "input": ctx.get(INPUT_KEY) or {},
        "variables": variables(ctx),
        "workflowId": wid if isinstance(wid, str) else ctx.flow_id,
        "correlationId": ctx.get(CORRELATION_KEY),
        "workflowType": name,
        "version": version,
        "status": "RUNNING",
    }


def fingerprint(value: Any) -> str:
    """A short digest of a workflow input (equal inputs, equal digests), for ``CHAIN_KEY``."""
    text = json.dumps(value, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
