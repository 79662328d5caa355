"""Fields a run makes only when its mode or plan writes them, and what the others read."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from taskflow import FunctionNode, SwitchNode, TaskContext, TaskScheduling
from taskflow.engine.run import Run
from taskflow.engine.unused import Unused, UnusedSet
from taskflow.errors import FlowDefinitionError
from taskflow.model.context import current
from taskflow.model.result import ResultState


def test_an_unused_field_reads_as_empty_and_refuses_a_write():
    d, s = Unused(), UnusedSet()
    assert d.get(1) is None and d.pop(1, None) is None and not d and list(d.items()) == []
    assert 1 not in s and not s
    s.discard(1)
    with pytest.raises(TypeError, match="taskflow bug"):
        d[1] = 2
    with pytest.raises(TypeError, match="taskflow bug"):
        d.setdefault(1, 2)
    with pytest.raises(TypeError, match="taskflow bug"):
        s.add(1)


def test_a_run_without_loops_timeouts_or_options_shares_the_empty_defaults():
    seen = {}

    def look(ctx, param):
        r = current.__dict__["run"]  # the run of this attempt
        seen.update(loop_futs=r.loop_futs, guards=r.guards, node_timers=r.node_timers,
                    fans=r.fans, chosen=r.chosen)

    node = FunctionNode(look, name="look")
    with ThreadPoolExecutor(1) as pool:
        def nested():  # inline on the pool's own worker: no loops
            return TaskScheduling.start(node, executor=pool, timeout=5.0)

        result = pool.submit(nested).result()
    assert result.result_of("look").state is ResultState.SUCCESS
    assert seen["loop_futs"] is Run.loop_futs and seen["guards"] is Run.guards
    assert seen["node_timers"] is Run.node_timers
    assert seen["fans"] is Run.fans and seen["chosen"] is Run.chosen


def test_a_switch_on_an_inline_run_makes_its_own_routes():
    left = FunctionNode(lambda ctx, p: "L", name="left")
    right = FunctionNode(lambda ctx, p: "R", name="right")
    switch = SwitchNode.of(lambda ctx, p: "l", name="switch", cases={"l": left, "r": right})
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(lambda: TaskScheduling.start(switch, executor=pool,
                                                          timeout=5.0)).result()
    assert result.result_of("left").state is ResultState.SUCCESS
    assert result.result_of("right").state is ResultState.SKIPPED
    assert not Run.chosen  # the run wrote its own


def test_a_context_given_to_two_runs_at_once_is_still_refused():
    started, release = threading.Event(), threading.Event()

    def hold(ctx, param):
        started.set()
        release.wait(5)

    ctx = TaskContext()
    with ThreadPoolExecutor(2) as pool:
        first = TaskScheduling.submit(FunctionNode(hold, name="hold"), executor=pool,
                                      timeout=5.0, context=ctx)
        assert started.wait(5)
        with pytest.raises(FlowDefinitionError, match="already used"):
            TaskScheduling.start(FunctionNode(hold, name="other"), executor=pool, context=ctx)
        release.set()
        first.result(5)
