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



def test_the_guides_virtual_time_module_passes_with_the_fake_clock_fixture(
        tmp_path: Path) -> None:
    # examples/test_page_virtual_time.py, included in the testing guide: seconds of budgets,
    # back-offs and cache ages on the fixture's FakeClock
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:taskflow",
         "-p", "taskflow.testing.plugin", "--strict-markers", "--rootdir", str(tmp_path),
         "--durations=0", str(ROOT / "examples" / "test_page_virtual_time.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 passed" in proc.stdout


FAKE_CLOCK_TESTS = '''
import threading
import pytest
from taskflow import clock
from taskflow.testing import FakeClock

def test_fixture_is_entered_with_autojump(fake_clock):
    assert isinstance(fake_clock, FakeClock) and fake_clock.autojump
    assert clock.installed() is fake_clock
    assert clock.wait(threading.Event(), 60.0) is False and fake_clock.now() == 60.0

@pytest.mark.fake_clock(autojump=False, start=5.0)
def test_marker_options(fake_clock):
    assert not fake_clock.autojump and fake_clock.now() == 5.0

def test_left_at_teardown():
    assert clock.installed() is None
'''


def test_fake_clock_fixture_and_marker_in_a_users_suite(tmp_path: Path) -> None:
    (tmp_path / "test_user_clock.py").write_text(FAKE_CLOCK_TESTS, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:taskflow",
         "-p", "taskflow.testing.plugin", "--strict-markers", "--rootdir", str(tmp_path),
         str(tmp_path / "test_user_clock.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
