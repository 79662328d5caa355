"""RateLimit: a token bucket served by reservations, so waiters hold no thread."""

from __future__ import annotations

import itertools
import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resilience_helpers import FakeClock, run_threads

from taskflow.errors import FlowDefinitionError
from taskflow.resilience import RateLimit
from taskflow.resilience.ratelimit import Reservation


def _within_bucket(times: list[float], rate: float, burst: int) -> bool:
    """Over every interval [a, b] at most burst + rate * (b - a) times fall."""
    times = sorted(times)
    for i in range(len(times)):
        for j in range(i, len(times)):
            if j - i + 1 > burst + rate * (times[j] - times[i]) + 1e-6:
                return False
    return True


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"per_second": 0}, "per_second must be a finite number of seconds > 0, got 0"),
        ({"per_second": -5}, "got -5"),
        ({"per_second": math.inf}, "got inf"),
        ({"per_second": math.nan}, "got nan"),
        ({"per_second": True}, "got True"),
        ({"per_second": 10, "burst": 0}, "burst must be an integer >= 1, got 0"),
        ({"per_second": 10, "burst": 2.5}, "got 2.5"),
    ],
)
def test_invalid_options_name_the_rate_limit(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        RateLimit("inventory", **kwargs)  # type: ignore[arg-type]
    assert "rate limit 'inventory'" in str(info.value) and fragment in str(info.value)


def test_default_burst_is_one_second_of_tokens() -> None:
    assert RateLimit("r", per_second=200).burst == 200
    assert RateLimit("r", per_second=0.5).burst == 1
    assert RateLimit("r", per_second=2.5).burst == 3


def test_burst_is_ready_now_and_the_rest_is_spaced_by_the_rate() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=10, burst=3, clock=clock)
    times = [limit.reserve() for _ in range(6)]
    assert all(isinstance(r, Reservation) for r in times)
    got = [r.ready_at - clock.now for r in times if r is not None]
    assert got == pytest.approx([0, 0, 0, 0.1, 0.2, 0.3])
    m = limit.metrics()
    assert (m.granted, m.waiting) == (6, 3)
    assert times[5] is not None and times[5].delay() == pytest.approx(0.3)


def test_reservation_past_the_deadline_is_refused_without_taking_a_token() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=10, burst=1, clock=clock)
    assert limit.reserve() is not None
    assert limit.reserve(deadline=clock.now + 0.05) is None  # the next token is 0.1s away
    assert limit.metrics().timed_out == 1
    nxt = limit.reserve(deadline=clock.now + 0.1)
    assert nxt is not None and nxt.ready_at == pytest.approx(clock.now + 0.1)


def test_try_take_and_next_token_at() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=4, burst=2, clock=clock)
    assert limit.next_token_at() == clock.now
    assert limit.try_take() and limit.try_take()
    assert not limit.try_take()
    assert limit.next_token_at() == pytest.approx(clock.now + 0.25)
    clock.advance(0.25)
    assert limit.try_take()
    assert limit.metrics().timed_out == 0


def test_reserve_now_takes_a_token_that_cancel_gives_back() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=4, burst=1, clock=clock)
    r = limit.reserve_now()
    assert r is not None and r.ready_at == clock.now
    assert limit.reserve_now() is None  # never a reservation for later
    assert r.cancel() is True  # the latest: its token is back
    assert limit.reserve_now() is not None
    m = limit.metrics()
    assert (m.granted, m.cancelled, m.timed_out, m.waiting) == (2, 1, 0, 0)


def test_a_quiet_period_refills_at_most_burst_tokens() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=100, burst=5, clock=clock)
    for _ in range(5):
        assert limit.try_take()
    clock.advance(3600)
    taken = sum(limit.try_take() for _ in range(50))
    assert taken == 5
    assert limit.metrics().tokens <= 5


def test_cancelling_the_latest_reservation_gives_its_token_back_exactly() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=10, burst=1, clock=clock)
    limit.reserve()
    second = limit.reserve()
    assert second is not None
    assert second.cancel() is True
    assert second.cancel() is False  # once
    third = limit.reserve()
    assert third is not None and third.ready_at == pytest.approx(second.ready_at)


def test_cancelling_an_earlier_reservation_loses_its_token_so_the_rate_holds() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=1, burst=1, clock=clock)
    first, second = limit.reserve(), limit.reserve()
    assert first is not None and second is not None
    assert first.cancel() is False
    third = limit.reserve()
    assert third is not None
    # without the rule both second and third would be ready at now + 1
    assert third.ready_at - second.ready_at == pytest.approx(1.0)
    assert limit.metrics().cancelled == 1


def test_waiting_counts_only_reservations_whose_time_has_not_come() -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=10, burst=1, clock=clock)
    rs = [limit.reserve() for _ in range(4)]
    assert limit.metrics().waiting == 3
    assert rs[2] is not None and rs[2].cancel() is False
    assert limit.metrics().waiting == 2
    clock.advance(0.15)
    assert limit.metrics().waiting == 1
    clock.advance(1.0)
    assert limit.metrics().waiting == 0


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.one_of(st.none(), st.floats(0.0, 2.0))),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("advance"), st.floats(0.0, 1.0)),
        st.tuples(st.just("try"), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.5, 50.0), burst=st.integers(1, 6), ops=_ops)
def test_starts_never_exceed_the_bucket(
    rate: float, burst: int, ops: list[tuple[str, object]],
) -> None:
    clock = FakeClock()
    limit = RateLimit("r", per_second=rate, burst=burst, clock=clock)
    made: list[tuple[float, Reservation]] = []
    taken: list[float] = []
    for op, arg in ops:
        if op == "reserve":
            deadline = None if arg is None else clock.now + float(arg)  # type: ignore[arg-type]
            r = limit.reserve(deadline=deadline)
            if r is not None:
                assert r.ready_at >= clock.now
                assert deadline is None or r.ready_at <= deadline
                made.append((clock.now, r))
        elif op == "cancel" and made:
            made[int(arg) % len(made)][1].cancel()  # type: ignore[call-overload]
        elif op == "advance":
            clock.advance(float(arg))  # type: ignore[arg-type]
        elif op == "try" and limit.try_take():
            taken.append(clock.now)
        assert limit.metrics().tokens <= burst + 1e-9
    live = [r.ready_at for _, r in made if not r.cancelled]
    assert _within_bucket(live + taken, rate, burst)
    # first come, first served: a later live reservation is never ready before an earlier one
    in_order = [r.ready_at for _, r in made if not r.cancelled]
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(in_order))


def test_many_threads_reserving_stay_within_the_bucket() -> None:
    limit = RateLimit("r", per_second=1000, burst=10)
    lock = threading.Lock()
    times: list[float] = []

    def body(_: int) -> None:
        for _ in range(50):
            r = limit.reserve()
            assert r is not None
            with lock:
                times.append(r.ready_at)

    run_threads(8, body)
    assert len(times) == 400
    assert limit.metrics().granted == 400
    assert _within_bucket(times, 1000, 10)
