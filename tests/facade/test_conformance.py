"""One conformance suite, every kind of executor: one outcome whatever runs the tasks.

The same DAGs (success, fail fast, the run's budget, a node's timeout, retries, join policies,
hooks) run on thread pools of 1, 2 and 8 workers, ``taskflow.pools.threadpool.ThreadPool``, process pools
(fork and spawn), loky's reusable executor and dask.distributed's ``ClientExecutor``
(``processes=False`` and ``True``), and each must end with the *same* outcome: every node's state
and its value or exception. Where an executor kind must differ, the test says so by name (only the
task travels to another process; a snapshot of the context goes with it).

Executors are module-scoped and warmed up (workers started, taskflow imported in them) before
the first test that uses them, so their long-lived threads exist before the thread-leak check
takes its snapshot. loky and dask are optional extras: their tests skip when not installed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import conftest
import pytest
import remote_tasks as rt
from conftest import EPS, LONG, SCALE

from taskflow import (
    FunctionNode,
    Join,
    NodeTimeoutError,
    ResultState,
    TaskContext,
    TaskScheduling,
    UpstreamFailedError,
)
from taskflow.model.result import FlowStatus

# The executors' long-lived threads (the stdlib process pool's unnamed manager thread, loky's
# "ExecutorManagerThread", dask's "0-Dask-Default-Threads-<pid>-1", "AsyncProcess Dask Worker ...
# watch ...", "IO loop") are all started by the module-scoped fixtures' warm-up, before any test's
# snapshot. One more is started by the first ``submit`` on a remote executor: taskflow's
# coordinator of remote runs, which lives as long as the process.
EXTRA_THREADS = ("taskflow-coordinator",)

BUDGET = 0.4 * SCALE  # the run's budget in the timeout tests
NODE_TIMEOUT = 0.15 * SCALE


@pytest.fixture(scope="module", autouse=True)
def allow_executor_threads() -> Iterator[None]:
    saved = conftest._ALLOWED_PREFIXES
    conftest._ALLOWED_PREFIXES = saved + EXTRA_THREADS
    yield
    conftest._ALLOWED_PREFIXES = saved


# -- the executors --------------------------------------------------------------------------------


@dataclass
class Kind:
    """An executor under test and what it is allowed to do differently."""

    name: str
    executor: Executor
    remote: bool  # tasks get a pickled snapshot (process pools, loky, dask)
    other_process: bool  # tasks run in another process
    cloudpickle: bool = False  # lambdas and local functions travel


def _warm(executor: Executor, workers: int) -> None:
    """Start every worker and import taskflow in it: ``workers`` parallel sleeps in one flow."""
    nodes = [FunctionNode(rt.sleep_for, 0.05, name=f"warm{i}") for i in range(workers)]
    result = TaskScheduling.start(nodes, executor=executor, timeout=120)
    result.raise_for_failure()


def _dask(processes: bool) -> tuple[Executor, Callable[[], None]]:
    distributed = pytest.importorskip("distributed")
    # the scheduler (in this process) logs every cancelled key at INFO: a flow that times out
    # cancels its remote work, which is expected here, not news
    dask_logger = logging.getLogger("distributed")
    level = dask_logger.level
    dask_logger.setLevel(logging.CRITICAL)
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=2,
        processes=processes,
        dashboard_address=":0",  # no fixed port: the scheduler serves HTTP even without a dashboard
        silence_logs=logging.CRITICAL,  # a failing task is an expected outcome here, not news
        # inproc:// when processes=False: dask refuses a host there
        **({"host": "127.0.0.1"} if processes else {}),
    )
    client = distributed.Client(cluster)

    def close() -> None:
        client.close()
        cluster.close()
        dask_logger.setLevel(level)

    # pure=False: two submissions of the same call are two executions, never one cached result
    return client.get_executor(pure=False), close


KINDS = [
    "threads-1",
    "threads-2",
    "threads-8",
    "taskflow-pool",
    "process-fork",
    "process-spawn",
    "loky",
    "dask-threads",
    "dask-processes",
]
# the kinds whose tasks leave this process (pickled snapshot): the only ones ``remote`` tests run on
REMOTE_KINDS = [name for name in KINDS if name.startswith(("process-", "loky", "dask-"))]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test on every executor kind, and a test of what only remote executors do (it
    asks for ``remote``) on those alone: it is not collected for the thread kinds at all,
    rather than reported as dozens of skips that bury the summary."""
    if "kind" in metafunc.fixturenames:
        kinds = REMOTE_KINDS if "remote" in metafunc.fixturenames else KINDS
        metafunc.parametrize("kind", kinds, indirect=True, scope="module")


@pytest.fixture(scope="module")
def kind(request: pytest.FixtureRequest) -> Iterator[Kind]:
    name = request.param
    closer: Callable[[], None] | None = None
    if name.startswith("threads-"):
        n = int(name.split("-")[1])
        ex: Executor = ThreadPoolExecutor(n, thread_name_prefix=f"conf-{name}")
        k = Kind(name, ex, remote=False, other_process=False)
        workers = n
    elif name == "taskflow-pool":
        from taskflow.pools.threadpool import ThreadPool

        ex = ThreadPool(4, thread_name_prefix="conf-pool")
        ex.prestart_core_threads()
        k = Kind(name, ex, remote=False, other_process=False)
        workers = 4
    elif name.startswith("process-"):
        method = name.split("-")[1]
        if method not in multiprocessing.get_all_start_methods():
            pytest.skip(f"no {method} start method on this platform")
        ex = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(method))
        k = Kind(name, ex, remote=True, other_process=True)
        workers = 2
    elif name == "loky":
        loky = pytest.importorskip("loky")
        ex = loky.get_reusable_executor(max_workers=2)
        k = Kind(name, ex, remote=True, other_process=True, cloudpickle=True)
        workers = 2
    else:
        ex, closer = _dask(processes=name == "dask-processes")
        k = Kind(name, ex, remote=True, other_process=name == "dask-processes", cloudpickle=True)
        workers = 4
    try:
        with warnings.catch_warnings():
            # 3.12+ warns when forking a process that has threads (pytest's, dask's)
            warnings.simplefilter("ignore", DeprecationWarning)
            _warm(ex, workers)
        yield k
    finally:
        ex.shutdown(wait=True)
        if closer is not None:
            closer()


# -- outcomes -------------------------------------------------------------------------------------


def describe(exc: BaseException | None) -> str | None:
    """An exception as the suite compares it: the original's repr, taskflow's by type (their
    messages carry timings), a fail-fast one with its cause."""
    if exc is None:
        return None
    if isinstance(exc, UpstreamFailedError):
        return f"UpstreamFailedError<-{describe(exc.__cause__)}"
    if type(exc).__module__.startswith("taskflow"):
        return type(exc).__name__
    return repr(exc)


def outcome(result: Any) -> dict[str, tuple[str, Any]]:
    """node name -> (state, value of a SUCCESS node or the description of its exception)."""
    out = {}
    for name in result:
        wr = result[name].work_result
        if wr.state is ResultState.SUCCESS:
            out[name] = ("SUCCESS", wr.result)
        else:
            out[name] = (wr.state.name, describe(wr.exception))
    return out


def run(kind: Kind, nodes: Any, timeout: float = LONG, **kw: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    result = TaskScheduling.start(nodes, executor=kind.executor, timeout=timeout, **kw)
    return result, time.monotonic() - t0


def fn(task: Any, param: Any = None, name: str | None = None, **options: Any) -> FunctionNode:
    return FunctionNode(task, param, name=name or task.__name__, **options)


# -- the DAGs -------------------------------------------------------------------------------------


def diamond() -> FunctionNode:
    src = fn(rt.const, 2, "src")
    left = fn(rt.total, ("src",), "left")
    right = fn(rt.total, ("src",), "right")
    sink = fn(rt.total, ("left", "right"), "sink")
    src >> [left, right] >> sink
    return src


DIAMOND = {
    "src": ("SUCCESS", 2),
    "left": ("SUCCESS", 12),
    "right": ("SUCCESS", 12),
    "sink": ("SUCCESS", 34),
}


def failing() -> FunctionNode:
    src = fn(rt.const, 1, "src")
    bad = fn(rt.fail, "bad input", "bad")
    after = fn(rt.const, "never", "after")
    good = fn(rt.const, "fine", "good")
    sink = fn(rt.const, "never", "sink")
    src >> bad >> after
    src >> good
    [after, good] >> sink
    return src


FAILING = {
    "src": ("SUCCESS", 1),
    "bad": ("EXCEPTION", "ValueError('bad input')"),
    "after": ("EXCEPTION", "UpstreamFailedError<-ValueError('bad input')"),
    "good": ("SUCCESS", "fine"),
    "sink": ("EXCEPTION", "UpstreamFailedError<-UpstreamFailedError<-ValueError('bad input')"),
}


@pytest.mark.parametrize("how", ["start", "submit"])
def test_diamond_succeeds_with_the_fathers_results(kind, how):
    ctx = TaskContext(offset=10)
    if how == "start":
        result, _ = run(kind, diamond(), context=ctx)
    else:
        future = TaskScheduling.submit(diamond(), executor=kind.executor, timeout=LONG, context=ctx)
        result = future.result(timeout=LONG)

    assert outcome(result) == DIAMOND
    assert result.ok
    assert result.outputs == {name: value for name, (_, value) in DIAMOND.items()}


@pytest.mark.parametrize("how", ["start", "submit"])
def test_failure_fails_the_descendants_fast_and_spares_the_rest(kind, how):
    if how == "start":
        result, _ = run(kind, failing())
    else:
        result = TaskScheduling.submit(failing(), executor=kind.executor, timeout=LONG).result(LONG)

    assert outcome(result) == FAILING
    assert not result.ok
    assert set(result.failed) == {"bad", "after", "sink"}
    with pytest.raises(ValueError, match="bad input"):
        result.raise_for_failure()


def test_the_budget_ends_the_run_on_time_and_times_out_the_rest(kind):
    src = fn(rt.const, 1, "src")
    # it notices the end of the run, then takes a little longer: its result always comes late
    slow = fn(rt.wait_for_cancel, (LONG, 0.1 * SCALE), "slow")
    after = fn(rt.const, "never", "after")
    src >> slow >> after

    result, elapsed = run(kind, src, timeout=BUDGET)

    assert BUDGET <= elapsed < BUDGET + EPS
    assert outcome(result) == {
        "src": ("SUCCESS", 1),
        "slow": ("TIMEOUT", "NodeTimeoutError"),
        "after": ("TIMEOUT", "NodeTimeoutError"),
    }


def test_a_result_arriving_after_the_deadline_never_counts(remote):
    # the remote task sees the deadline a transfer later than the caller (its snapshot carries
    # the remaining seconds), so its result always arrives after the caller's deadline
    budget = 0.05 * SCALE
    for _ in range(20):
        result, _ = run(remote, fn(rt.wait_for_cancel, (LONG, 0.0), "edge"), timeout=budget)
        node = result.report().nodes[0]
        assert node.state == "TIMEOUT" or node.finished_at <= budget, node


def test_a_node_timeout_fails_it_and_its_sons_as_timeouts(kind):
    src = fn(rt.const, 1, "src")
    slow = fn(rt.sleep_for, 0.5 * SCALE, "slow", timeout=NODE_TIMEOUT)
    after = fn(rt.const, "never", "after")
    other = fn(rt.const, "other", "other")
    src >> other  # first: on a one-worker pool it must not queue behind the stuck node
    src >> slow >> after

    result, elapsed = run(kind, src)

    assert elapsed < NODE_TIMEOUT + EPS
    assert outcome(result) == {
        "src": ("SUCCESS", 1),
        "slow": ("TIMEOUT", "NodeTimeoutError"),
        "after": ("TIMEOUT", "UpstreamFailedError<-NodeTimeoutError"),
        "other": ("SUCCESS", "other"),
    }
    assert isinstance(result["after"].work_result.exception.__cause__, NodeTimeoutError)


def test_a_task_sees_its_own_node_timeout_through_ctx_cancelled(kind, tmp_path, request):
    path = tmp_path / "ran"
    cap = 0.6 * SCALE
    slow = fn(rt.note_time_to_cancel, (cap, str(path)), "slow", timeout=NODE_TIMEOUT)

    result, _ = run(kind, slow)

    assert result["slow"].work_result.state is ResultState.TIMEOUT
    deadline = time.monotonic() + LONG
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert float(path.read_text()) < NODE_TIMEOUT + EPS  # it gave its worker back early


def test_retries_run_again_until_an_attempt_succeeds(kind, tmp_path):
    flaky = fn(rt.fail_first_attempts, (str(tmp_path / "attempts"), 2), "flaky", retries=3)
    son = fn(rt.total, (), "son")

    result, _ = run(kind, flaky >> son)

    assert outcome(result) == {"flaky": ("SUCCESS", "attempt 3"), "son": ("SUCCESS", 0)}
    assert result["flaky"].work_result.attempts == 3


def test_retries_exhausted_keep_the_last_error(kind, tmp_path):
    flaky = fn(rt.fail_first_attempts, (str(tmp_path / "attempts"), 5), "flaky", retries=1)

    result, _ = run(kind, flaky)

    assert outcome(result) == {"flaky": ("EXCEPTION", "ConnectionError('attempt 2 failed')")}
    assert result["flaky"].work_result.attempts == 2


def test_join_any_fires_on_the_first_success_and_cancels_the_unneeded_father(kind):
    # bad fails first; good waits for it (optional edge) so the order is the same everywhere;
    # late is still waiting when the join fires, and nobody else needs it
    bad = fn(rt.fail, "down", "bad")
    good = fn(rt.const, "from good", "good").depends_on(bad, optional=True)
    late = fn(rt.sleep_for, 0.3 * SCALE, "late")
    good >> late
    join = FunctionNode(rt.first_of, ("late", "good", "bad"), name="join", join=Join.ANY)
    [bad, good, late] >> join

    result, _ = run(kind, bad)

    assert outcome(result) == {
        "bad": ("EXCEPTION", "ValueError('down')"),
        "good": ("SUCCESS", "from good"),
        "late": ("CANCELLED", "NodeCancelledError"),
        "join": ("SUCCESS", "from good"),
    }
    assert set(result.failed) == {"bad"}


def test_join_quorum_fires_at_k_and_fails_once_k_is_out_of_reach(kind):
    bad = fn(rt.fail, "q down", "bad")
    bad2 = fn(rt.fail, "q2 down", "bad2")
    one = fn(rt.const, 1, "one").depends_on(bad, optional=True)
    two = fn(rt.const, 2, "two").depends_on(bad, optional=True)
    met = FunctionNode(rt.available, ("bad", "one", "two"), name="met", join=Join.quorum(2))
    [bad, one, two] >> met
    missed = FunctionNode(rt.const, "never", name="missed", join=Join.quorum(2))
    bad2.depends_on(two, optional=True)  # fails after the first quorum was met
    [bad, bad2, one] >> missed

    result, _ = run(kind, bad)

    assert outcome(result) == {
        "bad": ("EXCEPTION", "ValueError('q down')"),
        "bad2": ("EXCEPTION", "ValueError('q2 down')"),
        "one": ("SUCCESS", 1),
        "two": ("SUCCESS", 2),
        "met": ("SUCCESS", ["one", "two"]),
        "missed": ("EXCEPTION", "UpstreamFailedError<-ValueError('q2 down')"),
    }


def test_best_effort_and_optional_fathers_run_after_a_failure(kind):
    ok = fn(rt.const, 1, "ok")
    bad = fn(rt.fail, "flaky backend", "bad")
    best = FunctionNode(rt.available, ("ok", "bad"), name="best", join=Join.BEST_EFFORT)
    [ok, bad] >> best
    fn(rt.total, ("ok",), "tolerant").depends_on(ok).depends_on(bad, optional=True)

    result, _ = run(kind, [ok, bad])

    assert outcome(result) == {
        "ok": ("SUCCESS", 1),
        "bad": ("EXCEPTION", "ValueError('flaky backend')"),
        "best": ("SUCCESS", ["ok"]),
        "tolerant": ("SUCCESS", 1),
    }
    assert result.ok and set(result.failed) == {"bad"}  # tolerated: COMPLETED_WITH_ERRORS
    assert result.status is FlowStatus.COMPLETED_WITH_ERRORS


def test_hooks_run_once_in_the_callers_process(kind, request):
    a = rt.Recorder(rt.const, 1, name="a")
    b = rt.Recorder(rt.fail, "hook test", name="b")
    c = rt.Recorder(rt.const, 3, name="c")
    a >> b >> c
    ctx = TaskContext()

    result, _ = run(kind, a, context=ctx)

    assert outcome(result)["c"] == ("EXCEPTION", "UpstreamFailedError<-ValueError('hook test')")
    hooks = sorted(ctx["hooks"])
    assert [(node, hook) for node, hook, _, _ in hooks] == [
        ("a", "on_success"), ("b", "on_fail"), ("c", "on_fail"),
    ]
    assert {pid for _, _, pid, _ in hooks} == {os.getpid()}
    if kind.remote:
        # start's caller coordinates a remote run: the hooks run in this very thread
        assert {thread for _, _, _, thread in hooks} == {threading.current_thread().name}


def test_hooks_of_a_submitted_remote_run_run_on_taskflows_coordinator(remote, request):
    # never on the executor's callback thread (dask: its I/O loop, which a slow hook stalls)
    a = rt.Recorder(rt.const, 1, name="a")
    b = rt.Recorder(rt.fail, "x", name="b")
    ctx = TaskContext()

    future = TaskScheduling.submit(a >> b, executor=remote.executor, timeout=1.0 * SCALE,
                                   context=ctx)
    result = future.result(LONG)

    assert outcome(result) == {"a": ("SUCCESS", 1), "b": ("EXCEPTION", "ValueError('x')")}
    assert sorted((n, h, t) for n, h, _, t in ctx["hooks"]) == [
        ("a", "on_success", "taskflow-coordinator"), ("b", "on_fail", "taskflow-coordinator"),
    ]


def test_task_sees_the_context_its_fathers_and_the_remaining_budget(kind):
    ctx = TaskContext(user="ann")
    first = fn(rt.const, "first value", "first")
    look = fn(rt.where, "first", "look")

    result, _ = run(kind, first >> look, timeout=LONG, context=ctx)

    seen = result.outputs["look"]
    assert seen["user"] == "ann"
    assert seen["father"] == "first value"
    assert seen["flow_id"] == result.flow_id
    assert seen["flow_name"] == result.flow_name == "look"  # the node passed to start
    assert 0 < seen["remaining"] <= LONG
    assert (seen["pid"] != os.getpid()) == kind.other_process
    # a thread executor shares the caller's context; elsewhere the task wrote to a snapshot
    assert ctx.get("written_by_task", False) == (not kind.remote)


def test_result_of_a_node_that_is_not_a_father(kind):
    first = fn(rt.const, "first value", "first")
    middle = fn(rt.const, "middle", "middle")
    last = fn(rt.read_result_of, "first", "last")
    first >> middle >> last

    result, _ = run(kind, first)

    # in this process every finished node can be read; in another only the fathers travel
    expected = "ResultNotAvailableError" if kind.remote else "first value"
    assert result.outputs["last"] == expected


def test_node_options_named_like_dask_submit_options_are_not_swallowed(kind, tmp_path):
    # dask's ClientExecutor.submit takes key/pure/retries/priority/workers as its own options;
    # taskflow never forwards anything as keyword arguments, so nothing is lost
    key = fn(rt.const, {"key": "k", "pure": True, "priority": 5, "workers": ["w"]}, "key")
    retries = fn(rt.fail_first_attempts, (str(tmp_path / "n"), 1), "retries", retries=1)
    key >> retries

    result, _ = run(kind, key)

    assert outcome(result) == {
        "key": ("SUCCESS", {"key": "k", "pure": True, "priority": 5, "workers": ["w"]}),
        "retries": ("SUCCESS", "attempt 2"),
    }


def test_flows_from_many_threads_share_one_executor_without_cross_talk(kind):
    graph = diamond()  # built once, started from every thread (the web handler's way)
    errors: list[BaseException] = []
    results: dict[int, dict[str, Any]] = {}

    def request(i: int) -> None:
        try:
            res = TaskScheduling.start(graph, executor=kind.executor, timeout=LONG,
                                       context=TaskContext(offset=i))
            results[i] = res.outputs
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=request, args=(i,), name=f"conf-req-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LONG)

    assert not errors
    assert results == {
        i: {"src": 2, "left": i + 2, "right": i + 2, "sink": 3 * i + 4} for i in range(8)
    }


# -- what only remote executors do: pickling, crashes ---------------------------------------------


@pytest.fixture
def remote(kind: Kind) -> Kind:
    assert kind.remote, "pytest_generate_tests gives remote tests remote kinds only"
    return kind


def test_unpicklable_param_fails_that_node_naming_the_field(remote):
    lock = threading.Lock()
    node = fn(rt.const, lock, "locked")
    son = fn(rt.const, "never", "son")

    result, elapsed = run(remote, node >> son)

    assert elapsed < EPS
    exc = result["locked"].work_result.exception
    assert isinstance(exc, TypeError)
    assert "'locked'" in str(exc) and "param" in str(exc)
    assert outcome(result)["son"] == ("EXCEPTION", "UpstreamFailedError<-" + repr(exc))


def test_unpicklable_context_value_fails_the_node_naming_the_field(remote):
    node = fn(rt.const, 1, "reads_ctx")

    result, elapsed = run(remote, node, context=TaskContext(lock=threading.Lock()))

    assert elapsed < EPS
    exc = result["reads_ctx"].work_result.exception
    assert isinstance(exc, TypeError)
    assert "'reads_ctx'" in str(exc) and "context" in str(exc)


def test_unpicklable_result_fails_the_node_naming_the_field(remote):
    node = fn(rt.lock_result, None, "returns_lock")

    result, elapsed = run(remote, node)

    assert elapsed < EPS
    exc = result["returns_lock"].work_result.exception
    assert isinstance(exc, TypeError)
    assert "'returns_lock'" in str(exc) and "result" in str(exc)


def test_a_task_returning_a_coroutine_fails_its_node_naming_it(remote):
    # the coroutine is closed in the worker: no pickling error of it, no "never awaited"
    node = fn(rt.returns_coroutine, 7, "wrapped")

    result, _ = run(remote, node)

    exc = result["wrapped"].work_result.exception
    assert isinstance(exc, TypeError), repr(exc)
    assert "node 'wrapped'" in str(exc) and "coroutine of page()" in str(exc)
    assert "pickle" not in str(exc)


def test_a_lambda_travels_only_with_cloudpickle(remote):
    node = FunctionNode(lambda ctx, p: p * 2, 21, name="lam")

    result, _ = run(remote, node)

    if remote.cloudpickle:
        assert outcome(result) == {"lam": ("SUCCESS", 42)}
    else:
        exc = result["lam"].work_result.exception
        assert isinstance(exc, TypeError) and "'lam'" in str(exc) and "node" in str(exc)


@pytest.mark.slow
def test_a_result_the_executor_cannot_send_back_never_hangs_the_flow(remote):
    # passes the task's own pickling check, fails when the executor serialises it: a stdlib or
    # loky pool reports the error; dask (processes=True) never completes the future, so the
    # budget is what ends the run
    node = fn(rt.pickles_once, None, "sneaky")

    result, elapsed = run(remote, node, timeout=1.0 * SCALE)

    assert elapsed < 1.0 * SCALE + EPS
    state = result["sneaky"].work_result.state
    if remote.name == "dask-processes":
        assert state is ResultState.TIMEOUT
    elif remote.name == "dask-threads":
        assert state is ResultState.SUCCESS  # in-process: the result is never serialised
    else:
        assert state is ResultState.EXCEPTION
        assert "PicklesOnce" in repr(result["sneaky"].work_result.exception)


def test_a_crashed_worker_process_fails_the_node_and_the_pool_fails_fast_after():
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        crash = fn(rt.exit_process, 3, "crash")
        son = fn(rt.const, "never", "son")

        kind = Kind("one-off", pool, remote=True, other_process=True)
        result, elapsed = run(kind, crash >> son, timeout=LONG)

        assert elapsed < LONG / 2
        assert isinstance(result["crash"].work_result.exception, BrokenProcessPool)
        assert result["son"].work_result.state is ResultState.EXCEPTION

        again, elapsed = run(kind, fn(rt.const, 1, "next"), timeout=LONG)

        assert elapsed < EPS
        assert isinstance(again["next"].work_result.exception, BrokenProcessPool)


def test_a_monitored_process_pool_runs_flows_remotely():
    from taskflow.pools.monitored import MonitoredExecutor

    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        monitored = MonitoredExecutor(pool, name="procs")
        kind = Kind("monitored", monitored, remote=True, other_process=True)
        result, _ = run(kind, diamond(), context=TaskContext(offset=10))

        assert outcome(result) == DIAMOND
        assert monitored.metrics().completed_task_count == 4
