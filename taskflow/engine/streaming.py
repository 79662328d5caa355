"""Streamed runs: the nodes of a run handed to its caller one by one, as they settle.

``TaskScheduling.stream`` builds a run exactly as ``start`` does (the same validation, shedding
and nested-run rule) and gives it one more observer, a *channel* (``events.RunObserver``): the
engine tells every observer about each node once it is terminal (``node_settled``) and about the
end of the run (``run_ended``), and the channel only puts the node's number, or the end, on a
queue. The caller's ``FlowStream`` takes them from that queue. A run that is not streamed has no
channel and pays nothing for streaming (its observers are those of the listeners, usually none).

Who runs the run: a streamed run belongs to the shared ``taskflow-coordinator`` threads, like a
``submit`` run, because its caller goes away between two items (it writes a chunk to a slow
client) and work handed to the owner must not wait for it; the budget is kept by the
``taskflow-timer`` thread and by the caller itself: ``next()`` waits on the queue until the
run's deadline at most, then closes the run (unfinished nodes TIMEOUT, their ``on_fail`` hooks
run in the caller, as ``start`` does) and hands out what is left. A stream opened by a node of a
run on the same executor (a nested stream) is an *inline* run (``inline.py``): ``next()`` runs
the ready nodes on the calling thread until one settles, so a saturated or one-worker pool
cannot deadlock on it; the timer closes it at its deadline even while one of its nodes runs
on that thread (the node sees ``ctx.cancelled``; the rest is handed out by the next ``next()``).

Every node comes out once: when the run ends, the nodes the channel did not report (a node that
ended as the run closed may be reported after the end) come out in the plan's order, from the
run's results. Closing the stream cancels the run (unfinished nodes CANCELLED, queued work
cancelled, running work abandoned, its ``ctx.on_cancel`` callbacks called) and waits for its
result, so ``FlowStream.result`` is there afterwards; a stream dropped without being closed or
exhausted (garbage-collected) cancels its run from a coordinator thread (``weakref.finalize``:
the run never refers back to the stream, so dropping the stream lets it be collected).

Threads and locks: ``FlowStream._lock`` serialises consumers (``next()`` and the draining part
of ``close``) and guards ``_emitted``, ``_tail``, ``_done``; ``_closing`` is set once under
``_state``. The channel's ``ended`` Event and ``result`` are written once by the thread that
finishes the run, before the end is queued. No lock of the stream is held while the run's lock
is taken by a call that may run user code (``cancel``, ``expire``, an inline drain) but the
consumer's own, and the run never takes a stream lock.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from queue import Empty, SimpleQueue
from typing import Any

from taskflow import clock
from taskflow.engine import closing, events, inline, remote, timer
from taskflow.engine.run import Run
from taskflow.engine.states import INLINE
from taskflow.errors import StreamNotFinishedError
from taskflow.model.context import current
from taskflow.model.result import FlowResult, WorkResult

__all__ = ["FlowStream", "open_stream"]

_END = -1  # queued by the channel when the run has ended


class _Channel(events.RunObserver):
    """The streamed run's observer: queues each settled node, then the end."""

    per_node = True

    def __init__(self) -> None:
        self.queue: SimpleQueue[int] = SimpleQueue()
        self.result: FlowResult | None = None
        self.ended = threading.Event()

    def node_settled(self, i: int) -> None:
        self.queue.put(i)

    def run_ended(self, result: FlowResult) -> None:
        self.result = result
        self.ended.set()
        self.queue.put(_END)


def _abandon(run: Run) -> None:
    """The stream was dropped unfinished: cancel its run, on a coordinator thread (a finalizer
    may run on any thread, even one that holds some run's lock)."""
    if not run.finished:
        remote.coordinator.put(run.cv, run.cancel,
                               ("the stream was dropped before it ended",))


def open_stream(run: Run) -> FlowStream:
    """Give a built run (``TaskScheduling.stream``'s) its channel, begin it and return its
    stream. Nothing of the run has started before this call."""
    channel = _Channel()
    run.observers = (*run.observers, channel)
    run.node_observers = (*run.node_observers, channel)
    run.quiet = False  # a node observer: the run takes the general path of ``Run.complete``
    stream = FlowStream(run, channel)
    if run.mode is INLINE and not math.isinf(run.budget):
        # a nested stream's node runs on the consumer's thread: the timer closes the run at
        # its deadline (``ctx.cancelled`` turns true in that node) and hands the rest to the
        # consumer's next ``next()``; cancelled when the run finishes
        run.run_timer = timer.schedule(run.deadline, closing.expire_on_timer, run)
    run.begin()
    return stream


class FlowStream:
    """The nodes of a run as they settle: an iterator of ``(name, WorkResult)``.

    Made by [`TaskScheduling.stream`][taskflow.scheduling.TaskScheduling.stream]. Each node of
    the run comes out exactly once, in the order the nodes settle (a node whose fathers failed,
    or that a switch did not choose, comes out when that is decided). The iteration ends when
    the run ends: every node settled, the budget spent (the nodes still unfinished then come out
    last, TIMEOUT) or the run cancelled (they come out CANCELLED). A node's item may come out
    while its ``on_success``/``on_fail`` hook still runs; its ``WorkResult`` is final.

    ``next()`` blocks until the next node settles, never past the run's deadline: there it
    closes the run and the unfinished nodes' ``on_fail`` hooks run in the calling thread (as in
    ``start``; when the deadline comes between two calls, the timer closes the run and they
    run on a ``taskflow-coordinator`` thread), then the rest comes out at once. In a nested stream (opened by a node running
    on the same executor) the nodes run on the thread that calls ``next()``.

    ``close()`` (or leaving a ``with`` block, or an exception raised in one) cancels the run:
    its unfinished nodes end CANCELLED, queued work is cancelled and running work abandoned
    (``ctx.cancelled`` turns true, ``ctx.on_cancel`` callbacks run); it waits for the run's
    result (at most until the deadline, but for a node that called ``ctx.cancel``, which the
    run waits for as ``start`` does) and is idempotent. A stream dropped before it ended is
    cancelled the same way, from a ``taskflow-coordinator`` thread, once it is garbage.

    Thread-safe: several threads may take items (each node still comes out once) and any thread
    may close it.
    """

    __slots__ = ("__weakref__", "_channel", "_closing", "_done", "_emitted", "_finalizer",
                 "_lock", "_run", "_state", "_tail")

    def __init__(self, run: Run, channel: _Channel) -> None:
        self._run = run
        self._channel = channel
        self._emitted = bytearray(len(run.names))
        self._tail: deque[int] | None = None  # the nodes left to hand out once the run ended
        self._done = False
        self._closing = False
        self._lock = threading.Lock()  # serialises consumers; guards _emitted, _tail, _done
        self._state = threading.Lock()  # guards _closing
        self._finalizer = weakref.finalize(self, _abandon, run)
        self._finalizer.atexit = False  # at exit, a run left open just dies with the process

    # -- the iterator ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[str, WorkResult[Any]]]:
        return self

    def __next__(self) -> tuple[str, WorkResult[Any]]:
        with self._lock:
            i = self._next_node()
        if i < 0:
            raise StopIteration
        run = self._run
        return run.names[i], run.results[i]

    def _next_node(self) -> int:
        """Under ``_lock``: the next node to hand out, or -1 when the stream has ended."""
        if self._done:
            return -1
        emitted = self._emitted
        while True:
            tail = self._tail
            if tail is not None:
                while tail:
                    i = tail.popleft()
                    if not emitted[i]:
                        emitted[i] = 1
                        return i
                self._done = True
                self._finalizer.detach()
                return -1
            i = self._take()
            if i == _END:
                self._tail = deque(j for j in range(len(emitted)) if not emitted[j])
            elif not emitted[i]:
                emitted[i] = 1
                return i

    def _take(self) -> int:
        """Under ``_lock``: the channel's next item, waiting at most until the run's deadline
        (then the run is closed here and the end follows at once)."""
        run = self._run
        queue = self._channel.queue
        if run.mode is INLINE:
            return self._take_inline()
        if math.isinf(run.deadline) or run.expired or run.finished:
            return queue.get()  # no deadline, or it has closed the run: the end follows
        left = run.deadline - clock.now()
        try:
            if left <= 0:
                raise Empty
            return clock.get(queue, min(left, threading.TIMEOUT_MAX))
        except Empty:
            closing.expire(run)  # the end is queued by now, or by the thread finishing the run
            return queue.get()

    def _take_inline(self) -> int:
        """``_take`` for a nested stream: run the ready nodes here until one settles, doing
        the work handed to the owner (this thread) as ``start``'s wait does."""
        run = self._run
        queue = self._channel.queue
        inbox = run.inbox
        assert inbox is not None
        while True:
            try:
                return queue.get_nowait()
            except Empty:
                pass
            inline.drain(run)
            try:
                return queue.get_nowait()
            except Empty:
                pass
            if run.finished:
                return queue.get()  # the end is on its way
            # once the deadline closed the run, what is left of it follows promptly
            left = math.inf if run.expired else run.deadline - clock.now()
            try:
                if left <= 0:
                    raise Empty
                item = clock.get(inbox, None if math.isinf(left)
                                 else min(left, threading.TIMEOUT_MAX))
            except Empty:
                closing.expire(run)
                continue
            if item is not None:
                fn, args = item
                fn(*args)

    # -- the end ----------------------------------------------------------------------------------

    @property
    def result(self) -> FlowResult:
        """The run's FlowResult, once the stream has ended (iterated to its end or closed).

        Raises:
            StreamNotFinishedError: the stream has not ended yet (this never blocks).
        """
        result = self._channel.result
        if result is None or not (self._done or self._closing):
            raise StreamNotFinishedError(self._run.flow_id)
        return result

    @property
    def flow_id(self) -> str:
        """The run's flow id (as in its logs and its FlowResult)."""
        return self._run.flow_id

    def done(self) -> bool:
        """Whether every item has been handed out (or the stream closed)."""
        return self._done

    def close(self) -> None:
        """Cancel the run if it has not ended, and wait for its result (see the class
        docstring); items not taken yet are dropped. Idempotent, from any thread.

        Called from inside one of the run's own nodes, it cancels the run without waiting (the
        run waits for that node)."""
        with self._state:
            if self._closing:
                return
            self._closing = True
        run = self._run
        if not run.finished:
            run.cancel("the stream was closed")
        if current.__dict__.get("run") is run:
            self._finalizer.detach()
            return
        with self._lock:
            while self._next_node() >= 0:
                pass

    def __enter__(self) -> FlowStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        run = self._run
        phase = "ended" if self._done else "closed" if self._closing else "open"
        return (f"<FlowStream {run.flow_id} {phase} flow={run.flow_name!r} "
                f"handed_out={sum(self._emitted)}/{len(self._emitted)}>")
