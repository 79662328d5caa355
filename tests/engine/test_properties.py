"""Property tests on random DAGs, Join.ALL only: the outcome matches a
sequential oracle, every node runs at most once, and no node runs before its fathers.

Every example is run on ThreadPoolExecutor(1), (2) and (4) and compared with a sequential
oracle: the same spec interpreted in topological order on one thread.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import EPS, LONG, SHORT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import (
    NodeState,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    UpstreamFailedError,
)

# a failing example is reported by hypothesis through an import that warns on this machine;
# under `filterwarnings = error` that would hide the failure behind an INTERNALERROR
pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)

MOD = 1_000_003
PROFILE = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@st.composite
def dags(draw, max_nodes=12, behaviours=("ok", "ok", "ok", "slow", "flaky", "raise")):
    """(names, deps, spec, perm): index order of ``names`` is a topological order."""
    n = draw(st.integers(1, max_nodes))
    names = [f"n{i}" for i in range(n)]
    deps = {
        name: sorted(draw(st.sets(st.sampled_from(names[:j]), max_size=3))) if j else []
        for j, name in enumerate(names)
    }
    spec = {
        name: draw(
            st.fixed_dictionaries(
                {
                    "behaviour": st.sampled_from(behaviours),
                    "fail_times": st.integers(1, 3),
                    "retries": st.integers(0, 2),
                }
            )
        )
        for name in names
    }
    perm = draw(st.permutations(names))  # hide the order from the library
    return names, deps, spec, perm


def oracle(names, deps, spec):
    """Sequential interpreter. outcome[name] is ("ok", value) | ("raise",) | ("upstream",) |
    ("blocked",); execs[name] is how many attempts run (a blocked node counts 1)."""
    outcome: dict[str, tuple] = {}
    execs: dict[str, int] = {}
    for i, name in enumerate(names):
        fathers = [outcome[d] for d in deps[name]]
        if any(f[0] in ("raise", "upstream") for f in fathers):
            outcome[name], execs[name] = ("upstream",), 0
            continue
        if any(f[0] == "blocked" for f in fathers):
            outcome[name], execs[name] = ("blocked",), 0
            continue
        s = spec[name]
        behaviour, retries = s["behaviour"], s["retries"]
        if behaviour == "block":
            outcome[name], execs[name] = ("blocked",), 1
        elif behaviour == "raise" or (behaviour == "flaky" and s["fail_times"] > retries):
            outcome[name], execs[name] = ("raise",), retries + 1
        else:
            execs[name] = s["fail_times"] + 1 if behaviour == "flaky" else 1
            outcome[name] = ("ok", value_of(i, [f[1] for f in fathers]))
    return outcome, execs


def value_of(index, father_values):
    return (index * 7 + 1 + sum(father_values)) % MOD


class Recorder:
    """Everything the nodes of one run observe, with a global sequence for happens-before."""

    def __init__(self, release: threading.Event) -> None:
        self.lock = threading.Lock()
        self.seq = 0
        self.starts: dict[str, list[int]] = {}
        self.ends: dict[str, list[int]] = {}
        self.hooks: dict[str, list[str]] = {}
        self.active = 0
        self.max_active = 0
        self.returned = False
        self.late_hooks: list[tuple[str, str]] = []
        self.release = release

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def begin(self, name: str) -> int:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.starts.setdefault(name, []).append(self.tick())
            return len(self.starts[name])

    def end(self, name: str) -> None:
        with self.lock:
            self.active -= 1
            self.ends.setdefault(name, []).append(self.tick())

    def hook(self, name: str, kind: str) -> None:
        with self.lock:
            self.hooks.setdefault(name, []).append(kind)
            if self.returned:
                self.late_hooks.append((name, kind))


def build_graph(names, deps, spec, current):
    """Build the node objects once; ``current["rec"]`` selects the Recorder of the ongoing run."""

    class Probe(SchedulingNode):
        def task(self, ctx, param):
            index, name = param
            rec: Recorder = current["rec"]
            attempt = rec.begin(name)
            try:
                s = spec[name]
                behaviour = s["behaviour"]
                if behaviour == "slow":
                    time.sleep(0.002)
                elif behaviour == "block":
                    rec.release.wait(LONG)
                    return "late"
                elif behaviour == "raise" or (behaviour == "flaky" and attempt <= s["fail_times"]):
                    raise ValueError(name, attempt)
                return value_of(index, [ctx.result_of(d) for d in deps[name]])
            finally:
                rec.end(name)

        def on_begin(self, support):
            current["rec"].hook(self.name, "begin")

        def on_success(self, support):
            current["rec"].hook(self.name, "success")

        def on_fail(self, support):
            current["rec"].hook(self.name, "fail")

    nodes = {
        name: Probe(param=(i, name), name=name, retries=spec[name]["retries"])
        for i, name in enumerate(names)
    }
    for name in names:
        for d in deps[name]:
            nodes[d] >> nodes[name]
    return nodes


def check_happens_before(names, deps, rec):
    """P1: a son's first attempt starts after its father's last attempt ended."""
    for name in names:
        if name not in rec.starts:
            continue
        for d in deps[name]:
            assert d in rec.ends, f"{name} started but its father {d} never ran"
            assert rec.starts[name][0] > rec.ends[d][-1], f"{name} started before {d} ended"


def ancestors_of(names, deps):
    anc: dict[str, set[str]] = {}
    for name in names:
        anc[name] = set(deps[name]).union(*(anc[d] for d in deps[name])) if deps[name] else set()
    return anc


# --- P1, P2, P3: deterministic behaviours, no budget pressure --------------------------------


@settings(max_examples=100, **PROFILE)
@given(dags())
def test_random_dags_agree_with_the_sequential_oracle_on_1_2_and_4_workers(dag):
    names, deps, spec, perm = dag
    expected, execs = oracle(names, deps, spec)
    current: dict[str, Recorder] = {}
    nodes = build_graph(names, deps, spec, current)
    anc = ancestors_of(names, deps)

    for workers in (1, 2, 4):
        rec = current["rec"] = Recorder(threading.Event())
        pool = ThreadPoolExecutor(workers, thread_name_prefix=f"prop{workers}")
        try:
            result = TaskScheduling.start(
                [nodes[p] for p in perm], executor=pool, timeout=LONG, context=TaskContext()
            )
            rec.returned = True
        finally:
            pool.shutdown(wait=True)
        where = f"workers={workers}"

        # P2 totality and exactly-once
        assert set(result) == set(names), where
        for name in names:
            node, wr = result[name], result[name].work_result
            outcome = expected[name]
            assert len(rec.starts.get(name, [])) == execs[name], (where, name, spec[name])
            assert wr.attempts == execs[name], (where, name)
            hooks = rec.hooks.get(name, [])
            assert hooks.count("begin") == execs[name], (where, name, hooks)
            if outcome[0] == "ok":
                # P3 oracle agreement
                assert node.state is NodeState.FINISH, (where, name)
                assert wr.state is ResultState.SUCCESS, (where, name, wr.exception)
                assert wr.result == outcome[1], (where, name)
                assert hooks[-1:] == ["success"] and "fail" not in hooks, (where, name, hooks)
                assert wr.thread.startswith(f"prop{workers}"), (where, name, wr.thread)
            else:
                assert node.state is NodeState.ERROR, (where, name)
                assert wr.state is ResultState.EXCEPTION, (where, name, wr.state)
                assert hooks[-1:] == ["fail"] and "success" not in hooks, (where, name, hooks)
                if outcome[0] == "raise":
                    assert isinstance(wr.exception, ValueError), (where, name)
                    assert wr.exception.args == (name, execs[name]), "the last attempt's error"
                else:
                    assert isinstance(wr.exception, UpstreamFailedError), (where, name)
                    chain, exc = [], wr.exception
                    while exc is not None and len(chain) < len(names) + 2:
                        chain.append(exc)
                        exc = exc.__cause__
                    originals = [c for c in chain if isinstance(c, ValueError)]
                    assert originals and originals[-1].args[0] in anc[name], (where, name)
        assert rec.late_hooks == [], where
        failed = {n for n in names if expected[n][0] != "ok"}
        assert set(result.failed) == failed, where
        assert result.ok == (not failed), where
        assert dict(result.outputs) == {n: o[1] for n, o in expected.items() if o[0] == "ok"}, where
        # P1 happens-before, and the pool bound
        check_happens_before(names, deps, rec)
        assert rec.max_active <= workers, where
        if failed:
            try:
                result.raise_for_failure()
            except ValueError as exc:
                assert any(exc is result[n].work_result.exception for n in failed), where
            else:
                raise AssertionError(f"{where}: raise_for_failure did not raise an original error")
        else:
            assert result.raise_for_failure() is None
    # the definition was never touched by the three runs
    assert all(node.state is NodeState.INIT for node in nodes.values())


# --- P4: blocking nodes, a budget, late results -------------------------------------------------


@settings(max_examples=25, **PROFILE)
@given(
    dags(max_nodes=10, behaviours=("ok", "ok", "ok", "slow", "raise", "block")),
    st.sampled_from([1, 2, 4]),
)
def test_random_dags_with_blocked_nodes_end_by_the_budget_and_never_change_afterwards(dag, workers):
    names, deps, spec, perm = dag
    expected, _ = oracle(names, deps, spec)
    current: dict[str, Recorder] = {}
    nodes = build_graph(names, deps, spec, current)
    release = threading.Event()
    rec = current["rec"] = Recorder(release)
    budget = 3 * SHORT
    pool = ThreadPoolExecutor(workers, thread_name_prefix="p4")
    try:
        t0 = time.monotonic()
        result = TaskScheduling.start([nodes[p] for p in perm], executor=pool, timeout=budget)
        elapsed = time.monotonic() - t0
        rec.returned = True
        at_return = {n: (result[n].work_result.state, result[n].work_result.result) for n in names}
    finally:
        release.set()
        pool.shutdown(wait=True)

    assert elapsed < budget + EPS
    blocked = {n for n in names if spec[n]["behaviour"] == "block" and expected[n] == ("blocked",)}
    for name in names:
        state, value = at_return[name]
        outcome = expected[name]
        assert state in (ResultState.SUCCESS, ResultState.EXCEPTION, ResultState.TIMEOUT), (
            name,
            state,
        )
        if state is ResultState.SUCCESS:
            assert outcome[0] == "ok" and value == outcome[1], (name, outcome, value)
        if state is ResultState.EXCEPTION:
            assert outcome[0] in ("raise", "upstream"), (name, outcome)
        if name in blocked:
            assert state is ResultState.TIMEOUT, name
        hooks = rec.hooks.get(name, [])
        assert hooks.count("success") == (state is ResultState.SUCCESS), (name, hooks)
        assert hooks.count("fail") == (state is not ResultState.SUCCESS), (name, hooks)
    assert result.ok == all(s is ResultState.SUCCESS for s, _ in at_return.values())
    if blocked:
        assert not result.ok
    # late results never change a result, and no hook ran after start returned
    assert {
        n: (result[n].work_result.state, result[n].work_result.result) for n in names
    } == at_return
    assert rec.late_hooks == []
    check_happens_before(names, deps, rec)
    assert rec.max_active <= workers
