"""The public API is pinned: adding or removing a name is a deliberate change made here too."""

from __future__ import annotations

import importlib

import pytest

import taskflow

PUBLIC = [
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
    "ItemTimeoutError",
    "Join",
    "JoinNode",
    "JoinOutput",
    "LoadShedError",
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


def test_all_is_pinned():
    assert sorted(taskflow.__all__) == PUBLIC


def test_every_public_name_is_importable_from_the_package():
    missing = [name for name in PUBLIC if not hasattr(taskflow, name)]
    assert missing == []


# the other namespaces a user imports from or reaches through ``taskflow.<name>``
NAMESPACES = {
    "taskflow.resilience": [
        "Batch", "BatchKeys", "BatchMetrics", "BreakerMetrics", "BreakerState", "Bulkhead", "BulkheadFullError", "BulkheadMetrics",
        "CircuitBreaker", "CircuitOpenError", "Fallback", "FallbackError", "Hedge",
        "LatencyRegistry", "LatencyTracker", "LoadSheddingMetrics", "RateLimit", "RateLimitMetrics", "RetryBudget",
        "RetryBudgetMetrics", "SingleFlight", "SingleFlightMetrics", "UnhashableKeyError",
        "latencies", "render_prometheus", "set_load_shedding",
    ],
    "taskflow.declare.conductor": [
        "HostNotAllowedError", "INPUT_KEY", "JqError", "Limits", "SUPPORTED_TYPES", "ScriptError",
        "TaskFailedError", "TaskFn", "Workflow", "WorkflowRun", "load",
    ],
    "taskflow.observe.stats": [
        "DEFAULT_BUCKETS", "FlowStats", "FlowStatsModel", "KeptRun", "NodeStatsModel",
        "PrometheusCollector", "RunLog", "STATS", "StatsSnapshot", "critical_path", "disable",
        "enable", "flow_name_of", "record_run", "snapshot", "to_prometheus",
    ],
    "taskflow.observe.otel": ["instrument", "instrumented", "uninstrument"],
    "taskflow.observe.web": ["make_app"],
    "taskflow.http": ["async_httpx_client", "httpx_client", "session"],
    "taskflow.testing": ["DEFAULT_MAX_STEPS", "FakeClock", "ManualExecutor", "StepLimitError"],
}
# ``taskflow.conductor`` and friends are these modules, loaded on first access
REACHED_AS = {"conductor": "taskflow.declare.conductor", "stats": "taskflow.observe.stats",
              "otel": "taskflow.observe.otel", "web": "taskflow.observe.web",
              "http": "taskflow.http"}


@pytest.mark.parametrize("module", sorted(NAMESPACES))
def test_every_public_namespace_is_pinned_and_importable(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == NAMESPACES[module]
    assert [name for name in mod.__all__ if not hasattr(mod, name)] == []


@pytest.mark.parametrize(("name", "module"), sorted(REACHED_AS.items()))
def test_module_valued_names_of_the_package_are_the_pinned_modules(name: str, module: str) -> None:
    assert getattr(taskflow, name) is importlib.import_module(module)


@pytest.mark.parametrize(("name", "module"), sorted(REACHED_AS.items()))
def test_module_valued_names_import_as_the_documentation_writes_them(name: str, module: str
                                                                     ) -> None:
    # ``from taskflow.web import make_app`` in a fresh interpreter (no attribute touched
    # first): the statement imports the real module, the same object under both names
    import subprocess
    import sys

    member = importlib.import_module(module).__all__[0]
    code = (f"from taskflow.{name} import {member}\n"
            f"import sys, taskflow.{name}\n"
            f"assert sys.modules['taskflow.{name}'] is sys.modules[{module!r}]\n"
            f"assert taskflow.{name} is sys.modules[{module!r}]\n"
            f"assert {member} is getattr(sys.modules[{module!r}], {member!r})\n"
            f"assert sys.modules[{module!r}].__spec__.name == {module!r}\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_a_name_that_is_no_module_still_fails_to_import() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("taskflow.no_such_part")


def test_engine_internal_names_stay_out_of_the_resilience_namespace() -> None:
    # permits, races, shared calls and dispatch weights are the engine's; users never build them
    import taskflow.resilience as resilience

    for internal in ("HedgeRace", "Verdict", "Permit", "Ticket", "Reservation", "BreakerPermit",
                     "Member", "SharedCall", "Outcome", "node_weights", "remaining_paths",
                     "Seat", "BatchCall", "RetryToken"):
        assert internal not in resilience.__all__
        assert not hasattr(resilience, internal), internal



def test_flow_result_is_a_plain_mapping_and_outputs_holds_the_values(make_executor) -> None:
    # regression: the ``values`` attribute shadowed Mapping.values() (result.values() raised)
    a = taskflow.FunctionNode(lambda ctx, p: 7, name="a")
    result = taskflow.TaskScheduling.start(a, executor=make_executor(2), timeout=5)
    assert result.outputs == {"a": 7}
    assert [n.name for n in result.values()] == ["a"]
    assert [(k, v.name) for k, v in result.items()] == [("a", "a")]
