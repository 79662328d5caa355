"""Bad input (docs/concepts/run.md): invalid graphs and options raise before
anything runs — a spy executor proves that not one task was submitted.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from concurrent.futures import Executor, ThreadPoolExecutor

import pytest
from conftest import LONG

from taskflow import (
    CycleError,
    DuplicateNameError,
    FlowDefinitionError,
    FunctionNode,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
)


class SpyExecutor(Executor):
    """Counts submissions and delegates them to a real pool."""

    def __init__(self, inner: ThreadPoolExecutor) -> None:
        self.inner = inner
        self.submits = 0
        self._lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs):
        with self._lock:
            self.submits += 1
        return self.inner.submit(fn, *args, **kwargs)


@pytest.fixture
def spy(make_executor):
    return SpyExecutor(make_executor(2))


@pytest.fixture
def ran():
    return []


def recorder(ran):
    def fn(ctx, param):
        ran.append(param)
        return param

    return fn


def n(ran, name):
    return FunctionNode(recorder(ran), param=name, name=name)


class Plain(SchedulingNode):
    def task(self, ctx, param):
        return param


# --- B1: cycles ---------------------------------------------------------------------------------


def _raises_cycle(build, spy):
    """Wiring may refuse a cycle at once or ``start`` may; either way it is a CycleError."""
    with pytest.raises(FlowDefinitionError) as info:
        root = build()
        TaskScheduling.start(root, executor=spy, timeout=LONG)
    assert isinstance(info.value, CycleError), repr(info.value)
    assert spy.submits == 0
    return info.value


def test_self_loop_is_a_cycle(spy, ran):
    def build():
        a = n(ran, "a")
        a >> a
        return a

    exc = _raises_cycle(build, spy)
    assert exc.cycle == ["a", "a"]
    assert "'a'" in str(exc)
    assert ran == []


def test_two_node_cycle_is_named(spy, ran):
    def build():
        root, a, b = n(ran, "root"), n(ran, "a"), n(ran, "b")
        root >> a >> b >> a
        return root

    exc = _raises_cycle(build, spy)
    assert set(exc.cycle) == {"a", "b"}
    assert len(exc.cycle) == 3 and exc.cycle[0] == exc.cycle[-1]
    assert "'a'" in str(exc) and "'b'" in str(exc)
    assert "root" not in exc.cycle
    assert ran == []


def test_cycle_declared_with_father_handler_is_found(spy, ran):
    def build():
        a, b, c = n(ran, "a"), n(ran, "b"), n(ran, "c")
        b.set_father_handler(a)
        c.set_father_handler(b)
        a.set_father_handler(c)
        return a

    exc = _raises_cycle(build, spy)
    assert set(exc.cycle) == {"a", "b", "c"}


def test_cycle_hidden_in_1000_nodes_is_named_without_recursion(spy, ran):
    edges: set[tuple[str, str]] = set()

    def build():
        nodes = [n(ran, f"n{i}") for i in range(1000)]
        for i in range(999):
            nodes[i] >> nodes[i + 1]
            edges.add((f"n{i}", f"n{i + 1}"))
        for i in range(0, 993, 3):
            nodes[i] >> nodes[i + 7]
            edges.add((f"n{i}", f"n{i + 7}"))
        nodes[600] >> nodes[598]  # the only way back: n598 -> n599 -> n600 -> n598
        edges.add(("n600", "n598"))
        return nodes[0]

    exc = _raises_cycle(build, spy)
    cycle = exc.cycle
    assert set(cycle) == {"n598", "n599", "n600"}
    assert len(cycle) == 4 and cycle[0] == cycle[-1]
    pairs = list(itertools.pairwise(cycle))
    assert all(p in edges for p in pairs) or all((b, a) in edges for a, b in pairs), cycle
    assert ran == []


# --- B2: duplicate names ------------------------------------------------------------------------


def test_two_nodes_with_one_name_are_rejected(spy, ran):
    root, x1, x2 = n(ran, "root"), n(ran, "x"), n(ran, "x")
    root >> [x1, x2]

    with pytest.raises(DuplicateNameError) as info:
        TaskScheduling.start(root, executor=spy)

    assert isinstance(info.value, FlowDefinitionError)
    assert info.value.name == "x"
    assert "'x'" in str(info.value)
    assert spy.submits == 0 and ran == []


def test_duplicate_name_found_only_through_discovery_is_rejected(spy, ran):
    a, b = n(ran, "a"), n(ran, "b")
    twin = n(ran, "a")
    a >> b
    twin >> b  # reached from a only through b's fathers

    with pytest.raises(DuplicateNameError):
        TaskScheduling.start(a, executor=spy)
    assert spy.submits == 0 and ran == []


def test_default_names_of_two_instances_of_one_class_collide(spy):
    a, b = Plain(param=1), Plain(param=2)
    a >> b
    with pytest.raises(DuplicateNameError) as info:
        TaskScheduling.start(a, executor=spy)
    assert info.value.name == "Plain"
    assert spy.submits == 0


def test_the_same_instance_listed_twice_is_one_node(spy, ran):
    a = n(ran, "a")
    result = TaskScheduling.start([a, a, a], executor=spy, timeout=LONG)
    assert result.ok
    assert ran == ["a"]
    assert len(result) == 1


# --- B4/B7: things that are not nodes -----------------------------------------------------------


class NotANode:
    pass


@pytest.mark.parametrize(
    "bad",
    [None, 42, "a", lambda ctx, param: None, Plain, NotANode(), FunctionNode],
    ids=["None", "int", "str", "function", "class-not-instance", "object", "FunctionNode-class"],
)
def test_non_node_in_the_list_is_rejected_naming_its_index(spy, ran, bad):
    good, other = n(ran, "good"), n(ran, "other")

    with pytest.raises(FlowDefinitionError) as info:
        TaskScheduling.start([good, other, bad], executor=spy)

    assert re.search(r"\b2\b", str(info.value)), f"index 2 not named: {info.value}"
    assert spy.submits == 0 and ran == [], "no partial submission"


def test_class_instead_of_instance_is_named(spy):
    with pytest.raises(FlowDefinitionError) as info:
        TaskScheduling.start([Plain], executor=spy)
    assert "Plain" in str(info.value)
    assert spy.submits == 0


def test_one_non_node_that_is_not_iterable_is_rejected(spy):
    with pytest.raises((TypeError, ValueError)):
        TaskScheduling.start(42, executor=spy)
    assert spy.submits == 0


@pytest.mark.parametrize(
    "bad", [None, 3, "b", Plain, NotANode()], ids=["None", "int", "str", "class", "object"]
)
@pytest.mark.parametrize("how", ["son", "father", "depends_on", "rshift"])
def test_wiring_a_non_node_raises_in_the_wiring_call(bad, how):
    a = Plain(name="a")
    with pytest.raises((TypeError, ValueError)):
        if how == "son":
            a.set_son_handler(bad)
        elif how == "father":
            a.set_father_handler(bad)
        elif how == "depends_on":
            a.depends_on(bad)
        else:
            a >> bad
    assert list(a.son_handler) == [] and list(a.father_handler) == []


def test_one_shot_generator_of_nodes_is_accepted(spy, ran):
    a, b = n(ran, "a"), n(ran, "b")
    result = TaskScheduling.start((x for x in (a, b)), executor=spy, timeout=LONG)
    assert result.ok and sorted(ran) == ["a", "b"]


def test_empty_node_list_returns_an_empty_ok_result_without_submitting(spy):
    for nodes in ([], (), iter([])):
        result = TaskScheduling.start(nodes, executor=spy)
        assert result.ok and len(result) == 0
        assert dict(result.outputs) == {} and dict(result.failed) == {}
        assert result.raise_for_failure() is None
    assert spy.submits == 0


def test_node_without_task_is_rejected_naming_its_class(spy):
    class NoTask(SchedulingNode):
        pass

    with pytest.raises((TypeError, FlowDefinitionError)) as info:
        TaskScheduling.start(NoTask(), executor=spy)
    assert "NoTask" in str(info.value)
    assert spy.submits == 0


# --- executor and context -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "executor",
    [None, object(), ThreadPoolExecutor, "pool", lambda fn: fn()],
    ids=["None", "object", "class", "str", "function"],
)
def test_bad_executor_is_rejected_before_anything_runs(ran, executor):
    a = n(ran, "a")
    with pytest.raises((TypeError, ValueError)) as info:
        TaskScheduling.start(a, executor=executor)
    assert "executor" in str(info.value).lower()
    assert ran == []


def test_missing_executor_is_a_type_error(ran):
    with pytest.raises(TypeError):
        TaskScheduling.start(n(ran, "a"))  # type: ignore[call-arg]
    assert ran == []


@pytest.mark.parametrize(
    "context", [42, "ctx", object(), [("a", 1)]], ids=["int", "str", "object", "list"]
)
def test_bad_context_is_rejected_before_anything_runs(spy, ran, context):
    with pytest.raises((TypeError, ValueError)):
        TaskScheduling.start(n(ran, "a"), executor=spy, context=context)
    assert spy.submits == 0 and ran == []


def test_given_context_is_used_by_the_run(spy):
    ctx = TaskContext({"k": "v"})
    result = TaskScheduling.start(
        FunctionNode(lambda c, p: c["k"], name="a"), executor=spy, context=ctx, timeout=LONG
    )
    assert result.outputs == {"a": "v"}


# --- B5: timeout values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (-1, ValueError, "timeout must be non-negative"),
        (-0.001, ValueError, "timeout must be non-negative"),
        (-math.inf, ValueError, "timeout must be non-negative"),
        (math.nan, ValueError, "timeout must not be NaN"),
        (True, TypeError, None),
        (False, TypeError, None),
        ("1", TypeError, None),
        ([1], TypeError, None),
    ],
    ids=["-1", "-0.001", "-inf", "nan", "True", "False", "str", "list"],
)
def test_bad_timeout_is_rejected_before_anything_runs(spy, ran, timeout, error, message):
    with pytest.raises(error) as info:
        TaskScheduling.start(n(ran, "a"), executor=spy, timeout=timeout)
    if message:
        assert message in str(info.value)
    assert spy.submits == 0 and ran == []


@pytest.mark.parametrize("timeout", [None, math.inf, 1, LONG])
def test_good_timeouts_are_accepted(spy, ran, timeout):
    result = TaskScheduling.start(n(ran, "a"), executor=spy, timeout=timeout)
    assert result.ok and ran == ["a"]


def test_bad_timeout_is_rejected_by_submit_too(spy, ran):
    with pytest.raises(ValueError):
        TaskScheduling.submit(n(ran, "a"), executor=spy, timeout=-1)
    assert spy.submits == 0 and ran == []


# --- B6: node options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retries", -1),
        ("retry_backoff", -0.5),
        ("retry_backoff", math.nan),
        ("timeout", -1),
        ("timeout", math.nan),
    ],
    ids=["retries=-1", "backoff=-0.5", "backoff=nan", "timeout=-1", "timeout=nan"],
)
def test_bad_node_option_is_rejected_before_anything_runs(spy, ran, option, value):
    with pytest.raises(ValueError) as info:
        bad = FunctionNode(recorder(ran), param="bad", name="bad", **{option: value})
        good = n(ran, "good")
        good >> bad
        TaskScheduling.start(good, executor=spy)
    assert option in str(info.value) or "bad" in str(info.value), str(info.value)
    assert spy.submits == 0 and ran == []


@pytest.mark.parametrize(
    ("option", "value"), [("retries", 1.5), ("retries", "2"), ("timeout", "1")]
)
def test_node_option_of_the_wrong_type_is_rejected(spy, ran, option, value):
    with pytest.raises((TypeError, ValueError)):
        bad = FunctionNode(recorder(ran), param="bad", name="bad", **{option: value})
        TaskScheduling.start(bad, executor=spy)
    assert spy.submits == 0 and ran == []
