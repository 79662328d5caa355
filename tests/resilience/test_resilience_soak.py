"""A CI-sized soak of the resilience options in the engine, after ``tests/engine/test_soak.py``.

Sixteen caller threads start one shared graph whose nodes use every option at once (a bulkhead
shared by two nodes, a breaker with a fallback and a node timeout, a rate limit with a hedge,
single flight across runs, priority and ``min_budget``) on one small shared pool, with random
faults (raises, slow calls past the node timeout) and random budgets. Invariants:

* ``start`` returns by its budget plus a generous slack;
* every node is terminal when the run returns, and the status agrees with ``failed``/``degraded``;
* a son whose father ended EXCEPTION/TIMEOUT without a fallback never runs;
* when everything has returned, every bulkhead slot and rate-limit waiter is given back
  (``in_use == 0``, ``waiting == 0``) and no thread is left behind.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import EPS

from taskflow import (
    Bulkhead,
    CircuitBreaker,
    FlowStatus,
    FunctionNode,
    Hedge,
    RateLimit,
    ResultState,
    TaskContext,
    TaskScheduling,
)

FAILED = (ResultState.EXCEPTION, ResultState.TIMEOUT)


def _graph(seed: int) -> tuple[tuple[FunctionNode, ...], Bulkhead, RateLimit]:
    rnd = random.Random(seed)
    lock = threading.Lock()

    def work(ctx: TaskContext, param: Any) -> int:
        with lock:
            r = rnd.random()
            pause = rnd.random() * 0.004
        if r < 0.15:
            raise ValueError("backend refused")
        time.sleep(0.08 if r < 0.25 else pause)
        return 1

    bulkhead = Bulkhead("soak-bulkhead", max_concurrent=3, max_waiting=4)
    breaker = CircuitBreaker("soak-breaker", failure_ratio=0.5, window=10, min_calls=5,
                             open_for=0.05, half_open_calls=1)
    limit = RateLimit("soak-limit", per_second=2000, burst=5)
    a = FunctionNode(work, name="a", bulkhead=bulkhead, fallback=0)
    b = FunctionNode(work, name="b", breaker=breaker, timeout=0.05,
                     fallback=lambda ctx, error: -1)
    c = FunctionNode(work, name="c", rate_limit=limit, hedge=Hedge(after=0.01), idempotent=True)
    d = FunctionNode(work, name="d", bulkhead=bulkhead,
                     share_key=lambda ctx, param: ("sku", ctx["sku"]))
    e = FunctionNode(work, name="e", priority=5, min_budget=0.01)
    sink = FunctionNode(lambda ctx, param: 0, name="sink")
    a >> [b, c]
    b >> d
    c >> d
    [d, e] >> sink
    return (a, e), bulkhead, limit


@pytest.mark.timeout(120)
def test_sixteen_callers_with_every_option_and_random_faults() -> None:
    tops, bulkhead, limit = _graph(seed=12)
    problems: list[Any] = []
    runs = [0]
    lock = threading.Lock()
    before = set(threading.enumerate())

    def caller(k: int, pool: ThreadPoolExecutor) -> None:
        rnd = random.Random(k)
        for _ in range(25):
            budget = rnd.choice((0.03, 0.1, 0.3))
            began = time.monotonic()
            result = TaskScheduling.start(tops, executor=pool, timeout=budget,
                                          context=TaskContext({"sku": rnd.randint(0, 3)}))
            took = time.monotonic() - began
            states = result.states()
            with lock:
                runs[0] += 1
                if took > budget + 4 * EPS:
                    problems.append(("late", took, budget))
                if len(states) != 6 or ResultState.DEFAULT in states.values():
                    problems.append(("not terminal", states))
                if result.status is FlowStatus.COMPLETED and (result.failed or result.degraded):
                    problems.append(("status", result.status, states))
                if states["sink"] is ResultState.SUCCESS and (
                        states["d"] in FAILED or states["e"] in FAILED):
                    problems.append(("a son ran on a failed father", states))
                result.report()  # renders whatever the run holds

    with ThreadPoolExecutor(8, thread_name_prefix="soak-pool") as pool:
        callers = [threading.Thread(target=caller, args=(k, pool)) for k in range(16)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
    # the pool has drained: every abandoned attempt has returned
    assert problems == []
    assert runs[0] == 16 * 25
    held = bulkhead.metrics()
    assert (held.in_use, held.waiting) == (0, 0)
    assert held.granted > 0
    assert limit.metrics().waiting == 0
    left = [t.name for t in set(threading.enumerate()) - before
            if t.is_alive() and not t.name.startswith("taskflow-")]
    assert left == []
