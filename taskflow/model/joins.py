"""Join policies: when a node with several fathers may run.

==============  =========================================  ==========================================
policy          fires when                                 fails when
==============  =========================================  ==========================================
``ALL``         every required father succeeded            a required father failed (at once)
``ANY``         the first father succeeded                 every father failed
``quorum(k)``   k fathers succeeded                        k successes are out of reach (at once)
``BEST_EFFORT`` every father is terminal, whatever it was  never (it always runs, unless all skipped)
==============  =========================================  ==========================================

Fathers that are ``SKIPPED`` (an unchosen switch branch) are ignored; a node whose fathers were all
skipped is skipped itself. Optional edges (``depends_on(x, optional=True)``) are waited for under
``ALL`` but their failure is tolerated. ``DEGRADED`` fathers count as successes.

``decide`` is the whole rule as one pure function of a son's counts; the engine calls it each
time a father of a waiting son becomes terminal.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["FAIL", "FIRE", "SKIP", "WAIT", "Join", "decide"]

# policy kinds, compared by the engine on the hot path
ALL, ANY, QUORUM, BEST_EFFORT = 0, 1, 2, 3

# decisions of ``decide``
WAIT, FIRE, FAIL, SKIP = 0, 1, 2, 3
DECISION_NAMES = ("WAIT", "FIRE", "FAIL", "SKIP")


def decide(kind: int, k: int, nfathers: int, left: int, nsucc: int, nskip: int,
           nfail: int) -> int:
    """What a waiting son does now, from its fathers' counts.

    Args:
        kind: the son's policy kind (``ALL``, ``ANY``, ``QUORUM``, ``BEST_EFFORT``).
        k: the quorum size (``QUORUM`` only).
        nfathers: how many fathers it has.
        left: fathers not terminal yet.
        nsucc: fathers that succeeded (``SUCCESS`` or ``DEGRADED``, and, below a switch, chose it).
        nskip: fathers that were skipped.
        nfail: fathers whose failure counts against it (an optional father's failure under
            ``ALL`` does not count; under the other policies every failure does).

    Returns:
        ``WAIT`` (not decided yet), ``FIRE`` (run it), ``FAIL`` (fail fast, without running) or
        ``SKIP`` (every father was skipped).
    """
    if nskip == nfathers:
        return SKIP
    if kind == ALL:
        if nfail:
            return FAIL
        return WAIT if left else FIRE
    if kind == ANY:
        if nsucc:
            return FIRE
        return WAIT if left else FAIL
    if kind == QUORUM:
        if nsucc >= k:
            return FIRE
        return FAIL if nsucc + left < k else WAIT
    return WAIT if left else FIRE  # BEST_EFFORT


class Join:
    """A join policy. Use the constants ``Join.ALL``, ``Join.ANY``, ``Join.BEST_EFFORT`` or
    ``Join.quorum(k)``; instances are immutable and compare by value."""

    __slots__ = ("k", "kind")

    ALL: ClassVar[Join]
    ANY: ClassVar[Join]
    BEST_EFFORT: ClassVar[Join]

    kind: int
    k: int

    def __init__(self, kind: int, k: int = 0) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "k", k)

    @classmethod
    def quorum(cls, k: int) -> Join:
        """Fire once ``k`` fathers succeeded; fail as soon as ``k`` successes are out of reach.

        Raises:
            TypeError: ``k`` is not an int.
            ValueError: ``k`` < 1 (``k`` larger than the number of fathers is caught when the flow
                is validated, since the fathers may be wired later).
        """
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"quorum size must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"quorum size must be at least 1, got {k}")
        return cls(QUORUM, k)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Join policies are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Join) and (self.kind, self.k) == (other.kind, other.k)

    def __hash__(self) -> int:
        return hash((self.kind, self.k))

    def __reduce__(self) -> tuple[object, ...]:
        return (Join, (self.kind, self.k))

    def __repr__(self) -> str:
        if self.kind == QUORUM:
            return f"Join.quorum({self.k})"
        return "Join." + ("ALL", "ANY", "QUORUM", "BEST_EFFORT")[self.kind]


Join.ALL = Join(ALL)
Join.ANY = Join(ANY)
Join.BEST_EFFORT = Join(BEST_EFFORT)
