"""Bulkhead: slots, a FIFO of waiters that hold no thread, handoff outside the lock."""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from resilience_helpers import FakeClock, run_threads

from taskflow.errors import FlowDefinitionError, TaskflowError
from taskflow.resilience import Bulkhead, BulkheadFullError
from taskflow.resilience.bulkhead import Permit, Ticket


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_concurrent": 0}, "max_concurrent must be an integer >= 1, got 0"),
        ({"max_concurrent": -3}, "max_concurrent must be an integer >= 1, got -3"),
        ({"max_concurrent": 1.5}, "got 1.5"),
        ({"max_concurrent": True}, "got True"),
        ({"max_concurrent": "4"}, "got '4'"),
        ({"max_concurrent": 2, "max_waiting": -1}, "max_waiting must be an integer >= 0, got -1"),
    ],
)
def test_invalid_options_name_the_bulkhead(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        Bulkhead("inventory", **kwargs)  # type: ignore[arg-type]
    assert "bulkhead 'inventory'" in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_empty_name_is_refused() -> None:
    with pytest.raises(FlowDefinitionError, match="bulkhead name"):
        Bulkhead("", max_concurrent=1)


def test_try_acquire_stops_at_max_concurrent_and_release_frees_a_slot() -> None:
    bh = Bulkhead("b", max_concurrent=2)
    p1, p2 = bh.try_acquire(), bh.try_acquire()
    assert isinstance(p1, Permit) and isinstance(p2, Permit)
    assert bh.try_acquire() is None
    assert bh.metrics().in_use == 2
    assert p1.release() is True
    assert bh.metrics().in_use == 1
    p3 = bh.try_acquire()
    assert p3 is not None


def test_double_release_is_ignored_and_never_frees_two_slots() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    permit = bh.try_acquire()
    assert permit is not None
    assert permit.release() is True
    assert permit.release() is False
    assert bh.metrics().in_use == 0
    again = bh.try_acquire()
    assert again is not None
    permit.release()  # a late duplicate release must not free `again`'s slot
    assert bh.metrics().in_use == 1


def test_waiters_get_slots_in_fifo_order_on_the_releasing_thread() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None
    granted: list[tuple[int, str]] = []
    held: list[Permit] = []
    for i in range(3):
        ticket = bh.acquire(lambda p, i=i: (granted.append((i, threading.current_thread().name)),
                                            held.append(p)))
        assert isinstance(ticket, Ticket)
    assert bh.metrics().waiting == 3

    def release_from(permit: Permit) -> None:
        t = threading.Thread(target=permit.release, name="releaser")
        t.start()
        t.join()

    release_from(first)
    release_from(held[0])
    release_from(held[1])
    assert granted == [(0, "releaser"), (1, "releaser"), (2, "releaser")]
    assert bh.metrics().in_use == 1 and bh.metrics().waiting == 0


def test_acquire_with_a_free_slot_returns_a_permit_and_does_not_call_back() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    calls: list[Permit] = []
    got = bh.acquire(calls.append)
    assert isinstance(got, Permit)
    assert calls == []


def test_full_queue_raises_bulkhead_full_error() -> None:
    bh = Bulkhead("inventory", max_concurrent=1, max_waiting=1)
    bh.acquire(lambda p: None)
    bh.acquire(lambda p: None)
    with pytest.raises(BulkheadFullError) as info:
        bh.acquire(lambda p: None)
    err = info.value
    assert isinstance(err, TaskflowError) and isinstance(err, RuntimeError)
    assert str(err) == "bulkhead 'inventory' is full: 1 running and 1 waiting"
    assert (err.bulkhead, err.max_concurrent, err.max_waiting) == ("inventory", 1, 1)
    assert bh.metrics().rejected == 1


def test_max_waiting_zero_refuses_every_waiter() -> None:
    bh = Bulkhead("b", max_concurrent=1, max_waiting=0)
    bh.acquire(lambda p: None)
    with pytest.raises(BulkheadFullError):
        bh.acquire(lambda p: None)


def test_cancelled_waiter_is_never_granted_and_the_slot_goes_to_the_next() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None
    granted: list[str] = []
    a = bh.acquire(lambda p: granted.append("a"))
    b = bh.acquire(lambda p: granted.append("b"))
    assert isinstance(a, Ticket) and isinstance(b, Ticket)
    assert a.cancel() is True
    assert a.cancel() is True  # idempotent
    first.release()
    assert granted == ["b"]
    assert b.cancel() is False  # granted already: the permit belongs to the callback
    m = bh.metrics()
    assert (m.in_use, m.waiting, m.cancelled, m.granted) == (1, 0, 1, 2)


def test_expired_waiter_is_skipped_at_handoff_and_its_cancel_still_says_never_granted() -> None:
    clock = FakeClock()
    bh = Bulkhead("b", max_concurrent=1, clock=clock)
    first = bh.try_acquire()
    assert first is not None
    granted: list[str] = []
    late = bh.acquire(lambda p: granted.append("late"), deadline=clock.now + 1.0)
    patient = bh.acquire(lambda p: granted.append("patient"), deadline=clock.now + 10.0)
    clock.advance(2.0)
    first.release()
    assert granted == ["patient"]
    assert isinstance(late, Ticket) and late.state == "expired"
    assert late.cancel() is True
    assert bh.metrics().cancelled == 1
    assert isinstance(patient, Ticket) and patient.permit is not None


def test_release_with_only_expired_waiters_frees_the_slot() -> None:
    clock = FakeClock()
    bh = Bulkhead("b", max_concurrent=1, clock=clock)
    first = bh.try_acquire()
    assert first is not None
    bh.acquire(lambda p: pytest.fail("expired waiter granted"), deadline=clock.now + 0.5)
    clock.advance(1.0)
    first.release()
    assert bh.metrics().in_use == 0 and bh.metrics().waiting == 0


def test_abandoned_attempt_keeps_its_slot_until_it_returns() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    permit = bh.try_acquire()
    assert permit is not None
    permit.abandon()
    permit.abandon()  # counted once
    m = bh.metrics()
    assert (m.in_use, m.abandoned) == (1, 1)
    assert bh.try_acquire() is None
    permit.release()
    m = bh.metrics()
    assert (m.in_use, m.abandoned) == (0, 0)


def test_a_grant_callback_that_raises_passes_the_slot_on_and_is_logged(
    taskflow_logs: list[dict[str, object]],
) -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None

    def broken(permit: Permit) -> None:
        raise ValueError("engine bug")

    got: list[Permit] = []
    bh.acquire(broken)
    bh.acquire(got.append)
    first.release()
    assert len(got) == 1
    assert bh.metrics().in_use == 1
    assert any("raised" in str(r["message"]) for r in taskflow_logs)


def test_grant_callback_runs_without_the_lock_held() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None
    seen: list[int] = []

    def reenter(permit: Permit) -> None:
        # with the lock held this would deadlock (Lock is not reentrant); pytest-timeout guards
        seen.append(bh.metrics().in_use)
        permit.release()

    bh.acquire(reenter)
    first.release()
    assert seen == [1]
    assert bh.metrics().in_use == 0


def test_a_long_chain_of_handoffs_does_not_grow_the_stack() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None
    n = sys.getrecursionlimit() * 2
    order: list[int] = []
    for i in range(n):
        # each waiter releases at once, as a task run inline by CALLER_RUNS would
        bh.acquire(lambda p, i=i: (order.append(i), p.release()))
    first.release()
    assert order == list(range(n))
    assert bh.metrics().in_use == 0


def test_cancelled_tickets_are_compacted_out_of_the_queue() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None
    tickets = [bh.acquire(lambda p: None) for _ in range(500)]
    for t in tickets[:-1]:
        assert isinstance(t, Ticket)
        t.cancel()
    assert len(bh._queue) < 100  # the dead were dropped, not kept until a release
    assert bh.metrics().waiting == 1


def test_growing_hands_new_slots_to_waiters_in_order() -> None:
    bh = Bulkhead("b", max_concurrent=1)
    first = bh.try_acquire()
    assert first is not None
    granted: list[int] = []
    for i in range(4):
        bh.acquire(lambda p, i=i: granted.append(i))
    bh.set_max_concurrent(3)
    assert granted == [0, 1]
    assert (bh.metrics().in_use, bh.metrics().waiting, bh.max_concurrent) == (3, 2, 3)


def test_shrinking_keeps_running_slots_and_hands_out_none_until_below_the_new_size() -> None:
    bh = Bulkhead("b", max_concurrent=3)
    permits = [bh.try_acquire() for _ in range(3)]
    granted: list[Permit] = []
    bh.acquire(granted.append)
    bh.set_max_concurrent(1)
    assert bh.metrics().in_use == 3
    for p in permits[:2]:
        assert p is not None
        p.release()
    assert granted == []  # 1 in use = the new size: the waiter still waits
    assert permits[2] is not None
    permits[2].release()
    assert len(granted) == 1 and bh.metrics().in_use == 1
    with pytest.raises(FlowDefinitionError, match="bulkhead 'b': max_concurrent must be"):
        bh.set_max_concurrent(0)


def test_many_threads_never_exceed_max_concurrent_and_every_attempt_finishes() -> None:
    max_concurrent, threads, rounds = 3, 16, 200
    bh = Bulkhead("b", max_concurrent=max_concurrent)
    lock = threading.Lock()
    running = peak = done = 0
    finished = threading.Event()

    def attempt(permit: Permit) -> None:
        nonlocal running, peak, done
        with lock:
            running += 1
            peak = max(peak, running)
        with lock:
            running -= 1
            done += 1
            if done == threads * rounds:
                finished.set()
        permit.release()

    def body(_: int) -> None:
        for _ in range(rounds):
            got = bh.acquire(attempt)
            if isinstance(got, Permit):
                attempt(got)

    run_threads(threads, body)
    assert finished.wait(30)
    m = bh.metrics()
    assert peak <= max_concurrent
    assert (m.in_use, m.waiting, m.granted) == (0, 0, threads * rounds)


def test_many_threads_cancelling_and_releasing_grant_or_cancel_each_waiter_once() -> None:
    bh = Bulkhead("b", max_concurrent=2)
    lock = threading.Lock()
    grants: dict[int, int] = {}
    outcomes: dict[int, str] = {}

    def body(i: int) -> None:
        for j in range(150):
            key = i * 1000 + j

            def on_grant(permit: Permit, key: int = key) -> None:
                with lock:
                    grants[key] = grants.get(key, 0) + 1
                permit.release()

            got = bh.acquire(on_grant)
            if isinstance(got, Permit):
                with lock:
                    outcomes[key] = "immediate"
                got.release()
            elif j % 3 == 0 and got.cancel():
                with lock:
                    outcomes[key] = "cancelled"

    run_threads(12, body)
    assert all(n == 1 for n in grants.values())
    assert not set(grants) & {k for k, v in outcomes.items() if v == "cancelled"}
    assert not set(grants) & {k for k, v in outcomes.items() if v == "immediate"}
    assert len(grants) + len(outcomes) == 12 * 150
    m = bh.metrics()
    assert (m.in_use, m.waiting) == (0, 0)


class BulkheadMachine(RuleBasedStateMachine):
    """The bulkhead against a model: a counter of held slots and a FIFO list of waiters."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.max = 2
        self.bh = Bulkhead("model", max_concurrent=self.max, max_waiting=4, clock=self.clock)
        self.held: list[Permit] = []
        self.tickets: dict[int, Ticket] = {}
        self.model_queue: list[tuple[int, float | None]] = []  # live waiters in order
        self.grant_calls: dict[int, int] = {}
        self.ended: dict[int, str] = {}  # ticket -> granted / cancelled / expired
        self.next_id = 0
        self.grant_order: list[int] = []
        self.ceiling = self.max  # in_use may exceed max only after a shrink, down to max

    def _on_grant(self, tid: int) -> object:
        def on_grant(permit: Permit) -> None:
            self.grant_calls[tid] = self.grant_calls.get(tid, 0) + 1
            self.grant_order.append(tid)
            self.held.append(permit)

        return on_grant

    @rule(wait=st.one_of(st.none(), st.floats(0.1, 5.0)))
    def acquire(self, wait: float | None) -> None:
        tid = self.next_id
        self.next_id += 1
        deadline = None if wait is None else self.clock.now + wait
        free = len(self.held) < self.max and not self.model_queue
        try:
            got = self.bh.acquire(self._on_grant(tid), deadline=deadline)  # type: ignore[arg-type]
        except BulkheadFullError:
            assert not free and len(self.model_queue) == 4
            return
        if isinstance(got, Permit):
            assert free
            self.held.append(got)
        else:
            assert not free
            self.tickets[tid] = got
            self.model_queue.append((tid, deadline))

    def _expected_grants(self) -> list[int]:
        # the model's handoff: oldest live waiters, skipping the expired, while slots are free
        expected: list[int] = []
        held = len(self.held)
        while self.model_queue and held < self.max:
            tid, deadline = self.model_queue.pop(0)
            if deadline is not None and self.clock.now >= deadline:
                self.ended[tid] = "expired"
                continue
            expected.append(tid)
            self.ended[tid] = "granted"
            held += 1
        return expected

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        permit = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        expected = self._expected_grants()
        before = list(self.grant_order)
        assert permit.release() is True
        assert self.grant_order[len(before):] == expected

    @rule(size=st.integers(1, 4))
    def resize(self, size: int) -> None:
        self.max = size
        self.ceiling = max(self.ceiling, len(self.held))
        expected = self._expected_grants()
        before = list(self.grant_order)
        self.bh.set_max_concurrent(size)
        assert self.grant_order[len(before):] == expected

    @precondition(lambda self: self.tickets)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.tickets)))
        never_granted = self.tickets[tid].cancel()
        assert never_granted == (self.ended.get(tid) != "granted")
        if any(t == tid for t, _ in self.model_queue):
            self.model_queue = [(t, d) for t, d in self.model_queue if t != tid]
            self.ended[tid] = "cancelled"

    @precondition(lambda self: self.held)
    @rule()
    def abandon(self) -> None:
        self.held[0].abandon()

    @rule(seconds=st.floats(0.0, 3.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def matches_the_model(self) -> None:
        m = self.bh.metrics()
        self.ceiling = max(self.max, min(self.ceiling, len(self.held)))
        assert m.in_use == len(self.held) <= self.ceiling
        assert m.waiting == len(self.model_queue)
        assert all(n == 1 for n in self.grant_calls.values())
        for tid, ticket in self.tickets.items():
            state = self.ended.get(tid, "waiting")
            assert ticket.state == state


TestBulkheadMachine = BulkheadMachine.TestCase
TestBulkheadMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
