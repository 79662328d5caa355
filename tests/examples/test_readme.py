"""The README's quick start runs as printed, its set-up commands are the ones CI runs, and what
it says of the package (its extras) is what pyproject.toml declares."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_quick_start_runs_as_printed(capsys):
    quick_start = README[README.index("## Quick start"):]
    code = re.search(r"```python\n(.*?)```", quick_start, re.DOTALL)
    assert code is not None
    exec(compile(code.group(1), "README quick start", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("True {'product'"), out


def test_first_screen_gives_the_two_set_up_commands():
    """The demo's install is the lightest one (no extras); the test command is the whole suite."""
    first_screen = README[: README.index("## Quick start")]
    assert "pip install -e . && python -m taskflow demo" in first_screen
    assert "pip install -e '.[dev]' && pytest" in first_screen
    ci_lines = {line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()}
    assert {"pip install -e '.[dev]'", "pytest", "pip install -e .",
            "python -m taskflow demo > /dev/null"} <= ci_lines, "CI runs what the README prints"


def test_first_screen_says_which_tests_skip_without_which_system_packages():
    first_screen = " ".join(README[: README.index("## Quick start")].split())
    for needed in ("`redis-server`", "Chromium", "`test.test_concurrent_futures`", "`.ci/run`"):
        assert needed in first_screen, needed
    ci = (ROOT / ".ci" / "run").read_text()
    for package in ("redis-server", "chromium", "testsuite"):
        assert package in ci, package


def test_the_demo_needs_no_extra():
    """``pip install -e .`` is enough for the demo: it imports nothing an extra brings."""
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "class NoExtras(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in EXTRAS: raise ImportError(name)\n"
            f"EXTRAS = {sorted(EXTRA_MODULES)!r}\n"
            "sys.meta_path.insert(0, NoExtras())\n"
            "from taskflow.cli import main\n"
            "sys.exit(main(['demo']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


# what the extras bring that the library alone lacks (``pip install -e .`` gives pydantic,
# loguru and psutil)
EXTRA_MODULES = {"yaml", "flask", "django", "loky", "dask", "prometheus_client", "opentelemetry",
                 "gunicorn", "uvicorn", "requests", "httpx", "redis", "mkdocs", "pytest",
                 "hypothesis"}


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


def test_seeing_what_happened_runs_and_prints_what_it_says(capsys):
    """The statistics example runs as printed, and the line the README quotes is one it prints
    (regression: the README said ``in 0% of runs`` where the code prints about 95%)."""
    from taskflow.observe import stats

    section = README[README.index("## Seeing what happened"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    quoted = re.search(r"prints, for example, `([^`]+)`", section)
    assert quoted is not None
    was_enabled = stats.STATS.enabled
    stats.STATS.reset()  # the snippet reads flows[0]: this process's only flow
    try:
        exec(compile(code.group(1), "README seeing what happened", "exec"), {})
    finally:
        if not was_enabled:
            stats.disable()
        stats.STATS.reset()
    printed = capsys.readouterr().out.splitlines()
    # the figures vary from run to run (durations, and which of price and stock ends last)
    text = re.sub(r"p99 [\d.]+ ms", "p99 @MS@ ms", quoted.group(1))
    text = re.sub(r"in \d+% of", "in @PCT@% of", text)
    pattern = re.escape(text).replace("@MS@", r"[\d.]+").replace("@PCT@", r"(\d+)")
    lines = [m for m in map(re.compile(pattern).fullmatch, printed) if m]
    assert lines, (quoted.group(1), printed)
    said = int(re.search(r"in (\d+)% of", quoted.group(1)).group(1))  # type: ignore[union-attr]
    # the failed node ends the run, mostly: the README's example must not say otherwise
    assert int(lines[0].group(1)) >= 50 and said >= 50, (said, printed)


def declared_extras() -> set[str]:
    """The keys of ``[project.optional-dependencies]`` in pyproject.toml (read without tomllib,
    which Python 3.10 lacks)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    table = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*=", table, re.MULTILINE))


def test_the_readme_and_getting_started_name_every_extra_and_no_other():
    extras = declared_extras()
    assert {"flask", "django", "otel", "dev"} <= extras, extras  # the parser sees the table
    installing = README[README.index("## Installing"):README.index("## Quick start")]
    in_readme = set(re.findall(r"`\[([\w-]+)\]`", installing))
    assert in_readme == extras, (sorted(extras - in_readme), sorted(in_readme - extras))
    guide = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    in_guide = set(re.findall(r"^\| `([\w-]+)` \|", guide, re.MULTILINE))
    assert in_guide == extras, (sorted(extras - in_guide), sorted(in_guide - extras))


def test_the_readme_stays_a_first_screen_and_its_links():
    """Benchmark tables live on the performance page; the README keeps one paragraph of figures."""
    lines = README.splitlines()
    assert len(lines) <= 220, f"the README has grown to {len(lines)} lines"
    tables = [ln for ln in lines if ln.startswith("|") and "×" in ln]
    assert not tables, tables
    section = README[README.index("## Performance"):]
    assert "docs/concepts/performance.md" in section.split("\n## ", 1)[0]


def test_troubleshooting_quotes_the_error_of_a_checkout_folder_that_shadows_the_install(tmp_path):
    """A script beside a folder named ``taskflow`` (the clone) imports that folder: the message
    troubleshooting quotes is the one Python prints."""
    import subprocess
    import sys

    (tmp_path / "taskflow").mkdir()  # a clone's top: no __init__.py
    (tmp_path / "page.py").write_text("from taskflow import FunctionNode\n")
    done = subprocess.run([sys.executable, str(tmp_path / "page.py")], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    message = ("ImportError: cannot import name 'FunctionNode' from 'taskflow' "
               "(unknown location)")
    assert message in done.stderr, done.stderr
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    assert f"## `{message}`" in page and message in page.split(f"## `{message}`", 1)[1]
