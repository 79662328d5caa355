"""What the engine needs to know about an executor, and the only code that looks inside one.

An executor may declare its capabilities itself with a ``taskflow_capabilities()`` method
returning ``Capabilities`` (the explicit protocol). Otherwise they are read from what is
known: a wrapper's public ``executor`` attribute (``MonitoredExecutor``), a pool's public
``max_size`` (``taskflow.ThreadPool``), ``ThreadPoolExecutor``'s worker count, and the executors
that run tasks in other processes (``ProcessPoolExecutor`` and subclasses such as loky's, dask's
``ClientExecutor``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from taskflow import clock
from taskflow.errors import FlowDefinitionError, InvalidArgumentValueError
from taskflow.logs import logger

if TYPE_CHECKING:
    from taskflow.model.graph import Plan

__all__ = [
    "Capabilities",
    "DeclaresCapabilities",
    "backlog",
    "capabilities",
    "check_executor",
    "mark_abandoned",
    "pickler",
    "queues",
    "refusal",
    "runs_on",
    "same_executor",
    "unwrap",
]


class Capabilities(NamedTuple):
    """What a run may assume about its executor.

    Attributes:
        parallelism: how many tasks it runs at once (how many worker loops a run keeps on it).
        remote: tasks run in other processes: only a task and its arguments travel there, so each
            attempt is its own submission and hooks stay in this process.
        cloudpickle: the executor pickles with cloudpickle (loky, dask) rather than pickle.
    """

    parallelism: int
    remote: bool
    cloudpickle: bool = False


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """An executor that states its own capabilities."""

    def taskflow_capabilities(self) -> Capabilities: ...


def _default_parallelism() -> int:
    return min(32, (os.cpu_count() or 1) + 4)


def unwrap(executor: Executor) -> Executor:
    """The executor a wrapper runs on: its public ``executor`` (``MonitoredExecutor``) or
    ``inner`` attribute, when that is an Executor; followed through nested wrappers."""
    for _ in range(16):
        for attr in ("executor", "inner"):
            inner = getattr(executor, attr, None)
            if isinstance(inner, Executor) and inner is not executor:
                executor = inner
                break
        else:
            return executor
    return executor


def same_executor(a: Executor, b: Executor) -> bool:
    """Whether ``a`` and ``b`` submit to the same pool (wrappers compared by what they wrap)."""
    return a is b or unwrap(a) is unwrap(b)


def runs_on(executor: Executor) -> bool:
    """Whether the calling thread is one of ``executor``'s own worker threads (a stdlib
    ``ThreadPoolExecutor`` or a ``taskflow.ThreadPool``, through wrappers): a blocking ``start``
    there would wait for a worker it holds itself."""
    inner = executor if type(executor) is ThreadPoolExecutor else unwrap(executor)
    threads = getattr(inner, "_threads", None)
    if threads is None:
        return False
    me = threading.current_thread()
    if me in threads:
        return True
    # the stdlib pool adds a thread to _threads after starting it, so the thread's first task
    # can run before; until its target returns, a Thread keeps its args: the pool's queue
    args = getattr(me, "_args", None)
    queue = getattr(inner, "_work_queue", None)
    return (queue is not None and type(args) is tuple and len(args) > 1
            and args[1] is queue)


def queues(executor: Executor, remote: bool) -> bool:
    """Whether ``executor`` never runs a task in the thread that submits it (a stdlib
    ``ThreadPoolExecutor``, a ``taskflow.ThreadPool`` whose rejection policy is not
    ``CALLER_RUNS``, through wrappers; another process's executor, ``remote``). False for
    any other executor: it may run the task before ``submit`` returns (an inline executor)."""
    if remote or type(executor) is ThreadPoolExecutor:
        return True
    inner = unwrap(executor)
    if type(inner) is ThreadPoolExecutor:
        return True
    rejection = getattr(inner, "rejection", None)
    return (rejection is not None and type(inner).__module__ == "taskflow.pools.threadpool"
            and rejection != "caller_runs")


def _module_of(executor: Executor) -> str:
    return type(executor).__module__


def _is_process_pool(executor: Executor) -> bool:
    """Whether ``executor`` is a ``ProcessPoolExecutor``, without importing its module (and
    ``multiprocessing``) at ``import taskflow``: no instance exists before it is imported."""
    module = sys.modules.get("concurrent.futures.process")
    return module is not None and isinstance(executor, module.ProcessPoolExecutor)


# a ThreadPoolExecutor's capabilities by its size (a few sizes per process; read without a lock:
# two threads making the same entry make equal tuples)
_POOL_CAPS: dict[int, Capabilities] = {}


def capabilities(executor: Executor) -> Capabilities:
    """The capabilities of ``executor`` (see the module docstring)."""
    kind = type(executor)
    if kind is ThreadPoolExecutor:  # the common case, first (one tuple per pool size)
        size = executor._max_workers  # type: ignore[attr-defined]
        known = _POOL_CAPS.get(size)
        if known is None:
            known = _POOL_CAPS[size] = Capabilities(size, False)
        return known
    declared = getattr(kind, "taskflow_capabilities", None)
    if declared is not None:  # DeclaresCapabilities (an isinstance check would be slower)
        caps: Capabilities = declared(executor)
        return caps
    inner = unwrap(executor)
    mod = _module_of(inner)
    if _is_process_pool(inner) or mod.startswith(("distributed", "loky")):
        return Capabilities(1 << 30, True, mod.startswith(("distributed", "loky")))
    n: Any = getattr(executor, "max_size", None)
    if not isinstance(n, int):
        n = getattr(inner, "max_size", None)
    if not isinstance(n, int) and isinstance(inner, ThreadPoolExecutor):
        n = inner._max_workers
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return Capabilities(n, False)
    return Capabilities(_default_parallelism(), False)


def refusal(executor: Executor) -> str | None:
    """Why ``executor`` would refuse every task, said before a run submits any, or None.

    Read from what executors expose, through wrappers (see ``unwrap``): a public
    ``is_shutdown()`` (``taskflow.ThreadPool``), the stdlib pools' ``_shutdown`` /
    ``_shutdown_thread``, loky's ``_flags.shutdown``, dask's ``ClientExecutor._shutdown``, and
    the interpreter's own shutdown for thread pools. An executor shut down after this check
    still fails the nodes it refuses (never a hang); a broken pool is left to do the same.
    """
    if type(executor) is ThreadPoolExecutor:  # the common case: what the loop below reads of it
        if executor._broken:
            return None
        if executor._shutdown:
            return "executor ThreadPoolExecutor is shut down"
        thread_module = sys.modules.get("concurrent.futures.thread")
        if getattr(thread_module, "_shutdown", False) is True:
            return "executor ThreadPoolExecutor is shut down: the interpreter is exiting"
        return None
    outer = type(executor).__name__
    for _ in range(16):
        why = _refusal_of(executor)
        if why is not None:
            name = type(executor).__name__
            return f"executor {outer}{'' if name == outer else f' (its {name})'} {why}"
        inner = next((i for i in (getattr(executor, "executor", None),
                                  getattr(executor, "inner", None))
                      if isinstance(i, Executor) and i is not executor), None)
        if inner is None:
            return None
        executor = inner
    return None


def _refusal_of(executor: Executor) -> str | None:
    """``refusal`` for one executor, not looking through wrappers."""
    if getattr(executor, "_broken", False):  # a broken stdlib pool also flags itself shut down
        return None
    probe = getattr(executor, "is_shutdown", None)
    if callable(probe) and probe() is True:
        return "is shut down"
    if getattr(executor, "_shutdown", False) is True or (
            getattr(executor, "_shutdown_thread", False) is True) or (
            getattr(getattr(executor, "_flags", None), "shutdown", False) is True):
        return "is shut down"
    if isinstance(executor, ThreadPoolExecutor):
        thread_module = sys.modules.get("concurrent.futures.thread")
        if getattr(thread_module, "_shutdown", False) is True:
            return "is shut down: the interpreter is exiting"
    return None


def backlog(executor: Executor) -> Callable[[], int] | None:
    """A cheap probe of how many tasks wait in ``executor``'s queue, or None when that is not
    known (the engine then assumes none are waiting). Known: ``ThreadPoolExecutor`` and its
    subclasses, also behind a wrapper (``unwrap``): the size of its work queue."""
    inner = executor if type(executor) is ThreadPoolExecutor else unwrap(executor)
    if isinstance(inner, ThreadPoolExecutor):
        qsize = getattr(getattr(inner, "_work_queue", None), "qsize", None)
        if callable(qsize):
            probe: Callable[[], int] = qsize
            return probe
    return None


def pickler(caps: Capabilities) -> Any:
    """The module that pickles like the executor does (``pickle`` or ``cloudpickle``)."""
    if caps.cloudpickle:
        try:
            import cloudpickle  # type: ignore[import-untyped]

            return cloudpickle
        except ImportError:  # pragma: no cover - loky and dask ship it
            pass
    import pickle

    return pickle


def mark_abandoned(executor: Executor, futures: list[Future[Any]]) -> None:
    """Tell an executor that reports abandoned work (``mark_abandoned``) about ``futures``."""
    mark = getattr(executor, "mark_abandoned", None)
    if mark is None or not futures:
        return
    for f in futures:
        try:
            mark(f)
        except Exception:  # noqa: BLE001 - metrics must not break a run
            logger.opt(exception=True).warning("mark_abandoned failed")


def check_executor(plan: Plan, remote: bool, executor_name: str) -> None:
    """Before a run starts: hedging, batching and detached nodes need the run's own threads
    (duplicates are cancelled through ``ctx.cancelled``; a batch's call runs in this process; a
    detached node's hooks, timeout and slot stay in this process after the run returned), so a
    hedged, batched or detached node cannot run on a remote executor."""
    if not remote:
        return
    fake = clock.installed()
    if fake is not None:
        raise InvalidArgumentValueError(
            f"{executor_name} runs tasks in other processes, which never see virtual time: "
            f"a process executor cannot run under {fake!r}; use a thread pool or a "
            "ManualExecutor in this test, or leave the fake clock first", argument="executor")
    for pol in plan.policy:
        if pol is not None and (pol.hedge is not None or pol.batch is not None or pol.detach):
            what = ("hedge" if pol.hedge is not None else "batch" if pol.batch is not None
                    else "detach")
            raise FlowDefinitionError(
                f"node {pol.name!r}: {what} is not supported on {executor_name} (a process "
                f"executor); run the node on a thread pool, or drop {what}"
            )
