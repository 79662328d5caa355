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

A failure's traceback is written as text in the message, never through
``logger.opt(exception=...)``: a sink with ``diagnose=True`` (loguru's default) would print the
values of the variables of every frame, the task's arguments and the request's data included.
"""

from __future__ import annotations

__all__ = ["log_nodes", "logging_nodes"]

_node_lines = False


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
