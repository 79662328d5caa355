"""A fan-out's memory stays flat: what it allocates beyond the FanInResult it hands over does not
grow with the item count.

The FanInResult keeps every id and value by contract, and a dict that grows to n entries briefly
holds its old table beside the new one when it resizes; that cost belongs to the result, not to
the engine. So each measurement is taken against a baseline built in the same process: the same
ids and values put into a plain dict from the same kind of generator. What is left, the engine's
transient, must be about the same at 10,000 and 100,000 items.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG

from taskflow import TaskContext, TaskScheduling
from taskflow.kinds.fanout import FanInResult, FanOutNode

SMALL, LARGE = 10_000, 100_000
MB = 1024 * 1024


class Noop(FanOutNode[int]):
    """``param`` items ``(i, None)``; ``work`` returns None."""

    def items(self, ctx: TaskContext, param: int) -> Iterator[tuple[int, Any]]:
        return ((i, None) for i in range(param))

    def work(self, ctx: TaskContext, item: Any) -> None:
        return None


def transient(build: Callable[[], Any]) -> int:
    """Peak bytes traced while ``build()`` runs, less what its returned object keeps."""
    gc.collect()
    tracemalloc.start()
    try:
        kept_object = build()
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept_object
    return peak - kept


def engine_transient(pool: ThreadPoolExecutor, n: int, item_timeout: float | None) -> int:
    """The fan-out's transient over ``n`` items less a plain dict's built from the same items."""

    def fan_out() -> FanInResult:
        node = Noop(n, name="fan", max_concurrency=4, item_timeout=item_timeout)
        result = TaskScheduling.start(node, executor=pool, timeout=LONG * 6)
        fan_in = result["fan"].work_result.result
        assert isinstance(fan_in, FanInResult) and len(fan_in.succeeded) == n, fan_in
        return fan_in

    def by_hand() -> dict[int, None]:
        return {i: item for i, item in ((i, None) for i in range(n))}

    return transient(fan_out) - transient(by_hand)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("item_timeout", [None, 60.0], ids=["no-item-timeout", "item-timeout"])
def test_fan_out_transient_memory_does_not_grow_with_the_item_count(item_timeout):
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already tracing this process")
    with ThreadPoolExecutor(4, thread_name_prefix="tfmem") as pool:
        engine_transient(pool, 1000, item_timeout)  # warm-up: threads, caches, code paths
        small = engine_transient(pool, SMALL, item_timeout)
        large = engine_transient(pool, LARGE, item_timeout)

    assert large < 2 * small + MB // 8, (small, large)
    assert large < MB, (small, large)
