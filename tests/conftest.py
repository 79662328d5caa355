"""Shared test harness: scalable delays, thread-leak and worker-exception checks.

Every delay in the suite comes from ``TASKFLOW_TEST_DELAY_SCALE`` (default 1.0) so a slow CI
machine can stretch them all at once (JSR-166 TCK's SHORT/MEDIUM/LONG convention).
"""

from __future__ import annotations

import gc
import http.client
import os
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

SCALE = float(os.environ.get("TASKFLOW_TEST_DELAY_SCALE", "1.0"))
SHORT = 0.05 * SCALE
MEDIUM = 0.5 * SCALE
LONG = 10.0 * SCALE

PrometheusSeries = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_prometheus(text: str) -> tuple[dict[str, str], PrometheusSeries]:
    """Family name -> type, and every sample, as prometheus_client's parser reads them; a
    family or a series that appears twice fails the test."""
    from prometheus_client.parser import text_string_to_metric_families

    types: dict[str, str] = {}
    series: PrometheusSeries = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name not in types, f"family {fam.name!r} appears twice"
        types[fam.name] = fam.type
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in series, f"series {key} appears twice"
            series[key] = s.value
    return types, series
# scheduling tolerance for "returns about when it should" checks on a busy 2-core machine
EPS = 0.25 * SCALE
# how long a call that must return promptly may take before a test calls it a deadlock
PROMPT = 2.0 * SCALE

# long-lived daemon threads that taskflow or third-party libraries start once per process
_ALLOWED_PREFIXES = ("taskflow-timer", "taskflow-coordinator", "taskflow-asyncio", "loky", "Dask", "IO loop", "Profile", "asyncio_", "QueueFeederThread")



class HookLog:
    """Hook calls in order; a call made after the caller saw ``start`` return is flagged late."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.late: list[tuple[str, str]] = []
        self.returned = False
        self._lock = threading.Lock()

    def record(self, name: str, kind: str) -> None:
        with self._lock:
            self.calls.append((name, kind))
            if self.returned:
                self.late.append((name, kind))

    def count(self, name: str, kind: str) -> int:
        with self._lock:
            return self.calls.count((name, kind))

    def kinds(self, name: str) -> list[str]:
        with self._lock:
            return [k for n, k in self.calls if n == name]


def _live_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


@pytest.fixture(autouse=True)
def no_thread_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves threads behind (CPython's threading_cleanup, with names)."""
    before = _live_threads()
    yield
    if request.node.get_closest_marker("allow_thread_leak"):
        return
    deadline = time.monotonic() + 2.0 * SCALE
    while True:
        leaked = [
            t
            for t in _live_threads() - before
            if not t.name.startswith(_ALLOWED_PREFIXES)
        ]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked, "dangling threads: " + ", ".join(sorted(t.name for t in leaked))


@pytest.fixture(autouse=True)
def worker_exceptions_fail_the_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """An exception escaping any thread (an assertion in a worker) fails the test (TCK threadFailure)."""
    errors: list[str] = []

    def hook(args: threading.ExceptHookArgs) -> None:
        errors.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: {args.exc_value}")

    monkeypatch.setattr(threading, "excepthook", hook)
    yield errors
    assert not errors, "exceptions escaped worker threads: " + "; ".join(errors)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_thread_leak: the test deliberately abandons a thread")


@pytest.fixture(autouse=True)
def strict_engine() -> Iterator[None]:
    """Every test runs with the engine's debug switch on (an illegal node state move raises
    instead of being logged), whatever the test before it did with the switch."""
    from taskflow.engine import run

    run.set_strict(True)
    yield


# --- fixtures for the core-engine suites (test_scheduling, test_timeouts, test_failures, ...) ---


@pytest.fixture
def make_executor() -> Iterator[object]:
    """Factory of ThreadPoolExecutors that are shut down (after every gate is open) at teardown."""
    from concurrent.futures import ThreadPoolExecutor

    created: list[ThreadPoolExecutor] = []

    def make(max_workers: int = 2, prefix: str = "tfpool") -> ThreadPoolExecutor:
        pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=prefix)
        created.append(pool)
        return pool

    yield make
    for pool in created:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def gate(make_executor: object) -> Iterator[object]:
    """Factory of Events that are all set at teardown, before the executors are shut down.

    It depends on ``make_executor`` so pytest tears it down first: no pool thread is left blocked.
    """
    events: list[threading.Event] = []

    def make() -> threading.Event:
        event = threading.Event()
        events.append(event)
        return event

    yield make
    for event in events:
        event.set()


@pytest.fixture
def taskflow_logs() -> Iterator[list[dict[str, object]]]:
    """Enable taskflow's loguru logs, per-node DEBUG lines included, and collect their records
    (dicts with level, message, extra)."""
    from loguru import logger

    from taskflow import logs

    records: list[dict[str, object]] = []
    logger.enable("taskflow")
    logs.log_nodes()
    handler_id = logger.add(
        lambda message: records.append(message.record), level="DEBUG", format="{message}"
    )
    try:
        yield records
    finally:
        logger.remove(handler_id)
        logger.disable("taskflow")
        logs.log_nodes(False)


@pytest.fixture(scope="module")
def spawn_pool() -> Iterator[object]:
    """A two-process ``ProcessPoolExecutor`` (spawn) shared by a module's tests."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import remote_tasks

    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(remote_tasks.const, None, None).result(LONG)  # its manager thread, first
        yield pool


class Flaky:
    """A task that raises ``ConnectionError("attempt N refused")`` on its first ``failures``
    calls and returns ``"ok"`` after (thread executors: it counts in this process)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, ctx: object, param: object) -> str:
        with self._lock:
            self.calls += 1
            n = self.calls
        if n <= self.failures:
            raise ConnectionError(f"attempt {n} refused")
        return "ok"


@pytest.fixture
def node_lines() -> Iterator[None]:
    """Per-node DEBUG lines on (``taskflow.logs.log_nodes``) for the test."""
    from taskflow import logs

    logs.log_nodes()
    try:
        yield
    finally:
        logs.log_nodes(False)


class Call:
    """Run ``fn(*args, **kwargs)`` in a named daemon thread, so a deadlock is an assertion."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "defect-call",
                 **kwargs: Any) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, args, kwargs), name=name,
                                       daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def finished(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Stop a server a test started: SIGTERM, then SIGKILL if it is still there after LONG."""
    proc.terminate()
    try:
        proc.wait(LONG)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(LONG)


class NeverAwaited:
    """Records the "never awaited" warnings of the coroutines collected while it is entered
    (a collection runs before it leaves)."""

    def __enter__(self) -> NeverAwaited:
        self._catch = warnings.catch_warnings(record=True)
        self._caught = self._catch.__enter__()
        warnings.simplefilter("always")
        self.lines: list[str] = []
        return self

    def __exit__(self, *exc: object) -> None:
        gc.collect()
        self.lines = [str(w.message) for w in self._caught if "never awaited" in str(w.message)]
        self._catch.__exit__(*exc)


T = TypeVar("T")


def poll(read: Callable[[], T], done: Callable[[T], bool], what: str,
         timeout: float = LONG) -> T:
    """``read()`` again until ``done`` says yes, or fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what}; last seen: {value!r}"[:4000]
        time.sleep(0.05)


def http_get(port: int, path: str) -> tuple[int, str]:
    """``GET path`` from a server a test started on 127.0.0.1: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=LONG)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def wait_for_server(proc: subprocess.Popen[Any], port: int, path: str,
                    log: Callable[[], str]) -> None:
    """Wait until a server a test started answers ``GET path`` with 200; fail with its ``log()``
    if it exits first or never answers."""
    def up() -> bool:
        assert proc.poll() is None, log()
        try:
            return http_get(port, path)[0] == 200
        except OSError:
            return False

    poll(up, bool, f"the server did not start\n{log()}")
