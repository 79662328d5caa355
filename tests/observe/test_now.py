"""What is running now: runs in progress with their nodes' states and threads, abandoned
attempts with their stacks until their thread returns, the text dump (on demand and from a
real signal), the exported counts and the warning for an attempt still running past its
deadline."""

from __future__ import annotations

import gc
import io
import os
import signal
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, PROMPT, SHORT, parse_prometheus
from loguru import logger

import taskflow.observe as observe
from taskflow import FlowResult, FunctionNode, PoolMonitor, ResultState, TaskScheduling
from taskflow.errors import InvalidArgumentError, InvalidArgumentValueError

Gate = Callable[[], threading.Event]
MakeExecutor = Callable[..., ThreadPoolExecutor]


class Backend:
    """A backend call that hangs until released: it says when it is entered, on which thread,
    and when it returned."""

    def __init__(self, gate: Gate) -> None:
        self.entered = gate()
        self.release = gate()
        self.ident = 0
        self.thread = ""

    def stuck_in_backend(self, ctx: Any, param: Any) -> str:
        self.ident = threading.get_ident()
        self.thread = threading.current_thread().name
        self.entered.set()
        self.release.wait(LONG)
        return "late"


def drained(pool: Executor) -> None:
    """Once this returns, every worker of the one-worker ``pool`` left what it ran before."""
    pool.submit(lambda: None).result(PROMPT)


def run_of(run_id: str) -> observe.RunNow | None:
    return next((r for r in observe.inflight() if r.run_id == run_id), None)


def mine(run_id: str) -> list[observe.AbandonedAttempt]:
    return [a for a in observe.abandoned(with_stacks=True) if a.run_id == run_id]


def stuck_run(pool: Executor, backend: Backend, flow: str = "product_page") -> str:
    """A run whose node ignores its own timeout: it ends TIMEOUT while the thread is still in
    the backend; returns the run's id."""
    node = FunctionNode(backend.stuck_in_backend, name="price", timeout=SHORT)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG, name=flow)
    assert backend.entered.is_set()
    assert result.result_of("price").state is ResultState.TIMEOUT
    return result.flow_id


def held_page(pool: Executor, backend: Backend) -> Future[FlowResult]:
    """A run of ``price >> page`` (flow ``product_page``, priority critical) held in ``price``
    by ``backend`` (entered when this returns)."""
    price = FunctionNode(backend.stuck_in_backend, name="price")
    page = FunctionNode(lambda c, p: "page", name="page")
    price >> page
    future = TaskScheduling.submit(price, executor=pool, timeout=LONG, name="product_page",
                                   priority="critical")
    assert backend.entered.wait(PROMPT)
    return future


def test_a_node_waiting_on_an_event_shows_running_on_its_thread_until_the_run_ends(
        make_executor: MakeExecutor, gate: Gate) -> None:
    backend = Backend(gate)
    future = held_page(make_executor(2), backend)
    runs = [r for r in observe.inflight() if r.flow == "product_page"]
    assert len(runs) == 1
    run = runs[0]
    assert run.priority == "critical" and not run.closed
    assert 0.0 <= run.age_s < LONG and 0.0 < run.budget_left_s <= LONG
    nodes = {n.name: n for n in run.nodes}
    assert nodes["price"].state == "RUNNING"
    assert nodes["price"].thread == backend.thread
    assert nodes["price"].thread_ident == backend.ident
    assert nodes["price"].for_s is not None and nodes["price"].for_s >= 0.0
    assert run.running() == (nodes["price"],)
    assert nodes["page"].state == "WAITING"
    assert nodes["page"].waits_on == "fathers: price"
    backend.release.set()
    result = future.result(PROMPT)
    assert result.result_of("page").state is ResultState.SUCCESS
    assert run_of(result.flow_id) is None


def test_a_queued_node_waits_on_a_worker(make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(1)
    backend = Backend(gate)
    future = TaskScheduling.submit([FunctionNode(backend.stuck_in_backend, name="price"),
                                    FunctionNode(lambda c, p: 1, name="stock")],
                                   executor=pool, timeout=LONG, name="two_roots")
    assert backend.entered.wait(PROMPT)
    run = next(r for r in observe.inflight() if r.flow == "two_roots")
    stock = next(n for n in run.nodes if n.name == "stock")
    assert stock.state == "QUEUED" and stock.waits_on == "a worker"
    backend.release.set()
    future.result(PROMPT)


def test_a_node_that_ignores_its_timeout_is_abandoned_with_its_stack_until_released(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(1)
    backend = Backend(gate)
    run_id = stuck_run(pool, backend)
    assert run_of(run_id) is None  # the run itself has ended
    [attempt] = mine(run_id)
    assert (attempt.node, attempt.flow, attempt.attempt) == ("price", "product_page", 1)
    assert attempt.thread == backend.thread and attempt.thread_ident == backend.ident
    assert attempt.past_deadline_s >= 0.0 and attempt.running_s >= SHORT
    assert attempt.stack is not None
    assert any("in stuck_in_backend" in entry for entry in attempt.stack)
    where = attempt.frame()
    assert where is not None and "called from stuck_in_backend" in where
    assert observe.abandoned()[0].stack is None  # stacks only when asked
    backend.release.set()
    drained(pool)
    assert mine(run_id) == []


def test_a_run_closed_at_its_deadline_lists_its_running_node_abandoned(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(1)
    backend = Backend(gate)
    node = FunctionNode(backend.stuck_in_backend, name="search")
    result = TaskScheduling.start(node, executor=pool, timeout=SHORT, name="search_page")
    assert result.result_of("search").state is ResultState.TIMEOUT
    [attempt] = mine(result.flow_id)
    assert (attempt.node, attempt.flow) == ("search", "search_page")
    backend.release.set()
    drained(pool)
    assert mine(result.flow_id) == []


def test_dump_names_the_run_its_nodes_and_the_abandoned_frame(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(2)
    stuck, waiting = Backend(gate), Backend(gate)
    run_id = stuck_run(pool, stuck, flow="checkout")
    future = TaskScheduling.submit(FunctionNode(waiting.stuck_in_backend, name="cart"),
                                   executor=pool, timeout=LONG, name="basket")
    assert waiting.entered.wait(PROMPT)
    out = io.StringIO()
    observe.dump(out)
    text = out.getvalue()
    assert "flow 'basket'" in text and "cart: RUNNING" in text and waiting.thread in text
    assert f"node 'price' of flow 'checkout' (run {run_id})" in text
    assert "in stuck_in_backend" in text and "past its deadline" in text
    stuck.release.set()
    waiting.release.set()
    future.result(PROMPT)


@pytest.fixture
def dump_signal() -> Iterator[int]:
    """A signal nothing else in the tests uses, its handler restored afterwards."""
    sig = signal.SIGUSR2
    previous = signal.getsignal(sig)
    try:
        yield sig
    finally:
        signal.signal(sig, previous)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs POSIX signals")
def test_dump_on_signal_writes_the_dump_when_the_signal_comes(
        make_executor: MakeExecutor, gate: Gate, dump_signal: int, tmp_path: Any) -> None:
    pool = make_executor(1)
    backend = Backend(gate)
    run_id = stuck_run(pool, backend, flow="signalled")
    chained = threading.Event()
    signal.signal(dump_signal, lambda num, frame: chained.set())
    with open(tmp_path / "dump.txt", "w") as f:
        observe.dump_on_signal(dump_signal, file=f)
        os.kill(os.getpid(), dump_signal)
        assert chained.wait(PROMPT)  # the previous handler runs after the dump
    text = (tmp_path / "dump.txt").read_text()
    assert f"node 'price' of flow 'signalled' (run {run_id})" in text
    assert "in stuck_in_backend" in text
    backend.release.set()
    drained(pool)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs POSIX signals")
def test_dump_on_signal_keeps_the_file_it_was_given_open(
        make_executor: MakeExecutor, gate: Gate, dump_signal: int, tmp_path: Any) -> None:
    """A file opened in the call (as a gunicorn hook does) is not closed when the caller drops
    it: the handler holds it."""
    pool = make_executor(1)
    backend = Backend(gate)
    run_id = stuck_run(pool, backend, flow="kept_open")
    chained = threading.Event()
    signal.signal(dump_signal, lambda num, frame: chained.set())
    f = open(tmp_path / "dump.txt", "w")
    kept = weakref.ref(f)
    observe.dump_on_signal(dump_signal, file=f)
    del f
    gc.collect()
    f = kept()
    assert f is not None and not f.closed
    try:
        os.kill(os.getpid(), dump_signal)
        assert chained.wait(PROMPT)
    finally:
        f.close()
    assert f"node 'price' of flow 'kept_open' (run {run_id})" in (
        tmp_path / "dump.txt").read_text()
    backend.release.set()
    drained(pool)


@pytest.mark.parametrize("name", ["SIGKILL", "SIGSTOP", "SIGSEGV"])
def test_dump_on_signal_refuses_a_signal_a_handler_cannot_take(name: str) -> None:
    if not hasattr(signal, name):
        pytest.skip(f"no {name} here")
    with pytest.raises(InvalidArgumentValueError, match=name):
        observe.dump_on_signal(getattr(signal, name))


def test_dump_on_signal_refuses_what_is_no_signal_here() -> None:
    with pytest.raises(InvalidArgumentValueError, match="does not exist on this platform"):
        observe.dump_on_signal(10_000)
    with pytest.raises(InvalidArgumentError, match="signal number"):
        observe.dump_on_signal("SIGUSR2")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="fileno"):
        observe.dump_on_signal(signal.SIGTERM, file=object())  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="needs POSIX signals")
def test_dump_on_signal_must_be_called_from_the_main_thread(dump_signal: int) -> None:
    raised: list[BaseException] = []

    def install() -> None:
        try:
            observe.dump_on_signal(dump_signal)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            raised.append(exc)

    t = threading.Thread(target=install)
    t.start()
    t.join(PROMPT)
    assert len(raised) == 1 and isinstance(raised[0], InvalidArgumentValueError)
    assert "main thread" in str(raised[0])


def test_the_counts_are_in_the_pool_monitors_metrics_and_prometheus(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(2)
    stuck, waiting = Backend(gate), Backend(gate)
    stuck_run(pool, stuck, flow="counted")
    future = TaskScheduling.submit(FunctionNode(waiting.stuck_in_backend, name="cart"),
                                   executor=pool, timeout=LONG, name="basket")
    assert waiting.entered.wait(PROMPT)
    monitor = PoolMonitor(pool, name="now-test")
    snap = monitor.sample(record=False)
    [counts] = [m for m in snap.resilience if getattr(m, "name", None) == "inflight"]
    assert counts.runs >= 1 and counts.abandoned.get("price", 0) >= 1
    _, series = parse_prometheus(monitor.to_prometheus())
    assert series[("taskflow_inflight_runs", ())] >= 1
    assert series[("taskflow_abandoned_attempts", (("node", "price"),))] >= 1
    stuck.release.set()
    waiting.release.set()
    future.result(PROMPT)


@pytest.fixture
def warnings_logged() -> Iterator[tuple[list[str], threading.Event]]:
    """taskflow enabled, WARNING lines about abandoned attempts collected; the warning fires
    at once past the deadline."""
    out: list[str] = []
    seen = threading.Event()

    def sink(message: Any) -> None:
        if "past its deadline" in message.record["message"]:
            out.append(message.record["message"])
            seen.set()

    before = observe.abandoned_warning()
    observe.set_abandoned_warning(0)
    handle = logger.add(sink, level="WARNING", format="{message}")
    logger.enable("taskflow")
    try:
        yield out, seen
    finally:
        logger.disable("taskflow")
        logger.remove(handle)
        observe.set_abandoned_warning(before)


def test_one_warning_names_node_flow_and_frame_of_an_attempt_still_running_past_its_deadline(
        make_executor: MakeExecutor, gate: Gate,
        warnings_logged: tuple[list[str], threading.Event]) -> None:
    out, seen = warnings_logged
    pool = make_executor(1)
    backend = Backend(gate)
    stuck_run(pool, backend, flow="warned")
    assert seen.wait(PROMPT)
    [line] = [m for m in out if "of flow warned" in m]
    assert "node price of flow warned" in line and "stuck_in_backend" in line
    backend.release.set()
    drained(pool)


def test_the_warning_delay_is_checked() -> None:
    with pytest.raises(InvalidArgumentValueError, match="seconds"):
        observe.set_abandoned_warning(-1)
    with pytest.raises(InvalidArgumentError, match="seconds"):
        observe.set_abandoned_warning("soon")  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_with_nothing_in_flight(
        make_executor: MakeExecutor, gate: Gate) -> None:
    pool = make_executor(1)
    backend = Backend(gate)
    stuck_run(pool, backend, flow="forked")
    future = TaskScheduling.submit(FunctionNode(lambda c, p: 1, name="queued"),
                                   executor=pool, timeout=LONG, name="parent_run")
    assert observe.abandoned() and observe.inflight()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if observe.inflight() == [] and observe.abandoned() == [] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    backend.release.set()
    future.result(PROMPT)
