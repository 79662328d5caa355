"""The loop economy on its own (``taskflow.engine.economy``), without a run: nodes arrive in
``ready``, loops pop and exit, and the economy says how many loops to start and when its
watchdog adds some. The timer is replaced by a recorder, so no watchdog fires by itself."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskflow.engine import economy, timer
from taskflow.engine.states import QUEUED, RUNNING, WAITING

FAST = 1e-6  # a no-op node's typical duration
SLOW = 0.05  # an I/O call's
UNKNOWN = -1.0  # never measured


class Armed:
    """A timer entry that never fires by itself (the test calls ``fire``)."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args, self.cancelled = fn, args, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self.fn(*self.args)


class Harness:
    """An economy over ``n`` nodes of the given typical durations, with the timer recorded and
    the loops the watchdog starts collected in ``started``."""

    def __init__(self, est: list[float], max_loops: int = 8, pooled: bool = True,
                 backlog: Any = None) -> None:
        self.code = [WAITING] * len(est)
        self.ready: deque[int] = deque()
        self.started: list[int] = []
        self.armed: list[Armed] = []
        self.eco = economy.Economy(list(est), self.ready, self.code, pooled, max_loops, backlog,
                                   threading.Lock(), self.started.append)

    def arrive(self, *nodes: int) -> None:
        for i in nodes:
            self.code[i] = QUEUED
            self.eco.enqueue(i)

    def schedule(self, when: float, fn: Any, *args: Any) -> Armed:
        entry = Armed(fn, args)
        self.armed.append(entry)
        return entry


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Any:
    made: list[Harness] = []

    def make(est: list[float], **kw: Any) -> Harness:
        h = Harness(est, **kw)
        made.append(h)
        monkeypatch.setattr(timer.timer_thread, "schedule", h.schedule)
        return h

    return make


# --- how many loops ----------------------------------------------------------------------------


def test_each_slow_or_unmeasured_node_gets_a_loop_of_its_own(harness: Any) -> None:
    h = harness([SLOW, UNKNOWN, SLOW, FAST])
    h.arrive(0, 1, 2, 3)
    assert h.eco.nslow == 3
    assert h.eco.reserve() == 4  # three slow ones, and one for the fast one
    assert (h.eco.loops, h.eco.starting) == (4, 4)


def test_a_few_fast_nodes_share_one_loop_and_the_calling_loop_takes_them(harness: Any) -> None:
    h = harness([FAST] * 6)
    h.arrive(0, 1, 2, 3, 4)
    assert h.eco.reserve(nxt=5) == 0  # the calling loop goes on with fast node 5: no new loop
    assert h.armed  # ... and the watchdog looks after the ones it left ready
    assert h.eco.reserve() == 0  # nothing arrived, no loop left: no recount
    h.eco.loop_exits(0)  # the calling loop left after all: they are worth a loop again
    assert h.eco.reserve() == 1
    assert h.eco.reserve() == 0  # the loop on its way will take them


def test_a_count_is_redone_only_after_an_arrival_or_a_loop_leaving(harness: Any) -> None:
    h = harness([SLOW] * 6, max_loops=3)
    h.arrive(0, 1, 2, 3)
    assert h.eco.reserve() == 3  # the executor's bound
    assert h.eco.reserve() == 0
    h.arrive(4)
    assert h.eco.reserve() == 0  # still no room
    h.eco.refused()  # a reserved loop the executor refused: room for one
    assert h.eco.reserve() == 1
    h.eco.first_node(7)
    h.eco.loop_exits(7)
    assert h.eco.reserve() == 1  # a loop left: its place is taken again


def test_many_fast_nodes_get_a_loop_per_fast_task_of_their_work(harness: Any) -> None:
    # 40 no-op nodes (40 us of work) share one loop: a loop costs more than they do
    n = economy.FAST_SCAN + 24
    h = harness([FAST] * n)
    h.arrive(*range(n))
    assert h.eco.reserve() == 1


def test_past_the_scan_the_fast_work_is_extrapolated_from_the_entries_read(harness: Any) -> None:
    # 100 ready nodes of 60 us each: 6 ms of work, 30 loops of FAST_TASK; only FAST_SCAN read
    per = economy.FAST_TASK * 0.3
    n = 100
    h = harness([per] * n, max_loops=64)
    h.arrive(*range(n))
    assert h.eco.reserve() == pytest.approx(per * n / economy.FAST_TASK, abs=1)


def test_fast_nodes_behind_slow_ones_share_loops_by_the_batch(harness: Any) -> None:
    # the first FAST_SCAN entries are slow: the fast ones behind get a loop per FAST_BATCH
    slow, fast = economy.FAST_SCAN, 8
    h = harness([SLOW] * slow + [FAST] * fast, max_loops=64)
    h.arrive(*range(slow + fast))
    assert h.eco.reserve() == slow + -(-fast // economy.FAST_BATCH)


def test_never_more_loops_than_the_executor_runs(harness: Any) -> None:
    h = harness([SLOW] * 10, max_loops=3)
    h.arrive(*range(10))
    assert h.eco.reserve() == 3
    assert h.eco.reserve() == 0
    assert h.eco.loops == 3


def test_other_modes_count_a_loop_per_ready_node(harness: Any) -> None:
    h = harness([FAST] * 5, max_loops=4, pooled=False)
    h.arrive(0, 1, 2, 3, 4)
    assert h.eco.reserve() == 4
    assert h.eco.starting == 0 and not h.armed  # no watchdog: nothing waits for a worker loop
    h.eco.dispatched(4)
    assert h.eco.loops == 0


# --- loops taking nodes and leaving ------------------------------------------------------------


def test_a_loop_pops_queued_nodes_only_and_is_uncounted_when_none_is_left(harness: Any) -> None:
    h = harness([SLOW, SLOW, SLOW])
    h.arrive(0, 1, 2)
    assert h.eco.reserve() == 3
    h.code[1] = WAITING + 4  # settled while queued (a join cancelled it): not runnable
    assert h.eco.first_node(7) == 0
    assert h.code[0] == RUNNING and h.eco.loop_node == {7: 0}
    assert h.eco.next_node(7) == 2  # node 1 is passed over
    assert h.eco.next_node(7) == -1
    assert (h.eco.loops, h.eco.starting, h.eco.nslow) == (2, 2, 0)
    assert h.eco.loop_node == {}


def test_a_loop_leaves_a_slow_next_node_to_a_busy_executor(harness: Any) -> None:
    queued = [economy.BACKLOG + 1]
    h = harness([FAST, SLOW], backlog=lambda: queued[0])
    h.arrive(1)
    h.eco.loops = 1
    assert h.eco.next_node(3, after=True) == -1  # the thread serves the waiting tasks first
    assert h.eco.loops == 0 and list(h.ready) == [1]
    queued[0] = economy.BACKLOG  # a short queue: workers just waking up
    h.eco.loops = 1
    assert h.eco.next_node(3, after=True) == 1


def test_an_abandoned_loop_is_uncounted_at_once_and_forgotten_when_it_returns(
        harness: Any) -> None:
    h = harness([SLOW, SLOW])
    h.arrive(0, 1)
    assert h.eco.reserve() == 2
    assert h.eco.first_node(1) == 0
    assert h.eco.abandon_loop_of(0) == 1
    assert h.eco.loops == 1  # a new loop may take its place
    assert h.eco.abandon_loop_of(0) is None
    assert h.eco.next_unless_abandoned(1) == -1
    assert h.eco.forget_abandoned(1) and not h.eco.forget_abandoned(1)


def test_a_refused_loop_is_uncounted(harness: Any) -> None:
    h = harness([SLOW, SLOW])
    h.arrive(0, 1)
    assert h.eco.reserve() == 2
    assert h.eco.refused() is True
    assert h.eco.refused() is False
    assert (h.eco.loops, h.eco.starting) == (0, 0)


# --- the watchdog ------------------------------------------------------------------------------


def test_the_watchdog_is_armed_when_ready_nodes_wait_for_the_loops_there_are(
        harness: Any) -> None:
    h = harness([FAST] * 5)
    h.arrive(0, 1, 2, 3, 4)
    assert h.eco.reserve() == 1
    assert len(h.armed) == 1 and h.eco.watch is h.armed[0]
    h.eco.reserve()
    assert len(h.armed) == 1  # one watchdog per economy


def test_the_watchdog_starts_loops_only_without_progress_and_none_on_its_way(
        harness: Any) -> None:
    h = harness([FAST] * 5)
    h.arrive(0, 1, 2, 3, 4)
    assert h.eco.reserve() == 1
    h.armed[-1].fire()  # the reserved loop has not started: another would queue behind it
    assert h.started == []
    assert h.eco.first_node(1) == 0
    h.eco.progress += 1  # it completed a node
    h.armed[-1].fire()
    assert h.started == []
    h.armed[-1].fire()  # no progress since, nothing on its way: one more loop, then two
    assert h.started == [1]
    assert h.eco.first_node(2) == 1
    h.armed[-1].fire()
    assert h.started == [1, 2]
    assert h.eco.loops == 4 and h.eco.starting == 2


def test_a_closed_economy_arms_and_starts_nothing(harness: Any) -> None:
    h = harness([FAST] * 5)
    h.arrive(0, 1, 2, 3, 4)
    h.eco.reserve()
    watch = h.eco.stop()
    assert watch is h.armed[0] and h.eco.watch is None
    h.armed[0].fire()
    assert h.started == [] and len(h.armed) == 1
    h.eco.first_node(1)
    h.eco.reserve()
    assert len(h.armed) == 1


def test_the_watchdog_stops_looking_once_nothing_is_ready(harness: Any) -> None:
    h = harness([FAST] * 5)
    h.arrive(0, 1, 2, 3, 4)
    h.eco.reserve()
    h.eco.clear_ready()
    assert h.eco.nslow == 0
    h.armed[0].fire()
    assert h.started == [] and len(h.armed) == 1 and h.eco.watch is None


# --- invariants over any sequence of arrivals and departures -----------------------------------

STEPS = st.lists(st.tuples(st.sampled_from(["arrive", "reserve", "start", "pop", "exit",
                                            "watch", "progress"]),
                           st.integers(0, 11)), max_size=60)
ESTS = st.lists(st.sampled_from([FAST, SLOW, UNKNOWN, economy.FAST_TASK * 0.9]), min_size=12,
                max_size=12)


@settings(max_examples=150, deadline=None)
@given(ESTS, st.integers(1, 6), STEPS)
def test_the_economy_keeps_its_bounds(est: list[float], max_loops: int,
                                      steps: list[tuple[str, int]]) -> None:
    """Whatever arrives and leaves: never more loops than the executor runs nor more than the
    ready nodes and the running ones need; at least one loop while work is queued; and a node
    left waiting for the loops there are always has a watchdog looking after it."""
    h = Harness(est, max_loops=max_loops)
    mp = pytest.MonkeyPatch()
    mp.setattr(timer, "schedule", h.schedule)
    eco = h.eco
    running: dict[int, int] = {}  # token -> node
    token = 0
    try:
        for what, x in steps:
            if what == "arrive" and h.code[x] == WAITING:
                h.arrive(x)
            elif what == "reserve":
                before, free = eco.loops, max_loops - eco.loops
                k = eco.reserve()
                assert k <= max(0, len(h.ready) - (eco.starting - k))
                assert eco.loops == before + k
                if h.ready and before == 0:
                    assert k >= 1  # never no loop while work is queued
                if free > 0 and eco.starting < len(h.ready):
                    # ready nodes wait for the loops there are: the watchdog looks after them
                    assert eco.watch is not None
            elif what == "start" and eco.starting:
                token += 1
                i = eco.first_node(token)
                if i >= 0:
                    running[token] = i
            elif what == "pop" and running:
                t = next(iter(running))
                h.code[running.pop(t)] = WAITING  # done with it (reusable in the test)
                i = eco.next_node(t, after=True)
                if i >= 0:
                    running[t] = i
                else:
                    assert not h.ready  # no loop leaves while a node waits
            elif what == "exit" and running:
                t = next(iter(running))
                h.code[running.pop(t)] = WAITING
                eco.loop_exits(t)
            elif what == "watch" and h.armed and not h.armed[-1].cancelled:
                entry = h.armed.pop()
                entry.cancelled = True
                entry.fire()  # the loops it starts are counted in starting already
                if h.ready:
                    assert eco.watch is not None  # it looks again while nodes are ready
            elif what == "progress":
                eco.progress += 1
            assert 0 <= eco.starting
            assert eco.starting + len(running) <= eco.loops <= max_loops
            assert eco.nslow == sum(eco.slowq[i] for i in h.ready)
    finally:
        mp.undo()


# --- batched nodes -------------------------------------------------------------------------------


def test_a_batched_node_is_popped_with_the_ready_nodes_of_its_batch(harness: Any) -> None:
    from taskflow.engine.states import PARKED

    h = harness([SLOW] * 6)
    prices, stock = object(), object()
    h.eco.batch_of = [prices, stock, prices, None, prices, prices]
    h.eco.joinable = lambda i: i != 5  # node 5's outcome is decided already
    h.arrive(0, 1, 2, 3, 4, 5)
    nslow = h.eco.nslow
    assert h.eco.next_node(1) == 0
    assert h.eco.gathered == {0: [2, 4]}
    assert [h.code[i] for i in (0, 2, 4)] == [RUNNING, PARKED, PARKED]
    assert list(h.ready) == [1, 3, 5] and h.eco.nslow == nslow - 3
    assert h.eco.next_node(2) == 1 and 1 not in h.eco.gathered  # alone in its batch
    # node 0 ends before its gate took them: they are ready again, counted as before
    h.eco.regather(0)
    assert h.eco.gathered == {} and list(h.ready) == [3, 5, 2, 4]
    assert h.code[2] == QUEUED and h.eco.nslow == 4


def test_a_node_that_may_not_join_takes_nobody_along(harness: Any) -> None:
    h = harness([SLOW] * 3)
    batch = object()
    h.eco.batch_of = [batch] * 3
    h.eco.joinable = lambda i: i != 0
    h.arrive(0, 1, 2)
    assert h.eco.next_node(1) == 0 and h.eco.gathered == {}
    assert h.eco.next_node(2) == 1 and h.eco.gathered == {1: [2]}
