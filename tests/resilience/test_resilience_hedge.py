"""Hedge and the latency trackers it reads; HedgeRace decides which attempt's outcome counts."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resilience_helpers import run_threads

from taskflow.errors import FlowDefinitionError
from taskflow.resilience import Hedge, LatencyRegistry, LatencyTracker
from taskflow.resilience.hedge import HedgeRace, Verdict


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"after": 0}, "after must be a finite number of seconds > 0, got 0"),
        ({"after": -0.5}, "got -0.5"),
        ({"after": "p100"}, "after must be seconds > 0 or a percentile like 'p95', got 'p100'"),
        ({"after": "p0"}, "got 'p0'"),
        ({"after": "fast"}, "got 'fast'"),
        ({"after": 0.05, "max_extra": 0}, "max_extra must be an integer >= 1, got 0"),
        ({"after": "p95", "min_samples": 0}, "min_samples must be an integer >= 1, got 0"),
    ],
)
def test_invalid_hedge_options(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        Hedge(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith("hedge: ") and fragment in str(info.value)


def test_fixed_delay_ignores_history() -> None:
    assert Hedge(after=0.05).delay(None) == 0.05


def test_percentile_delay_hedges_from_the_first_calls() -> None:
    # before any duration: `initial` (none by default); before min_samples: the slowest so far;
    # then the percentile (uncapped here, to read it alone)
    hedge = Hedge(after="p95", min_samples=20, median_cap=None)
    tracker = LatencyTracker(size=100)
    assert hedge.delay(None) is None and hedge.delay(tracker) is None
    assert Hedge(after="p95", initial=0.05).delay(tracker) == 0.05
    tracker.record(0.02)
    assert hedge.delay(tracker) == 0.02  # one call known: the second one can be hedged
    for i in range(1, 19):
        tracker.record(i / 100)
    assert hedge.delay(tracker) == pytest.approx(0.18)  # 19 known: the slowest
    for i in range(19, 100):
        tracker.record(i / 100)
    assert hedge.delay(tracker) == pytest.approx(0.94)  # nearest rank of 0.01 .. 0.99


def test_a_percentile_hedge_waits_at_most_median_cap_times_the_median() -> None:
    # one call in ten slow: the 95th percentile is a slow call, and waiting for it rescues none
    tracker = LatencyTracker(size=200)
    for i in range(200):
        tracker.record(0.3 if i % 10 == 0 else 0.01)
    assert Hedge(after="p95", median_cap=None).delay(tracker) == 0.3
    assert Hedge(after="p95").delay(tracker) == pytest.approx(0.03)  # 3 x the 10 ms median
    assert Hedge(after="p95", median_cap=10).delay(tracker) == pytest.approx(0.1)
    healthy = LatencyTracker(size=100)
    for i in range(100):
        healthy.record(0.010 + i / 10000)  # 10-20 ms: the percentile is below the cap
    assert Hedge(after="p95").delay(healthy) == pytest.approx(0.0194)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"initial": 0}, "initial must be a finite number of seconds > 0, got 0"),
    ({"median_cap": 0.5}, "median_cap must be a number >= 1 or None, got 0.5"),
    ({"median_cap": True}, "got True"),
])
def test_invalid_warm_up_options(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(FlowDefinitionError, match="hedge: ") as info:
        Hedge(after="p95", **kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_tracker_keeps_only_the_most_recent_durations() -> None:
    tracker = LatencyTracker(size=4)
    for d in (10.0, 10.0, 10.0, 10.0, 1.0, 2.0, 3.0, 4.0):
        tracker.record(d)
    assert tracker.quantile(1.0) == 4.0
    assert tracker.median() == 2.0
    assert tracker.count == 8


def test_tracker_ignores_nonsense_and_checks_the_quantile() -> None:
    tracker = LatencyTracker()
    assert tracker.median() is None
    tracker.record(-1.0)
    tracker.record(float("nan"))
    tracker.record(float("inf"))
    assert tracker.count == 0
    with pytest.raises(ValueError, match="quantile must be in"):
        tracker.quantile(1.5)


def test_tracker_cache_follows_new_records() -> None:
    tracker = LatencyTracker(size=8)
    tracker.record(1.0)
    assert tracker.p95() == 1.0
    tracker.record(5.0)
    assert tracker.p95() == 5.0


def test_registry_drops_the_least_recently_used_key() -> None:
    registry = LatencyRegistry(max_keys=2, size=8)
    registry.record("a", 1.0)
    registry.record("b", 2.0)
    registry.tracker("a")  # a is now more recent than b
    registry.record("c", 3.0)
    assert registry.get("b") is None
    assert registry.median("a") == 1.0 and registry.median("c") == 3.0
    assert len(registry) == 2


def test_tracker_under_many_threads_loses_no_record() -> None:
    tracker = LatencyTracker(size=10_000)

    def body(i: int) -> None:
        for j in range(500):
            tracker.record(float(i))
            if j % 50 == 0:
                tracker.p95()

    run_threads(16, body)
    assert tracker.count == 8000
    assert tracker.quantile(1.0) == 15.0 and tracker.quantile(0.0) == 0.0


def test_first_success_wins_and_the_others_lose() -> None:
    race = HedgeRace(max_extra=2)
    assert race.launch() == 0
    assert race.launch() == 1
    assert race.settle(1, ok=True) is Verdict.WON
    assert race.running() == [0]  # the loser, to cancel
    assert race.launch() is None  # decided: no more hedges
    assert race.settle(0, ok=True) is Verdict.LOST
    assert (race.hedges, race.winner) == (1, 1)


def test_a_failure_waits_for_the_attempts_still_running() -> None:
    race = HedgeRace(max_extra=1)
    race.launch()
    race.launch()
    assert race.settle(0, ok=False) is Verdict.PENDING
    assert race.settle(1, ok=False) is Verdict.FAILED
    assert race.launch() is None


def test_the_primary_failing_before_any_hedge_ends_the_race() -> None:
    race = HedgeRace(max_extra=3)
    race.launch()
    assert race.settle(0, ok=False) is Verdict.FAILED
    assert race.launch() is None  # the hedge timer fires later and finds nothing to do
    assert race.hedges == 0


def test_settling_an_attempt_twice_is_a_bug() -> None:
    race = HedgeRace(max_extra=1)
    race.launch()
    race.settle(0, ok=True)
    with pytest.raises(RuntimeError, match="attempt 0 is not running"):
        race.settle(0, ok=True)


@settings(max_examples=300, deadline=None)
@given(max_extra=st.integers(0, 3), outcomes=st.lists(st.booleans(), max_size=8),
       data=st.data())
def test_a_race_has_at_most_one_winner_and_fails_only_when_every_attempt_failed(
    max_extra: int, outcomes: list[bool], data: st.DataObject,
) -> None:
    race = HedgeRace(max_extra=max_extra)
    running: list[int] = []
    verdicts: list[tuple[bool, Verdict]] = []
    for ok in outcomes:
        n = race.launch()
        if n is not None:
            running.append(n)
        if running and data.draw(st.booleans()):
            done = running.pop(data.draw(st.integers(0, len(running) - 1)))
            verdicts.append((ok, race.settle(done, ok)))
    assert race.hedges <= max_extra
    assert sum(v is Verdict.WON for _, v in verdicts) <= 1
    assert sum(v is Verdict.FAILED for _, v in verdicts) <= 1
    assert not any(v is Verdict.WON for _, v in verdicts) or not any(
        v is Verdict.FAILED for _, v in verdicts)
    for ok, v in verdicts:
        assert v is not Verdict.WON or ok


def test_concurrent_settles_pick_exactly_one_winner() -> None:
    race = HedgeRace(max_extra=15)
    attempts = [race.launch() for _ in range(16)]
    lock = threading.Lock()
    verdicts: list[Verdict] = []

    def body(i: int) -> None:
        n = attempts[i]
        assert n is not None
        v = race.settle(n, ok=True)
        with lock:
            verdicts.append(v)

    run_threads(16, body)
    assert verdicts.count(Verdict.WON) == 1 and verdicts.count(Verdict.LOST) == 15


def test_a_percentile_hedge_rescues_a_slow_call_while_its_window_warms_up() -> None:
    # the node's second call ever hangs: Hedge("p95") with 1 duration known duplicates it
    # after the slowest so far, and the duplicate answers (the window is far from full)
    from concurrent.futures import ThreadPoolExecutor

    from conftest import LONG, SHORT

    from taskflow import FunctionNode, TaskScheduling, clock
    from taskflow.testing import FakeClock

    release = threading.Event()
    calls = [0]
    lock = threading.Lock()

    def backend(ctx: object, param: object) -> str:
        with lock:
            calls[0] += 1
            n = calls[0]
        if n == 2:
            clock.wait(release, LONG)  # the slow call: held until the test ends
            return "late"
        clock.sleep(SHORT)  # on virtual time: the first call's known duration
        return f"call {n}"

    node = FunctionNode(backend, name="reco", hedge=Hedge(after="p95"), idempotent=True)
    try:
        with ThreadPoolExecutor(4, thread_name_prefix="hedge-warm") as pool:
            with FakeClock(autojump=True):
                first = TaskScheduling.start(node, executor=pool, timeout=LONG)
                second = TaskScheduling.start(node, executor=pool, timeout=LONG)
                release.set()
    finally:
        release.set()
    assert first.outputs["reco"] == "call 1" and first.result_of("reco").hedges == 0
    assert second.outputs["reco"] == "call 3" and second.result_of("reco").hedges == 1
    # the duplicate started after the slowest duration known (SHORT) and took SHORT itself
    assert second.elapsed == pytest.approx(2 * SHORT)
    assert calls[0] == 3
