"""taskflow's pytest plugin (entry point ``pytest11``, loaded by pytest when taskflow-juc is
installed; ``-p taskflow.testing.plugin`` loads it by hand).

Fixtures:
    manual_executor: a fresh [`ManualExecutor`][taskflow.testing.ManualExecutor] (FIFO; mark a
        test ``@pytest.mark.manual_executor(seed=3)`` for a seeded order, ``max_workers=`` as
        the constructor's), shut down at teardown with what is still queued cancelled.

Nothing here runs threads; the fixture's executor belongs to one test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskflow.testing.manual import ManualExecutor

__all__ = ["manual_executor", "pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``manual_executor`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        "manual_executor(seed=None, max_workers=4): options of the manual_executor fixture",
    )


@pytest.fixture
def manual_executor(request: pytest.FixtureRequest) -> Iterator[ManualExecutor]:
    """A ManualExecutor for this test, shut down (queued work cancelled) at teardown."""
    marker = request.node.get_closest_marker("manual_executor")
    options = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        raise TypeError("@pytest.mark.manual_executor takes keyword arguments only "
                        "(seed=, max_workers=)")
    executor = ManualExecutor(**options)
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
