"""taskflow — orchestrate a DAG of tasks on a concurrent.futures executor.

The whole public API is re-exported here; see README.md and API.md.
"""

from __future__ import annotations

from loguru import logger

from taskflow.context import TaskContext, TaskSupport
from taskflow.errors import (
    CycleError,
    DuplicateNameError,
    FlowDefinitionError,
    FlowFailedError,
    FlowTimeoutError,
    InvalidNodeError,
    NodeCancelledError,
    NodeTimeoutError,
    RejectedExecutionError,
    ResultNotAvailableError,
    TaskflowError,
    UpstreamFailedError,
)
from taskflow.joins import Join
from taskflow.node import FunctionNode, NodeState, SchedulingNode
from taskflow.result import FlowReport, FlowResult, NodeReport, ResultState, WorkResult
from taskflow.scheduling import TaskScheduling, run_async

logger.disable("taskflow")

__version__ = "0.1.0"

__all__ = [
    "CycleError",
    "DuplicateNameError",
    "FlowDefinitionError",
    "FlowFailedError",
    "FlowReport",
    "FlowResult",
    "FlowTimeoutError",
    "FunctionNode",
    "InvalidNodeError",
    "Join",
    "NodeCancelledError",
    "NodeReport",
    "NodeState",
    "NodeTimeoutError",
    "RejectedExecutionError",
    "ResultNotAvailableError",
    "ResultState",
    "SchedulingNode",
    "TaskContext",
    "TaskScheduling",
    "TaskSupport",
    "TaskflowError",
    "UpstreamFailedError",
    "WorkResult",
    "run_async",
]
