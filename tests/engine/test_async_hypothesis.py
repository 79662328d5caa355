"""Random mixed DAGs of sync and async nodes (some raise, some fail once and retry, some wait,
some hang until the run gives up on them, one may call ``ctx.cancel``; joins ALL, ANY and best
effort), run by ``start``, ``stream`` or ``run_async``: every node settles exactly once, its
``on_success``/``on_fail`` hook runs exactly once as its final state says, nothing (no hook, no
node's state) changes after the run has returned, and sons see the values of their fathers
that succeeded through ``ctx.result_of``."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import LONG, PROMPT, SHORT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskflow
from taskflow import Join, ResultState, SchedulingNode, TaskContext, TaskScheduling, TaskSupport
from taskflow.engine import aio

pytestmark = [
    pytest.mark.timeout(120),
    # a failing example is reported by hypothesis through an import that warns on this machine
    pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"),
]

S = ResultState
FAILED = (S.EXCEPTION, S.TIMEOUT, S.CANCELLED)
BEHAVIOURS = ("ok", "ok", "raise", "flaky", "waits", "hangs", "cancels")
JOINS = {"all": Join.ALL, "any": Join.ANY, "best_effort": Join.BEST_EFFORT}
BUDGET = SHORT * 2  # a run with a node that hangs ends at its budget


class Boom(Exception):
    pass


@dataclass
class Record:
    """What the nodes and hooks of one run did (any thread)."""

    gate: threading.Event = field(default_factory=threading.Event)  # lets sync hangs return
    lock: threading.Lock = field(default_factory=threading.Lock)
    attempts: Counter[str] = field(default_factory=Counter)
    hooks: Counter[tuple[str, str]] = field(default_factory=Counter)
    seen: dict[str, dict[str, tuple[str, Any]]] = field(default_factory=dict)
    returned: bool = False
    late: list[tuple[str, str]] = field(default_factory=list)  # hooks run after the return

    def attempt(self, name: str, ctx: TaskContext, fathers: list[str]) -> int:
        seen: dict[str, tuple[str, Any]] = {}
        for f in fathers:
            try:
                seen[f] = ("ok", ctx.result_of(f))
            except Exception as exc:  # noqa: BLE001 - a father that did not succeed (yet)
                seen[f] = ("error", type(exc).__name__)
        with self.lock:
            self.attempts[name] += 1
            self.seen[name] = seen
            return self.attempts[name]

    def hook(self, name: str, which: str) -> None:
        with self.lock:
            self.hooks[(name, which)] += 1
            if self.returned:
                self.late.append((name, which))


@dataclass(frozen=True)
class Spec:
    behaviour: str
    fathers: tuple[str, ...]


def _begin(ctx: TaskContext, name: str, spec: Spec) -> Record:
    """An attempt's start, sync or async: note what it sees of its fathers, then raise or
    cancel the run as its behaviour says."""
    rec: Record = ctx["rec"]
    n = rec.attempt(name, ctx, list(spec.fathers))
    if spec.behaviour == "raise" or (spec.behaviour == "flaky" and n == 1):
        raise Boom(name)
    if spec.behaviour == "cancels":
        ctx.cancel(f"{name} has enough")
    return rec


def _sync_body(ctx: TaskContext, name: str, spec: Spec) -> str:
    rec = _begin(ctx, name, spec)
    if spec.behaviour == "waits":
        threading.Event().wait(0.002)  # stands in for a short call
    elif spec.behaviour == "hangs":
        rec.gate.wait(LONG)  # until the test lets it go, after the run gave up on it
    return f"value of {name}"


async def _async_body(ctx: TaskContext, name: str, spec: Spec) -> str:
    _begin(ctx, name, spec)
    if spec.behaviour == "waits":
        await asyncio.sleep(0.002)
    elif spec.behaviour == "hangs":
        await asyncio.get_running_loop().create_future()  # until the run cancels it
    return f"value of {name}"


class Hooked(SchedulingNode[Spec, str]):
    def on_success(self, support: TaskSupport) -> None:
        support.context["rec"].hook(self.name, "on_success")

    def on_fail(self, support: TaskSupport) -> None:
        support.context["rec"].hook(self.name, "on_fail")


class SyncNode(Hooked):
    def task(self, ctx: TaskContext, param: Spec) -> str:
        return _sync_body(ctx, self.name, param)


class AsyncNode(Hooked):
    async def task(self, ctx: TaskContext, param: Spec) -> str:  # type: ignore[override]
        return await _async_body(ctx, self.name, param)


@st.composite
def graphs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Up to 7 nodes, each with fathers among the nodes before it (a DAG)."""
    n = draw(st.integers(1, 7))
    shapes: list[dict[str, Any]] = []
    for i in range(n):
        fathers = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        shapes.append({
            "name": f"n{i}",
            "async": draw(st.booleans()),
            "behaviour": draw(st.sampled_from(BEHAVIOURS)),
            "fathers": tuple(f"n{f}" for f in sorted(fathers)),
            "join": draw(st.sampled_from(sorted(JOINS))) if fathers else "all",
        })
    return shapes


def build(shapes: list[dict[str, Any]]) -> list[Hooked]:
    nodes: dict[str, Hooked] = {}
    for s in shapes:
        cls = AsyncNode if s["async"] else SyncNode
        node = cls(Spec(s["behaviour"], s["fathers"]), name=s["name"], join=JOINS[s["join"]],
                   retries=1 if s["behaviour"] == "flaky" else 0)
        for f in s["fathers"]:
            nodes[f] >> node
        nodes[s["name"]] = node
    return list(nodes.values())


def run(mode: str, nodes: list[Hooked], pool: ThreadPoolExecutor, timeout: float,
        ctx: TaskContext) -> tuple[Any, Counter[str]]:
    """The run's result, and how many times ``stream`` handed out each node."""
    handed: Counter[str] = Counter()
    if mode == "start":
        return TaskScheduling.start(nodes, executor=pool, timeout=timeout, context=ctx), handed
    if mode == "stream":
        stream = TaskScheduling.stream(nodes, executor=pool, timeout=timeout, context=ctx)
        for name, _ in stream:
            handed[name] += 1
        return stream.result, handed
    return asyncio.run(taskflow.run_async(nodes, executor=pool, timeout=timeout,
                                          context=ctx)), handed


def snapshot(result: Any, names: list[str]) -> dict[str, tuple[Any, ...]]:
    out = {}
    for n in names:
        wr = result.result_of(n)
        out[n] = (wr.state, wr.result, wr.exception, wr.finished_at, wr.attempts)
    return out


def loop_is_idle() -> bool:
    async def others() -> set[asyncio.Task[Any]]:
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    end = PROMPT
    while end > 0:
        if not asyncio.run_coroutine_threadsafe(others(), aio.loop_thread.get()).result(PROMPT):
            return True
        threading.Event().wait(0.005)
        end -= 0.005
    return False


def check_fathers_seen(shapes: list[dict[str, Any]], states: dict[str, Any],
                       rec: Record) -> None:
    for s in shapes:
        name = s["name"]
        if name not in rec.seen or not s["fathers"]:
            continue
        seen = rec.seen[name]
        for f, (kind, value) in seen.items():
            if kind == "ok":  # a value seen is the father's own, and it succeeded
                assert value == f"value of {f}" and states[f] is S.SUCCESS, (name, f)
        succeeded = [f for f in s["fathers"] if states[f] is S.SUCCESS]
        if s["join"] in ("all", "best_effort"):
            # ALL runs once every father succeeded, best effort once every one settled: each
            # father that succeeded had done so, and its value was there
            assert all(seen[f][0] == "ok" for f in succeeded), (name, seen, states)
        else:
            assert any(kind == "ok" for kind, _ in seen.values()), (name, seen)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(shapes=graphs(), mode=st.sampled_from(["start", "stream", "run_async"]))
def test_random_mixed_dags_settle_once_run_hooks_once_and_change_nothing_afterwards(
        shapes: list[dict[str, Any]], mode: str) -> None:
    nodes = build(shapes)
    names = [s["name"] for s in shapes]
    rec = Record()
    hangs = any(s["behaviour"] == "hangs" for s in shapes)
    pool = ThreadPoolExecutor(4, thread_name_prefix="tfpool")
    try:
        result, handed = run(mode, nodes, pool, BUDGET if hangs else LONG,
                             TaskContext(rec=rec))
        with rec.lock:
            rec.returned = True
            hooks_then = Counter(rec.hooks)
        then = snapshot(result, names)
    finally:
        rec.gate.set()  # the sync nodes that hang return now: their late results are dropped
        pool.shutdown(wait=True)
    assert loop_is_idle()  # every async attempt ended or was cancelled

    states = {n: then[n][0] for n in names}
    # every node settled, exactly once
    assert all(st is not S.DEFAULT for st in states.values()), states
    if mode == "stream":
        assert handed == Counter(names)
    # each hook exactly once, as the final state says (none after the run returned)
    for n in names:
        assert hooks_then[(n, "on_success")] == (1 if states[n] is S.SUCCESS else 0), (n, states)
        assert hooks_then[(n, "on_fail")] == (1 if states[n] in FAILED else 0), (n, states)
    # an attempt per try at most
    for s in shapes:
        assert rec.attempts[s["name"]] <= (2 if s["behaviour"] == "flaky" else 1)
    # nothing changed once the run had returned
    assert rec.late == [] and rec.hooks == hooks_then
    assert snapshot(result, names) == then
    check_fathers_seen(shapes, states, rec)
