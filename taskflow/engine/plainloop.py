"""A loop's fast path: running the plain nodes of a quiet run, each in one step.

A plain node (``Plan.plain``: a stateless FunctionNode with no own timeout or deadline, no
routing, no fan-out and no resilience options) of a quiet run (no node observers, no DEBUG
lines) needs none of ``Run.execute``'s and ``Run.complete``'s checks: no gate admits it, no hook,
observer or log line hears of it, no timer entry or other attempt of it exists. ``stepper``
makes, once per loop (``Run.run_nodes``), the ``step(i)`` that runs such a node: it stamps the
attempt, calls ``fn(ctx, param)`` and, if the task returned in time, in ONE critical section of
the run's lock records the success, settles the sons (a son of an ALL join inline: fathers
left, or queued; any other join through ``settling.other_join``), pops the loop's next node,
reserves the loops the ready nodes need and counts the node off ``pending``; outside the lock
it starts those loops and finishes the run when it is done. Everything the run and the plan hold
that a step reads is bound once in the closure, so a node costs no attribute look-up of the run.

Whatever is not such a success takes the general path, as ``Run.execute_plain`` did: a failure
(``retrying.retry_delay``: an immediate retry is the next turn of the step's loop, a back-off
``retrying.back_off``, else ``Run.complete``), a task that returned past the run's deadline, and
a late outcome (the node was settled meanwhile: a timeout, a cancel, a closed run) go to
``Run.complete`` (which records, observes, hooks and settles them, or drops a late one), and a
node settled before its attempt started goes to ``Run.late``.

The invariants of ``run.py`` hold as there: the outcome is recorded once, under the lock, by the
thread holding the node RUNNING with no outcome yet (tested in the same critical section);
nothing under the lock calls out; the states move RUNNING -> SETTLED in that one critical
section (TERMINAL in between while its sons are settled, which ``settling`` reads: a son that
fires early cancels only fathers not yet terminal). ``clock.now`` is read through the module
(the seam: a fake clock may be installed or left while a run is in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from types import CoroutineType as _Coroutine
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import aio, closing, retrying, settling
from taskflow.engine.economy import FAST_TASK
from taskflow.engine.states import QUEUED, RUNNING, SETTLED, TERMINAL
from taskflow.model.context import TaskContext, current
from taskflow.model.result import ResultState

__all__ = ["PlainLoopRun", "stepper"]

_DEFAULT = ResultState.DEFAULT
_SUCCESS = ResultState.SUCCESS
_succeeded = settling.succeeded


class PlainLoopRun(settling.SettlingRun, closing.ClosingRun, retrying.BudgetedRun, Protocol):
    """What a step uses of a run (``run.Run`` satisfies it; ``run.py`` has mypy check that): the
    settling, closing and retrying state, and ``ctx`` (fixed), ``pending``, ``keep``,
    ``finished`` (under ``lock``)."""

    ctx: TaskContext
    pending: int
    keep: int
    finished: bool

    def late(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """The node was settled without us: drop the outcome; the loop's next node."""

    def complete(self, i: int, token: int, value: Any, error: BaseException | None) -> int:
        """Record node ``i``'s outcome (the general path); the loop's next node."""

    def carry_on(self, nxt: int, k: int, fin: bool, hooks: list[int]) -> int:
        """Outside the lock: settle ``hooks``, start ``k`` loops, finish if ``fin``; ``nxt``."""


def stepper(run: PlainLoopRun, token: int, tname: str) -> Callable[[int], int]:
    """The step of loop ``token`` (on thread ``tname``) of quiet ``run``: ``step(i)`` runs plain
    node ``i`` (popped by this loop, RUNNING) to its outcome and returns the loop's next node
    (-1: the loop exits). Called in a fresh copy of the caller's contextvars, with
    ``current.run`` set to ``run``."""
    plan = run.plan
    nodes, sons_of, kinds, est = plan.nodes, plan.sons, plan.join_kind, plan.est
    results, code, left, nsucc = run.results, run.code, run.left, run.nsucc
    ready, lock, eco, ctx, deadline = run.ready, run.lock, run.economy, run.ctx, run.deadline
    slowq, loop_node = eco.slowq, eco.loop_node
    # next_node's FIFO pop inlined: no ranks, no batch (both fixed at begin); a pooled economy
    # reserves only when something changed since it last counted (Economy.reserve)
    fifo = eco.ranks is None and eco.batch_of is None
    pooled = eco.pooled
    hooks: list[int] = []  # what settling ended without running (a father no son needs)

    def step(i: int) -> int:
        wr = results[i]
        node: Any = nodes[i]  # a FunctionNode (Plan.plain)
        current.idx = i
        while True:
            if wr.state is not _DEFAULT:
                return run.late(i, token, None, None)
            began = wr.started_at
            if began is None:
                began = wr.started_at = clock.now()
            wr.attempts += 1
            wr.thread = tname
            try:
                value = node.fn(ctx, node.param)
                if type(value) is _Coroutine:
                    aio.returned_coroutine(run.names[i], value)
            except BaseException as exc:  # noqa: BLE001 - a task's failure is its node's outcome
                delay = retrying.retry_delay(run, i, wr, exc)
                if delay != 0.0:  # 0: retry at once; > 0: after a back-off; else it failed
                    return (retrying.back_off(run, i, wr, token, delay) if delay > 0.0
                            else run.complete(i, token, None, exc))
                continue
            break
        now = clock.now()
        if now >= deadline:
            return run.complete(i, token, value, None)  # past the deadline: it says so
        e = est[i]  # economy.learn_duration, inlined
        d = now - began
        est[i] = d if e < 0.0 else e + (d - e) * 0.25
        with lock:
            if code[i] != RUNNING or wr.state is not _DEFAULT:
                done = False  # settled without us: the general path drops it
            else:
                done = True
                eco.progress += 1
                wr.result = value  # Run.record_success, inlined
                wr.finished_at = now
                wr.state = _SUCCESS
                sons = sons_of[i]
                if sons:
                    code[i] = TERMINAL  # RUNNING -> TERMINAL, checked just above
                    _succeeded(run, sons, hooks, now, code, left, nsucc, kinds, est, results,
                              ready, eco)
                code[i] = SETTLED  # -> SETTLED: its sons were updated, it has no hook
                # the loop's next node (Economy.next_node(token, True), its FIFO pop inlined)
                abandoned = eco.abandoned
                if token < -1 or (abandoned and token in abandoned):
                    nxt = -1
                elif fifo and ready and est[ready[0]] < FAST_TASK:
                    nxt = ready.popleft()
                    if slowq[nxt]:
                        slowq[nxt] = 0
                        eco.nslow -= 1
                    if code[nxt] == QUEUED:
                        code[nxt] = RUNNING  # QUEUED -> RUNNING, checked just above
                        loop_node[token] = nxt
                    else:
                        nxt = eco.next_node(token)
                else:
                    nxt = eco.next_node(token, True)
                k = eco.reserve(nxt) if ready and (eco.dirty or not pooled) else 0
                if run.closed:
                    fin = i == run.keep and not run.finished
                else:
                    run.pending -= 1
                    fin = run.pending == 0
        if not done:
            return run.complete(i, token, value, None)
        if hooks or k:
            taken = hooks[:]
            hooks.clear()
            return run.carry_on(nxt, k, fin, taken)
        if fin:
            closing.finish(run)
        return nxt

    return step
