"""``ManualExecutor``: an executor that runs submitted work only when a test says so.

A test submits a flow with ``TaskScheduling.submit`` (``start`` would block its caller until
the run ends, and nobody would be left to step the executor), then drives it with ``step()``
or ``run_until_idle()`` on its own thread and reads the result off the returned future::

    ex = ManualExecutor(seed=7)
    future = TaskScheduling.submit(page, executor=ex)
    ex.run_until_idle()
    result = future.result(timeout=0)

The executor starts no thread: every callable runs on the thread that calls ``step``, and the
futures' done-callbacks run as the standard library runs them (on the thread that completes or
cancels the future; at once, on the calling thread, when added to a done future). With
``seed=None`` queued work runs first in, first out; with an int each step picks one queued
callable with ``random.Random(seed)``, so the same seed and the same submissions give the same
order, and a test can try many orders. taskflow's worker loops pop ready nodes themselves, so
for a flow the seed decides which loop runs first and in what order work the nodes submit
(fan-out items, nested flows on other executors) runs.

Concurrency: ``submit`` may be called from any thread (taskflow's timer or coordinator thread
included); ``_lock`` guards ``_queue`` and ``_shutdown``. No callable, callback or
``Future.cancel`` runs while holding it.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from taskflow import clock
from taskflow.engine import inflight
from taskflow.engine.executors import Capabilities, same_executor
from taskflow.engine.states import RUNNING
from taskflow.errors import TaskflowError

__all__ = ["DEFAULT_MAX_STEPS", "ManualExecutor", "StepLimitError"]

T = TypeVar("T")

# ``run_until_idle``'s default bound on the number of callables it runs
DEFAULT_MAX_STEPS = 100_000
# real seconds between two looks at async work in flight while nothing is queued
_SLICE = 0.005


class StepLimitError(TaskflowError, RuntimeError):
    """``run_until_idle`` ran ``max_steps`` callables and work was still queued (work that keeps
    submitting more work never ends)."""

    def __init__(self, max_steps: int, pending: int) -> None:
        self.max_steps = max_steps
        self.pending = pending
        super().__init__(f"run_until_idle ran max_steps={max_steps} callables and {pending} "
                         "still queued: does the work keep submitting more?")


class _Item:
    """One queued callable and its future."""

    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def run(self) -> bool:
        """Run the callable into its future (as the standard library's work items do); False if
        the future was cancelled while queued (nothing ran)."""
        if not self.future.set_running_or_notify_cancel():
            return False
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - the future carries the callable's failure
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)
        return True


def _check_max_steps(max_steps: object) -> int:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise TypeError(f"max_steps must be an int, got {type(max_steps).__name__}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    return max_steps


class ManualExecutor(Executor):
    """A ``concurrent.futures.Executor`` that runs queued work only in ``step``/``run_until_idle``.

    Args:
        seed: None: run queued work first in, first out; an int: each step picks a queued
            callable at random with ``random.Random(seed)`` (reproducible).
        max_workers: the parallelism the executor reports to taskflow (how many worker loops
            one run may keep queued on it at once); no thread is ever started.

    Raises:
        TypeError: seed is not an int or None, max_workers not an int.
        ValueError: max_workers below 1.
    """

    def __init__(self, seed: int | None = None, *, max_workers: int = 4) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int):
            raise TypeError(f"max_workers must be an int, got {type(max_workers).__name__}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.seed = seed
        self.max_workers = max_workers
        self._rng = None if seed is None else random.Random(seed)
        # guards _queue and _shutdown; notified when work is queued
        self._lock = threading.Condition(threading.Lock())
        self._queue: deque[_Item] = deque()
        self._shutdown = False
        self.steps = 0  # callables run so far (written by the stepping thread only)

    def taskflow_capabilities(self) -> Capabilities:
        """What taskflow may assume: ``max_workers`` tasks at once, in this process."""
        return Capabilities(self.max_workers, False)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; it runs in a later ``step``. Any thread may submit.

        Raises:
            RuntimeError: the executor was shut down (as the standard library's pools do).
        """
        future: Future[T] = Future()
        item = _Item(future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.append(item)
            self._lock.notify_all()
        return future

    @property
    def pending(self) -> int:
        """How many submitted callables are queued (cancelled ones not counted)."""
        with self._lock:
            items = list(self._queue)
        return sum(1 for item in items if not item.future.cancelled())

    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` was called (new work is refused; queued work may still run)."""
        return self._shutdown

    def _pop(self) -> _Item | None:
        with self._lock:
            queue = self._queue
            if not queue:
                return None
            if self._rng is None or len(queue) == 1:
                return queue.popleft()
            k = self._rng.randrange(len(queue))
            item = queue[k]
            del queue[k]
            return item

    def step(self) -> bool:
        """Run one queued callable on this thread; return whether one ran.

        Futures cancelled while queued are dropped on the way (their waiters are told, as the
        standard library does) and do not count. The callable's exception goes to its future;
        the future's done-callbacks run on this thread before ``step`` returns.
        """
        while True:
            item = self._pop()
            if item is None:
                return False
            if item.run():
                self.steps += 1
                return True

    def run_until_idle(self, max_steps: int = DEFAULT_MAX_STEPS) -> int:
        """Run queued callables on this thread (work they submit included) until none is queued;
        return how many ran. While none is queued and a run on this executor has an async node
        (or an async batch function's call) running on an event loop, it waits for that work
        (real time; under a fake clock, until the loop is blocked) and goes on with what it
        queues. Under a ``FakeClock(autojump=True)``, when none is queued time jumps to the next
        due timer (which may queue more) until nothing waits for a time to come.

        Raises:
            StepLimitError: ``max_steps`` callables ran and work is still queued (the work left
                stays queued).
            TypeError, ValueError: ``max_steps`` is not a positive int.
        """
        limit = _check_max_steps(max_steps)
        ran = 0
        while ran < limit:
            if not self.step():
                fake: Any = clock.installed()
                if fake is None or not getattr(fake, "autojump", False):
                    if not self._wait_for_async():
                        return ran
                    continue
                if self._async_in_flight():  # its next step may be due before the next timer
                    fake.wait_until_blocked()
                    if self.pending:
                        continue
                if not fake.jump():
                    return ran
                continue
            ran += 1
        left = self.pending
        if left:
            raise StepLimitError(limit, left)
        return ran

    def _async_in_flight(self) -> bool:
        """Whether a run on this executor with async work (async nodes, an async batch
        function) has a node running: on an event loop, not in a ``step``, when nothing is
        queued here; what it does next may queue work here."""
        for run in inflight.runs():
            plan = run.plan
            if ((plan.any_async or plan.batches is not None) and RUNNING in run.code
                    and same_executor(run.executor, self)):
                return True
        return False

    def _wait_for_async(self) -> bool:
        """Nothing is queued: wait (real time) while async work of a run on this executor is
        in flight, until it queues work here (True) or no longer is (False)."""
        while self._async_in_flight():
            with self._lock:
                if self._queue:
                    return True
                clock.real_wait(self._lock, _SLICE)
        return self.pending > 0

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new work, as ``ThreadPoolExecutor.shutdown`` does.

        ``cancel_futures``: cancel every queued future (their callbacks run on this thread).
        ``wait``: run what is still queued on this thread now (at most ``DEFAULT_MAX_STEPS``
        callables; submissions they make are refused), as a pool's workers would finish it
        before ``shutdown`` returns. With ``wait=False`` queued work stays and ``step`` still
        runs it.
        """
        with self._lock:
            self._shutdown = True
            dropped = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
        for item in dropped:
            item.future.cancel()
        if wait:
            self.run_until_idle()

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        return (f"<ManualExecutor seed={self.seed!r} {state} pending={self.pending} "
                f"steps={self.steps}>")
