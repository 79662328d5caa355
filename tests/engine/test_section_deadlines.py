"""Deadlines from the run's start: a node's ``deadline=`` and a ``Section``'s.

Pinned: past its deadline a node ends ``TIMEOUT`` (``DEGRADED`` with a fallback) whether it is
running or still waiting for its fathers, while the rest of the run goes on; the nearer of a
node's own timeout and its deadline decides (and its error says which); ``ctx.timeout()`` and
retries' back-offs respect the deadline; hooks run exactly once; reports and the HTML page show
the section and its deadline; bad sections are refused before anything runs, and a deadline
past the budget is a warning.

The tests whose subject is when a node gives up run on virtual time (the ``fake_clock``
fixture): a task that stands in for a slow backend waits with ``clock.wait`` or
``fake_clock.sleep``, so the run's timers fire at their exact virtual times, in microseconds of
wall time, and the assertions read exact times. The random-pages invariant stays on the real
clock: under a fake clock entered after other tests it waited for ever (a loop count left by a
thread of an earlier test keeps autojump from moving).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, SHORT, HookLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskflow import (
    DeadlineWarning,
    FlowDefinitionError,
    FunctionNode,
    InvalidNodeError,
    NodeTimeoutError,
    ResultState,
    SchedulingNode,
    Section,
    TaskScheduling,
    ThreadPool,
    clock,
)
from taskflow.testing import FakeClock

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    ex = ThreadPoolExecutor(4, thread_name_prefix="deadline")
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


class Hooked(SchedulingNode[Any, Any]):
    """A node whose task waits for ``gate`` (when given) and whose hooks are logged."""

    def __init__(self, name: str, log: HookLog, gate: threading.Event | None = None,
                 ended: threading.Event | None = None, **options: Any) -> None:
        super().__init__(name=name, **options)
        self.__dict__.update(log=log, gate=gate, ended=ended)

    def task(self, ctx: Any, param: Any) -> str:
        if self.gate is not None:
            clock.wait(self.gate, LONG)  # in virtual time under a fake clock
        return self.name

    def on_success(self, support: Any) -> None:
        self.log.record(self.name, "success")
        if self.ended is not None:
            self.ended.set()

    def on_fail(self, support: Any) -> None:
        self.log.record(self.name, "fail")
        if self.ended is not None:
            self.ended.set()


def test_a_running_node_past_its_deadline_times_out_and_the_rest_of_the_run_goes_on(
        pool, fake_clock):
    log, gate, gave_up = HookLog(), threading.Event(), threading.Event()
    recs = Hooked("recs", log, gate=gate, ended=gave_up, deadline=SHORT)

    def price(ctx: Any, p: Any) -> str:
        assert clock.wait(gave_up, LONG)  # runs on after the section gave up
        return "79.0"

    try:
        result = TaskScheduling.start([recs, FunctionNode(price, name="price")], executor=pool,
                                      timeout=LONG)
    finally:
        gate.set()
    wr = result.result_of("recs")
    assert wr.state is ResultState.TIMEOUT
    assert isinstance(wr.exception, NodeTimeoutError)
    assert wr.exception.deadline and wr.exception.timeout == SHORT
    assert "from the run's start" in str(wr.exception)
    assert wr.finished_at - result.started_at == pytest.approx(SHORT)  # at its deadline exactly
    assert result.result_of("price").result == "79.0"
    assert result.elapsed == pytest.approx(SHORT)  # price went on at once
    assert log.calls == [("recs", "fail")]


def test_a_node_still_waiting_for_its_fathers_ends_at_its_deadline_without_running(
        pool, fake_clock):
    log, gate, gave_up = HookLog(), threading.Event(), threading.Event()
    slow_father = Hooked("reviews_data", log, gate=gate)
    qa = Hooked("qa", log, ended=gave_up, deadline=SHORT)
    after = Hooked("qa_widget", log)
    slow_father >> qa >> after
    threading.Thread(target=lambda: gave_up.wait(LONG) and gate.set(), daemon=True).start()
    result = TaskScheduling.start(slow_father, executor=pool, timeout=LONG)
    wr = result.result_of("qa")
    assert wr.state is ResultState.TIMEOUT and wr.attempts == 0 and wr.started_at is None
    assert wr.finished_at - result.started_at == pytest.approx(SHORT)
    assert result.result_of("reviews_data").state is ResultState.SUCCESS  # it went on
    assert result.result_of("qa_widget").state is ResultState.TIMEOUT  # failed fast after qa
    assert log.count("qa", "fail") == 1 and log.count("reviews_data", "success") == 1
    assert log.count("qa_widget", "fail") == 1


@pytest.mark.parametrize("waiting", [False, True], ids=["running", "waiting"])
def test_a_fallback_stands_in_at_the_deadline(pool, fake_clock, waiting):
    log, gate, ended = HookLog(), threading.Event(), threading.Event()
    if waiting:  # its father holds it back past its deadline
        father = Hooked("father", log, gate=gate)
        node = Hooked("qa", log, ended=ended, deadline=SHORT, fallback="cached")
        father >> node
        threading.Thread(target=lambda: ended.wait(LONG) and gate.set(), daemon=True).start()
        tops: Any = father
    else:
        node = Hooked("qa", log, gate=gate, ended=ended, deadline=SHORT, fallback="cached")
        tops = node
    try:
        result = TaskScheduling.start(tops, executor=pool, timeout=LONG)
    finally:
        gate.set()
    wr = result.result_of("qa")
    assert wr.state is ResultState.DEGRADED and wr.result == "cached"
    assert isinstance(wr.exception, NodeTimeoutError) and wr.exception.deadline
    assert wr.finished_at - result.started_at == pytest.approx(SHORT)
    assert log.count("qa", "success") + log.count("qa", "fail") == 1


def test_the_deadline_counts_from_the_runs_start_not_the_nodes(pool, fake_clock):
    started = threading.Event()

    def father(ctx: Any, p: Any) -> str:
        fake_clock.sleep(SHORT)
        return "f"

    def son(ctx: Any, p: Any) -> float | None:
        started.set()
        return ctx.timeout()

    f = FunctionNode(father, name="father")
    s = FunctionNode(son, name="son", deadline=MEDIUM, timeout=LONG)
    f >> s
    result = TaskScheduling.start(f, executor=pool, timeout=LONG)
    wr = result.result_of("son")
    assert wr.state is ResultState.SUCCESS
    t0 = result.started_at
    assert wr.started_at - t0 == pytest.approx(SHORT)
    # what it may still take is what is left of the deadline from the run's start, not its
    # own (longer) timeout from its own start
    assert wr.result == pytest.approx(MEDIUM - SHORT)


@pytest.mark.parametrize("timeout, deadline, which", [
    (SHORT, LONG, "timeout"), (LONG, SHORT, "deadline")])
def test_the_nearer_of_the_nodes_timeout_and_its_deadline_decides(pool, fake_clock, timeout,
                                                                   deadline, which):
    gate = threading.Event()
    node = FunctionNode(lambda c, p: clock.wait(gate, LONG), name="n", timeout=timeout,
                        deadline=deadline)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeadlineWarning)
            result = TaskScheduling.start(node, executor=pool, timeout=LONG * 2)
    finally:
        gate.set()
    err = result.result_of("n").exception
    assert isinstance(err, NodeTimeoutError)
    assert err.deadline is (which == "deadline")
    assert err.timeout == SHORT
    assert result.elapsed == pytest.approx(SHORT)


def test_a_retry_whose_back_off_would_pass_the_deadline_is_not_made(pool, fake_clock):
    calls: list[float] = []

    def flaky(ctx: Any, p: Any) -> None:
        calls.append(fake_clock.now())
        raise RuntimeError("backend down")

    node = FunctionNode(flaky, name="flaky", retries=3, retry_backoff=MEDIUM, deadline=SHORT * 2)
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    wr = result.result_of("flaky")
    assert wr.state is ResultState.EXCEPTION and len(calls) == 1  # no retry past the deadline
    assert result.elapsed == 0  # it ended at once: no back-off was waited for


def test_a_section_gives_its_deadline_to_each_of_its_nodes_and_an_earlier_own_one_wins(
        pool, fake_clock):
    gate = threading.Event()
    recs = FunctionNode(lambda c, p: clock.wait(gate, LONG), name="recs")
    qa = FunctionNode(lambda c, p: clock.wait(gate, LONG), name="qa", deadline=SHORT)
    price = FunctionNode(lambda c, p: "79.0", name="price")
    below = Section("below-the-fold", [recs, qa], deadline=MEDIUM)
    assert below.nodes == (recs, qa) and recs.section is below and price.section is None
    assert "below-the-fold" in repr(below)
    try:
        result = TaskScheduling.start([recs, qa, price], executor=pool, timeout=LONG)
    finally:
        gate.set()
    assert result.deadlines == {"recs": ("below-the-fold", MEDIUM),
                                "qa": ("below-the-fold", SHORT)}
    for name, limit in (("recs", MEDIUM), ("qa", SHORT)):
        err = result.result_of(name).exception
        assert isinstance(err, NodeTimeoutError)
        assert err.section == "below-the-fold" and err.timeout == limit
        assert "section 'below-the-fold'" in str(err)
        assert result.result_of(name).finished_at - result.started_at == pytest.approx(limit)
    assert result.result_of("price").state is ResultState.SUCCESS
    report = {n.name: n for n in result.report().nodes}
    assert (report["recs"].section, report["recs"].deadline) == ("below-the-fold", MEDIUM)
    assert (report["price"].section, report["price"].deadline) == (None, None)
    page = result.to_html()
    assert "section below-the-fold deadline" in page and 'class="deadline"' in page


def test_nodes_that_end_in_time_are_untouched_and_their_timer_entries_are_dropped(pool):
    nodes = [FunctionNode(lambda c, p: p, p, name=f"n{p}", deadline=LONG) for p in range(20)]
    section = FunctionNode(lambda c, p: "s", name="s")
    Section("all", [section], deadline=LONG)
    result = TaskScheduling.start([*nodes, section], executor=pool, timeout=LONG * 2)
    assert result.ok
    assert all(result.result_of(f"n{p}").result == p for p in range(20))


def test_deadline_nodes_complete_on_a_one_worker_pool():
    pool = ThreadPool(core_size=1, max_size=1, name="one")
    try:
        with FakeClock(autojump=True) as fake:
            a = FunctionNode(lambda c, p: fake.sleep(MEDIUM) or "a", name="a")
            b = FunctionNode(lambda c, p: "b", name="b", deadline=SHORT)
            a >> b
            result = TaskScheduling.start(a, executor=pool, timeout=LONG)
            assert result.result_of("a").result == "a"
            assert result.result_of("b").state is ResultState.TIMEOUT
            assert result.result_of("b").finished_at - result.started_at == pytest.approx(SHORT)
            assert result.elapsed == pytest.approx(MEDIUM)
            # the next flow on the one worker starts at once: nothing was left holding it
            following = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="next"),
                                             executor=pool, timeout=LONG)
            assert following.ok and following.elapsed == 0
    finally:
        pool.shutdown()


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, error, match", [
    (0, FlowDefinitionError, "deadline of node 'n' must be > 0"),
    (-1.0, FlowDefinitionError, "deadline of node 'n' must be non-negative"),
    (float("nan"), FlowDefinitionError, "NaN"),
    ("0.1", InvalidNodeError, "deadline of node 'n' must be a number"),
    (True, InvalidNodeError, "deadline of node 'n'"),
])
def test_a_bad_node_deadline_is_refused_naming_the_node(value, error, match):
    with pytest.raises(error, match=match):
        FunctionNode(lambda c, p: 1, name="n", deadline=value)
    node = FunctionNode(lambda c, p: 1, name="n")
    with pytest.raises(error, match=match):
        node.deadline = value


@pytest.mark.parametrize("kwargs, error, match", [
    ({"name": "", "deadline": 0.1}, FlowDefinitionError, "name must not be empty"),
    ({"name": 3, "deadline": 0.1}, InvalidNodeError, "name must be a string"),
    ({"name": "s", "deadline": 0}, FlowDefinitionError, "deadline of section 's' must be > 0"),
    ({"name": "s", "deadline": None}, FlowDefinitionError, "deadline of section 's'"),
    ({"name": "s", "deadline": "1"}, InvalidNodeError, "deadline of section 's'"),
])
def test_a_bad_section_is_refused_naming_it(kwargs, error, match):
    with pytest.raises(error, match=match):
        Section(nodes=[FunctionNode(lambda c, p: 1, name="n")], **kwargs)


def test_a_section_needs_nodes_each_once_and_in_no_other_section():
    a, b = FunctionNode(lambda c, p: 1, name="a"), FunctionNode(lambda c, p: 1, name="b")
    with pytest.raises(FlowDefinitionError, match="section 'empty' has no nodes"):
        Section("empty", [], deadline=0.1)
    with pytest.raises(InvalidNodeError, match="section 's'"):
        Section("s", [a, "b"], deadline=0.1)  # type: ignore[list-item]
    with pytest.raises(FlowDefinitionError, match="names node 'a' twice"):
        Section("s", [a, a], deadline=0.1)
    assert a.section is None  # a refused section changes nothing
    Section("first", [a], deadline=0.1)
    with pytest.raises(FlowDefinitionError, match="already in section 'first'"):
        Section("second", [b, a], deadline=0.2)
    assert b.section is None


def test_a_section_naming_nodes_of_another_graph_is_refused_before_anything_runs(pool):
    ran: list[str] = []
    page_a = FunctionNode(lambda c, p: ran.append("a"), name="page_a")
    page_b = FunctionNode(lambda c, p: ran.append("b"), name="page_b")
    Section("mixed", [page_a, page_b], deadline=0.1)
    for top in (page_a, page_b):
        with pytest.raises(FlowDefinitionError, match="section 'mixed' names node 'page_"):
            TaskScheduling.start(top, executor=pool, timeout=1)
    assert ran == []
    page_a >> page_b  # one graph now: it runs
    assert TaskScheduling.start(page_a, executor=pool, timeout=LONG).ok


def test_joining_a_section_makes_a_compiled_plan_stale(pool, fake_clock):
    gates = [threading.Event()]
    gates[0].set()
    n = FunctionNode(lambda c, p: clock.wait(gates[0], LONG), name="n")
    assert TaskScheduling.start(n, executor=pool, timeout=LONG).ok  # its plan is compiled
    gates[0] = threading.Event()
    Section("late", [n], deadline=SHORT)
    try:
        result = TaskScheduling.start(n, executor=pool, timeout=LONG)
    finally:
        gates[0].set()
    assert result.result_of("n").state is ResultState.TIMEOUT
    assert result.elapsed == pytest.approx(SHORT)


def test_a_deadline_past_the_budget_is_a_warning_not_an_error(pool):
    node = FunctionNode(lambda c, p: "ok", name="slow_section", deadline=5.0)
    Section("below", [FunctionNode(lambda c, p: 1, name="other")], deadline=9.0)
    with pytest.warns(DeadlineWarning, match="'slow_section': its deadline of 5s is not before"):
        result = TaskScheduling.start(node, executor=pool, timeout=1.0)
    assert result.ok
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeadlineWarning)
        assert TaskScheduling.start(node, executor=pool, timeout=10.0).ok  # before it: silent
        assert TaskScheduling.start(node, executor=pool, timeout=None).ok  # no budget: silent


def test_the_error_keeps_its_fields_through_pickle():
    import pickle

    err = NodeTimeoutError("qa", 0.08, deadline=True, section="below")
    back = pickle.loads(pickle.dumps(err))
    assert (back.node, back.timeout, back.deadline, back.section) == ("qa", 0.08, True, "below")
    assert str(back) == str(err)


# -- an invariant over random pages ----------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_node_succeeds_after_its_deadline_and_every_hook_runs_once(data):
    n = data.draw(st.integers(2, 7))
    log = HookLog()
    gate = threading.Event()
    nodes = []
    for k in range(n):
        if data.draw(st.booleans()):  # a deadline: it may block past it, and may fall back
            options: dict[str, Any] = {"deadline": SHORT}
            if data.draw(st.booleans()):
                options["fallback"] = "stand-in"
            blocks = data.draw(st.booleans())
            nodes.append(Hooked(f"n{k}", log, gate=gate if blocks else None, **options))
        else:
            nodes.append(Hooked(f"n{k}", log))
    for k in range(1, n):
        father = data.draw(st.integers(0, k - 1))
        nodes[father] >> nodes[k]
    with ThreadPoolExecutor(3) as ex:
        try:
            result = TaskScheduling.start(nodes[0], executor=ex, timeout=LONG)
            log.returned = True
        finally:
            gate.set()
    for k, node in enumerate(nodes):
        wr = result.result_of(f"n{k}")
        d = node.deadline
        if d is not None and wr.state is ResultState.SUCCESS:
            # on the seam's clock, as the stamps (a fake clock that ran ahead left it ahead)
            assert wr.finished_at is not None and wr.finished_at - result.started_at < d + SHORT
        expected = "success" if wr.state is ResultState.SUCCESS else "fail"  # DEGRADED: on_fail
        assert log.kinds(f"n{k}") == [expected], (k, wr.state)
    assert log.late == []
