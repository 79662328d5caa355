"""Retry budgets: the retries of every node that shares one stay within ``ratio`` x first
attempts + ``min_per_second`` per second over the window; a retry past it is not made and the
node ends with its last error; a token for a retry that never starts is given back."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG, MEDIUM, parse_prometheus
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from resilience_helpers import FakeClock, wait_until

from taskflow import (
    FlowDefinitionError,
    FunctionNode,
    PoolMonitor,
    ResultState,
    RetryBudget,
    TaskContext,
    TaskScheduling,
)
from taskflow.resilience.retrybudget import SLICES

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)




class Down:
    """A backend in an outage: every call fails (and is counted)."""

    def __init__(self, failures: int | None = None) -> None:
        self.calls = 0
        self.failures = failures  # None: every call fails
        self.lock = threading.Lock()

    def __call__(self, ctx: Any, param: Any) -> str:
        with self.lock:
            self.calls += 1
            n = self.calls
        attempt = ctx["attempt"] = ctx.get("attempt", 0) + 1  # this run's attempts
        if self.failures is None or n <= self.failures:
            raise ConnectionError(f"attempt {attempt} refused")
        return "ok"


# -- options --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "message"), [
    ({"ratio": -0.1, "min_per_second": 1}, "ratio must be a finite number >= 0, got -0.1"),
    ({"ratio": math.nan, "min_per_second": 1}, "ratio must be a finite number >= 0"),
    ({"ratio": True, "min_per_second": 1}, "ratio must be a finite number >= 0"),
    ({"ratio": 0.2, "min_per_second": -1}, "min_per_second must be a finite number >= 0"),
    ({"ratio": 0.2, "min_per_second": math.inf}, "min_per_second must be a finite number"),
    ({"ratio": 0, "min_per_second": 0}, "ratio and min_per_second are both 0"),
    ({"ratio": 0.2, "min_per_second": 1, "window": 0}, "window must be a finite number of "
                                                        "seconds > 0"),
])
def test_bad_options_are_refused_naming_the_budget(options: dict[str, Any], message: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        RetryBudget("inventory", **options)
    assert str(info.value).startswith("retry budget 'inventory': ")
    assert message in str(info.value)


def test_retry_budget_on_a_node_is_typed_and_spelled() -> None:
    from taskflow import FanOutNode, InvalidNodeError

    with pytest.raises(FlowDefinitionError, match="retry_budget must be a taskflow.RetryBudget"):
        FunctionNode(Down(), name="stock", retries=3, retry_budget=0.2)  # type: ignore[arg-type]
    with pytest.raises(InvalidNodeError, match="did you mean 'retry_budget'"):
        FunctionNode(Down(), name="stock", retry_budgte=None)  # type: ignore[call-arg]
    fan = FanOutNode(name="fan")
    with pytest.raises(FlowDefinitionError, match="a fan-out node takes fallback, priority"):
        fan.retry_budget = RetryBudget("fan-budget", ratio=0.1, min_per_second=1)


# -- the budget on its own ---------------------------------------------------------------------------

def test_first_attempts_buy_retries_at_the_ratio_and_expire_with_the_window() -> None:
    clock = FakeClock()
    budget = RetryBudget("budget-ratio", ratio=0.25, min_per_second=0, window=10.0, clock=clock)
    assert budget.withdraw() is None  # nothing deposited, no reserve
    for _ in range(8):
        budget.deposit()
    tokens = [budget.withdraw() for _ in range(3)]
    assert tokens[0] is not None and tokens[1] is not None and tokens[2] is None
    m = budget.metrics()
    assert (m.attempts, m.retries, m.refused, m.balance) == (8, 2, 2, 0.0)
    clock.advance(10.0 + 10.0 / SLICES)  # the deposits and withdrawals left the window
    assert budget.metrics().balance == 0.0 and budget.withdraw() is None
    budget.deposit()
    budget.deposit()
    budget.deposit()
    budget.deposit()
    assert budget.withdraw() is not None


def test_min_per_second_is_a_reserve_over_the_window() -> None:
    clock = FakeClock()
    budget = RetryBudget("budget-reserve", ratio=0.0, min_per_second=2, window=3.0, clock=clock)
    granted = [budget.withdraw() for _ in range(8)]
    assert sum(t is not None for t in granted) == 6  # 2 a second over 3 seconds
    clock.advance(3.0 + 3.0 / SLICES)
    assert budget.withdraw() is not None


def test_a_token_given_back_unused_is_a_retry_not_made() -> None:
    clock = FakeClock()
    budget = RetryBudget("budget-give", ratio=0.0, min_per_second=1, window=1.0, clock=clock)
    token = budget.withdraw()
    assert token is not None and budget.withdraw() is None
    assert token.give_back() is True and token.give_back() is False
    used = budget.withdraw()
    assert used is not None
    used.use()
    assert used.give_back() is False  # its retry was made
    m = budget.metrics()
    assert (m.retries, m.returned, m.refused) == (2, 1, 1)


def test_metrics_export_as_prometheus_series_labelled_by_budget() -> None:
    budget = RetryBudget("budget-export", ratio=0.5, min_per_second=0, window=10.0)
    budget.deposit()
    budget.deposit()
    assert budget.withdraw() is not None
    assert budget.withdraw() is None
    _, series = parse_prometheus(budget.prometheus_lines())
    lab = (("retry_budget", "budget-export"),)
    assert series[("taskflow_retry_budget_attempts_total", lab)] == 2
    assert series[("taskflow_retry_budget_retries_total", lab)] == 1
    assert series[("taskflow_retry_budget_refused_total", lab)] == 1
    assert series[("taskflow_retry_budget_balance", lab)] == 0


class BudgetMachine(RuleBasedStateMachine):
    """Deposits, withdrawals, tokens used or given back and time passing, in any order: a
    retry is granted only if, counting it, the retries standing in the last window stay within
    ``min_per_second * window + ratio *`` the first attempts of that window, and refused only
    when they would not; the counters agree with what happened."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.window = 2.0
        self.budget = RetryBudget("machine", ratio=0.3, min_per_second=1.5, window=self.window,
                                  clock=self.clock)
        self.deposits: list[float] = []
        self.standing: list[tuple[float, Any]] = []  # granted, not given back
        self.held: list[Any] = []
        self.refused = 0
        self.returned = 0

    def _slice(self, t: float) -> int:
        return math.floor(t / (self.window / SLICES))

    def _in_window(self, t: float) -> bool:
        return self._slice(self.clock()) - self._slice(t) < SLICES

    @rule()
    def deposit(self) -> None:
        self.budget.deposit()
        self.deposits.append(self.clock())

    @rule()
    def withdraw(self) -> None:
        token = self.budget.withdraw()
        if token is None:
            self.refused += 1
            # refused only when the window's balance is below one retry
            balance = (1.5 * self.window + 0.3 * sum(map(self._in_window, self.deposits))
                       - sum(self._in_window(t) for t, _ in self.standing))
            assert balance < 1.0
        else:
            self.standing.append((self.clock(), token))
            self.held.append(token)
            # granted only if, counting it, the window's retries stay within the budget
            in_window = sum(self._in_window(t) for t, _ in self.standing)
            allowed = 1.5 * self.window + 0.3 * sum(map(self._in_window, self.deposits))
            assert in_window <= allowed + 1e-9

    @precondition(lambda self: self.held)
    @rule(data=st.data(), back=st.booleans())
    def settle_token(self, data: st.DataObject, back: bool) -> None:
        token = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        if back:
            assert token.give_back()
            self.returned += 1
            self.standing = [(t, k) for t, k in self.standing if k is not token]
        else:
            token.use()

    @rule(seconds=st.floats(0.0, 3.0))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def the_counters_agree(self) -> None:
        m = self.budget.metrics()
        assert m.attempts == len(self.deposits) and m.refused == self.refused
        assert m.retries == len(self.standing) + self.returned and m.returned == self.returned


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


# -- in runs ------------------------------------------------------------------------------------------

def test_an_outage_costs_a_fraction_of_the_retries_it_would_without_a_budget() -> None:
    runs, ratio, per_second, window = 200, 0.2, 5.0, 1.0
    plain, budgeted = Down(), Down()
    budget = RetryBudget("outage", ratio=ratio, min_per_second=per_second, window=window)
    without = FunctionNode(plain, name="stock", retries=3)
    with_budget = FunctionNode(budgeted, name="stock", retries=3, retry_budget=budget)
    with ThreadPoolExecutor(4, thread_name_prefix="budget-outage") as pool:
        for _ in range(runs):
            TaskScheduling.start(without, executor=pool, timeout=LONG)
        began = time.monotonic()
        futures = [TaskScheduling.submit(with_budget, executor=pool, timeout=LONG)
                   for _ in range(runs)]
        results = [f.result(LONG) for f in futures]
        elapsed = time.monotonic() - began
    assert plain.calls == 4 * runs
    # every first attempt, and retries within ratio x those + the per-second reserve
    assert budgeted.calls <= (1 + ratio) * runs + per_second * (elapsed + window) + 1
    m = budget.metrics()
    assert m.attempts == runs and m.retries == budgeted.calls - runs and m.returned == 0
    refused = [r for r in results if r["stock"].work_result.retry_refused]
    assert m.refused == len(refused) > runs / 2
    for r in results:  # each node ends with the error of its last attempt
        wr = r["stock"].work_result
        assert wr.state is ResultState.EXCEPTION and isinstance(wr.exception, ConnectionError)
        assert str(wr.exception) == f"attempt {wr.attempts} refused"
        assert wr.retry_refused == (wr.attempts < 4)
    last = refused[-1]
    assert last.report().nodes[0].retry_refused is True
    assert "retry refused" in last["stock"].work_result.marks


def test_a_retry_within_the_budget_is_made_and_counted() -> None:
    backend = Down(failures=1)
    budget = RetryBudget("budget-flaky", ratio=0.5, min_per_second=1, window=10.0)
    node = FunctionNode(backend, name="stock", retries=2, retry_budget=budget)
    with ThreadPoolExecutor(1, thread_name_prefix="budget-flaky") as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.outputs == {"stock": "ok"} and result["stock"].work_result.attempts == 2
    m = budget.metrics()
    assert (m.attempts, m.retries, m.refused, m.returned) == (1, 1, 0, 0)
    assert not result["stock"].work_result.retry_refused


def test_a_token_for_a_retry_that_never_starts_is_given_back() -> None:
    backend = Down()
    budget = RetryBudget("budget-back", ratio=0.0, min_per_second=1, window=10.0)
    node = FunctionNode(backend, name="stock", retries=1, retry_backoff=MEDIUM,
                        retry_budget=budget)
    ctx = TaskContext()
    with ThreadPoolExecutor(1, thread_name_prefix="budget-back") as pool:
        future = TaskScheduling.submit(node, executor=pool, timeout=LONG, context=ctx)
        wait_until(lambda: budget.metrics().retries == 1)  # in its back-off, holding a token
        ctx.cancel("page closed")
        result = future.result(LONG)
    assert result["stock"].work_result.state is ResultState.CANCELLED
    assert backend.calls == 1
    wait_until(lambda: budget.metrics().returned == 1)
    assert budget.metrics().balance == 10.0  # the whole reserve again


def test_a_monitor_exports_the_retry_budget() -> None:
    budget = RetryBudget("budget-monitor", ratio=0.1, min_per_second=1)
    node = FunctionNode(Down(), name="stock", retries=1, retry_budget=budget)
    with ThreadPoolExecutor(1, thread_name_prefix="budget-monitor") as pool:
        TaskScheduling.start(node, executor=pool, timeout=LONG)
        with PoolMonitor(pool, interval=LONG, resilience=[budget]) as monitor:
            snap = monitor.sample()
            text = monitor.to_prometheus()
    (metrics,) = snap.resilience
    assert metrics.name == "budget-monitor" and metrics.attempts == 1 and metrics.retries == 1
    _, series = parse_prometheus(text)
    assert series[("taskflow_retry_budget_retries_total",
                   (("retry_budget", "budget-monitor"),))] == 1
