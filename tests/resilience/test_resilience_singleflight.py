"""SingleFlight: one call per key among concurrent runs, shared outcomes, a bounded TTL cache."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resilience_helpers import FakeClock, run_threads

from taskflow.errors import FlowDefinitionError, TaskflowError
from taskflow.resilience import SingleFlight, UnhashableKeyError
from taskflow.resilience.singleflight import Member, Outcome, check_share_key, share_key_of


class Inbox:
    """Collects the outcomes delivered to one member."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def __call__(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"cache_ttl": 0}, "cache_ttl must be a finite number of seconds > 0, got 0"),
        ({"cache_ttl": -1}, "got -1"),
        ({"cache_size": 0}, "cache_size must be an integer >= 1, got 0"),
    ],
)
def test_invalid_options_name_the_single_flight(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(FlowDefinitionError) as info:
        SingleFlight("stock", **kwargs)  # type: ignore[arg-type]
    assert "single flight 'stock'" in str(info.value) and fragment in str(info.value)


def test_unhashable_key_is_a_clear_type_error() -> None:
    flight = SingleFlight("stock")
    with pytest.raises(UnhashableKeyError) as info:
        flight.join(("stock", ["sku-1"]), Inbox())
    assert isinstance(info.value, TypeError) and isinstance(info.value, TaskflowError)
    assert str(info.value).startswith(
        "single flight 'stock': share key ('stock', ['sku-1']) is not hashable"
    )


def test_share_key_of_names_the_node_when_the_key_is_unhashable() -> None:
    ctx = {"sku": "sku-1"}
    assert share_key_of(lambda c, p: ("stock", c["sku"], p), ctx, 3, node="stock") == (
        "stock", "sku-1", 3)
    with pytest.raises(UnhashableKeyError) as info:
        share_key_of(lambda c, p: {"sku": c["sku"]}, ctx, None, node="stock")
    assert str(info.value) == (
        "node 'stock': share key {'sku': 'sku-1'} is not hashable (dict);"
        " return a tuple of strings or numbers"
    )
    with pytest.raises(KeyError):  # share_key's own error is the node's failure, unchanged
        share_key_of(lambda c, p: c["missing"], ctx, None, node="stock")


def test_check_share_key_refuses_what_cannot_take_ctx_and_param() -> None:
    check_share_key(lambda ctx, param: "k", node="stock")
    check_share_key(print, node="stock")  # *args
    with pytest.raises(FlowDefinitionError, match=r"node 'stock': share_key must be callable"):
        check_share_key("sku", node="stock")
    with pytest.raises(FlowDefinitionError, match=r"cannot be called as share_key\(ctx, param\)"):
        check_share_key(lambda ctx: "k", node="stock")


def test_concurrent_joins_of_one_key_make_one_call_and_all_get_the_value() -> None:
    flight = SingleFlight("stock")
    n = 32
    inboxes = [Inbox() for _ in range(n)]
    members: list[Member | None] = [None] * n
    all_joined = threading.Barrier(n)

    def body(i: int) -> None:
        members[i] = flight.join(("stock", "sku-1"), inboxes[i])
        all_joined.wait()
        m = members[i]
        assert m is not None
        if m.leader:
            m.call.set_result({"in_stock": 3})

    run_threads(n, body)
    leaders = [i for i, m in enumerate(members) if m is not None and m.leader]
    assert len(leaders) == 1
    assert flight.metrics().calls == 1
    for i, inbox in enumerate(inboxes):
        assert [o.value for o in inbox.outcomes] == [{"in_stock": 3}], i
    assert flight.metrics().in_flight == 0


def test_the_error_is_shared_by_every_member() -> None:
    flight = SingleFlight()
    a, b, c = Inbox(), Inbox(), Inbox()
    lead = flight.join("k", a)
    flight.join("k", b)
    flight.join("k", c)
    boom = ConnectionError("backend down")
    assert lead.call.set_exception(boom) is True
    assert [o.error for o in a.outcomes + b.outcomes + c.outcomes] == [boom, boom, boom]
    with pytest.raises(ConnectionError):
        lead.call.result()
    assert lead.call.set_result(1) is False  # resolved once


def test_a_joiner_leaving_early_does_not_affect_the_others() -> None:
    flight = SingleFlight()
    a, b, c = Inbox(), Inbox(), Inbox()
    lead = flight.join("k", a)
    quitter = flight.join("k", b)
    stayer = flight.join("k", c)
    assert quitter.leave() is True
    assert flight.metrics().waiting == 1
    lead.call.set_result(7)
    assert b.outcomes == []
    assert [o.value for o in a.outcomes] == [7] and [o.value for o in c.outcomes] == [7]
    assert stayer.leave() is False  # already delivered
    assert flight.metrics().left == 1


def test_the_leaders_run_leaving_does_not_stop_its_attempt_resolving_the_others() -> None:
    flight = SingleFlight()
    a, b = Inbox(), Inbox()
    lead = flight.join("k", a)
    flight.join("k", b)
    lead.leave()  # its run timed out; the abandoned attempt still returns
    lead.call.set_result("late but useful")
    assert a.outcomes == [] and [o.value for o in b.outcomes] == ["late but useful"]


def test_a_resigning_leader_promotes_the_oldest_waiter() -> None:
    flight = SingleFlight()
    a, b, c = Inbox(), Inbox(), Inbox()
    lead = flight.join("k", a)
    gone = flight.join("k", b)
    heir = flight.join("k", c)
    gone.leave()
    lead.resign()  # it never started: its run ended while waiting for a bulkhead slot
    assert len(c.outcomes) == 1 and c.outcomes[0].promoted and not c.outcomes[0].ok
    assert heir.leader and not lead.leader
    latecomer = Inbox()
    flight.join("k", latecomer)
    heir.call.set_result(5)
    assert [o.value for o in latecomer.outcomes] == [5]
    assert a.outcomes == [] and b.outcomes == []
    assert flight.metrics().calls == 2  # the promoted member started a second attempt


def test_resigning_with_nobody_waiting_lets_the_next_join_lead() -> None:
    flight = SingleFlight()
    lead = flight.join("k", Inbox())
    lead.resign()
    assert flight.metrics().in_flight == 0
    assert flight.join("k", Inbox()).leader


def test_withdraw_resigns_a_leader_and_makes_a_waiter_leave() -> None:
    flight = SingleFlight()
    a, b, c = Inbox(), Inbox(), Inbox()
    lead = flight.join("k", a)
    waiter = flight.join("k", b)
    heir = flight.join("k", c)
    waiter.withdraw()  # its run ended while it waited
    lead.withdraw()  # its run ended before its attempt started
    assert heir.leader and [o.promoted for o in c.outcomes] == [True]
    assert a.outcomes == [] and b.outcomes == []
    heir.withdraw()
    assert flight.metrics().in_flight == 0 and flight.join("k", Inbox()).leader


@pytest.mark.parametrize("resign_first", [True, False])
def test_a_waiter_withdrawing_as_the_leader_resigns_never_ends_up_leading(
        resign_first: bool) -> None:
    flight = SingleFlight()
    lead = flight.join("k", Inbox())
    quitter = flight.join("k", Inbox())
    inbox = Inbox()
    stayer = flight.join("k", inbox)
    steps = [lead.resign, quitter.withdraw]  # resign first: the quitter was promoted
    for step in steps if resign_first else steps[::-1]:
        step()
    # either way, the one member that still wants the call leads it
    assert stayer.leader and not quitter.leader and flight.metrics().in_flight == 1
    assert [o.promoted for o in inbox.outcomes] == [True]


def test_a_cache_hit_says_so() -> None:
    flight = SingleFlight(cache_ttl=60.0)
    first = flight.join("k", Inbox())
    assert not first.cached
    first.call.set_result(1)
    assert flight.join("k", Inbox()).cached


def test_members_unpack_as_leader_and_call() -> None:
    flight = SingleFlight()
    leader, call = flight.join("k", Inbox())
    assert leader is True and not call.done()


def test_cache_serves_a_success_until_its_ttl_passes() -> None:
    clock = FakeClock()
    flight = SingleFlight(cache_ttl=10.0, clock=clock)
    flight.join("k", Inbox()).call.set_result("v1")
    inbox = Inbox()
    hit = flight.join("k", inbox)
    assert not hit.leader and hit.call.done() and hit.call.result() == "v1"
    assert inbox.outcomes == []  # a cached value is read now, not called back
    clock.advance(10.0)
    assert flight.join("k", Inbox()).leader
    m = flight.metrics()
    assert (m.cache_hits, m.calls) == (1, 2)


def test_errors_are_not_cached() -> None:
    flight = SingleFlight(cache_ttl=60.0)
    flight.join("k", Inbox()).call.set_exception(TimeoutError())
    assert flight.join("k", Inbox()).leader


def test_the_cache_is_a_bounded_lru() -> None:
    flight = SingleFlight(cache_ttl=60.0, cache_size=2)
    for key in ("a", "b"):
        flight.join(key, Inbox()).call.set_result(key)
    assert flight.join("a", Inbox()).call.done()  # touch a: b is now least recent
    flight.join("c", Inbox()).call.set_result("c")
    assert flight.metrics().cached == 2
    assert flight.join("b", Inbox()).leader
    assert flight.join("a", Inbox()).call.done()


def test_a_delivery_that_raises_does_not_stop_the_others(
    taskflow_logs: list[dict[str, object]],
) -> None:
    flight = SingleFlight()
    lead = flight.join("k", Inbox())

    def broken(outcome: Outcome) -> None:
        raise RuntimeError("engine bug")

    flight.join("k", broken)
    after = Inbox()
    flight.join("k", after)
    lead.call.set_result(1)
    assert [o.value for o in after.outcomes] == [1]
    assert any("raised" in str(r["message"]) for r in taskflow_logs)


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from("xy")),
        st.tuples(st.just("leave"), st.integers(0, 30)),
        st.tuples(st.just("resign"), st.integers(0, 30)),
        st.tuples(st.just("ok"), st.integers(0, 30)),
        st.tuples(st.just("error"), st.integers(0, 30)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps=_steps)
def test_every_member_gets_its_calls_outcome_once_unless_it_left(
    steps: list[tuple[str, object]],
) -> None:
    flight = SingleFlight()
    members: list[tuple[Member, Inbox]] = []
    # the model: per member, whether it still wants an outcome and what it should receive
    wants: list[bool] = []
    expected: list[list[str]] = []
    pending: dict[str, list[int]] = {}  # key -> [leader or -1, waiters...] of the pending call
    key_of: list[str] = []
    call_of: list[int] = []  # member -> model call number
    resolved: set[int] = set()
    calls = 0
    for op, arg in steps:
        if op == "join":
            key = str(arg)
            inbox = Inbox()
            member = flight.join(key, inbox)
            members.append((member, inbox))
            key_of.append(key)
            wants.append(True)
            expected.append([])
            i = len(members) - 1
            if key in pending:
                assert not member.leader
                pending[key].append(i)
                call_of.append(call_of[pending[key][0]] if pending[key][0] >= 0 else
                               call_of[pending[key][1]])
            else:
                assert member.leader
                pending[key] = [i]
                call_of.append(calls)
                calls += 1
            continue
        if not members:
            continue
        i = int(arg) % len(members)  # type: ignore[call-overload]
        member, _ = members[i]
        key = key_of[i]
        group = pending.get(key) if call_of[i] not in resolved else None
        if op == "leave":
            assert member.leave() == wants[i]
            if wants[i] and group is not None and i in group[1:]:
                group.remove(i)
            wants[i] = False
        elif op == "resign":
            member.resign()
            if group is not None and group[0] == i:
                wants[i] = False
                if len(group) > 1:
                    heir = group.pop(1)
                    group[0] = heir
                    expected[heir].append("promoted")
                else:
                    del pending[key]
                    resolved.add(call_of[i])  # dropped: a later join starts a new call
        else:
            done = member.call.done()
            if op == "ok":
                assert member.call.set_result(f"v{call_of[i]}") == (not done)
            else:
                assert member.call.set_exception(ValueError(f"e{call_of[i]}")) == (not done)
            if group is not None and not done:
                for j in group:
                    if j >= 0 and wants[j]:
                        expected[j].append(("v" if op == "ok" else "e") + str(call_of[i]))
                        wants[j] = False
                del pending[key]
                resolved.add(call_of[i])
    for i, (_, inbox) in enumerate(members):
        got = [
            "promoted" if o.promoted else (f"v{o.value[1:]}" if o.error is None
                                           else f"e{o.error.args[0][1:]}")
            for o in inbox.outcomes
        ]
        assert got == expected[i], i
    assert flight.metrics().calls == calls + sum(e.count("promoted") for e in expected)


def test_leaving_while_the_call_resolves_gives_each_member_exactly_one_ending() -> None:
    flight = SingleFlight()
    n = 24
    for _ in range(10):
        lead = flight.join("k", Inbox())
        inboxes = [Inbox() for _ in range(n)]
        members = [flight.join("k", inbox) for inbox in inboxes]
        left = [False] * n

        def body(i: int, members: list[Member] = members, left: list[bool] = left,
                 lead: Member = lead) -> None:
            if i == n:
                lead.call.set_result("v")
            else:
                left[i] = members[i].leave()

        run_threads(n + 1, body)
        for i, inbox in enumerate(inboxes):
            assert len(inbox.outcomes) + left[i] == 1, i
        assert flight.metrics().in_flight == 0
