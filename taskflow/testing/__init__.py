"""Testing a flow without threads or sleeps: ``ManualExecutor`` and the pytest plugin.

``ManualExecutor`` runs submitted work only when the test steps it, on the test's own thread,
in a seeded order; ``TaskScheduling.start``/``submit``/``run_async`` take
``overrides={name: value or callable}`` to replace nodes' work in a test. The pytest plugin
(``taskflow.testing.plugin``, registered through the ``pytest11`` entry point) provides the
``manual_executor`` fixture.
"""

from __future__ import annotations

from taskflow.testing.manual import DEFAULT_MAX_STEPS, ManualExecutor, StepLimitError

__all__ = ["DEFAULT_MAX_STEPS", "ManualExecutor", "StepLimitError"]
