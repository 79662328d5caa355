"""Validation of the primitives' constructor options: bad input raises before anything runs.

Every error is a ``FlowDefinitionError`` (a ``ValueError``) that names the object and the option,
e.g. ``bulkhead 'inventory': max_concurrent must be an integer >= 1, got -1``.
"""

from __future__ import annotations

import inspect
import math
import types
from types import CoroutineType
from typing import Any

from taskflow.errors import FlowDefinitionError

__all__ = [
    "check_callable",
    "check_not_coroutine",
    "check_int",
    "check_name",
    "check_ratio",
    "check_seconds",
    "is_async",
    "rebuild",
]


def check_name(kind: str, name: object) -> str:
    """Return ``name`` when it is a non-empty string."""
    if not isinstance(name, str) or not name:
        raise FlowDefinitionError(f"{kind} name must be a non-empty string, got {name!r}")
    return name


def check_int(owner: str, option: str, value: object, *, minimum: int) -> int:
    """Return ``value`` when it is an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FlowDefinitionError(
            f"{owner}: {option} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def check_seconds(owner: str, option: str, value: object, *, allow_zero: bool) -> float:
    """Return ``value`` as a float when it is a finite number > 0 (or >= 0 with ``allow_zero``)."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise FlowDefinitionError(
            f"{owner}: {option} must be a finite number of seconds {bound}, got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def check_ratio(owner: str, option: str, value: object) -> float:
    """Return ``value`` as a float when it lies in (0, 1]."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0.0 < value <= 1.0
    )
    if not ok:
        raise FlowDefinitionError(f"{owner}: {option} must be in (0, 1], got {value!r}")
    return float(value)  # type: ignore[arg-type]


def is_async(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine: a coroutine function (or a partial of one), or
    an object whose class defines ``async def __call__``."""
    if inspect.iscoroutinefunction(fn):
        return True
    if isinstance(fn, (types.FunctionType, types.MethodType, type)):
        return False
    return callable(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def check_not_coroutine(owner: str, option: str, fn: object, params: str) -> None:
    """Raise when ``fn`` is a coroutine object (a call of an async function, given where the
    function was expected), closed first so that it does not warn "never awaited" later."""
    if type(fn) is CoroutineType:
        what = fn.__qualname__
        fn.close()
        raise FlowDefinitionError(
            f"{owner}: {option} must be a function callable as {option}{params}, got the "
            f"coroutine object {what}(...), which taskflow would never await (it was closed)")


def check_callable(owner: str, option: str, fn: object, params: str) -> None:
    """Raise unless ``fn`` is a plain (not async) callable with two positional arguments
    (named in ``params``); a coroutine object given instead is closed.

    Callables whose signature Python cannot read (some builtins) are accepted.
    """
    check_not_coroutine(owner, option, fn, params)
    if not callable(fn):
        raise FlowDefinitionError(f"{owner}: {option} must be callable as {option}{params}, "
                                  f"got {fn!r}")
    if is_async(fn):
        raise FlowDefinitionError(
            f"{owner}: {option} {fn!r} is async (a coroutine function, or an object with "
            f"async def __call__): taskflow calls {option} on its own threads and does not "
            "await it; pass a plain function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise FlowDefinitionError(
            f"{owner}: {option} {fn!r} cannot be called as {option}{params}: {exc}"
        ) from None


def rebuild(cls: type[Any], name: str, options: dict[str, Any]) -> Any:
    """Unpickle a primitive as a fresh object with the same options.

    A node sent to another process (process pools, loky, dask) carries its bulkhead or breaker
    along; the engine keeps all their bookkeeping in the caller's process, so the copy only
    needs to exist, not to share state (and a lock cannot be pickled).
    """
    return cls(name, **options)
