"""``TaskContext`` — the task bus shared by the nodes of one run — and ``TaskSupport`` for hooks."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from taskflow.errors import NodeCancelledError, ResultNotAvailableError
from taskflow.result import WorkResult

if TYPE_CHECKING:
    from taskflow.engine import RunView as _RunView
    from taskflow.engine import _Run
    from taskflow.node import SchedulingNode

__all__ = ["TaskContext", "TaskSupport", "current"]

# The engine sets ``current.run``/``current.idx`` around each task and hook call on the thread
# running it, so ``ctx.cancelled`` can also answer for the node that asks.
current = threading.local()


class TaskContext(MutableMapping[str, Any]):
    """A thread-safe mutable mapping shared by every node of one run.

    One context belongs to one run at a time. Beyond the mapping it tells a task about its run:
    ``flow_id``, ``remaining()``, ``cancelled``, ``cancel()``, ``result_of()``.

    On executors that run tasks in other processes, a task gets a picklable snapshot: its
    writes are not seen by other nodes, so results travel as return values.
    """

    __slots__ = ("__weakref__", "_data", "_lock", "_run")

    def __init__(self, initial: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._lock = threading.Lock()  # guards _data for compound operations
        self._data: dict[str, Any] = dict(initial or {}, **kwargs)
        self._run: _RunView | None = None

    # -- the mapping -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value

    def __delitem__(self, key: str) -> None:
        with self._lock:
            del self._data[key]

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._data.setdefault(key, default)

    def incr(self, key: str, n: int = 1) -> int:
        """Atomically add ``n`` to ``self[key]`` (missing counts as 0) and return the new value."""
        with self._lock:
            value: int = self._data.get(key, 0) + n
            self._data[key] = value
            return value

    def snapshot(self) -> dict[str, Any]:
        """A shallow copy of the entries (what travels to other processes)."""
        with self._lock:
            return dict(self._data)

    # -- the run -----------------------------------------------------------------------------
    @property
    def flow_id(self) -> str | None:
        """The id of the run using this context (None outside a run)."""
        run = self._run
        return run.flow_id if run is not None else None

    def remaining(self) -> float:
        """Seconds left of the run's budget: never negative, ``inf`` with no budget."""
        run = self._run
        if run is None:
            return math.inf
        left = run.deadline - time.monotonic()
        return max(0.0, left)

    @property
    def cancelled(self) -> bool:
        """True once the run timed out or was cancelled, or the asking node was cancelled
        (a join no longer needs it, or its own timeout passed). Long tasks poll it."""
        run = self._run
        return run is not None and run.cancelled_for_caller()

    def raise_if_cancelled(self) -> None:
        """Raise ``NodeCancelledError`` naming the asking node if :attr:`cancelled` is True."""
        run = self._run
        if run is not None and run.cancelled_for_caller():
            raise NodeCancelledError(run.caller_name(), run.cancel_reason)

    def cancel(self, reason: str | None = None) -> None:
        """End the run early: unfinished nodes become CANCELLED and ``start`` returns.

        A node that calls this and returns keeps its own result. Safe from any thread. In
        another process (process pools, dask) it has no effect: return a value instead.
        """
        run = self._run
        if run is not None:
            run.cancel(reason)

    def result_of(self, name: str) -> Any:
        """The value of node ``name`` if it finished with SUCCESS.

        In another process only the fathers' results are available.

        Raises:
            KeyError: no node of that name in the run.
            ResultNotAvailableError: the node has not (or not successfully) finished.
        """
        run = self._run
        if run is None:
            raise ResultNotAvailableError(name, "not part of a running flow")
        return run.value_of(name)

    def __repr__(self) -> str:
        return f"<TaskContext flow={self.flow_id} keys={sorted(self._data)!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TaskContext, (self.snapshot(),))


class TaskSupport:
    """What a hook is given.

    Attributes:
        node: this run's node.
        work_result: its WorkResult.
        context: the run's TaskContext.
        attempt: the attempt number (1-based) the hook is about.
    """

    __slots__ = ("_idx", "_run", "attempt", "context", "node", "work_result")

    def __init__(self, run: _Run, idx: int, attempt: int) -> None:
        self._run = run
        self._idx = idx
        self.node: SchedulingNode[Any, Any] = run.node(idx)
        self.work_result: WorkResult[Any] = run.results[idx]
        self.context: TaskContext = run.ctx
        self.attempt = attempt

    @property
    def fathers(self) -> dict[str, WorkResult[Any]]:
        """father name -> its WorkResult in this run."""
        run = self._run
        names = run.plan.names
        return {names[f]: run.results[f] for f in run.plan.fathers[self._idx]}

    def __repr__(self) -> str:
        return f"<TaskSupport {self.node!r} attempt={self.attempt}>"
