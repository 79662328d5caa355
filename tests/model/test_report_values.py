"""What a run's report carries, and what it keeps out:

* node results as JSON values when JSON can carry them, else a ``repr`` in ``result_repr``;
* a hook that raised, in ``FlowResult.hook_errors``, the report and the HTML page, with
  logging off;
* the context only when asked (``report(show_context=True)``, ``FlowResult.context``);
* errors raised in user code (hooks, ``on_alarm``, resilience callbacks) logged with their
  traceback as text, never as a record's exception (a ``diagnose=True`` sink would print the
  frames' variables).
"""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LONG
from hypothesis import given, settings
from hypothesis import strategies as st

from taskflow import FunctionNode, SchedulingNode, TaskContext, TaskScheduling, TaskSupport
from taskflow.model.report import json_value
from taskflow.model.result import HookError
from taskflow.resilience.callbacks import run_callbacks

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="report-values") as ex:
        yield ex


def run_returning(pool: ThreadPoolExecutor, value: Any) -> dict[str, Any]:
    """The JSON report's entry of a one-node run whose task returns ``value``."""
    node = FunctionNode(lambda ctx, p: value, name="n")
    result = TaskScheduling.start(node, executor=pool, timeout=LONG)
    assert result.ok
    data = json.loads(result.report().model_dump_json())
    entry: dict[str, Any] = data["nodes"][0]
    return entry


class Colour(enum.IntEnum):
    RED = 1


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque thing>"


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2**80, 1.5, "", "text with \"quotes\" and <tags>\n",
    [], {}, [1, "a", None, [2.5, {"k": [True]}]], {"page": {"price": 79.0, "tags": ["a", "b"]}},
])
def test_json_results_round_trip_as_values(pool: ThreadPoolExecutor, value: Any) -> None:
    entry = run_returning(pool, value)
    assert entry["result"] == value and type(entry["result"]) is type(value)
    assert entry["result_repr"] is None


@pytest.mark.parametrize(("value", "expected"), [
    ((1, 2, (3,)), [1, 2, [3]]),                     # tuples are carried as lists
    (Colour.RED, 1),                                  # subclasses as their base type
    (OrderedDict(a=1), {"a": 1}),
])
def test_json_like_results_are_carried_as_their_json_value(
        pool: ThreadPoolExecutor, value: Any, expected: Any) -> None:
    entry = run_returning(pool, value)
    assert entry["result"] == expected and entry["result_repr"] is None


@pytest.mark.parametrize(("value", "text"), [
    ({1, 2}, "{1, 2}"),
    (Opaque(), "<Opaque thing>"),
    (math.nan, "nan"),
    (math.inf, "inf"),
    ({1: "int key"}, "{1: 'int key'}"),
    ([1, Opaque()], "[1, <Opaque thing>]"),           # never split: the whole value as repr
    (b"bytes", "b'bytes'"),
])
def test_other_results_fall_back_to_a_marked_repr(pool: ThreadPoolExecutor, value: Any,
                                                  text: str) -> None:
    entry = run_returning(pool, value)
    assert entry["result"] is None and entry["result_repr"] == text


def test_a_long_repr_is_cut_and_a_raising_repr_is_named(pool: ThreadPoolExecutor) -> None:
    entry = run_returning(pool, [Opaque()] * 100)
    assert len(entry["result_repr"]) == 200 and entry["result_repr"].endswith("...")
    entry = run_returning(pool, BadRepr())
    assert entry["result_repr"] == "<BadRepr object; repr raised RuntimeError>"


def test_values_nested_too_deep_or_in_a_cycle_fall_back_to_repr() -> None:
    deep: list[Any] = []
    inner = deep
    for _ in range(150):
        inner.append([])
        inner = inner[0]
    assert json_value(deep)[0] is None and json_value(deep)[1] is not None
    loop: list[Any] = []
    loop.append(loop)
    assert json_value(loop) == (None, "[[...]]")


json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(json_data)
def test_any_json_value_survives_the_report_unchanged(value: Any) -> None:
    plain, text = json_value(value)
    assert text is None
    assert json.loads(json.dumps(plain)) == value


# -- hooks that raise -----------------------------------------------------------------------------


class Hooks(SchedulingNode[Any, Any]):
    """A node whose task returns ``param`` or raises it, and whose hooks named in
    ``self.raising`` raise."""

    def __init__(self, param: Any, raising: tuple[str, ...], **options: Any) -> None:
        super().__init__(param, **options)
        self.raising = raising

    def task(self, ctx: TaskContext, param: Any) -> Any:
        if isinstance(param, Exception):
            raise param
        return param

    def _maybe(self, hook: str) -> None:
        if hook in self.raising:
            raise KeyError(f"{hook} of {self.name} <broke>")

    def on_begin(self, support: TaskSupport) -> None:
        self._maybe("on_begin")

    def on_success(self, support: TaskSupport) -> None:
        self._maybe("on_success")

    def on_fail(self, support: TaskSupport) -> None:
        self._maybe("on_fail")


def test_a_raising_hook_shows_in_the_result_report_and_page_without_logging(
        pool: ThreadPoolExecutor) -> None:
    ok = Hooks({"v": 1}, ("on_success",), name="ok")
    bad = Hooks(ValueError("task failed"), ("on_fail",), name="bad")
    begin = Hooks(3, ("on_begin", "on_success"), name="begin")  # the first error is kept
    quiet = Hooks(4, (), name="quiet")
    ok >> [bad, begin, quiet]
    result = TaskScheduling.start(ok, executor=pool, timeout=LONG)
    assert result.states()["ok"].name == "SUCCESS" and result.outputs["ok"] == {"v": 1}
    assert result.states()["bad"].name == "EXCEPTION"

    errors = result.hook_errors
    assert set(errors) == {"ok", "bad", "begin"}
    hook = errors["ok"]
    assert isinstance(hook, HookError) and hook.hook == "on_success"
    assert isinstance(hook.exception, KeyError)
    assert errors["bad"].hook == "on_fail" and errors["begin"].hook == "on_begin"

    nodes = {n["name"]: n for n in json.loads(result.report().model_dump_json())["nodes"]}
    assert nodes["ok"]["hook_error"] == {"hook": "on_success", "type": "KeyError",
                                         "message": "'on_success of ok <broke>'"}
    assert nodes["bad"]["hook_error"]["hook"] == "on_fail"
    assert nodes["bad"]["error"] == "task failed"  # the node's own error is untouched
    assert nodes["quiet"]["hook_error"] is None

    page = result.to_html()
    assert "hook on_success raised KeyError: &#x27;on_success of ok &lt;broke&gt;&#x27;" in page
    assert "hook on_fail raised" in page and "<broke>" not in page


def test_a_hook_error_is_logged_as_text_not_as_a_record_exception(
        pool: ThreadPoolExecutor, taskflow_logs: list[dict[str, Any]]) -> None:
    node = Hooks(1, ("on_success",), name="n")
    TaskScheduling.start(node, executor=pool, timeout=LONG)
    hooks = [r for r in taskflow_logs if "hook on_success of node n raised" in r["message"]]
    assert len(hooks) == 1
    record = hooks[0]
    assert record["exception"] is None
    assert "Traceback (most recent call last)" in record["message"]
    assert "KeyError: 'on_success of n <broke>'" in record["message"]
    assert record["extra"]["node"] == "n" and record["level"].name == "ERROR"


def test_user_callbacks_are_logged_as_text(taskflow_logs: list[dict[str, Any]]) -> None:
    def broken(token: str) -> None:
        raise ValueError("callback broke")

    run_callbacks([(broken, ("tok",))])
    record = next(r for r in taskflow_logs if "resilience callback" in r["message"])
    assert record["exception"] is None and "ValueError: callback broke" in record["message"]


# -- the context, when asked ----------------------------------------------------------------------


def test_report_leaves_the_context_out_unless_asked(pool: ThreadPoolExecutor) -> None:
    ctx = TaskContext(user={"id": 7, "roles": ["a"]}, token="Bearer x", request=Opaque())
    result = TaskScheduling.start(FunctionNode(lambda c, p: 1, name="n"), executor=pool,
                                  timeout=LONG, context=ctx)
    data = json.loads(result.report().model_dump_json())
    assert data["context"] is None and data["context_repr"] is None
    data = json.loads(result.report(show_context=True).model_dump_json())
    assert data["context"] == {"user": {"id": 7, "roles": ["a"]}, "token": "Bearer x"}
    assert data["context_repr"] == {"request": "<Opaque thing>"}


def test_flow_result_context_is_a_read_only_view_of_the_runs_own_entries(
        pool: ThreadPoolExecutor) -> None:
    ctx = TaskContext(a=1)

    def write(c: TaskContext, p: Any) -> None:
        c["written"] = p

    first = TaskScheduling.start(FunctionNode(write, "first", name="w"), executor=pool,
                                 timeout=LONG, context=ctx)
    assert dict(first.context) == {"a": 1, "written": "first"}
    with pytest.raises(TypeError):
        first.context["a"] = 2  # type: ignore[index]
    second = TaskScheduling.start(FunctionNode(write, "second", name="w"), executor=pool,
                                  timeout=LONG, context=ctx)
    assert first.context["written"] == "first" and second.context["written"] == "second"
    assert "first" not in repr(first)  # the result's repr still leaves values out


def test_an_on_fail_that_raises_at_the_deadline_is_in_the_result(
        pool: ThreadPoolExecutor, gate: Any) -> None:
    release = gate()

    class Stuck(Hooks):
        def task(self, ctx: TaskContext, param: Any) -> Any:
            release.wait(LONG)
            return param

    node = Stuck(1, ("on_fail",), name="stuck")
    result = TaskScheduling.start(node, executor=pool, timeout=0.05)
    release.set()
    assert result.states()["stuck"].name == "TIMEOUT"
    assert result.hook_errors["stuck"].hook == "on_fail"  # run by the caller before returning
