"""Near-valid flow specs: the repository's example spec mutated a few
times (any value replaced by one of any JSON type, keys deleted, tasks duplicated, subtrees
copied elsewhere) loads under an allow-list or ends in the library's own error.

``tests/declare/test_spec_fuzz.py`` builds documents from a vocabulary; this one starts from a real spec,
so most documents are one or two mistakes away from valid, where the checks are deepest.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_trust_conductor_fuzz import _get, _paths, anything

from taskflow import TaskflowError
from taskflow.declare.spec import SpecError, load_spec

yaml = pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = yaml.safe_load((EXAMPLES / "flow_spec.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", autouse=True)
def example_tasks_importable() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))


@st.composite
def near_valid(draw: Any) -> Any:
    doc: Any = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "delete", "duplicate", "graft"]))
        if not path:
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[last] = draw(anything)
        elif op == "delete":
            del parent[last]
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        elif op == "graft":
            parent[last] = copy.deepcopy(_get(doc, draw(st.sampled_from(paths))))
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=near_valid())
def test_a_near_valid_spec_loads_or_fails_with_the_librarys_error(doc: Any) -> None:
    try:
        load_spec(doc, allow_modules=("flow_spec_tasks",))
    except SpecError as exc:
        assert isinstance(exc, TaskflowError) and str(exc)
        event("refused")
    else:
        event("loaded")
