"""Executors that run tasks in other processes (process pools, loky, dask).

Only a node's task can travel: each attempt is its own submission of ``remote_call`` with the node,
its param, a snapshot of the context, the fathers' results and the time left. Its future's
done-callback only hands the outcome to the run's coordinator (``start``'s caller, or the shared
``taskflow-coordinator`` thread for ``submit``), which settles it like any outcome, so hooks and
bookkeeping stay in this process.

In the worker (``remote_call``, ``remote_work``) a result and an exception are round-tripped
through pickle before they are returned: a value that pickles but does not unpickle, or an
exception whose ``__init__`` takes two arguments, would otherwise break the pool for every later
run. A result that cannot travel fails its node with a ``TypeError`` naming it; an exception that
cannot travel is replaced by :class:`~taskflow.errors.RemoteTaskError` carrying its type name,
message and traceback text.

The coordinator thread is process-wide, started on first use, and started afresh in a forked child.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable
from contextvars import Context
from queue import Empty, SimpleQueue
from typing import Any

from loguru import logger

from taskflow.context import TaskContext, attach_view
from taskflow.errors import RemoteTaskError, ResultNotAvailableError

__all__ = [
    "Coordinator",
    "RemoteRunView",
    "coordinator",
    "preflight_pickle",
    "remote_call",
    "remote_work",
]

_FIELDS = ("node", "param", "context", "fathers' results")


def preflight_pickle(pickler: Any, executor_name: str, name: str,
                     args: tuple[Any, ...]) -> BaseException | None:
    """A TypeError naming the node and the field of ``args`` that cannot travel, or None."""
    # the param first: it also rides inside the node, and the message should name it
    checks = sorted(zip(_FIELDS, args), key=lambda fv: fv[0] != "param")
    for field, value in checks:
        try:
            pickler.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling raises many types
            err = TypeError(
                f"node {name!r}: its {field} cannot be pickled to run on {executor_name}: {exc}"
            )
            err.__cause__ = exc
            return err
    return None


class Coordinator:
    """The threads, ``taskflow-coordinator``, that do the work handed over by runs started with
    ``submit`` (their callers do not wait): remote outcomes, refused loops, hooks and closing after
    a timeout. One thread when idle; when every thread is busy (a slow hook of one run) and work
    is waiting, another starts, so one run's hook never holds up another run's deadline. Threads
    above one exit after ``KEEP_ALIVE`` seconds without work. Started afresh in a forked child.
    """

    KEEP_ALIVE = 1.0
    MAX_THREADS = 64

    def __init__(self) -> None:
        self.queue: SimpleQueue[tuple[Context, Callable[..., Any], tuple[Any, ...]]] = (
            SimpleQueue())
        self.lock = threading.Lock()  # guards threads, idle, waiting
        self.threads = 0
        self.idle = 0  # threads waiting for work
        self.waiting = 0  # items put and not taken yet
        self.seq = 0

    def put(self, cv: Context, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``fn(*args)`` on a coordinator thread, in a copy of ``cv``."""
        with self.lock:
            self.waiting += 1
            start = self.waiting > self.idle and self.threads < self.MAX_THREADS
            if start:
                self.threads += 1
                self.seq += 1
                name = "taskflow-coordinator"
        self.queue.put((cv, fn, args))
        if start:
            threading.Thread(target=self.serve, args=(self.queue,), name=name,
                             daemon=True).start()

    def serve(self, queue: SimpleQueue[tuple[Context, Callable[..., Any], tuple[Any, ...]]]
              ) -> None:
        """A coordinator thread's loop."""
        while True:
            with self.lock:
                self.idle += 1
            try:
                cv, fn, args = queue.get(timeout=self.KEEP_ALIVE)
            except Empty:
                with self.lock:
                    self.idle -= 1
                    if self.threads > 1 and queue is self.queue:
                        self.threads -= 1
                        return
                continue
            with self.lock:
                self.idle -= 1
                self.waiting -= 1
            try:
                cv.copy().run(fn, *args)
            except BaseException:  # noqa: BLE001 - one run's bug must not stop the others
                logger.opt(exception=True).error("taskflow coordinator callback {!r} failed", fn)
            del cv, fn, args

    def after_fork_in_child(self) -> None:
        """A forked child has no coordinator thread: start afresh with an empty queue."""
        self.queue = SimpleQueue()
        self.lock = threading.Lock()
        self.threads = 0
        self.idle = 0
        self.waiting = 0


coordinator = Coordinator()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=coordinator.after_fork_in_child)


class RemoteRunView:
    """What a TaskContext sees of its run inside another process: a snapshot."""

    def __init__(self, flow_id: str, remaining: float, fathers: dict[str, Any], name: str) -> None:
        self.flow_id = flow_id
        self.deadline = time.monotonic() + remaining
        self.fathers = fathers
        self.name = name
        self.cancel_reason: str | None = None
        self.finished = False

    def cancelled_for_caller(self) -> bool:
        return time.monotonic() >= self.deadline

    def caller_name(self) -> str:
        return self.name

    def value_of(self, name: str) -> Any:
        try:
            return self.fathers[name]
        except KeyError:
            raise ResultNotAvailableError(
                name, "not available in another process (only the fathers' results travel)"
            ) from None

    def cancel(self, reason: str | None) -> None:
        logger.warning("ctx.cancel() in another process has no effect (flow {})", self.flow_id)


def _round_trip(value: Any) -> None:
    """Raise if ``value`` does not survive pickling (the way back to the caller's process)."""
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:  # noqa: BLE001 - maybe only cloudpickle can carry it (loky, dask)
        import cloudpickle  # type: ignore[import-untyped]

        pickle.loads(cloudpickle.dumps(value))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it can travel back, else a RemoteTaskError standing in for it."""
    with contextlib.suppress(Exception):  # any failure to travel: a stand-in
        _round_trip(exc)
        return exc
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises
        message = "<unprintable>"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kind = type(exc)
    return RemoteTaskError(f"{kind.__module__}.{kind.__qualname__}", message, tb)


def _portable_value(name: str, value: Any) -> Any:
    try:
        _round_trip(value)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            f"node {name!r}: its result ({type(value).__name__}) cannot be pickled to return "
            f"it: {exc!r}"
        ) from None
    return value


def _call(name: str, fn: Callable[[TaskContext, Any], Any], ctx: TaskContext, arg: Any) -> Any:
    try:
        value = fn(ctx, arg)
    except Exception as exc:
        portable = _portable(exc)
        if portable is exc:
            raise
        raise portable from None
    return _portable_value(name, value)


def remote_call(node: Any, param: Any, entries: dict[str, Any], fathers: dict[str, Any],
                remaining: float, flow_id: str) -> Any:
    """Runs in the executor's process: the task on a snapshot of the context."""
    ctx = TaskContext(entries)
    view = RemoteRunView(flow_id, remaining, fathers, node.name)
    attach_view(ctx, view)
    return _call(node.name, node.task, ctx, param)


def remote_work(blob: bytes, item: Any, entries: dict[str, Any], fathers: dict[str, Any],
                remaining: float, flow_id: str) -> Any:
    """Runs in the executor's process: one fan-out item (the node arrives pickled once, as
    ``blob``, without its param)."""
    node = pickle.loads(blob)
    ctx = TaskContext(entries)
    view = RemoteRunView(flow_id, remaining, fathers, node.name)
    attach_view(ctx, view)
    return _call(node.name, node.work, ctx, item)
