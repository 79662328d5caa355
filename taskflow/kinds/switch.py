"""``SwitchNode``: a node whose result decides which of its branches run.

A switch is an ordinary node whose ``task`` returns a *decision* (its result, kept in the run's
report like any other). ``cases`` maps each decision to the node or nodes that start its branch,
and ``default`` (optional) catches every other decision. The switch is wired at construction as
the father of every case and default node. When the switch succeeds, the engine asks it which
sons were chosen ([`SwitchNode.choose_sons`][taskflow.SwitchNode.choose_sons]); every other case node is ``SKIPPED`` at once,
whatever its other fathers do (a rejected order is never charged). Below it, joins ignore skipped
fathers and a node whose fathers were all skipped is skipped itself, so an unchosen branch is
skipped down to the first node that also hears from a branch that ran (a *merge* node), which
runs as usual.

The questions every switch must answer, answered here:

* *Empty, unknown or new values*: ``default`` takes them; without a default the switch fails
  (``EXCEPTION``, its sons fail fast) with [`UnknownCaseError`][taskflow.UnknownCaseError] naming the value and the
  known cases. ``None`` is a value like any other and may be a case.
* *Several conditions true at once*: cannot happen; a decision is one hashable value and selects
  exactly one case (a case may list several nodes, which all run).
* *No case matches*: ``default`` if given, else the failure above. Nothing runs by accident.
* *Replays*: the decision is the switch's recorded result (``work_result.result``), so a report
  shows which branch was taken; put the reason beside it (the risk example audits it).

Sons wired to a switch outside ``cases``/``default`` (``switch >> audit``) always run.

A case node may have other fathers: it runs only when chosen *and* its join holds. Making what
the decision needs a father of the switch (``[risk, inventory] >> switch``) lets the switch decide
with everything in hand.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from taskflow.errors import FlowDefinitionError, TaskflowError
from taskflow.model.callables import callable_is_async
from taskflow.model.context import TaskContext
from taskflow.model.node import NodeKind, SchedulingNode

__all__ = ["SwitchNode", "UnknownCaseError"]

T = TypeVar("T")

Branch = tuple[SchedulingNode[Any, Any], ...]


class UnknownCaseError(TaskflowError, LookupError):
    """A switch decided a value that has no case, and it has no default.

    Attributes:
        switch: the switch's name.
        value: the decision.
        cases: the values that have a case, in definition order.
    """

    def __init__(self, switch: str, value: object, cases: Iterable[object]) -> None:
        self.switch = switch
        self.value = value
        self.cases = list(cases)
        known = ", ".join(repr(c) for c in self.cases) or "none"
        super().__init__(
            f"switch {switch!r} has no case for {value!r} and no default (cases: {known})"
        )


def _branch(value: object, what: str) -> Branch:
    """A case target as a tuple of nodes: one node, or a non-empty list/tuple of nodes."""
    if isinstance(value, SchedulingNode):
        return (value,)
    if isinstance(value, (list, tuple)):
        if not value:
            raise FlowDefinitionError(f"{what} is an empty list; give at least one node")
        for i, n in enumerate(value):
            if not isinstance(n, SchedulingNode):
                raise TypeError(
                    f"{what}[{i}] must be a SchedulingNode, got {type(n).__name__}"
                )
        return tuple(value)
    raise TypeError(f"{what} must be a SchedulingNode or a list of them, got {type(value).__name__}")


class SwitchNode(SchedulingNode[T, Any]):
    """A node whose ``task`` returns a decision that selects which branch runs.

    Subclass it and implement ``task`` (or use [`SwitchNode.of`][taskflow.SwitchNode.of] with a function)::

        class RiskSwitch(SwitchNode[None]):
            def task(self, ctx, param):
                return ctx.result_of("risk")["decision"]

        RiskSwitch(name="route", cases={"approve": charge, "reject": [refund, notify]},
                   default=manual_review)

    Args:
        param: passed to ``task`` as ``param``.
        name: unique name within a flow; defaults to the class name.
        cases: decision value -> the node, or list of nodes, that start that branch. Each is wired
            as a son of the switch now. Keys must be hashable.
        default: node or list of nodes chosen for any decision without a case; None: such a
            decision fails the switch with [`UnknownCaseError`][taskflow.UnknownCaseError].
        **options: ``timeout``, ``retries``, ``retry_backoff``, ``join`` as for SchedulingNode.

    Raises:
        TypeError: ``cases`` is not a mapping, or a target is not a node or list of nodes.
        FlowDefinitionError: no cases and no default, an empty target list, or the switch is
            its own case.
    """

    # the engine calls choose_sons(value) after task succeeds (see Plan.routes)
    node_kind: ClassVar[NodeKind] = NodeKind.SWITCH

    cases: Mapping[Hashable, Branch]
    default: Branch | None

    def __init__(
        self,
        param: T | None = None,
        *,
        name: str | None = None,
        cases: Mapping[Hashable, SchedulingNode[Any, Any] | Sequence[SchedulingNode[Any, Any]]]
        | None = None,
        default: SchedulingNode[Any, Any] | Sequence[SchedulingNode[Any, Any]] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(param, name=name, **options)
        if cases is None:
            cases = {}
        if not isinstance(cases, Mapping):
            raise TypeError(
                f"cases of switch {self.name!r} must be a mapping of value -> node(s), "
                f"got {type(cases).__name__}"
            )
        table: dict[Hashable, Branch] = {}
        for value, target in cases.items():
            table[value] = _branch(target, f"case {value!r} of switch {self.name!r}")
        fallback = None if default is None else _branch(default, f"default of switch {self.name!r}")
        if not table and fallback is None:
            raise FlowDefinitionError(f"switch {self.name!r} has no cases and no default")
        targets = [n for branch in table.values() for n in branch] + list(fallback or ())
        if any(n is self for n in targets):
            raise FlowDefinitionError(f"switch {self.name!r} is one of its own cases")
        self.cases = MappingProxyType(table)
        self.default = fallback
        self.set_son_handler(targets)

    @classmethod
    def of(
        cls,
        fn: Callable[[TaskContext, Any], Any],
        param: Any = None,
        *,
        name: str | None = None,
        cases: Mapping[Hashable, SchedulingNode[Any, Any] | Sequence[SchedulingNode[Any, Any]]]
        | None = None,
        default: SchedulingNode[Any, Any] | Sequence[SchedulingNode[Any, Any]] | None = None,
        **options: Any,
    ) -> SwitchNode[Any]:
        """A switch whose decision is ``fn(ctx, param)``; ``name`` defaults to ``fn.__name__``.
        An ``async def`` ``fn`` is awaited on the event loop (an async node).

        On executors that run tasks in other processes ``fn`` must be picklable (a module-level
        function, or any callable with loky and dask).
        """
        if not callable(fn):
            raise TypeError(f"SwitchNode.of needs a callable, got {type(fn).__name__}")
        if name is None:
            name = getattr(fn, "__name__", None) or type(fn).__name__
        cls = _AsyncFunctionSwitch if callable_is_async(fn) else _FunctionSwitch
        node = cls(param, name=name, cases=cases, default=default, **options)
        node.__dict__["fn"] = fn
        return node

    def choose_sons(self, value: object) -> tuple[SchedulingNode[Any, Any], ...]:
        """The definition sons chosen by decision ``value`` (called by the engine).

        Raises:
            UnknownCaseError: no case for ``value`` and no default.
            TypeError: ``value`` is not hashable.
        """
        cases = self.cases
        try:
            branch = cases.get(value)
        except TypeError:
            raise TypeError(
                f"switch {self.name!r} decided {value!r} ({type(value).__name__}), "
                "which is not hashable; return a case value"
            ) from None
        if branch is None:  # targets are non-empty tuples: None means no case
            if self.default is None:
                raise UnknownCaseError(self.name, value, cases)
            branch = self.default
        # sons wired outside cases/default always run
        routed = {id(n) for b in cases.values() for n in b}
        routed.update(id(n) for n in self.default or ())
        return branch + tuple(s for s in self._sons if id(s) not in routed)

    def __getstate__(self) -> dict[str, Any]:
        # only the decision travels to other processes; the branches stay in the caller's
        # process (the engine asks the definition node which sons were chosen)
        state = super().__getstate__()
        state["cases"] = {}  # a MappingProxyType cannot be pickled
        state["default"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__["cases"] = MappingProxyType(self.__dict__["cases"])


class _FunctionSwitch(SwitchNode[Any]):
    """The switch built by [`SwitchNode.of`][taskflow.SwitchNode.of]."""

    fn: Callable[[TaskContext, Any], Any]

    def task(self, ctx: TaskContext, param: Any) -> Any:
        return self.fn(ctx, param)


class _AsyncFunctionSwitch(_FunctionSwitch):
    """``SwitchNode.of`` an async function: the decision is awaited on the event loop, as an
    ``async def task`` of a ``SwitchNode`` subclass is."""

    async def task(self, ctx: TaskContext, param: Any) -> Any:
        return await self.fn(ctx, param)
