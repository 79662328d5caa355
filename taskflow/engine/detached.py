"""Detached nodes (``detach=True``): handed off by their run, which does not wait for them.

Audit writes, analytics events and cache warm-ups must neither delay the page nor pile up
unbounded on a side thread. A detached node is a sink with a finite ``timeout``
(``model/node.py`` and ``model/graph.py`` refuse anything else before a run starts). It becomes
ready like any node, once its fathers succeed; when a loop pops it, ``Run.execute`` calls
``hand_off`` instead of running it.

The hand-off (the loop's thread, one critical section under the run's lock)
==========================================================================
* the node already ended without us (the run closed: a detached node not handed off by then
  ends TIMEOUT or CANCELLED like any other): the loop moves on (``Run.late``);
* no slot of the process's bound is free (``taskflow.resilience.detached.try_enter``, which
  counts the refusal): outside the lock the node completes like any failed node, EXCEPTION
  with ``DetachedRefusedError`` (its ``on_fail`` hook runs in the run, before ``start``
  returns);
* else it holds a slot; its WorkResult in the run becomes ``DETACHED`` (handed off at
  ``started_at`` = ``finished_at``), the node is TERMINAL then SETTLED at once (it has no
  sons; a ``Section``'s deadline, which held it until then, no longer does), and its
  ``Detached``'s ``Handle`` (its Future) is registered in ``run.detached_work`` (what
  ``FlowResult.detached(name)`` reads) before the run can finish.

Outside the lock the node's own timer is armed, its first attempt is submitted to the run's
executor, and the loop carries on as after any settled node.

The detached life
=================
A ``Detached`` owns the node from then on: its own WorkResult (``final``: ``queued_at`` as in
the run, ``started_at`` the hand-off, ``finished_at`` its end), its deadline (hand-off +
``timeout``), its attempts (each one submission to the run's executor, run in a copy of the
caller's contextvars: ``attempt``), its retries (``retries``/``retry_backoff`` as for any
node, within its deadline; a back-off is a timer entry whose due time hands the next
submission to a ``taskflow-coordinator`` thread) and its ``ctx.on_cancel`` callbacks. It ends
exactly once (``end``; the claim is ``ended``, under ``lock``):

* an attempt's outcome (its worker): SUCCESS or EXCEPTION, TIMEOUT if it came past the
  deadline (its value dropped);
* the deadline first (``timed_out``, on the timer thread, only claims the end and hands the
  rest to a coordinator thread): TIMEOUT; the running attempt is abandoned (a thread cannot
  be killed: ``executors.mark_abandoned`` tells the executor's metrics, its ``ctx.on_cancel``
  callbacks run, its late outcome is dropped and logged);
* the executor refusing a submission: EXCEPTION with its error.

An async node's attempt (``async def`` task) is not submitted: ``aio.start_detached`` runs its
``on_begin`` on the thread that would have submitted it and its task on the event loop; the
task's outcome reaches ``attempt_ended`` on a coordinator thread (a retry or the end, as for a
worker's), and ``timed_out`` cancels the task (``stop``, handed over by ``hold`` when the task
starts) before its ``ctx.on_cancel`` callbacks run: nothing of it is left running.

Then, on the thread that ended it and outside every lock: the outcome is logged, the run's
node observers hear of it (``detached_ended``: its span ends), its ``on_success``/``on_fail``
hook runs once, the slot is given back (``detached.leave(ok)``) and the Future resolves with
``final`` (statistics record it from the Future: ``observe/stats.py``). Its hooks may run after
``start`` returned; no other node's do (they never pass through here).

The run never cancels it: a handed-off node is SETTLED, so closing the run (its deadline,
``ctx.cancel``) has nothing of it to end; only its own ``timeout`` bounds it, and the
process's ``set_max_detached`` bounds how many run at once.

What a detached task and its hooks see
======================================
``current.run`` is the work's ``DetachedView``: the run's context entries, ``ctx.result_of``
of its ancestors (settled before it was handed off), ``ctx.cancelled`` once it ended,
``ctx.timeout()``/``deadline_headers()``/``remaining()`` from its own deadline,
``ctx.on_cancel`` for its timeout; ``ctx.cancel`` does nothing (the run does not wait for it,
so there is nothing for it to end). Its task and hooks run on the view's own copy of the node,
whose ``work_result`` is ``final``.

A refresh (``Refresh``, started by ``refresh``)
===============================================
A node with ``stale_for`` served a stale cached value at its ``share_key`` gate; the cache
(``CacheBase.refresh_with``) took the key's single flight and a slot of the same bound, and
hands ``refresh(run, i, limit, finish)`` (``Run.start_refresh``) the seconds it may take: the
node's ``timeout``, or ``DEFAULT_REFRESH_TIMEOUT``. A ``Refresh`` is a ``Detached`` of node ``i``
that was never handed off (the run's node keeps the value it was served): its deadline counts
from its own start, its attempts (retries included) run in the caller's contextvars on the
run's executor and see the same ``DetachedView`` (``ctx.cancelled`` False until it ends,
``ctx.timeout()`` and the clamped clients from its deadline, ``ctx.on_cancel`` called at it),
whether the run has ended or not. What differs: no hook of the node runs and the run's node
observers hear nothing (the node already ended in the run), its log line names it a refresh
(bound ``refresh=True``), and instead of giving the slot back its end calls the cache's
``finish(value, error)``, which stores the value or counts the failure, frees the key's single
flight and gives the slot back (``taskflow.resilience.detached.metrics()`` counts it
``succeeded`` or ``failed``).

Fields of a ``Detached`` (``lock`` guards ``ended``, ``futs``, ``stop``, ``cancels``, ``retry``;
the rest is fixed at the hand-off, or written by the one thread that holds the claim)
=========================================================================================
``run``, ``i``, ``name``, ``timeout``, ``deadline``, ``retries``, ``backoff``, ``cv`` (the
caller's contextvars), ``view`` (None once it ended: the view holds the work, not back),
``node`` (the view's copy), ``final``, ``future``;
``ended`` (the end was claimed), ``futs`` (its attempts' futures, one after the other: those
not done at the deadline are reported abandoned), ``stop`` (cancels a running async attempt's
task), ``cancels`` (the running attempt's
``ctx.on_cancel`` callbacks), ``retry`` (the back-off's timer entry), ``timer`` (the
deadline's entry).
"""

from __future__ import annotations

import contextvars
import math
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Protocol

from taskflow import clock
from taskflow.engine import aio, events, executors, remote, timer
from taskflow.engine import hooks as hooking
from taskflow.engine.states import RUNNING, TERMINAL
from taskflow.errors import DetachedRefusedError, NodeTimeoutError, traceback_text
from taskflow.model.context import TaskSupport, current
from taskflow.model.graph import PlanView, copy_node
from taskflow.model.result import HookError, ResultState, WorkResult

if TYPE_CHECKING:
    from taskflow.model.context import TaskContext
    from taskflow.model.graph import Plan
    from taskflow.resilience.cache import Finish

__all__ = ["Detached", "DetachedView", "DetachingRun", "Handle", "Refresh", "hand_off", "refresh"]

_DEFAULT = ResultState.DEFAULT
_DETACHED = ResultState.DETACHED
_SUCCESS = ResultState.SUCCESS
_EXCEPTION = ResultState.EXCEPTION
_TIMEOUT = ResultState.TIMEOUT


class DetachingRun(hooking.HookedRun, Protocol):
    """Exactly what a hand-off uses of a run (``run.Run`` satisfies it; ``run.py`` has mypy
    check that). Fixed: ``plan``, ``executor``, ``cv``, ``flow_id``, ``flow_name``, ``t0``,
    ``budget``, ``data``, ``ctx``; under ``lock``: ``code``, ``detached_work`` and what
    ``settle_and_next`` moves."""

    plan: Plan
    executor: Executor
    cv: contextvars.Context
    code: list[int]
    node_timers: dict[int, timer.Timer]
    ctx: TaskContext
    data: dict[str, Any]
    node_observers: tuple[events.RunObserver, ...]
    debug: bool
    detached_work: dict[int, Handle] | None

    def value_of(self, name: str) -> Any:
        """``ctx.result_of(name)`` through the run."""

    def move(self, i: int, new: int) -> None:
        """Under lock: move node ``i`` along the state table."""

    def settle_and_next(self, i: int, token: int, hooks: list[int],
                        now: float) -> tuple[int, int, bool]:
        """Under lock: settle node ``i``; the loop's next node, loops reserved, finish."""

    def carry_on(self, nxt: int, k: int, fin: bool, hooks: list[int]) -> int:
        """Outside the lock, after ``settle_and_next``."""

    def complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Record node ``i``'s outcome as any node's."""

    def late(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """The node ended without us: the loop's next node."""


def hand_off(run: DetachingRun, i: int, token: int) -> int:
    """Loop ``token`` popped detached node ``i`` (RUNNING): hand it off, or end it refused;
    returns the loop's next node (see the module docstring)."""
    from taskflow.resilience import detached as slots  # pydantic: off ``import taskflow``'s path

    wr = run.results[i]
    now = clock.now()
    hooks: list[int] = []
    work: Detached | None = None
    entry: timer.Timer | None = None
    with run.lock:
        if run.code[i] != RUNNING or wr.state is not _DEFAULT or run.closed:
            alive = False
        else:
            alive = True
            if slots.try_enter():  # non-blocking, its own leaf lock: never calls out
                work = Detached(run, i, now)
                if run.detached_work is None:
                    run.detached_work = {}
                run.detached_work[i] = Handle(work.future)
                wr.started_at = wr.finished_at = now
                wr.state = _DETACHED
                run.move(i, TERMINAL)
                entry = run.node_timers.pop(i, None)  # its section's deadline: no longer its
                nxt, k, fin = run.settle_and_next(i, token, hooks, now)
    if not alive:
        return run.late(i, token, None, None)
    if entry is not None:
        entry.cancel()
    if work is None:
        return run.complete(i, token, None,
                            DetachedRefusedError(run.names[i], slots.max_detached()))
    if run.debug:
        run.log.bind(node=run.names[i]).debug(
            "node {} handed off detached (timeout {}s)", run.names[i], work.timeout)
    if run.node_observers:
        events.node_settled(run.node_observers, i)
    work.begin()
    return run.carry_on(nxt, k, fin, hooks)


class Handle:
    """What a run keeps of a node it handed off: the Future of its final WorkResult. It holds
    nothing of the work, so a run and its detached work never form a reference cycle: the
    work holds its run until it ends, the run only this."""

    __slots__ = ("future",)

    def __init__(self, future: Future[WorkResult[Any]]) -> None:
        self.future = future


class Detached:
    """One detached node after its hand-off (see the module docstring for every field)."""

    __slots__ = ("backoff", "cancels", "cv", "deadline", "ended", "final", "future", "futs",
                 "i", "lock", "name", "node", "retries", "retry", "run", "stop", "timeout",
                 "timer", "view")

    LABEL = "detached node"  # how its log lines name it
    HOOKED = True  # its hooks run and the run's node observers hear of it
    EXTRA: dict[str, Any] = {}  # bound in its outcome's log line, beside node and detached

    def __init__(self, run: DetachingRun, i: int, now: float,
                 timeout: float | None = None) -> None:
        plan = run.plan
        self.run = run
        self.i = i
        self.name = plan.names[i]
        t = plan.timeout[i] if timeout is None else timeout
        assert t is not None and not math.isinf(t)  # the node's definition checked it
        self.timeout = t
        self.deadline = now + t
        self.retries = plan.retries[i]
        self.backoff = plan.backoff[i]
        self.cv = run.cv
        self.lock = threading.Lock()
        self.ended = False
        self.futs: list[Future[Any]] = []
        self.cancels: list[Any] = []
        self.stop: Callable[[], None] | None = None  # cancels an async attempt's task
        self.retry: timer.Timer | None = None
        self.timer: timer.Timer | None = None
        final: WorkResult[Any] = WorkResult()
        final.queued_at = run.results[i].queued_at
        final.started_at = now
        self.final = final
        self.future: Future[WorkResult[Any]] = Future()
        self.future.set_running_or_notify_cancel()  # nobody may cancel it: it resolves once
        view = DetachedView(self)
        # the view holds the work; the work holds it back only until it ended (no cycle then)
        self.view: DetachedView | None = view
        self.node = view.copy_of_node()

    # -- starting and attempts -----------------------------------------------------------------

    def begin(self) -> None:
        """After the hand-off, outside the run's lock: arm the deadline, submit the first
        attempt."""
        self.timer = timer.schedule(self.deadline, self.timed_out)
        self.submit()

    def submit(self) -> None:
        """Submit the next attempt (a thread that may submit: the hand-off's loop, or a
        coordinator thread after a back-off)."""
        with self.lock:
            if self.ended:
                return
            self.retry = None
        if self.run.plan.asyncs[self.i]:  # an async def task: a task on the event loop
            aio.start_detached(self)
            return
        try:
            fut = self.run.executor.submit(self.cv.copy().run, self.attempt)
        except BaseException as exc:  # noqa: BLE001 - a refused submission ends the node
            self.end(None, exc)
            return
        with self.lock:
            if not self.ended:
                self.futs.append(fut)  # one per attempt, made one after the other

    def attempt(self) -> None:
        """One attempt, on an executor worker (in its own copy of the caller's contextvars)."""
        view = self.attempt_begins(threading.current_thread().name)
        if view is None:
            return  # timed out while it waited in the executor's queue
        node, run = self.node, self.run
        cur = current
        d = cur.__dict__
        prev = d.get("run"), d.get("idx"), d.get("hooking")
        cur.run, cur.idx, cur.hooking = view, self.i, None
        try:
            value = node.task(run.ctx, node.param)
            if type(value) is CoroutineType:  # a sync task returned a coroutine
                aio.returned_coroutine(run.names[self.i], value)
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - a task's failure is its node's outcome
            value, error = None, exc
        finally:
            cur.run, cur.idx, cur.hooking = prev
        self.attempt_ended(value, error)

    def attempt_begins(self, thread: str) -> DetachedView | None:
        """Count an attempt about to start on ``thread`` and run ``on_begin`` (the thread that
        starts it; never the event loop's); None when the work has ended."""
        with self.lock:
            if self.ended:
                return None
            view = self.view
        assert view is not None  # cleared only once ended
        final = self.final
        final.attempts += 1
        final.thread = thread
        number = final.attempts
        run = self.run
        if self.HOOKED and run.node_observers:
            events.detached_started(run.node_observers, self.i, number)
        if self.HOOKED and run.plan.has_begin[self.i]:
            self.call_hook(view, self.node.on_begin, number)
        return view

    def hold(self, stop: Callable[[], None]) -> bool:
        """An async attempt's task is about to start: ``stop`` cancels it at the deadline.
        False when the work has ended meanwhile (the task must not start)."""
        with self.lock:
            if self.ended:
                return False
            self.stop = stop
            return True

    def attempt_ended(self, value: Any, error: BaseException | None) -> None:
        """An attempt returned (its worker; an async one's, a coordinator thread): retry it
        or end the work."""
        run = self.run
        hooked = self.HOOKED
        number = self.final.attempts
        with self.lock:
            self.cancels = []  # callbacks of an attempt that ended by itself never run
            self.stop = None
        if error is not None:
            delay = self.retry_delay(error)
            if delay >= 0.0:
                if hooked and run.node_observers:
                    events.detached_retry(run.node_observers, self.i, number, error, delay)
                if delay == 0.0:
                    self.submit()
                    return
                entry = timer.schedule(clock.now() + delay, self.retry_due)
                with self.lock:
                    if not self.ended:
                        self.retry = entry
                        return
                entry.cancel()
                return
        self.end(value, error)

    def retry_delay(self, error: BaseException) -> float:
        """0.0: retry now; > 0: after that back-off; < 0: no retry (within its deadline)."""
        attempts = self.final.attempts
        if attempts > self.retries or not isinstance(error, Exception) or self.ended:
            return -1.0
        delay = self.backoff * (2.0 ** min(attempts - 1, 1000))
        return -1.0 if clock.now() + delay >= self.deadline else delay

    def retry_due(self) -> None:
        """Timer thread: a back-off ended; a coordinator thread submits the next attempt."""
        remote.coordinator.put(self.cv, self.submit, ())

    # -- the end -------------------------------------------------------------------------------

    def timed_out(self) -> None:
        """Timer thread: the deadline passed first; claim the end, hand the rest over."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            running, self.futs = self.futs, []
            cancels, self.cancels = self.cancels, []
            retry, self.retry = self.retry, None
            stop, self.stop = self.stop, None
        if retry is not None:
            retry.cancel()
        if stop is not None:
            stop()  # an async attempt's task is cancelled (quick: no user code)
        remote.coordinator.put(self.cv, self.abandon, (running, cancels))

    def abandon(self, running: list[Future[Any]], cancels: list[Any]) -> None:
        """Coordinator thread: the node timed out; abandon its attempt, then end it."""
        executors.mark_abandoned(self.run.executor, [f for f in running if not f.done()])
        for fn in cancels:
            _call_cancel(self, fn)
        self.finish(None, NodeTimeoutError(self.name, self.timeout))

    def end(self, value: Any, error: BaseException | None) -> None:
        """An attempt's outcome, or a refused submission: claim the end (dropped if the
        deadline claimed it first) and finish."""
        with self.lock:
            late = self.ended
            self.ended = True
            entry, self.timer = self.timer, None
            self.futs = []
        if late:
            log = self.run.log.bind(node=self.name)
            if error is not None:
                log.warning("late exception from timed-out {} {} dropped: {!r}",  # noqa: PLE1205 - loguru formats with {}
                            self.LABEL, self.name, error)
            else:
                log.debug("late result from timed-out {} {} dropped",  # noqa: PLE1205
                          self.LABEL, self.name)
            return
        if entry is not None:
            entry.cancel()
        if clock.now() >= self.deadline:
            value, error = None, NodeTimeoutError(self.name, self.timeout)
        self.finish(value, error)

    def finish(self, value: Any, error: BaseException | None) -> None:
        """The claim's holder, outside every lock: write the outcome, log it, tell the
        observers, run the hook once, give the slot back, resolve the Future."""
        final = self.final
        final.result = value
        final.exception = error
        final.finished_at = clock.now()
        final.state = (_SUCCESS if error is None else
                       _TIMEOUT if isinstance(error, NodeTimeoutError) else _EXCEPTION)
        self.log_outcome()
        self.settle(value, error)
        self.view = None
        self.future.set_result(final)

    def settle(self, value: Any, error: BaseException | None) -> None:
        """The outcome is written and logged: tell the observers, run the hook once, give the
        slot back."""
        ok = error is None
        run = self.run
        final = self.final
        if run.node_observers:
            events.detached_ended(run.node_observers, self.i, final)
        plan = run.plan
        view = self.view
        assert view is not None  # this thread holds the end: nobody cleared it
        if plan.has_success[self.i] if ok else plan.has_fail[self.i]:
            node = self.node
            self.call_hook(view, node.on_success if ok else node.on_fail, final.attempts,
                           outcome=True)
        from taskflow.resilience import detached as slots

        slots.leave(ok)

    def log_outcome(self) -> None:
        final = self.final
        log = self.run.log.bind(node=self.name, detached=True, **self.EXTRA)
        st = final.state
        if st is _SUCCESS:
            log.debug("{} {} ended SUCCESS in {:.3f}s",  # noqa: PLE1205
                      self.LABEL, self.name, final.duration)
            return
        exc = final.exception
        trace = ""
        if exc is not None and exc.__traceback__ is not None:
            trace = "\n" + traceback_text(exc).rstrip()
        log.warning("{} {} ended {}: {!r}{}",  # noqa: PLE1205 - loguru formats with {}
                    self.LABEL, self.name, st.name, exc, trace)

    def call_hook(self, view: DetachedView, fn: Any, attempt: int,
                  outcome: bool = False) -> None:
        """Call a hook of the node on ``view`` (a raising hook is logged, never propagated;
        its first error is kept on the view's ``hook_errors``)."""
        cur = current
        d = cur.__dict__
        prev = d.get("run"), d.get("idx"), d.get("hooking")
        cur.run, cur.idx, cur.hooking = view, self.i, view
        try:
            hooking.unawaited(fn(TaskSupport(view, self.i, attempt)), self.name, fn)
        except BaseException as exc:  # noqa: BLE001 - a hook never changes the outcome
            fname = getattr(fn, "__name__", "?")
            if outcome and self.i not in view.hook_errors:
                view.hook_errors[self.i] = HookError(fname, exc)
            self.run.log.bind(node=self.name).error(
                "hook {} of detached node {} raised; ignored\n{}", fname, self.name,
                traceback_text(exc))
        finally:
            cur.run, cur.idx, cur.hooking = prev

    # -- what the view asks --------------------------------------------------------------------

    def add_cancel(self, fn: Any) -> None:
        """``ctx.on_cancel`` in an attempt: kept until it ends (run at once if it ended)."""
        with self.lock:
            if not self.ended:
                self.cancels.append(fn)
                return
        _call_cancel(self, fn)

    def __repr__(self) -> str:
        state = self.final.state.name if self.future.done() else "running"
        return f"<Detached {self.name!r} of flow {self.run.flow_id} {state}>"


class Refresh(Detached):
    """A ``stale_for`` refresh of node ``i``'s cached value: detached work of its own (see
    "A refresh" in the module docstring). ``finish(value, error)`` is the cache's end of it."""

    __slots__ = ("finish_cache",)

    LABEL = "refresh of node"
    HOOKED = False
    EXTRA = {"refresh": True}

    def __init__(self, run: DetachingRun, i: int, now: float, timeout: float,
                 finish: Finish) -> None:
        super().__init__(run, i, now, timeout)
        self.final.queued_at = now
        self.finish_cache = finish

    def settle(self, value: Any, error: BaseException | None) -> None:
        """The cache stores the value (or counts the failure), frees the key's single flight
        and gives the slot back."""
        self.finish_cache(value, error)


def refresh(run: DetachingRun, i: int, limit: float, finish: Finish) -> None:
    """Start a refresh of node ``i``'s cached value, bounded by ``limit`` seconds from now
    (``CacheBase.refresh_with``'s runner; the gate that served the stale value calls it)."""
    Refresh(run, i, clock.now(), limit, finish).begin()


def _call_cancel(work: Detached, fn: Any) -> None:
    try:
        hooking.unawaited(fn(), work.name, fn, callback=True)
    except Exception as exc:  # noqa: BLE001 - a callback's error is logged, never raised
        work.run.log.bind(node=work.name).error(
            "on_cancel callback of {} {} raised; ignored\n{}", work.LABEL, work.name,
            traceback_text(exc))


class _Attempt:
    """The attempt of a detached node running on this thread, as ``ctx`` asks it
    (``AttemptView``)."""

    __slots__ = ("work",)

    def __init__(self, work: Detached) -> None:
        self.work = work

    def deadline(self) -> float:
        return -math.inf if self.work.ended else self.work.deadline

    def on_cancel(self, fn: Any) -> None:
        self.work.add_cancel(fn)

    def note_clamp(self, seconds: float) -> None:
        """Clamped calls of a detached node are not kept (its run has returned)."""


class DetachedView(PlanView):
    """What a detached node's task and hooks see of their run (``ContextView`` and
    ``RunView``): the run's entries and results, the node's own deadline and end."""

    __slots__ = ("__weakref__", "budget", "ctx", "data", "deadline", "flow_id", "flow_name",
                 "hook_errors", "names", "plan", "results", "t0", "work")

    cancel_reason: str | None = None
    expired = False
    finished = False
    watch = None

    def __init__(self, work: Detached) -> None:
        run = work.run
        self.work = work
        results = list(run.results)  # the fathers' are settled: they no longer change
        results[work.i] = work.final
        self.results = results
        self.hook_errors: dict[int, HookError] = {}
        self.flow_id = run.flow_id
        self.flow_name = run.flow_name
        self.deadline = work.deadline  # ``ctx.remaining()`` reads the node's own
        self.t0 = run.t0
        self.budget = work.timeout
        self.names = run.names
        self.plan = run.plan
        self.ctx = run.ctx
        self.data = run.data

    def copy_of_node(self) -> Any:
        """The view's copy of the node (its ``work_result`` is the node's final one)."""
        work = self.work
        return copy_node(work.run.plan.nodes[work.i], weakref.ref(self), work.final, work.i)

    def cancelled_for_caller(self) -> bool:
        return self.work.ended

    def caller_name(self) -> str:
        return self.work.name

    def value_of(self, name: str) -> Any:
        return self.work.run.value_of(name)

    def cancel(self, reason: str | None) -> None:
        """Nothing to end: the run does not wait for a detached node."""

    def asking(self) -> _Attempt | None:
        d = current.__dict__
        if d.get("run") is not self or d.get("hooking") is self:
            return None
        return _Attempt(self.work)

    def node(self, i: int) -> Any:
        work = self.work
        return work.node if i == work.i else work.run.node(i)

    @property
    def detached_work(self) -> dict[int, Handle]:
        return {self.work.i: Handle(self.work.future)}

    def __repr__(self) -> str:
        return f"<DetachedView of {self.work!r}>"
