"""Empty class-level defaults of the fields of a run that only some runs write.

``Run`` makes a field such as ``loop_futs`` (LOOPS runs) or ``guards`` (plans with resilience
options) only for the runs that write it; every other run reads the class-level default, one of
these: an empty mapping or set that reads like any empty one and raises on a write, so a field
written where it was not made is a loud bug in taskflow instead of state shared by all runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Unused", "UnusedSet"]


class Unused(dict[Any, Any]):
    """The class-level default of a field of ``Run`` that a run of its mode or plan never
    writes (``Run.__init__`` gives the others their own): reading it is reading an empty
    mapping; writing it is a bug in taskflow and raises."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError(f"taskflow bug: a run wrote {key!r} into a field it never uses")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        raise TypeError(f"taskflow bug: a run wrote {key!r} into a field it never uses")


class UnusedSet(set[int]):
    """``Unused`` for a set."""

    __slots__ = ()

    def add(self, token: int) -> None:
        raise TypeError(f"taskflow bug: a run wrote {token!r} into a field it never uses")
