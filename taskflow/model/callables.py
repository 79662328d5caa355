"""Whether a callable is async, and its plain function, answered without ``inspect`` when the
code object can tell (``node`` builds nodes with these, ``context`` checks callbacks)."""

from __future__ import annotations

import functools
import types

__all__ = ["CO_VARARGS", "callable_is_async", "generator_problem", "is_coroutine_function",
           "plain_function"]

# ``inspect`` (with ``ast``, ``dis`` and ``tokenize``, about 7 ms) is imported only when a
# plain function's code object cannot answer (a wrapper, a partial, a callable object) or an
# error message needs a signature: building a node from a plain function reads the
# code object's flags, as ``inspect`` does for such a function.
CO_VARARGS = 0x04  # inspect.CO_VARARGS
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE
_CO_GENERATOR = 0x20  # inspect.CO_GENERATOR
_CO_ASYNC_GENERATOR = 0x200  # inspect.CO_ASYNC_GENERATOR


def plain_function(fn: object) -> types.FunctionType | None:
    """``fn`` when it is a plain function whose code object tells its signature, else None."""
    if (type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__")
            and "__signature__" not in fn.__dict__):
        return fn
    return None


def is_coroutine_function(fn: object) -> bool:
    """``inspect.iscoroutinefunction``, answered from the code object for a plain function (or
    a method of one), without importing ``inspect``."""
    plain = plain_function(fn.__func__ if type(fn) is types.MethodType else fn)
    if plain is not None and not hasattr(plain, "_is_coroutine_marker"):
        return bool(plain.__code__.co_flags & _CO_COROUTINE)
    import inspect

    return inspect.iscoroutinefunction(fn)


def callable_is_async(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine to await: a coroutine function, or an object
    whose class defines ``async def __call__``."""
    if isinstance(fn, types.BuiltinFunctionType):
        return False  # a function or method written in C (``list.append``, ...)
    if is_coroutine_function(fn):
        return True
    if isinstance(fn, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type)):
        return False
    return callable(fn) and is_coroutine_function(type(fn).__call__)


def _generator_flags(fn: object) -> int:
    """``fn``'s generator flags (``_CO_GENERATOR``, ``_CO_ASYNC_GENERATOR``): of its code
    object, or (a partial, a method, a callable object) as ``inspect`` reads it. A wrapper
    (``functools.wraps``) is read as itself: it may well consume the generator it wraps."""
    plain = plain_function(fn.__func__ if type(fn) is types.MethodType else fn)
    if plain is not None:
        return plain.__code__.co_flags & (_CO_GENERATOR | _CO_ASYNC_GENERATOR)
    if isinstance(fn, (types.BuiltinFunctionType, type)) or not callable(fn):
        return 0
    import inspect

    for f in (fn, type(fn).__call__):
        if inspect.isasyncgenfunction(f):
            return _CO_ASYNC_GENERATOR
        if inspect.isgeneratorfunction(f):
            return _CO_GENERATOR
        if isinstance(f, (types.FunctionType, types.MethodType, functools.partial)):
            break  # a function's own ``__call__`` is not its body
    return 0


def generator_problem(fn: object) -> str | None:
    """Why ``fn``, a node's task, cannot be one (it is a generator function, sync or async:
    calling it runs none of its body), or None. Read once when the node is defined."""
    flags = _generator_flags(fn)
    if not flags:
        return None
    what = getattr(fn, "__qualname__", None) or type(fn).__name__
    if flags & _CO_ASYNC_GENERATOR:
        return (f"its task {what} is an async generator function (async def with yield): a "
                "task returns one value, and taskflow would neither await nor iterate it; "
                "write an async def that returns the value (the items collected: "
                "[x async for x in ...])")
    return (f"its task {what} is a generator function (def with yield): calling it runs none "
            "of its body, which would run later in whoever iterates the result, outside the "
            "node's deadline and retries; return the value (the items collected: "
            "list(...))")
