"""``start(..., overrides=...)``: a plan whose named nodes do other work, for tests.

``override_plan(plan, overrides)`` returns a new plan equal to ``plan`` but for the overridden
nodes: each is replaced by a copy of its definition whose ``task`` is the override (a constant
is returned as the node's value; a callable is called as ``fn(ctx, param)`` instead of the
node's task). Everything else about the node stays: its class (so its hooks run), name, param,
edges, joins, timeout, retries and resilience options (but ``batch``: an overridden node takes
no seat in its batch's calls); a switch routes on the value returned, a fan-out node runs the
override once instead of fanning out. The definitions the user built are
never touched: the copies belong to the returned plan only, and that plan is not cached (the
cost of a run without overrides is one ``is None`` test in the facade).

Nothing here is shared between threads: the new plan is built by the caller of ``start`` before
anything runs, and is read-only afterwards but for ``est`` (its own list, as any plan's).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from taskflow.errors import (
    InvalidArgumentError,
    InvalidArgumentValueError,
    did_you_mean,
)
from taskflow.model.callables import generator_problem
from taskflow.model.graph import Plan
from taskflow.model.node import SchedulingNode, arity_problem

__all__ = ["Constant", "override_plan"]


class Constant:
    """An override's task that returns ``value`` (whatever ``ctx`` and ``param``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, ctx: Any, param: Any) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


def _unknown(names: list[str], known: Mapping[str, int]) -> InvalidArgumentValueError:
    hints = [f"{name!r}{did_you_mean(name, known)}" for name in names]
    return InvalidArgumentValueError(
        f"overrides name{'s' if len(hints) > 1 else ''} {', '.join(hints)} not in this run; "
        f"its nodes are {', '.join(repr(n) for n in sorted(known))}", argument="overrides")


def _task_of(name: str, override: Any) -> Callable[[Any, Any], Any]:
    if not callable(override):
        return Constant(override)
    problem = generator_problem(override) or arity_problem(override, "fn(ctx, param)", 2)
    if problem is not None:
        raise InvalidArgumentValueError(f"override of node {name!r}: {problem}",
                                        argument="overrides")
    task: Callable[[Any, Any], Any] = override
    return task


def _copy_with_task(defn: SchedulingNode[Any, Any], task: Callable[[Any, Any], Any]) -> Any:
    copy = object.__new__(type(defn))
    d = copy.__dict__
    d.update(defn.__dict__)
    d["_plans"] = []  # never compiled: the copy is in no cached plan
    d["task"] = task  # an instance attribute: called as node.task(ctx, param)
    return copy


def override_plan(plan: Plan, overrides: object) -> Plan:
    """``plan`` with the nodes named in ``overrides`` doing the override's work instead (see
    the module docstring).

    Raises:
        InvalidArgumentError: ``overrides`` is not a mapping, or a key is not a str (a
            ``TypeError``).
        InvalidArgumentValueError: a name is not a node of this run (with the closest names),
            or a callable override cannot be called as ``fn(ctx, param)`` (a
            ``FlowDefinitionError``).
    """
    if not isinstance(overrides, Mapping):
        raise InvalidArgumentError(
            "overrides must be a mapping of node name -> value or fn(ctx, param), "
            f"got {type(overrides).__name__}", argument="overrides")
    bad = [k for k in overrides if not isinstance(k, str)]
    if bad:
        raise InvalidArgumentError(f"overrides keys must be node names (str), got {bad[0]!r} "
                                   f"({type(bad[0]).__name__})", argument="overrides")
    unknown = [name for name in overrides if name not in plan.index]
    if unknown:
        raise _unknown(unknown, plan.index)
    if not overrides:
        return plan
    nodes = list(plan.nodes)
    touched = set()
    for name, override in overrides.items():
        i = plan.index[name]
        nodes[i] = _copy_with_task(nodes[i], _task_of(name, override))
        touched.add(i)
    new = object.__new__(Plan)
    for slot in Plan.__slots__:
        if slot != "__weakref__":
            object.__setattr__(new, slot, getattr(plan, slot))
    new.nodes = tuple(nodes)
    new.subsets = {}
    new.est = list(plan.est)

    def off(flags: tuple[bool, ...]) -> tuple[bool, ...]:
        return tuple(f and i not in touched for i, f in enumerate(flags))

    # an overridden node runs its (instance) task: never the FunctionNode fast path, never a
    # fan-out
    new.stateless = off(plan.stateless)
    new.plain = off(plan.plain)
    new.aplain = off(plan.aplain)
    new.fanout = off(plan.fanout)
    _unbatch(plan, new, touched)
    return new


def _unbatch(plan: Plan, new: Plan, touched: set[int]) -> None:
    """An overridden node does the override's work: it takes no seat in its batch's calls (a
    copy of its policy without the batch; the plan's ``batches`` without it)."""
    if plan.batches is None:
        return
    policy = list(plan.policy)
    for i in touched:
        pol = policy[i]
        if pol is not None and pol.batch is not None:
            pol = copy.copy(pol)
            pol.batch = None
            policy[i] = pol
    new.policy = tuple(policy)
    batches = tuple(None if i in touched else b for i, b in enumerate(plan.batches))
    new.batches = batches if any(b is not None for b in batches) else None
