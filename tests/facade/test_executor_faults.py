"""Executors that misbehave and values that cannot cross a process boundary: an executor whose
``submit`` returns no future, a remote ``submit`` started in a forked child, and exceptions or
results that cannot be pickled back (process pools and loky). Each fails its node with an error
naming the culprit, and the pool keeps working for the next run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import (
    Executor,
    ProcessPoolExecutor,
)
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

import defect_tasks as dt
import pytest
from conftest import LONG, PROMPT, Call

from taskflow import (
    FunctionNode,
    ResultState,
    TaskContext,
    TaskflowError,
    TaskScheduling,
)


def fn_node(fn: Callable[[TaskContext, Any], Any], name: str, **options: Any) -> FunctionNode:
    return FunctionNode(fn, name=name, **options)


class NoFutureExecutor(Executor):
    """A broken executor: ``submit`` returns None instead of a Future (and runs nothing)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return None


@pytest.mark.timeout(30)
def test_an_executor_whose_submit_returns_none_gets_a_clear_error() -> None:
    call = Call(TaskScheduling.start, fn_node(lambda ctx, p: 1, "a"),
                executor=NoFutureExecutor(), timeout=LONG, name="no-future-start")
    assert call.finished(PROMPT), "start waited on work that the executor never took"
    if call.error is not None:  # refused at once, naming the executor
        assert isinstance(call.error, (TypeError, TaskflowError)), repr(call.error)
        assert "NoFutureExecutor" in str(call.error)
    else:  # or the node failed with an error naming the executor
        wr = call.value["a"].work_result
        assert wr.state is ResultState.EXCEPTION
        assert not isinstance(wr.exception, AttributeError), repr(wr.exception)
        assert "NoFutureExecutor" in str(wr.exception)


def _submit_remote_in_child() -> int:
    """In a forked child: a ``submit`` run on a process pool; 0 if it resolves in time."""
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as procs:
            future = TaskScheduling.submit(FunctionNode(dt.const, 7, name="seven"),
                                           executor=procs, timeout=None)
            try:
                result = future.result(timeout=PROMPT)
            except FutureTimeoutError:
                return 3  # the outcome was never processed: no coordinator in this process
            return 0 if result.outputs == {"seven": 7} else 4
    except BaseException:  # noqa: BLE001 - any failure is an exit code for the parent
        return 5


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_remote_submit_runs_complete_in_a_forked_child() -> None:
    # the parent's coordinator thread exists once a remote run was started with submit
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as procs:
        future = TaskScheduling.submit(FunctionNode(dt.const, 1, name="one"), executor=procs,
                                       timeout=LONG)
        assert future.result(timeout=LONG).outputs == {"one": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 6
        try:
            code = _submit_remote_in_child()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 4 * PROMPT + LONG
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
        elif time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        else:
            time.sleep(0.02)
    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0, "the child's submit run never resolved (3) or failed"


# --- values that cannot travel back from another process ------------------------------------------


@contextlib.contextmanager
def process_pool(kind: str) -> Iterator[Executor]:
    if kind == "loky":
        loky = pytest.importorskip("loky")
        pool: Executor = loky.ProcessPoolExecutor(max_workers=1)
    else:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True)


def _pool_still_works(pool: Executor) -> None:
    again = TaskScheduling.start(FunctionNode(dt.const, 5, name="next"), executor=pool,
                                 timeout=LONG)
    assert again["next"].work_result.state is ResultState.SUCCESS, again["next"].work_result
    assert again.outputs == {"next": 5}


REMOTE_KINDS = [pytest.param("process", id="process-pool"), pytest.param("loky", id="loky")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_an_exception_that_cannot_travel_fails_its_node_and_leaves_the_pool_working(
    kind: str,
) -> None:
    with process_pool(kind) as pool:
        result = TaskScheduling.start(FunctionNode(dt.raise_api_error, 503, name="api"),
                                      executor=pool, timeout=LONG)
        wr = result["api"].work_result
        assert wr.state is ResultState.EXCEPTION
        text = f"{type(wr.exception).__name__}: {wr.exception}"
        assert "ApiError" in text and "503" in text and "service unavailable" in text, text
        _pool_still_works(pool)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_a_result_that_cannot_be_unpickled_fails_its_node_and_leaves_the_pool_working(
    kind: str,
) -> None:
    with process_pool(kind) as pool:
        result = TaskScheduling.start(FunctionNode(dt.return_unloadable, None, name="odd"),
                                      executor=pool, timeout=LONG)
        wr = result["odd"].work_result
        assert wr.state is ResultState.EXCEPTION
        text = f"{wr.exception!r} {wr.exception}"
        assert "Unloadable" in text or "'odd'" in text, text  # names the value or its node
        _pool_still_works(pool)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", REMOTE_KINDS)
def test_a_fan_out_items_exception_that_cannot_travel_leaves_the_pool_working(
    kind: str,
) -> None:
    with process_pool(kind) as pool:
        fan = dt.ApiErrorItems(name="fan", policy="best_effort", max_concurrency=1)
        result = TaskScheduling.start(fan, executor=pool, timeout=LONG)
        fanin = result["fan"].work_result.result
        assert fanin.succeeded == {"good": 1}
        error = fanin.failed["bad"]
        text = f"{type(error).__name__}: {error}"
        assert "ApiError" in text and "502" in text and "bad gateway" in text, text
        _pool_still_works(pool)
