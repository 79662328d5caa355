"""The ``taskflow`` command line: ``taskflow demo | graph | run`` (or ``python -m taskflow ...``).

One parser, one ``main`` and the demo's printed table here; the rest lives beside it:

* ``taskflow.cli.demo`` — the product-detail flow that ``demo`` runs, against the same calls
  made stage by stage by hand;
* ``taskflow.cli.flows`` — ``graph`` and ``run`` for Conductor definitions and flow specs;
* ``taskflow.cli.terminal`` — what may reach the terminal (user data escaped), the option
  parsers shared by the subcommands, and the exit codes.

This package is an application, not library code: it is the one place in taskflow that configures
loguru, and only when asked (``--verbose``). By default it prints the demo's output and nothing
else. Exit status: 0 the flow succeeded, 1 it failed (``--fail``, a too short ``--timeout``),
2 the command line was wrong (or the ``taskflow`` package found is not this one).
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TextIO

import taskflow
from taskflow import logs
from taskflow._version import __version__

SHADOWED_HINT = (
    "error: the 'taskflow' package imported from {where} is not taskflow-juc (this command's "
    "package, version {version}); most likely OpenStack's TaskFlow is installed in the same "
    "environment, and both use the import name 'taskflow'. Use a separate virtual environment, "
    "or 'pip uninstall taskflow' there and then reinstall taskflow-juc."
)


def check_not_shadowed(package: ModuleType) -> str | None:
    """Return a hint when ``package`` (the imported ``taskflow``) is another project's.

    OpenStack's TaskFlow is published as ``taskflow`` on the package index and imports as
    ``taskflow`` too. Installed next to taskflow-juc it wins the import (or its files overwrite
    ours), and every ``from taskflow import TaskScheduling`` fails with a bare ImportError. The
    command line runs this check first so that it can say why.

    Args:
        package: The module ``import taskflow`` returned.

    Returns:
        None when it is this project's package; otherwise the message to print.
    """
    if getattr(package, "__version__", None) == __version__ and hasattr(
        package, "TaskScheduling"
    ):
        return None
    where = getattr(package, "__file__", None) or "an unknown place"
    return SHADOWED_HINT.format(where=where, version=__version__)


# ``import taskflow`` ran before this module: when it found another project's package, stop
# here with the hint, before importing the modules that would fail with a bare ImportError.
_SHADOWED = check_not_shadowed(taskflow)
if _SHADOWED is not None:  # pragma: no cover - exercised in a subprocess by tests/cli/test_commands.py
    print(_SHADOWED, file=sys.stderr)
    raise SystemExit(2)

from loguru import logger

from taskflow.cli.demo import NODE_NAMES, DemoRun, run_demo
from taskflow.cli.flows import add_graph_parser, add_run_parser
from taskflow.cli.terminal import (
    EXIT_FLOW_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    budget,
    json_terminal_safe,
    log_sink,
    positive_int,
    terminal_safe,
)
from taskflow.errors import did_you_mean
from taskflow.metrics import Percentiles, PoolMetrics
from taskflow.model.result import FlowResult
from taskflow.pools.threadpool import ThreadPool

__all__ = ["build_parser", "check_not_shadowed", "format_table", "main", "program_name"]


def program_name(argv0: str | None = None) -> str:
    """Return how the user invoked the command, for ``--help`` and error messages.

    Args:
        argv0: ``sys.argv[0]``; None reads it.

    Returns:
        ``python -m taskflow`` when run as a module (argv[0] is the package's ``__main__.py``),
        otherwise the script's base name: ``taskflow`` for the console script.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    base = os.path.basename(argv0)
    if not base or base in ("__main__.py", "-c", "-m") or base.startswith("python"):
        return "python -m taskflow"
    return os.path.splitext(base)[0] if base.endswith((".py", ".exe")) else base


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Return the parser of the ``taskflow`` command and its subcommands.

    Args:
        prog: The program name shown in help and errors; None works it out from ``sys.argv``
            (see ``program_name``).
    """
    parser = argparse.ArgumentParser(
        prog=program_name() if prog is None else prog,
        description="Orchestrate a DAG of tasks on a concurrent.futures executor.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"taskflow-juc {__version__}",
        help="print the version of taskflow-juc and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the product-detail aggregation and compare it with hand-written stages",
        description=(
            "Run the product-detail aggregation of the JUC orchestration article: the product "
            "side (product_info -> price, stock) and the item side (category -> reviews, "
            "recommendations) in parallel, then aggregate. Print a per-node table, the Mermaid "
            "Gantt chart of the run, and the same work done the hand-written staged way "
            "(product stage, then item stage) with the speed-up."
        ),
        epilog=(
            "nodes: " + ", ".join(NODE_NAMES) + ". "
            "Exit status: 0 flow ok, 1 flow failed, 2 bad command line."
        ),
    )
    demo.add_argument(
        "--timeout",
        type=budget,
        default=1.0,
        metavar="SECONDS",
        help="global budget of the run in seconds (default: %(default)s)",
    )
    demo.add_argument(
        "--workers",
        type=positive_int,
        default=8,
        metavar="N",
        help="threads of the embedded pool (default: %(default)s)",
    )
    demo.add_argument(
        "--fail",
        metavar="NODE",
        help="make NODE raise, to show fail-fast (its sons fail without running)",
    )
    demo.add_argument(
        "--json",
        action="store_true",
        help="print the run's report as JSON instead of the table, chart and comparison",
    )
    demo.add_argument(
        "--html",
        metavar="FILE",
        help="also write the run as one self-contained HTML page (graph and timeline) to FILE",
    )
    demo.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="log taskflow's node transitions to stderr (DEBUG)",
    )
    add_graph_parser(commands)
    add_run_parser(commands)
    return parser


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _relative(at: float | None, origin: float) -> float | None:
    return None if at is None else at - origin


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal: wide (East Asian) characters two, combining none."""
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def _pad(text: str, width: int, *, right: bool = False) -> str:
    fill = " " * max(0, width - _width(text))
    return fill + text if right else text + fill


def format_table(result: FlowResult, order: Iterable[str] = ()) -> str:
    """Return the per-node table of a run: state, thread, and times relative to the run start.

    Node and thread names are user data: control characters in them (an ANSI escape sequence,
    a line break) are printed as visible escapes (``terminal_safe``),
    so every row stays one line and cannot restyle the terminal.

    Args:
        result: The run.
        order: Node names to list first, in this order; the others follow sorted by name.

    Returns:
        Aligned plain-text lines, times in milliseconds, ``-`` for a time that never came.
    """
    names = [name for name in order if name in result]
    names += sorted(name for name in result if name not in names)
    header = ("node", "state", "thread", "queued ms", "started ms", "duration ms")
    rows = [header]
    for name in names:
        work_result = result[name].work_result
        rows.append(
            (
                terminal_safe(name),
                work_result.state.name,
                terminal_safe(work_result.thread or "-"),
                _ms(_relative(work_result.queued_at, result.started_at)),
                _ms(_relative(work_result.started_at, result.started_at)),
                _ms(work_result.duration),
            )
        )
    widths = [max(_width(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        # text columns left-aligned, times right-aligned
        cells = [
            _pad(cell, width, right=i >= 3) for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _format_failures(result: FlowResult) -> str:
    lines = []
    for name, work_result in result.failed.items():
        exc = work_result.exception
        line = f"  {terminal_safe(name)}: {work_result.state.name}: {terminal_safe(repr(exc))}"
        if exc is not None and exc.__cause__ is not None:
            line += f"\n      caused by {terminal_safe(repr(exc.__cause__))}"
        lines.append(line)
    return "\n".join(lines)


def _comparison_line(flow_elapsed: float, staged_elapsed: float) -> str:
    """Both measured times and their difference, as measured: no rounding into a verdict."""
    diff = staged_elapsed - flow_elapsed
    if diff >= 0:
        verdict = f"taskflow took {diff * 1000:.1f} ms less"
    else:
        verdict = f"taskflow took {-diff * 1000:.1f} ms more"
    ratio = f"staged / taskflow = {staged_elapsed / flow_elapsed:.2f}" if flow_elapsed > 0 else ""
    return (
        f"taskflow {flow_elapsed * 1000:.1f} ms, hand-written stages "
        f"{staged_elapsed * 1000:.1f} ms: {verdict}" + (f" ({ratio})" if ratio else "")
    )


def _print_demo(run: DemoRun, args: argparse.Namespace, out: TextIO) -> None:
    result = run.result
    verdict = "ok" if result.ok else f"FAILED ({len(result.failed)} node(s))"
    print(
        f"\nproduct-detail flow {result.flow_id}: {verdict} in {result.elapsed * 1000:.1f} ms "
        f"on a pool of {args.workers} threads\n",
        file=out,
    )
    print(format_table(result, NODE_NAMES), file=out)
    if not result.ok:
        print("\nfailures:", file=out)
        print(_format_failures(result), file=out)
    print("\nMermaid Gantt chart of the run (paste into any Mermaid renderer):\n", file=out)
    print(terminal_safe(result.to_mermaid().rstrip(), keep_newlines=True), file=out)
    print(
        "\nthe same work, hand-written the article's way (product stage, then item stage):",
        file=out,
    )
    if run.staged_elapsed is not None:
        print(f"  staged run: {run.staged_elapsed * 1000:.1f} ms", file=out)
        if result.ok:
            print("\n" + _comparison_line(result.elapsed, run.staged_elapsed), file=out)
    elif run.staged_timed_out:
        print(f"  staged run: did not finish within the {args.timeout:g} s budget", file=out)
    else:
        print("  skipped: --fail makes a node fail, so there is nothing to compare", file=out)


def _demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.fail is not None and args.fail not in NODE_NAMES:
        print(
            f"{args.prog} demo: error: unknown node {args.fail!r}"
            f"{did_you_mean(args.fail, NODE_NAMES)} for --fail; "
            f"nodes are: {', '.join(NODE_NAMES)}",
            file=err,
        )
        return EXIT_USAGE
    # hook lines go where they cannot spoil the JSON on stdout
    echo = err if args.json else out
    pool = ThreadPool(args.workers, thread_name_prefix="demo")
    try:
        run = run_demo(pool, timeout=args.timeout, fail=args.fail, echo=echo)
        metrics = pool.metrics()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if args.html is not None:
        with open(args.html, "w", encoding="utf-8") as page:
            page.write(run.result.to_html())
        print(f"run page written to {terminal_safe(args.html)}", file=err)
    if args.json:
        print(json_terminal_safe(run.result.report().model_dump_json(indent=2)), file=out)
    else:
        _print_demo(run, args, out)
        print(format_metrics(metrics), file=out)
    return EXIT_OK if run.result.ok else EXIT_FLOW_FAILED


def format_metrics(m: PoolMetrics) -> str:
    """A few lines on the pool after the demo: sizes, counts, queue wait and run time."""

    def pct(p: Percentiles | None) -> str:
        if p is None:
            return "-"
        return f"p50 {p.p50 * 1000:.2f} ms, p90 {p.p90 * 1000:.2f} ms, p99 {p.p99 * 1000:.2f} ms"

    lines = [
        "",
        f"pool {terminal_safe(m.pool_name)} after both runs (taskflow.ThreadPool.metrics()):",
        (
            f"  threads {m.pool_size} (largest {m.largest_pool_size}, core {m.core_size}, "
            f"max {m.max_size}), active {m.active_count}, queued {m.queue_size}"
        ),
        (
            f"  tasks {m.task_count}: completed {m.completed_task_count}, failed "
            f"{m.failed_task_count}, cancelled {m.cancelled_task_count}, "
            f"rejected {m.rejected_count}"
        ),
    ]
    if m.abandoned_running:
        # only worth a line when it happened: threads a timed-out flow left behind
        lines.append(
            f"  {m.abandoned_running} task(s) still running after their flow's budget ran out "
            "(a thread cannot be killed; it returns to the pool when its task returns)"
        )
    lines += [
        f"  queue wait {pct(m.queue_wait_s)}",
        f"  run time   {pct(m.run_time_s)}",
        (
            "  (a flow submits one executor task per drain loop, which runs ready nodes one "
            "after another)"
        ),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taskflow`` command.

    Args:
        argv: The arguments after the program name; None reads ``sys.argv``.

    Returns:
        The exit status: 0 ok, 1 the flow failed, 2 bad command line (argparse exits with 2
        itself for malformed options, and with 0 after ``--help``).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.prog = parser.prog
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "verbose", False):
        logger.remove()
        logger.add(log_sink(sys.stderr), level="DEBUG")  # one escaped line per record
        logger.enable("taskflow")
        logs.log_nodes()  # every node's attempts and outcome
    if args.command == "demo":
        try:
            return _demo(args, sys.stdout, sys.stderr)
        except BrokenPipeError:
            # the reader went away (``| head``): stop quietly, and keep the interpreter's
            # final flush of stdout from raising again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_FLOW_FAILED
    if args.command in ("graph", "run"):
        return int(args.handler(args, sys.stdout, sys.stderr))
    parser.error(f"unknown command {args.command!r}")  # unreachable: argparse checks choices
    return EXIT_USAGE
