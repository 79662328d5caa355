"""Async nodes: a node whose task is a coroutine function runs on an event loop, not on a worker.

Which loop
==========
Under ``start``/``stream``/``submit``, taskflow's own loop thread (``taskflow-asyncio``, one per
process: ``LoopThread``, started on first use, started afresh in a forked child, stopped at
interpreter exit after cancelling what is left on it), or the application's loop given to
``set_event_loop``; under ``run_async``, the loop that awaits the run (``Run.aio_loop``).

One attempt
===========
``start_node`` is called where ``Run.execute`` would call the task, on the thread that popped
the node (a worker loop, an inline drain, or the owner for a retry): it stamps the attempt
(``begin_attempt``: the ``on_begin`` hook runs there, never on the loop), makes the coroutine,
has the run track the attempt (``attempts.track``: an ``Attempt`` with a dict of its own for
``current``, so every way the run abandons it reaches it) and hands it to the loop through the
loop's ``loophub.Hub`` (``Hub.call``: the attempts handed over before the loop thread gets to
them are begun by one drain, for one ``call_soon_threadsafe``). The thread goes on at once with
its next node: the attempt holds no worker while it awaits. The plain async roots
(``Plan.aplain``) of a quiet run on a thread pool skip the worker: the run's owner starts them
as the run begins (``Run.begin`` -> ``start_plain``: tracked under one lock of the watch, handed
to the loop in one ``Hub.call``), so a pool whose workers are all held does not delay them.
The attempt's thread is the loop's
(``WorkResult.thread``: the thread's name, written again by the loop as it begins the task).

On the loop, the coroutine runs inside an asyncio task driving a ``_Steps`` wrapper, which
writes the attempt's ``current`` fields (``run``, ``idx``, ``item``) on the loop thread around
each step, so ``ctx.result_of``, ``ctx.remaining``, ``ctx.timeout``, ``ctx.on_cancel`` and the
clamped clients answer for this attempt, as they do on a worker. ``ctx.cancel`` from a step is
handed to the owner (``cancel_from_loop``, after the outcomes handed over before it): closing a
run runs hooks, and hooks never run on the loop thread.

When the task ends, its done-callback (the loop thread) marks the attempt ended and hands the
outcome to the run's owner (``_outcome``) with the run's other outcomes of the loop's iteration
(``Hub.post``: one ``run.post`` for them all), which records it like a worker would: a failed
attempt is retried at once or after its back-off (the node waits in BACKOFF on the engine timer,
holding no thread and no task: ``retrying.requeue`` queues it again), otherwise
``Run.complete`` records it, runs the hook and settles the sons.

Cancellation
============
When the run gives up on the attempt (its budget, the node's ``timeout=`` or ``deadline=``, a
``ctx.cancel``, a join that no longer needs it), ``attempts.abandon`` calls the attempt's
``stop`` (``Attempt.stop``): it asks the loop to cancel the asyncio task (``CancelledError``
inside the coroutine), and the user's ``ctx.on_cancel`` callbacks go to a coordinator thread as
for any attempt. The node's state was already written by whoever gave up (TIMEOUT,
CANCELLED); the cancelled task's end is dropped. A task cancelled before it started is never
started (its coroutine is closed). Nothing of an abandoned async attempt is left running.

Resilience options
==================
A node with a ``NodePolicy`` passes the same gates as a plain one (``guards.admit``, in
``start_node`` on the thread that popped it, before ``begin_attempt``): PARKED, it holds no
worker and no task (what it waits for queues it again, and it comes back here); DONE, its
outcome is recorded at once; GO, its attempt starts holding what the gates gave it (a bulkhead
slot, a breaker permit, in ``guards.Attempt``). Everything it holds goes back on a
``taskflow-coordinator`` thread, never on the loop thread (releasing a slot runs the next
waiter's callback, recording in a breaker logs: both may be user code), whichever way the
attempt ends:

* it returned: ``Attempt.deliver`` hands the outcome to a coordinator thread rather than to the
  owner (whose inbox is no longer read once ``start`` returned), and ``_record`` calls
  ``guards.attempt_done`` before it retries or completes the node;
* the run abandoned it (the task cancelled, or never started): ``_abandoned_end`` gives the
  slot back and counts the breaker permit as ``guards.release`` does, whichever of the two
  comes first: a failure when the node ran out of time or the run was closed, nothing when a
  join no longer needed it or it lost a hedge race (the cancelled call said nothing).

Hedged duplicates are asyncio tasks too: ``start_node`` gives the node's ``Guard`` a ``launch``
(``_launch_hedge``), which ``guards``' hedge launch calls on the owner instead of submitting a
worker; the duplicate's end goes to ``guards.hedge_returned`` (``_hedge_outcome``), and the
loser is cancelled for real when the winner settles the node (``attempts.abandon``).

Detached work (``detach=True``, and a ``stale_for`` refresh) of an async node starts its
attempts with ``start_detached`` instead of submitting them: ``on_begin`` on the thread that
starts it, the task on the loop seeing the work's view as its run, its outcome to a
coordinator thread (``Detached.attempt_ended``) and its deadline cancelling the task
(``Detached.hold`` gives it the attempt's ``stop``).

Invariants: the loop thread calls no hook, no observer, no ``executor.submit``, no gate and no
give-back (it only hands outcomes over: ``run.post``, ``Hub.post``,
``remote.coordinator.put``), and takes no run's lock but through the task's own ``ctx`` calls; an attempt's outcome is handed over at
most once, and only when the run did not abandon it; an abandoned attempt of a node with resilience options hands over its give-back exactly
once (from its task's end, or from ``begin``/``_begin`` when it never started); ``stop`` is
called at most once per attempt (the watch takes it out under its lock) and is idempotent
anyway.

Async batch functions
=====================
A ``Batch`` whose function is ``async def`` has its calls awaited here (``start_batch_call``,
which ``batching`` reaches as ``batching.start_on_loop``): the thread that holds the duty to
run a call (a joiner, the engine timer at the window's end, a fan-out's item loop) reads its
keys (``Batch.begin``) and hands ``fn(keys)`` to the loop of a run with a seat in it (as for
an async node of that run: ``run_async``'s loop, the application's, or taskflow's loop
thread), then goes on: no worker is held while the call awaits, whether its seats are sync or
async nodes. The task's end goes to a coordinator thread, which answers the seats
(``Batch.resolve``: the parties, a user mapping's lookups) as a worker answers a plain call.
The call registers its ``stop`` with the batch (``Batch.running``): when the last seat leaves
(every run waiting for it gave up: its budget, a node's timeout or deadline), the task is
cancelled for real, and its end counts as cancelled, not failed. An async ``key=`` is still
refused by ``Batch`` (keys are read synchronously, on the joiner's thread); an async node
with a plain ``Batch`` is answered by it like a plain node (its task is not called).

What is refused (``check_plan``, before anything runs): an async node on an executor that runs
tasks in other processes, or of a kind that schedules its own work (a fan-out); and, but under
``run_async``, a loop given to ``set_event_loop`` that was closed since.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

from taskflow import _fork, clock
from taskflow.engine import (
    aiorecord,
    attempts,
    batching,
    guards,
    loophub,
    looplag,
    remote,
    retrying,
    timer,
)
from taskflow.engine.states import BACKOFF, NO_LOOP, RUNNING
from taskflow.errors import (
    FlowDefinitionError,
    InvalidArgumentError,
    InvalidArgumentValueError,
    NodeCancelledError,
    NodeTimeoutError,
)
from taskflow.errors import returned_coroutine as returned
from taskflow.model.context import current
from taskflow.model.graph import Plan
from taskflow.model.result import ResultState, WorkResult

if TYPE_CHECKING:
    import asyncio

    from taskflow.engine.economy import Economy

__all__ = ["LOOP_THREAD", "AsyncRun", "Attempt", "LoopThread", "cancel_from_loop",
           "check_batches", "check_plan", "event_loop", "loop_thread", "on_loop",
           "returned_coroutine", "set_event_loop", "start_batch_call", "start_detached",
           "start_node", "start_plain"]

LOOP_THREAD = "taskflow-asyncio"
# how long interpreter exit waits for the loop thread to cancel what is left (real time)
_EXIT_GRACE = 1.0

# ``create_task(context=)`` (3.11): the task runs in the copy given, instead of a copy of the
# copy entered to create it
_TASK_CONTEXT = sys.version_info >= (3, 11)

_DEFAULT = ResultState.DEFAULT
_TIMEOUT = ResultState.TIMEOUT


class AsyncRun(aiorecord.PlainRun, retrying.BudgetedRun, Protocol):
    """What running async nodes uses of a run (``run.Run`` satisfies it; ``run.py`` has mypy
    check that). ``aio_loop``: the loop of ``run_async``'s caller (None: the process's)."""

    aio_loop: Any

    @property
    def economy(self) -> Economy:
        """The run's loop economy (the gates' and the retries' view of it)."""

    def begin_attempt(self, i: int, wr: WorkResult[Any], thread: str, node: Any) -> None:
        """Stamp an attempt of node ``i`` and run ``on_begin``."""

    def complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Record node ``i``'s outcome, run its hook, settle its sons."""

    def late(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Drop node ``i``'s outcome (it was settled without it)."""

    def move_on(self, token: int) -> int:
        """Loop ``token`` is done with its node: its next node, or -1."""

    def route(self, i: int, node: Any, value: Any) -> None:
        """A switch returned ``value``: record the sons it chose."""

    def node(self, i: int) -> Any:
        """The run's copy of node ``i``."""

    def cancel(self, reason: str | None) -> None:
        """``ctx.cancel``."""


# -- the loops -----------------------------------------------------------------------------------


class LoopThread:
    """Taskflow's own event loop on a daemon thread of its own (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards loop and thread
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.at_exit = False
        _fork.register(self, hold="lock")

    def get(self) -> asyncio.AbstractEventLoop:
        """The loop, started on first use."""
        loop = self.loop
        if loop is not None:
            return loop
        with self.lock:
            if self.loop is None:
                import asyncio  # loaded when the async node was built (model.node.load_asyncio)

                fresh = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(target=self.serve, args=(fresh, ready),
                                          name=LOOP_THREAD, daemon=True)
                thread.start()
                ready.wait()
                self.loop, self.thread = fresh, thread
                if not self.at_exit:
                    self.at_exit = True
                    atexit.register(self.shutdown)
            return self.loop

    @staticmethod
    def serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        """The loop thread: run the loop until ``shutdown``, then cancel what is left on it,
        wait for it and close the loop."""
        import asyncio

        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def shutdown(self) -> None:
        """Stop the loop (interpreter exit): its tasks are cancelled, the thread ends."""
        with self.lock:
            loop, thread = self.loop, self.thread
            self.loop = self.thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(loop.stop)
        clock.real_join(thread, _EXIT_GRACE)

    def _after_fork_in_child(self) -> None:
        """A forked child has no loop thread: a new one starts on first use (the parent's loop
        object, whose thread is absent here, is dropped, not closed: its files are shared)."""
        self.lock = threading.Lock()
        self.loop = self.thread = None
        _forget_app_loop()  # its thread is absent in the child too


loop_thread = LoopThread()
_app_loop: asyncio.AbstractEventLoop | None = None  # set_event_loop's


def _forget_app_loop() -> None:
    global _app_loop
    _app_loop = None


def set_event_loop(loop: Any) -> None:
    """Run async nodes of ``start``/``stream``/``submit`` runs on ``loop`` (an application's
    running loop) instead of taskflow's own loop thread; ``None`` goes back to taskflow's.

    Raises:
        InvalidArgumentError: ``loop`` is not an ``asyncio.AbstractEventLoop`` (nor None).
        InvalidArgumentValueError: ``loop`` is closed.
    """
    global _app_loop
    if loop is None:
        _app_loop = None
        return
    import asyncio  # a program with an event loop to give has it loaded

    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise InvalidArgumentError(
            f"set_event_loop needs an asyncio event loop or None, got {type(loop).__name__}",
            argument="loop")
    if loop.is_closed():
        raise InvalidArgumentValueError(
            "set_event_loop got a closed event loop: async nodes could never run on it; give "
            "a running loop (asyncio.get_running_loop()) or None for taskflow's own",
            argument="loop")
    _app_loop = loop


on_loop: Callable[[Any], None] | None = None
"""While set (a fake clock is entered, ``taskflow.testing.aioclock``): called with each loop an
attempt goes to, before it does, so that virtual time drives the loop's timers."""


def event_loop(run: AsyncRun) -> asyncio.AbstractEventLoop:
    """The loop ``run``'s async nodes run on (see the module docstring)."""
    loop = run.aio_loop or _app_loop
    if loop is None:
        loop = loop_thread.get()
    elif loop.is_closed():
        raise RuntimeError("the event loop async nodes run on is closed (given to "
                           "taskflow.set_event_loop or awaiting run_async); an async node "
                           "cannot run on it")
    if on_loop is not None:
        on_loop(loop)
    return loop


# -- bad input -----------------------------------------------------------------------------------


def check_plan(plan: Plan, remote: bool, executor_name: str, blocking: bool,
               awaiting: Any = None) -> None:
    """Before a run with async nodes starts: refuse what does not work for them (another
    process's executor, a fan-out), a ``blocking`` start (``start``, ``stream``) called on the
    very loop they would run on, and a loop given to ``set_event_loop`` that was closed since
    (``awaiting``: ``run_async``'s loop, which the run uses instead).

    Raises:
        FlowDefinitionError: naming the async node and what it cannot have, or the loop.
    """
    app = _app_loop
    if awaiting is None and app is not None and app.is_closed():
        raise FlowDefinitionError(
            f"node {plan.names[plan.asyncs.index(True)]!r} has an async def task, and the event "
            "loop given to taskflow.set_event_loop has been closed since: its async nodes "
            "could never run; give set_event_loop a running loop, or None for taskflow's own")
    if blocking and _on_their_loop():
        raise FlowDefinitionError(
            "start/stream of a flow with async nodes was called on the event loop those "
            "nodes run on: it would block them until the budget ends; await "
            "taskflow.run_async(...) there instead")
    for i, is_async in enumerate(plan.asyncs):
        if not is_async:
            continue
        name = plan.names[i]
        if remote:
            raise FlowDefinitionError(
                f"node {name!r} has an async def task, which cannot run on {executor_name}: "
                "an executor in other processes does not run coroutines; start the flow on a "
                "thread pool (async nodes run on an event loop and take no worker), or make "
                "the task a plain def that calls asyncio.run itself")
        if plan.fanout[i]:
            raise FlowDefinitionError(
                f"node {name!r}: a fan-out's task cannot be async def (its items run on the "
                "executor)")


def returned_coroutine(name: str, coro: Any) -> None:
    """A sync task of node ``name`` returned coroutine ``coro`` (``lambda ctx, p: fetch(ctx,
    p)`` with ``fetch`` async): nothing would ever await it. Close it (no "never awaited"
    warning later) and fail the attempt.

    Raises:
        TypeError: always, naming the node and the coroutine's function.
    """
    raise returned(f"node {name!r}", coro, "its task",
                   "pass the async function itself, FunctionNode({fn}) or an async def task, "
                   "so that it runs on an event loop")


def _on_their_loop() -> bool:
    """Whether this thread runs the loop a ``start``/``stream`` run's async work would use
    (the application's, or taskflow's loop thread): blocking here, it would wait for itself."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:  # no loop runs in a process that never loaded asyncio
        return False
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return running in (_app_loop, loop_thread.loop)


def check_batches(plan: Plan) -> None:
    """Before a blocking run (``start``, ``stream``) of a flow without async nodes whose
    batches may have an async function: refuse it on the loop that function's calls would be
    awaited on (the run would block them until its budget ends).

    Raises:
        FlowDefinitionError: naming the node and its batch.
    """
    batches = plan.batches
    if batches is None:
        return
    for name, batch in zip(plan.names, batches, strict=True):
        if batch is not None and batch.is_async and _on_their_loop():
            raise FlowDefinitionError(
                f"node {name!r} is answered by batch {batch.name!r}, whose batch function is "
                "async def: start/stream was called on the event loop its calls run on, and "
                "would block them until the budget ends; await taskflow.run_async(...) there "
                "instead")


# -- one attempt ---------------------------------------------------------------------------------


class Attempt:
    """One attempt of an async node: its ``current`` fields (``tls``), its asyncio task and
    whether the run abandoned it."""

    __slots__ = ("end", "guarded", "hedge", "hub", "i", "loop", "run", "stopped", "task", "tls")

    def __init__(self, run: AsyncRun, i: int, guarded: bool = False,
                 hedge: tuple[Any, guards.Attempt] | None = None) -> None:
        self.run = run
        self.i = i
        self.guarded = guarded  # the node has resilience options (see ``deliver``)
        self.hedge = hedge  # a hedged duplicate: its race and its ``guards.Attempt``
        # detached work's attempt: where its outcome goes (``start_detached``)
        self.end: Callable[[Any, BaseException | None], None] | None = None
        self.tls: dict[str, Any] = {"run": run, "idx": i, "item": None}
        self.stopped = False
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.hub: loophub.Hub | None = None  # the loop's (``_begin``)

    def stop(self) -> None:
        """The run abandoned the attempt (any thread, maybe under the run's lock): cancel its
        task on the loop, or keep it from starting."""
        self.stopped = True
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop was closed: nothing runs there
                loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        task = self.task
        if task is not None:
            task.cancel()

    def begin(self, coro: Any) -> None:
        """The loop thread: start the task (unless the attempt was abandoned meanwhile)."""
        if self.stopped:
            coro.close()
            if self.guarded:  # what its gates gave it goes back (never on the loop thread)
                self.abandoned_end(None)
            return
        if self.end is None:  # the thread it runs on, as the in-flight view shows it
            wr = self.run.results[self.i]
            name = self.hub.name  # type: ignore[union-attr]
            if wr.thread != name:
                wr.thread = name
        # the task copies the run's contextvars, as a worker runs a node in a copy of them; its
        # end is handed over by its last step (``_Steps``), with no done-callback
        if _TASK_CONTEXT:
            self.task = self.loop.create_task(  # type: ignore[union-attr]
                _Steps(self, coro), context=self.run.cv.copy())
        else:
            self.task = self.run.cv.copy().run(self.loop.create_task,  # type: ignore[union-attr]
                                               _Steps(self, coro))

    def ended(self, value: Any, error: BaseException | None, cancelled: bool) -> None:
        """The loop thread, in the task's last step: the coroutine returned ``value``, raised
        ``error`` or was cancelled; hand the outcome over unless the run abandoned the attempt
        (an abandoned attempt of a node with resilience options still gives back its slot)."""
        self.tls["idx"] = None  # no longer running: an abandonment from now on skips it
        self.task = None
        if cancelled and not self.stopped:
            error = _cancelled_outside(self.run, self.i)
        if not self.stopped:
            self.deliver(value, error, True)
        elif self.guarded:  # the run gave up on it: its state says so already
            self.abandoned_end(None if cancelled else error is None)
        # the run's watch keeps the attempt (its ``stop``, its ``tls``) until the run is freed:
        # without these links back the run is freed by refcounting, not by the cyclic collector
        self.tls["run"] = None
        self.run = None  # type: ignore[assignment]  # read by no one from now on

    def deliver(self, value: Any, error: BaseException | None, on_loop: bool = False) -> None:
        """The attempt's outcome goes to the run's owner (``on_loop``, from the loop thread:
        with the run's other outcomes of the loop's iteration, ``Hub.post``); with resilience
        options, to a coordinator thread, which gives back what its gates gave it
        (``guards.attempt_done``) even when the run has ended and its owner reads no more. It
        only hands over: the loop thread may call it."""
        run = self.run
        if self.end is not None:
            remote.coordinator.put(run.cv, self.end, (value, error))
        elif self.hedge is not None:
            remote.coordinator.put(run.cv, _hedge_outcome, (run, self.i, *self.hedge, value,
                                                            error))
        elif self.guarded:
            remote.coordinator.put(run.cv, _outcome, (run, self.i, value, error, True))
        elif on_loop:
            self.hub.post(run, _outcome, (run, self.i, value, error))  # type: ignore[union-attr]
        else:
            run.post(_outcome, run, self.i, value, error)

    def abandoned_end(self, ok: bool | None) -> None:
        """The run gave up on this attempt of a node with resilience options and it ended (or
        never started: ``ok`` None): a coordinator thread gives back what it holds."""
        remote.coordinator.put(self.run.cv, _abandoned_end, (self.run, self.i, ok, self.hedge))


def _cancelled_outside(run: AsyncRun, i: int) -> BaseException:
    return NodeCancelledError(run.names[i], "its asyncio task was cancelled outside taskflow "
                              "(the event loop shutting down?)")


def _abandoned_end(run: AsyncRun, i: int, ok: bool | None,
                   hedge: tuple[Any, guards.Attempt] | None) -> None:
    """A coordinator thread: an attempt of async node ``i`` the run abandoned has ended (``ok``:
    how it returned; None: cancelled, or never started). Its slot goes back; its breaker
    permit counts as a failure when the node ran out of time (its timeout, deadline or the
    run's budget: a hanging backend opens the breaker) or the run was closed (``ctx.cancel``),
    as ``guards.release`` counts it, whichever of the two comes first; and for nothing when a
    join no longer needed the node, or the attempt lost a hedge race (the cancelled call said
    nothing of the backend)."""
    with run.lock:
        wr = run.results[i]
        failed = (wr.state is _TIMEOUT or isinstance(wr.exception, NodeTimeoutError)
                  or run.expired or run.cancel_reason is not None)
    if hedge is not None:
        race, a = hedge
        guards.hedge_returned(run, i, race, a, None,
                              NodeCancelledError(run.names[i], "its run gave up on it"),
                              ran=failed)
        return
    guards.attempt_done(run, i, (False if failed else None) if ok is None else ok)


def _launch_hedge(run: AsyncRun, i: int, race: Any, a: guards.Attempt) -> None:
    """The run's owner (``guards``' hedge launch, which holds the duplicate's slot, breaker
    permit and token in ``a``): a duplicate attempt of async node ``i``, a second asyncio task.
    Whichever attempt loses the race is cancelled for real: the winner's outcome settles the
    node, and the run abandons the node's other attempts (``attempts.abandon``)."""
    node = run.plan.nodes[i] if run.plan.stateless[i] else run.node(i)
    _begin(Attempt(run, i, True, (race, a)), node)


def _hedge_outcome(run: AsyncRun, i: int, race: Any, a: guards.Attempt, value: Any,
                   error: BaseException | None) -> None:
    """A coordinator thread (in a copy of the run's contextvars): a hedged duplicate of async
    node ``i`` returned; the race says whether its outcome is the node's
    (``guards.hedge_returned``), as for a plain duplicate."""
    from taskflow.resilience.latency import latencies

    cur = current.__dict__
    prev = cur.get("run"), cur.get("idx")
    cur["run"], cur["idx"] = run, i
    try:
        value, error = _routed(run, i, value, error)
        if error is None:
            latencies.record(run.plan.policy[i], clock.now() - a.started)
        guards.hedge_returned(run, i, race, a, value, error)
    finally:
        cur["run"], cur["idx"] = prev


class _Steps(Coroutine[Any, Any, Any]):
    """The coroutine an attempt's asyncio task drives: it steps the task's own coroutine with the
    attempt's ``current`` fields written on the loop thread around each step (and the thread's
    own put back after it), each step timed for ``looplag`` (a step holding the loop past its
    threshold is reported), the attempt counted in flight on its loop from its first step to
    its end. Its last step hands the attempt's outcome over (``Attempt.ended``) and ends the
    task with None: the task's own result is read by nobody (no done-callback, and no
    "exception never retrieved" for a failed attempt)."""

    __slots__ = ("att", "coro", "live", "watch")

    def __init__(self, att: Attempt, coro: Any, watch: looplag.Loop | None = None) -> None:
        self.att = att
        self.coro = coro
        self.watch = watch or looplag.loop_of(att.loop, current.__dict__)
        self.live = False  # between its first step and its end (``looplag.began``)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.coro.__await__()  # type: ignore[no-any-return]  # never awaited

    def send(self, value: Any) -> Any:
        return self._step(self.coro.send, value)

    def throw(self, *exc: Any) -> Any:
        return self._step(self.coro.throw, *exc)

    def close(self) -> None:
        self.coro.close()
        if self.live:
            self.live = False
            self.watch.running -= 1  # looplag.ended

    def _step(self, method: Callable[..., Any], *arg: Any) -> Any:
        watch = self.watch
        if not self.live:
            self.live = True
            looplag.began(watch)
        att = self.att
        d = current.__dict__
        tls = att.tls
        prev = d.get("run"), d.get("idx"), d.get("item"), d.get("aio")
        d["run"], d["idx"], d["item"], d["aio"] = tls["run"], tls["idx"], None, tls
        t0 = watch.t0 = clock.real_now()  # t0 first: the watcher reads step, then t0
        watch.step = att
        try:
            out = method(*arg)
        except StopIteration as stop:  # it returned
            end: tuple[Any, BaseException | None, bool] = (stop.value, None, False)
        except Exception as exc:  # noqa: BLE001 - the attempt's failure
            end = (None, exc, False)
        except BaseException as exc:
            if not isinstance(exc, sys.modules["asyncio"].CancelledError):
                self._end(d, prev, t0, (None, exc, False))  # KeyboardInterrupt, SystemExit:
                raise  # the loop's too
            end = (None, None, True)
        else:
            watch.step = None
            d["run"], d["idx"], d["item"], d["aio"] = prev
            lag = clock.real_now() - t0
            if lag >= looplag.threshold():
                looplag.stepped(att, lag)
            return out
        self._end(d, prev, t0, end)
        raise StopIteration(None)  # the task ends with None: its outcome went over

    def _end(self, d: dict[str, Any], prev: tuple[Any, ...], t0: float,
             end: tuple[Any, BaseException | None, bool]) -> None:
        """The last step returned, raised or was cancelled: put the thread's own ``current``
        back, time the step, and hand the outcome over."""
        watch, att = self.watch, self.att
        watch.step = None
        d["run"], d["idx"], d["item"], d["aio"] = prev
        self.live = False
        watch.running -= 1  # looplag.ended
        lag = clock.real_now() - t0
        if lag >= looplag.threshold():
            looplag.stepped(att, lag)
        att.ended(*end)


def start_node(run: AsyncRun, i: int, token: int, node: Any) -> int:
    """Where ``Run.execute`` would call node ``i``'s task: pass its gates (a node with
    resilience options, see "Resilience options" in the module), start an attempt on the loop
    and return loop ``token``'s next node (the attempt holds no worker)."""
    wr = run.results[i]
    if wr.state is not _DEFAULT:
        return run.late(i, token, None, None)  # settled while queued or between attempts
    pol = run.plan.policy[i] if run.plan.any_policy else None
    if pol is not None:
        if pol.hedge is not None:  # its duplicates are asyncio tasks too
            guards.guard_of(run, i).launch = _launch_hedge
        gate = guards.admit(run, i)
        if gate == guards.PARKED:  # it holds no worker and no task while it waits
            return run.move_on(token)
        if gate == guards.DONE:
            return run.complete(i, token, *guards.take_outcome(run, i))
    if run.plan.aplain[i] and run.quiet:  # begin_attempt's steps that apply to it
        if wr.started_at is None:
            wr.started_at = clock.now()
        wr.attempts += 1
        wr.thread = _thread_name(run)
    else:
        run.begin_attempt(i, wr, _thread_name(run), node)
    _begin(Attempt(run, i, pol is not None), node)
    return run.move_on(token)


def start_plain(run: AsyncRun, nodes: list[int]) -> None:
    """The run's owner, as the run begins: start an attempt of each plain async node of
    ``nodes`` (``Plan.aplain``, of a quiet run; moved to RUNNING by the caller) on the loop,
    without a worker: the attempts are stamped, tracked under one lock of the run's watch
    and handed to the loop in one ``Hub.call`` (begun there by one call). A pool whose
    workers are all busy does not delay them."""
    try:
        loop = event_loop(run)
    except BaseException as exc:  # noqa: BLE001 - every attempt fails, as a task's would
        for i in nodes:
            run.post(_outcome, run, i, None, exc)
        return
    hub = loophub.hub_of(loop, LOOP_THREAD if loop is loop_thread.loop else None)
    name = hub.name or _thread_name(run)
    now = clock.now()
    plan_nodes, results, ctx = run.plan.nodes, run.results, run.ctx
    started: list[tuple[Attempt, Any]] = []
    for i in nodes:
        wr = results[i]
        if wr.started_at is None:
            wr.started_at = now
        wr.attempts += 1
        wr.thread = name
        att = Attempt(run, i)
        att.loop, att.hub = loop, hub
        att.tls["hub"] = hub
        node: Any = plan_nodes[i]  # a FunctionNode (Plan.aplain)
        try:
            started.append((att, node.fn(ctx, node.param)))
        except BaseException as exc:  # noqa: BLE001 - the attempt's failure
            att.deliver(None, exc)
    ok = attempts.track_many(run, [(a.i, a.tls, a.stop) for a, _ in started])
    go = []
    for (att, coro), tracked in zip(started, ok, strict=True):
        if tracked:
            go.append((att, coro))
        else:
            coro.close()  # the run gave up on the node already
    if not go:
        return
    try:
        hub.call(loop, _begin_all, go)
    except RuntimeError as exc:  # the loop was closed meanwhile
        for att, coro in go:
            coro.close()
            att.tls["idx"] = None
            att.deliver(None, exc)


def _begin_all(go: list[tuple[Attempt, Any]]) -> None:
    """The loop thread: begin the attempts ``start_plain`` handed over together (of one run,
    on one loop): ``Attempt.begin``'s steps, with what they share read once."""
    first = go[0][0]
    run, loop = first.run, first.loop
    assert loop is not None and first.hub is not None
    name, results, cv, create = first.hub.name, run.results, run.cv, loop.create_task
    watch = looplag.loop_of(loop, current.__dict__)
    for att, coro in go:
        if att.stopped:
            att.begin(coro)  # it closes the coroutine
            continue
        wr = results[att.i]
        if wr.thread != name:
            wr.thread = name
        if _TASK_CONTEXT:
            att.task = create(_Steps(att, coro, watch), context=cv.copy())
        else:
            att.task = cv.copy().run(create, _Steps(att, coro, watch))


def _thread_name(run: AsyncRun) -> str:
    """The name of the thread running the loop ``run``'s async nodes run on, once an attempt
    ran there (before: taskflow's loop thread's; the attempt's start on the loop writes the
    real one, ``Attempt.begin``)."""
    loop = run.aio_loop or _app_loop or loop_thread.loop
    if loop is not None:
        name = loophub.name_of(loop)
        if name is not None:
            return name
    return LOOP_THREAD


def _begin(att: Attempt, node: Any,
           hold: Callable[[Attempt], bool] | None = None) -> None:
    """Make the attempt's coroutine and hand it to the loop (the thread that starts it).
    ``hold(att)`` registers it with whoever may abandon it (default: the run's watch,
    ``attempts.track``); False: abandoned already, it never starts."""
    run = att.run
    try:
        loop = att.loop = event_loop(run)
        hub = att.tls["hub"] = att.hub = loophub.hub_of(
            loop, LOOP_THREAD if loop is loop_thread.loop else None)
        coro = node.task(run.ctx, node.param)
    except BaseException as exc:  # noqa: BLE001 - the attempt's failure, as a task's would be
        att.deliver(None, exc)
        return
    if (attempts.track(run, att.i, att.tls, att.stop) if hold is None else hold(att)):
        try:
            hub.call(loop, att.begin, coro)  # with the other attempts the loop has not begun
        except RuntimeError as exc:  # the loop was closed meanwhile
            coro.close()
            att.tls["idx"] = None
            att.deliver(None, exc)
    else:
        coro.close()  # the run gave up on the node already
        if att.guarded:
            att.abandoned_end(None)  # the call never happened


def start_detached(work: Any) -> None:
    """An attempt of detached work (``detached.Detached``: a node handed off with
    ``detach=True``, or a ``stale_for`` refresh) whose task is async, started by the thread
    that would submit it (the hand-off's loop, a coordinator after a back-off): ``on_begin``
    runs here, the task on the loop seeing the work's ``DetachedView`` as its run; its outcome
    goes to a coordinator thread (``Detached.attempt_ended``: a retry or the end), and the
    work's deadline cancels the task (``Detached.stop``, given by ``Detached.hold``)."""
    view = work.attempt_begins(_thread_name(work.run))
    if view is None:
        return
    att = Attempt(work.run, work.i)
    att.end = work.attempt_ended
    att.tls["run"] = view
    _begin(att, work.node, lambda a: bool(work.hold(a.stop)))


def _outcome(run: AsyncRun, i: int, value: Any, error: BaseException | None,
             guarded: bool = False) -> None:
    """The run's owner (a coordinator thread for a node with resilience options): the outcome
    of an attempt of async node ``i`` (in a copy of the run's contextvars, with ``current``
    naming the node, as a worker records it)."""
    if guarded:
        run.cv.copy().run(_record, run, i, value, error, True)
    else:
        run.cv.copy().run(_record_all, run, [(run, i, value, error)])


def _outcomes(batch: list[tuple[Any, ...]]) -> None:
    """The run's owner: the outcomes ``(run, i, value, error)`` of attempts of one run handed
    over together (``loophub.batched``), in one copy of the run's contextvars."""
    run = batch[0][0]
    run.cv.copy().run(_record_all, run, batch)


def _record_all(run: AsyncRun, batch: list[tuple[Any, ...]]) -> None:
    """The plain successes of ``batch`` under one lock (``aiorecord.settle_plain``), the rest
    one by one."""
    for _, i, value, error in aiorecord.settle_plain(run, batch):
        _record(run, i, value, error, False)


def _routed(run: AsyncRun, i: int, value: Any,
            error: BaseException | None) -> tuple[Any, BaseException | None]:
    """A switch's successful attempt records which sons it chose; a bad choice fails it."""
    if error is None and run.plan.routes[i]:
        try:
            run.route(i, run.node(i), value)
        except BaseException as exc:  # noqa: BLE001 - a switch's bad choice fails it
            return None, exc
    return value, error


def _record(run: AsyncRun, i: int, value: Any, error: BaseException | None,
            guarded: bool) -> None:
    """The general path of an outcome: route, gates, retry or back-off, ``Run.complete``."""
    cur = current.__dict__
    prev = cur.get("run"), cur.get("idx")
    cur["run"], cur["idx"] = run, i
    try:
        value, error = _routed(run, i, value, error)
        if guarded and not guards.attempt_done(run, i, error is None):
            return  # a duplicate attempt decides
        if error is not None:
            wr = run.results[i]
            delay = retrying.retry_delay(run, i, wr, error)
            if delay >= 0.0 and run.node_observers:
                retrying.retrying(run, i, wr.attempts, error, delay)
            if delay == 0.0:
                start_node(run, i, NO_LOOP,
                           run.plan.nodes[i] if run.plan.stateless[i] else run.node(i))
                return
            if delay > 0.0:
                _back_off(run, i, wr, delay)
                return
        run.complete(i, NO_LOOP, value, error)
    finally:
        cur["run"], cur["idx"] = prev


def _back_off(run: AsyncRun, i: int, wr: WorkResult[Any], delay: float) -> None:
    """Node ``i``'s attempt failed and another follows after ``delay``: it waits in BACKOFF on
    the engine timer (no thread, no task), which queues it again (``retrying.requeue``)."""
    with run.lock:
        if run.code[i] == RUNNING and wr.state is _DEFAULT:
            run.move(i, BACKOFF)
            timer.schedule(clock.now() + delay, retrying.requeue, run, i)


def cancel_from_loop(run: AsyncRun, reason: str | None) -> bool:
    """``ctx.cancel`` asked by a step of an async attempt: the run's owner closes the run (its
    hooks never run on the loop thread). False when not asked from an async attempt."""
    d = current.__dict__
    tls = d.get("aio")
    if tls is None or d.get("run") is not run:
        return False
    # after the outcomes of the run's attempts that ended before it (``Hub.post``)
    tls["hub"].post(run, _cancel_as, (run, int(d["idx"]), reason))
    return True


def _cancel_as(run: AsyncRun, i: int, reason: str | None) -> None:
    """The owner: ``ctx.cancel`` on behalf of async node ``i`` (the run waits for it)."""
    cur = current.__dict__
    prev = cur.get("run"), cur.get("idx")
    cur["run"], cur["idx"] = run, i
    try:
        run.cancel(reason)
    finally:
        cur["run"], cur["idx"] = prev


# -- async batch functions -----------------------------------------------------------------------


def start_batch_call(run: Any, batch: Any, call: Any) -> None:
    """Closed ``call`` of ``batch``, whose function is async, starts on ``run``'s event loop
    (the thread holding the duty to run it, outside every lock; see "Async batch functions"):
    ``fn(keys)`` becomes an asyncio task there and this thread goes on."""
    try:
        loop = event_loop(run)
    except BaseException as exc:  # noqa: BLE001 - a closed loop fails the call's seats
        batch.fail(call, exc)
        return
    keys = batch.begin(call)
    if keys is None:
        return  # nobody waits for it any more
    bc = _BatchCall(batch, call, loop, run.cv)
    if not batch.running(call, bc.stop):  # every seat left meanwhile: never started
        batch.resolve(call, None, None, cancelled=True)
        return
    try:
        loop.call_soon_threadsafe(bc.begin, keys)
    except RuntimeError as exc:  # the loop was closed meanwhile
        batch.resolve(call, None, exc)


class _BatchCall:
    """One call of an async batch function on its loop: its task, and whether taskflow
    cancelled it (``stop``: every seat left)."""

    __slots__ = ("batch", "call", "cv", "loop", "stopped", "task")

    def __init__(self, batch: Any, call: Any, loop: asyncio.AbstractEventLoop,
                 cv: Any) -> None:
        self.batch = batch
        self.call = call
        self.loop = loop
        self.cv = cv
        self.stopped = False
        self.task: asyncio.Task[Any] | None = None

    def stop(self) -> None:
        """Every seat left (``Batch.leave``, any thread): cancel the task on the loop, or keep
        it from starting."""
        self.stopped = True
        with contextlib.suppress(RuntimeError):  # the loop was closed: nothing runs there
            self.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        task = self.task
        if task is not None:
            task.cancel()

    def begin(self, keys: Any) -> None:
        """The loop thread: make ``fn(keys)`` an asyncio task (in a copy of the contextvars of
        the run that started it), unless every seat left meanwhile."""
        if self.stopped:
            self._answer(None, None, True)
            return
        try:
            task = self.cv.copy().run(self.loop.create_task, self.batch.fn(keys))
        except BaseException as exc:  # noqa: BLE001 - fn(keys) made no coroutine: it failed
            self._answer(None, exc, False)
            return
        self.task = task
        task.add_done_callback(self.task_ended)

    def task_ended(self, task: asyncio.Task[Any]) -> None:
        """The loop thread: the task ended; its outcome answers the seats still waiting."""
        import asyncio

        self.task = None
        if task.cancelled():
            if self.stopped:
                self._answer(None, None, True)
            else:
                self._answer(None, asyncio.CancelledError(
                    f"batch {self.batch.name!r}: the call's asyncio task was cancelled outside "
                    "taskflow (the event loop shutting down?)"), False)
            return
        error = task.exception()
        self._answer(task.result() if error is None else None, error, False)

    def _answer(self, value: Any, error: BaseException | None, cancelled: bool) -> None:
        """Hand the outcome to a coordinator thread: answering runs parties and a user
        mapping's lookups, never on the loop thread."""
        remote.coordinator.put(self.cv, self.batch.resolve, (self.call, value, error, cancelled))


batching.start_on_loop = start_batch_call
aiorecord.start_plain = start_plain
loophub.batched[_outcome] = _outcomes
