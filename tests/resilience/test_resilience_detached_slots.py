"""The process-wide bound on detached work: slots taken and given back, refusals counted."""

from __future__ import annotations

import os
import threading

import pytest

import taskflow
from taskflow.errors import FlowDefinitionError
from taskflow.resilience.detached import DetachedSlots

pytestmark = pytest.mark.timeout(30)


def test_slots_past_the_limit_are_refused_and_counted() -> None:
    slots = DetachedSlots(limit=2)
    assert slots.try_enter() and slots.try_enter()
    assert not slots.try_enter()
    slots.leave(ok=True)
    assert slots.try_enter()
    slots.leave(ok=False)
    m = slots.metrics()
    assert (m.running, m.started, m.refused, m.succeeded, m.failed) == (1, 3, 1, 1, 1)


def test_lowering_the_limit_refuses_new_work_and_keeps_running_work() -> None:
    slots = DetachedSlots(limit=3)
    for _ in range(3):
        assert slots.try_enter()
    slots.set_limit(1)
    assert not slots.try_enter()
    slots.leave()
    slots.leave()
    assert not slots.try_enter()  # one still held, the limit is one
    slots.leave()
    assert slots.try_enter()


def test_a_slot_given_back_twice_is_a_bug_not_a_negative_count() -> None:
    slots = DetachedSlots()
    with pytest.raises(RuntimeError, match="twice"):
        slots.leave()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_set_max_detached_refuses_a_bad_bound_naming_it(bad: object) -> None:
    with pytest.raises(FlowDefinitionError, match="set_max_detached"):
        taskflow.set_max_detached(bad)  # type: ignore[arg-type]


def test_set_max_detached_sets_the_process_bound() -> None:
    from taskflow.resilience import detached
    before = detached.max_detached()
    try:
        taskflow.set_max_detached(5)
        assert detached.max_detached() == 5 == detached.metrics().limit
    finally:
        taskflow.set_max_detached(before)


def test_concurrent_takers_never_hold_more_than_the_limit() -> None:
    slots = DetachedSlots(limit=4)
    held = []
    peak = []
    lock = threading.Lock()
    go = threading.Event()

    def worker() -> None:
        go.wait()
        for _ in range(500):
            if slots.try_enter():
                with lock:
                    held.append(1)
                    peak.append(len(held))
                with lock:
                    held.pop()
                slots.leave()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    m = slots.metrics()
    assert max(peak) <= 4 and m.running == 0
    assert m.started + m.refused == 8 * 500


def test_prometheus_lines_name_every_figure() -> None:
    text = DetachedSlots(limit=3).prometheus_lines()
    for family in ("detached_limit", "detached_running", "detached_refused_total"):
        assert f"taskflow_{family}" in text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_holds_none_of_the_parents_slots() -> None:
    from taskflow.resilience import detached
    assert detached.try_enter()
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.write(w, str(detached.metrics().running).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 16) == b"0"
    finally:
        detached.leave()
