"""A user's tests of what a page does with time, on virtual time: the ``fake_clock`` fixture.

Each test below is about seconds of budget, timeouts, back-offs and cache ages, and takes a few
milliseconds: while the fixture's ``FakeClock`` is entered, taskflow reads virtual time, and
``autojump`` moves it to the next timer whenever no node can make progress. The nodes stand in
for slow backends with ``fake_clock.sleep``. Run it with
``pytest examples/test_page_virtual_time.py`` once taskflow-juc is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from taskflow import FunctionNode, ResultState, Section, TaskScheduling
from taskflow.testing import FakeClock


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    # one pool for the module: set up before each test's fake clock and shut down after the
    # last one has left (a pool shut down first would wait for a node still in clock.sleep)
    with ThreadPoolExecutor(8) as executor:
        yield executor


def build_page(clock: FakeClock, inventory_takes: float) -> list[FunctionNode]:
    def inventory(ctx: Any, sku: str) -> int:
        clock.sleep(inventory_takes)  # the backend's latency, in virtual time
        return 3

    price = FunctionNode(lambda ctx, sku: 19.5, param="sku-1", name="price")
    stock = FunctionNode(inventory, param="sku-1", name="inventory", timeout=0.2,
                         fallback=None)  # unknown stock: the page says "check availability"
    page = FunctionNode(lambda ctx, _: (ctx.result_of("price"), ctx.result_of("inventory")),
                        name="page")
    price >> page
    stock >> page
    return [price, stock]


def test_the_page_degrades_when_inventory_takes_300_ms(fake_clock: FakeClock, pool: Any) -> None:
    result = TaskScheduling.start(build_page(fake_clock, 0.3), executor=pool, timeout=1.0)
    assert result["inventory"].work_result.state is ResultState.DEGRADED
    assert result.outputs["page"] == (19.5, None)
    assert fake_clock.now() == pytest.approx(0.2)  # the node's timeout, not the 300 ms


def test_the_page_shows_stock_when_inventory_answers_in_time(fake_clock: FakeClock,
                                                             pool: Any) -> None:
    result = TaskScheduling.start(build_page(fake_clock, 0.15), executor=pool, timeout=1.0)
    assert result.outputs["page"] == (19.5, 3)


def test_reviews_below_the_fold_give_up_at_their_section_deadline(fake_clock: FakeClock,
                                                                   pool: Any) -> None:
    product = FunctionNode(lambda ctx, _: "product", name="product")
    reviews = FunctionNode(lambda ctx, _: fake_clock.sleep(2.0), name="reviews")
    Section("below the fold", [reviews], deadline=0.5)
    result = TaskScheduling.start([product, reviews], executor=pool, timeout=30.0)
    assert result["reviews"].work_result.state is ResultState.TIMEOUT
    assert result.outputs["product"] == "product"
    assert result.elapsed == pytest.approx(0.5)  # the page did not wait for the 30 s budget


def test_a_retry_after_a_10_second_back_off_still_fits_a_30_second_budget(
        fake_clock: FakeClock, pool: Any) -> None:
    attempts: list[float] = []

    def flaky(ctx: Any, _: Any) -> str:
        attempts.append(fake_clock.now())
        if len(attempts) == 1:
            raise ConnectionError("the backend dropped the connection")
        return "ok"

    node = FunctionNode(flaky, name="flaky", retries=1, retry_backoff=10.0)
    result = TaskScheduling.start(node, executor=pool, timeout=30.0)
    assert result.outputs["flaky"] == "ok"
    assert attempts == [0.0, pytest.approx(10.0, abs=1e-6)]


def test_a_stale_price_is_served_for_30_s_after_its_ttl(fake_clock: FakeClock,
                                                        pool: Any) -> None:
    prices = iter([19.5, 21.0])
    price = FunctionNode(lambda ctx, sku: next(prices), param="sku-1", name="price",
                         share_key=lambda ctx, sku: ("price", sku), cache_ttl=60.0,
                         stale_for=30.0)
    assert TaskScheduling.start(price, executor=pool, timeout=1.0).outputs["price"] == 19.5
    fake_clock.advance(75.0)  # past the TTL, within the stale window: served at once
    assert TaskScheduling.start(price, executor=pool, timeout=1.0).outputs["price"] == 19.5


@pytest.mark.fake_clock(autojump=False)
def test_time_moves_only_when_the_test_says_so(fake_clock: FakeClock, pool: Any) -> None:
    future = TaskScheduling.submit(build_page(fake_clock, 0.3), executor=pool, timeout=1.0)
    assert fake_clock.wait_until_blocked()  # the nodes started: inventory sleeps, page waits
    fake_clock.advance(0.1)
    assert not future.done()
    fake_clock.advance(0.1)  # the inventory node's timeout fires now
    assert future.result(timeout=10).outputs["page"] == (19.5, None)
