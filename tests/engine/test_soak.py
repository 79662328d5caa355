"""A CI-sized soak of the engine: request threads starting random graphs with random faults on
one shared pool, the way a 110,000-run soak found the engine's worst races, at a size CI can
afford: hypothesis draws
8-16 runs of random DAGs (at most 12 nodes; joins ALL/ANY/quorum/BEST_EFFORT, optional edges,
node timeouts, retries) whose nodes succeed, raise, run slowly, hang until the test releases
them, or call ``ctx.cancel``; the runs start at once from their own caller threads on one shared
``ThreadPoolExecutor`` (some through ``start``, some through ``submit``), each with its own
budget. After every run returned, the hung tasks are released and the pool drained, so late
results and late hooks have had every chance to show up. Invariants (the documented contract, docs/concepts):

* ``start`` returns (``submit``'s future resolves) by its budget plus a generous slack;
* every node is in a terminal state when the run returns;
* each node gets ``on_success`` or ``on_fail`` at most once, matching its final state, and no
  hook starts after the run returned;
* late results never change a node's state or value;
* ``result.outputs`` holds exactly the nodes that ended SUCCESS, with their values.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import LONG, SCALE, HookLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import Join, ResultState, SchedulingNode, TaskContext, TaskScheduling, TaskSupport

# a failing example is reported by hypothesis through an import that warns on this machine;
# under `filterwarnings = error` that would hide the failure behind an INTERNALERROR
pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)

PROFILE: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
WORKERS = 8
# how late a run may return after its budget on a busy 2-core machine running 16 of them
SLACK = 1.5 * SCALE
TERMINAL = set(ResultState) - {ResultState.DEFAULT}  # every final state
FAILED = {ResultState.EXCEPTION, ResultState.TIMEOUT, ResultState.CANCELLED}
FAULTS = ("ok", "ok", "ok", "raise", "slow", "slow", "hang", "cancel")


@dataclass(frozen=True)
class NodeSpec:
    fault: str  # ok, raise, slow, hang (until the test releases it), cancel (ctx.cancel)
    fathers: tuple[int, ...]
    optional: frozenset[int]
    join: str  # all, any, quorum, best_effort
    quorum: int
    timeout: float | None
    retries: int
    delay: float  # how long a "slow" node sleeps (lateness, never ordering)
    hook_delay: float  # how long its hooks take (hooks should be quick)


@dataclass(frozen=True)
class RunSpec:
    nodes: tuple[NodeSpec, ...]
    budget: float
    via_submit: bool


@st.composite
def node_specs(draw: st.DrawFn, index: int, hook_delays: tuple[float, ...]) -> NodeSpec:
    fathers = tuple(sorted(draw(st.sets(st.integers(0, index - 1), max_size=3)))) if index else ()
    join = draw(st.sampled_from(("all", "all", "any", "quorum", "best_effort"))) if fathers else "all"
    optional = frozenset(draw(st.sets(st.sampled_from(fathers), max_size=1))) if (
        fathers and join == "all") else frozenset()
    return NodeSpec(
        fault=draw(st.sampled_from(FAULTS)),
        fathers=fathers,
        optional=optional,
        join=join,
        quorum=draw(st.integers(1, len(fathers))) if join == "quorum" else 1,
        timeout=draw(st.sampled_from((None, None, None, 0.03, 0.1))),
        retries=draw(st.sampled_from((0, 0, 1, 2))),
        delay=draw(st.sampled_from((0.005, 0.02, 0.05))),
        hook_delay=draw(st.sampled_from(hook_delays)),
    )


@st.composite
def run_specs(draw: st.DrawFn, hook_delays: tuple[float, ...]) -> RunSpec:
    n = draw(st.integers(1, 12))
    return RunSpec(
        nodes=tuple(draw(node_specs(i, hook_delays)) for i in range(n)),
        budget=draw(st.sampled_from((0.1, 0.2, 0.3, 0.5))),
        via_submit=draw(st.booleans()),
    )


class SoakNode(SchedulingNode[Any, Any]):
    """Does what its spec says; its hooks are recorded in the run's ``HookLog``."""

    def __init__(self, name: str, spec: NodeSpec, log: HookLog, release: threading.Event) -> None:
        joins = {"all": Join.ALL, "any": Join.ANY, "best_effort": Join.BEST_EFFORT}
        join = Join.quorum(spec.quorum) if spec.join == "quorum" else joins[spec.join]
        super().__init__(None, name=name, timeout=spec.timeout, retries=spec.retries,
                         retry_backoff=0.01, join=join)
        self.__dict__.update(_spec=spec, _log=log, _release=release)

    def task(self, ctx: TaskContext, param: Any) -> str:
        spec: NodeSpec = self.__dict__["_spec"]
        if spec.fault == "raise":
            raise ValueError(f"{self.name} failed")
        if spec.fault == "slow":
            time.sleep(spec.delay)
        elif spec.fault == "hang":
            self.__dict__["_release"].wait(LONG)
        elif spec.fault == "cancel":
            ctx.cancel(f"{self.name} cancelled the run")
        return f"{self.name}:{spec.fault}"

    def _hook(self, kind: str) -> None:
        self.__dict__["_log"].record(self.name, kind)
        delay = self.__dict__["_spec"].hook_delay
        if delay:
            time.sleep(delay)

    def on_success(self, support: TaskSupport) -> None:
        self._hook("on_success")

    def on_fail(self, support: TaskSupport) -> None:
        self._hook("on_fail")


@dataclass
class Outcome:
    spec: RunSpec
    log: HookLog
    result: Any = None
    elapsed: float = 0.0
    error: BaseException | None = None
    at_return: dict[str, tuple[ResultState, Any]] | None = None
    outputs: dict[str, Any] | None = None


def build(spec: RunSpec, log: HookLog, release: threading.Event) -> list[SoakNode]:
    nodes = [SoakNode(f"n{i}", s, log, release) for i, s in enumerate(spec.nodes)]
    for i, s in enumerate(spec.nodes):
        for f in s.fathers:
            nodes[i].depends_on(nodes[f], optional=f in s.optional)
    return nodes


def soak(specs: list[RunSpec]) -> list[Outcome]:
    """Start every run at once on one shared pool; return once all have returned, the hung
    tasks were released and the pool drained."""
    release = threading.Event()
    outcomes = [Outcome(spec, HookLog()) for spec in specs]
    barrier = threading.Barrier(len(specs))
    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="soak")

    def caller(out: Outcome) -> None:
        nodes = build(out.spec, out.log, release)
        barrier.wait(LONG)
        t0 = time.monotonic()
        try:
            if out.spec.via_submit:
                future = TaskScheduling.submit(nodes, executor=pool, timeout=out.spec.budget)
                result = future.result(timeout=out.spec.budget + LONG)
            else:
                result = TaskScheduling.start(nodes, executor=pool, timeout=out.spec.budget)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out.error = exc
            return
        finally:
            out.elapsed = time.monotonic() - t0
            with out.log._lock:
                out.log.returned = True
        out.result = result
        out.at_return = {n: (result[n].work_result.state, result[n].work_result.result)
                         for n in result}
        out.outputs = dict(result.outputs)

    callers = [threading.Thread(target=caller, args=(out,), name=f"soak-caller-{i}")
               for i, out in enumerate(outcomes)]
    try:
        for t in callers:
            t.start()
        for t in callers:
            t.join(2 * LONG)
        assert not any(t.is_alive() for t in callers), "a caller never returned"
    finally:
        release.set()
        pool.shutdown(wait=True)  # every late result and late hook has happened now
    for t in callers:
        t.join(LONG)
    return outcomes


def check_invariants(outcomes: list[Outcome]) -> Iterator[str]:
    """The soak's invariants (see the module docstring); yields one line per violation."""
    for k, out in enumerate(outcomes):
        where = f"run {k} ({'submit' if out.spec.via_submit else 'start'}, budget {out.spec.budget})"
        if out.error is not None or out.at_return is None or out.outputs is None:
            yield f"{where}: raised {out.error!r}"
            continue
        if out.elapsed > out.spec.budget + SLACK:
            yield f"{where}: returned after {out.elapsed:.3f}s"
        unfinished = {n: s.name for n, (s, _) in out.at_return.items() if s not in TERMINAL}
        if unfinished:
            yield f"{where}: not terminal when the run returned: {unfinished}"
        if out.log.late:
            yield f"{where}: hooks started after the run returned: {out.log.late}"
        for name, (state, _) in out.at_return.items():
            kinds = out.log.kinds(name)
            if len(kinds) > 1:
                yield f"{where}: {name} ({state.name}) got hooks {kinds}"
            elif kinds == ["on_success"] and state is not ResultState.SUCCESS:
                yield f"{where}: on_success for {name}, which ended {state.name}"
            elif kinds == ["on_fail"] and state not in FAILED:
                yield f"{where}: on_fail for {name}, which ended {state.name}"
        now = {n: (out.result[n].work_result.state, out.result[n].work_result.result)
               for n in out.result}
        changed = {n: (out.at_return[n], now[n]) for n in now if now[n] != out.at_return[n]}
        if changed:
            yield f"{where}: a late result changed a node: {changed}"
        success = {n: v for n, (s, v) in out.at_return.items() if s is ResultState.SUCCESS}
        if out.outputs != success:
            yield f"{where}: outputs {out.outputs} are not the SUCCESS nodes {success}"


def check_hooks_complete(outcomes: list[Outcome]) -> Iterator[str]:
    """Every failed node got its on_fail exactly once, and none started after the return."""
    for k, out in enumerate(outcomes):
        if out.at_return is None:
            continue
        if out.log.late:
            yield f"run {k}: hooks started after the run returned: {out.log.late}"
        for name, (state, _) in out.at_return.items():
            if state in FAILED and out.log.kinds(name) != ["on_fail"]:
                yield f"run {k}: {name} ended {state.name} with hooks {out.log.kinds(name)}"


def soak_violations(specs: st.SearchStrategy[list[RunSpec]], examples: int,
                    check: Callable[[list[Outcome]], Iterator[str]]) -> list[str]:
    """Soak ``examples`` drawn lists of runs and collect every violation ``check`` finds.

    Violations are collected, not asserted per example: a timing-dependent failure is reported
    with all the others instead of sending hypothesis into shrinking (and a Flaky error).
    """
    violations: list[str] = []
    count = iter(range(examples * 10))

    @settings(max_examples=examples, **PROFILE)
    @given(specs)
    def one(runs: list[RunSpec]) -> None:
        example = next(count)
        violations.extend(f"example {example}, {line}" for line in check(soak(runs)))

    one()
    return violations


def report(violations: list[str]) -> str:
    return f"{len(violations)} violation(s):\n" + "\n".join(violations[:20])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_soak_random_faults_on_one_shared_pool_keep_the_invariants() -> None:
    specs = st.lists(run_specs(hook_delays=(0.0,)), min_size=8, max_size=16)
    violations = soak_violations(specs, 40, check_invariants)
    assert violations == [], report(violations)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_soak_with_slow_hooks_every_failed_node_gets_on_fail_before_the_return() -> None:
    specs = st.lists(run_specs(hook_delays=(0.005, 0.02, 0.05)), min_size=8, max_size=16)
    violations = soak_violations(specs, 20, check_hooks_complete)
    assert violations == [], report(violations)
