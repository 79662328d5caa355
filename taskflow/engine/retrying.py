"""Retry budgets at run time: a node with ``retry_budget=`` deposits for its first attempt and
withdraws for each retry.

``Run.retry_delay`` decides that a failed attempt is retried (retries left, a back-off that
fits the budget); then, on the node's own thread and outside the lock, ``allow`` asks the
budget for a token (``RetryBudget.withdraw``). Refused: no retry is made, the node ends with
its last error and its result says so (``WorkResult.retry_refused``). Granted: the token is
handed to the node's Guard (``Guard.retry``) under the run's lock if the node is still alive,
else given back at once. ``Run.begin_attempt`` calls ``attempt_begins``: a first attempt
deposits (``RetryBudget.deposit``), a retry's attempt takes its token from the Guard and uses
it. A node that ends before its retry starts (its run closed during the back-off, its own
timeout, a join that no longer needs it) has its token given back by ``guards.release``, so
the budget counts only retries that were made.

The token's owners, in order: the thread that withdrew it, the node's Guard, the attempt that
uses it. Nothing here is called under the run's lock but the handover.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from taskflow.engine import events
from taskflow.model.result import ResultState, WorkResult

__all__ = ["BudgetedRun", "allow", "attempt_begins"]

_DEFAULT = ResultState.DEFAULT


class BudgetedRun(Protocol):
    """What retry budgets use of a run (``run.Run`` satisfies it). ``lock`` guards ``closed``,
    ``guards`` and the results' states; ``observers`` is fixed before any node is queued."""

    lock: threading.Lock
    closed: bool
    results: list[WorkResult[Any]]
    observers: tuple[events.RunObserver, ...]

    @property
    def guards(self) -> Any:
        """Node -> its ``guards.Guard`` (``retry``: the token for its next attempt)."""


def attempt_begins(run: BudgetedRun, i: int, pol: Any, first: bool) -> None:
    """An attempt of node ``i`` begins (its own thread): the first deposits; a retry uses the
    token its Guard holds."""
    if first:
        pol.retry_budget.deposit()
        return
    g = run.guards.get(i)
    if g is None:
        return
    with run.lock:
        token, g.retry = g.retry, None
    if token is not None:
        token.use()


def allow(run: BudgetedRun, i: int, pol: Any, attempt: int) -> bool:
    """Node ``i``'s attempt ``attempt`` failed and would be retried: whether the budget grants
    the retry (its token then held by the node's Guard)."""
    budget = pol.retry_budget
    token = budget.withdraw()
    wr = run.results[i]
    if token is None:
        wr.retry_refused = True  # the node's own thread, before its outcome is published
        if run.observers:
            events.event(run.observers, i, "retry_refused",
                         {"attempt": attempt, "budget": budget.name})
        return False
    g = run.guards.get(i)
    if g is None:  # pragma: no cover - a node with a policy has a Guard from its admission
        token.use()
        return True
    with run.lock:
        alive = not run.closed and wr.state is _DEFAULT
        held = None
        if alive:
            held, g.retry = g.retry, token
    if not alive:
        token.give_back()
        return False
    if held is not None:  # pragma: no cover - one retry is decided at a time per node
        held.give_back()
    return True
