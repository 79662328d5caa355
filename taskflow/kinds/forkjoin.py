"""Conductor-style static fork/join: ``fork_join``, ``JoinNode`` and its ``JoinOutput``.

``fork_join(branches, join, join_on)`` builds what Conductor's ``FORK_JOIN`` + ``JOIN`` pair
describes::

    fork -> a1 -> a2 --\\
    fork -> b1 -> b2 ---> join        join_on = ["a2", "b2"]
    fork -> c1 -> c2                  (c runs, the join does not wait for it)

* Each branch is a serial chain (``a1 -> a2``); the branches run in parallel after the *fork*, a
  no-op node that only marks where the parallel section starts (Conductor's fork has no output).
* The join's fathers are exactly the ``join_on`` nodes (default: the last node of each branch),
  so a branch left out of ``join_on`` never blocks it: the join and whatever follows it run as
  soon as the joined nodes are done. Such a branch is still part of the flow (through the fork),
  so it runs, and ``TaskScheduling.start`` returns only once it has finished too (or the budget
  ended): a run is over when every node is.
* ``join_on=[]`` is Conductor's "join on nothing": the join's only father is the fork, so it runs
  right after the fork, in parallel with every branch, and reports an empty (complete) output.
* The join's policy (``JoinNode(join=Join.ANY)``, ``Join.quorum(k)``, ``Join.BEST_EFFORT``) and
  per-edge ``join.depends_on(node, optional=True)`` work as for any node (docs/concepts/joins.md).

``JoinNode`` reads its fathers' outcomes in the run and hands them to [`JoinNode.merge`][taskflow.JoinNode.merge] as a
[`JoinOutput`][taskflow.JoinOutput] (Conductor's join output, keyed by node name, plus what failed or is missing).
It never pretends: ``complete`` is True only when every joined father succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from taskflow.errors import FlowDefinitionError
from taskflow.model.context import TaskContext
from taskflow.model.joins import Join
from taskflow.model.node import SchedulingNode
from taskflow.model.result import ResultState

__all__ = ["ForkNode", "JoinNode", "JoinOutput", "fork_join"]

_FAILED = (ResultState.EXCEPTION, ResultState.TIMEOUT)


@dataclass(frozen=True)
class JoinOutput:
    """What a [`JoinNode`][taskflow.JoinNode] saw of its fathers when it ran, in their wiring order.

    Attributes:
        results: name -> value of each father that ended ``SUCCESS``.
        failed: name -> exception of each father that ended ``EXCEPTION`` or ``TIMEOUT``.
        missing: names of the fathers that did not finish: ``CANCELLED`` (a join no longer
            needed them), ``SKIPPED`` (an unchosen switch branch) or still running (under
            ``Join.ANY`` or a quorum the join may run before every father is done).
        complete: True only if every father succeeded (``failed`` and ``missing`` are empty).
    """

    results: dict[str, Any]
    failed: dict[str, BaseException]
    missing: list[str]
    complete: bool

    def __post_init__(self) -> None:
        expected = not self.failed and not self.missing
        if self.complete and not expected:
            raise ValueError("a JoinOutput with failed or missing fathers cannot be complete")


class JoinNode(SchedulingNode[Any, Any]):
    """A node that collects its fathers' outcomes into a [`JoinOutput`][taskflow.JoinOutput].

    Its result is ``merge(ctx, output)``, which returns the output itself unless a subclass
    overrides it (to combine the values, or to raise when the output is not good enough).
    With ``Join.BEST_EFFORT`` it runs whatever happened to its fathers and says what is missing;
    with ``Join.ALL`` (the default) it only runs when every required father succeeded.

    Args:
        param: passed to ``merge`` through ``self.param``.
        name: unique name within a flow; defaults to the class name.
        join: the [`Join`][taskflow.Join] policy (default ``Join.ALL``).
        **options: ``timeout``, ``retries``, ``retry_backoff`` as for SchedulingNode.

    On executors that run tasks in other processes only the succeeded fathers' values travel
    with the task: the other fathers are reported in ``missing`` there (their exceptions are in
    the caller's FlowResult).
    """

    def __init__(self, param: Any = None, *, name: str | None = None, join: Join = Join.ALL,
                 **options: Any) -> None:
        super().__init__(param, name=name, join=join, **options)

    def task(self, ctx: TaskContext, param: Any) -> Any:
        return self.merge(ctx, self.collect(ctx))

    def merge(self, ctx: TaskContext, output: JoinOutput) -> Any:
        """The join's result, computed from ``output``. Override it; the default returns it."""
        return output

    def collect(self, ctx: TaskContext) -> JoinOutput:
        """This run's outcome of each father (the fork of a ``fork_join`` is not reported)."""
        if self.__dict__.get("_run") is None:
            return self._collect_remote(ctx)
        results: dict[str, Any] = {}
        failed: dict[str, BaseException] = {}
        missing: list[str] = []
        for father in self.father_handler:
            if isinstance(father, ForkNode):
                continue
            wr = father.work_result
            state = wr.state  # read once: result and exception are written before the state
            if state is ResultState.SUCCESS:
                results[father.name] = wr.result
            elif state in _FAILED:
                exc = wr.exception
                assert exc is not None, "a failed node always has its exception"
                failed[father.name] = exc
            else:
                missing.append(father.name)
        return JoinOutput(results, failed, missing, not failed and not missing)

    def _collect_remote(self, ctx: TaskContext) -> JoinOutput:
        """In another process: the task's snapshot carries the succeeded fathers' values only."""
        names: list[str] = self.__dict__.get("_father_names", [])
        results: dict[str, Any] = {}
        missing: list[str] = []
        for n in names:
            try:
                results[n] = ctx.result_of(n)
            except LookupError:  # ResultNotAvailableError: it did not succeed
                missing.append(n)
        return JoinOutput(results, {}, missing, not missing)

    def __getstate__(self) -> dict[str, Any]:
        # the wiring does not travel to other processes; the fathers' names do
        state = super().__getstate__()
        state["_father_names"] = [f.name for f in self._fathers if not isinstance(f, ForkNode)]
        return state


class ForkNode(SchedulingNode[Any, None]):
    """The start of a ``fork_join``: a no-op whose sons are the branches' first nodes.

    Attributes:
        branches: the branches, each a tuple of nodes in chain order.
        join_node: the join that follows the fork.
    """

    branches: tuple[tuple[SchedulingNode[Any, Any], ...], ...]
    join_node: SchedulingNode[Any, Any]

    def task(self, ctx: TaskContext, param: Any) -> None:
        return None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["branches"] = ()
        state["join_node"] = None
        return state


def _as_branch(branch: object, b: int) -> tuple[SchedulingNode[Any, Any], ...]:
    if isinstance(branch, SchedulingNode):
        return (branch,)
    if isinstance(branch, (str, bytes)) or not isinstance(branch, Iterable):
        raise TypeError(f"branch {b} must be a list of SchedulingNode, got {type(branch).__name__}")
    nodes = tuple(branch)
    if not nodes:
        raise FlowDefinitionError(f"branch {b} of the fork is empty; give it at least one node")
    for i, n in enumerate(nodes):
        if not isinstance(n, SchedulingNode):
            raise TypeError(f"branch {b}[{i}] must be a SchedulingNode, got {type(n).__name__}")
    return nodes


def fork_join(
    branches: Sequence[Sequence[SchedulingNode[Any, Any]] | SchedulingNode[Any, Any]],
    join: SchedulingNode[Any, Any] | None = None,
    join_on: Iterable[str | SchedulingNode[Any, Any]] | None = None,
    *,
    fork_name: str = "fork",
) -> ForkNode:
    """Wire a static fork/join and return the fork node to start the flow from.

    Each inner list is a serial chain (``[a, b, c]`` wires ``a -> b -> c``); the fork is the
    father of each chain's first node, and the join's fathers are the ``join_on`` nodes.
    Wire what follows with ``fork.join_node >> next_step``, and what precedes with
    ``previous >> fork``.

    Args:
        branches: the branches, in order; each a non-empty list of nodes (a single node is a
            one-node branch). A node may appear in only one branch.
        join: the join node (default ``JoinNode(name="join")``, policy ``Join.ALL``). Any node
            works; a [`JoinNode`][taskflow.JoinNode] gets a [`JoinOutput`][taskflow.JoinOutput].
        join_on: names or nodes of branch nodes the join waits for (default: each branch's last
            node). Branches without a ``join_on`` node do not block the join. ``[]``: the join
            waits for nothing but the fork (Conductor's behaviour without ``joinOn``).
        fork_name: the fork node's name, unique within the flow.

    Returns:
        The fork node (a [`ForkNode`][taskflow.ForkNode]; ``.join_node`` is the join, ``.branches`` the chains).

    Raises:
        TypeError: a branch is not a list of nodes, or ``join`` is not a node.
        FlowDefinitionError: no branches, an empty branch, a node in two branches or used as the
            join, or a ``join_on`` entry that is not a node of the branches (it is named).
    """
    if isinstance(branches, (str, bytes)) or not isinstance(branches, Iterable):
        raise TypeError(f"branches must be a list of lists of nodes, got {type(branches).__name__}")
    chains = tuple(_as_branch(branch, b) for b, branch in enumerate(branches))
    if not chains:
        raise FlowDefinitionError("fork_join needs at least one branch")
    if join is None:
        join = JoinNode(name="join")
    elif not isinstance(join, SchedulingNode):
        raise TypeError(f"join must be a SchedulingNode (e.g. a JoinNode), got {type(join).__name__}")
    seen: dict[int, int] = {}
    by_name: dict[str, SchedulingNode[Any, Any]] = {}
    for b, chain in enumerate(chains):
        for n in chain:
            if n is join:
                raise FlowDefinitionError(f"the join {join.name!r} is also a node of branch {b}")
            if id(n) in seen and seen[id(n)] != b:
                raise FlowDefinitionError(
                    f"node {n.name!r} is in branches {seen[id(n)]} and {b}; "
                    "a node may belong to one branch only"
                )
            seen[id(n)] = b
            by_name.setdefault(n.name, n)
    if join_on is None:
        targets = [chain[-1] for chain in chains]
    else:
        if isinstance(join_on, (str, bytes, SchedulingNode)) or not isinstance(join_on, Iterable):
            raise TypeError(
                f"join_on must be a list of node names or nodes, got {type(join_on).__name__}"
            )
        targets = []
        for ref in join_on:
            node = by_name.get(ref) if isinstance(ref, str) else ref
            if node is None or id(node) not in seen:
                label = ref if isinstance(ref, str) else getattr(ref, "name", ref)
                raise FlowDefinitionError(
                    f"join_on names {label!r}, which is not a node of the fork's branches "
                    f"(nodes: {', '.join(repr(n) for n in by_name)})"
                )
            if not any(t is node for t in targets):
                targets.append(node)
    fork = ForkNode(name=fork_name)
    fork.__dict__["branches"] = chains
    fork.__dict__["join_node"] = join
    for chain in chains:
        fork.set_son_handler(chain[0])
        for father, son in pairwise(chain):
            father.set_son_handler(son)
    join.set_father_handler(targets or [fork])
    return fork
