"""CPython's own thread-pool tests, re-run against taskflow's executors.

The interpreter's ``test.test_concurrent_futures`` (a single module up to 3.11, a package from
3.12 on; some builds ship without it) holds the tests CPython runs on ``ThreadPoolExecutor``:
the executor, shutdown, wait, as_completed and initializer classes. This module imports them
from the running interpreter (nothing of CPython's is copied here) and re-runs every class that
uses ``ThreadPoolMixin`` three times: on the stdlib pool itself (a control: a failure there is
this harness's, not ours; marked slow, so CI's runs on the other Pythons leave it out), on ``MonitoredExecutor(ThreadPoolExecutor(...))`` and on
``ThreadPool.fixed(...)``, the constructor of ``ThreadPool`` that takes ``ThreadPoolExecutor``'s
arguments.

The executor under test stands in for ``concurrent.futures.ThreadPoolExecutor`` wherever the
tests name it: as the class's ``executor_type``, as the module attribute (tests that build a
pool of their own) and in the child processes the shutdown tests start (their scripts import
it from ``concurrent.futures``; the child gets the same stand-in, and this checkout's taskflow
on its path).

Three tests pin what the stdlib does and JUC does not, and are expected to fail on
``ThreadPool``: below its core size it starts a thread per task instead of reusing an idle one
(``test_idle_thread_reuse``), and it names its threads ``{prefix}-{pool}_{n}`` (the two
thread-name tests). Every other test must pass on both of taskflow's executors.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import os
import pkgutil
import sys
import traceback
import unittest
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import taskflow

try:
    _SUITE: ModuleType | None = importlib.import_module("test.test_concurrent_futures")
except ImportError as exc:  # some builds ship without the test package
    _SUITE = None
    _MISSING = f"this Python ({sys.version.split()[0]}) has no test.test_concurrent_futures: {exc}"

if _SUITE is None:
    pytest.skip(_MISSING, allow_module_level=True)

# The source of each stand-in (taskflow is imported before the stand-in replaces the stdlib's
# name: taskflow's modules bind the real class) for concurrent.futures.ThreadPoolExecutor, run in this process
# and in the child processes of the shutdown tests.
_STANDINS = {
    "Stdlib": "from concurrent.futures.thread import ThreadPoolExecutor\n",
    "Monitored": (
        "import concurrent.futures.thread\n"
        "from taskflow import MonitoredExecutor\n"
        "def ThreadPoolExecutor(max_workers=None, *args, **kwargs):\n"
        "    return MonitoredExecutor(\n"
        "        concurrent.futures.thread.ThreadPoolExecutor(max_workers, *args, **kwargs))\n"
    ),
    "ThreadPool": (
        "from taskflow import ThreadPool\n"
        "def ThreadPoolExecutor(max_workers=None, *args, **kwargs):\n"
        "    return ThreadPool.fixed(max_workers, *args, **kwargs)\n"
    ),
}

# What the stdlib does and JUC's pool does not, by the executor that differs
_JUC_DIFFERENCES = {
    "ThreadPool": {
        "test_idle_thread_reuse": "below core_size a ThreadPool starts a thread per task, as JUC",
        "test_thread_names_assigned": "ThreadPool threads are named {prefix}-{pool}_{n}",
        "test_thread_names_default": "ThreadPool threads are named {prefix}-{pool}_{n}",
    },
}

# this checkout's taskflow, for the child processes (they run in a fresh environment)
_CHECKOUT = str(Path(taskflow.__file__).resolve().parent.parent)


def _modules(suite: ModuleType) -> list[ModuleType]:
    """The modules holding the tests: the package's ``test_*`` submodules, or the module."""
    if not hasattr(suite, "__path__"):
        return [suite]
    return [
        importlib.import_module(f"{suite.__name__}.{info.name}")
        for info in pkgutil.iter_modules(suite.__path__)
        if info.name.startswith("test_")
    ]


def _thread_pool_mixin(suite: ModuleType) -> type:
    holder = suite if not hasattr(suite, "__path__") else importlib.import_module(
        f"{suite.__name__}.util"
    )
    mixin: type = holder.ThreadPoolMixin
    return mixin


def _thread_pool_classes(modules: list[ModuleType], mixin: type) -> list[type]:
    """Every test class of ``modules`` that runs on the stdlib thread pool."""
    found: dict[int, type] = {}
    for mod in modules:
        for obj in vars(mod).values():
            if (
                isinstance(obj, type) and issubclass(obj, unittest.TestCase)
                and issubclass(obj, mixin) and obj.__module__ == mod.__name__
            ):
                found[id(obj)] = obj
    return sorted(found.values(), key=lambda c: c.__name__)


def _standin(label: str) -> Callable[..., concurrent.futures.Executor]:
    namespace: dict[str, Any] = {}
    exec(_STANDINS[label], namespace)  # our own source, the same the child runs
    factory: Callable[..., concurrent.futures.Executor] = namespace["ThreadPoolExecutor"]
    return factory


def _expected_failure(test: Callable[..., Any], reason: str) -> Callable[..., Any]:
    """A copy of CPython's test method that must fail (the original stays unmarked)."""

    @functools.wraps(test, updated=())
    def copy(self: unittest.TestCase) -> Any:
        try:
            return test(self)
        except BaseException as exc:
            # the failed test's frame holds its pool (it never reached its shutdown): free it,
            # so the pool is collected and its threads exit before the thread-leak check
            traceback.clear_frames(exc.__traceback__)
            raise

    return pytest.mark.xfail(strict=True, reason=reason)(copy)


_MODULES = _modules(_SUITE)
_CLASSES = _thread_pool_classes(_MODULES, _thread_pool_mixin(_SUITE))


def _rerun(label: str, base: type) -> type:
    attrs: dict[str, Any] = {
        "__module__": __name__,
        "executor_type": staticmethod(_standin(label)),
        "taskflow_standin": label,
        # a test forks a process pool while threads run (3.12+ warns about that)
        "pytestmark": [pytest.mark.filterwarnings(
            "ignore:This process .* is multi-threaded:DeprecationWarning"
        )] + ([pytest.mark.slow] if label == "Stdlib" else []),
    }
    for name, reason in _JUC_DIFFERENCES.get(label, {}).items():
        if hasattr(base, name):
            attrs[name] = _expected_failure(getattr(base, name), reason)
    name = base.__name__.replace("ThreadPool", label, 1) if label != "Stdlib" else base.__name__
    return type(f"{label}_{name}" if label == "Stdlib" else name, (base,), attrs)


for _label in _STANDINS:
    for _base in _CLASSES:
        _cls = _rerun(_label, _base)
        globals()[_cls.__name__] = _cls
del _label, _base, _cls


def test_the_interpreter_suite_has_the_thread_pool_classes() -> None:
    """The classes were found (a reorganised suite must fail here, not silently run nothing)."""
    names = {c.__name__ for c in _CLASSES}
    assert {"ThreadPoolExecutorTest", "ThreadPoolShutdownTest"} <= names, names
    assert sum(
        unittest.defaultTestLoader.loadTestsFromTestCase(c).countTestCases() for c in _CLASSES
    ) >= 40


def _in_child(label: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """``assert_python_ok`` whose child gets the stand-in and this checkout's taskflow."""

    def assert_python_ok(*args: Any, **env: Any) -> Any:
        if len(args) >= 2 and args[0] == "-c":
            preamble = (
                _STANDINS[label]
                + "import concurrent.futures\n"
                + "concurrent.futures.ThreadPoolExecutor = ThreadPoolExecutor\n"
            )
            args = ("-c", preamble + args[1], *args[2:])
        path = os.pathsep.join(p for p in (_CHECKOUT, os.environ.get("PYTHONPATH")) if p)
        return run(*args, __isolated=False, PYTHONPATH=path, **env)

    return assert_python_ok


@pytest.fixture(autouse=True)
def _standin_for_the_stdlib_pool(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    label = getattr(request.cls, "taskflow_standin", None)
    if label is None:
        yield
        return
    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", request.cls.executor_type)
    for mod in _MODULES:
        run = getattr(mod, "assert_python_ok", None)
        if run is not None:
            monkeypatch.setattr(mod, "assert_python_ok", _in_child(label, run))
    yield
