"""The ``graph`` and ``run`` subcommands of ``python -m taskflow``, for declarative flows.

``graph FILE`` prints the Mermaid flowchart (or ``--format dot``) of a Conductor workflow
definition or a taskflow flow spec; ``run FILE --input JSON --registry MODULE`` runs it on a
thread pool and prints the run's report (``FlowResult.report()`` as JSON) on stdout, with a
one-line verdict on stderr. The kind of FILE is guessed from its content (a Conductor task has
a ``taskReferenceName``; ``--kind`` overrides).

A registry is a module (``--registry shop.workers``): its ``REGISTRY`` mapping if it has one,
otherwise its public functions by name; ``module:attribute`` names a mapping directly.

What ``run`` may import: a flow spec names its callables, so it is code. ``--allow-module
PREFIX`` (repeatable) refuses every callable of a flow spec, and a ``--registry``, outside those
modules, before anything is imported. ``sys.path`` is left alone unless ``--import-file-dir``
asks to also import task and registry modules from FILE's folder. For a Conductor definition,
``--allow-host HOST`` (repeatable) limits the hosts its HTTP tasks may reach and
``--max-response-bytes`` caps their responses. See ``docs/security.md``.

What is printed is safe for a terminal (``taskflow.cli.terminal``).

Hooked into ``taskflow.cli`` with ``add_graph_parser`` / ``add_run_parser``; each
sets ``handler`` on the parsed arguments (``args.handler(args, out, err) -> exit status``).
Exit status: 0 ok, 1 the flow failed, 2 a bad command line or definition.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from taskflow.cli.terminal import (
    EXIT_FLOW_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    budget,
    json_terminal_safe,
    positive_int,
    terminal_safe,
)
from taskflow.errors import FlowDefinitionError

__all__ = [
    "add_graph_parser",
    "add_run_parser",
    "detect_kind",
    "graph_command",
    "load_registry",
    "run_command",
]

Handler = Callable[[argparse.Namespace, TextIO, TextIO], int]


def _host(text: str) -> str:
    if not text or "/" in text or " " in text or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be a host name or host:port, got {text!r}")
    return text


def _module_prefix(text: str) -> str:
    if not text or not all(part.isidentifier() for part in text.split(".")):
        raise argparse.ArgumentTypeError(f"must be a module name such as myapp.tasks, got {text!r}")
    return text


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE",
                   help="a Conductor workflow definition (.json) or a flow spec (.json/.yaml)")
    p.add_argument("--kind", choices=("auto", "conductor", "spec"), default="auto",
                   help="what FILE is (default: guessed from its content)")


def add_graph_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``graph FILE [--format mermaid|dot]`` to ``subparsers`` (from ``add_subparsers``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "graph",
        help="print the flowchart of a Conductor workflow or a flow spec",
        description=("Print the flowchart of a Conductor workflow definition or a taskflow flow "
                     "spec: Mermaid (paste into any Mermaid renderer) or Graphviz DOT. Switch "
                     "case edges are labelled, optional edges dotted. No task code is run or "
                     "imported."),
        epilog="Exit status: 0 printed, 2 bad command line or invalid definition.",
    )
    _add_common(p)
    p.add_argument("--format", choices=("mermaid", "dot"), default="mermaid",
                   help="output format (default: %(default)s)")
    p.set_defaults(handler=graph_command)
    return p


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run FILE [--input JSON] [--registry MODULE] ...`` to ``subparsers``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run a Conductor workflow or a flow spec and print its report",
        description=("Run a Conductor workflow definition (its SIMPLE tasks' names looked up in "
                     "--registry) or a taskflow flow spec (its callables imported) on a thread "
                     "pool, and print the run's report as JSON."),
        epilog="Exit status: 0 flow ok, 1 flow failed, 2 bad command line or invalid definition.",
    )
    _add_common(p)
    p.add_argument("--input", default=None, metavar="JSON",
                   help="the workflow input as JSON text, or @FILE to read it (Conductor only)")
    p.add_argument("--registry", default=None, metavar="MODULE",
                   help=("module whose REGISTRY mapping (or public functions) implement the "
                         "tasks by name; MODULE:ATTR names a mapping (Conductor only)"))
    p.add_argument("--timeout", type=budget, default=None, metavar="SECONDS",
                   help="budget of the run (default: the definition's, else none)")
    p.add_argument("--workers", type=positive_int, default=8, metavar="N",
                   help="threads of the pool (default: %(default)s)")
    p.add_argument("--allow-module", action="append", type=_module_prefix, default=None,
                   metavar="PREFIX",
                   dest="allow_modules",
                   help=("import code only from this module or its submodules (repeatable): a "
                         "flow spec naming any other callable, or another --registry, is "
                         "refused before anything is imported (default: trust FILE)"))
    p.add_argument("--import-file-dir", action="store_true",
                   help=("also import task modules (and --registry) from FILE's folder, put on "
                         "sys.path for the import (default: sys.path is left alone)"))
    p.add_argument("--allow-host", action="append", type=_host, default=None, metavar="HOST",
                   dest="allow_hosts",
                   help=("HTTP tasks of a Conductor definition may reach only this host or "
                         "host:port (repeatable); a request (or a redirect) to any other host "
                         "fails its task without connecting (default: any host)"))
    p.add_argument("--max-response-bytes", type=positive_int, default=10 * 1024 * 1024,
                   metavar="N",
                   help="largest HTTP response body a Conductor HTTP task accepts (default: "
                        "%(default)s, 10 MiB)")
    p.add_argument("--mermaid", action="store_true",
                   help="also print the run's flowchart, coloured by state, after the report")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="log taskflow's node transitions to stderr (DEBUG)")
    p.set_defaults(handler=run_command)
    return p


# -- helpers ------------------------------------------------------------------------------------


def _read_json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON, a NUL
        return None


def detect_kind(path: str | Path) -> str:
    """``"conductor"`` or ``"spec"``: a Conductor task has ``taskReferenceName`` (or a ``type``)."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        return "spec"
    data = _read_json_file(p)
    tasks = data if isinstance(data, list) else data.get("tasks") if isinstance(data, dict) else None
    if isinstance(tasks, list):
        for t in tasks:
            if isinstance(t, dict) and ("taskReferenceName" in t or "type" in t):
                return "conductor"
            if isinstance(t, dict) and "callable" in t:
                return "spec"
    return "conductor" if isinstance(data, list) or (isinstance(data, dict) and "schemaVersion" in data) else "spec"


def load_registry(spec: str, base_dir: str | None = None,
                  allow_modules: Sequence[str] | None = None) -> Mapping[str, Callable[..., Any]]:
    """The registry named by ``spec`` (``module`` or ``module:attribute``).

    Args:
        spec: ``module`` or ``module:attribute``.
        base_dir: a folder tried when the module is not importable from ``sys.path`` (put on
            ``sys.path`` for that import only); None: ``sys.path`` is not touched.
        allow_modules: module-name prefixes the registry module must be in (None: any).

    Raises:
        FlowDefinitionError: the module is not allowed or cannot be imported, or the attribute
            is not a mapping.
    """
    module_name, _, attr = spec.partition(":")
    if allow_modules is not None and not any(
            module_name == p or module_name.startswith(p + ".") for p in allow_modules):
        raise FlowDefinitionError(f"registry module {module_name!r} is not allowed by "
                                  f"--allow-module {list(allow_modules)!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if base_dir is None or exc.name != module_name.split(".")[0]:
            hint = " (FILE's folder is searched only with --import-file-dir)" if base_dir is None else ""
            raise FlowDefinitionError(
                f"cannot import registry module {module_name!r}: {exc}{hint}") from None
        sys.path.insert(0, base_dir)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc2:
            raise FlowDefinitionError(f"cannot import registry module {module_name!r}: {exc2}") from None
        finally:
            if base_dir in sys.path:
                sys.path.remove(base_dir)
    except ImportError as exc:
        raise FlowDefinitionError(f"cannot import registry module {module_name!r}: {exc}") from None
    if attr:
        registry = getattr(module, attr, None)
        if not isinstance(registry, Mapping):
            raise FlowDefinitionError(f"{spec!r} is not a mapping of task name -> callable")
        return registry
    registry = getattr(module, "REGISTRY", None)
    if isinstance(registry, Mapping):
        return registry
    return {name: fn for name, fn in vars(module).items()
            if not name.startswith("_") and inspect.isfunction(fn)}


def _load(args: argparse.Namespace, *, for_run: bool) -> tuple[str, Any]:
    """("conductor", Workflow) or ("spec", Flow) for ``args.file``."""
    path = Path(args.file)
    if not path.exists():
        raise FlowDefinitionError(f"no such file: {str(path)!r}")
    kind = args.kind if args.kind != "auto" else detect_kind(path)
    if kind == "conductor":
        from taskflow import conductor

        registry = None
        if for_run:
            if not args.registry:
                raise FlowDefinitionError(
                    "running a Conductor workflow needs --registry MODULE (the task callables)")
            base_dir = str(path.resolve().parent) if args.import_file_dir else None
            registry = load_registry(args.registry, base_dir, args.allow_modules)
        if not for_run:
            return kind, conductor.load(path, registry)
        return kind, conductor.load(path, registry, allow_hosts=args.allow_hosts,
                                    max_response_bytes=args.max_response_bytes)
    from taskflow.declare.spec import load_spec

    if not for_run:
        return kind, load_spec(path, resolve=False)
    return kind, load_spec(path, allow_modules=args.allow_modules,
                           import_spec_dir=args.import_file_dir)


def _input(text: str | None) -> Any:
    if text is None:
        return {}
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, not UTF-8
            raise FlowDefinitionError(f"cannot read --input file {text[1:]!r}: {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlowDefinitionError(f"--input is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise FlowDefinitionError("--input is nested too deeply") from None
    if not isinstance(value, dict):
        raise FlowDefinitionError(f"--input must be a JSON object, got {type(value).__name__}")
    return value


# -- commands -----------------------------------------------------------------------------------


def _prog(args: argparse.Namespace) -> str:
    """The program name to start messages with: ``taskflow`` as the console script."""
    prog = getattr(args, "prog", None)
    return prog if isinstance(prog, str) and prog else "python -m taskflow"


def graph_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``graph FILE``: print the flowchart."""
    try:
        _, flow = _load(args, for_run=False)
    except FlowDefinitionError as exc:
        print(f"{_prog(args)} graph: error: {terminal_safe(exc)}", file=err)
        return EXIT_USAGE
    text = flow.to_dot() if args.format == "dot" else flow.to_mermaid()
    out.write(terminal_safe(text, keep_newlines=True))
    return EXIT_OK


def run_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``run FILE``: run it and print the report."""
    try:
        kind, flow = _load(args, for_run=True)
        workflow_input = _input(args.input)
        if kind == "spec" and args.input is not None:
            raise FlowDefinitionError("--input is for Conductor workflows; a flow spec's tasks "
                                      "take their param from the spec")
        if kind == "spec" and (args.allow_hosts is not None
                               or args.max_response_bytes != 10 * 1024 * 1024):
            raise FlowDefinitionError("--allow-host and --max-response-bytes are for Conductor "
                                      "workflows (their HTTP tasks); a flow spec has none")
    except FlowDefinitionError as exc:
        print(f"{_prog(args)} run: error: {terminal_safe(exc)}", file=err)
        return EXIT_USAGE
    pool = ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="taskflow-run")
    try:
        if kind == "conductor":
            result = flow.start(workflow_input, executor=pool, timeout=args.timeout)
            verdict = flow.status(result)
        else:
            result = flow.start(executor=pool, timeout=args.timeout)
            verdict = "ok" if result.ok else "FAILED"
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    print(json_terminal_safe(result.report().model_dump_json(indent=2)), file=out)
    if args.mermaid:
        out.write(terminal_safe(flow.to_mermaid(result), keep_newlines=True))
    print(f"{terminal_safe(flow.name)}: {verdict} in {result.elapsed * 1000:.1f} ms "
          f"({len(result.failed)} failed node(s))", file=err)
    if kind == "conductor":
        ok = verdict == "COMPLETED"
    else:
        ok = result.ok
    return EXIT_OK if ok else EXIT_FLOW_FAILED
