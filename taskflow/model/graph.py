"""The graph: discovery from the top nodes, validation, and compilation into an immutable plan.

``compile_plan(tops)`` follows edges in both directions from the nodes given (iteratively, so a
10,000-node chain is fine), validates everything that can be known before a run (types, names,
cycles via ``graphlib``, join parameters) and returns a ``Plan``: flat tuples indexed by node
number that the engine reads without locks. Plans are cached on the first top node and marked
stale when any node in them is rewired or has an option changed.

``select_targets(plan, targets)`` narrows a plan to the targets and their ancestors (what
``start(..., targets=...)`` runs, as dask's ``get(keys)``): the narrowed plan is cached on the
full plan, keyed by the targets' indices, so it goes stale with it.
"""

from __future__ import annotations

import graphlib
from collections import deque
from collections.abc import Iterable
from operator import is_ as _is
from typing import Any

from taskflow.errors import (
    CycleError,
    DuplicateNameError,
    FlowDefinitionError,
    InvalidArgumentValueError,
    InvalidNodeError,
    did_you_mean,
)
from taskflow.model import joins
from taskflow.model.callables import (
    callable_is_async,
    generator_problem,
    is_coroutine_function,
)
from taskflow.model.node import (
    FunctionNode,
    NodeKind,
    SchedulingNode,
    closed_coroutine,
    load_asyncio,
    not_a_node,
    task_is_async,
)

__all__ = ["Plan", "PlanView", "as_top_nodes", "cached_plan", "compile_plan", "copy_node",
           "select_targets"]

# narrowed plans kept per full plan (``select_targets``); the cache starts afresh when full
SUBSET_CACHE = 64


class Plan:
    """An immutable, validated graph. Node ``i`` is ``nodes[i]``; edges are index tuples.

    A narrowed plan (``select_targets``) holds some nodes of a connected graph, closed under
    fathers: ``pruned`` has the ids of the connected nodes it leaves out (sons edges to them
    are dropped), and ``subsets`` of a full plan caches its narrowed plans.
    """

    __slots__ = (
        "__weakref__",
        "any_async",
        "any_deadline",
        "any_policy",
        "any_timeout",
        "aplain",
        "asyncs",
        "backoff",
        "batches",
        "bulkheads",
        "deadline",
        "est",
        "fanout",
        "fathers",
        "has_begin",
        "has_fail",
        "has_success",
        "index",
        "join_k",
        "join_kind",
        "names",
        "nfathers",
        "nodes",
        "optional",
        "plain",
        "policy",
        "pos",
        "pruned",
        "retries",
        "roots",
        "routes",
        "section",
        "sinks",
        "sons",
        "stale",
        "stateless",
        "subsets",
        "timeout",
        "tops",
    )

    def __init__(self, tops: tuple[SchedulingNode[Any, Any], ...],
                 nodes: list[SchedulingNode[Any, Any]],
                 pruned: frozenset[int] = frozenset()) -> None:
        self.stale = False
        self.tops = tops
        self.pruned = pruned
        self.subsets: dict[tuple[int, ...], Plan] = {}
        self.nodes = tuple(nodes)
        self.names = tuple(n.name for n in nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self._wire(nodes)
        self._read_options(nodes)
        self._read_kinds(nodes)
        # the one mutable field: each node's typical task time (seconds, an exponential moving
        # average; -1.0 until measured), written by runs without a lock (a float store is atomic)
        # and read by the engine to decide whether a ready node deserves a worker loop of its own;
        # an async node holds a worker only while it is handed to its event loop: fast, 0.0 (its
        # duration is not learned), so the loop that pops one goes on with the next
        self.est = [0.0 if a else -1.0 for a in self.asyncs]
        self._mark_plain()
        # each node's batch (``batch=``; a fan-out's answers its items, not itself), or None
        # when no node of the plan is batched
        batches = tuple(None if p is None or fo else p.batch
                        for p, fo in zip(self.policy, self.fanout, strict=True))
        self.batches = batches if any(b is not None for b in batches) else None

    def _wire(self, nodes: list[SchedulingNode[Any, Any]]) -> None:
        """The edges as indices: fathers, sons (pruned ones left out), optional fathers, roots
        and sinks, and each node's join."""
        self.pos = pos = {id(n): i for i, n in enumerate(nodes)}
        self.fathers = tuple(tuple(pos[id(f)] for f in n._fathers) for n in nodes)
        self.sons = tuple(tuple(pos[id(s)] for s in n._sons if id(s) in pos) for n in nodes)
        self.optional = tuple(
            frozenset(pos[id(f)] for f in n._fathers if id(f) in n._optional) for n in nodes
        )
        self.nfathers = tuple(len(f) for f in self.fathers)
        self.join_kind = tuple(n.join.kind for n in nodes)
        self.join_k = tuple(n.join.k for n in nodes)
        self.roots = tuple(i for i, f in enumerate(self.fathers) if not f)
        self.sinks = tuple(not s for s in self.sons)

    def _read_options(self, nodes: list[SchedulingNode[Any, Any]]) -> None:
        """Timeouts, retries and resilience options, with the run-wide "any" flags."""
        self.timeout = tuple(n.timeout for n in nodes)
        # each node's deadline from the run's start (its own ``deadline=`` or its section's,
        # the earlier) and its section's name; a deadline is armed on the timer like a timeout
        sections = tuple(n.__dict__.get("_section") for n in nodes)
        self.section = tuple(None if s is None else s.name for s in sections)
        self.deadline = tuple(_earliest(n.__dict__.get("deadline"), s)
                              for n, s in zip(nodes, sections, strict=True))
        self.any_deadline = any(d is not None for d in self.deadline)
        self.any_timeout = self.any_deadline or any(t is not None for t in self.timeout)
        self.retries = tuple(n.retries for n in nodes)
        self.backoff = tuple(n.retry_backoff for n in nodes)
        # each node's resilience options (``taskflow.resilience.policy``; None: none), read by
        # ``taskflow.engine.guards``; ``any_policy`` lets the engine skip them in one test
        self.policy = tuple(n.__dict__.get("_policy") for n in nodes)
        self.any_policy = any(p is not None for p in self.policy)
        # the distinct bulkheads of the plan, whose load decides whether a run is shed at start
        self.bulkheads = tuple(dict.fromkeys(
            p.bulkhead for p in self.policy if p is not None and p.bulkhead is not None))

    def _read_kinds(self, nodes: list[SchedulingNode[Any, Any]]) -> None:
        """Which hooks each node's class overrides, and what kind of node it is."""
        base = SchedulingNode
        self.has_begin = tuple(type(n).on_begin is not base.on_begin for n in nodes)
        self.has_success = tuple(type(n).on_success is not base.on_success for n in nodes)
        self.has_fail = tuple(type(n).on_fail is not base.on_fail for n in nodes)
        kinds = tuple(type(n).node_kind for n in nodes)
        # nodes that choose which sons run (switches): index -> True
        self.routes = tuple(k is NodeKind.SWITCH for k in kinds)
        # nodes that schedule sub-work themselves (taskflow.kinds.fanout)
        self.fanout = tuple(k is NodeKind.FANOUT for k in kinds)
        # nodes whose task is a coroutine function: they run on an event loop (engine/aio.py)
        self.asyncs = tuple(task_is_async(n) for n in nodes)
        self.any_async = any(self.asyncs)
        # plain FunctionNodes without hooks: the task runs on the definition, no per-run copy
        self.stateless = tuple(
            type(n).task is FunctionNode.task and not (b or s or f)
            for n, b, s, f in zip(nodes, self.has_begin, self.has_success, self.has_fail, strict=True)
        )

    def _mark_plain(self) -> None:
        """The engine's fast path (``engine/plainloop.py``): a stateless FunctionNode
        with no own timeout, no routing, no fan-out and no resilience options; its task is
        ``fn(ctx, param)`` called directly and a success settles without any of those checks."""
        simple = [
            sl and t is None and d is None and not r and not fo and p is None
            for sl, t, d, r, fo, p in zip(self.stateless, self.timeout, self.deadline,
                                          self.routes, self.fanout, self.policy, strict=True)
        ]
        self.plain = tuple(s and not a for s, a in zip(simple, self.asyncs, strict=True))
        # the same of async nodes: their plain successes are recorded in batches (aiorecord.py)
        self.aplain = tuple(s and a for s, a in zip(simple, self.asyncs, strict=True))


class PlanView:
    """The graph questions a run (or what remains of it) answers from its ``plan``."""

    __slots__ = ()

    plan: Plan

    def index_of(self, name: str) -> int:
        return self.plan.index[name]

    def fathers_of(self, i: int) -> tuple[int, ...]:
        return self.plan.fathers[i]

    def sons_of(self, i: int) -> tuple[int, ...]:
        return self.plan.sons[i]

    def is_sink(self, i: int) -> bool:
        return self.plan.sinks[i]


def copy_node(defn: SchedulingNode[Any, Any], ref: Any, wr: Any, i: int) -> Any:
    """A run's copy of its definition node ``defn`` (node ``i``): it holds its run (or what
    remains of it) weakly through ``ref``, and its WorkResult ``wr``."""
    obj = object.__new__(type(defn))
    d = obj.__dict__
    d.update(defn.__dict__)
    d["_run"] = ref
    d["_wr"] = wr
    d["_idx"] = i
    d["_plans"] = ()
    return obj


def _earliest(own: float | None, section: Any) -> float | None:
    """The nearer of a node's own deadline and its section's (None: neither)."""
    if section is None:
        return own
    theirs: float = section.deadline
    return theirs if own is None else min(own, theirs)


def as_top_nodes(nodes: object) -> tuple[SchedulingNode[Any, Any], ...]:
    """Normalise ``start``'s ``nodes`` argument, naming the culprit on bad input."""
    if isinstance(nodes, SchedulingNode):
        nodes = (nodes,)
    if isinstance(nodes, type) and issubclass(nodes, SchedulingNode):
        raise InvalidNodeError(f"got the class {nodes.__name__}; pass an instance: {nodes.__name__}(...)")
    if isinstance(nodes, (str, bytes, dict)) or not isinstance(nodes, Iterable):
        named = (callable(nodes) and not isinstance(nodes, type)
                 or closed_coroutine(nodes) is not None)
        got = not_a_node(nodes) if named else type(nodes).__name__
        raise InvalidNodeError(f"nodes must be a SchedulingNode or an iterable of them, got {got}")
    tops = tuple(nodes)
    for i, n in enumerate(tops):
        if isinstance(n, SchedulingNode) and n.__dict__.get("_run") is not None:
            raise InvalidNodeError(
                f"node {n.name!r} is a run's copy (from a FlowResult or a hook); "
                "start the definition nodes you built the graph from"
            )
        if not isinstance(n, SchedulingNode):
            raise InvalidNodeError(f"nodes[{i}] is {not_a_node(n)}")
    return tops


def cached_plan(nodes: object) -> Plan | None:
    """The cached plan of ``start``'s ``nodes`` when they are the very top nodes it was compiled
    for (a node, or a tuple or list of them), else None: those were validated by
    ``as_top_nodes`` when the plan was made, and are not checked again."""
    if isinstance(nodes, SchedulingNode):
        cached: Plan | None = nodes.__dict__.get("_plan_cache")
        if cached is not None and not cached.stale and len(cached.tops) == 1 and (
                cached.tops[0] is nodes):
            return cached
        return None
    if type(nodes) is not tuple and type(nodes) is not list or not nodes:
        return None
    first = nodes[0]
    if not isinstance(first, SchedulingNode):
        return None
    cached = first.__dict__.get("_plan_cache")
    if cached is not None and not cached.stale and len(cached.tops) == len(nodes) and all(
        map(_is, cached.tops, nodes)  # identity, never a node's __eq__ (map: no generator)
    ):
        plan: Plan = cached
        return plan
    return None


def compile_plan(tops: tuple[SchedulingNode[Any, Any], ...]) -> Plan:
    """The validated plan of the graph connected to ``tops`` (cached until rewired)."""
    cached: Plan | None = tops[0].__dict__.get("_plan_cache") if tops else None
    if cached is not None and not cached.stale and len(cached.tops) == len(tops) and all(
        a is b for a, b in zip(cached.tops, tops, strict=True)
    ):
        return cached
    nodes = _discover(tops)
    _validate(nodes)
    _validate_sections(nodes)
    plan = Plan(tops, nodes)
    for n in nodes:
        n.__dict__["_plans"].append(plan)
    if tops:
        tops[0].__dict__["_plan_cache"] = plan
    return plan


def select_targets(plan: Plan, targets: object) -> Plan:
    """The plan of ``targets`` and their ancestors in ``plan`` (cached on ``plan``).

    ``targets`` is a node, a node name, or an iterable of them; each must be in ``plan``.

    Raises:
        InvalidArgumentValueError: a target is not in the graph (named, with the closest node
            name), or ``targets`` is empty (a ``FlowDefinitionError``).
        InvalidNodeError: a target is neither a node nor a name.
    """
    key = _target_indices(plan, targets)
    cached = plan.subsets.get(key)
    if cached is not None:
        return cached
    keep = bytearray(len(plan.nodes))
    stack = list(key)
    fathers = plan.fathers
    while stack:
        i = stack.pop()
        if not keep[i]:
            keep[i] = 1
            stack.extend(fathers[i])
    if all(keep):
        sub = plan
    else:
        nodes = [n for n, k in zip(plan.nodes, keep, strict=True) if k]  # plan order: still topological
        sub = Plan(plan.tops, nodes, frozenset(id(n) for n, k in zip(plan.nodes, keep, strict=True) if not k))
        sub.est = [e for e, k in zip(plan.est, keep, strict=True) if k]
    if len(plan.subsets) >= SUBSET_CACHE:
        plan.subsets.clear()
    plan.subsets[key] = sub
    return sub


def _target_indices(plan: Plan, targets: object) -> tuple[int, ...]:
    """The sorted indices of ``targets`` in ``plan``, naming any culprit."""
    if isinstance(targets, (SchedulingNode, str)):
        targets = (targets,)
    elif isinstance(targets, (bytes, dict)) or not isinstance(targets, Iterable):
        raise InvalidNodeError(
            f"targets must be a node, a node name or an iterable of them, got {type(targets).__name__}"
        )
    found: set[int] = set()
    where = "the graph connected to the nodes given"
    for k, t in enumerate(targets):
        if isinstance(t, SchedulingNode):
            i = plan.pos.get(id(t))
            if i is None or plan.nodes[i] is not t:
                name = t.__dict__.get("name", "?")
                other = " (a different node has that name)" if name in plan.index else ""
                raise InvalidArgumentValueError(f"target {name!r} is not in {where}{other}",
                                                argument="targets")
        elif isinstance(t, str):
            j = plan.index.get(t)
            if j is None:
                raise InvalidArgumentValueError(
                    f"target {t!r} names no node in {where}{did_you_mean(t, plan.index)}",
                    argument="targets")
            i = j
        else:
            raise InvalidNodeError(
                f"targets[{k}] is {t!r} ({type(t).__name__}), not a node or a node name"
            )
        found.add(i)
    if not found:
        raise InvalidArgumentValueError(
            "targets is empty; pass targets=None to run the whole graph", argument="targets")
    return tuple(sorted(found))


def _discover(tops: tuple[SchedulingNode[Any, Any], ...]) -> list[SchedulingNode[Any, Any]]:
    """Every node connected to ``tops`` (breadth first, both directions), then put in a stable
    topological order (Kahn's algorithm, ties by discovery). A cycle leaves nodes out of the
    order; they are appended so that validation can name the cycle."""
    seen: set[int] = set()
    found: list[SchedulingNode[Any, Any]] = []
    queue = deque(tops)
    while queue:
        n = queue.popleft()
        if id(n) in seen:
            continue
        d = n.__dict__
        if "_fathers" not in d:
            raise FlowDefinitionError(
                f"{type(n).__name__}.__init__ did not call super().__init__(); "
                "SchedulingNode subclasses must initialise their base"
            )
        seen.add(id(n))
        found.append(n)
        queue.extend(m for m in d["_sons"] if id(m) not in seen)
        queue.extend(m for m in d["_fathers"] if id(m) not in seen)
    left = {id(n): len(n._fathers) for n in found}
    ready = deque(n for n in found if not left[id(n)])
    order: list[SchedulingNode[Any, Any]] = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for s in n._sons:
            left[id(s)] -= 1
            if not left[id(s)]:
                ready.append(s)
    if len(order) < len(found):
        placed = {id(n) for n in order}
        order.extend(n for n in found if id(n) not in placed)
    return order


def _validate_sections(nodes: list[SchedulingNode[Any, Any]]) -> None:
    """Every node a section of this graph names is in this graph."""
    ids = {id(n) for n in nodes}
    checked: set[int] = set()
    for n in nodes:
        section = n.__dict__.get("_section")
        if section is None or id(section) in checked:
            continue
        checked.add(id(section))
        for m in section.nodes:
            if id(m) not in ids:
                raise FlowDefinitionError(
                    f"section {section.name!r} names node {m.name!r}, which is not in the graph "
                    f"of {n.name!r}: a section's nodes must all be in the graph that is started")


def _validate(nodes: list[SchedulingNode[Any, Any]]) -> None:
    names: dict[str, SchedulingNode[Any, Any]] = {}
    for n in nodes:
        cls = type(n)
        if cls.task is SchedulingNode.task:
            raise FlowDefinitionError(
                f"node {n.name!r}: {cls.__name__} does not implement task(self, ctx, param)"
            )
        if not callable(cls.task):
            raise FlowDefinitionError(
                f"node {n.name!r}: {cls.__name__}.task must be a method task(self, ctx, param), "
                f"got {not_a_node(cls.task)}")
        if is_coroutine_function(cls.task):
            load_asyncio()  # with the plan, not inside the run
        elif cls.task is not FunctionNode.task:
            problem = generator_problem(cls.task)
            if problem is not None:
                raise FlowDefinitionError(f"node {n.name!r}: {problem}")
        for hook in ("on_begin", "on_success", "on_fail"):
            if callable_is_async(n.__dict__.get(hook) or getattr(cls, hook)):
                raise FlowDefinitionError(
                    f"node {n.name!r}: {cls.__name__}.{hook} is async (a coroutine function, or "
                    "an object with async def __call__); hooks run on the run's threads (never "
                    "on an event loop): write it as a plain def, and move the awaiting into the "
                    "task")
        check = getattr(n, "_check_definition", None)
        if check is not None:
            check()
        other = names.get(n.name)
        if other is not None:
            raise DuplicateNameError(n.name)
        names[n.name] = n
        if n._sons and n.__dict__.get("detach"):
            raise FlowDefinitionError(
                f"node {n.name!r} is detached (detach=True) but has sons "
                f"({', '.join(repr(x.name) for x in n._sons)}): the run does not wait for a "
                "detached node, so nothing may depend on it; make it a sink or drop detach")
        nf = len(n._fathers)
        kind, k = n.join.kind, n.join.k
        if kind in (joins.ANY, joins.QUORUM) and nf == 0:
            raise FlowDefinitionError(f"node {n.name!r} has join {n.join!r} but no fathers")
        if kind == joins.QUORUM and k > nf:
            raise FlowDefinitionError(
                f"node {n.name!r} has join {n.join!r} but only {nf} father(s)"
            )
    ts: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for n in nodes:
        ts.add(n.name, *(f.name for f in n._fathers))
    try:
        ts.prepare()
    except graphlib.CycleError as e:
        cycle = list(e.args[1])
        cycle.reverse()  # graphlib reports son -> father; name it along the edges
        raise CycleError(cycle) from None
