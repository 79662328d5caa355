"""The engine's instrumentation points (``taskflow.engine.events``): what observers are told, on
which threads, and that nobody is told anything under the run's lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
import remote_tasks
from conftest import LONG, MEDIUM, SHORT, Flaky
from fanout_tasks import Numbers, RemoteSquares

from taskflow import FlowResult, FunctionNode, ResultState, TaskScheduling
from taskflow.engine import closing, events


class Observer(events.RunObserver):
    """Records every call as a tuple, and checks the threading rules on each."""

    def __init__(self, run: events.ObservedRun, log: Recorder) -> None:
        self.run = run
        self.log = log

    def _note(self, *call: Any) -> None:
        self.log.note(self.run, call)

    def attempt_started(self, i: int, attempt: int) -> None:
        self._note("attempt_started", self.run.names[i], attempt)

    def attempt_ended(self, i: int, attempt: int, error: BaseException | None, fate: str) -> None:
        self._note("attempt_ended", self.run.names[i], attempt, type(error).__name__, fate)

    def node_settled(self, i: int) -> None:
        self._note("node_settled", self.run.names[i], self.run.results[i].state.name)

    def event(self, i: int, name: str, attrs: dict[str, Any]) -> None:
        self._note("event", self.run.names[i] if i >= 0 else None, name, attrs)

    def run_ended(self, result: FlowResult) -> None:
        self._note("run_ended", result.flow_id)


class Recorder:
    """A listener that watches every run and records what its observers are told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []  # (flow_id, call)
        self.threads: set[str] = set()
        self.violations: list[str] = []
        self.runs: list[events.ObservedRun] = []
        self._lock = threading.Lock()

    def run_started(self, run: events.ObservedRun) -> Observer:
        with self._lock:
            self.runs.append(run)
        return Observer(run, self)

    def note(self, run: events.ObservedRun, call: tuple[Any, ...]) -> None:
        lock = run.lock  # type: ignore[attr-defined]
        # the run's lock is not reentrant: if this thread held it, the acquire would time out
        if lock.acquire(timeout=LONG):
            lock.release()
        else:
            self.violations.append(f"{call[0]} under the run's lock")
        name = threading.current_thread().name
        if name.startswith("taskflow-timer"):
            self.violations.append(f"{call[0]} on the timer thread")
        with self._lock:
            self.calls.append((run.flow_id, call))
            self.threads.add(name)

    def of(self, flow_id: str, kind: str | None = None) -> list[tuple[Any, ...]]:
        with self._lock:
            return [c for f, c in self.calls if f == flow_id and (kind is None or c[0] == kind)]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    events.add_listener(rec)
    try:
        yield rec
    finally:
        events.remove_listener(rec)
    assert not rec.violations


def const(ctx: Any, param: Any) -> Any:
    return param


def boom(ctx: Any, param: Any) -> None:
    raise ValueError("boom")


def test_nobody_listens_by_default() -> None:
    assert events.LISTENERS == ()
    with ThreadPoolExecutor(2) as pool:
        nodes = FunctionNode(const, 1, name="a")
        from taskflow.scheduling import _prepare

        run = _prepare(nodes, pool, 1.0, None, None)
        run.begin()
        closing.wait(run)
    assert run.observers == () and run.node_observers == ()


def test_a_flow_tells_each_attempt_and_each_node_once(recorder: Recorder) -> None:
    a = FunctionNode(const, 1, name="a")
    b = FunctionNode(const, 2, name="b")
    c = FunctionNode(boom, name="c")
    a >> [b, c]
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=LONG)
    calls = recorder.of(result.flow_id)
    assert calls[-1] == ("run_ended", result.flow_id)
    assert [c for c in calls if c[0] == "run_ended"] == [("run_ended", result.flow_id)]
    for name in "abc":
        mine = [c for c in calls if c[1] == name]
        assert mine[0] == ("attempt_started", name, 1)
        assert mine[1][0] == "attempt_ended" and mine[1][4] == events.FINAL
        assert mine[2] == ("node_settled", name, result.result_of(name).state.name)
        assert len(mine) == 3
    assert ("attempt_ended", "c", 1, "ValueError", events.FINAL) in calls
    assert recorder.runs[0].flow_name == "a"


def test_every_node_is_settled_before_the_run_ends() -> None:
    # "first" is told it settled while "second" finishes the run's last node: the run must not
    # end (and its observers hear run_ended) before "first" has been told
    told, ended = threading.Event(), threading.Event()
    order: list[str] = []

    class Probe(events.RunObserver):
        def __init__(self, run: events.ObservedRun) -> None:
            self.run = run

        def node_settled(self, i: int) -> None:
            if self.run.names[i] == "first":
                told.set()
                ended.wait(MEDIUM)  # times out unless the run ended meanwhile
                order.append("first settled")

        def run_ended(self, result: FlowResult) -> None:
            ended.set()
            order.append("run ended")

    class Listener:
        def run_started(self, run: events.ObservedRun) -> events.RunObserver:
            return Probe(run)

    running = threading.Event()

    def first(ctx: Any, param: Any) -> None:
        running.wait(LONG)  # both run at once, on two workers

    def second(ctx: Any, param: Any) -> None:
        running.set()
        told.wait(LONG)

    listener = Listener()
    events.add_listener(listener)
    try:
        with ThreadPoolExecutor(2) as pool:
            TaskScheduling.start([FunctionNode(first, name="first"),
                                  FunctionNode(second, name="second")], executor=pool,
                                 timeout=LONG)
    finally:
        events.remove_listener(listener)
    assert order == ["first settled", "run ended"], order


def test_retries_are_told_as_retry_then_final(recorder: Recorder) -> None:
    node = FunctionNode(Flaky(2), name="flaky", retries=3, retry_backoff=0.001)
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok
    calls = recorder.of(result.flow_id)
    ends = [c for c in calls if c[0] == "attempt_ended"]
    assert ends == [("attempt_ended", "flaky", 1, "ConnectionError", events.RETRY),
                    ("attempt_ended", "flaky", 2, "ConnectionError", events.RETRY),
                    ("attempt_ended", "flaky", 3, "NoneType", events.FINAL)]
    kinds = [(c[0], c[2]) if c[0] == "event" else (c[0], c[4]) for c in calls
             if c[0] in ("event", "attempt_ended")]
    assert kinds[:2] == [("event", "retry"), ("attempt_ended", events.RETRY)]
    retries = [c for c in calls if c[0] == "event"]
    assert [(c[2], c[3]["attempt"]) for c in retries] == [("retry", 1), ("retry", 2)]
    assert retries[0][3]["delay"] == pytest.approx(0.001)
    assert [c[2] for c in calls if c[0] == "attempt_started"] == [1, 2, 3]


def test_a_timed_out_node_is_settled_before_its_late_return(recorder: Recorder) -> None:
    release = threading.Event()

    def stuck(ctx: Any, param: Any) -> str:
        release.wait(LONG)
        return "late"

    node = FunctionNode(stuck, name="stuck", timeout=SHORT)
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
        assert result["stuck"].work_result.state is ResultState.TIMEOUT
        assert recorder.of(result.flow_id, "node_settled") == [
            ("node_settled", "stuck", "TIMEOUT")]
        assert recorder.of(result.flow_id, "attempt_ended") == []
        release.set()
    assert recorder.of(result.flow_id, "attempt_ended") == [
        ("attempt_ended", "stuck", 1, "NodeTimeoutError", events.LATE)]


def test_the_budget_settles_running_nodes_and_ends_the_run_once(recorder: Recorder) -> None:
    release = threading.Event()

    def slow(ctx: Any, param: Any) -> None:
        release.wait(LONG)

    a = FunctionNode(slow, name="a")
    b = FunctionNode(const, name="b")
    a >> b
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=SHORT)
        release.set()
    assert result.status.name == "TIMED_OUT"
    calls = recorder.of(result.flow_id)
    assert ("node_settled", "a", "TIMEOUT") in calls and ("node_settled", "b", "TIMEOUT") in calls
    assert len(recorder.of(result.flow_id, "run_ended")) == 1
    assert recorder.of(result.flow_id, "attempt_started") == [("attempt_started", "a", 1)]


def test_ctx_cancel_is_an_event_of_the_run(recorder: Recorder) -> None:
    def cancel(ctx: Any, param: Any) -> None:
        ctx.cancel("enough")

    a = FunctionNode(cancel, name="a")
    b = FunctionNode(const, name="b")
    a >> b
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=LONG)
    assert ("event", None, "cancelled", {"reason": "enough", "by": "a"}) in recorder.of(
        result.flow_id)
    assert ("node_settled", "b", "CANCELLED") in recorder.of(result.flow_id)


def test_a_nested_inline_run_is_observed_on_its_callers_thread(recorder: Recorder) -> None:
    with ThreadPoolExecutor(1, thread_name_prefix="only") as pool:
        def outer(ctx: Any, param: Any) -> Any:
            inner = FunctionNode(const, 5, name="inner")
            return TaskScheduling.start(inner, executor=pool, timeout=LONG).outputs["inner"]

        result = TaskScheduling.start(FunctionNode(outer, name="outer"), executor=pool,
                                      timeout=LONG)
    assert result.outputs["outer"] == 5
    inner_run = next(r for r in recorder.runs if r.names == ("inner",))
    assert inner_run.mode == "inline"
    assert [c[0] for c in recorder.of(inner_run.flow_id)] == [
        "attempt_started", "attempt_ended", "node_settled", "run_ended"]



def test_failed_fan_out_items_are_events_of_their_node(recorder: Recorder) -> None:
    node = Numbers(6, name="fan", policy="best_effort", max_concurrency=2)
    with ThreadPoolExecutor(3) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok
    evts = recorder.of(result.flow_id, "event")
    assert [(c[1], c[2], c[3]["item"], str(c[3]["error"])) for c in evts] == [
        ("fan", "item_failed", 2, "item 2 is corrupt")]
    assert recorder.of(result.flow_id, "attempt_started") == [("attempt_started", "fan", 1)]



def test_remote_attempts_are_seen_from_the_caller(recorder: Recorder, tmp_path: Any,
                                                  spawn_pool: ProcessPoolExecutor) -> None:
    flaky = FunctionNode(remote_tasks.fail_first_attempts, (str(tmp_path / "n"), 1),
                         name="flaky", retries=2)
    fan = RemoteSquares(8, name="squares", policy="best_effort")
    flaky >> fan
    result = TaskScheduling.start(flaky, executor=spawn_pool, timeout=LONG)
    assert result.ok, result.failed
    calls = recorder.of(result.flow_id)
    caller = threading.current_thread().name
    assert recorder.threads == {caller}  # the owner: start's caller
    assert [c for c in calls if c[0] == "attempt_ended"] == [
        ("attempt_ended", "flaky", 1, "ConnectionError", events.RETRY),
        ("attempt_ended", "flaky", 2, "NoneType", events.FINAL),
        ("attempt_ended", "squares", 1, "NoneType", events.FINAL)]
    assert [c[3]["item"] for c in calls if c[0] == "event" and c[2] == "item_failed"] == [
        "item-007"]


def test_submit_ends_the_run_before_its_future_resolves(recorder: Recorder) -> None:
    with ThreadPoolExecutor(2) as pool:
        fut = TaskScheduling.submit(FunctionNode(const, 1, name="a"), executor=pool,
                                    timeout=MEDIUM)
        result = fut.result(LONG)
    assert recorder.of(result.flow_id, "run_ended") == [("run_ended", result.flow_id)]


def test_an_observer_that_raises_changes_nothing(recorder: Recorder) -> None:
    class Broken(events.RunObserver):
        def attempt_started(self, i: int, attempt: int) -> None:
            raise RuntimeError("observer bug")

        def run_ended(self, result: FlowResult) -> None:
            raise RuntimeError("observer bug")

    class BrokenListener:
        def run_started(self, run: events.ObservedRun) -> events.RunObserver:
            return Broken()

    class Refusing:
        def run_started(self, run: events.ObservedRun) -> events.RunObserver:
            raise RuntimeError("listener bug")

    broken, refusing = BrokenListener(), Refusing()
    events.add_listener(broken)
    events.add_listener(refusing)
    events.add_listener(refusing)  # once only
    try:
        assert events.LISTENERS.count(refusing) == 1
        with ThreadPoolExecutor(2) as pool:
            result = TaskScheduling.start(FunctionNode(const, 1, name="a"), executor=pool,
                                          timeout=LONG)
    finally:
        events.remove_listener(broken)
        events.remove_listener(refusing)
    assert result.ok and result.outputs == {"a": 1}
    assert len(recorder.of(result.flow_id, "run_ended")) == 1  # the others were still told


def test_an_observer_of_runs_only_is_not_told_about_nodes() -> None:
    ended: list[str] = []

    class RunsOnly(events.RunObserver):
        per_node = False

        def attempt_started(self, i: int, attempt: int) -> None:
            raise AssertionError("not told")

        def run_ended(self, result: FlowResult) -> None:
            ended.append(result.flow_id)

    class Listener:
        def run_started(self, run: events.ObservedRun) -> events.RunObserver:
            return RunsOnly()

    listener = Listener()
    events.add_listener(listener)
    try:
        with ThreadPoolExecutor(2) as pool:
            result = TaskScheduling.start(FunctionNode(const, 1, name="a"), executor=pool,
                                          timeout=LONG)
    finally:
        events.remove_listener(listener)
    assert ended == [result.flow_id]
