"""The ``Batch`` primitive on its own: calls opened, filled, closed and run; seats answered or
left exactly once; bad options refused naming the batch. A hypothesis state machine drives
joins, leaves, window ends and calls in any order."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from conftest import parse_prometheus
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from resilience_helpers import FakeClock

from taskflow import (
    Batch,
    BatchCallError,
    BatchKeyError,
    BatchResultError,
    FlowDefinitionError,
    TaskflowError,
    UnhashableKeyError,
)
from taskflow.resilience.batch import CLOSED, DONE, OPEN

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)


class Answers:
    """A party: every answer a seat got, by tag."""

    def __init__(self) -> None:
        self.got: dict[Any, list[tuple[Any, BaseException | None]]] = {}

    def __call__(self, answers: list[Any]) -> None:
        for seat, value, error in answers:
            self.got.setdefault(seat.tag, []).append((value, error))


def doubling(log: list[list[Any]]) -> Any:
    def fn(keys: Any) -> dict[Any, Any]:
        log.append(list(keys))
        return {k: k * 2 for k in keys}
    return fn


# -- options --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "message"), [
    ({"max_size": 0}, "max_size must be an integer >= 1"),
    ({"max_size": 2.5}, "max_size must be an integer >= 1"),
    ({"window": -0.1}, "window must be a finite number of seconds >= 0"),
    ({"window": math.inf}, "window must be a finite number of seconds >= 0"),
    ({"across_runs": True}, "across_runs=True needs a window > 0"),
    ({"across_runs": "yes", "window": 0.1}, "across_runs must be True or False"),
    ({"key": "sku"}, "key must be callable as key(ctx, param)"),
    ({"key": lambda p: p}, "cannot be called as key(ctx, param)"),
])
def test_bad_options_are_refused_naming_the_batch(options: dict[str, Any], message: str) -> None:
    with pytest.raises(FlowDefinitionError, match=re.escape(message)) as info:
        Batch("prices", lambda keys: {}, **options)
    assert "batch 'prices'" in str(info.value)


def test_a_function_that_cannot_take_the_keys_is_refused() -> None:
    with pytest.raises(FlowDefinitionError, match=r"batch 'prices': fn .* cannot be called as fn\(keys\)"):
        Batch("prices", lambda: {})
    with pytest.raises(FlowDefinitionError, match="batch 'prices': fn must be callable"):
        Batch("prices", {"a": 1})  # type: ignore[arg-type]

    async def coro() -> dict[Any, Any]:
        return {}

    with pytest.raises(FlowDefinitionError, match=r"batch 'prices': fn .* cannot be called as fn\(keys\)"):
        Batch("prices", coro)  # an async one is checked the same way
    with pytest.raises(FlowDefinitionError, match="batch name must be a non-empty string"):
        Batch("", lambda keys: {})


# -- calls ----------------------------------------------------------------------------------------

def test_one_join_of_many_keys_makes_one_call_with_each_key_once() -> None:
    log: list[list[Any]] = []
    batch = Batch("prices", doubling(log))
    party = Answers()
    seats, closed, opened = batch.join("run", [(1, math.inf, "a"), (2, math.inf, "b"),
                                               (1, math.inf, "c")], party)
    assert opened == [] and len(closed) == 1 and closed[0].state == CLOSED
    assert batch.execute(closed[0], seats[0]) == (2, None)  # the runner's own answer
    assert log == [[1, 2]]
    assert party.got == {"b": [(4, None)], "c": [(2, None)]}
    m = batch.metrics()
    assert (m.calls, m.keys, m.largest, m.waiting, m.failed) == (1, 2, 2, 0, 0)


def test_more_keys_than_max_size_make_several_closed_calls() -> None:
    log: list[list[Any]] = []
    batch = Batch("prices", doubling(log), max_size=3)
    party = Answers()
    _, closed, _ = batch.join("run", [(k, math.inf, k) for k in range(7)], party)
    assert [len(c.keys) for c in closed] == [3, 3, 1]
    for call in closed:
        batch.execute(call)
    assert log == [[0, 1, 2], [3, 4, 5], [6]]
    assert sorted(party.got) == list(range(7))
    assert batch.metrics().largest == 3


def test_a_window_keeps_a_call_open_for_its_scope_until_closed_or_full() -> None:
    log: list[list[Any]] = []
    batch = Batch("prices", doubling(log), window=5.0, max_size=3)
    party = Answers()
    _, closed, opened = batch.join("run-1", [("a", math.inf, 1)], party)
    assert closed == [] and len(opened) == 1 and opened[0].state == OPEN
    # another scope opens a call of its own; the same scope joins the open one
    _, _, other = batch.join("run-2", [("x", math.inf, 9)], party)
    assert other[0] is not opened[0]
    _, closed, more = batch.join("run-1", [("b", math.inf, 2), ("c", math.inf, 3),
                                           ("d", math.inf, 4)], party)
    assert closed == [opened[0]] and len(closed[0].keys) == 3  # full: closed by this join
    assert len(more) == 1 and list(more[0].keys) == ["d"]  # the rest: a new open call
    assert batch.close(more[0]) is True and batch.close(more[0]) is False  # once
    batch.execute(closed[0])
    batch.execute(more[0])
    assert log == [["a", "b", "c"], ["d"]]
    assert batch.metrics().waiting == 1  # run-2's seat, its call still open


def test_a_seat_that_leaves_is_never_answered_and_its_key_not_sent() -> None:
    log: list[list[Any]] = []
    batch = Batch("prices", doubling(log))
    party = Answers()
    seats, closed, _ = batch.join("run", [(1, math.inf, "a"), (2, math.inf, "b"),
                                          (2, math.inf, "c")], party)
    assert batch.leave(seats[1]) is True and batch.leave(seats[1]) is False
    assert batch.execute(closed[0]) is None
    assert log == [[1, 2]]  # key 2 is still wanted by "c"
    assert set(party.got) == {"a", "c"}
    seats, closed, _ = batch.join("run", [(5, math.inf, "x")], party)
    batch.leave(seats[0])
    batch.execute(closed[0])
    assert log == [[1, 2]]  # nobody left to answer: no call
    m = batch.metrics()
    assert (m.calls, m.left, m.dropped, m.waiting) == (1, 2, 1, 0)


def test_a_seat_that_leaves_while_its_call_runs_gets_no_answer() -> None:
    batch = Batch("prices", lambda keys: (batch.leave(seats[1]), {k: k for k in keys})[1])
    party = Answers()
    seats, closed, _ = batch.join("run", [(1, math.inf, "a"), (2, math.inf, "b")], party)
    batch.execute(closed[0])
    assert party.got == {"a": [(1, None)]}


def test_the_time_limit_is_the_earliest_deadline_of_the_seats_still_waiting() -> None:
    clock = FakeClock()
    seen: list[Any] = []
    batch = Batch("prices", lambda keys: (seen.append((keys.timeout, keys.deadline,
                                                       keys.label)), {})[1], clock=clock)
    now = clock()
    seats, closed, _ = batch.join("run", [(1, now + 3.0, "a"), (2, now + 1.0, "b"),
                                          (3, math.inf, "c")], Answers())
    batch.leave(seats[1])  # the earliest leaves: the next one bounds the call
    clock.advance(0.5)
    batch.execute(closed[0])
    assert seen == [(2.5, now + 3.0, closed[0].label)]
    _, closed, _ = batch.join("run", [(4, math.inf, "d")], Answers())
    batch.execute(closed[0])
    assert seen[-1][:2] == (None, None)  # no budget: no limit


def test_a_missing_key_fails_its_seat_with_a_key_error_naming_the_key() -> None:
    batch = Batch("prices", lambda keys: {"sku-1": 1.5})
    party = Answers()
    _, closed, _ = batch.join("run", [("sku-1", math.inf, "a"), ("sku-9", math.inf, "b")],
                              party)
    batch.execute(closed[0])
    assert party.got["a"] == [(1.5, None)]
    (value, error), = party.got["b"]
    assert isinstance(error, BatchKeyError) and isinstance(error, KeyError)
    assert isinstance(error, TaskflowError) and error.key == "sku-9"
    assert str(error) == "batch 'prices' returned no value for key 'sku-9'"


def test_an_answer_that_is_no_mapping_fails_every_seat_naming_the_batch() -> None:
    batch = Batch("prices", lambda keys: [1, 2])
    party = Answers()
    _, closed, _ = batch.join("run", [(1, math.inf, "a"), (2, math.inf, "b")], party)
    batch.execute(closed[0])
    for tag in ("a", "b"):
        (_, error), = party.got[tag]
        assert isinstance(error, BatchResultError) and isinstance(error, TypeError)
        assert str(error) == ("batch 'prices': its function returned list, not a mapping of "
                              "key -> value")
    assert batch.metrics().failed == 1


def test_a_failed_call_fails_every_seat_with_the_cause_chained() -> None:
    boom = ConnectionError("price backend down")

    def fn(keys: Any) -> Any:
        raise boom

    batch = Batch("prices", fn)
    party = Answers()
    seats, closed, _ = batch.join("run", [(1, math.inf, "a"), (2, math.inf, "b")], party)
    own = batch.execute(closed[0], seats[0])
    assert own is not None
    errors = [own[1], party.got["b"][0][1]]
    for key, error in zip((1, 2), errors, strict=True):
        assert isinstance(error, BatchCallError) and error.__cause__ is boom
        assert error.key == key and "price backend down" in str(error)
    assert errors[0] is not errors[1]  # each seat has its own error, naming its key


def test_a_call_that_cannot_run_fails_its_seats_once() -> None:
    batch = Batch("prices", lambda keys: {k: k for k in keys})
    party = Answers()
    _, closed, _ = batch.join("run", [(1, math.inf, "a")], party)
    refused = RuntimeError("pool shut down")
    batch.fail(closed[0], refused)
    batch.fail(closed[0], refused)
    assert batch.execute(closed[0]) is None  # done: nothing runs
    (_, error), = party.got["a"]
    assert isinstance(error, BatchCallError) and error.__cause__ is refused
    assert closed[0].state == DONE and batch.metrics().calls == 0


def test_keys_must_be_hashable() -> None:
    batch = Batch("prices", lambda keys: {}, key=lambda ctx, p: p["skus"])
    with pytest.raises(UnhashableKeyError, match=r"node 'price' \(batch 'prices'\)"):
        batch.key_of(None, {"skus": ["a"]}, owner="node 'price'")
    assert batch.key_of(None, {"skus": "a"}, owner="node 'price'") == "a"


def test_metrics_export_as_prometheus_series_labelled_by_batch() -> None:
    batch = Batch("prices-export", lambda keys: {k: k for k in keys}, max_size=4)
    _, closed, _ = batch.join("run", [(k, math.inf, k) for k in range(6)], Answers())
    batch.execute(closed[0])
    types, series = parse_prometheus(batch.prometheus_lines())
    lab = (("batch", "prices-export"),)
    assert types["taskflow_batch_calls"] == "counter"
    assert series[("taskflow_batch_calls_total", lab)] == 1
    assert series[("taskflow_batch_keys_total", lab)] == 4
    assert series[("taskflow_batch_largest", lab)] == 4
    assert series[("taskflow_batch_waiting", lab)] == 2  # the second call not run yet
    assert series[("taskflow_batch_max_size", lab)] == 4


def test_a_pickled_batch_is_a_fresh_one_with_the_same_options() -> None:
    import pickle

    batch = Batch("prices-pickle", dict.fromkeys, max_size=7, window=0.25, across_runs=True)
    copy = pickle.loads(pickle.dumps(batch))
    assert (copy.name, copy.max_size, copy.window, copy.across_runs) == (
        "prices-pickle", 7, 0.25, True)
    assert copy.metrics().calls == 0


# -- any order of joins, leaves, window ends and calls ------------------------------------------------

class BatchMachine(RuleBasedStateMachine):
    """Seats join calls of two scopes, leave, windows end and closed calls run, in any order.
    Every seat is answered or leaves exactly once; a call gets at most ``max_size`` distinct
    keys, each wanted by a seat that had not left; no call runs twice; the metrics agree."""

    def __init__(self) -> None:
        super().__init__()
        self.max_size = 3
        self.sent: list[list[Any]] = []
        self.batch = Batch("machine", self.fn, max_size=self.max_size, window=1.0,
                           across_runs=True)
        self.answers = Answers()
        self.seats: list[Any] = []
        self.left: set[int] = set()
        self.closed: list[Any] = []  # calls whose duty we hold
        self.opened: list[Any] = []
        self.runs = 0

    def fn(self, keys: Any) -> dict[Any, Any]:
        self.sent.append(list(keys))
        waiting = {s.key for i, s in enumerate(self.seats) if i not in self.left
                   and s.label == keys.label}
        assert set(keys) <= waiting, "a key no waiting seat wants was sent"
        return {k: ("v", k) for k in keys if k != "missing"}

    @rule(scope=st.sampled_from(["a", None]),
          keys=st.lists(st.sampled_from(["k1", "k2", "k3", "k4", "missing"]), min_size=1,
                        max_size=5))
    def join(self, scope: Any, keys: list[str]) -> None:
        start = len(self.seats)
        seats, closed, opened = self.batch.join(
            scope, [(k, math.inf, start + n) for n, k in enumerate(keys)], self.answers)
        self.seats += seats
        self.closed += closed
        self.opened += opened

    @precondition(lambda self: len(self.left) < len(self.seats))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.seats) - 1))
        if self.batch.leave(self.seats[i]):
            self.left.add(i)

    @precondition(lambda self: self.opened)
    @rule(data=st.data())
    def window_ends(self, data: st.DataObject) -> None:
        call = self.opened.pop(data.draw(st.integers(0, len(self.opened) - 1)))
        if self.batch.close(call):
            self.closed.append(call)

    @precondition(lambda self: self.closed)
    @rule(data=st.data(), fail=st.booleans())
    def run_call(self, data: st.DataObject, fail: bool) -> None:
        call = self.closed.pop(data.draw(st.integers(0, len(self.closed) - 1)))
        if fail:
            self.batch.fail(call, RuntimeError("refused"))
        else:
            self.batch.execute(call)

    @invariant()
    def each_seat_is_answered_at_most_once_and_never_after_leaving(self) -> None:
        for tag, got in self.answers.got.items():
            assert len(got) == 1 and tag not in self.left

    @invariant()
    def calls_hold_at_most_max_size_distinct_keys(self) -> None:
        assert all(len(keys) == len(set(keys)) <= self.max_size for keys in self.sent)

    @invariant()
    def the_metrics_agree(self) -> None:
        m = self.batch.metrics()
        answered = len(self.answers.got)
        assert m.waiting == len(self.seats) - answered - len(self.left)
        assert m.left == len(self.left)
        assert m.calls == len(self.sent) and m.keys == sum(map(len, self.sent))

    def teardown(self) -> None:
        for call in self.opened:
            if self.batch.close(call):
                self.closed.append(call)
        for call in self.closed:
            self.batch.execute(call)
        # every seat ended exactly one way: an answer, or it left
        assert set(self.answers.got) | self.left == set(range(len(self.seats)))
        assert not set(self.answers.got) & self.left
        for tag, ((value, error),) in self.answers.got.items():
            key = self.seats[tag].key
            if error is None:
                assert value == ("v", key)
            else:
                assert isinstance(error, (BatchKeyError, BatchCallError)) and (
                    key == "missing" or isinstance(error, BatchCallError))
        assert self.batch.metrics().waiting == 0


TestBatchMachine = BatchMachine.TestCase
TestBatchMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
