"""A hypothesis state machine over ThreadPool against a model of JUC ThreadPoolExecutor (P5).

Rules: submit, burst (several submits with no pause), finish (the task returns), fail (it
raises), finish all, prestart core threads, cancel, mark abandoned, resize (core or max), and
shutdown; a cancel or a mark may be made while another thread holds the pool's lock, and must
then return without waiting for it (the pool counts it in its next lock section). Every
task blocks on its own gate, so the model knows exactly which tasks run and which wait; after
every step the machine lets the pool settle (waits for the tasks the model says run to have
started, by Event, and for retiring threads to exit) and then checks the snapshot against the
model and the invariants: conservation, monotonic counters, ``active <= pool_size``, no thread
idles while a task is queued, and ``pool_size <= max_size`` unless the surplus threads are busy.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import LONG, MEDIUM
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from lock_holder import lock_held_elsewhere

from taskflow.errors import RejectedExecutionError
from taskflow.metrics import PoolMetrics
from taskflow.pools.threadpool import RejectionPolicy, ThreadPool

# How long the pool may take to reach the model's state (a thread waking up to take a queued
# task, an idle one retiring). Short, so that a wrong model or pool fails fast while hypothesis
# shrinks, instead of waiting out LONG at every step.
SETTLE = 2 * MEDIUM


class Boom(Exception):
    """The failure a task is told to raise."""


@dataclass(eq=False)
class Task:
    """A task that blocks on its gate until a rule finishes or fails it."""

    tid: int
    caller: threading.Thread
    gate: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    fail: bool = False
    abandoned: bool = False
    future: Future[Any] | None = None

    def __call__(self) -> int:
        self.started.set()
        if threading.current_thread() is not self.caller:  # CALLER_RUNS returns at once
            assert self.gate.wait(LONG), f"task {self.tid} never released"
        if self.fail:
            raise Boom(self.tid)
        return self.tid


COUNTERS = (
    "task_count", "completed_task_count", "failed_task_count", "cancelled_task_count",
    "rejected_count", "largest_pool_size", "abandoned_total",
)


class PoolMachine(RuleBasedStateMachine):
    """Drive a real ThreadPool and a model of it side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: ThreadPool | None = None
        self.tasks: list[Task] = []
        self.running: list[Task] = []  # in the model: started on a pool thread
        self.queue: deque[Task] = deque()
        self.done: list[Task] = []
        self.pool_size = 0
        self.largest = 0
        self.shut = False
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.previous: PoolMetrics | None = None

    # ------------------------------------------------------------------ setup
    @initialize(
        core=st.integers(0, 3),
        extra=st.integers(0, 2),
        capacity=st.sampled_from([None, 0, 1, 2]),
        policy=st.sampled_from(list(RejectionPolicy)),
    )
    def make_pool(self, core: int, extra: int, capacity: int | None, policy: RejectionPolicy) -> None:
        self.core, self.max = core, max(core + extra, 1)
        self.capacity, self.policy = capacity, policy
        # no thread times out during an example: sizes change only by the rules
        self.pool = ThreadPool(
            core, self.max, queue_capacity=capacity, keep_alive=LONG * 100, rejection=policy,
            thread_name_prefix="taskflow-machine",
        )

    def teardown(self) -> None:
        for task in self.tasks:
            task.gate.set()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            assert self.pool.await_termination(LONG), "pool did not terminate"

    # ------------------------------------------------------------------ model helpers
    @property
    def idle(self) -> int:
        return self.pool_size - len(self.running)

    def start_thread(self, task: Task | None) -> None:
        self.pool_size += 1
        self.largest = max(self.largest, self.pool_size)
        self.counts["largest_pool_size"] = self.largest
        if task is not None:
            self.to_running(task)

    def to_running(self, task: Task) -> None:
        """A model thread takes ``task``; one marked abandoned while queued counts now."""
        self.running.append(task)
        if task.abandoned:
            self.counts["abandoned_total"] += 1

    def thread_freed(self) -> None:
        """A model thread finished its task: retire it, or give it the next queued task."""
        if self.pool_size > self.max or (self.shut and not self.queue):
            self.pool_size -= 1
        elif self.queue:
            self.to_running(self.queue.popleft())

    # ------------------------------------------------------------------ rules
    @rule(n=st.integers(1, 4))
    def submit(self, n: int) -> None:
        for _ in range(n):
            self.submit_one()
            # an idle thread takes a queued task a moment later (as in JUC); the model assumes
            # it has before the next submit
            self._settle()

    @precondition(lambda self: self.capacity is None or self.capacity == 0)
    @rule(n=st.integers(2, 6))
    def burst(self, n: int) -> None:
        """Submit n tasks at once, without waiting for idle threads to take them in between.

        Only for an unbounded queue or a hand-off, where the pool's decisions do not depend on
        how quickly idle threads take queued tasks (with a bound, a queue that is briefly full
        would legitimately start a thread above core).
        """
        for _ in range(n):
            self.submit_one()

    def submit_one(self) -> None:
        assert self.pool is not None
        task = Task(len(self.tasks), threading.current_thread())
        self.tasks.append(task)
        if self.shut:
            with pytest.raises(RuntimeError, match="after shutdown"):
                self.pool.submit(task)
            return
        self.counts["task_count"] += 1
        saturated = False
        if self.pool_size < self.core:
            self.start_thread(task)
        elif (self.idle > 0 if self.capacity == 0 else
              self.capacity is None or len(self.queue) < self.capacity):
            if self.idle > 0:
                self.to_running(task)  # the queue is empty: an idle thread takes it
            else:
                self.queue.append(task)
                if self.pool_size == 0:
                    self.start_thread(self.queue.popleft())
        elif self.pool_size < self.max:
            self.start_thread(task)
        else:
            saturated = True
        if not saturated:
            task.future = self.pool.submit(task)
            return
        self.counts["rejected_count"] += 1
        if self.policy is RejectionPolicy.ABORT:
            with pytest.raises(RejectedExecutionError):
                self.pool.submit(task)
            return
        task.future = self.pool.submit(task)
        if self.policy is RejectionPolicy.CALLER_RUNS:
            assert task.future.done() and task.future.result() == task.tid
        elif self.policy is RejectionPolicy.DISCARD_OLDEST and self.queue:
            oldest = self.queue.popleft()
            assert oldest.future is not None and oldest.future.cancelled()
            self.done.append(oldest)
            self.queue.append(task)
            return
        else:
            assert task.future.cancelled()
        self.done.append(task)

    @precondition(lambda self: bool(self.running))
    @rule(i=st.integers(0, 50), fail=st.booleans())
    def finish(self, i: int, fail: bool) -> None:
        self.finish_task(self.running[i % len(self.running)], fail)

    @precondition(lambda self: len(self.running) > 1)
    @rule(fail=st.booleans())
    def finish_all(self, fail: bool) -> None:
        """Release every running task at once: several threads go idle together."""
        for task in list(self.running):
            self.finish_task(task, fail)

    def finish_task(self, task: Task, fail: bool) -> None:
        """Let a running task return (or raise); its thread moves on as the model says."""
        self.running.remove(task)
        task.fail = fail
        self.counts["completed_task_count"] += 1
        self.counts["failed_task_count"] += fail
        task.gate.set()
        self.done.append(task)
        self.thread_freed()

    # Not for a hand-off pool: a hand-off needs a thread already waiting, and a thread just
    # started is not waiting until it has run (JUC's SynchronousQueue is the same), which the
    # model cannot observe.
    @precondition(lambda self: self.capacity != 0)
    @rule()
    def prestart_core_threads(self) -> None:
        assert self.pool is not None
        started = 0
        while not self.shut and self.pool_size < self.core:
            self.start_thread(self.queue.popleft() if self.queue else None)
            started += 1
        assert self.pool.prestart_core_threads() == started

    @precondition(lambda self: bool(self.queue) or bool(self.running))
    @rule(i=st.integers(0, 50), queued=st.booleans(), contended=st.booleans())
    def cancel(self, i: int, queued: bool, contended: bool) -> None:
        assert self.pool is not None
        if queued and self.queue:
            task = self.queue[i % len(self.queue)]
            self.queue.remove(task)
            with lock_held_elsewhere(self.pool, SETTLE) if contended else nullcontext():
                assert task.future is not None and task.future.cancel()
            self.counts["cancelled_task_count"] += 1
            self.done.append(task)
        elif self.running:
            task = self.running[i % len(self.running)]
            with lock_held_elsewhere(self.pool, SETTLE) if contended else nullcontext():
                assert task.future is not None and not task.future.cancel()

    @precondition(lambda self: bool(self.queue) or bool(self.running))
    @rule(i=st.integers(0, 50), queued=st.booleans(), contended=st.booleans())
    def mark_abandoned(self, i: int, queued: bool, contended: bool) -> None:
        """The flow gave up on a task: counted while it runs (a queued one once it starts)."""
        assert self.pool is not None
        tasks = self.queue if queued and self.queue else self.running or self.queue
        task = tasks[i % len(tasks)]
        with lock_held_elsewhere(self.pool, SETTLE) if contended else nullcontext():
            assert task.future is not None
            self.pool.mark_abandoned(task.future)
        if not task.abandoned and task in self.running:
            self.counts["abandoned_total"] += 1
        task.abandoned = True

    @rule(core=st.integers(0, 4))
    def set_core_size(self, core: int) -> None:
        assert self.pool is not None
        if core > self.max:
            with pytest.raises(ValueError):
                self.pool.set_core_size(core)
            return
        self.pool.set_core_size(core)
        for _ in range(min(core - self.core, len(self.queue), core - self.pool_size)):
            self.start_thread(self.queue.popleft())
        self.core = core

    @rule(max_size=st.integers(1, 5))
    def set_max_size(self, max_size: int) -> None:
        assert self.pool is not None
        if max_size < self.core:
            with pytest.raises(ValueError):
                self.pool.set_max_size(max_size)
            return
        self.pool.set_max_size(max_size)
        self.max = max_size
        self.pool_size -= min(self.idle, max(0, self.pool_size - max_size))

    @precondition(lambda self: not self.shut and len(self.tasks) >= 8)
    @rule(cancel_futures=st.booleans())
    def shutdown(self, cancel_futures: bool) -> None:
        assert self.pool is not None
        self.pool.shutdown(wait=False, cancel_futures=cancel_futures)
        self.shut = True
        if cancel_futures:
            self.counts["cancelled_task_count"] += len(self.queue)
            self.done.extend(self.queue)
            self.queue.clear()
        self.pool_size -= self.idle

    # ------------------------------------------------------------------ checks
    @invariant()
    def pool_matches_the_model(self) -> None:
        if self.pool is None:
            return
        m = self._settle()
        for task in self.done:  # counters are updated before a future resolves
            if task.future is not None:
                assert _settled(task.future), f"task {task.tid} should be done"
        assert m.pool_size is not None and m.active_count is not None
        # no worker idles while a task waits (a lost wake-up once broke this)
        assert not m.queue_size or m.active_count == m.pool_size, f"idle thread, queued task: {m}"
        assert (m.pool_size, m.active_count, m.queue_size) == (
            self.pool_size, len(self.running), len(self.queue)
        ), str(m)
        assert m.abandoned_running == sum(t.abandoned for t in self.running), str(m)
        for name, expected in self.counts.items():
            assert getattr(m, name) == expected, f"{name}: {getattr(m, name)} != {expected}"
        assert (m.core_size, m.max_size, m.is_shutdown) == (self.core, self.max, self.shut)
        # once idle surplus threads have retired, only busy ones may exceed a lowered max
        assert m.pool_size <= m.max_size or m.pool_size - m.max_size <= m.active_count
        for task in self.queue:
            assert not task.started.is_set()
        self.counter_invariants(m)

    def counter_invariants(self, m: PoolMetrics) -> None:
        assert m.active_count is not None and m.queue_size is not None
        assert m.pool_size is not None and m.max_size is not None
        assert m.task_count == (
            m.completed_task_count + m.cancelled_task_count + m.rejected_count
            + m.active_count + m.queue_size
        )
        assert 0 <= m.active_count <= m.pool_size
        assert m.failed_task_count <= m.completed_task_count
        if self.previous is not None:
            for name in COUNTERS:
                assert getattr(m, name) >= getattr(self.previous, name), name
        self.previous = m

    def _settle(self) -> PoolMetrics:
        """Wait (bounded) until the pool's gauges reach the model's; return the snapshot."""
        assert self.pool is not None
        for task in self.running:
            assert task.started.wait(SETTLE), f"task {task.tid} should run"
        deadline = time.monotonic() + SETTLE
        while True:
            m = self.pool.metrics()
            settled = (m.pool_size, m.active_count, m.queue_size, m.completed_task_count) == (
                self.pool_size, len(self.running), len(self.queue),
                self.counts["completed_task_count"],
            )
            if settled or time.monotonic() > deadline:
                return m
            self.counter_invariants(m)  # must hold in passing states too
            time.sleep(0.001)


def _settled(future: Future[Any]) -> bool:
    wait([future], timeout=SETTLE)
    return future.done()


def test_pool_state_machine() -> None:
    # No shrinking: with real threads a replay is not exactly the same run, and each failing
    # replay waits SETTLE, so shrinking would take minutes; the failing steps are printed as
    # generated (at most stateful_step_count of them).
    run_state_machine_as_test(
        PoolMachine,
        settings=settings(
            max_examples=150,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
