"""The README's quick start runs as printed, and its set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_quick_start_runs_as_printed(capsys):
    quick_start = README[README.index("## Quick start"):]
    code = re.search(r"```python\n(.*?)```", quick_start, re.DOTALL)
    assert code is not None
    exec(compile(code.group(1), "README quick start", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    assert out.startswith("True {'product'"), out


def test_first_screen_gives_the_two_set_up_commands():
    first_screen = README[: README.index("## Quick start")]
    assert "pip install -e '.[dev]' && python -m taskflow demo" in first_screen
    assert "pip install -e '.[dev]' && pytest" in first_screen
    ci_lines = {line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()}
    assert {"pip install -e '.[dev]'", "pytest"} <= ci_lines, "CI runs what the README prints"
