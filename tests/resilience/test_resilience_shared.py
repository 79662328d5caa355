"""Single flight (share_key, cache_ttl) and hedged attempts in runs."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import LONG, MEDIUM, SHORT
from resilience_helpers import wait_until

from taskflow import FunctionNode, Hedge, ResultState, TaskContext, TaskScheduling


class Backend:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, ctx, param):
        with self.lock:
            self.calls += 1
        self.release.wait(LONG)
        if self.fail:
            raise ValueError("stock backend down")
        return {"sku": ctx["sku"], "stock": 7}


def stock_node(backend, **options):
    return FunctionNode(backend, name="stock", share_key=lambda ctx, p: ("stock", ctx["sku"]),
                        **options)


def test_32_concurrent_requests_for_one_key_make_one_backend_call():
    backend = Backend()
    node = stock_node(backend)
    with ThreadPoolExecutor(4, thread_name_prefix="res-sf") as pool:
        futures = [TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                         context=TaskContext(sku="k1")) for _ in range(32)]
        flight = node._policy.flight
        wait_until(lambda: flight.metrics().waiting == 31)  # 31 wait, holding no worker
        backend.release.set()
        results = [f.result(LONG) for f in futures]
    assert backend.calls == 1
    assert all(r.outputs == {"stock": {"sku": "k1", "stock": 7}} for r in results)
    assert sum(r.result_of("stock").shared for r in results) == 31


def test_shared_error_reaches_every_run_and_each_applies_its_own_fallback():
    backend = Backend(fail=True)
    node = stock_node(backend)
    with ThreadPoolExecutor(3) as pool:
        first = TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                      context=TaskContext(sku="k2"))
        wait_until(lambda: backend.calls == 1)
        others = [TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                        context=TaskContext(sku="k2")) for _ in range(3)]
        wait_until(lambda: node._policy.flight.metrics().waiting == 3)
        backend.release.set()
        results = [first.result(LONG)] + [f.result(LONG) for f in others]
    errors = {id(r.result_of("stock").exception) for r in results}
    assert backend.calls == 1 and len(errors) == 1
    assert all(r.result_of("stock").state is ResultState.EXCEPTION for r in results)


def test_a_joiner_waits_only_within_its_own_budget():
    backend = Backend()
    node = stock_node(backend)
    with ThreadPoolExecutor(3) as pool:
        leader = TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                       context=TaskContext(sku="k3"))
        wait_until(lambda: backend.calls == 1)
        hurried = TaskScheduling.start(node, executor=pool, timeout=SHORT,
                                       context=TaskContext(sku="k3"))
        patient = TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                        context=TaskContext(sku="k3"))
        wait_until(lambda: node._policy.flight.metrics().waiting == 1)
        backend.release.set()
        assert leader.result(LONG).ok and patient.result(LONG).ok
    wr = hurried.result_of("stock")
    assert wr.state is ResultState.TIMEOUT and wr.attempts == 0
    assert backend.calls == 1


def test_an_abandoned_leader_still_serves_the_runs_that_wait():
    backend = Backend()
    node = stock_node(backend)
    with ThreadPoolExecutor(3) as pool:
        leader = TaskScheduling.submit(node, executor=pool, timeout=SHORT,
                                       context=TaskContext(sku="k4"))
        wait_until(lambda: backend.calls == 1)
        joiner = TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                       context=TaskContext(sku="k4"))
        assert leader.result(LONG).result_of("stock").state is ResultState.TIMEOUT
        backend.release.set()
        result = joiner.result(LONG)
    assert result.ok and result.result_of("stock").shared and backend.calls == 1


def test_cache_ttl_serves_a_later_run_without_a_call():
    backend = Backend()
    backend.release.set()
    node = stock_node(backend, cache_ttl=LONG)
    with ThreadPoolExecutor(2) as pool:
        first = TaskScheduling.start(node, executor=pool, timeout=LONG,
                                     context=TaskContext(sku="k5"))
        second = TaskScheduling.start(node, executor=pool, timeout=LONG,
                                      context=TaskContext(sku="k5"))
        other = TaskScheduling.start(node, executor=pool, timeout=LONG,
                                     context=TaskContext(sku="k6"))
    assert first.outputs == second.outputs and backend.calls == 2
    assert second.result_of("stock").shared and not first.result_of("stock").shared
    assert other.outputs["stock"]["sku"] == "k6"


def test_unhashable_share_key_fails_the_node_naming_it():
    node = FunctionNode(lambda c, p: 1, name="stock", share_key=lambda ctx, p: ["list"])
    with ThreadPoolExecutor(1) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    exc = result.result_of("stock").exception
    assert isinstance(exc, TypeError) and "node 'stock'" in str(exc)


class Replicas:
    """The first attempt hangs until it sees ``ctx.cancelled``; later ones answer at once."""

    def __init__(self, later_fail: bool = False) -> None:
        self.lock = threading.Lock()
        self.n = 0
        self.saw_cancel = threading.Event()
        self.ids: list[str | None] = []
        self.later_fail = later_fail

    def __call__(self, ctx, param):
        with self.lock:
            n = self.n
            self.n += 1
            self.ids.append(ctx.operation_id)
        if n == 0:
            end = time.monotonic() + LONG
            while not ctx.cancelled and time.monotonic() < end:
                time.sleep(0.001)
            if ctx.cancelled:
                self.saw_cancel.set()
            if self.later_fail:
                return "slow first"
            return "first"
        if self.later_fail:
            raise ValueError("replica down")
        return f"hedge {n}"


def test_hedge_starts_a_duplicate_and_the_first_success_wins():
    replicas = Replicas()
    node = FunctionNode(replicas, name="price", hedge=Hedge(after=SHORT / 5),
                        idempotent=True)
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
        assert replicas.saw_cancel.wait(LONG)  # the loser sees ctx.cancelled
    wr = result.result_of("price")
    assert wr.state is ResultState.SUCCESS and wr.result == "hedge 1"
    assert wr.hedges == 1 and result.elapsed < LONG / 2
    assert len(set(replicas.ids)) == 1  # one operation id for every attempt


def test_a_failed_hedge_leaves_the_race_to_the_first_attempt():
    replicas = Replicas(later_fail=True)
    node = FunctionNode(replicas, name="price", hedge=Hedge(after=SHORT / 5, max_extra=1),
                        idempotent=True, timeout=SHORT * 4)
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    wr = result.result_of("price")
    # the hedge failed; the first attempt was still running, and the node's timeout ends it
    assert wr.hedges == 1 and wr.state is ResultState.TIMEOUT


def test_percentile_hedge_waits_for_enough_samples():
    calls = []
    node = FunctionNode(lambda c, p: calls.append(1), name="p",
                        hedge=Hedge(after="p95", min_samples=50), idempotent=True)
    with ThreadPoolExecutor(2) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok and result.result_of("p").hedges == 0 and calls == [1]


def test_a_hedged_attempt_is_an_event_for_observers():
    from taskflow.engine import events

    seen = []

    class Watch(events.RunObserver):
        def event(self, i, name, attrs):
            seen.append((name, attrs, threading.current_thread().name))

    class Listener:
        def run_started(self, run):
            return Watch()

    listener = Listener()
    events.add_listener(listener)
    replicas = Replicas()
    try:
        node = FunctionNode(replicas, name="price", hedge=Hedge(after=SHORT / 5),
                            idempotent=True)
        with ThreadPoolExecutor(4) as pool:
            result = TaskScheduling.start(node, executor=pool, timeout=LONG)
            assert replicas.saw_cancel.wait(LONG)
    finally:
        events.remove_listener(listener)
    assert result.ok
    assert [(name, attrs) for name, attrs, _ in seen] == [("hedge", {"attempt": 1})]
    assert not seen[0][2].startswith("taskflow-timer")


def test_percentile_hedge_starts_once_the_node_has_a_history():
    from taskflow.resilience import latencies

    replicas = Replicas()
    node = FunctionNode(replicas, name="price", hedge=Hedge(after="p95", min_samples=5),
                        idempotent=True)
    for _ in range(5):
        latencies.record(node._policy, SHORT / 5)  # its recent durations in this process
    with ThreadPoolExecutor(4) as pool:
        result = TaskScheduling.start(node, executor=pool, timeout=LONG)
        assert replicas.saw_cancel.wait(LONG)
    assert result.result_of("price").hedges == 1 and result.outputs["price"] == "hedge 1"


def test_single_flight_on_a_process_pool():
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import remote_tasks

    node = FunctionNode(remote_tasks.sleep_for, param=MEDIUM, name="stock",
                        share_key=lambda ctx, p: ("stock", ctx["sku"]))
    flight = node._policy.flight
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [TaskScheduling.submit(node, executor=pool, timeout=LONG,
                                         context=TaskContext(sku="p")) for _ in range(3)]
        results = [f.result(LONG) for f in futures]
    assert all(r.ok for r in results)
    assert flight.metrics().calls == 1 and sum(r.result_of("stock").shared for r in results) == 2
