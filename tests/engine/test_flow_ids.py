"""Flow ids: distinct per run, and a forked child draws its own prefix."""

from __future__ import annotations

import os

import pytest

from taskflow.engine import flowids


def test_flow_ids_are_twelve_hex_digits_and_distinct():
    ids = [flowids.new_flow_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_flow_ids():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(write, flowids.new_flow_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = flowids.new_flow_id()
    assert child[:6] != parent[:6]


def test_a_cached_plan_is_not_used_for_a_runs_copy_of_a_top_node():
    from concurrent.futures import ThreadPoolExecutor

    from taskflow import FunctionNode, TaskScheduling
    from taskflow.errors import InvalidNodeError

    a = FunctionNode(lambda ctx, p: 1, name="a")
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start([a], executor=pool, timeout=5)
        with pytest.raises(InvalidNodeError, match="run's copy"):
            TaskScheduling.start([result["a"]], executor=pool, timeout=5)
