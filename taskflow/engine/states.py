"""The lifecycle of a node within a run: its codes, their names and the legal moves between them.

A run keeps one code per node (``Run.code``) and moves it only along ``LEGAL_MOVES``, in one
place (``Run.move``); the hot path writes moves whose old state it has just tested, each marked
so at the write. Any other move is a bug in taskflow.

====================  =====================================================================
from                  to
====================  =====================================================================
WAITING               QUEUED (its join fired), TERMINAL (failed fast, skipped, cancelled)
QUEUED                RUNNING (popped), TERMINAL (cancelled, timed out, refused, closed),
                      PARKED (taken into a batch call by a node of its batch)
RUNNING               TERMINAL (its outcome, its timeout), BACKOFF (retry later),
                      QUEUED (retry at once on a remote executor), PARKED (waits for a
                      bulkhead slot, a rate-limit token, another run's shared call or the
                      answer of its batch's call)
BACKOFF               QUEUED (back-off over), TERMINAL (timed out, closed)
PARKED                QUEUED (what it waited for arrived), TERMINAL (timed out, closed)
TERMINAL              SETTLED (its hook returned and its sons were updated)
SETTLED               (none)
====================  =====================================================================

A PARKED node holds no worker: its loop went on with another node. The callback that ends its
wait (a releasing thread, the timer, a resolving thread) moves it to QUEUED under the run's lock
and hands ``dispatch`` to the run's owner (``guards.py``, ``batching.py``). A batched node
ready when another node of its batch is dispatched goes QUEUED -> PARKED without running: that
node takes it into its call (``batching.py``). A node with a fallback whose father
failed moves WAITING -> QUEUED with its failure decided; its worker computes the stand-in, and it
ends DEGRADED (TERMINAL), its sons running on that value.

A leaf of the engine: ``run.py`` and ``guards.py`` both import it, so each reads the same codes
whichever is imported first.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADMIT_DONE",
    "ADMIT_GO",
    "ADMIT_PARKED",
    "BACKOFF",
    "LEGAL_BITS",
    "LEGAL_MOVES",
    "NO_LOOP",
    "PARKED",
    "QUEUED",
    "RUNNING",
    "SETTLED",
    "STATE_NAMES",
    "TERMINAL",
    "WAITING",
    "INLINE",
    "LOOPS",
    "REMOTE",
    "IllegalMoveError",
]

WAITING: Final = 0
QUEUED: Final = 1
RUNNING: Final = 2
BACKOFF: Final = 3
TERMINAL: Final = 4
SETTLED: Final = 5
PARKED: Final = 6
STATE_NAMES: Final = ("WAITING", "QUEUED", "RUNNING", "BACKOFF", "TERMINAL", "SETTLED", "PARKED")

LEGAL_MOVES: Final[dict[int, frozenset[int]]] = {
    WAITING: frozenset({QUEUED, TERMINAL}),
    QUEUED: frozenset({RUNNING, TERMINAL, PARKED}),
    RUNNING: frozenset({TERMINAL, BACKOFF, QUEUED, PARKED}),
    BACKOFF: frozenset({QUEUED, TERMINAL}),
    TERMINAL: frozenset({SETTLED}),
    SETTLED: frozenset(),
    PARKED: frozenset({QUEUED, TERMINAL}),
}
LEGAL_BITS: Final = tuple(sum(1 << b for b in LEGAL_MOVES[a]) for a in range(len(STATE_NAMES)))
"""``LEGAL_MOVES`` as bit masks: ``(LEGAL_BITS[old] >> new) & 1`` says whether a move is legal."""

ADMIT_GO: Final = 0
ADMIT_PARKED: Final = 1
ADMIT_DONE: Final = 2
"""What a gate answers about a node's next attempt (``guards.admit``, ``batching.gate``): let it
start, it waits holding no worker (PARKED), or its outcome is decided without it."""

NO_LOOP: Final = -2
"""The loop token of work done outside any worker loop (remote outcomes, fan-in)."""

LOOPS: Final = "loops"
INLINE: Final = "inline"
REMOTE: Final = "remote"
"""How a run's nodes are executed (``Run.mode``): worker loops, the caller's thread, or one
submission per attempt on an executor in other processes."""


class IllegalMoveError(AssertionError):
    """A node state move outside ``LEGAL_MOVES``: a bug in taskflow (debug switch on)."""
