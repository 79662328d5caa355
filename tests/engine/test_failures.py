"""Exceptions, fail-fast, hooks and cancellation (docs/concepts/failures.md).

As the docs say: a hook that raises is logged and changes nothing; ``start``
returns a FlowResult and ``raise_for_failure()`` raises.
"""

from __future__ import annotations

import threading
import time
import traceback
from concurrent.futures import CancelledError

import pytest
from conftest import EPS, LONG, SHORT, HookLog

from taskflow import (
    FunctionNode,
    NodeState,
    ResultState,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    UpstreamFailedError,
)


def hooked_class(log: HookLog, raising: str | None = None):
    """Node class: task is ``param(ctx)``; hooks record, and the hook named ``raising`` raises."""

    class Hooked(SchedulingNode):
        def task(self, ctx, param):
            return param(ctx)

        def _hook(self, kind):
            log.record(self.name, kind)
            if kind == raising:
                raise RuntimeError(f"{kind} hook of {self.name} is broken")

        def on_begin(self, support):
            self._hook("begin")

        def on_success(self, support):
            self._hook("success")

        def on_fail(self, support):
            self._hook("fail")

    return Hooked


def raiser(exc):
    def fn(ctx, param=None):
        raise exc

    return fn


def cause_chain(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__
    return seen


# --- fail-fast ---------------------------------------------------------------------------------


def test_failed_father_fails_children_fast(make_executor):
    log = HookLog()
    Hooked = hooked_class(log)
    ran = []
    original = ValueError("bad input")
    a = Hooked(param=raiser(original), name="a")
    b = Hooked(param=lambda c: ran.append("b"), name="b")
    c = Hooked(param=lambda c: ran.append("c"), name="c")
    x = Hooked(param=lambda c: "independent", name="x")
    a >> b >> c

    result = TaskScheduling.start([a, x], executor=make_executor(2), timeout=LONG)
    log.returned = True

    assert ran == []
    assert result["a"].work_result.state is ResultState.EXCEPTION
    assert result["a"].work_result.exception is original
    for son in ("b", "c"):
        wr = result[son].work_result
        assert result[son].state is NodeState.ERROR
        assert wr.state is ResultState.EXCEPTION
        assert isinstance(wr.exception, UpstreamFailedError)
        assert wr.attempts == 0
        assert original in cause_chain(wr.exception), "the father's exception is chained as cause"
    assert result["b"].work_result.exception.__cause__ is original
    assert result["x"].work_result.state is ResultState.SUCCESS
    assert result.outputs == {"x": "independent"}
    assert set(result.failed) == {"a", "b", "c"}
    assert not result.ok
    # hooks: on_fail once for every failed node, including those failed fast without running
    assert log.kinds("a") == ["begin", "fail"]
    assert log.kinds("b") == ["fail"]
    assert log.kinds("c") == ["fail"]
    assert log.kinds("x") == ["begin", "success"]
    assert log.late == []


def test_son_fails_fast_without_waiting_for_its_other_fathers(make_executor, gate):
    release, son_failed = gate(), threading.Event()
    son_ran = threading.Event()

    class Node(SchedulingNode):
        def task(self, ctx, param):
            return param(ctx)

        def on_fail(self, support):
            if self.name == "son":
                son_failed.set()

    bad = Node(param=raiser(ValueError("x")), name="bad")
    slow = Node(param=lambda c: release.wait(LONG) and "slow", name="slow")
    son = Node(param=lambda c: son_ran.set(), name="son")
    [bad, slow] >> son

    future = TaskScheduling.submit([bad, slow], executor=make_executor(2), timeout=LONG)
    try:
        assert son_failed.wait(LONG), "the son fails as soon as one required father failed"
        assert not future.done(), "the run itself still waits for the running father"
    finally:
        release.set()
    result = future.result(timeout=LONG)

    assert not son_ran.is_set()
    assert result["son"].work_result.state is ResultState.EXCEPTION
    assert result["son"].work_result.exception.__cause__ is result["bad"].work_result.exception
    assert result["slow"].work_result.state is ResultState.SUCCESS


def test_hooks_of_a_son_failed_fast_see_their_fathers(make_executor):
    seen = {}

    class Node(SchedulingNode):
        def task(self, ctx, param):
            return param(ctx)

        def on_fail(self, support):
            seen[self.name] = (dict(support.fathers), support.work_result, support.node)

    original = KeyError("k")
    good = Node(param=lambda c: "g", name="good")
    bad = Node(param=raiser(original), name="bad")
    son = Node(param=lambda c: "never", name="son")
    [good, bad] >> son

    result = TaskScheduling.start([good, bad], executor=make_executor(1), timeout=LONG)

    fathers, work_result, node = seen["son"]
    assert node is result["son"]
    assert work_result.state is ResultState.EXCEPTION
    assert work_result.exception.__cause__ is original
    assert fathers["bad"].state is ResultState.EXCEPTION
    assert fathers["bad"].exception is original
    assert set(fathers) <= {"good", "bad"}


def test_cancelled_nodes_are_logged_with_their_name(make_executor, gate, taskflow_logs):
    release = gate()
    started = threading.Event()

    def waiter(c, p):
        started.set()
        release.wait(LONG)

    def canceller(c, p):
        assert started.wait(LONG)
        c.cancel("stop")

    result = TaskScheduling.start(
        [FunctionNode(waiter, name="waiter"), FunctionNode(canceller, name="canceller")],
        executor=make_executor(2),
        timeout=LONG,
    )
    release.set()

    assert result["waiter"].work_result.state is ResultState.CANCELLED
    assert any(
        r["extra"].get("node") == "waiter" and r["extra"].get("flow_id") == result.flow_id
        for r in taskflow_logs
    )


def test_optional_father_failure_is_tolerated_but_still_reported(make_executor):
    bad = FunctionNode(raiser(ValueError("optional broke")), name="bad")
    good = FunctionNode(lambda c, p: 1, name="good")
    son = FunctionNode(lambda c, p: c.result_of("good") + 1, name="son")
    son.depends_on(good).depends_on(bad, optional=True)

    result = TaskScheduling.start(son, executor=make_executor(2), timeout=LONG)

    assert result["son"].work_result.state is ResultState.SUCCESS
    assert result.outputs == {"good": 1, "son": 2}
    assert set(result.failed) == {"bad"}, "tolerated failures are still failures"
    assert result.ok and result.status.name == "COMPLETED_WITH_ERRORS"


def test_every_failure_is_recorded_and_the_earliest_original_is_raised(make_executor):
    errors = {name: ValueError(name) for name in ("f1", "f2", "f3")}
    nodes = [FunctionNode(raiser(exc), name=name) for name, exc in errors.items()]
    sons = [FunctionNode(lambda c, p: None, name=f"son{i}") for i in range(3)]
    for n, s in zip(nodes, sons, strict=True):
        n >> s

    result = TaskScheduling.start(nodes, executor=make_executor(3), timeout=LONG)

    assert set(result.failed) == {"f1", "f2", "f3", "son0", "son1", "son2"}
    with pytest.raises(ValueError) as info:
        result.raise_for_failure()
    raised = info.value
    assert any(raised is exc for exc in errors.values()), "an original, not a fail-fast error"
    earliest = min(errors, key=lambda n: result[n].work_result.finished_at)
    assert raised is errors[earliest]


# --- the original exception is preserved --------------------------------------------------------


def test_original_exception_keeps_type_args_cause_and_traceback(make_executor):
    def parse_order(ctx, param):
        try:
            {}["missing"]
        except KeyError as key_error:
            raise ValueError("bad order", 17) from key_error

    result = TaskScheduling.start(
        FunctionNode(parse_order, name="parse"), executor=make_executor(1)
    )

    exc = result["parse"].work_result.exception
    assert type(exc) is ValueError
    assert exc.args == ("bad order", 17)
    assert isinstance(exc.__cause__, KeyError)
    frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
    assert "parse_order" in frames


def test_raise_for_failure_reraises_the_original_with_a_note_naming_the_node(make_executor):
    original = LookupError("sku-9 not found")
    a = FunctionNode(raiser(original), name="fetch_price")
    b = FunctionNode(lambda c, p: None, name="render")
    a >> b
    result = TaskScheduling.start(a, executor=make_executor(1))

    with pytest.raises(LookupError) as info:
        result.raise_for_failure()

    assert info.value is original
    assert info.value.args == ("sku-9 not found",)
    notes = getattr(info.value, "__notes__", [])
    assert any("fetch_price" in note for note in notes), notes


def test_raise_for_failure_returns_none_when_ok(make_executor):
    result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="n"), executor=make_executor(1))
    assert result.ok
    assert result.raise_for_failure() is None


# --- hooks ----------------------------------------------------------------------------------------


def test_hooks_fire_exactly_once_per_node_and_before_start_returns(make_executor):
    log = HookLog()
    Hooked = hooked_class(log)
    flaky_calls = []

    def flaky(ctx):
        flaky_calls.append(1)
        if len(flaky_calls) < 3:
            raise OSError("transient")
        return "ok"

    root = Hooked(param=lambda c: "r", name="root")
    retried = Hooked(param=flaky, name="retried", retries=3)
    broken = Hooked(param=raiser(ValueError("no")), name="broken", retries=1)
    left = Hooked(param=lambda c: "l", name="left")
    sink = Hooked(param=lambda c: "never", name="sink")
    after_broken = Hooked(param=lambda c: "never", name="after_broken")
    root >> [retried, broken, left]
    [retried, left] >> sink
    broken >> after_broken
    sink.depends_on(broken)

    result = TaskScheduling.start(root, executor=make_executor(2), timeout=LONG)
    log.returned = True

    assert log.kinds("root") == ["begin", "success"]
    assert log.kinds("retried") == ["begin", "begin", "begin", "success"]
    assert log.kinds("broken") == ["begin", "begin", "fail"]
    assert log.kinds("left") == ["begin", "success"]
    assert log.kinds("sink") == ["fail"]
    assert log.kinds("after_broken") == ["fail"]
    assert log.late == []
    assert result["broken"].work_result.attempts == 2


def test_on_success_that_raises_is_logged_and_changes_nothing(make_executor, taskflow_logs):
    log = HookLog()
    Hooked = hooked_class(log, raising="success")
    a = Hooked(param=lambda c: "A", name="a")
    b = Hooked(param=lambda c: c.result_of("a") + "B", name="b")
    a >> b

    result = TaskScheduling.start(a, executor=make_executor(2), timeout=LONG)

    assert result.ok
    assert result.outputs == {"a": "A", "b": "AB"}
    assert result["a"].work_result.state is ResultState.SUCCESS
    assert result["a"].work_result.exception is None
    assert log.kinds("a") == ["begin", "success"]
    assert _hook_error_logged(taskflow_logs, "a", "success hook of a is broken")


def test_on_fail_that_raises_is_logged_and_the_original_exception_stays(
    make_executor, taskflow_logs
):
    log = HookLog()
    Hooked = hooked_class(log, raising="fail")
    original = ValueError("task failed")
    a = Hooked(param=raiser(original), name="a")
    b = Hooked(param=lambda c: "never", name="b")
    a >> b

    result = TaskScheduling.start(a, executor=make_executor(2), timeout=LONG)

    assert result["a"].work_result.state is ResultState.EXCEPTION
    assert result["a"].work_result.exception is original
    assert result["b"].work_result.state is ResultState.EXCEPTION
    assert result["b"].work_result.exception.__cause__ is original
    assert log.kinds("a") == ["begin", "fail"]
    assert log.kinds("b") == ["fail"]
    with pytest.raises(ValueError) as info:
        result.raise_for_failure()
    assert info.value is original
    assert _hook_error_logged(taskflow_logs, "a", "fail hook of a is broken")


def test_on_begin_that_raises_is_logged_and_the_task_still_runs(make_executor, taskflow_logs):
    log = HookLog()
    Hooked = hooked_class(log, raising="begin")
    a = Hooked(param=lambda c: "A", name="a")

    result = TaskScheduling.start(a, executor=make_executor(1), timeout=LONG)

    assert result.ok
    assert result.outputs == {"a": "A"}
    assert log.kinds("a") == ["begin", "success"]
    assert _hook_error_logged(taskflow_logs, "a", "begin hook of a is broken")


def _hook_error_logged(records, node, text):
    for record in records:
        if record["extra"].get("node") != node or record["level"].no < 30:
            continue
        exc = record["exception"]
        if text in record["message"] or (exc is not None and text in str(exc.value)):
            return True
    return False


# --- BaseException ----------------------------------------------------------------------------


class CustomBaseError(BaseException):
    pass


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, CustomBaseError])
def test_base_exception_in_a_task_does_not_hang_and_the_worker_survives(make_executor, exc_type):
    pool = make_executor(1)
    son_ran = threading.Event()
    boom = FunctionNode(raiser(exc_type("boom")), name="boom")
    son = FunctionNode(lambda c, p: son_ran.set(), name="son")
    boom >> son

    t0 = time.monotonic()
    try:
        result = TaskScheduling.start(boom, executor=pool, timeout=LONG)
    except exc_type:
        result = None  # propagating the very BaseException to the caller is acceptable
    elapsed = time.monotonic() - t0

    assert elapsed < LONG / 2, "the run must not wait for its budget"
    assert not son_ran.is_set()
    if result is not None:
        assert not result.ok
        assert result["boom"].state is NodeState.ERROR
        assert result["boom"].work_result.state is not ResultState.SUCCESS
        assert result["son"].work_result.state is not ResultState.SUCCESS
    # the caller thread and the single pool worker both survive: the next flow works
    after = TaskScheduling.start(
        FunctionNode(lambda c, p: "alive", name="next"), executor=pool, timeout=LONG
    )
    assert after.outputs == {"next": "alive"}


# --- cancellation via ctx.cancel -------------------------------------------------------------


def test_ctx_cancel_in_a_node_ends_the_run_and_cancels_unfinished_nodes(make_executor, gate):
    release = gate()
    runner_started, runner_exited = threading.Event(), threading.Event()
    log = HookLog()
    Hooked = hooked_class(log)

    def runner(ctx):
        runner_started.set()
        try:
            release.wait(LONG)
        finally:
            runner_exited.set()
        return "late"

    def canceller(ctx):
        assert runner_started.wait(LONG)
        ctx.cancel("enough")
        return "mine"

    ctx = TaskContext()
    pool = make_executor(2)
    stop = Hooked(param=canceller, name="canceller")
    run = Hooked(param=runner, name="runner")
    son = Hooked(param=lambda c: "never", name="son")
    stop >> son

    t0 = time.monotonic()
    result = TaskScheduling.start([stop, run], executor=pool, timeout=LONG, context=ctx)
    elapsed = time.monotonic() - t0
    log.returned = True

    assert elapsed < EPS * 2, "start returns at once after ctx.cancel"
    assert not runner_exited.is_set()
    assert ctx.cancelled
    assert result["canceller"].work_result.state is ResultState.SUCCESS
    assert result["canceller"].work_result.result == "mine", "the cancelling node keeps its result"
    for name in ("runner", "son"):
        assert result[name].work_result.state is ResultState.CANCELLED, name
        assert result[name].state is NodeState.ERROR
        assert log.count(name, "fail") == 1, name
    assert log.count("son", "begin") == 0
    assert not result.ok, "a run ended by ctx.cancel is never ok"
    with pytest.raises(CancelledError):
        result.raise_for_failure()

    release.set()
    pool.shutdown(wait=True)  # the runner has returned and its completion callback has run
    assert runner_exited.is_set()
    assert result["runner"].work_result.state is ResultState.CANCELLED
    assert result["runner"].work_result.result != "late"
    assert log.count("runner", "success") == 0
    assert log.late == []


def test_ctx_cancel_from_the_caller_ends_a_submitted_run_promptly(make_executor, gate):
    release = gate()
    started = threading.Event()
    ctx = TaskContext()
    checks = []

    def long_task(c, p):
        started.set()
        release.wait(LONG)
        try:
            c.raise_if_cancelled()
        except CancelledError as exc:
            checks.append(exc)
            raise

    a = FunctionNode(long_task, name="long")
    b = FunctionNode(lambda c, p: "never", name="after")
    a >> b
    pool = make_executor(1)

    future = TaskScheduling.submit(a, executor=pool, timeout=LONG, context=ctx)
    try:
        assert started.wait(LONG)
        t0 = time.monotonic()
        ctx.cancel("user pressed stop")
        result = future.result(timeout=LONG)
        elapsed = time.monotonic() - t0
    finally:
        release.set()

    assert elapsed < EPS
    assert ctx.cancelled
    assert result["long"].work_result.state is ResultState.CANCELLED
    assert result["after"].work_result.state is ResultState.CANCELLED
    assert not result.ok
    with pytest.raises(CancelledError) as info:
        result.raise_for_failure()
    assert isinstance(info.value, CancelledError)
    pool.shutdown(wait=True)
    assert len(checks) == 1 and isinstance(checks[0], CancelledError), "raise_if_cancelled raises"


def test_raise_if_cancelled_is_silent_while_the_run_is_live(make_executor):
    node = FunctionNode(lambda c, p: c.raise_if_cancelled() or "fine", name="n")
    result = TaskScheduling.start(node, executor=make_executor(1), timeout=LONG)
    assert result.outputs == {"n": "fine"}


# --- C4: late exceptions from abandoned tasks ------------------------------------------------


def _abandon_then_fail(make_executor, gate):
    pool = make_executor(1)
    release, started = gate(), threading.Event()

    def late(ctx, p):
        started.set()
        release.wait(LONG)
        raise RuntimeError("late failure after the run ended")

    result = TaskScheduling.start(FunctionNode(late, name="late"), executor=pool, timeout=4 * SHORT)
    assert started.is_set()
    assert result["late"].work_result.state is ResultState.TIMEOUT
    release.set()
    pool.shutdown(wait=True)  # the abandoned task has raised and every callback has run
    assert result["late"].work_result.state is ResultState.TIMEOUT
    exc = result["late"].work_result.exception
    assert not isinstance(exc, RuntimeError) or "late failure" not in str(exc)
    return result


def test_late_exception_from_an_abandoned_node_is_not_printed(make_executor, gate, capfd, caplog):
    _abandon_then_fail(make_executor, gate)

    out, err = capfd.readouterr()
    assert "late failure" not in err + out
    assert "Traceback" not in err
    assert "Exception in thread" not in err
    assert not [r for r in caplog.records if r.name.startswith("concurrent.futures")], (
        "exception calling callback"
    )


def test_late_exception_from_an_abandoned_node_is_logged(make_executor, gate, taskflow_logs):
    result = _abandon_then_fail(make_executor, gate)

    after = [r for r in taskflow_logs if r["extra"].get("flow_id") == result.flow_id]
    late = [
        r
        for r in after
        if "late failure" in r["message"]
        or (r["exception"] is not None and "late failure" in str(r["exception"].value))
    ]
    assert late, "the late exception of an abandoned node is logged"
    assert all(r["extra"].get("node") == "late" for r in late)


def test_failed_and_timed_out_nodes_are_logged_at_warning(make_executor, gate, taskflow_logs):
    release = gate()
    bad = FunctionNode(raiser(ValueError("x")), name="bad")
    stuck = FunctionNode(lambda c, p: release.wait(LONG), name="stuck")

    result = TaskScheduling.start([bad, stuck], executor=make_executor(2), timeout=4 * SHORT)
    release.set()

    for name in ("bad", "stuck"):
        assert any(
            r["extra"].get("node") == name
            and r["extra"].get("flow_id") == result.flow_id
            and r["level"].no >= 30
            for r in taskflow_logs
        ), name
