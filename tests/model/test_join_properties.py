"""Property tests on random DAGs with random join policies and switches.

Every node is a ``JoinNode`` (it records the ``JoinOutput`` it saw) or a ``SwitchNode``, with a
random policy (ALL with random optional edges, ANY, quorum(k), BEST_EFFORT) and a deterministic
behaviour. A sequential oracle computes each node's *would-be* outcome ignoring cancellation;
the run must agree with it exactly, except that a node a join may no longer need may end
CANCELLED instead (whether it does depends on timing). Checked on ThreadPoolExecutor(1, 2, 4):

* P1 happens-before w.r.t. the join rules: a node starts only after the fathers its policy needs
  succeeded and ran their hook (ALL/BEST_EFFORT: every father that ran is terminal and hooked;
  ANY: one success; quorum(k): k successes), and its JoinOutput agrees with the fathers' states.
* P2 exactly-once and totality: every node ends in one final state, attempts = task calls =
  on_begin calls <= retries + 1, on_success once per SUCCESS, on_fail once per EXCEPTION or
  CANCELLED, no hook for SKIPPED; ``ok`` iff nothing ended EXCEPTION.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import LONG
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from taskflow import (
    Join,
    NodeCancelledError,
    ResultState,
    TaskScheduling,
    UpstreamFailedError,
)
from taskflow.kinds.forkjoin import JoinNode
from taskflow.kinds.switch import SwitchNode, UnknownCaseError

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)

PROFILE = {
    "max_examples": 100,
    "deadline": None,
    "derandomize": True,
    "database": None,
    # the suite's autouse leak checks are function-scoped; every example shuts its pool down
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                              HealthCheck.data_too_large],
}

SUCCESS, EXCEPTION, CANCELLED, SKIPPED = (ResultState.SUCCESS, ResultState.EXCEPTION,
                                          ResultState.CANCELLED, ResultState.SKIPPED)
POLICIES = {"all": Join.ALL, "any": Join.ANY, "best_effort": Join.BEST_EFFORT}


class NodeError(Exception):
    """What a node's own failing attempt raises."""


# --- the random flows ---------------------------------------------------------------------------


@st.composite
def flows(draw, max_nodes=12):
    """A list of node specs; index order is a topological order, fathers are earlier nodes."""
    n = draw(st.integers(1, max_nodes))
    specs = []
    for j in range(n):
        width = draw(st.sampled_from([1, 2, 3, 3]))  # single fathers make switch cases likely
        fathers = sorted(draw(st.sets(st.integers(0, j - 1), max_size=width))) if j else []
        policy = draw(st.sampled_from(["all", "all", "any", "quorum", "best_effort"])) if fathers else "all"
        specs.append({
            "fathers": fathers,
            "policy": policy,
            "k": draw(st.integers(1, len(fathers))) if policy == "quorum" else 0,
            "optional": sorted(draw(st.sets(st.sampled_from(fathers)))) if fathers and policy == "all" else [],
            "behaviour": draw(st.sampled_from(["ok", "ok", "ok", "slow", "flaky", "raise"])),
            "fail_times": draw(st.integers(1, 2)),
            "retries": draw(st.integers(0, 2)),
            "switch": draw(st.booleans()),
            "decision": draw(st.integers(0, 2)),
            "case": draw(st.sampled_from([0, 1, "default", None])),  # how a switch father routes it
        })
    for spec in specs:
        # a case node has the switch as its only father, so the outcome does not depend on how
        # a skipped switch edge meets another father (see test_switch.py's strict xfail)
        if len(spec["fathers"]) != 1 or not specs[spec["fathers"][0]]["switch"]:
            spec["case"] = None
    for i, spec in enumerate(specs):
        if spec["switch"] and not any(s["case"] is not None and s["fathers"] == [i] for s in specs):
            spec["switch"] = False  # a switch needs a case or a default
    return specs


def routes(specs, i):
    """Switch ``i``'s cases (value -> son indexes) and default, and its unrouted sons."""
    cases: dict[object, list[int]] = {}
    default: list[int] = []
    plain: list[int] = []
    for j, s in enumerate(specs):
        if i not in s["fathers"]:
            continue
        if s["case"] is None:
            plain.append(j)
        elif s["case"] == "default":
            default.append(j)
        else:
            cases.setdefault(s["case"], []).append(j)
    return cases, default, plain


# --- the oracle ----------------------------------------------------------------------------------


def oracle(specs):
    """Would-be outcome of each node ignoring cancellation: (kind, attempts, chosen sons).

    kind is "ok", "fail" (its own error), "upstream" (failed fast) or "skip"."""
    out: list[tuple[str, int, set[int] | None]] = []
    for j, s in enumerate(specs):
        edges = []
        for i in s["fathers"]:
            kind, _, chosen = out[i]
            if kind == "skip" or (kind == "ok" and chosen is not None and j not in chosen):
                edges.append("skip")
            else:
                edges.append("ok" if kind == "ok" else "fail")
        n, ok = len(edges), edges.count("ok")
        required_failed = any(e == "fail" and i not in s["optional"]
                              for e, i in zip(edges, s["fathers"], strict=True))
        if n and edges.count("skip") == n:
            out.append(("skip", 0, None))
            continue
        policy = s["policy"]
        if ((policy == "all" and required_failed) or (policy == "any" and ok == 0)
                or (policy == "quorum" and ok < s["k"])):
            out.append(("upstream", 0, None))
            continue
        tries = s["retries"] + 1
        if s["behaviour"] == "raise":
            out.append(("fail", tries, None))
            continue
        failures = s["fail_times"] if s["behaviour"] == "flaky" else 0
        if failures >= tries:
            out.append(("fail", tries, None))
            continue
        if not s["switch"]:
            out.append(("ok", failures + 1, None))
            continue
        cases, default, plain = routes(specs, j)
        branch = cases.get(s["decision"]) or (default if s["decision"] not in cases else None)
        if not branch:
            out.append(("fail", tries, None))  # UnknownCaseError, retried like any failure
        else:
            out.append(("ok", failures + 1, set(branch) | set(plain)))
    return out


def maybe_cancelled(specs):
    """Nodes a join may cancel: a father of an early-firing join, or of such a node, transitively."""
    early = [s["policy"] == "any" and len(s["fathers"]) > 1
             or s["policy"] == "quorum" and s["k"] < len(s["fathers"]) for s in specs]
    result: set[int] = set()
    for i in reversed(range(len(specs))):
        sons = [j for j, s in enumerate(specs) if i in s["fathers"]]
        if any(early[j] or j in result for j in sons):
            result.add(i)
    return result


# --- the nodes -------------------------------------------------------------------------------------


class Log:
    """Every step of one run with a global sequence number (``next`` on a count is atomic)."""

    def __init__(self) -> None:
        self.seq = itertools.count()
        self.steps: dict[str, list[tuple[str, int]]] = {}
        self.outputs: dict[str, list] = {}

    def add(self, name: str, kind: str) -> None:
        self.steps.setdefault(name, []).append((kind, next(self.seq)))

    def count(self, name: str, kind: str) -> int:
        return sum(1 for k, _ in self.steps.get(name, ()) if k == kind)

    def first(self, name: str, kind: str) -> int | None:
        return next((q for k, q in self.steps.get(name, ()) if k == kind), None)


def behave(log: Log, name: str, spec: dict) -> None:
    attempt = log.count(name, "start")
    if spec["behaviour"] == "raise" or (spec["behaviour"] == "flaky" and attempt <= spec["fail_times"]):
        raise NodeError(name)
    if spec["behaviour"] == "slow":
        time.sleep(0.001)


class Recorded:
    """Hooks that log; ``param`` is (log, spec)."""

    def on_begin(self, support):
        self.param[0].add(self.name, "begin")

    def on_success(self, support):
        self.param[0].add(self.name, "success")

    def on_fail(self, support):
        self.param[0].add(self.name, "fail")


class PropNode(Recorded, JoinNode):
    def task(self, ctx, param):
        log, spec = param
        log.add(self.name, "start")
        try:
            log.outputs.setdefault(self.name, []).append(self.collect(ctx))
            behave(log, self.name, spec)
            return self.name
        finally:
            log.add(self.name, "end")


class PropSwitch(Recorded, SwitchNode):
    def task(self, ctx, param):
        log, spec = param
        log.add(self.name, "start")
        try:
            behave(log, self.name, spec)
            return spec["decision"]
        finally:
            log.add(self.name, "end")


def build(specs, log):
    """The nodes, built sons first so a switch can be given its case nodes."""
    nodes: dict[int, object] = {}
    for i in reversed(range(len(specs))):
        s = specs[i]
        options = {"name": f"n{i}", "retries": s["retries"]}
        if s["policy"] == "quorum":
            options["join"] = Join.quorum(s["k"])
        else:
            options["join"] = POLICIES[s["policy"]]
        if s["switch"]:
            cases, default, _ = routes(specs, i)
            nodes[i] = PropSwitch(param=(log, s), cases={v: [nodes[j] for j in js] for v, js in cases.items()},
                                  default=[nodes[j] for j in default] or None, **options)
        else:
            nodes[i] = PropNode(param=(log, s), **options)
    for j, s in enumerate(specs):
        for i in s["fathers"]:
            nodes[j].depends_on(nodes[i], optional=i in s["optional"])
    return [nodes[i] for i in range(len(specs))]


# --- the property -----------------------------------------------------------------------------


@settings(**PROFILE)
@given(specs=flows(), workers=st.sampled_from([1, 2, 4]), tops=st.randoms(use_true_random=False))
def test_random_join_policies_agree_with_the_oracle_and_keep_p1_p2(specs, workers, tops):
    log = Log()
    nodes = build(specs, log)
    expected = oracle(specs)
    cancellable = maybe_cancelled(specs)
    start_from = tops.sample(nodes, k=len(nodes))  # hide the topological order from the library
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prop")
    try:
        result = TaskScheduling.start(start_from, executor=pool, timeout=LONG)
    finally:
        pool.shutdown(wait=True)  # a cancelled running father has returned: logs are complete

    assert result.elapsed < LONG, "a finite DAG without blocking finishes well within budget"
    for j, s in enumerate(specs):
        name = f"n{j}"
        wr = result[name].work_result
        kind, attempts, _ = expected[j]
        state = wr.state
        # P2: one final state, as many task calls and on_begin calls as attempts
        assert state is not ResultState.DEFAULT, name
        assert log.count(name, "start") == log.count(name, "end") == wr.attempts, name
        assert wr.attempts <= s["retries"] + 1, name
        assert log.count(name, "begin") == wr.attempts, name
        assert log.count(name, "success") == (state is SUCCESS), name
        assert log.count(name, "fail") == (state in (EXCEPTION, CANCELLED)), name
        # oracle agreement (cancellation aside)
        if state is CANCELLED:
            assert j in cancellable, f"{name} cancelled though no join could stop needing it"
            assert isinstance(wr.exception, NodeCancelledError) and wr.result is None
            assert wr.attempts <= attempts, name
            continue
        assert wr.attempts == attempts, name
        if kind == "ok":
            assert state is SUCCESS, (name, wr)
            assert wr.result == (s["decision"] if s["switch"] else name)
        elif kind == "fail":
            assert state is EXCEPTION, (name, wr)
            assert isinstance(wr.exception, (NodeError, UnknownCaseError)), (name, wr)
        elif kind == "upstream":
            assert state is EXCEPTION and isinstance(wr.exception, UpstreamFailedError), (name, wr)
        else:
            assert state is SKIPPED and wr.exception is None, (name, wr)
        if wr.attempts:
            check_happens_before(result, log, specs, j)
    for state in sorted({wr.state.name for wr in (result[n].work_result for n in result)}):
        event(f"some node {state}")  # shown by --hypothesis-show-statistics
    failed = {f"n{j}" for j in range(len(specs)) if result[f"n{j}"].work_result.state is EXCEPTION}
    assert set(result.failed) == failed
    sinks = {n for n in result if not result[n].son_handler}
    assert result.ok == (not failed & sinks)  # tolerated failures: COMPLETED_WITH_ERRORS


def check_happens_before(result, log, specs, j):
    """P1 for node ``j``, which started: what its policy needed came first, and its JoinOutput
    agrees with its fathers' final states."""
    s = specs[j]
    name = f"n{j}"
    started = log.first(name, "start")
    fathers = [f"n{i}" for i in s["fathers"]]
    final = {f: result[f].work_result for f in fathers}
    hooked = {f: log.first(f, "success") if final[f].state is SUCCESS else log.first(f, "fail")
              for f in fathers}
    succeeded_before = [f for f in fathers if final[f].state is SUCCESS and hooked[f] < started]
    policy = s["policy"]
    if policy in ("all", "best_effort"):
        for f in fathers:
            assert final[f].state is not CANCELLED, (name, f)
            # its terminal hook (failed-fast fathers' on_fail too) happened before this started
            if final[f].state is not SKIPPED:
                assert hooked[f] is not None and hooked[f] < started, (name, f)
    elif policy == "any":
        assert succeeded_before, name
    else:
        assert len(succeeded_before) >= s["k"], name
    if s["switch"]:
        return
    output = log.outputs[name][0]
    assert sorted([*output.results, *output.failed, *output.missing]) == sorted(fathers), name
    assert list(output.results) == [f for f in fathers if f in output.results], "wiring order"
    assert output.complete == (not output.failed and not output.missing)
    for f, value in output.results.items():
        assert final[f].state is SUCCESS and final[f].result == value, (name, f)
    for f, exc in output.failed.items():
        assert final[f].state is EXCEPTION and final[f].exception is exc, (name, f)
    if policy in ("all", "best_effort"):
        # every father was terminal before the join ran: the output is their final state
        assert set(output.results) == {f for f in fathers if final[f].state is SUCCESS}, name
        assert set(output.failed) == {f for f in fathers if final[f].state is EXCEPTION}, name
        assert set(output.missing) == {f for f in fathers if final[f].state is SKIPPED}, name
    elif policy == "any":
        assert output.results, name
    else:
        assert len(output.results) >= s["k"], name
