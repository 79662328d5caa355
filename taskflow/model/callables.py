"""Whether a callable is async, and its plain function, answered without ``inspect`` when the
code object can tell (``node`` builds nodes with these, ``context`` checks callbacks)."""

from __future__ import annotations

import types

__all__ = ["CO_VARARGS", "callable_is_async", "is_coroutine_function", "plain_function"]

# ``inspect`` (with ``ast``, ``dis`` and ``tokenize``, about 7 ms) is imported only when a
# plain function's code object cannot answer (a wrapper, a partial, a callable object) or an
# error message needs a signature: building a node from a plain function reads the
# code object's flags, as ``inspect`` does for such a function.
CO_VARARGS = 0x04  # inspect.CO_VARARGS
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE


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
