"""Testing a flow without threads or sleeps: ``ManualExecutor`` and the pytest plugin.

``ManualExecutor`` runs submitted work only when the test steps it, on the test's own thread,
in a seeded order; ``FakeClock`` is virtual time for taskflow (budgets, timeouts, back-offs,
TTLs) while entered; ``TaskScheduling.start``/``submit``/``run_async`` take
``overrides={name: value or callable}`` to replace nodes' work in a test. The pytest plugin
(``taskflow.testing.plugin``, registered through the ``pytest11`` entry point) provides the
``manual_executor`` and ``fake_clock`` fixtures.
"""

from __future__ import annotations

from taskflow.testing.manual import DEFAULT_MAX_STEPS, ManualExecutor, StepLimitError
from taskflow.testing.virtual import FakeClock

__all__ = ["DEFAULT_MAX_STEPS", "FakeClock", "ManualExecutor", "StepLimitError"]
