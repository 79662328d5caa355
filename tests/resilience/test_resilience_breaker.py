"""CircuitBreaker: closed -> open on a failure ratio, open fails at once, half-open trials."""

from __future__ import annotations

import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from resilience_helpers import FakeClock, run_threads

from taskflow.errors import FlowDefinitionError, TaskflowError
from taskflow.resilience import BreakerState, CircuitBreaker, CircuitOpenError
from taskflow.resilience.breaker import BreakerPermit


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"failure_ratio": 0}, "failure_ratio must be in (0, 1], got 0"),
        ({"failure_ratio": 1.5}, "failure_ratio must be in (0, 1], got 1.5"),
        ({"failure_ratio": -0.1}, "got -0.1"),
        ({"window": 0}, "window must be an integer >= 1, got 0"),
        ({"window": 5, "min_calls": 6}, "min_calls (6) must not exceed window (5)"),
        ({"min_calls": 0}, "min_calls must be an integer >= 1, got 0"),
        ({"open_for": 0}, "open_for must be a finite number of seconds > 0, got 0"),
        ({"open_for": -1.0}, "got -1.0"),
        ({"half_open_calls": 0}, "half_open_calls must be an integer >= 1, got 0"),
    ],
)
def test_invalid_options_name_the_breaker(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        CircuitBreaker("inventory", **kwargs)  # type: ignore[arg-type]
    assert "circuit breaker 'inventory'" in str(info.value) and fragment in str(info.value)


def _calls(breaker: CircuitBreaker, outcomes: str) -> None:
    for c in outcomes:
        breaker.record(breaker.allow(), c == "s")


def test_opens_when_the_failure_ratio_is_reached_over_at_least_min_calls() -> None:
    breaker = CircuitBreaker("b", failure_ratio=0.5, window=10, min_calls=4)
    _calls(breaker, "fff")
    assert breaker.state is BreakerState.CLOSED  # 3 calls < min_calls
    _calls(breaker, "s")
    assert breaker.state is BreakerState.OPEN  # 3 of 4 failed


def test_the_window_slides_so_old_failures_stop_counting() -> None:
    breaker = CircuitBreaker("b", failure_ratio=0.75, window=4, min_calls=4)
    _calls(breaker, "ffss")  # 2 of 4
    _calls(breaker, "sss")  # the window is now s s s s... never 3 failures of 4
    _calls(breaker, "ff")  # s s f f: 2 of 4
    assert breaker.state is BreakerState.CLOSED
    _calls(breaker, "f")  # s f f f: 3 of 4
    assert breaker.state is BreakerState.OPEN
    assert breaker.metrics().window_calls == 0  # a transition clears the window


def test_open_breaker_fails_at_once_and_says_when_it_retries() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("inventory", window=2, min_calls=2, open_for=5.0, clock=clock)
    _calls(breaker, "ff")
    clock.advance(2.0)
    with pytest.raises(CircuitOpenError) as info:
        breaker.allow()
    err = info.value
    assert isinstance(err, TaskflowError) and isinstance(err, RuntimeError)
    assert err.retry_in == pytest.approx(3.0)
    assert str(err) == "circuit breaker 'inventory' is open; next trial in 3s"
    assert breaker.metrics().rejected == 1


def test_half_open_trial_success_closes_and_failure_reopens() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", window=2, min_calls=2, open_for=1.0, half_open_calls=2,
                             clock=clock)
    _calls(breaker, "ff")
    clock.advance(1.0)
    assert breaker.state is BreakerState.HALF_OPEN
    t1, t2 = breaker.allow(), breaker.allow()
    assert t1.trial and t2.trial
    with pytest.raises(CircuitOpenError, match="half-open and its trial calls are taken"):
        breaker.allow()
    breaker.record(t1, True)
    assert breaker.state is BreakerState.HALF_OPEN  # both trials must succeed
    breaker.record(t2, True)
    assert breaker.state is BreakerState.CLOSED

    _calls(breaker, "ff")
    clock.advance(1.0)
    trial = breaker.allow()
    breaker.record(trial, False)
    assert breaker.state is BreakerState.OPEN
    assert breaker.metrics().transitions == {
        "closed->open": 2, "open->half_open": 2, "half_open->closed": 1, "half_open->open": 1,
    }


def test_a_discarded_trial_frees_its_slot() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", window=1, min_calls=1, open_for=1.0, clock=clock)
    _calls(breaker, "f")
    clock.advance(1.0)
    trial = breaker.allow()
    with pytest.raises(CircuitOpenError):
        breaker.allow()
    breaker.discard(trial)
    breaker.record(trial, False)  # discarded: no longer counts
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.record(breaker.allow(), True)
    assert breaker.state is BreakerState.CLOSED


def test_renew_keeps_a_permit_until_the_breaker_moves() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", window=1, min_calls=1, open_for=1.0, clock=clock)
    waited = breaker.allow()  # a node waits for a slot with it
    assert breaker.renew(waited) is waited
    _calls(breaker, "f")  # meanwhile another call fails: open
    with pytest.raises(CircuitOpenError, match="is open"):
        breaker.renew(waited)  # the node must not start now
    assert breaker.record(waited, True) is False  # the stale permit counts for nothing
    clock.advance(1.0)
    trial = breaker.renew(breaker.allow())
    assert trial.trial and breaker.metrics().trials_running == 1
    with pytest.raises(CircuitOpenError, match="trial calls are taken"):
        breaker.renew(waited)  # half-open with its one trial out: refused like allow()


def test_renew_after_a_move_issues_a_fresh_permit_that_counts() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", window=1, min_calls=1, open_for=1.0, half_open_calls=2,
                             clock=clock)
    waited = breaker.allow()
    _calls(breaker, "f")
    clock.advance(1.0)  # half-open: two trials
    fresh = breaker.renew(waited)
    assert fresh is not waited and fresh.trial and waited.done
    assert breaker.metrics().trials_running == 1
    assert breaker.record(fresh, True) is True
    assert breaker.metrics().trials_running == 0
    discarded = breaker.allow()
    breaker.discard(discarded)
    again = breaker.renew(discarded)  # given back meanwhile: a new permit, or none
    assert again is not discarded and breaker.metrics().trials_running == 1


def test_a_permit_counts_once_and_stale_permits_are_ignored() -> None:
    breaker = CircuitBreaker("b", window=2, min_calls=2)
    old = breaker.allow()
    p = breaker.allow()
    assert breaker.record(p, False) is True
    assert breaker.record(p, False) is False  # a timeout, then the abandoned attempt's result
    _calls(breaker, "f")
    assert breaker.state is BreakerState.OPEN
    assert breaker.record(old, True) is False  # issued while closed: says nothing now
    m = breaker.metrics()
    assert (m.failures, m.successes, m.ignored) == (2, 0, 2)


def test_transitions_are_logged_with_the_breaker_bound(
    taskflow_logs: list[dict[str, object]],
) -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("inventory", window=1, min_calls=1, open_for=1.0, clock=clock)
    _calls(breaker, "f")
    clock.advance(1.0)
    _calls(breaker, "s")
    moves = [
        (r["level"].name, r["message"], r["extra"].get("breaker"))  # type: ignore[attr-defined]
        for r in taskflow_logs
    ]
    assert moves == [
        ("WARNING", "circuit breaker 'inventory': closed -> open (1 of the last 1 calls failed)",
         "inventory"),
        ("INFO", "circuit breaker 'inventory': open -> half_open (1s passed)", "inventory"),
        ("INFO", "circuit breaker 'inventory': half_open -> closed (1 trial call(s) succeeded)",
         "inventory"),
    ]


def test_many_threads_keep_the_counts_consistent() -> None:
    breaker = CircuitBreaker("b", failure_ratio=0.5, window=20, min_calls=10, open_for=1e-4)
    lock = threading.Lock()
    allowed = rejected = counted = 0

    def body(i: int) -> None:
        nonlocal allowed, rejected, counted
        for j in range(300):
            try:
                permit = breaker.allow()
            except CircuitOpenError:
                with lock:
                    rejected += 1
                continue
            ok = breaker.record(permit, (i + j) % 3 != 0)
            with lock:
                allowed += 1
                counted += ok

    run_threads(12, body)
    m = breaker.metrics()
    assert allowed + rejected == 12 * 300
    assert m.rejected == rejected
    assert m.successes + m.failures == counted
    assert m.successes + m.failures + m.ignored == allowed


class _Model:
    """The breaker's rules written out plainly."""

    def __init__(self, ratio: float, window: int, min_calls: int, open_for: float,
                 trials: int) -> None:
        self.ratio, self.window, self.min_calls = ratio, window, min_calls
        self.open_for, self.trials = open_for, trials
        self.state = "closed"
        self.outcomes: list[bool] = []  # True = failure
        self.opened_at = 0.0
        self.out = 0
        self.ok = 0
        self.epoch = 0

    def go(self, state: str, now: float) -> None:
        self.state, self.outcomes, self.out, self.ok = state, [], 0, 0
        self.epoch += 1
        if state == "open":
            self.opened_at = now

    def tick(self, now: float) -> None:
        if self.state == "open" and now - self.opened_at >= self.open_for:
            self.go("half_open", now)

    def allow(self, now: float) -> tuple[int, bool] | None:
        self.tick(now)
        if self.state == "closed":
            return (self.epoch, False)
        if self.state == "half_open" and self.out < self.trials:
            self.out += 1
            return (self.epoch, True)
        return None

    def record(self, permit: tuple[int, bool], success: bool, now: float) -> None:
        if permit[0] != self.epoch:
            return
        if self.state == "closed":
            self.outcomes = (self.outcomes + [not success])[-self.window:]
            n = len(self.outcomes)
            if n >= self.min_calls and sum(self.outcomes) / n >= self.ratio:
                self.go("open", now)
        elif not success:
            self.go("open", now)
        else:
            self.ok += 1
            if self.ok == self.trials:
                self.go("closed", now)

    def discard(self, permit: tuple[int, bool]) -> None:
        if permit[1] and permit[0] == self.epoch and self.state == "half_open":
            self.out -= 1


class BreakerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.breaker: CircuitBreaker | None = None
        self.model: _Model | None = None
        self.permits: list[tuple[BreakerPermit, tuple[int, bool]]] = []

    @precondition(lambda self: self.breaker is None)
    @rule(ratio=st.sampled_from([0.2, 0.5, 2 / 3, 1.0]), window=st.integers(1, 6),
          data=st.data(), trials=st.integers(1, 3))
    def build(self, ratio: float, window: int, data: st.DataObject, trials: int) -> None:
        min_calls = data.draw(st.integers(1, window))
        self.breaker = CircuitBreaker("m", failure_ratio=ratio, window=window,
                                      min_calls=min_calls, open_for=1.0,
                                      half_open_calls=trials, clock=self.clock)
        self.model = _Model(ratio, window, min_calls, 1.0, trials)

    @precondition(lambda self: self.breaker is not None)
    @rule()
    def allow(self) -> None:
        assert self.breaker is not None and self.model is not None
        expected = self.model.allow(self.clock.now)
        try:
            permit = self.breaker.allow()
        except CircuitOpenError:
            assert expected is None
            return
        assert expected is not None and permit.trial == expected[1]
        self.permits.append((permit, expected))

    @precondition(lambda self: self.permits)
    @rule(data=st.data(), success=st.booleans(), discard=st.booleans())
    def finish(self, data: st.DataObject, success: bool, discard: bool) -> None:
        assert self.breaker is not None and self.model is not None
        permit, mine = self.permits.pop(data.draw(st.integers(0, len(self.permits) - 1)))
        if discard:
            self.breaker.discard(permit)
            self.model.discard(mine)
        else:
            self.breaker.record(permit, success)
            self.model.record(mine, success, self.clock.now)

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 2.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def same_state(self) -> None:
        if self.breaker is not None and self.model is not None:
            self.model.tick(self.clock.now)
            assert self.breaker.state.value == self.model.state


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
