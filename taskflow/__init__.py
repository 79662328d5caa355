"""taskflow — orchestrate a DAG of tasks on a concurrent.futures executor.

The whole public API is re-exported here; the documentation site (``docs/``, built with
``mkdocs build``) describes it, its API reference is generated from these docstrings. The parts
that need pydantic or other heavy imports (report models, pools and monitors, FlowSpec,
Conductor, the resilience primitives) load on first use (``__getattr__``), and loguru loads
with the program that uses it (``taskflow.logs``), so ``import taskflow`` stays fast
(``benchmarks/import_time.py``). What a run itself needs is all loaded here, so no run ever
imports a module after its clock has started.
"""

from __future__ import annotations

import importlib
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

from taskflow import logs as logs
from taskflow._version import __version__ as __version__
from taskflow.errors import (
    ArgumentError,
    BatchCallError,
    BatchKeyError,
    BatchResultError,
    BrokenPoolError,
    BudgetExhaustedError,
    BulkheadFullError,
    CircuitOpenError,
    CycleError,
    DeadlineWarning,
    DetachedRefusedError,
    DuplicateNameError,
    FallbackError,
    FlowDefinitionError,
    FlowFailedError,
    FlowTimeoutError,
    InvalidArgumentError,
    InvalidArgumentValueError,
    InvalidNodeError,
    LoadShedError,
    NodeCancelledError,
    NodeTimeoutError,
    RejectedExecutionError,
    ResultNotAvailableError,
    StreamNotFinishedError,
    TaskflowError,
    UnhashableKeyError,
    UnknownNodeError,
    UpstreamFailedError,
)
from taskflow.model.context import TaskContext, TaskSupport
from taskflow.model.deadlines import budget_from_headers
from taskflow.model.joins import Join
from taskflow.model.node import FunctionNode, NodeState, SchedulingNode, Section
from taskflow.model.result import FlowResult, FlowStatus, ResultState, WorkResult
from taskflow.scheduling import (
    FlowStream,
    TaskScheduling,
    run_async,
    set_event_loop,
    set_loop_block_threshold,
)

if TYPE_CHECKING:
    from taskflow import http as http
    from taskflow.declare import conductor
    from taskflow.declare.spec import FlowSpec, load_spec
    from taskflow.kinds.fanout import FanInResult, FanOutNode, FanOutPolicyError, ItemTimeoutError
    from taskflow.kinds.forkjoin import ForkNode, JoinNode, JoinOutput, fork_join
    from taskflow.kinds.switch import SwitchNode, UnknownCaseError
    from taskflow.metrics import Percentiles, PoolMetrics
    from taskflow.model.report import FlowReport, NodeReport
    from taskflow.observe import otel as otel
    from taskflow.observe import stats as stats
    from taskflow.observe import web as web
    from taskflow.observe.monitor import PoolMonitor
    from taskflow.observe.snapshots import Alarm, PoolSnapshot, ProcessMetrics, Thresholds
    from taskflow.pools.monitored import MonitoredExecutor
    from taskflow.pools.threadpool import RejectionPolicy, ThreadPool
    from taskflow.resilience.batch import Batch
    from taskflow.resilience.breaker import CircuitBreaker
    from taskflow.resilience.bulkhead import Bulkhead
    from taskflow.resilience.detached import set_max_detached
    from taskflow.resilience.hedge import Hedge
    from taskflow.resilience.ratelimit import RateLimit
    from taskflow.resilience.retrybudget import RetryBudget
    from taskflow.resilience.shedding import set_load_shedding

# name -> the module that defines it, imported on first access (the node kinds too: a program
# names them when it builds its flows, before any run, and the engine never needs them)
_LAZY = {
    "FanInResult": "taskflow.kinds.fanout",
    "FanOutNode": "taskflow.kinds.fanout",
    "FanOutPolicyError": "taskflow.kinds.fanout",
    "ItemTimeoutError": "taskflow.kinds.fanout",
    "ForkNode": "taskflow.kinds.forkjoin",
    "JoinNode": "taskflow.kinds.forkjoin",
    "JoinOutput": "taskflow.kinds.forkjoin",
    "fork_join": "taskflow.kinds.forkjoin",
    "SwitchNode": "taskflow.kinds.switch",
    "UnknownCaseError": "taskflow.kinds.switch",
    "Alarm": "taskflow.observe.snapshots",
    "PoolMonitor": "taskflow.observe.monitor",
    "PoolSnapshot": "taskflow.observe.snapshots",
    "ProcessMetrics": "taskflow.observe.snapshots",
    "Thresholds": "taskflow.observe.snapshots",
    "MonitoredExecutor": "taskflow.pools.monitored",
    "Percentiles": "taskflow.metrics",
    "PoolMetrics": "taskflow.metrics",
    "RejectionPolicy": "taskflow.pools.threadpool",
    "ThreadPool": "taskflow.pools.threadpool",
    "FlowReport": "taskflow.model.report",
    "NodeReport": "taskflow.model.report",
    "FlowSpec": "taskflow.declare.spec",
    "load_spec": "taskflow.declare.spec",
    "Batch": "taskflow.resilience.batch",
    "Bulkhead": "taskflow.resilience.bulkhead",
    "CircuitBreaker": "taskflow.resilience.breaker",
    "Hedge": "taskflow.resilience.hedge",
    "RateLimit": "taskflow.resilience.ratelimit",
    "RetryBudget": "taskflow.resilience.retrybudget",
    "set_max_detached": "taskflow.resilience.detached",
    "set_load_shedding": "taskflow.resilience.shedding",
}

# module-valued names, imported on first access: ``taskflow.conductor.load(...)``,
# ``taskflow.otel.instrument()``, ``taskflow.stats.enable()``, ``taskflow.web.make_app(...)``,
# ``taskflow.http.session()``
_MODULES = {
    "conductor": "taskflow.declare.conductor",
    "http": "taskflow.http",
    "otel": "taskflow.observe.otel",
    "stats": "taskflow.observe.stats",
    "web": "taskflow.observe.web",
}


class _ModuleNames:
    """``import taskflow.web``, ``from taskflow.stats import enable``: the module-valued names
    of ``_MODULES`` import as the modules they name (the same module object under both names),
    so the import statements the documentation shows work, not only attribute access. A finder
    and loader by their methods (``importlib.abc``'s base classes would cost ``import
    taskflow`` ``importlib.resources`` and ``tempfile``)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        if fullname.startswith("taskflow.") and fullname[9:] in _MODULES:
            return ModuleSpec(fullname, self)  # type: ignore[arg-type]
        return None

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        # the import system returns what sys.modules holds once this returns
        sys.modules[module.__name__] = importlib.import_module(_MODULES[module.__name__[9:]])


if not any(isinstance(f, _ModuleNames) for f in sys.meta_path):
    sys.meta_path.append(_ModuleNames())


def __getattr__(name: str) -> Any:
    """Load the heavy parts of the public API on first use."""
    module_path = _MODULES.get(name)
    if module_path is not None:
        module = importlib.import_module(module_path)
        globals()[name] = module
        return module
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'taskflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


__all__ = [
    "Alarm",
    "ArgumentError",
    "Batch",
    "BatchCallError",
    "BatchKeyError",
    "BatchResultError",
    "BrokenPoolError",
    "BudgetExhaustedError",
    "Bulkhead",
    "BulkheadFullError",
    "CircuitBreaker",
    "CircuitOpenError",
    "CycleError",
    "DeadlineWarning",
    "DetachedRefusedError",
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
    "FlowStream",
    "FlowTimeoutError",
    "ForkNode",
    "FunctionNode",
    "Hedge",
    "InvalidArgumentError",
    "InvalidArgumentValueError",
    "InvalidNodeError",
    "LoadShedError",
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
    "RetryBudget",
    "SchedulingNode",
    "Section",
    "StreamNotFinishedError",
    "SwitchNode",
    "TaskContext",
    "TaskScheduling",
    "TaskSupport",
    "TaskflowError",
    "ThreadPool",
    "Thresholds",
    "UnhashableKeyError",
    "UnknownCaseError",
    "UnknownNodeError",
    "UpstreamFailedError",
    "WorkResult",
    "budget_from_headers",
    "conductor",
    "fork_join",
    "http",
    "load_spec",
    "run_async",
    "set_event_loop",
    "set_load_shedding",
    "set_loop_block_threshold",
    "set_max_detached",
]
