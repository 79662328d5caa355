"""The loop economy of a run: how many worker loops (``loops.py``) it should have.

A run's ready nodes are drained by worker loops; each loop costs a thread wake-up, which is more
than a fast node costs, so a flow of fast nodes should run in few loops while nodes expected to
be slow (I/O) each get their own. ``Economy`` counts the loops, decides how many new ones
the ready nodes are worth (``reserve``), pops the next node for a loop (``next_node``) and,
while ready nodes are left to busy loops, watches that they make progress (``watchdog``).

It shares the run's ``ready`` deque and ``code`` list (the same objects) and the plan's ``est``
(the nodes' typical task times, racy by design) and is guarded by the run's ``lock``: every
method but ``watchdog`` (the timer thread's, which takes the lock itself) is called under it.

Fields (all under ``lock``)
===========================
``loops``: loops counted and not exited (reserved, submitted or running), but abandoned ones;
  ``max_loops``: the executor's parallelism, the bound on ``loops``.
``starting``: loops reserved and not started yet (each will pop a node, so they count against
  new ones).
``nslow``, ``slowq[i]``: how many ready entries were expected to be slow when queued, and whether
  node ``i``'s entry was counted.
``progress``: nodes completed so far (the run counts them); ``watch``: the watchdog's timer
  entry, armed while ready nodes are left to busy loops.
``loop_node``: the node each loop runs (by token); ``abandoned``: loops stuck in a node that
  timed out (no longer counted in ``loops``).
``ranks``: each node's dispatch rank (``ranking.rank``) or None (FIFO); set by the run's ``begin``.
``batch_of``: each node's ``Batch`` (None: none), or None when the plan has no batched node;
  ``joinable(i)``: whether ready node ``i`` may take a seat now (``batching.joinable``); both set
  by the run's ``begin``. ``gathered[i]``: the ready nodes of its batch that node ``i`` took
  along when it was popped (PARKED since), until its batch gate takes them (``batching.gate``)
  or it ends first (``regather``: they are ready again); made by the first batch taken along
  (until then the class-level empty ``Unused`` mapping, which raises on a write).
``closed``: the run closed; no watchdog is armed any more.
``dirty``: a ready node arrived, or a loop exited, was refused or abandoned, since ``reserve``
  last counted (pooled): without it ``reserve`` answers 0 at once (the loops counted then
  still cover what is ready: since, loops only took nodes).
``backlog``: a probe of how many tasks wait in the executor's queue, or None (see
  ``next_node``); with ``start``, stored only by a pooled economy (an unpooled one reads the
  class-level None and a ``start`` that starts nothing).

Invariants
==========
* ``0 <= starting`` and ``starting + (loops running a node) <= loops <= max_loops``.
* ``reserve`` never asks for more loops than there are ready nodes (less those already on their
  way), nor more than ``max_loops - loops``.
* While nodes are ready and fewer loops are on their way than ready nodes, a watchdog is armed
  (unless the run closed): a ready node never waits for a loop that does not come.
* ``nslow`` equals the number of ``ready`` entries whose ``slowq`` flag is set.
* A batched node is popped together with every ready node of its batch that may join it (one
  critical section: no other loop can take one of them and make a call of its own).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from taskflow import clock
from taskflow.engine import ranking, timer
from taskflow.engine.states import PARKED, QUEUED, RUNNING
from taskflow.engine.unused import Unused

__all__ = ["BACKLOG", "FAST_BATCH", "FAST_SCAN", "FAST_TASK", "WATCH", "Economy", "learn_duration"]

# a node whose tasks typically take less than this runs in a loop that is already there (the
# next ready node waits a few microseconds); a slower one, or one never measured, gets a loop of
# its own (a thread wake-up costs about this much)
FAST_TASK = 0.0002
# how many ready entries ``reserve`` reads to estimate the fast ones' work (the mean of those
# read times their number), and how many fast nodes share a loop when none of those read is
# fast (the slow ones first in the queue)
FAST_SCAN = 16
FAST_BATCH = 4
# more tasks than this waiting in the executor's queue means the pool is behind (fewer are
# typically tasks just submitted, their workers waking up): see ``Economy.next_node``
BACKLOG = 2
# how often ready nodes left to busy loops are checked for progress (``watchdog``), in real time
# even under a fake clock: it is armed on the real timer thread by name
WATCH = 0.002


def _watch_time(now: float) -> float:
    """When a watchdog armed at ``now`` looks: ``WATCH`` to ``2 * WATCH`` later, at a multiple
    of ``WATCH``, so every run armed in the same ``WATCH`` window shares one timer wake-up (most
    are cancelled before: their run finished). Without it the timer thread woke for nearly every
    run's entry (0.31 wake-ups per 20-node no-op flow, at 1 or 16 callers; now 0.09-0.12), and
    competed for the GIL each time."""
    return math.ceil((now + WATCH) / WATCH) * WATCH


def learn_duration(est: list[float], i: int, began: float | None, now: float) -> None:
    """Fold a successful attempt's duration into ``est[i]`` (``Plan.est``), the node's typical
    task time the economy sizes loops by: an exponential average, written without a lock (racy
    by design, see ``Plan.est``). A plain node's step (``plainloop``) inlines it."""
    if began is not None:
        e = est[i]
        d = now - began
        est[i] = d if e < 0.0 else e + (d - e) * 0.25


class Economy:
    """The worker loops of one run (see the module docstring for every field).

    ``pooled``: the run's nodes are drained by worker loops on a thread executor (else each
    ready node is worth one "loop": an inline drain or a remote submission). ``lock``: the
    run's. ``start(k)``: called by the watchdog, outside the lock, to have ``k`` reserved loops
    started (the run posts it to its owner).
    """

    def __init__(self, est: list[float], ready: deque[int], code: list[int], pooled: bool,
                 max_loops: int, backlog: Callable[[], int] | None, lock: Any,
                 start: Callable[[int], None] | None) -> None:
        self.est = est
        self.ready = ready
        self.code = code
        self.max_loops = max_loops
        self.lock = lock
        if pooled:  # the class-level defaults otherwise
            self.pooled = True
            self.backlog = backlog
            self.start = start  # type: ignore[method-assign,assignment]
        self.slowq = bytearray(len(code))
        self.loop_node: dict[int, int] = {}

    pooled = False
    backlog: Callable[[], int] | None = None
    gathered: dict[int, list[int]] = Unused()  # made by the first batch taken along

    def start(self, k: int) -> None:  # pragma: no cover - a watchdog is armed only when pooled
        """An unpooled economy's ``start`` (a pooled one is given the run's): none."""

    # the scalar fields start at class-level defaults (an economy writes its own on change)
    loops = 0
    starting = 0
    nslow = 0
    progress = 0
    watch: timer.Timer | None = None
    ranks: list[tuple[float, float]] | None = None
    batch_of: Sequence[Any] | None = None
    joinable: Callable[[int], bool] | None = None
    closed = False
    # something that can raise the loops the ready nodes are worth happened since ``reserve``
    # last counted them (an arrival, a loop that left or was refused or abandoned)
    dirty = False
    # made by the first abandoned loop (nearly every run has none)
    abandoned: AbstractSet[int] = frozenset()

    # -- arrivals ---------------------------------------------------------------------------------

    def enqueue(self, i: int) -> None:
        """Append QUEUED node ``i`` to ``ready``, counting it if expected slow."""
        e = self.est[i]
        if e < 0.0 or e >= FAST_TASK:
            self.nslow += 1
            self.slowq[i] = 1
        self.ready.append(i)
        self.dirty = True

    def clear_ready(self) -> None:
        """Empty ``ready``."""
        for i in self.ready:
            self.slowq[i] = 0
        self.nslow = 0
        self.ready.clear()

    # -- how many loops ---------------------------------------------------------------------------

    def reserve(self, nxt: int = -1) -> int:
        """How many new loops to start for the ready nodes (and count them).

        Pooled: one loop per ready node expected to be slow (never measured, or ``est`` at or
        above ``FAST_TASK``), plus, for the fast ones, one per ``FAST_TASK`` of their expected
        work (the 19 no-op backends of a page share one loop: a loop's wake-up costs more than
        they do; past ``FAST_SCAN`` ready entries the work is the mean of the fast ones among
        the first ``FAST_SCAN`` times their number, or, when none of those is fast, one loop
        per ``FAST_BATCH`` fast ones); one less if the calling loop goes on with a
        fast node ``nxt`` (it will take them next), less the loops already submitted and not
        started; ready nodes left to the loops there are arm the watchdog. Otherwise: one per
        ready node. Never more than ``max_loops - loops``.
        """
        ready = self.ready
        free = self.max_loops - self.loops
        if not ready or free <= 0:
            return 0
        if self.pooled:
            if not self.dirty:
                # nothing arrived and no loop left since the last count: the loops there are
                # and those on their way already cover the ready nodes (a fan's sources each
                # completing with their siblings still ready: no rescan per node)
                return 0
            self.dirty = False
            k = self._pooled_loops(nxt, free)
            if k == 0:
                return 0
            self.starting += k
        else:
            k = min(len(ready), free)
        self.loops += k
        return k

    def _pooled_loops(self, nxt: int, free: int) -> int:
        """``reserve``'s count on a thread executor (not counted yet); arms the watchdog when
        ready nodes are left to the loops there are."""
        ready = self.ready
        slow = self.nslow
        fast = len(ready) - slow
        if fast:
            # the fast ones: a loop per FAST_TASK of their expected work (at least one); past
            # FAST_SCAN entries, the work is the mean of the first FAST_SCAN times their number
            est, slowq = self.est, self.slowq
            if len(ready) <= FAST_SCAN:
                work = sum([est[i] for i in ready if not slowq[i]])
                k = slow + max(1, math.ceil(work / FAST_TASK))
            else:
                seen = [est[ready[j]] for j in range(FAST_SCAN) if not slowq[ready[j]]]
                if seen:
                    work = sum(seen) / len(seen) * fast
                    k = slow + max(1, math.ceil(work / FAST_TASK))
                else:
                    k = slow + (fast + FAST_BATCH - 1) // FAST_BATCH
        else:
            k = slow
        # less the calling loop if it goes on with a fast node
        if k > slow and nxt >= 0 and 0.0 <= self.est[nxt] < FAST_TASK:
            k -= 1
        # loops already on their way will each take one: do not start more than needed
        k = max(0, min(k - self.starting, free))
        if k + self.starting < len(ready) and self.watch is None and not self.closed:
            # ready nodes are left to the loops there are: make sure they make progress
            self.watch = timer.timer_thread.schedule(_watch_time(clock.real_now()), self.watchdog,
                                                     self.progress)
        return k

    def watchdog(self, progress: int, grow: int = 1) -> None:
        """Timer thread: ready nodes were left to the loops there are. If none of those loops
        finished a node since (a node expected to be fast is not, or the loops waited for the
        GIL or a CPU), ``start`` gets ``grow`` more loops for the ready nodes, unless one is
        already on its way; while ready nodes remain, look again later, doubling ``grow`` while
        there is still no progress. A busy process so does not get a loop per ready node that
        would mostly find nothing left to do, and a real stall still gets loops within a few
        looks."""
        with self.lock:
            self.watch = None
            if self.closed or not self.ready:
                return
            k = 0
            if self.progress == progress and not self.starting:
                k = min(grow, len(self.ready), self.max_loops - self.loops)
                if k > 0:
                    self.loops += k
                    self.starting += k
            self.watch = timer.timer_thread.schedule(_watch_time(clock.real_now()), self.watchdog,
                                                     self.progress, grow * 2 if k > 0 else 1)
        if k > 0:
            self.start(k)

    def stop(self) -> timer.Timer | None:
        """The run closed: no watchdog any more; returns the armed one (to cancel outside the
        lock)."""
        self.closed = True
        watch, self.watch = self.watch, None
        return watch

    # -- departures -------------------------------------------------------------------------------

    def next_node(self, token: int, after: bool = False) -> int:
        """Pop the next runnable node for loop ``token`` (moved to RUNNING), or exit the loop
        (-1, uncounted).

        ``after``: the loop has just completed a node. If the executor then has more than
        ``BACKLOG`` tasks waiting in its queue and the next ready node is known to be slow, the
        loop exits instead: the node gets a loop of its own at the back of the queue
        (``reserve``, right after) and the thread serves the waiting tasks first, typically
        other runs' nodes that became ready earlier. Otherwise, under a saturated pool, a run
        whose loops keep going overtakes older runs' queued work: the pool serves runs in the
        order their loops finish rather than the order they asked (lower throughput and a longer
        tail in ``benchmarks/concurrency.py``). Nodes never measured or fast keep the loop (a
        chain never pays an executor round trip per node).
        """
        code = self.code
        ready = self.ready
        if after and ready and self.est[ready[0]] >= FAST_TASK and token >= 0:
            backlog = self.backlog
            if backlog is not None and backlog() > BACKLOG:
                self.loop_exits(token)
                return -1
        ranks = self.ranks
        while ready:
            i = ready.popleft() if ranks is None else ranking.pop_best(ready, ranks)
            if self.slowq[i]:
                self.slowq[i] = 0
                self.nslow -= 1
            if code[i] == QUEUED:
                code[i] = RUNNING  # QUEUED -> RUNNING, checked just above
                self.loop_node[token] = i
                if self.batch_of is not None and self.batch_of[i] is not None:
                    self._gather(i)
                return i
        self.loop_exits(token)
        return -1

    def _gather(self, i: int) -> None:
        """Batched node ``i`` was just popped: the ready nodes of its batch that may join it go
        along (QUEUED -> PARKED), kept in ``gathered[i]`` for its batch gate."""
        joinable, batch_of, code = self.joinable, self.batch_of, self.code
        assert joinable is not None and batch_of is not None
        if not joinable(i):
            return
        b = batch_of[i]
        taken = [j for j in self.ready if code[j] == QUEUED and batch_of[j] is b and joinable(j)]
        if not taken:
            return
        self._remove(taken)
        for j in taken:
            code[j] = PARKED  # QUEUED -> PARKED: taken along into node i's batch call
        gathered = self.__dict__.get("gathered")
        if gathered is None:  # the first batch taken along: the economy's own mapping
            gathered = self.gathered = {}
        gathered[i] = taken

    def _remove(self, taken: list[int]) -> None:
        """Take the ready entries of ``taken`` out of ``ready`` (and their slow counts)."""
        gone = set(taken)
        kept = [j for j in self.ready if j not in gone]
        self.ready.clear()
        self.ready.extend(kept)
        slowq = self.slowq
        for j in taken:
            if slowq[j]:
                slowq[j] = 0
                self.nslow -= 1

    def regather(self, i: int) -> None:
        """Node ``i`` ended (or will not take a seat) before its batch gate took the nodes it
        took along: those still PARKED are ready again (the caller reserves loops)."""
        code = self.code
        for j in self.gathered.pop(i, ()):
            if code[j] == PARKED:
                code[j] = QUEUED  # PARKED -> QUEUED: it waited for nothing yet
                self.enqueue(j)

    def take(self, flags: Sequence[bool]) -> list[int]:
        """Take the QUEUED ready nodes whose flag is set out of ``ready``, moved to RUNNING:
        the caller starts them itself, with no loop (plain async nodes, ``aio.start_plain``)."""
        code = self.code
        taken = list(dict.fromkeys(i for i in self.ready if flags[i] and code[i] == QUEUED))
        if not taken:
            return taken
        self._remove(taken)
        for i in taken:
            code[i] = RUNNING  # QUEUED -> RUNNING, checked just above
        return taken

    def first_node(self, token: int) -> int:
        """A reserved loop started: its first node (``next_node``), or -1."""
        self.starting -= 1
        return self.next_node(token)

    def next_unless_abandoned(self, token: int) -> int:
        """``next_node`` for a loop that may have been abandoned (-1 then, already uncounted)."""
        if token in self.abandoned:
            return -1
        return self.next_node(token)

    def loop_exits(self, token: int) -> None:
        """Loop ``token`` exits: uncount it."""
        self.loops -= 1
        self.dirty = True
        self.loop_node.pop(token, None)

    def forget_abandoned(self, token: int) -> bool:
        """Whether loop ``token`` was abandoned (then it is forgotten: it exits)."""
        if token in self.abandoned:
            self.abandoned = self.abandoned - {token}
            self.loop_node.pop(token, None)
            return True
        return False

    def abandon_loop_of(self, i: int) -> int | None:
        """Node ``i`` timed out while a loop runs it: that loop is abandoned (uncounted, so a new
        one may take its place); returns its token (None: no loop runs ``i``)."""
        for token, x in self.loop_node.items():
            if x == i:
                self.abandoned = {*self.abandoned, token}
                self.loops -= 1
                self.dirty = True
                del self.loop_node[token]
                return token
        return None

    def refused(self) -> bool:
        """A reserved loop was refused by the executor (uncounted); True if loops are left."""
        self.loops -= 1
        self.starting -= 1
        self.dirty = True
        return self.loops > 0

    def dispatched(self, k: int) -> None:
        """``k`` reserved "loops" were handed over at once (inline drain, remote batch): they
        are no loops that exit later."""
        self.loops -= k
