"""taskflow — orchestrate a DAG of tasks on a concurrent.futures executor.

The whole public API is re-exported here; the documentation site (``docs/``, built with
``mkdocs build``) describes it, its API reference is generated from these docstrings. The parts
that need pydantic or other heavy imports (report models, pools and monitors, FlowSpec,
Conductor) load on first use (``__getattr__``), so ``import taskflow`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loguru import logger

from taskflow._version import __version__ as __version__
from taskflow.context import TaskContext, TaskSupport
from taskflow.errors import (
    BulkheadFullError,
    CircuitOpenError,
    CycleError,
    DuplicateNameError,
    FallbackError,
    FlowDefinitionError,
    FlowFailedError,
    FlowTimeoutError,
    InvalidNodeError,
    NodeCancelledError,
    NodeTimeoutError,
    RejectedExecutionError,
    ResultNotAvailableError,
    TaskflowError,
    UnhashableKeyError,
    UpstreamFailedError,
)
from taskflow.fanout import FanInResult, FanOutNode, FanOutPolicyError, ItemTimeoutError
from taskflow.forkjoin import ForkNode, JoinNode, JoinOutput, fork_join
from taskflow.joins import Join
from taskflow.node import FunctionNode, NodeState, SchedulingNode
from taskflow.result import FlowResult, FlowStatus, ResultState, WorkResult
from taskflow.scheduling import TaskScheduling, run_async
from taskflow.switch import SwitchNode, UnknownCaseError

if TYPE_CHECKING:
    from taskflow import conductor
    from taskflow.monitor import Alarm, PoolMonitor, PoolSnapshot, ProcessMetrics, Thresholds
    from taskflow.pool import (
        MonitoredExecutor,
        Percentiles,
        PoolMetrics,
        RejectionPolicy,
        ThreadPool,
    )
    from taskflow.report import FlowReport, NodeReport
    from taskflow.resilience.breaker import CircuitBreaker
    from taskflow.resilience.bulkhead import Bulkhead
    from taskflow.resilience.hedge import Hedge
    from taskflow.resilience.ratelimit import RateLimit
    from taskflow.spec import FlowSpec, load_spec

logger.disable("taskflow")

# name -> the module that defines it, imported on first access
_LAZY = {
    "Alarm": "taskflow.monitor",
    "PoolMonitor": "taskflow.monitor",
    "PoolSnapshot": "taskflow.monitor",
    "ProcessMetrics": "taskflow.monitor",
    "Thresholds": "taskflow.monitor",
    "MonitoredExecutor": "taskflow.pool",
    "Percentiles": "taskflow.pool",
    "PoolMetrics": "taskflow.pool",
    "RejectionPolicy": "taskflow.pool",
    "ThreadPool": "taskflow.pool",
    "FlowReport": "taskflow.report",
    "NodeReport": "taskflow.report",
    "FlowSpec": "taskflow.spec",
    "load_spec": "taskflow.spec",
    "Bulkhead": "taskflow.resilience.bulkhead",
    "CircuitBreaker": "taskflow.resilience.breaker",
    "Hedge": "taskflow.resilience.hedge",
    "RateLimit": "taskflow.resilience.ratelimit",
}


def __getattr__(name: str) -> Any:
    """Load the heavy parts of the public API on first use."""
    if name == "conductor":
        module = importlib.import_module("taskflow.conductor")
        globals()[name] = module
        return module
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'taskflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"conductor"})


__all__ = [
    "Alarm",
    "Bulkhead",
    "BulkheadFullError",
    "CircuitBreaker",
    "CircuitOpenError",
    "CycleError",
    "DuplicateNameError",
    "FallbackError",
    "FanInResult",
    "FanOutNode",
    "FanOutPolicyError",
    "FlowDefinitionError",
    "FlowFailedError",
    "FlowReport",
    "FlowResult",
    "FlowSpec",
    "FlowStatus",
    "FlowTimeoutError",
    "ForkNode",
    "FunctionNode",
    "Hedge",
    "InvalidNodeError",
    "ItemTimeoutError",
    "Join",
    "JoinNode",
    "JoinOutput",
    "MonitoredExecutor",
    "NodeCancelledError",
    "NodeReport",
    "NodeState",
    "NodeTimeoutError",
    "Percentiles",
    "PoolMetrics",
    "PoolMonitor",
    "PoolSnapshot",
    "ProcessMetrics",
    "RateLimit",
    "RejectedExecutionError",
    "RejectionPolicy",
    "ResultNotAvailableError",
    "ResultState",
    "SchedulingNode",
    "SwitchNode",
    "TaskContext",
    "TaskScheduling",
    "TaskSupport",
    "TaskflowError",
    "ThreadPool",
    "Thresholds",
    "UnhashableKeyError",
    "UnknownCaseError",
    "UpstreamFailedError",
    "WorkResult",
    "conductor",
    "fork_join",
    "load_spec",
    "run_async",
]
