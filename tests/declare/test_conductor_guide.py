"""The Conductor guide's tables name every task type and every field the loader reads, so a
user porting a workflow learns from the guide what runs before running it."""

from __future__ import annotations

import re
from pathlib import Path

from taskflow.declare.conductor.compiling import COMMON_FIELDS, TYPE_FIELDS
from taskflow.declare.conductor.loader import SERVER_ONLY

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "conductor.md").read_text(
    encoding="utf-8")
NAMED = set(re.findall(r"`([A-Za-z_]+)", GUIDE))


def test_every_supported_type_has_a_row() -> None:
    first_cells = re.findall(r"^\| ([^|]+)\|", GUIDE, flags=re.MULTILINE)
    rows = {name for cell in first_cells for name in re.findall(r"`([A-Z_]+)`", cell)}
    assert set(TYPE_FIELDS) - rows == set()


def test_every_field_the_loader_reads_is_named_in_the_guide() -> None:
    fields = set(COMMON_FIELDS).union(*TYPE_FIELDS.values())
    assert fields - NAMED == set()


def test_every_type_refused_at_load_is_named_in_the_guide() -> None:
    assert set(SERVER_ONLY) - NAMED == set()
