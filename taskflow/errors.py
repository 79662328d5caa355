"""The exception hierarchy: one root, each subclass also a builtin so plain ``except`` works."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import CancelledError

__all__ = [
    "CycleError",
    "DuplicateNameError",
    "FlowDefinitionError",
    "FlowFailedError",
    "FlowTimeoutError",
    "InvalidNodeError",
    "NodeCancelledError",
    "NodeTimeoutError",
    "RejectedExecutionError",
    "ResultNotAvailableError",
    "TaskflowError",
    "UpstreamFailedError",
    "traceback_text",
]


class TaskflowError(Exception):
    """Root of every error taskflow raises itself."""


class FlowDefinitionError(TaskflowError, ValueError):
    """The graph or an option is invalid; raised before anything runs."""


class InvalidNodeError(FlowDefinitionError, TypeError):
    """Something given as a node is not a ``SchedulingNode`` instance (also a TypeError)."""


class CycleError(FlowDefinitionError):
    """The graph has a cycle; ``cycle`` lists the node names along it, first repeated last."""

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        super().__init__("cycle between nodes " + " -> ".join(repr(n) for n in self.cycle))


class DuplicateNameError(FlowDefinitionError):
    """Two distinct nodes of one flow share a name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"two different nodes are named {name!r}; names must be unique in a flow")


class FlowTimeoutError(TaskflowError, TimeoutError):
    """The run's budget passed before these nodes finished."""

    def __init__(self, unfinished: Iterable[str], timeout: float | None = None) -> None:
        self.unfinished = sorted(unfinished)
        self.timeout = timeout
        budget = f" of {timeout:g}s" if timeout is not None else ""
        super().__init__(
            f"flow budget{budget} exceeded; {len(self.unfinished)} node(s) timed out: "
            + ", ".join(repr(n) for n in self.unfinished)
        )


class FlowFailedError(TaskflowError, RuntimeError):
    """Raised by ``FlowResult.raise_for_failure`` when failures are not a single original error."""

    def __init__(self, failed: Iterable[str]) -> None:
        self.failed = sorted(failed)
        super().__init__("flow failed in node(s) " + ", ".join(repr(n) for n in self.failed))


class NodeTimeoutError(TaskflowError, TimeoutError):
    """A node's own ``timeout`` or the run's budget passed while the node was unfinished."""

    def __init__(self, node: str, timeout: float | None, *, budget: bool = False) -> None:
        self.node = node
        self.timeout = timeout
        what = "flow budget" if budget else "node timeout"
        limit = f" of {timeout:g}s" if timeout is not None else ""
        super().__init__(f"{what}{limit} passed before node {node!r} finished")


class NodeCancelledError(TaskflowError, CancelledError):
    """The node was cancelled: ``ctx.cancel``, a join that no longer needed it, or shutdown."""

    def __init__(self, node: str, reason: str | None = None) -> None:
        self.node = node
        self.reason = reason
        super().__init__(f"node {node!r} cancelled" + (f": {reason}" if reason else ""))


class UpstreamFailedError(TaskflowError, RuntimeError):
    """A node failed fast without running because a father it needed failed.

    The father's exception is chained as ``__cause__``.
    """

    def __init__(self, node: str, father: str) -> None:
        self.node = node
        self.father = father
        super().__init__(f"node {node!r} not run: father {father!r} failed")


class RejectedExecutionError(TaskflowError, RuntimeError):
    """An executor refused a task (saturated or shut down)."""


class ResultNotAvailableError(TaskflowError, LookupError):
    """``ctx.result_of(name)`` for a node that has not finished with SUCCESS."""

    def __init__(self, name: str, state: str) -> None:
        self.name = name
        self.state = state
        super().__init__(f"no result for node {name!r}: it is {state}")


class RemoteTaskError(TaskflowError, RuntimeError):
    """Stands in for an exception raised in another process that could not travel back
    (it does not pickle, or does not unpickle: e.g. an ``__init__`` with two required arguments).

    Attributes:
        type_name: the qualified name of the original exception's type.
        message: ``str()`` of the original exception.
        traceback_text: the original traceback, formatted in the worker.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (RemoteTaskError, (self.type_name, self.message, self.traceback_text))


def traceback_text(exc: BaseException) -> str:
    """``exc`` with its traceback, as text: how taskflow logs an error raised in user code (a
    hook, a callback).

    Not as the log record's exception (``logger.opt(exception=True)``): a loguru sink with
    ``diagnose=True`` (loguru's default) prints the values of the variables on every line of a
    record's traceback, and user frames hold context entries and tokens. Text keeps the
    traceback's lines and messages only. Errors in taskflow's own code keep full records.
    """
    return "".join(traceback.format_exception(exc))
