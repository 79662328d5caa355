"""A flow spec is code: ``allow_modules`` limits what it may import, and ``sys.path`` is left alone.

Each test writes its own task modules into ``tmp_path`` under names unique to
the test, so a module "not imported" can be checked in ``sys.modules`` and by its side effect.
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_spec import needs_yaml

from taskflow import FlowDefinitionError, TaskflowError
from taskflow.cli import main as cli_main
from taskflow.declare.spec import FlowSpec, SpecError, load_spec


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spec-trust")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


class Modules:
    """Task modules written into a folder; each import leaves a marker file (its side effect)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tag = uuid.uuid4().hex[:8]

    def name(self, stem: str) -> str:
        return f"{stem}_{self.tag}"

    def write(self, stem: str, body: str = "") -> str:
        """Write ``<stem>_<tag>.py`` that marks its import, then ``body``; its module name."""
        name = self.name(stem)
        marker = self.folder / f"{name}.imported"
        code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('yes')\n"
        (self.folder / f"{name}.py").write_text(code + textwrap.dedent(body))
        return name

    def imported(self, name: str) -> bool:
        return name in sys.modules or (self.folder / f"{name}.imported").exists()


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Modules]:
    mods = Modules(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield mods
    for name in [n for n in sys.modules if n.endswith(mods.tag)]:
        del sys.modules[name]


TASKS = """\
import os
import subprocess
from os import system
from subprocess import run as run_process


def work(ctx, param):
    return param


def _private(ctx, param):
    return "private"


class Tasks:
    @staticmethod
    def double(ctx, param):
        return 2 * param


from functools import partial

triple = partial(lambda factor, ctx, param: factor * param, 3)
print_it = print
"""


def doc(*callables: str, **fields: Any) -> dict[str, Any]:
    return {"tasks": [{"name": f"t{i}", "callable": c, **fields}
                      for i, c in enumerate(callables)]}


# -- refused before anything is imported --------------------------------------------------------


@pytest.mark.parametrize("path", ["os:system", "subprocess:run", "builtins:eval",
                                  "importlib:import_module"])
def test_a_callable_outside_the_allow_list_is_refused_naming_it_and_its_place(
        modules: Modules, path: str) -> None:
    tasks = modules.write("tasks", TASKS)
    with pytest.raises(SpecError) as info:
        load_spec(doc(f"{tasks}:work", path), allow_modules=[tasks])
    assert info.value.errors == [(
        "tasks[1].callable",
        (f"callable {path!r} is not allowed: module {path.split(':')[0]!r} is not in "
         f"allow_modules [{tasks!r}]"))]
    assert isinstance(info.value, FlowDefinitionError)


def test_nothing_is_imported_when_any_callable_is_refused(modules: Modules) -> None:
    allowed = modules.write("allowed", "def f(ctx, p):\n    return p\n")
    other = modules.write("other", "def f(ctx, p):\n    return p\n")
    spec = {"tasks": [
        {"name": "a", "callable": f"{allowed}:f"},
        {"name": "b", "fathers": ["a"], "fanout": {"items": f"{allowed}:f", "work": f"{other}:f"}},
    ]}
    with pytest.raises(SpecError) as info:
        load_spec(spec, allow_modules=(allowed,))
    assert [place for place, _ in info.value.errors] == ["tasks[1].fanout.work"]
    # the refused module, and the allowed one named before it, were never imported
    assert not modules.imported(other) and not modules.imported(allowed)


def test_every_refused_callable_is_listed_at_once(modules: Modules) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(doc("os:system", "shutil:rmtree", "os.path:join"), allow_modules=["myapp"])
    assert [place for place, _ in info.value.errors] == [
        "tasks[0].callable", "tasks[1].callable", "tasks[2].callable"]
    assert str(info.value).startswith("3 errors\n")


@pytest.mark.parametrize(("prefix", "module", "allowed"), [
    ("myapp.tasks", "myapp.tasks", True),
    ("myapp.tasks", "myapp.tasks.x", True),
    ("myapp.tasks", "myapp.tasks.x.y", True),
    ("myapp.tasks", "myapp.tasksevil", False),
    ("myapp.tasks", "myapp.tasks_x", False),
    ("myapp.tasks", "myapp", False),
    ("myapp.tasks", "myapp.task", False),
    ("myapp.tasks", "other.myapp.tasks", False),
    ("myapp", "myapp.tasks", True),
    ("myapp", "myappx.tasks", False),
    ("os", "os", True),
    ("os", "os.path", True),
    ("os", "posix", False),
])
def test_prefixes_match_on_dotted_boundaries(prefix: str, module: str, allowed: bool) -> None:
    # resolve=False: nothing is imported, the allow-list is still enforced
    spec = doc(f"{module}:fn")
    if allowed:
        flow = load_spec(spec, allow_modules=[prefix], resolve=False)
        assert list(flow.nodes) == ["t0"]
    else:
        with pytest.raises(SpecError, match=f"module '{module}' is not in allow_modules"):
            load_spec(spec, allow_modules=[prefix], resolve=False)


def test_an_empty_allow_list_refuses_every_callable() -> None:
    with pytest.raises(SpecError, match="is not in allow_modules"):
        load_spec(doc("json:dumps"), allow_modules=[], resolve=False)


def test_the_allow_list_must_be_a_sequence_of_module_names() -> None:
    with pytest.raises(TypeError, match="allow_modules must be None or a sequence"):
        load_spec(doc("json:dumps"), allow_modules="json")  # a str would allow "j", "s", ...
    with pytest.raises(TypeError, match="allow_modules"):
        load_spec(doc("json:dumps"), allow_modules=3)  # type: ignore[arg-type]
    for bad in ("", "my app", "myapp.", ".myapp", "myapp..x", 7):
        with pytest.raises(FlowDefinitionError, match="is not a module name"):
            load_spec(doc("json:dumps"), allow_modules=[bad])  # type: ignore[list-item]


# -- the allowed module cannot be used as a way out ----------------------------------------------


def test_an_allowed_module_runs(modules: Modules, pool: ThreadPoolExecutor) -> None:
    tasks = modules.write("tasks", TASKS)
    spec = {"tasks": [{"name": "a", "callable": f"{tasks}:work", "param": 21},
                      {"name": "b", "callable": f"{tasks}:Tasks.double", "param": 2},
                      {"name": "c", "callable": f"{tasks}:triple", "param": 3}]}
    result = load_spec(spec, allow_modules=[tasks]).start(executor=pool)
    assert result.outputs == {"a": 21, "b": 4, "c": 9}


@pytest.mark.parametrize(("attr", "reason"), [
    ("os.system", "'os' is a module"),
    ("subprocess.run", "'subprocess' is a module"),
    ("system", "it is defined in module 'posix'"),
    ("run_process", "it is defined in module 'subprocess'"),
    ("partial", "it is defined in module 'functools'"),
    ("print_it", "it is defined in module 'builtins'"),
    ("_private", "private attributes are refused"),
    ("Tasks.__init__", "private attributes are refused"),
])
def test_an_allowed_module_does_not_lend_out_what_it_imported(
        modules: Modules, attr: str, reason: str) -> None:
    if attr == "system" and sys.platform == "win32":  # pragma: no cover - posix is 'nt' there
        pytest.skip("os.system lives in 'nt' on Windows")
    tasks = modules.write("tasks", TASKS)
    with pytest.raises(SpecError) as info:
        load_spec(doc(f"{tasks}:{attr}"), allow_modules=[tasks])
    assert info.value.errors[0][0] == "tasks[0].callable"
    assert reason in info.value.errors[0][1] and f"{tasks}:{attr}" in info.value.errors[0][1]


def test_without_an_allow_list_the_spec_is_trusted(modules: Modules) -> None:
    tasks = modules.write("tasks", TASKS)
    flow = load_spec(doc(f"{tasks}:subprocess.run", f"{tasks}:_private"))
    assert set(flow.nodes) == {"t0", "t1"}


def test_flowspec_build_and_build_false_check_the_allow_list_too() -> None:
    spec = FlowSpec.parse(doc("os:system"))
    with pytest.raises(SpecError, match="'os:system' is not allowed"):
        spec.build(allow_modules=["myapp"])
    with pytest.raises(SpecError, match="'os:system' is not allowed"):
        load_spec(doc("os:system"), allow_modules=["myapp"], build=False)
    assert isinstance(load_spec(doc("os:system"), build=False), FlowSpec)


@needs_yaml
def test_a_refusal_in_a_yaml_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text(textwrap.dedent("""\
        name: shell
        tasks:
          - name: ok
            callable: myapp.tasks:fetch
          - name: shell
            callable: os:system
            param: "rm -rf /"
        """))
    with pytest.raises(SpecError) as info:
        load_spec(path, allow_modules=["myapp.tasks"])
    assert info.value.errors[0][0] == "tasks[1].callable (line 6)"
    assert str(path) in str(info.value) and "'os:system'" in str(info.value)


# -- sys.path is left alone unless asked ------------------------------------------------------


def test_the_spec_folder_is_not_searched_unless_asked(tmp_path: Path,
                                                      pool: ThreadPoolExecutor) -> None:
    mods = Modules(tmp_path)  # NOT on sys.path
    beside = mods.write("beside", "import sys\nPATH = list(sys.path)\n"
                                  "def f(ctx, p):\n    return 'beside'\n")
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(doc(f"{beside}:f")))
    before = list(sys.path)
    try:
        with pytest.raises(SpecError) as info:
            load_spec(path)
        assert "cannot import module" in str(info.value)
        assert "import_spec_dir=True" in str(info.value)
        assert sys.path == before and not mods.imported(beside)

        result = load_spec(path, import_spec_dir=True).start(executor=pool)
        assert result.outputs == {"t0": "beside"}
        assert sys.path == before  # it was there for the import only
        assert str(tmp_path) in sys.modules[beside].PATH
    finally:
        sys.modules.pop(beside, None)


def test_import_spec_dir_still_obeys_the_allow_list(tmp_path: Path) -> None:
    mods = Modules(tmp_path)
    beside = mods.write("beside", "def f(ctx, p):\n    return p\n")
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(doc(f"{beside}:f")))
    with pytest.raises(SpecError, match="is not in allow_modules"):
        load_spec(path, import_spec_dir=True, allow_modules=["myapp"])
    assert not mods.imported(beside)


# -- command line -------------------------------------------------------------------------------


def test_cli_run_refuses_a_callable_outside_allow_module(
        modules: Modules, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = modules.write("tasks", TASKS)
    path = modules.folder / "flow.json"
    path.write_text(json.dumps(doc(f"{tasks}:work", "subprocess:run")))
    assert cli_main(["run", str(path), "--allow-module", "myapp", "--allow-module", tasks]) == 2
    err = capsys.readouterr().err
    assert "tasks[1].callable" in err and "'subprocess:run' is not allowed" in err
    assert not modules.imported(tasks)


def test_cli_run_with_allow_module_runs_an_allowed_spec(
        modules: Modules, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = modules.write("tasks", TASKS)
    path = modules.folder / "flow.json"
    path.write_text(json.dumps({"tasks": [{"name": "a", "callable": f"{tasks}:work",
                                           "param": 1}]}))
    assert cli_main(["run", str(path), "--allow-module", tasks]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_cli_allow_module_must_be_a_module_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["run", "flow.json", "--allow-module", "my app"])
    assert info.value.code == 2
    assert "must be a module name" in capsys.readouterr().err


def test_cli_import_file_dir_is_needed_for_modules_beside_the_spec(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mods = Modules(tmp_path)
    beside = mods.write("beside", "def f(ctx, p):\n    return p\n")
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(doc(f"{beside}:f")))
    before = list(sys.path)
    try:
        assert cli_main(["run", str(path)]) == 2
        assert "cannot import module" in capsys.readouterr().err
        assert not mods.imported(beside)
        assert cli_main(["run", str(path), "--import-file-dir"]) == 0
        assert sys.path == before
    finally:
        sys.modules.pop(beside, None)


def test_cli_allow_module_also_limits_the_conductor_registry(
        capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "notification_workflow.json"
    status = cli_main(["run", str(example), "--registry", "os", "--allow-module", "myapp"])
    assert status == 2
    assert "registry module 'os' is not allowed" in capsys.readouterr().err


def test_refusals_are_library_errors() -> None:
    with pytest.raises(TaskflowError):
        load_spec(doc("os:system"), allow_modules=["x"])


def test_cli_registry_beside_the_file_needs_import_file_dir(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "notification_workflow.json"
    monkeypatch.delitem(sys.modules, "conductor_notifications", raising=False)  # an earlier run
    before = list(sys.path)
    assert cli_main(["run", str(example), "--registry", "conductor_notifications"]) == 2
    assert "searched only with --import-file-dir" in capsys.readouterr().err
    assert sys.path == before and "conductor_notifications" not in sys.modules
