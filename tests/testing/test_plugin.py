"""The pytest plugin: declared as a ``pytest11`` entry point, its fixture works in a user's
suite (run in a child pytest) and is shut down at teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_TESTS = '''
import pytest
from taskflow import FunctionNode, TaskScheduling
from taskflow.testing import ManualExecutor

KEPT = []

def test_fixture_drives_a_flow(manual_executor):
    assert isinstance(manual_executor, ManualExecutor) and manual_executor.seed is None
    node = FunctionNode(lambda c, p: p * 2, param=21, name="answer")
    future = TaskScheduling.submit(node, executor=manual_executor)
    manual_executor.run_until_idle()
    assert future.result(timeout=0).outputs == {"answer": 42}
    KEPT.append(manual_executor)
    KEPT.append(manual_executor.submit(print, "left queued"))

def test_previous_executor_was_shut_down_and_its_queue_cancelled():
    executor, left = KEPT
    assert executor.is_shutdown() and left.cancelled()

@pytest.mark.manual_executor(seed=5, max_workers=2)
def test_marker_options(manual_executor):
    assert manual_executor.seed == 5 and manual_executor.max_workers == 2
'''


def test_pyproject_declares_the_plugin_entry_point() -> None:
    # read as text: tomllib is not in Python 3.10
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.entry-points.pytest11]\n", 1)[1].split("\n[", 1)[0]
    assert [line for line in section.splitlines() if line and not line.startswith("#")] == [
        'taskflow = "taskflow.testing.plugin"']


def test_the_fixture_works_in_a_users_suite(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n",
                                         encoding="utf-8")
    env_path = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:taskflow",
         "-p", "taskflow.testing.plugin", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


def test_the_guides_example_test_module_passes_with_the_plugin(tmp_path: Path) -> None:
    # examples/test_page_with_plugin.py, included in the testing guide
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:taskflow",
         "-p", "taskflow.testing.plugin", "--strict-markers", "--rootdir", str(tmp_path),
         str(ROOT / "examples" / "test_page_with_plugin.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout

