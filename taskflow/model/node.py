"""Nodes: ``SchedulingNode`` (subclass it), ``FunctionNode`` (wrap a function), and their wiring.

A node object is a *definition*: its wiring (fathers, sons) and options. ``TaskScheduling.start``
never mutates it; every run works on per-run copies, made when the run needs them, whose
``state`` and ``work_result`` read that run's bookkeeping. ``task`` and the hooks are called on the
run's copy, so ``self`` inside them is that run's node and attributes set there stay in that run.

Wiring and options may be changed between runs (the compiled plan cached for the graph is then
rebuilt), but not while a run of the same graph is being started from another thread.

What can be known about one node is checked when it is made, never per execution: its options
(an unknown keyword is refused with the closest option's name), the arity of ``fn`` or of the
class's ``task`` (read once per class, when it is defined) and, in each wiring call, that what
is wired is a node. What needs the whole graph (names, cycles, joins) is checked when a run
compiles its plan (``taskflow.model.graph``).
"""

from __future__ import annotations

import enum
import math
import threading
import types
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, TypeVar, Union, overload

from taskflow.errors import FlowDefinitionError, InvalidNodeError, closest_name
from taskflow.model.callables import (
    CO_VARARGS,
    callable_is_async,
    generator_problem,
    is_coroutine_function,
    plain_function,
)
from taskflow.model.joins import Join
from taskflow.model.result import ResultState, WorkResult


def load_asyncio() -> None:
    """Import ``asyncio`` (about 10 ms) when an async node is built or compiled, so that its
    first run does not pay for it inside its budget."""
    import asyncio  # noqa: F401


def task_is_async(node: SchedulingNode[Any, Any]) -> bool:
    """Whether ``node``'s task is a coroutine function (``async def task``, a ``FunctionNode``
    of an ``async def`` function, or an override that is one): it runs on an event loop."""
    own = node.__dict__.get("task")  # an override (``start(..., overrides=...)``)
    if own is not None:
        return callable_is_async(own)
    task = type(node).task
    if task is FunctionNode.task:
        fn = node.__dict__.get("fn")
        return fn is not None and callable_is_async(fn)
    return is_coroutine_function(task)


if TYPE_CHECKING:
    import weakref

    from taskflow.model.context import RunView, TaskContext, TaskSupport
    from taskflow.resilience import Bulkhead, CircuitBreaker, Hedge, RateLimit
    from taskflow.resilience.batch import Batch
    from taskflow.resilience.cache import Cache
    from taskflow.resilience.retrybudget import RetryBudget

__all__ = ["FunctionNode", "NodeKind", "NodeState", "SchedulingNode", "Section"]

T = TypeVar("T")
V = TypeVar("V")

# attributes whose change invalidates a compiled plan (see graph.compile_plan)
_PLAN_FIELDS = frozenset({"name", "timeout", "deadline", "retries", "retry_backoff", "join"})
# the resilience options (``taskflow.resilience.policy``): a change rebuilds the node's policy
_POLICY_FIELDS = ("bulkhead", "breaker", "rate_limit", "fallback", "hedge", "idempotent",
                  "share_key", "cache_ttl", "cache_size", "priority", "min_budget", "batch",
                  "retry_budget", "cache", "stale_for", "stale_if_error", "detach")
_POLICY_DEFAULTS: dict[str, Any] = {
    "bulkhead": None, "breaker": None, "rate_limit": None, "hedge": None, "idempotent": False,
    "share_key": None, "cache_ttl": None, "cache_size": 1024, "priority": 0, "min_budget": None,
    "batch": None, "retry_budget": None, "cache": None, "stale_for": None,
    "stale_if_error": None, "detach": False,
}


class _NoFallback:
    """The ``fallback`` default: no stand-in value (None is a valid one)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_FALLBACK"

    def __reduce__(self) -> str:
        return "NO_FALLBACK"


NO_FALLBACK: Any = _NoFallback()


class NodeState(enum.Enum):
    """Coarse lifecycle of a node in one run (the Java design's INIT/WORKING/FINISH/ERROR).

    ``SUCCESS`` and ``SKIPPED`` end in ``FINISH``; ``EXCEPTION``, ``TIMEOUT`` and ``CANCELLED``
    in ``ERROR``. ``str()`` is the bare name (``"FINISH"``).
    """

    INIT = 0
    WORKING = 3
    FINISH = 1
    ERROR = 2

    def __str__(self) -> str:
        """The bare name (``"FINISH"``)."""
        return self.name


class NodeKind(enum.Enum):
    """How the engine runs a node (a class declares it with the ``node_kind`` class attribute).

    ``TASK``: call ``task`` (with retries) and record its value. ``SWITCH``: a task whose value
    chooses which sons run: the engine calls ``choose_sons(value)``. ``FANOUT``: the engine calls
    ``open_fan_out(host, i)`` and the node schedules its own items (``taskflow.kinds.fanout``).
    """

    TASK = "task"
    SWITCH = "switch"
    FANOUT = "fanout"


_FINISH_STATES = (ResultState.SUCCESS, ResultState.SKIPPED, ResultState.DEGRADED)


def check_timeout(value: object, what: str = "timeout") -> float | None:
    """Validate a duration option: None, or a non-negative real number.

    ``inf``, and anything at or above ``threading.TIMEOUT_MAX`` (about 292 years: ``sys.maxsize``,
    ``1e10``, ``10**400``), means no limit and is returned as ``inf``.

    Raises:
        InvalidNodeError: not a number (also a ``TypeError``).
        FlowDefinitionError: negative or NaN (also a ``ValueError``).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidNodeError(
            f"{what} must be a number of seconds or None, got {type(value).__name__}")
    if isinstance(value, float) and math.isnan(value):
        raise FlowDefinitionError(f"{what} must not be NaN")
    if value < 0:
        raise FlowDefinitionError(f"{what} must be non-negative, got {value!r}")
    if value >= threading.TIMEOUT_MAX:
        return math.inf
    return float(value)


def check_node_timeout(value: object, node: str, what: str = "timeout") -> float | None:
    """A node's own time limit: None (no limit) or a number of seconds > 0.

    Zero is refused like a negative number: it would time the node out before its first
    attempt.
    """
    checked = check_timeout(value, f"{what} of node {node!r}")
    if checked == 0.0:
        raise FlowDefinitionError(
            f"{what} of node {node!r} must be > 0 seconds (None: no limit), got {value!r}")
    return checked


def _check_retries(retries: object, backoff: object, node: str) -> tuple[int, float]:
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise InvalidNodeError(
            f"retries of node {node!r} must be an int, got {type(retries).__name__}")
    if retries < 0:
        raise FlowDefinitionError(f"retries of node {node!r} must be >= 0, got {retries}")
    checked = check_timeout(backoff, f"retry_backoff of node {node!r}")
    if checked is None or math.isinf(checked):
        raise FlowDefinitionError(
            f"retry_backoff of node {node!r} must be a finite number of seconds, got {backoff!r}")
    return retries, checked


def refuse_options(node: str, cls: type[Any], unknown: dict[str, Any],
                   upto: type[Any] | None = None) -> NoReturn:
    """Raise ``InvalidNodeError`` for keyword options no ``__init__`` of ``cls`` takes, with
    the closest known option for each (the known ones: the parameters of the ``__init__`` of
    every class in its MRO, down to ``upto`` when given)."""
    import inspect

    known: set[str] = set()
    mro = cls.__mro__
    if upto is not None:
        mro = mro[: mro.index(upto) + 1]
    for klass in mro:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):  # pragma: no cover - a C-level __init__
            continue
        known.update(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                     and p.name != "self")
    hints = []
    guessed = True
    for option in sorted(unknown):
        close = closest_name(option, known)
        hints.append(f"{option!r}" + (f" (did you mean {close!r}?)" if close else ""))
        guessed = guessed and bool(close)
    public = next(k for k in mro if not k.__name__.startswith("_"))
    message = (f"node {node!r}: unknown option{'s' if len(hints) > 1 else ''} "
               f"{', '.join(hints)} for {public.__name__}")
    if not guessed:
        message += f"; its options are {', '.join(sorted(known))}"
    raise InvalidNodeError(message)


def arity_problem(fn: object, called_as: str, nargs: int) -> str | None:
    """Why ``fn`` cannot be called with ``nargs`` positional arguments (``called_as`` names
    them for the message), or None when it can or its signature cannot be read.

    A plain function is read from its code object (about a microsecond); anything else
    through ``inspect.signature``.
    """
    plain = plain_function(fn)
    if plain is not None:
        code = plain.__code__
        npos = code.co_argcount
        required = npos - len(plain.__defaults__ or ())
        kw_required = code.co_kwonlyargcount - len(plain.__kwdefaults__ or {})
        if required <= nargs and (npos >= nargs or code.co_flags & CO_VARARGS) \
                and kw_required == 0:
            return None
    import inspect

    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*([None] * nargs))
    except TypeError as exc:
        label = getattr(fn, "__qualname__", None) or repr(fn)
        return f"{label}{signature} cannot be called as {called_as}: {exc}"
    return None


def _arity_of_methods(cls: type[Any]) -> str | None:
    """The first method of ``cls`` (its own or inherited) in ``_called_as`` that cannot take
    the arguments the engine passes, described; None when all can."""
    for method, called_as in cls._called_as.items():
        for klass in cls.__mro__:
            if method in klass.__dict__:
                fn = klass.__dict__[method]
                break
        else:  # pragma: no cover - SchedulingNode defines every method it names
            continue
        if not isinstance(fn, types.FunctionType):  # a staticmethod, a callable object: left to the call
            continue
        nargs = called_as.count(",") + 2  # self and the arguments
        problem = arity_problem(fn, f"{method}(self, {called_as[1:]}", nargs)
        if problem is not None:
            return problem
    return None


NodeArg = Union["SchedulingNode[Any, Any]", Iterable["SchedulingNode[Any, Any]"]]


def closed_coroutine(value: object) -> str | None:
    """When ``value`` is a coroutine object (a call of an async function, given where the
    function was expected): close it, so that it does not warn "never awaited" later, and
    return the function's name; None for anything else."""
    if type(value).__name__ != "coroutine" or not hasattr(value, "close"):
        return None
    value.close()
    return str(getattr(value, "__qualname__", "fn"))


def not_a_node(value: object) -> str:
    """What ``value``, given where a node was expected, is, and what to pass instead."""
    coro = closed_coroutine(value)
    if coro is not None:
        return (f"the coroutine object {coro}(...); wrap the async function itself in a node: "
                f"FunctionNode({coro})")
    if isinstance(value, type) and issubclass(value, SchedulingNode):
        return f"the class {value.__name__}; pass an instance: {value.__name__}(...)"
    if isinstance(value, str):
        return (f"the string {value!r}; wiring takes the node object, not its name "
                "(names are not looked up)")
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        fname = getattr(value, "__name__", "fn")
        return f"the function {fname}; wrap it in a node: FunctionNode({fname})"
    return f"{type(value).__name__} {_short_repr(value)}, not a SchedulingNode"


def _short_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user __repr__ must not hide the real error
        return "(unprintable)"
    return text if len(text) <= 80 else text[:77] + "..."


def _flatten(nodes: tuple[Any, ...], lead: str) -> list[SchedulingNode[Any, Any]]:
    """``f(a, b)`` and ``f([a, b])`` both give ``[a, b]``; anything else is an
    ``InvalidNodeError`` whose message starts with ``lead`` (which names the wiring call)."""
    if len(nodes) == 1 and not isinstance(nodes[0], SchedulingNode):
        items = nodes[0]
        if isinstance(items, (str, bytes, type)) or not isinstance(items, Iterable):
            raise InvalidNodeError(f"{lead} {not_a_node(items)}")
        nodes = tuple(items)
        where = f"{lead} a list whose item {{}} is"
    else:
        where = f"{lead}, as argument {{}}," if len(nodes) > 1 else lead
    out = []
    for i, n in enumerate(nodes):
        if not isinstance(n, SchedulingNode):
            raise InvalidNodeError(f"{where.format(i)} {not_a_node(n)}")
        out.append(n)
    return out


class SchedulingNode(Generic[T, V]):
    """A unit of work in a flow. Subclass it and implement [`task`][taskflow.SchedulingNode.task].

    Every option is checked here, when the node is defined: a bad one raises
    ``FlowDefinitionError`` (a ``ValueError``; ``InvalidNodeError``, also a ``TypeError``, for
    a value of the wrong type or an unknown option) naming the node, and a misspelt option
    is refused with the closest option's name. A subclass whose ``task`` cannot be called as
    ``task(ctx, param)`` is refused when its first node is made.

    Args:
        param: the value passed to ``task`` as ``param``.
        name: unique name within a flow; defaults to the class name.
        timeout: seconds (> 0) from the node's first start that cover all its attempts; when
            it passes the node is ``TIMEOUT`` at once and its sons fail fast. Its thread keeps
            running (a Python thread cannot be interrupted): the late result is dropped.
            None: no limit.
        deadline: seconds (> 0) from the run's start by which the node must end, whatever its
            fathers took: past it the node is ``TIMEOUT`` (``DEGRADED`` with a fallback),
            started or not, and the rest of the run goes on (see [`Section`][taskflow.Section]
            for a group). None: the run's budget alone.
        retries: extra attempts after a failure (>= 0).
        retry_backoff: seconds before the first retry, doubled for each further one. Retries
            stop when the next back-off would not fit the budget.
        join: the [`Join`][taskflow.Join] policy deciding when the node runs.
        bulkhead: a [`Bulkhead`][taskflow.Bulkhead] capping concurrent attempts across runs.
        breaker: a [`CircuitBreaker`][taskflow.CircuitBreaker]; while open the node fails at
            once.
        rate_limit: a [`RateLimit`][taskflow.RateLimit] token bucket shared across runs.
        fallback: a value, or ``fallback(ctx, error)``: the node ends ``DEGRADED`` with it
            instead of ``EXCEPTION``/``TIMEOUT``.
        hedge: a [`Hedge`][taskflow.Hedge]: duplicate attempts when the first is slow; needs
            ``idempotent=True``.
        idempotent: the task may run more than once for one operation (``ctx.operation_id``).
        share_key: ``share_key(ctx, param)`` -> a hashable key; concurrent runs with the same
            key share one attempt.
        cache_ttl: with ``share_key``, keep successes this many seconds (None: not kept).
        cache_size: with ``cache_ttl``, at most this many kept successes.
        cache: with ``cache_ttl``, where successes are kept (``taskflow.cache``: the
            in-process ``LruCache`` by default, ``RedisCache`` shares them across processes).
        stale_for: seconds after ``cache_ttl`` a value is still kept (servable stale).
        stale_if_error: seconds after ``cache_ttl`` a value is served, ``DEGRADED``, when the
            call fails.
        priority: higher first when more nodes are ready than workers are free.
        min_budget: seconds of budget the node needs to start; less: ``TIMEOUT`` at once.
        batch: a [`Batch`][taskflow.Batch]: the node is answered by one call shared with the
            other nodes of that batch that are ready with it (its key: ``param``, or the
            batch's ``key(ctx, param)``); its ``task`` is not called.
        retry_budget: a [`RetryBudget`][taskflow.RetryBudget] its retries draw from, shared
            across nodes and runs; a retry past it is not made.
        detach: the run does not wait for the node: once its fathers succeed it is handed off
            as detached work (its state in the run's result is ``DETACHED``,
            ``FlowResult.detached(name)`` the Future of its final outcome), bounded by its own
            ``timeout`` (required, counted from the hand-off) and by the process's
            ``taskflow.set_max_detached``; past that bound it ends EXCEPTION with
            ``DetachedRefusedError``. Nothing may depend on it (no sons). Its hooks run once,
            when it ends, possibly after ``start`` returned.
        **unknown: refused: any other keyword raises ``InvalidNodeError`` naming it and the
            closest option.
    """

    # set in __init__ (through __dict__, so that construction does not invalidate plans)
    param: T
    name: str
    timeout: float | None
    deadline: float | None
    retries: int
    retry_backoff: float
    join: Join
    bulkhead: Bulkhead | None
    breaker: CircuitBreaker | None
    rate_limit: RateLimit | None
    fallback: Any
    hedge: Hedge | None
    idempotent: bool
    share_key: Callable[[TaskContext, Any], Hashable] | None
    cache_ttl: float | None
    cache_size: int
    priority: float
    min_budget: float | None
    batch: Batch | None
    retry_budget: RetryBudget | None
    detach: bool
    _fathers: list[SchedulingNode[Any, Any]]
    _sons: list[SchedulingNode[Any, Any]]
    _optional: set[int]
    _run: weakref.ref[RunView] | None
    _idx: int

    node_kind: ClassVar[NodeKind] = NodeKind.TASK
    """How the engine runs this class's nodes (see ``NodeKind``)."""

    draw_as: ClassVar[str | None] = None
    """How diagrams (Mermaid, DOT) draw this class's nodes: ``"task"``, ``"switch"``,
    ``"fanout"``, ``"fork"`` or ``"join"``; None derives it from [`node_kind`][taskflow.model.node.SchedulingNode.node_kind]."""

    # methods a subclass overrides, with the arguments the engine calls them with (after self):
    # an override that cannot take them is refused when a node of the class is made
    _called_as: ClassVar[dict[str, str]] = {"task": "(ctx, param)"}
    _arity_problem: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # classes written before NodeKind declared their kind with a class flag
        if cls.__dict__.get("_routes_sons"):
            cls.node_kind = NodeKind.SWITCH
        elif cls.__dict__.get("_fans_out"):
            cls.node_kind = NodeKind.FANOUT
        cls._arity_problem = _arity_of_methods(cls)

    def __init__(
        self,
        param: T | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        retries: int = 0,
        retry_backoff: float = 0.0,
        join: Join = Join.ALL,
        bulkhead: Bulkhead | None = None,
        breaker: CircuitBreaker | None = None,
        rate_limit: RateLimit | None = None,
        fallback: Any = NO_FALLBACK,
        hedge: Hedge | None = None,
        idempotent: bool = False,
        share_key: Callable[[TaskContext, Any], Hashable] | None = None,
        cache_ttl: float | None = None,
        cache_size: int = 1024,
        cache: Cache | None = None,
        stale_for: float | None = None,
        stale_if_error: float | None = None,
        priority: float = 0,
        min_budget: float | None = None,
        batch: Batch | None = None,
        retry_budget: RetryBudget | None = None,
        detach: bool = False,
        **unknown: NoReturn,
    ) -> None:
        d = self.__dict__
        d["_plans"] = []  # compiled plans that include this node; invalidated on change
        d["_run"] = None  # set on per-run copies only
        d["_idx"] = -1
        d["_fathers"] = []
        d["_sons"] = []
        d["_optional"] = set()  # ids of fathers whose failure is tolerated
        if name is not None:
            _check_name(name)
        label = name if name is not None else type(self).__name__
        if unknown:
            refuse_options(label, type(self), unknown)
        problem = type(self)._arity_problem
        if problem is not None:
            raise InvalidNodeError(f"node {label!r}: {problem}")
        if not isinstance(join, Join):
            raise InvalidNodeError(f"node {label!r}: join must be a taskflow.Join policy, got {join!r}")
        d["param"] = param
        d["name"] = label
        d["timeout"] = check_node_timeout(timeout, label)
        d["deadline"] = check_node_timeout(deadline, label, "deadline")
        d["retries"], d["retry_backoff"] = _check_retries(retries, retry_backoff, label)
        d["join"] = join
        _set_policy(self, {
            "bulkhead": bulkhead, "breaker": breaker, "rate_limit": rate_limit,
            "fallback": fallback, "hedge": hedge, "idempotent": idempotent,
            "share_key": share_key, "cache_ttl": cache_ttl, "cache_size": cache_size,
            "priority": priority, "min_budget": min_budget, "batch": batch,
            "retry_budget": retry_budget, "cache": cache, "stale_for": stale_for,
            "stale_if_error": stale_if_error, "detach": detach,
        })

    # -- the work and the hooks -------------------------------------------------------------

    def task(self, ctx: TaskContext, param: T) -> V:
        """The work. Runs on an executor worker (or in another process, see the README)."""
        raise NotImplementedError

    def on_begin(self, support: TaskSupport) -> None:
        """Called before each attempt, on the thread that runs the attempt."""

    def on_success(self, support: TaskSupport) -> None:
        """Called once when the node succeeded, before its sons are started."""

    def on_fail(self, support: TaskSupport) -> None:
        """Called once when the node ends EXCEPTION, TIMEOUT or CANCELLED (failed fast too)."""

    def choose_sons(self, value: object) -> tuple[SchedulingNode[Any, Any], ...]:
        """For ``NodeKind.SWITCH`` classes: the definition sons chosen by the task's ``value``
        (called by the engine after ``task`` succeeded)."""
        choose = getattr(self, "_choose", None)
        if choose is None:
            raise NotImplementedError(f"{type(self).__name__} does not implement choose_sons()")
        chosen: tuple[SchedulingNode[Any, Any], ...] = choose(value)
        return chosen

    # -- wiring ------------------------------------------------------------------------------

    def set_son_handler(self, *nodes: Any) -> SchedulingNode[T, V]:
        """Add edges self -> each node (also recorded on the sons). Returns self."""
        for son in _flatten(nodes, f"node {self.name!r}: set_son_handler got"):
            _link(self, son)
        return self

    def set_father_handler(self, *nodes: Any) -> SchedulingNode[T, V]:
        """Add edges each node -> self (also recorded on the fathers). Returns self."""
        for father in _flatten(nodes, f"node {self.name!r}: set_father_handler got"):
            _link(father, self)
        return self

    def depends_on(self, node: SchedulingNode[Any, Any], optional: bool = False) -> SchedulingNode[T, V]:
        """Add the edge node -> self; ``optional=True`` tolerates that father's failure."""
        if not isinstance(node, SchedulingNode):
            raise InvalidNodeError(f"node {self.name!r}: depends_on got {not_a_node(node)}")
        father = node
        _link(father, self)
        opt = self._optional
        if optional and id(father) not in opt:
            opt.add(id(father))
            self._touch()
        elif not optional and id(father) in opt:
            opt.discard(id(father))
            self._touch()
        return self

    @property
    def section(self) -> Section | None:
        """The [`Section`][taskflow.Section] this node belongs to, or None."""
        section: Section | None = self.__dict__.get("_section")
        return section

    @property
    def father_handler(self) -> list[SchedulingNode[Any, Any]]:
        """The fathers (in a run's copy: that run's nodes)."""
        run = self._run_view()
        if run is not None:
            return [run.node(i) for i in run.fathers_of(self._idx)]
        return list(self._fathers)

    @property
    def son_handler(self) -> list[SchedulingNode[Any, Any]]:
        """The sons (in a run's copy: that run's nodes)."""
        run = self._run_view()
        if run is not None:
            return [run.node(i) for i in run.sons_of(self._idx)]
        return list(self._sons)

    @overload
    def __rshift__(self, other: SchedulingNode[Any, Any]) -> SchedulingNode[Any, Any]: ...
    @overload
    def __rshift__(self, other: list[SchedulingNode[Any, Any]]) -> list[SchedulingNode[Any, Any]]: ...

    def __rshift__(self, other: Any) -> Any:
        """``a >> b`` adds a -> b and returns b; ``a >> [b, c]`` returns the list."""
        if isinstance(other, SchedulingNode):
            _link(self, other)
            return other
        sons = _flatten((other,), f"cannot wire node {self.name!r} >>")
        for son in sons:
            _link(self, son)
        return other

    def __rrshift__(self, other: Any) -> SchedulingNode[Any, Any]:
        """``[a, b] >> c`` adds a -> c and b -> c and returns c."""
        for father in _flatten((other,), f"cannot wire ... >> node {self.name!r}: the left side is"):
            _link(father, self)
        return self

    # -- per-run view --------------------------------------------------------------------------

    def _run_view(self) -> RunView | None:
        """The run this copy belongs to (None for a definition).

        Raises:
            RuntimeError: the run is gone (a copy holds its run weakly; keep the FlowResult).
        """
        ref = self.__dict__.get("_run")
        if ref is None:
            return None
        run: RunView | None = ref()
        if run is None:
            raise RuntimeError(
                f"the run of node {self.name!r} is gone; keep its FlowResult to walk its graph")
        return run

    @property
    def work_result(self) -> WorkResult[V]:
        """This run's result (a definition node holds a default result forever)."""
        wr: WorkResult[V] | None = self.__dict__.get("_wr")
        return _DEFAULT_RESULT if wr is None else wr

    @property
    def state(self) -> NodeState:
        wr = self.__dict__.get("_wr")
        if wr is None:
            return NodeState.INIT
        st = wr.state
        if st is ResultState.DEFAULT:
            return NodeState.WORKING if wr.started_at is not None else NodeState.INIT
        if st is ResultState.DETACHED:  # handed off: it may still be running
            return NodeState.WORKING
        return NodeState.FINISH if st in _FINISH_STATES else NodeState.ERROR

    # -- internals -----------------------------------------------------------------------------

    def __setattr__(self, key: str, value: Any) -> None:
        d = self.__dict__
        if key in _PLAN_FIELDS and d.get("_run", 1) is None:
            if key == "name":
                _check_name(value)
            if key == "join" and not isinstance(value, Join):
                raise InvalidNodeError(
                    f"node {self.name!r}: join must be a taskflow.Join policy, got {value!r}")
            if key == "timeout" or key == "deadline":
                value = check_node_timeout(value, self.name, key)
                if d.get("detach"):
                    _check_detached(self, value if key == "timeout" else d.get("timeout"),
                                    value if key == "deadline" else d.get("deadline"))
            elif key == "retries":
                value = _check_retries(value, d.get("retry_backoff", 0.0), self.name)[0]
                _check_batched(self, value, d.get("batch"))
            elif key == "retry_backoff":
                value = _check_retries(d.get("retries", 0), value, self.name)[1]
            d[key] = value
            self._touch()
            return
        if key in _POLICY_FIELDS and d.get("_run", 1) is None:
            _set_policy(self, {**{k: d.get(k, _POLICY_DEFAULTS.get(k, NO_FALLBACK))
                                  for k in _POLICY_FIELDS}, key: value})
            self._touch()
            return
        object.__setattr__(self, key, value)

    def _touch(self) -> None:
        """Invalidate the compiled plans that include this node."""
        plans = self.__dict__.get("_plans")
        if plans:
            for plan in plans:
                plan.stale = True
            plans.clear()

    def __getstate__(self) -> dict[str, Any]:
        # only the node itself travels to other processes: not the graph, not the run
        state = {k: v for k, v in self.__dict__.items() if k not in _UNPICKLED}
        state["_run"] = None
        state.pop("_wr", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.update(_plans=[], _fathers=[], _sons=[], _optional=set(), _idx=-1,
                             _policy=None)

    def __repr__(self) -> str:
        name = self.__dict__.get("name", "?")
        run = self.__dict__.get("_run")
        if run is None:
            return f"<{type(self).__name__} {name!r}>"
        return f"<{type(self).__name__} {name!r} {self.work_result.state.name}>"


# the resilience options stay in the caller's process (all their bookkeeping is there), and a
# lambda fallback or share_key must not stop a node from travelling to a process pool
_UNPICKLED = frozenset({"_plans", "_run", "_wr", "_fathers", "_sons", "_optional",
                        "_plan_cache", "_policy", "_section", "bulkhead", "breaker", "rate_limit", "fallback",
                        "hedge", "share_key", "batch", "retry_budget", "cache"})


def _set_policy(node: SchedulingNode[Any, Any], options: dict[str, Any]) -> None:
    """Check ``options`` and store them with the node's ``NodePolicy`` (None when every option
    has its default, so such nodes cost the engine nothing)."""
    d = node.__dict__
    if all(options[k] is v or options[k] == v and type(options[k]) is type(v)
           for k, v in _POLICY_DEFAULTS.items()) and options["fallback"] is NO_FALLBACK:
        d.update(options)
        d["_policy"] = None
        return
    from taskflow.resilience.fallback import Fallback
    from taskflow.resilience.policy import NodePolicy

    name = d["name"]
    spec = options["fallback"]
    policy = NodePolicy(
        name, fanout=type(node).node_kind is NodeKind.FANOUT,
        bulkhead=options["bulkhead"], breaker=options["breaker"],
        rate_limit=options["rate_limit"],
        fallback=None if spec is NO_FALLBACK else Fallback(spec, node=name),
        hedge=options["hedge"], idempotent=options["idempotent"],
        share_key=options["share_key"], cache_ttl=options["cache_ttl"],
        cache_size=options["cache_size"], priority=options["priority"],
        min_budget=options["min_budget"], batch=options["batch"],
        retry_budget=options["retry_budget"], cache=options["cache"],
        stale_for=options["stale_for"], stale_if_error=options["stale_if_error"],
        detach=options["detach"],
    )
    _check_batched(node, d.get("retries", 0), options["batch"])
    if options["detach"]:
        _check_detached(node, d.get("timeout"), d.get("deadline"))
    d.update(options)
    d["_policy"] = policy


def _check_batched(node: SchedulingNode[Any, Any], retries: int, batch: object) -> None:
    """A batched task node is answered by its batch's call: it does not retry (the call is
    shared) and runs no attempt of its own for ``on_begin`` to precede."""
    cls = type(node)
    if batch is None or cls.node_kind is NodeKind.FANOUT:
        return
    name = node.__dict__["name"]
    if retries:
        raise FlowDefinitionError(
            f"node {name!r}: a batched node does not retry (its call is shared with other "
            f"nodes), got retries={retries}; retry inside the batch's fn, or drop batch")
    if cls.on_begin is not SchedulingNode.on_begin:
        raise InvalidNodeError(
            f"node {name!r}: {cls.__name__} overrides on_begin, which a batched node never "
            "calls (it runs no attempt of its own: its batch's call answers it); drop "
            "on_begin or batch")


def _check_detached(node: SchedulingNode[Any, Any], timeout: float | None,
                    deadline: float | None = None) -> None:
    """A detached node is bounded by its own time limit (the run's budget no longer covers
    it once ``start`` returned, nor does a deadline from the run's start), and is a plain
    task: a switch chooses sons (a detached node has none) and a fan-out's items belong to
    the run."""
    name = node.__dict__["name"]
    if deadline is not None:
        raise FlowDefinitionError(
            f"node {name!r}: detach=True is bounded by its own timeout from its hand-off, not "
            f"by a deadline from the run's start; drop deadline={deadline!r} or detach")
    if timeout is None or math.isinf(timeout):
        raise FlowDefinitionError(
            f"node {name!r}: detach=True needs a finite timeout (seconds, counted from its "
            f"hand-off): the run does not wait for it, so nothing else bounds it; got "
            f"timeout={timeout!r}")
    kind = type(node).node_kind
    if kind is not NodeKind.TASK:
        raise FlowDefinitionError(
            f"node {name!r}: a {kind.value} node cannot be detached; detach a plain task node")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidNodeError(f"node name must be a non-empty str, got {name!r}")
_DEFAULT_RESULT: WorkResult[Any] = WorkResult()


def _link(father: SchedulingNode[Any, Any], son: SchedulingNode[Any, Any]) -> None:
    fd, sd = father.__dict__, son.__dict__
    if "_sons" not in fd or "_fathers" not in sd:
        bad = father if "_sons" not in fd else son
        raise FlowDefinitionError(
            f"{type(bad).__name__}.__init__ did not call super().__init__(); "
            "SchedulingNode subclasses must initialise their base"
        )
    if fd["_run"] is not None or sd["_run"] is not None:
        raise RuntimeError("cannot rewire the nodes of a run; wire the definitions instead")
    sons, fathers = fd["_sons"], sd["_fathers"]
    if not any(s is son for s in sons):
        sons.append(son)
        father._touch()
        son._touch()
    if not any(f is father for f in fathers):
        fathers.append(father)
        father._touch()
        son._touch()


class FunctionNode(SchedulingNode[Any, Any]):
    """A node that calls ``fn(ctx, param)``: replaces an ``executor.submit`` without a class.

    ``fn`` is checked when the node is made: it must be a plain (not ``async``) callable that
    can be called with two positional arguments.

    Args:
        fn: a callable taking ``(ctx, param)``.
        param: passed as ``param``.
        name: defaults to ``fn.__name__``.
        timeout: as for [`SchedulingNode`][taskflow.SchedulingNode], like every option below.
        deadline: seconds from the run's start by which the node must end.
        retries: extra attempts after a failure.
        retry_backoff: seconds before the first retry, doubled for each further one.
        join: the [`Join`][taskflow.Join] policy deciding when the node runs.
        bulkhead: a [`Bulkhead`][taskflow.Bulkhead] capping concurrent attempts across runs.
        breaker: a [`CircuitBreaker`][taskflow.CircuitBreaker].
        rate_limit: a [`RateLimit`][taskflow.RateLimit] token bucket.
        fallback: a value, or ``fallback(ctx, error)``, standing in when the node fails.
        hedge: a [`Hedge`][taskflow.Hedge] (needs ``idempotent=True``).
        idempotent: the task may run more than once for one operation.
        share_key: ``share_key(ctx, param)`` -> a hashable key shared across runs.
        cache_ttl: with ``share_key``, keep successes this many seconds.
        cache_size: with ``cache_ttl``, at most this many kept successes.
        cache: with ``cache_ttl``, where successes are kept (``taskflow.cache``).
        stale_for: seconds after ``cache_ttl`` a value is still kept (servable stale).
        stale_if_error: seconds after ``cache_ttl`` a value is served when the call fails.
        priority: higher first when more nodes are ready than workers are free.
        min_budget: seconds of budget the node needs to start.
        batch: a [`Batch`][taskflow.Batch]: one call ``fn(keys)`` answers the nodes of that
            batch that are ready together; ``fn`` here is not called.
        retry_budget: a [`RetryBudget`][taskflow.RetryBudget] shared by the retries of every
            node that names it.
        detach: the run does not wait for the node (it needs a finite ``timeout`` and no
            sons); see [`SchedulingNode`][taskflow.SchedulingNode].
        **unknown: refused: any other keyword raises ``InvalidNodeError`` naming it and the
            closest option.
    """

    def __init__(
        self,
        fn: Callable[[TaskContext, Any], Any],
        param: Any = None,
        name: str | None = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        retries: int = 0,
        retry_backoff: float = 0.0,
        join: Join = Join.ALL,
        bulkhead: Bulkhead | None = None,
        breaker: CircuitBreaker | None = None,
        rate_limit: RateLimit | None = None,
        fallback: Any = NO_FALLBACK,
        hedge: Hedge | None = None,
        idempotent: bool = False,
        share_key: Callable[[TaskContext, Any], Hashable] | None = None,
        cache_ttl: float | None = None,
        cache_size: int = 1024,
        cache: Cache | None = None,
        stale_for: float | None = None,
        stale_if_error: float | None = None,
        priority: float = 0,
        min_budget: float | None = None,
        batch: Batch | None = None,
        retry_budget: RetryBudget | None = None,
        detach: bool = False,
        **unknown: NoReturn,
    ) -> None:
        if not callable(fn):
            what = closed_coroutine(fn)
            if what is not None:
                raise InvalidNodeError(
                    f"FunctionNode needs a callable, got the coroutine object {what}(...): "
                    f"pass the async function itself, FunctionNode({what}), not a call of it")
            raise InvalidNodeError(f"FunctionNode needs a callable, got {not_a_node(fn)}")
        if name is None:
            name = getattr(fn, "__name__", None) or type(fn).__name__
        if callable_is_async(fn):
            load_asyncio()  # with the node, not inside its first run
        else:
            problem = generator_problem(fn)
            if problem is not None:
                raise InvalidNodeError(f"node {name!r}: {problem}")
        problem = arity_problem(fn, "fn(ctx, param)", 2)
        if problem is not None:
            raise InvalidNodeError(f"node {name!r}: {problem}")
        super().__init__(
            param, name=name, timeout=timeout, deadline=deadline, retries=retries,
            retry_backoff=retry_backoff, join=join, bulkhead=bulkhead, breaker=breaker, rate_limit=rate_limit,
            fallback=fallback, hedge=hedge, idempotent=idempotent, share_key=share_key,
            cache_ttl=cache_ttl, cache_size=cache_size, cache=cache, stale_for=stale_for,
            stale_if_error=stale_if_error, priority=priority,
            min_budget=min_budget, batch=batch, retry_budget=retry_budget, detach=detach,
            **unknown)
        self.__dict__["fn"] = fn

    fn: Callable[[TaskContext, Any], Any]

    def task(self, ctx: TaskContext, param: Any) -> Any:
        return self.fn(ctx, param)


class Section:
    """A named group of nodes sharing a deadline measured from the run's start.

    ``Section("below-fold", [recommendations, questions], deadline=0.08)`` gives each node the
    deadline (a node's own ``deadline=`` still applies when it is earlier): past it, whatever
    its fathers took, a node of the section that has not ended is ``TIMEOUT`` (``DEGRADED``
    with a fallback), started or not, and the rest of the run goes on. A node belongs to at
    most one section; joining one marks its compiled plans stale. Every node a section names
    must be in the graph a run starts (a section naming nodes of two graphs is refused when
    either is started). Reports and the HTML view show each node's section and deadline.

    Args:
        name: the section's name (shown in reports and the HTML view).
        nodes: the nodes of the section (node objects of one graph, at least one).
        deadline: seconds (> 0) from the run's start by which each node must end.

    Raises:
        InvalidNodeError: a member is not a node, or the name is not a string.
        FlowDefinitionError: the name is empty, the deadline is not > 0, no node is given,
            a node is given twice or already belongs to another section.
    """

    __slots__ = ("_nodes", "deadline", "name")

    name: str
    deadline: float

    def __init__(self, name: str, nodes: Iterable[SchedulingNode[Any, Any]], *,
                 deadline: float) -> None:
        if not isinstance(name, str):
            raise InvalidNodeError(f"Section name must be a string, got {type(name).__name__}")
        if not name:
            raise FlowDefinitionError("Section name must not be empty")
        checked = check_timeout(deadline, f"deadline of section {name!r}")
        if not checked:  # None or 0: it would end every node before it starts
            raise FlowDefinitionError(
                f"deadline of section {name!r} must be > 0 seconds, got {deadline!r}")
        if isinstance(nodes, SchedulingNode):
            nodes = (nodes,)
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Iterable):
            raise InvalidNodeError(
                f"section {name!r}: nodes must be an iterable of nodes, got {type(nodes).__name__}")
        members = tuple(nodes)
        if not members:
            raise FlowDefinitionError(f"section {name!r} has no nodes")
        seen: set[int] = set()
        for n in members:
            if not isinstance(n, SchedulingNode):
                raise InvalidNodeError(f"section {name!r}: {not_a_node(n)} is not a node")
            if n.__dict__.get("_run") is not None:
                raise InvalidNodeError(
                    f"section {name!r}: node {n.name!r} is a run's copy; name the definition node")
            if id(n) in seen:
                raise FlowDefinitionError(f"section {name!r} names node {n.name!r} twice")
            seen.add(id(n))
            other = n.section
            if other is not None:
                raise FlowDefinitionError(
                    f"node {n.name!r} is already in section {other.name!r}; "
                    f"it cannot join section {name!r}")
        self.name = name
        self.deadline = checked
        self._nodes = members
        for n in members:
            n.__dict__["_section"] = self
            n._touch()

    @property
    def nodes(self) -> tuple[SchedulingNode[Any, Any], ...]:
        """The section's nodes, in the order given."""
        return self._nodes

    def __repr__(self) -> str:
        names = ", ".join(repr(n.name) for n in self._nodes)
        return f"Section({self.name!r}, [{names}], deadline={self.deadline:g})"
