"""Fuzz of flow-spec documents: whatever the document, ``load_spec`` returns a flow or raises the
library's own error (a :class:`~taskflow.TaskflowError`), never a bare ``KeyError``/``TypeError``/
``ValueError`` from deep inside, and never hangs.

Only this module's callables may be imported (``allow_modules``), so a random document cannot
import anything else; a second run trusts the spec but names only harmless modules.
"""

from __future__ import annotations

import json
import math
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_spec import needs_yaml

from taskflow import TaskflowError
from taskflow.declare.spec import Flow, FlowSpec, SpecError, load_spec

HERE = "test_spec_fuzz"
NOT_CALLABLE = 42


def const(ctx: Any, param: Any) -> Any:
    return param


def pairs(ctx: Any, param: Any) -> Any:
    return [(i, i) for i in range(3)]


NAMES = ["a", "b", "c", "j", "t", "a.b", " ", "é", "<x>"]
CALLABLES = [f"{HERE}:const", f"{HERE}:pairs", f"{HERE}:NOT_CALLABLE", f"{HERE}:missing",
             f"{HERE}:const.__call__", f"{HERE}:json.dumps", "no_such_module_xyz:f", "json:dumps",
             "os:system", ".rel:f", "a:b:c", "a:", ":b", "a b:c", "x", "", "1a:b", "json:1"]

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(NAMES + CALLABLES + ["all", "any", "best_effort", "quorum"]),
)
anything = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8) | st.sampled_from(NAMES), inner,
                                            max_size=4)),
    max_leaves=12,
)
names = st.sampled_from(NAMES) | st.text(max_size=4)
name_lists = st.lists(names, max_size=4)
numbers = st.one_of(st.integers(min_value=-3, max_value=10**20),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans())
joins = st.one_of(st.sampled_from(["all", "any", "best_effort", "most"]),
                  st.fixed_dictionaries({"quorum": numbers | anything}))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A plausible value most of the time, anything at all otherwise."""
    return st.one_of(strategy, strategy, anything)


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": maybe(names),
    "callable": maybe(st.sampled_from(CALLABLES)),
    "param": anything,
    "fathers": maybe(st.lists(names | st.fixed_dictionaries(
        {"name": maybe(names)}, optional={"optional": maybe(st.booleans())}), max_size=3)),
    "join": maybe(joins),
    "optional": maybe(st.booleans()),
    "timeout": maybe(numbers | st.none()),
    "retries": maybe(numbers),
    "retry_backoff": maybe(numbers),
    "switch": maybe(st.fixed_dictionaries({}, optional={
        "cases": maybe(st.dictionaries(st.one_of(names, st.integers(), st.booleans(), st.none()),
                                       maybe(name_lists), max_size=3)),
        "default": maybe(name_lists | st.none())})),
    "fork": maybe(st.fixed_dictionaries({}, optional={
        "branches": maybe(st.lists(maybe(name_lists), max_size=3)),
        "join": maybe(st.fixed_dictionaries({}, optional={
            "name": maybe(names), "join_on": maybe(name_lists | st.none()),
            "policy": maybe(joins)}))})),
    "fanout": maybe(st.fixed_dictionaries({}, optional={
        "items": maybe(st.sampled_from(CALLABLES)), "work": maybe(st.sampled_from(CALLABLES)),
        "max_concurrency": maybe(numbers), "item_timeout": maybe(numbers | st.none()),
        "policy": maybe(st.sampled_from(["all", "best_effort", 0.5, 0, 2]) | numbers)})),
    "bogus": anything,
}


@st.composite
def tasks(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=6))
    keys |= draw(st.sampled_from([set(), {"name"}, {"name", "callable"}]))
    return {key: draw(FIELDS[key]) for key in sorted(keys)}


TASK_NAMES = ["a", "b", "c", "d", "e"]


def plausible_task(draw: st.DrawFn, name: str, before: list[str], after: list[str]
                   ) -> dict[str, Any]:
    """A task that is valid on its own: fathers among the tasks ``before`` it, switch cases and
    fork branches among those ``after`` it (mostly), with at most one field replaced by a
    random one: it reaches the graph builder."""
    earlier = st.sampled_from(before) if before else st.sampled_from(TASK_NAMES)
    later = st.sampled_from(after) if after else st.sampled_from(TASK_NAMES)
    kind = draw(st.sampled_from(["plain", "plain", "switch", "fork", "fanout"]))
    task: dict[str, Any] = {"name": name, "callable": f"{HERE}:const"}
    task["fathers"] = draw(st.lists(earlier | st.fixed_dictionaries(
        {"name": earlier, "optional": st.booleans()}), max_size=2, unique_by=str))
    if draw(st.booleans()):
        task["join"] = draw(st.sampled_from(["all", "any", "best_effort", {"quorum": 1},
                                             {"quorum": 3}]))
    if kind == "switch":
        task["switch"] = {"cases": draw(st.dictionaries(
            st.one_of(st.sampled_from(TASK_NAMES), st.integers(0, 2), st.booleans(), st.none()),
            st.lists(later, min_size=1, max_size=2), max_size=2)),
            "default": draw(st.none() | st.lists(later, min_size=1, max_size=2))}
    elif kind == "fork":
        del task["callable"]
        task["fork"] = {"branches": draw(st.lists(st.lists(later, min_size=1, max_size=2),
                                                  min_size=1, max_size=2)),
                        "join": {"name": f"{name}_joined",
                                 "join_on": draw(st.none() | st.lists(later, max_size=2)),
                                 "policy": draw(st.sampled_from(["all", "any"]))}}
    elif kind == "fanout":
        del task["callable"]
        task["fanout"] = {"items": f"{HERE}:pairs", "work": f"{HERE}:const",
                          "max_concurrency": draw(st.integers(1, 3)),
                          "policy": draw(st.sampled_from(["all", "best_effort", 0.5]))}
    if draw(st.booleans()):
        task["optional"] = True
    if draw(st.integers(0, 3)) == 0:
        task[draw(st.sampled_from(sorted(FIELDS)))] = draw(anything)
    return task


@st.composite
def plausible_documents(draw: st.DrawFn) -> dict[str, Any]:
    order = draw(st.permutations(TASK_NAMES))[:draw(st.integers(1, len(TASK_NAMES)))]
    return {"name": "fuzz", "tasks": [plausible_task(draw, name, order[:i], order[i + 1:])
                                      for i, name in enumerate(order)]}


documents = st.one_of(
    st.fixed_dictionaries({"tasks": maybe(st.lists(tasks(), max_size=5))}, optional={
        "name": maybe(names), "description": anything, "timeout": maybe(numbers | st.none()),
        "extra": anything}),
    plausible_documents(),
    plausible_documents(),
    anything,
)


def outcome(source: Any, **options: Any) -> Any:
    """load_spec's result, or the library error it raised (any other exception fails)."""
    try:
        return load_spec(source, **options)
    except TaskflowError as exc:
        assert str(exc)  # the message itself can be built
        return exc


def check(doc: Any, **options: Any) -> None:
    sources: list[Any] = []
    if isinstance(doc, dict):
        sources.append(doc)
        sources.append(json.dumps(doc))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "flow.json"
        path.write_text(json.dumps(doc))
        sources.append(path)
        for source in sources:
            got = outcome(source, **options)
            assert isinstance(got, (Flow, FlowSpec, TaskflowError))


FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(documents)
def test_any_document_builds_or_raises_a_library_error(doc: Any) -> None:
    check(doc, allow_modules=[HERE])


@FUZZ
@given(documents)
def test_any_document_read_without_imports_builds_or_raises_a_library_error(doc: Any) -> None:
    check(doc, resolve=False)
    check(doc, build=False, allow_modules=[HERE])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_a_trusted_document_naming_harmless_modules_builds_or_raises_a_library_error(
        doc: Any) -> None:
    text = json.dumps(doc)
    if "os:system" in text or ".rel" in text:
        return  # trusted mode imports what it names: keep to this module, json and a missing one
    check(doc)


@needs_yaml
@FUZZ
@given(documents)
def test_any_yaml_document_builds_or_raises_a_library_error(doc: Any) -> None:
    import yaml

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "flow.yaml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
        assert isinstance(outcome(path, allow_modules=[HERE]), (Flow, TaskflowError))


@needs_yaml
@FUZZ
@given(st.text(max_size=200))
def test_any_text_read_as_yaml_or_json_ends_in_a_library_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for suffix in (".yaml", ".json"):
            path = Path(folder) / f"flow{suffix}"
            path.write_text(text, encoding="utf-8")
            assert isinstance(outcome(path, allow_modules=[HERE]), (Flow, TaskflowError))
    assert isinstance(outcome("{" + text, allow_modules=[HERE]), (Flow, TaskflowError))


@FUZZ
@given(st.binary(max_size=64))
def test_any_bytes_in_a_file_end_in_a_library_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "flow.json"
        path.write_bytes(data)
        assert isinstance(outcome(path), (Flow, TaskflowError))


# -- what the fuzz found, pinned ---------------------------------------------------------------


def test_a_file_that_is_not_utf8_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    path.write_bytes(b'{"tasks": [{"name": "\xff"}]}')
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(path)


def test_a_path_with_a_nul_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec("flow\x00.json")


def test_an_integer_too_long_to_read_is_a_spec_error(tmp_path: Path) -> None:
    digits = "9" * 5000  # past sys.get_int_max_str_digits(): int() raises ValueError
    with pytest.raises(SpecError, match="invalid JSON"):
        load_spec('{"tasks": [{"name": "a", "callable": "m:f", "retries": ' + digits + "}]}")
    path = tmp_path / "flow.yaml"
    path.write_text(f"tasks:\n  - {{name: a, callable: 'm:f', retries: {digits}}}\n")
    if pytest.importorskip("yaml"):
        with pytest.raises(SpecError, match="invalid YAML"):
            load_spec(path)


def test_a_document_nested_too_deeply_is_a_spec_error(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(SpecError, match="nested too deeply"):
        load_spec('{"tasks": [{"name": "a", "callable": "m:f", "param": ' + deep + "}]}")
    path = tmp_path / "flow.yaml"
    path.write_text("tasks:\n  - {name: a, callable: 'm:f', param: " + deep + "}\n")
    if pytest.importorskip("yaml"):
        with pytest.raises(SpecError, match="nested too deeply"):
            load_spec(path)


@pytest.mark.parametrize("path", [".rel:f", "..rel:f", "a..b:f", "a:b..c", "1a:b", "a b:c",
                                  "a:b c", "a:1"])
def test_a_callable_path_must_be_dotted_names(path: str) -> None:
    # ".rel:f" reached importlib.import_module, which raised a bare TypeError
    with pytest.raises(SpecError, match="callable must be 'package.module:function'"):
        load_spec({"tasks": [{"name": "a", "callable": path}]})


def alias_bomb(levels: int, field: str) -> str:
    """A YAML spec whose task ``field`` is ``10**levels`` items made of nested aliases."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return ("defs:\n" + textwrap.indent("\n".join(lines), "  ") + "\n"
            f"tasks:\n  - {{name: a, callable: 'm:f', {field}: *l{levels - 1}}}\n")


@needs_yaml
@pytest.mark.parametrize("field", ["join", "callable", "fathers", "name", "timeout"])
@pytest.mark.parametrize("levels", [5, 9])
def test_a_yaml_alias_bomb_gives_a_short_message_quickly(tmp_path: Path, field: str,
                                                         levels: int) -> None:
    """Aliases make a few lines into 10**9 items; a message quoting the value in full would
    take minutes and gigabytes (before the fix, 5 levels gave a 500 KB message). Every value a
    message quotes is cut to a bounded repr."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(levels, field))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert len(str(info.value)) < 2000


def test_a_model_build_with_nan_and_inf_options_is_checked() -> None:
    spec = {"tasks": [{"name": "a", "callable": f"{HERE}:const", "timeout": math.nan}]}
    with pytest.raises(SpecError, match="timeout"):
        load_spec(spec)
    flow = load_spec({"tasks": [{"name": "a", "callable": f"{HERE}:const",
                                 "timeout": math.inf}]})
    assert isinstance(flow, Flow)


def test_flowspec_parse_rejects_non_documents() -> None:
    for data in (None, [], "tasks", 3, {"tasks": None}):
        with pytest.raises(SpecError):
            FlowSpec.parse(data)


def test_a_join_with_no_fathers_names_its_place_in_the_document() -> None:
    # the graph check's own FlowDefinitionError came out without a place (no ``errors``)
    with pytest.raises(SpecError) as info:
        load_spec({"tasks": [{"name": "a", "callable": f"{HERE}:const"},
                             {"name": "b", "callable": f"{HERE}:const", "join": "any"}]})
    assert info.value.errors == [("tasks[1]", "node 'b' has join Join.ANY but no fathers")]
