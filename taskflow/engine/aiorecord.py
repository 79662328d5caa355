"""The owner's side of async nodes' outcomes: the plain successes of one hand-over recorded under
one acquisition of the run's lock (``aio.py``'s outcomes use it).

A plain async node (``Plan.aplain``: a stateless FunctionNode whose task is async, with no own
timeout or deadline, no routing, no fan-out and no resilience options) that succeeded in a
quiet run (no node observers, no DEBUG lines) needs nothing of ``Run.complete`` but what
its fast path does for a plain sync node: record the value, settle the sons, count the node off
``pending``. Its duration is not learned (``Plan.est`` keeps an async node fast), its timeout
entry, fan-out and other attempts do not exist (it has no timeout, fan-out or hedge), and no
hook, observer or log line hears of it. ``settle_plain`` does those steps for every such
outcome of a batch (``loophub.Hub.post``: the outcomes of a run's attempts that ended in the
same iteration of the loop) under one lock, then reserves and starts the loops the ready sons
need once (its plain async sons start on the loop from here, ``start_plain``: no worker hop),
and finishes the run if it is done; whatever is not such an outcome (a failure, a
late outcome, a run past its deadline or not quiet) is returned, for the general path
(``aio._record``, one by one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import closing, settling
from taskflow.engine.states import RUNNING, SETTLED, TERMINAL
from taskflow.model.result import ResultState

__all__ = ["PlainRun", "settle_plain"]

_DEFAULT = ResultState.DEFAULT
_SUCCESS = ResultState.SUCCESS

# an outcome as ``aio`` hands it over: (run, node, value, error)
Outcome = tuple[Any, int, Any, "BaseException | None"]


class PlainRun(settling.SettlingRun, closing.ClosingRun, Protocol):
    """What recording plain outcomes uses of a run (``run.Run`` satisfies it; ``run.py`` has
    mypy check that, through ``aio.AsyncRun``): the settling state, and ``quiet``, ``pending``, ``keep``, ``finished``
    (``pending`` and ``finished`` under ``lock``)."""

    quiet: bool
    pending: int
    keep: int
    finished: bool

    def dispatch(self, k: int) -> None:
        """Outside the lock: start ``k`` reserved loops."""


def _no_loop(run: Any, nodes: list[int]) -> None:  # pragma: no cover - aio replaces it
    raise RuntimeError("taskflow.engine.aio is not loaded: no async node can start")


start_plain: Callable[[Any, list[int]], None] = _no_loop
"""Start plain async nodes moved to RUNNING on the run's loop: ``aio.start_plain`` (set by
``aio``, which imports this module; a plan with async nodes has loaded it)."""


def settle_plain(run: PlainRun, batch: list[Outcome]) -> list[Outcome]:
    """The run's owner: record the successes of plain async nodes in ``batch`` (outcomes of
    ``run``'s attempts) under one lock, settle their sons, start the loops the ready nodes need
    and finish the run if it is done. Returns the outcomes left to the general path, in order."""
    plan = run.plan
    if not run.quiet:
        return batch
    aplain = plan.aplain
    now = clock.now()
    if now >= run.deadline:
        return batch  # past the deadline: the general path says so
    rest: list[Outcome] = []
    hooks: list[int] = []
    results, sons = run.results, plan.sons
    eco = run.economy
    fin = False
    with run.lock:
        code = run.code
        for item in batch:
            i = item[1]
            wr = results[i]
            if (item[3] is not None or not aplain[i] or code[i] != RUNNING
                    or wr.state is not _DEFAULT):
                rest.append(item)
                continue
            eco.progress += 1
            wr.result = item[2]
            wr.finished_at = now
            wr.state = _SUCCESS
            code[i] = TERMINAL  # RUNNING -> TERMINAL, checked just above
            if sons[i]:
                settling.settle_sons(run, i, hooks, now)
            code[i] = SETTLED  # TERMINAL -> SETTLED: its sons were updated, it has no hook
            if run.closed:
                fin = fin or (i == run.keep and not run.finished)
            else:
                run.pending -= 1
                fin = fin or run.pending == 0
        moved = run.ready and len(rest) < len(batch)  # else no son became ready
        # its plain async sons start from here, on the loop, with no worker hop
        direct = eco.take(aplain) if moved and eco.pooled else None
        k = eco.reserve() if moved else 0
    if direct:
        start_plain(run, direct)
    if hooks:
        fin = settling.after_settle(run, hooks, k) or fin
    elif k:
        run.dispatch(k)
    if fin:
        closing.finish(run)
    return rest
