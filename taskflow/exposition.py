"""The Prometheus text exposition format (version 0.0.4): samples, families and their text.

One escaping rule for every exporter of taskflow: the resilience primitives
([`taskflow.resilience`][taskflow.resilience]) describe their series as ``Sample`` s, the pool monitor and
the flow statistics build ``Family`` s, and ``render_families`` writes them out. A leaf:
it imports nothing of taskflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "Family", "Sample", "format_label", "format_number", "render_families", "sample_families",
]


class Sample(NamedTuple):
    """One series: family name (without prefix), type, help text, labels and value."""

    family: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float


class Family:
    """One metric family: its full name, type, help text and samples.

    Each sample is ``(name, labels, value)``; a sample's name is the family's name or the
    family's name plus a suffix (``_sum``, ``_count`` of a summary).
    """

    __slots__ = ("help", "kind", "name", "samples")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: list[tuple[str, dict[str, str], float]] = []

    def add(self, name: str, labels: dict[str, str], value: float | None) -> None:
        """Add a sample; an unknown (``None``) value is left out."""
        if value is not None:
            self.samples.append((name, labels, float(value)))


def sample_families(samples: Iterable[Sample], *, prefix: str = "taskflow") -> list[Family]:
    """Group samples (of bulkheads, rate limits, breakers...) by family.

    Each family appears once, in the order first seen; a series (family and labels) seen
    again is left out, so objects exported by several monitors appear once.
    """
    out: dict[str, Family] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for sample in samples:
        key = (sample.family, sample.labels)
        if key in seen:
            continue
        seen.add(key)
        fam = out.get(sample.family)
        if fam is None:
            fam = out[sample.family] = Family(f"{prefix}_{sample.family}", sample.kind, sample.help)
        fam.add(fam.name, dict(sample.labels), sample.value)
    return list(out.values())


def render_families(fams: Iterable[Family]) -> str:
    """Families in the Prometheus text exposition format (0.0.4), ending with a newline, or
    ``""`` when there are none."""
    out: list[str] = []
    for fam in fams:
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        for name, labels, value in fam.samples:
            if labels:
                body = ",".join(f"{k}={format_label(v)}" for k, v in labels.items())
                out.append(f"{name}{{{body}}} {format_number(value)}")
            else:
                out.append(f"{name} {format_number(value)}")
    return "\n".join(out) + "\n" if out else ""


def format_label(value: str) -> str:
    """A label value, quoted and escaped (backslash, line feed, double quote)."""
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'"{escaped}"'


def format_number(value: float) -> str:
    """A sample value: integers without a fraction, ``NaN``, ``+Inf``/``-Inf``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
