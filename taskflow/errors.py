"""The exception hierarchy: one root, each subclass also a builtin so plain ``except`` works."""

from __future__ import annotations

import math
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import CancelledError
from concurrent.futures.thread import BrokenThreadPool

__all__ = [
    "BatchCallError",
    "BatchKeyError",
    "BatchResultError",
    "BrokenPoolError",
    "BudgetExhaustedError",
    "DeadlineWarning",
    "BulkheadFullError",
    "CircuitOpenError",
    "CycleError",
    "DetachedRefusedError",
    "DuplicateNameError",
    "FallbackError",
    "FlowDefinitionError",
    "FlowFailedError",
    "FlowTimeoutError",
    "ArgumentError",
    "InvalidArgumentError",
    "InvalidArgumentValueError",
    "InvalidNodeError",
    "LoadShedError",
    "NodeCancelledError",
    "NodeTimeoutError",
    "RejectedExecutionError",
    "ResultNotAvailableError",
    "StreamNotFinishedError",
    "TaskflowError",
    "UnhashableKeyError",
    "UnknownNodeError",
    "UpstreamFailedError",
    "did_you_mean",
    "traceback_text",
]


class TaskflowError(Exception):
    """Root of every error taskflow raises itself."""


class DeadlineWarning(UserWarning):
    """A node's ``deadline`` (or its section's) is not before the run's budget: the budget
    ends the node first, so the deadline has no effect in that run (``start`` warns)."""


class FlowDefinitionError(TaskflowError, ValueError):
    """The graph or an option is invalid; raised before anything runs."""


class InvalidNodeError(FlowDefinitionError, TypeError):
    """Something given as a node is not a ``SchedulingNode`` instance, or a node option is of
    the wrong type or unknown (also a TypeError)."""


class ArgumentError(TaskflowError):
    """A bad argument of a call, raised before anything runs: the root of the two kinds below,
    each also the matching builtin (``InvalidArgumentError`` a ``TypeError``,
    ``InvalidArgumentValueError`` a ``ValueError``). ``argument`` names the argument (None when
    the raiser does not say)."""

    def __init__(self, message: str, *, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class InvalidArgumentError(ArgumentError, TypeError):
    """An argument of the wrong type: ``TaskScheduling.start`` (``stream``, ``submit``,
    ``run_async``) given an executor that is not an ``Executor``, a timeout that is not a number,
    a context that is not a ``TaskContext``; an object that shows runs or pools (such as the web
    app) given the wrong kind of thing, raised when that object is built; a function that reads
    one (such as ``budget_from_headers`` given something that is not a mapping of headers).
    Also a TypeError."""


class InvalidArgumentValueError(ArgumentError, FlowDefinitionError):
    """An argument of the right type with a value that cannot be used: a negative or NaN
    ``timeout``, an empty ``name``, an unknown ``priority`` of ``TaskScheduling.start`` (and
    ``stream``, ``submit``, ``run_async``). Also a ``ValueError``, and a
    ``FlowDefinitionError`` (what these raised before they had a class of their own)."""


class UnknownNodeError(TaskflowError, KeyError):
    """A node looked up by a name that no node of the run has (``ctx.result_of``,
    ``FlowResult.result_of``, ``result[name]``, ``result.detached``). ``name`` is the name asked
    for (also ``args[0]``, as a plain ``KeyError(name)`` has it), ``close`` the run's node name
    closest to it, if any is close; the message says "did you mean ...?" then."""

    def __init__(self, name: str, known: Iterable[str], message: str | None = None) -> None:
        super().__init__(name)
        self.name = name
        close = closest_name(name, known)
        self.close = close
        hint = f"; did you mean {close!r}?" if close is not None else ""
        self.message = (message or f"no node named {name!r} in this run") + hint

    def __str__(self) -> str:  # KeyError's own would print only the name's repr
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (_unknown_node, (self.name, self.close, self.message))


def _unknown_node(name: str, close: str | None, message: str) -> UnknownNodeError:
    err = UnknownNodeError(name, ())
    err.close = close
    err.message = message
    return err


def closest_name(name: object, known: Iterable[str]) -> str | None:
    """The name of ``known`` closest to ``name``, if one is close enough (difflib's ratio of at
    least 0.6), else None."""
    if not isinstance(name, str):
        return None
    import difflib  # only an error message needs it

    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``" (did you mean 'product'?)"`` when a name of ``known`` is close to ``name``, else
    ``""``: the hint an error about an unknown name ends with."""
    close = closest_name(name, known)
    return f" (did you mean {close!r}?)" if close is not None else ""


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
    """A node's own ``timeout``, its ``deadline`` (or its section's) or the run's budget passed
    while the node was unfinished."""

    def __init__(self, node: str, timeout: float | None, *, budget: bool = False,
                 deadline: bool = False, section: str | None = None) -> None:
        self.node = node
        self.timeout = timeout
        self.budget = budget  # the run's budget passed (not the node's own timeout)
        self.deadline = deadline  # ``timeout`` is a deadline from the run's start
        self.section = section  # the section whose deadline it was, if any
        limit = f" of {timeout:g}s" if timeout is not None else ""
        if deadline:
            where = f" (section {section!r})" if section is not None else ""
            super().__init__(f"deadline{limit} from the run's start{where} passed before node "
                             f"{node!r} finished")
            return
        what = "flow budget" if budget else "node timeout"
        super().__init__(f"{what}{limit} passed before node {node!r} finished")

    def __reduce__(self) -> tuple[object, ...]:
        return (_node_timeout, (self.node, self.timeout, self.budget, self.deadline,
                                self.section), dict(self.__dict__))


def _node_timeout(node: str, timeout: float | None, budget: bool, deadline: bool,
                  section: str | None) -> NodeTimeoutError:
    return NodeTimeoutError(node, timeout, budget=budget, deadline=deadline, section=section)


class BudgetExhaustedError(TaskflowError, TimeoutError):
    """``ctx.timeout()`` (or a clamped HTTP client) was asked for time when the asking attempt
    has none left: its node's own timeout or the run's budget has passed, or the attempt was
    abandoned (also a ``TimeoutError``)."""

    def __init__(self, node: str, flow_id: str | None, why: str) -> None:
        self.node = node
        self.flow_id = flow_id
        self.why = why
        where = f" of flow {flow_id}" if flow_id else ""
        super().__init__(f"no time left for node {node!r}{where}: {why}")


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


class BrokenPoolError(TaskflowError, BrokenThreadPool):
    """A ``ThreadPool`` whose thread initializer raised: it fails its queued tasks and refuses
    new ones (the stdlib's ``BrokenThreadPool``, so ``except BrokenExecutor`` catches it)."""

    def __init__(self, pool: str, cause: BaseException | None = None) -> None:
        self.pool = pool
        self.cause = cause
        why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        super().__init__(
            f"pool {pool!r} is broken: a thread initializer failed{why}; it runs no more tasks"
        )


class ResultNotAvailableError(TaskflowError, LookupError):
    """``ctx.result_of(name)`` for a node that has not finished with SUCCESS."""

    def __init__(self, name: str, state: str) -> None:
        self.name = name
        self.state = state
        super().__init__(f"no result for node {name!r}: it is {state}")


class StreamNotFinishedError(TaskflowError, RuntimeError):
    """``FlowStream.result`` read before the stream ended (it never blocks: iterate the
    stream to its end, or close it, first)."""

    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        super().__init__(f"the stream of flow {flow_id} has not ended: iterate it to the end "
                         "or close it before reading its result")


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
class BulkheadFullError(TaskflowError, RuntimeError):
    """A bulkhead refused a waiter: ``max_waiting`` callers were already waiting for a slot."""

    def __init__(self, bulkhead: str, max_concurrent: int, max_waiting: int) -> None:
        self.bulkhead = bulkhead
        self.max_concurrent = max_concurrent
        self.max_waiting = max_waiting
        super().__init__(
            f"bulkhead {bulkhead!r} is full: {max_concurrent} running and"
            f" {max_waiting} waiting"
        )


class LoadShedError(TaskflowError, RuntimeError):
    """A run was refused at ``start`` because its priority is shed at the current load.

    Nothing was submitted. ``priority`` is the run's (``"sheddable"`` or ``"normal"``; a
    ``"critical"`` run is never shed), ``resource`` what was saturated (``pool 'web'`` or
    ``bulkhead 'inventory'``), ``load`` its load (busy plus waiting, over its capacity) and
    ``threshold`` the load at which that priority is shed.
    """

    def __init__(self, flow: str, priority: str, resource: str, load: float,
                 threshold: float) -> None:
        self.flow = flow
        self.priority = priority
        self.resource = resource
        self.load = load
        self.threshold = threshold
        super().__init__(
            f"run {flow!r} (priority {priority!r}) shed: {resource} is at load {load:.2f} "
            f"(this priority is shed from {threshold:.2f}); nothing was submitted"
        )


class DetachedRefusedError(TaskflowError, RuntimeError):
    """A detached node (``detach=True``) was not started: every slot of the process's bound on
    detached work (``taskflow.set_max_detached``) was taken. The node ends EXCEPTION with it,
    its ``on_fail`` hook is told, and the refusal is counted
    (``taskflow.resilience.detached.metrics().refused``, ``PoolMonitor``, Prometheus).
    ``node`` names the node, ``limit`` is the bound it met.
    """

    def __init__(self, node: str, limit: int) -> None:
        self.node = node
        self.limit = limit
        super().__init__(
            f"detached node {node!r} refused: all {limit} detached slots are taken "
            "(taskflow.set_max_detached); it did not run")


class CircuitOpenError(TaskflowError, RuntimeError):
    """A circuit breaker refused a call without running it.

    ``retry_in`` is the number of seconds until the breaker lets a trial call through (0 when it
    is half-open and all its trial calls are taken; the next one frees when a trial finishes).
    """

    def __init__(self, breaker: str, state: str, retry_in: float) -> None:
        self.breaker = breaker
        self.state = state
        self.retry_in = retry_in
        if state == "half_open":
            detail = "half-open and its trial calls are taken"
        else:
            detail = f"open; next trial in {retry_in:.3g}s" if math.isfinite(retry_in) else "open"
        super().__init__(f"circuit breaker {breaker!r} is {detail}")


class UnhashableKeyError(TaskflowError, TypeError):
    """A single-flight key (a node's ``share_key`` result) cannot be hashed.

    ``owner`` names who gave it: ``node 'stock'`` or ``single flight 'shared'``.
    """

    def __init__(self, owner: str, key: object) -> None:
        self.owner = owner
        self.key = key
        super().__init__(
            f"{owner}: share key {key!r} is not hashable ({type(key).__name__});"
            " return a tuple of strings or numbers"
        )


class FallbackError(TaskflowError, RuntimeError):
    """A node's fallback raised while standing in for the node's own failure.

    ``error`` is the failure the fallback stood in for; ``fallback_error`` (also ``__cause__``)
    is what the fallback raised, and its ``__context__`` leads back to ``error``, so a traceback
    shows both.
    """

    def __init__(self, node: str, error: BaseException, fallback_error: BaseException) -> None:
        self.node = node
        self.error = error
        self.fallback_error = fallback_error
        super().__init__(
            f"node {node!r}: fallback raised {type(fallback_error).__name__}: {fallback_error}"
            f" while standing in for {type(error).__name__}: {error}"
        )


class BatchCallError(TaskflowError, RuntimeError):
    """A batch's call failed (its function raised, or it could not be run), so each of its
    members fails with one of these, naming the batch and the member's key; the call's own
    exception is the ``__cause__``."""

    def __init__(self, batch: str, key: object, error: BaseException) -> None:
        self.batch = batch
        self.key = key
        super().__init__(f"batch {batch!r}: the call for key {key!r} failed: "
                         f"{type(error).__name__}: {error}")
        self.__cause__ = error

    def __reduce__(self) -> tuple[object, ...]:
        return (BatchCallError, (self.batch, self.key, self.__cause__))


class BatchKeyError(TaskflowError, KeyError):
    """A batch's function answered without a value for one of the keys it was given."""

    def __init__(self, batch: str, key: object) -> None:
        self.batch = batch
        self.key = key
        super().__init__(key)
        self.message = f"batch {batch!r} returned no value for key {key!r}"

    def __str__(self) -> str:  # KeyError's own would print only the key's repr
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (BatchKeyError, (self.batch, self.key))


class BatchResultError(TaskflowError, TypeError):
    """A batch's function returned something other than a mapping of key to value;
    ``got_type`` names what it returned."""

    def __init__(self, batch: str, got_type: str) -> None:
        self.batch = batch
        self.got_type = got_type
        super().__init__(f"batch {batch!r}: its function returned {got_type}, not a mapping "
                         "of key -> value")

    def __reduce__(self) -> tuple[object, ...]:
        return (BatchResultError, (self.batch, self.got_type))


def returned_coroutine(owner: str, coro: object, what: str, fix: str) -> TypeError:
    """A plain def (``what`` of ``owner``: "its task" of "node 'x'") returned coroutine
    ``coro``, which nothing would ever await: close it (no "never awaited" warning follows) and
    return the ``TypeError`` to fail with, naming ``owner``, the coroutine's function and
    ``fix`` (``{fn}`` in it: that function's name). Not an exception class of its own: the
    mistake is the caller's type error, and ``except TypeError`` catches it."""
    fn = getattr(coro, "__name__", "fn")
    close = getattr(coro, "close", None)
    if close is not None:
        close()
    return TypeError(
        f"{owner}: {what} is a plain def that returned a coroutine of {fn}(), which taskflow "
        f"does not await (the coroutine was closed); {fix.format(fn=fn)}")
