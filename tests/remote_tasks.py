"""Picklable tasks and nodes shared by the executor conformance suite (and the web tests).

Process pools, loky and dask pickle the node (with its function) and run it in another process,
where it is imported *by reference*: everything here lives at module level of a module that a
spawned child can import (pytest puts ``tests/`` on ``sys.path``, and ``multiprocessing``, loky and
dask's nannies hand ``sys.path`` to their children). Test modules themselves are not used for
this: they may be imported under another name by pytest.

Every task takes ``(ctx, param)`` like ``FunctionNode`` expects, and talks back only through its
return value: in another process its writes to ``ctx`` are not seen by anyone.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from taskflow import FunctionNode, TaskSupport


def const(ctx: Any, value: Any) -> Any:
    """Return ``param``."""
    return value


def total(ctx: Any, fathers: tuple[str, ...]) -> int:
    """``ctx["offset"]`` plus the sum of the named fathers' results."""
    return int(ctx.get("offset", 0)) + sum(ctx.result_of(name) for name in fathers)


async def page(value: Any) -> Any:
    """An async call, for ``returns_coroutine``."""
    return value


def returns_coroutine(ctx: Any, value: Any) -> Any:
    """A plain def that returns the coroutine ``page(value)`` instead of awaiting it."""
    return page(value)


def fail(ctx: Any, message: str) -> None:
    """Raise ``ValueError(message)``."""
    raise ValueError(message)


def available(ctx: Any, fathers: tuple[str, ...]) -> list[str]:
    """The names among ``fathers`` whose result this node can read (the ones that succeeded)."""
    out = []
    for name in fathers:
        try:
            ctx.result_of(name)
        except LookupError:  # ResultNotAvailableError: failed, cancelled or not a father
            continue
        out.append(name)
    return out


def first_of(ctx: Any, fathers: tuple[str, ...]) -> Any:
    """The result of the first father in ``fathers`` that succeeded."""
    for name in fathers:
        try:
            return ctx.result_of(name)
        except LookupError:
            continue
    raise LookupError("no father succeeded")


def wait_for_cancel(ctx: Any, spec: tuple[float, float]) -> float:
    """Poll ``ctx.cancelled`` (a long task's duty) until it is set or ``cap`` seconds passed,
    then take ``grace`` seconds more to wind down. Returns how long it ran.

    In another process ``ctx.cancelled`` turns True at the run's deadline (the snapshot carries
    the remaining budget); in this process also when the node itself times out or is cancelled.
    """
    cap, grace = spec
    t0 = time.monotonic()
    while not ctx.cancelled and time.monotonic() - t0 < cap:
        time.sleep(0.005)
    time.sleep(grace)
    return time.monotonic() - t0


def note_time_to_cancel(ctx: Any, spec: tuple[float, str]) -> float:
    """``wait_for_cancel`` for at most ``cap`` seconds, then write how long it ran to ``path``
    (the result of a timed-out node is dropped: a file is how the test learns it)."""
    cap, path = spec
    ran = wait_for_cancel(ctx, (cap, 0.0))
    with open(path + ".tmp", "w") as f:
        f.write(repr(ran))
    os.replace(path + ".tmp", path)
    return ran


def sleep_for(ctx: Any, seconds: float) -> float:
    """Stand in for ``seconds`` of uninterruptible work."""
    time.sleep(seconds)
    return seconds


def fail_first_attempts(ctx: Any, spec: tuple[str, int]) -> str:
    """Fail until attempt ``failures + 1``; attempts are counted in the file ``path``.

    A file, not a global or ``ctx``: attempts may run in different processes.
    """
    path, failures = spec
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    attempt = os.path.getsize(path)
    if attempt <= failures:
        raise ConnectionError(f"attempt {attempt} failed")
    return f"attempt {attempt}"


def where(ctx: Any, father: str | None) -> dict[str, Any]:
    """Report what the task sees: its process, its thread, the context and its father's result.

    It also writes to ``ctx``: a thread executor shares the caller's context, another process
    gets a snapshot, so the write is seen by the caller only in the first case.
    """
    ctx["written_by_task"] = True
    return {
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "user": ctx.get("user"),
        "flow_id": ctx.flow_id,
        "flow_name": ctx.flow_name,
        "remaining": ctx.remaining(),
        "father": ctx.result_of(father) if father else None,
    }


def read_result_of(ctx: Any, name: str) -> Any:
    """``ctx.result_of(name)``, or the exception's type name when it raises."""
    try:
        return ctx.result_of(name)
    except LookupError as exc:
        return type(exc).__name__


def lock_result(ctx: Any, param: Any) -> threading.Lock:
    """Return something that cannot be pickled."""
    return threading.Lock()


def exit_process(ctx: Any, code: int) -> None:
    """Kill the worker process (a crashing extension module, an OOM kill)."""
    os._exit(code)


class PicklesOnce:
    """A value that pickles the first time and fails every later time.

    It passes a task's own "is my result picklable?" check and then fails when the executor
    serialises it to send it back: the case where dask (``processes=True``) never completes the
    future, so only the flow's budget ends the wait.
    """

    def __init__(self) -> None:
        self.pickled = 0

    def __reduce__(self) -> tuple[Any, ...]:
        self.pickled += 1
        if self.pickled > 1:
            raise TypeError("PicklesOnce refuses to be pickled twice")
        return (PicklesOnce, ())


def pickles_once(ctx: Any, param: Any) -> PicklesOnce:
    return PicklesOnce()


class Recorder(FunctionNode):
    """A FunctionNode whose hooks append ``(node, hook, pid, thread)`` to ``ctx["hooks"]``.

    Hooks run in the caller's process on every executor, so the list they append to is the
    caller's context, even when the task ran elsewhere.
    """

    def on_success(self, support: TaskSupport) -> None:
        self._record(support, "on_success")

    def on_fail(self, support: TaskSupport) -> None:
        self._record(support, "on_fail")

    def _record(self, support: TaskSupport, hook: str) -> None:
        support.context.setdefault("hooks", []).append(
            (self.name, hook, os.getpid(), threading.current_thread().name)
        )


class BeginRecorder(Recorder):
    """A ``Recorder`` that also records its ``on_begin``."""

    def on_begin(self, support: TaskSupport) -> None:
        self._record(support, "on_begin")
