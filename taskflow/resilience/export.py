"""Prometheus text export of the primitives' metrics, grouped by metric family.

Each primitive gives ``prometheus_samples()``; ``render_prometheus`` groups the samples of many
objects so every family appears once with one series per object (label ``bulkhead``,
``breaker``, ``rate_limit`` or ``single_flight``), as the text exposition format requires.
``PoolMonitor.to_prometheus`` can append the output for the objects it is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple, Protocol

__all__ = ["Exportable", "Sample", "render_prometheus"]


class Sample(NamedTuple):
    """One series: family name (without prefix), type, help text, labels and value."""

    family: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float


class Exportable(Protocol):
    """Anything with ``prometheus_samples()``: every primitive in this package."""

    def prometheus_samples(self) -> list[Sample]: ...


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def render_prometheus(objects: Iterable[Exportable], *, prefix: str = "taskflow") -> str:
    """Render the metrics of ``objects`` in the Prometheus text exposition format (0.0.4).

    Args:
        objects: Bulkheads, rate limits, breakers, single flights (anything ``Exportable``).
        prefix: Prepended to every family name.

    Returns:
        The text, ending with a newline, or ``""`` when there is nothing to export.
    """
    families: dict[str, tuple[str, str, list[Sample]]] = {}
    for obj in objects:
        for sample in obj.prometheus_samples():
            entry = families.setdefault(sample.family, (sample.kind, sample.help, []))
            entry[2].append(sample)
    out: list[str] = []
    for family, (kind, help_text, samples) in families.items():
        name = f"{prefix}_{family}"
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for s in samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
            out.append(f"{name}{{{labels}}} {_number(s.value)}" if labels
                       else f"{name} {_number(s.value)}")
    return "\n".join(out) + "\n" if out else ""
