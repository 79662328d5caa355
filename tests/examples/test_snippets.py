"""Every ``python`` block of README.md and of the documentation site runs as printed.

Each block runs in a fresh interpreter (this one, warnings as errors), from the repository's
root with the checkout on ``PYTHONPATH``, as the ``__main__`` module, under a timeout; a
traceback names the Markdown file and line. A comment on the line just above a block changes
that, and the test keeps such comments rare:

- ``<!-- snippet: continues -->``: the block goes on from the ``python`` block above it in the
  same file (it uses names defined there), so it runs in the same interpreter, right after it.
- ``<!-- snippet: fragment: REASON -->``: the block cannot run on its own, for the reason given
  (what only a deployment has: its own files, modules or servers); it is not run.

A block that only includes a file (``--8<-- "examples/flask_app.py"``) shows an example; the
example's own tests run it, so here the file must exist and a test must name it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SNIPPET_TIMEOUT = 60.0  # seconds one block may take on a busy 2-core machine (dask starts one)
# the markers in use today; a new one must be argued for in the page, next to its block
MAX_FRAGMENTS = 1
MAX_CONTINUES = 3
KINDS = ("continues", "fragment")

FENCE = re.compile(r"^(?P<indent> *)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*snippet:\s*(?P<kind>[\w-]+)\s*(?::(?P<reason>.*?))?-->")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')


@dataclass(frozen=True)
class Snippet:
    """One ``python`` block: where it is, its code (dedented), and the marker above it."""

    page: str  # relative to the repository's root
    line: int  # the Markdown line of the block's first line of code
    code: str
    kind: str | None = None  # "continues", "fragment", or None (runs on its own)
    reason: str = ""

    @property
    def origin(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def included(self) -> list[str]:
        """The files a block of ``--8<--`` lines includes ([] for a block of code)."""
        lines = [ln.strip() for ln in self.code.splitlines() if ln.strip()]
        found = [INCLUDE.match(ln) for ln in lines]
        return [m.group("path") for m in found if m] if lines and all(found) else []


@dataclass
class Program:
    """A block that runs on its own, followed by the blocks that continue it."""

    parts: list[Snippet] = field(default_factory=list)

    @property
    def origin(self) -> str:
        return self.parts[0].origin + "".join(f"+{s.line}" for s in self.parts[1:])


def marker_above(text: str, start: int) -> re.Match[str] | None:
    before = text[:start].rstrip("\n ").rsplit("\n", 1)[-1]
    return MARKER.fullmatch(before.strip())


def snippets_of(path: Path) -> list[Snippet]:
    text = path.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        indent = len(m.group("indent"))
        code = "\n".join(ln[indent:] for ln in m.group("body").splitlines())
        marker = marker_above(text, m.start())
        found.append(Snippet(
            page=str(path.relative_to(ROOT)),
            line=text.count("\n", 0, m.start("body")) + 1,
            code=code + "\n",
            kind=marker.group("kind") if marker else None,
            reason=(marker.group("reason") or "").strip() if marker else "",
        ))
    return found


SNIPPETS = [s for page in PAGES for s in snippets_of(page)]


def programs() -> list[Program]:
    """The runnable blocks, each continuation joined to the block it continues."""
    progs: list[Program] = []
    last: dict[str, Program] = {}  # page -> the program its next ``continues`` block joins
    for s in SNIPPETS:
        if s.included or s.kind == "fragment":
            last.pop(s.page, None)
        elif s.kind == "continues":
            assert s.page in last, f"{s.origin}: continues, but no runnable block is above it"
            last[s.page].parts.append(s)
        else:
            last[s.page] = Program([s])
            progs.append(last[s.page])
    return progs


PROGRAMS = programs()

# runs each part in one namespace that is ``sys.modules["__main__"]`` (so ``Flask(__name__)``,
# Django's ``ROOT_URLCONF=__name__`` and pickling by reference work as in a script), compiled
# with the page as its file name and padded to its line: a traceback quotes the Markdown line
DRIVER = """
import json, sys, types
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
for page, line, code in json.load(sys.stdin):
    exec(compile("\\n" * (line - 1) + code, page, "exec"), main.__dict__)
"""


def run(program: Program) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    parts = [[s.page, s.line, s.code] for s in program.parts]
    return subprocess.run([sys.executable, "-W", "error", "-c", DRIVER], input=json.dumps(parts),
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=SNIPPET_TIMEOUT, check=False)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.origin for p in PROGRAMS])
def test_snippet_runs_as_printed(program: Program) -> None:
    proc = run(program)
    assert proc.returncode == 0, (
        f"{program.origin} exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-4000:]}")


def test_the_snippets_are_found() -> None:
    """The parser sees the blocks (a broken pattern must not make the test above vacuous)."""
    pages = {s.page for p in PROGRAMS for s in p.parts}
    assert len(PROGRAMS) >= 25, [p.origin for p in PROGRAMS]
    for page in ("README.md", "docs/index.md", "docs/getting-started.md", "docs/guides/flask.md",
                 "docs/guides/django.md", "docs/guides/asyncio.md", "docs/guides/pools.md",
                 "docs/concepts/run.md", "docs/concepts/joins.md"):
        assert page in pages, f"no runnable python block found in {page}"
    codes = [s.code for s in SNIPPETS]
    assert any("DispatcherMiddleware(app.wsgi_app" in c for c in codes)  # the README's mount
    assert any(s.included for s in SNIPPETS)  # the blocks indented under "??? example"


def test_markers_are_few_known_and_say_why() -> None:
    marked = [s for s in SNIPPETS if s.kind is not None]
    for s in marked:
        assert s.kind in KINDS, f"{s.origin}: unknown snippet marker {s.kind!r}"
    fragments = [s for s in marked if s.kind == "fragment"]
    continues = [s for s in marked if s.kind == "continues"]
    for s in fragments:
        assert len(s.reason.split()) >= 3, f"{s.origin}: a fragment marker must say why"
    assert len(fragments) <= MAX_FRAGMENTS, [s.origin for s in fragments]
    assert len(continues) <= MAX_CONTINUES, [s.origin for s in continues]
    # every marker in the pages sits right above a python block (none left stranded)
    attached = len(marked)
    written = sum(len(MARKER.findall(page.read_text(encoding="utf-8"))) for page in PAGES)
    assert written == attached, "a snippet marker is not on the line above a python block"


def test_included_examples_exist_and_have_tests() -> None:
    tests = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    included = [(s, path) for s in SNIPPETS for path in s.included]
    assert included, "no included example found"
    for s, path in included:
        assert (ROOT / path).is_file(), f"{s.origin}: includes a missing {path!r}"
        assert Path(path).name.removesuffix(".py") in tests, f"{s.origin}: no test runs {path}"


INLINE_START = re.compile(r"`([^`\n]*\bstart\([^`\n]+\))`")


def test_inline_start_calls_name_the_executor_or_elide_it() -> None:
    """``start`` needs an executor: a call quoted in the text shows it (``executorService`` in
    the Java signature), or ``...`` for the rest."""
    offenders = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for call in INLINE_START.findall(text):
            if "executor" not in call and "..." not in call:
                offenders.append(f"{page.relative_to(ROOT)}: {call}")
    assert not offenders, offenders
