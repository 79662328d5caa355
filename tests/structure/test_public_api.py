"""The public API is pinned: adding or removing a name is a deliberate change made here too."""

from __future__ import annotations

import taskflow

PUBLIC = [
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


def test_all_is_pinned():
    assert sorted(taskflow.__all__) == PUBLIC


def test_every_public_name_is_importable_from_the_package():
    missing = [name for name in PUBLIC if not hasattr(taskflow, name)]
    assert missing == []



def test_flow_result_is_a_plain_mapping_and_outputs_holds_the_values(make_executor) -> None:
    # regression: the ``values`` attribute shadowed Mapping.values() (result.values() raised)
    a = taskflow.FunctionNode(lambda ctx, p: 7, name="a")
    result = taskflow.TaskScheduling.start(a, executor=make_executor(2), timeout=5)
    assert result.outputs == {"a": 7}
    assert [n.name for n in result.values()] == ["a"]
    assert [(k, v.name) for k, v in result.items()] == [("a", "a")]
