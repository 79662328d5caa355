"""The snapshot model of load shedding (``LoadShedder.metrics``), apart so that starting a run
does not load pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["LoadSheddingMetrics"]


class LoadSheddingMetrics(BaseModel):
    """A snapshot of the process's load shedding."""

    model_config = ConfigDict(frozen=True)

    name: str
    sheddable_at: float  # load from which sheddable runs are refused
    normal_at: float | None  # load from which normal runs are refused (None: never)
    admitted: dict[str, int]  # runs let through, per priority (total)
    shed: dict[str, int]  # runs refused with LoadShedError, per priority (total)
