"""examples/fanout_files.py (the 100-file exercise) runs, quickly, and shows what it claims."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from conftest import SCALE

from taskflow import ResultState
from taskflow.kinds.fanout import FanInResult, ItemTimeoutError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fanout_files.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_fanout_files", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fanout_example_blocks_under_all_and_publishes_98_files_under_the_quorum(capsys):
    example = load()
    t0 = time.monotonic()
    result = example.main()
    elapsed = time.monotonic() - t0
    out = capsys.readouterr().out

    assert elapsed < 2.0 * SCALE, elapsed  # the example promises about 1 s
    check = result["check_files"].work_result
    assert check.state is ResultState.SUCCESS
    fan_in = check.result
    assert isinstance(fan_in, FanInResult)
    assert set(fan_in.succeeded) == set(example.FILES[:98])
    assert list(fan_in.failed) == ["file-099"]
    assert isinstance(fan_in.failed["file-099"], ItemTimeoutError)
    assert fan_in.missing == ["file-100"] and fan_in.duplicates == 1 and not fan_in.complete
    publish = result["publish"].work_result
    assert publish.state is ResultState.SUCCESS
    assert publish.result["published"] == example.FILES[:98]
    assert publish.result["held"] == {"file-099": "failed", "file-100": "missing"}

    all_part, quorum_part = out.split("policy 0.95")
    assert "check_files  TIMEOUT" in all_part and "publish      TIMEOUT: nothing published" in all_part
    assert "check_files  SUCCESS" in quorum_part
    assert "held for reconciliation: file-099 (failed), file-100 (missing)" in quorum_part
    for part in (all_part, quorum_part):
        assert "98 passed, 1 failed, 1 missing, 1 duplicate" in part
        assert "file-050 checked 1 time(s), delivered twice" in part
        assert "dropped, fan-in unchanged" in part
    assert "CHANGED" not in out
    # the example released its stuck checks and shut its pool down
    assert not [t for t in threading.enumerate() if t.name.startswith("files")]


def test_fanout_example_runs_as_a_script():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("98 passed, 1 failed, 1 missing") == 2
    assert proc.stderr == ""
