"""Prometheus text export of the primitives' metrics, grouped by metric family.

Each primitive gives ``prometheus_samples()``; ``render_prometheus`` groups the samples of many
objects so every family appears once with one series per object (label ``bulkhead``,
``breaker``, ``rate_limit`` or ``single_flight``), as the text exposition format requires.

Every ``Bulkhead``, ``RateLimit`` and ``CircuitBreaker`` also enters a process-wide weak
registry when it is made (``register``; ``registered()`` lists the live ones). A
[`PoolMonitor`][taskflow.observe.monitor.PoolMonitor] built without ``resilience=`` exports the registered
objects with its pool: in ``latest()``/``history()`` and in its Prometheus output. A name is
registered once per kind: while the first object of that name lives, a second one of the same
kind and name is not registered (its series would clash with the first's); hand it to a monitor
explicitly with ``PoolMonitor(..., resilience=[...])`` under a name of its own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from taskflow import _fork
from taskflow.exposition import Sample, render_families, sample_families

__all__ = ["Exportable", "register", "registered", "render_prometheus"]


class Exportable(Protocol):
    """A named primitive with metrics: every primitive in this package."""

    name: str

    def prometheus_samples(self) -> list[Sample]: ...

    def metrics(self) -> Any: ...


class _Registry:
    """The named primitives alive in this process, for ``PoolMonitor``.

    ``_lock`` guards ``_objects``: ``(kind, name)`` -> a weak reference to the first live object
    of that kind and name. Dead references are dropped by ``add`` and ``live``, never by a
    weakref callback (one could run during a garbage collection inside a locked section).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], weakref.ref[Exportable]] = {}
        _fork.register(self, hold="_lock")

    def add(self, kind: str, obj: Exportable) -> bool:
        with self._lock:
            self._prune_locked()
            key = (kind, obj.name)
            if key in self._objects:
                return False
            self._objects[key] = weakref.ref(obj)
            return True

    def live(self) -> list[Exportable]:
        with self._lock:
            self._prune_locked()
            refs = list(self._objects.values())
        return [obj for ref in refs if (obj := ref()) is not None]

    def _prune_locked(self) -> None:
        for key in [k for k, ref in self._objects.items() if ref() is None]:
            del self._objects[key]

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # the objects live on in the child, registered


_registry = _Registry()


def register(obj: Exportable, kind: str) -> bool:
    """Add ``obj`` to the process-wide registry ``PoolMonitor`` exports by default.

    Args:
        obj: A named primitive (held weakly).
        kind: Its kind, as in its series' label: ``"bulkhead"``, ``"rate_limit"``, ``"breaker"``.

    Returns:
        False when a live object of the same kind and name is registered already (``obj`` is
        then not registered).
    """
    return _registry.add(kind, obj)


def registered() -> list[Exportable]:
    """The registered primitives still alive, in the order they were made."""
    return _registry.live()


def render_prometheus(objects: Iterable[Exportable], *, prefix: str = "taskflow") -> str:
    """Render the metrics of ``objects`` in the Prometheus text exposition format (0.0.4).

    Args:
        objects: Bulkheads, rate limits, breakers, single flights (anything ``Exportable``).
        prefix: Prepended to every family name.

    Returns:
        The text, ending with a newline, or ``""`` when there is nothing to export.
    """
    return render_families(
        sample_families((s for obj in objects for s in obj.prometheus_samples()), prefix=prefix)
    )
