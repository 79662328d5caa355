"""examples/backend_calls.py: the page answers within the caller's deadline, passes it on to the
stock backend, answers 504 at once to a deadline already past, and no worker stays stuck."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("flask")
pytest.importorskip("requests")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "backend_calls.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("backend_calls_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_answers_each_deadline_as_its_docstring_says(capsys):
    module = load()
    try:
        assert module.main() == 0
    finally:
        sys.modules.pop("backend_calls_example", None)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("{'grpc-timeout': '400m'} -> 200")
    assert "'in_stock': None" in out[0]  # stock left out at its own 150 ms
    # the stock backend was told at most the node's own 150 ms
    told = re.search(r"x-envoy-expected-rq-timeout-ms=(\d+)", out[1])
    assert told is not None and 0 < int(told.group(1)) <= 150
    assert out[2].startswith("{'X-Request-Deadline':") and "-> 504" in out[2]
    assert any(line.startswith("{'x-envoy-expected-rq-timeout-ms': '100'} -> 504")
               for line in out)
    assert any(line.startswith("report: stock was clamped to") for line in out)
    assert "audit: handed off DETACHED, ended SUCCESS" in out  # the detached audit write
    assert out[-1] == "a worker is free at once: True"
