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


def test_first_screen_warns_that_start_runs_everything_connected():
    first_screen = README[: README.index("## Installing")]
    text = " ".join(first_screen.replace("\n> ", "\n").split())  # a block quote, unquoted
    assert "`start` runs everything connected to the nodes you pass, in both directions" in text
    assert "use `targets=` to run only what they need" in text


def test_readme_links_lead_to_files_and_headings_that_exist():
    links = re.findall(r"\]\(([^)]+)\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) >= 10
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to a missing {path!r}"
        if anchor:
            text = target.read_text(encoding="utf-8")
            slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
                     for h in re.findall(r"^#+ (.*?)\s*(?:\{.*\})?$", text, re.MULTILINE)}
            slugs |= set(re.findall(r"\{ #([\w-]+) \}", text))
            assert anchor in slugs, f"README links to a missing heading {link!r}"


def test_nothing_cites_the_internal_api_contract():
    """The API reference in docs/ is the contract users read; no file points elsewhere."""
    offenders = []
    for pattern in ("README.md", "taskflow/**/*.py", "tests/**/*.py", "examples/**/*",
                    "docs/**/*.md", "benchmarks/**/*.py"):
        for path in ROOT.glob(pattern):
            if (path.is_file() and path.name != "test_readme.py"
                    and "API" + ".md" in path.read_text(encoding="utf-8", errors="replace")):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders
