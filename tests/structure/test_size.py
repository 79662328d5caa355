"""Size limits a maintainer can rely on, measured on the sources: no function of the package
above cyclomatic complexity 30 (radon's count), none of the engine, the pools or the declarative
part above 25 (its Conductor compiler, split per task type, above 20), no module over 1,000 lines, and a top level that holds at most ten files beside
at least six parts in folders."""

from __future__ import annotations

import pathlib

import radon.complexity as radon_complexity

import taskflow

ROOT = pathlib.Path(taskflow.__file__).parent
SOURCES = sorted(ROOT.rglob("*.py"))
MAX_COMPLEXITY = 30
MAX_LINES = 1000


def _blocks(path: pathlib.Path) -> list[tuple[str, int]]:
    """(qualified name, complexity) of every function and method in ``path``."""
    out = []
    for block in radon_complexity.cc_visit(path.read_text(encoding="utf-8")):
        if block.letter == "C":  # a class: radon also lists its methods on their own
            out += [(f"{block.name}.{m.name}", m.complexity) for m in block.methods]
        else:
            out.append((getattr(block, "fullname", block.name), block.complexity))
    return out


# the parts with the most intricate code keep to a lower limit
PART_LIMITS = {"engine": 25, "pools": 25, "declare": 25, "declare/conductor": 20}


def _limit(path: pathlib.Path) -> int:
    """The limit of the innermost part (a folder, or a folder of one) that holds ``path``."""
    folders = path.relative_to(ROOT).parts[:-1]
    for n in range(len(folders), 0, -1):
        limit = PART_LIMITS.get("/".join(folders[:n]))
        if limit is not None:
            return limit
    return MAX_COMPLEXITY


def test_no_function_of_the_package_is_above_the_complexity_limit() -> None:
    over = {f"{p.relative_to(ROOT.parent)}:{name}": cc for p in SOURCES
            for name, cc in _blocks(p) if cc > _limit(p)}
    assert over == {}


def test_the_part_limits_name_real_parts() -> None:
    assert all((ROOT / part / "__init__.py").is_file() for part in PART_LIMITS)


def test_no_module_is_over_the_line_limit() -> None:
    long = {str(p.relative_to(ROOT.parent)): n for p in SOURCES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_the_top_level_is_small_and_the_parts_are_folders() -> None:
    top = [p.name for p in ROOT.glob("*.py")]
    folders = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()]
    assert len(top) <= 10, sorted(top)
    assert len(folders) >= 6, sorted(folders)


def test_the_checker_sees_a_method_over_the_limit() -> None:
    branches = "\n".join(f"        if x == {i}:\n            return {i}" for i in range(MAX_COMPLEXITY))
    source = f"class K:\n    def m(self, x):\n{branches}\n        return -1\n"
    blocks = radon_complexity.cc_visit(source)
    assert [(m.name, m.complexity) for b in blocks if b.letter == "C" for m in b.methods] == [
        ("m", MAX_COMPLEXITY + 1)]
