"""What ``import taskflow`` costs a fresh interpreter, and where the time goes.

The figure is the time of the ``import taskflow`` statement itself, measured inside the
interpreter (``time.perf_counter`` around it, so the interpreter's own start is left out), the
median of ``--runs`` fresh interpreters (default 7), in two states of the package:

- **with bytecode**: the package's ``.pyc`` files are cached (a wheel install, or any checkout
  after its first import);
- **without bytecode**: taskflow's ``.pyc`` files are absent and not written
  (``PYTHONDONTWRITEBYTECODE=1``: an editable install in a read-only tree, a container), so every
  module of the package is compiled at each start (the standard library and the dependencies
  keep theirs).

Both are measured on a copy of the package in a temporary folder, put first on ``sys.path``, so
the checkout is left as it was. ``import concurrent.futures`` is printed beside them: the floor a
library built on it cannot go below. Then the top costs of one import with bytecode, from
``python -X importtime``: the modules taskflow imports directly (cumulative) and the single
modules that cost the most on their own (self time).

    python benchmarks/import_time.py            # both figures and the top costs
    python benchmarks/import_time.py --runs 15  # more interpreters per figure
    python benchmarks/import_time.py --top 25   # a longer list of costs
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import taskflow

PACKAGE = Path(taskflow.__file__).resolve().parent
TIMED = ("import time; t = time.perf_counter(); import {module}; "
         "print((time.perf_counter() - t) * 1e3)")


def _env(where: Path, bytecode: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(where), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def timed(module: str, where: Path, bytecode: bool, runs: int) -> list[float]:
    """``import module`` in ``runs`` fresh interpreters: each one's time in ms."""
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", TIMED.format(module=module)], cwd=where,
                              env=_env(where, bytecode), check=True, capture_output=True,
                              text=True)
        out.append(float(done.stdout.strip().splitlines()[-1]))
    return out


def copy_package(into: Path) -> Path:
    """A copy of the package without its bytecode; returns the folder to put on ``sys.path``."""
    shutil.copytree(PACKAGE, into / "taskflow", ignore=shutil.ignore_patterns("__pycache__"))
    return into


def check_copy(where: Path) -> None:
    """The interpreters import the copy, not the installed package."""
    done = subprocess.run([sys.executable, "-c", "import taskflow; print(taskflow.__file__)"],
                          cwd=where, env=_env(where, False), check=True, capture_output=True,
                          text=True)
    found = Path(done.stdout.strip()).resolve()
    if not found.is_relative_to(where.resolve()):
        raise SystemExit(f"the interpreters import {found}, not the copy in {where}")


def compile_copy(where: Path) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(where / "taskflow")],
                   check=True, env=_env(where, True))


def top_costs(where: Path, top: int) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(direct imports of taskflow by cumulative µs, modules by self µs), each the ``top``
    largest, from one ``-X importtime`` run with bytecode."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import taskflow"],
                          cwd=where, env=_env(where, True), check=True, capture_output=True,
                          text=True)
    rows: list[tuple[int, int, str]] = []  # (self, cumulative, "  name") in import order
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        rows.append((int(self_us), int(cum_us), name.rstrip()))
    # the rows of ``import taskflow``: from after the previous top-level row to its own row
    end = max(k for k, r in enumerate(rows) if r[2].strip() == "taskflow")
    start = max((k for k, r in enumerate(rows[:end]) if not r[2].startswith("  ")), default=-1)
    mine = rows[start + 1:end + 1]
    depth = min(len(r[2]) - len(r[2].lstrip()) for r in mine[:-1]) if len(mine) > 1 else 0
    direct = sorted(((c, n.strip()) for s, c, n in mine[:-1]
                     if len(n) - len(n.lstrip()) == depth), reverse=True)[:top]
    own = sorted(((s, n.strip()) for s, c, n in mine), reverse=True)[:top]
    return direct, own


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per figure")
    parser.add_argument("--top", type=int, default=12, help="how many costs to list")
    args = parser.parse_args(argv)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="taskflow-import-") as tmp:
        where = copy_package(Path(tmp))
        check_copy(where)
        cold = timed("taskflow", where, False, args.runs)
        compile_copy(where)
        warm = timed("taskflow", where, True, args.runs)
        floor = timed("concurrent.futures", where, True, args.runs)
        figures = {"with_bytecode_ms": statistics.median(warm),
                   "without_bytecode_ms": statistics.median(cold),
                   "concurrent_futures_ms": statistics.median(floor)}
        print(f"import taskflow, median of {args.runs} fresh interpreters "
              f"(python {sys.version.split()[0]}):")
        print(f"  with bytecode     {figures['with_bytecode_ms']:6.1f} ms   "
              f"(min {min(warm):.1f}, max {max(warm):.1f})")
        print(f"  without bytecode  {figures['without_bytecode_ms']:6.1f} ms   "
              f"(min {min(cold):.1f}, max {max(cold):.1f})")
        print(f"  import concurrent.futures alone: {figures['concurrent_futures_ms']:.1f} ms")
        direct, own = top_costs(where, args.top)
        print("\nwhat taskflow imports directly, cumulative (one run, with bytecode):")
        for us, name in direct:
            print(f"  {us / 1e3:7.1f} ms  {name}")
        print("\nthe single modules that cost the most, self time:")
        for us, name in own:
            print(f"  {us / 1e3:7.1f} ms  {name}")
    return figures


if __name__ == "__main__":
    main()
