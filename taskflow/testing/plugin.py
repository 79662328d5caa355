"""taskflow's pytest plugin (entry point ``pytest11``, loaded by pytest when taskflow-juc is
installed; ``-p taskflow.testing.plugin`` loads it by hand).

Fixtures:
    manual_executor: a fresh [`ManualExecutor`][taskflow.testing.ManualExecutor] (FIFO; mark a
        test ``@pytest.mark.manual_executor(seed=3)`` for a seeded order, ``max_workers=`` as
        the constructor's), shut down at teardown with what is still queued cancelled.
    fake_clock: an entered [`FakeClock`][taskflow.testing.FakeClock], autojump on (mark a test
        ``@pytest.mark.fake_clock(autojump=False)`` to move time only with ``advance``;
        ``start=`` and ``autojump_threshold=`` as the constructor's), left at teardown: a thread
        still in ``clock.sleep`` is released then.

The fixtures belong to one test each; only ``fake_clock`` with autojump starts a thread (its
driver), stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from taskflow.testing.manual import ManualExecutor
from taskflow.testing.virtual import FakeClock

__all__ = ["fake_clock", "manual_executor", "pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``manual_executor`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        "manual_executor(seed=None, max_workers=4): options of the manual_executor fixture",
    )
    config.addinivalue_line(
        "markers",
        "fake_clock(start=0.0, autojump=True, autojump_threshold=0.005): options of the "
        "fake_clock fixture",
    )


@pytest.fixture
def manual_executor(request: pytest.FixtureRequest) -> Iterator[ManualExecutor]:
    """A ManualExecutor for this test, shut down (queued work cancelled) at teardown."""
    options = _options(request, "manual_executor", "seed=, max_workers=")
    executor = ManualExecutor(**options)
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def fake_clock(request: pytest.FixtureRequest) -> Iterator[FakeClock]:
    """An entered FakeClock for this test (autojump on unless the marker says otherwise), left
    at teardown."""
    options = {"autojump": True, **_options(request, "fake_clock",
                                             "start=, autojump=, autojump_threshold=")}
    with FakeClock(**options) as fake:
        yield fake


def _options(request: pytest.FixtureRequest, name: str, takes: str) -> dict[str, Any]:
    """The keyword arguments of the test's closest ``name`` marker."""
    marker = request.node.get_closest_marker(name)
    if marker is None:
        return {}
    if marker.args:
        raise TypeError(f"@pytest.mark.{name} takes keyword arguments only ({takes})")
    return dict(marker.kwargs)
