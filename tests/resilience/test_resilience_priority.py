"""Dispatch order with resilience options: priority, then the longest remaining path."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import remote_tasks
from conftest import LONG

from taskflow import FunctionNode, TaskScheduling


def test_higher_priority_starts_first_when_workers_are_short():
    order = []

    def note(ctx, param):
        order.append(param)

    root = FunctionNode(note, param="root", name="root")
    sons = [FunctionNode(note, param=p, name=f"p{p}", priority=p) for p in (0, 5, 1, 3)]
    root >> sons
    with ThreadPoolExecutor(1) as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok
    assert order == ["root", 5, 3, 1, 0]


def test_longest_remaining_path_goes_first_among_equal_priorities():
    order = []

    def note(ctx, param):
        order.append(param)

    root = FunctionNode(note, param="root", name="root", min_budget=0)  # an option: ordered
    short = FunctionNode(note, param="short", name="short")
    long1 = FunctionNode(note, param="long1", name="long1")
    long2 = FunctionNode(note, param="long2", name="long2")
    long3 = FunctionNode(note, param="long3", name="long3")
    root >> short
    root >> long1 >> long2 >> long3
    with ThreadPoolExecutor(1) as pool:
        result = TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert result.ok
    assert order.index("long1") < order.index("short")


def test_plans_without_options_keep_fifo_order():
    order = []
    root = FunctionNode(lambda c, p: order.append("root"), name="root")
    sons = [FunctionNode(lambda c, p: order.append(p), param=k, name=f"s{k}") for k in range(4)]
    root >> sons
    with ThreadPoolExecutor(1) as pool:
        TaskScheduling.start(root, executor=pool, timeout=LONG)
    assert order == ["root", 0, 1, 2, 3]


def test_priority_orders_submissions_to_a_process_pool():
    nodes = [FunctionNode(remote_tasks.const, param=p, name=f"p{p}", priority=p)
             for p in (0, 2, 1)]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = TaskScheduling.start(nodes, executor=pool, timeout=LONG)
    assert result.ok
    started = sorted(result.values(), key=lambda n: n.work_result.started_at)
    assert [n.name for n in started] == ["p2", "p1", "p0"]
