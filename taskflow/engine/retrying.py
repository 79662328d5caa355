"""A node's retries at run time: whether a failed attempt is retried and after what back-off
(``retry_delay``), telling the observers (``retrying``), parking the node in BACKOFF
(``back_off``) and queueing its next attempt when the back-off ends (``requeue``, the timer
thread); and retry budgets: a node with ``retry_budget=`` deposits for its first attempt and
withdraws for each retry.

``retry_delay`` decides that a failed attempt is retried (retries left, a back-off that
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
from collections.abc import Callable
from typing import Any, Protocol

from taskflow import clock
from taskflow.engine import events, sections, timer
from taskflow.engine.economy import Economy
from taskflow.engine.states import BACKOFF, QUEUED, RUNNING
from taskflow.model.graph import Plan
from taskflow.model.result import ResultState, WorkResult

__all__ = ["BudgetedRun", "allow", "attempt_begins", "back_off", "next_attempt", "requeue",
           "retry_delay", "retrying"]

_DEFAULT = ResultState.DEFAULT


class BudgetedRun(Protocol):
    """What a node's retries use of a run (``run.Run`` satisfies it). ``lock`` guards
    ``closed``, ``code``, ``guards``, the economy and the results' states; ``plan``,
    ``deadline``, ``t0``, ``debug`` are fixed at creation; ``observers`` and
    ``node_observers`` before any node is queued."""

    lock: threading.Lock
    closed: bool
    plan: Plan
    code: list[int]
    deadline: float
    t0: float
    debug: bool
    results: list[WorkResult[Any]]
    observers: tuple[events.RunObserver, ...]
    node_observers: tuple[events.RunObserver, ...]

    @property
    def guards(self) -> Any:
        """Node -> its ``guards.Guard`` (``retry``: the token for its next attempt)."""

    @property
    def economy(self) -> Economy:
        """The run's loop economy (its fields under ``lock``)."""

    @property
    def log(self) -> Any:
        """The run's logger."""

    def move(self, i: int, new: int) -> None:
        """Under lock: move node ``i`` to state ``new``."""

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the run's owner thread."""

    def dispatch(self, k: int) -> None:
        """Outside the lock, on a thread that may submit: start ``k`` reserved loops."""


def retry_delay(run: BudgetedRun, i: int, wr: WorkResult[Any], error: BaseException) -> float:
    """Node ``i``'s attempt failed with ``error``: 0.0, retry now; > 0, retry after that
    back-off; < 0, no retry (none left, not an Exception, the run closed, the node settled,
    the back-off would pass a deadline, the budget refused it)."""
    plan = run.plan
    if wr.attempts > plan.retries[i] or not isinstance(error, Exception) or run.closed:
        return -1.0
    if wr.state is not _DEFAULT:
        return -1.0
    # a float product overflows to inf (no retry), where 2.0 ** n would raise
    delay = plan.backoff[i] * (2.0 ** min(wr.attempts - 1, 1000))
    limit = run.deadline
    t = plan.timeout[i]
    if t is not None and wr.started_at is not None:
        limit = min(limit, wr.started_at + t)
    if plan.any_deadline:
        limit = sections.limit(plan, i, run.t0, limit)
    if clock.now() + delay >= limit:
        return -1.0
    if plan.any_policy:
        pol = plan.policy[i]
        if pol is not None and pol.retry_budget is not None and not allow(
                run, i, pol, wr.attempts):
            return -1.0  # the budget refused it: the node ends with this error
    if run.debug:
        run.log.bind(node=plan.names[i]).debug(
            "node {} failed attempt {}, retrying in {:.3f}s: {!r}",
            plan.names[i], wr.attempts, delay, error)
    return delay


def retrying(run: BudgetedRun, i: int, attempt: int, error: BaseException,
             delay: float) -> None:
    """Tell the observers that attempt ``attempt`` of node ``i`` failed and another follows
    after ``delay`` seconds."""
    events.event(run.observers, i, "retry", {"attempt": attempt, "delay": delay,
                                             "error": error})
    events.attempt_ended(run.node_observers, i, attempt, error, events.RETRY)


def next_attempt(run: BudgetedRun, i: int, wr: WorkResult[Any], error: BaseException) -> float:
    """``retry_delay`` for node ``i``'s failed attempt, the node observers told when another
    attempt follows (``retrying``)."""
    delay = retry_delay(run, i, wr, error)
    if delay >= 0.0 and run.node_observers:
        retrying(run, i, wr.attempts, error, delay)
    return delay


def back_off(run: BudgetedRun, i: int, wr: WorkResult[Any], token: int, delay: float) -> int:
    """Node ``i``'s attempt failed and another follows after ``delay`` seconds: park it in
    BACKOFF (the timer requeues it) and return loop ``token``'s next node."""
    with run.lock:
        if run.code[i] == RUNNING and wr.state is _DEFAULT:
            run.move(i, BACKOFF)
            timer.schedule(clock.now() + delay, requeue, run, i)
        return run.economy.next_unless_abandoned(token)


def requeue(run: BudgetedRun, i: int) -> None:
    """Timer thread: node ``i``'s back-off ended; queue its next attempt (the owner
    dispatches it)."""
    with run.lock:
        if run.code[i] != BACKOFF or run.closed:
            return
        run.move(i, QUEUED)
        run.economy.enqueue(i)
        k = run.economy.reserve()
    if k:
        run.post(run.dispatch, k)


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
