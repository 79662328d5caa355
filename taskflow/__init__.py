"""taskflow — orchestrate a DAG of tasks on a concurrent.futures executor.

The whole public API is re-exported here; the documentation site (``docs/``, built with
``mkdocs build``) describes it, its API reference is generated from these docstrings.
"""

from __future__ import annotations

from loguru import logger

from taskflow import conductor
from taskflow._version import __version__ as __version__
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
from taskflow.fanout import FanInResult, FanOutNode, FanOutPolicyError, ItemTimeoutError
from taskflow.forkjoin import ForkNode, JoinNode, JoinOutput, fork_join
from taskflow.joins import Join
from taskflow.monitor import Alarm, PoolMonitor, PoolSnapshot, ProcessMetrics, Thresholds
from taskflow.node import FunctionNode, NodeState, SchedulingNode
from taskflow.pool import MonitoredExecutor, Percentiles, PoolMetrics, RejectionPolicy, ThreadPool
from taskflow.result import FlowReport, FlowResult, NodeReport, ResultState, WorkResult
from taskflow.scheduling import TaskScheduling, run_async
from taskflow.spec import FlowSpec, load_spec
from taskflow.switch import SwitchNode, UnknownCaseError

logger.disable("taskflow")

__all__ = [
    "Alarm",
    "CycleError",
    "DuplicateNameError",
    "FanInResult",
    "FanOutNode",
    "FanOutPolicyError",
    "FlowDefinitionError",
    "FlowFailedError",
    "FlowReport",
    "FlowResult",
    "FlowSpec",
    "FlowTimeoutError",
    "ForkNode",
    "FunctionNode",
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
    "UnknownCaseError",
    "UpstreamFailedError",
    "WorkResult",
    "conductor",
    "fork_join",
    "load_spec",
    "run_async",
]
