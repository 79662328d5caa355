"""taskflow's log lines (loguru), as loguru asks of a library, and the switch for per-node lines.

* Nothing is written until the application calls ``logger.enable("taskflow")`` (``import
  taskflow`` disables it); taskflow never adds, removes or configures a sink.
* Enabled, a run writes a line only when something went wrong: ``WARNING`` for a node that ended
  ``EXCEPTION`` (with its traceback as text) or ``TIMEOUT``, and for a late exception of an
  abandoned node; ``INFO`` for a cancelled node; ``ERROR`` for a hook that raised or a bug in
  taskflow.
* Per-node ``DEBUG`` lines (each attempt, each node's end, retries, late results, the end of the
  run: about two lines per node) are opt-in, on top of a sink at ``DEBUG``:
  ``taskflow.logs.log_nodes()``. A request handler that enabled taskflow under a default
  (``DEBUG``) sink would otherwise write a dozen lines per request.
* Every line about a run carries ``flow_id``, ``flow`` (its name) and ``node`` (None for lines
  about the whole run) in ``record["extra"]``, and so do the values the caller bound with
  ``logger.contextualize()`` (a trace id): nodes run in a copy of the caller's contextvars on
  thread executors, and taskflow logs there.

In production, one JSON object per line, at ``INFO``::

    logger.remove()
    logger.add(sys.stderr, level="INFO", serialize=True)
    logger.enable("taskflow")

loguru itself is loaded by whoever uses it, never by ``import taskflow`` (it and what it imports
are most of a plain import's cost). taskflow writes through ``logger`` below: loguru's logger once
loguru is imported, and nothing before, since nothing could show a line then (a sink, and
``logger.enable("taskflow")`` itself, need ``import loguru``). So taskflow stays disabled at the
moment loguru loads, whenever that is: when ``import taskflow`` finds loguru imported already it
calls ``logger.disable("taskflow")`` then; otherwise an import hook calls it just after loguru's
own module has run, before the statement that imported loguru returns. Nothing is imported while
a run is in progress on taskflow's account.

A failure's traceback is written as text in the message, never through
``logger.opt(exception=...)``: a sink with ``diagnose=True`` (loguru's default) would print the
values of the variables of every frame, the task's arguments and the request's data included.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

    from loguru import Logger

# ``logger`` and ``loguru_logger`` are what taskflow's own modules write through
__all__ = ["log_nodes", "logging_nodes"]

_node_lines = False
_loguru: Any = None  # loguru's logger, once loguru is imported and taskflow disabled in it


class _Silent:
    """What ``logger`` gives before loguru is imported: takes any call, writes nothing."""

    def __getattr__(self, name: str) -> _Silent:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _Silent:
        return self

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_SILENT = _Silent()


class _Logger:
    """taskflow's logger: loguru's once loguru is imported (a call reaches loguru from the
    caller's own frame, so each line names the module that wrote it), silent before."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        real = _loguru
        return _SILENT if real is None else getattr(real, name)

    def __repr__(self) -> str:
        return "<taskflow logger: loguru's>" if _loguru is not None else (
            "<taskflow logger: silent until loguru is imported>")


logger = cast("Logger", _Logger())


def loguru_logger() -> Logger | None:
    """loguru's logger as taskflow writes to it, or None while loguru is not imported."""
    return cast("Logger | None", _loguru)


def _adopt(module: ModuleType) -> None:
    global _loguru
    real = module.logger
    real.disable("taskflow")
    _loguru = real


class _AfterLoguru:
    """The loader of ``loguru`` with one step added after it ran: :func:`_adopt`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return None if create is None else cast("ModuleType | None", create(spec))

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        # the module keeps the loader that found it
        spec: Any = module.__spec__
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        _adopt(module)
        _HOOK.remove()


class _LoguruHook:
    """A finder first on ``sys.meta_path`` that answers for ``loguru`` alone: it asks the other
    finders for loguru's spec and wraps its loader in :class:`_AfterLoguru`."""

    def __init__(self) -> None:
        self.asking = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        if fullname != "loguru" or self.asking:
            return None
        self.asking = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec: ModuleSpec | None = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _AfterLoguru(spec.loader)  # type: ignore[assignment]
                    return spec
            return None
        finally:
            self.asking = False

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)


_HOOK = _LoguruHook()


def _watch_for_loguru() -> None:
    """At ``import taskflow``: disable taskflow in loguru now if it is imported, else as soon
    as it is."""
    module = sys.modules.get("loguru")
    if module is not None and hasattr(module, "logger"):
        _adopt(module)
    else:
        _HOOK.install()


_watch_for_loguru()


def log_nodes(on: bool = True) -> None:
    """Write per-node ``DEBUG`` lines for runs started from now on (``on=False``: stop).

    They reach a sink only if taskflow is enabled (``logger.enable("taskflow")``) and the sink
    takes ``DEBUG``.
    """
    global _node_lines
    _node_lines = bool(on)


def logging_nodes() -> bool:
    """Whether per-node ``DEBUG`` lines are on ([`log_nodes`][taskflow.logs.log_nodes])."""
    return _node_lines
