"""examples/resilience.py runs and shows what each demo claims."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "resilience.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_resilience", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bulkhead_caps_concurrent_calls():
    out = load().bulkhead_demo()
    assert out["ok"] == out["requests"] and out["peak_concurrent"] <= 2


def test_rate_limit_spaces_calls():
    out = load().rate_limit_demo()
    assert out["ok"] and out["granted"] == 5 and out["elapsed_ms"] >= 60


def test_breaker_opens_and_stops_calling_the_backend():
    out = load().breaker_demo()
    assert out["outcomes"] == ["failed"] * 3 + ["open"] * 3
    assert out["backend_calls"] == 3 and out["state"] == "open"


def test_fallback_renders_the_page():
    out = load().fallback_demo()
    assert out["status"] == "COMPLETED_WITH_ERRORS"
    assert out["page"]["recommended"] == [] and out["degraded"] == ["recommendations"]


def test_hedge_beats_the_slow_replica():
    out = load().hedge_demo()
    assert out["price"] == 79.0 and out["hedges"] == 1 and out["elapsed_ms"] < 250


def test_single_flight_makes_one_call():
    out = load().single_flight_demo()
    assert out["backend_calls"] == 1 and out["all_ok"]


def test_priority_orders_ready_calls():
    assert load().priority_demo() == ["price", "stock", "reviews", "ads"]


def test_min_budget_degrades_without_running():
    assert load().min_budget_demo() == {"state": "DEGRADED", "value": "summary only",
                                        "ran": False}


def test_example_runs_as_a_script():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "single_flight_demo" in proc.stdout and "'backend_calls': 1" in proc.stdout
