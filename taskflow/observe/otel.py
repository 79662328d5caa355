"""OpenTelemetry traces of runs: ``instrument()`` once at start-up, ``uninstrument()`` to stop.

Needs the ``[otel]`` extra (``opentelemetry-api``; the application brings the SDK and its
exporters, as for any instrumented library). Once instrumented, every run started makes:

* one ``taskflow.run`` span, a child of the span current where ``start``/``submit`` was called
  (a nested run's parent is the node span of the node that started it), from the start of the run
  to its result, with ``taskflow.flow_id``, ``taskflow.flow``, ``taskflow.status``,
  ``taskflow.elapsed`` and ``taskflow.timeout``; status ERROR when the run ``FAILED`` or
  ``TIMED_OUT``;
* one ``taskflow.node`` span per attempt of a node, a child of the run span, with
  ``taskflow.flow_id``, ``taskflow.flow``, ``taskflow.node``, ``taskflow.attempt``,
  ``taskflow.queue_wait`` (seconds between being queued and starting), ``taskflow.state`` (how the
  attempt ended: the node's final state, or ``EXCEPTION`` for an attempt that was retried) and
  ``taskflow.abandoned`` (the node ended while the attempt still ran: a timeout, a cancel, the
  run's budget; its thread may still be running); status ERROR for ``EXCEPTION`` and ``TIMEOUT``,
  with the exception recorded. On thread executors the node span is the current span inside the
  task, its hooks and its fan-out items, so spans the task makes (an HTTP client's) are its
  children. On executors in other processes the span covers the attempt as the caller sees it,
  from submission to the outcome coming back.

A detached node (``detach=True``) gets its ``taskflow.node`` spans too, with
``taskflow.detached`` true, one per attempt, children of the run span, though they may start
and end after it: the run span ends when ``start`` returns, and the node's span ends when the
node does (``taskflow.state`` its final state; ``taskflow.abandoned`` true when its own timeout
ended it while its attempt still ran).

Events: ``taskflow.retry`` (on the failed attempt's span: ``attempt``, ``delay``, the error),
``taskflow.hedge`` (a duplicate attempt started), ``taskflow.item_failed`` (a fan-out item raised),
``taskflow.cancelled`` (on the run span when ``ctx.cancel`` ends the run; on a node span when the
node is cancelled), and ``taskflow.node_ended`` on the run span for a node that failed, timed out
or was cancelled without an attempt running (failed fast after its father, or never started).

Not instrumented, nothing is paid (``benchmarks/overhead.py``); instrumented, each attempt costs
a span (about 15-30 µs with the SDK and a batch processor: ``benchmarks/overhead.py --otel``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, Status, StatusCode, TracerProvider
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "taskflow.otel needs OpenTelemetry: pip install 'taskflow-juc[otel]'") from exc

from taskflow import clock
from taskflow._version import __version__
from taskflow.engine import events
from taskflow.model.result import ResultState

if TYPE_CHECKING:
    from taskflow.model.result import FlowResult, WorkResult

__all__ = ["instrument", "instrumented", "uninstrument"]

_lock = threading.Lock()  # guards _listener
_listener: _Tracing | None = None

_FAILED = (ResultState.EXCEPTION, ResultState.TIMEOUT)
_RUN_FAILED = ("FAILED", "TIMED_OUT")


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Trace every run started from now on.

    Args:
        tracer_provider: Where the spans go; default: the global one
            (``opentelemetry.trace.set_tracer_provider``), looked up when each span starts.

    Calling it again replaces the provider.
    """
    global _listener
    tracer = trace.get_tracer("taskflow", __version__, tracer_provider=tracer_provider)
    listener = _Tracing(tracer)
    with _lock:
        if _listener is not None:
            events.remove_listener(_listener)
        _listener = listener
        events.add_listener(listener)


def uninstrument() -> None:
    """Stop tracing runs started from now on (runs already started finish their spans)."""
    global _listener
    with _lock:
        if _listener is not None:
            events.remove_listener(_listener)
        _listener = None


def instrumented() -> bool:
    """Whether runs are traced."""
    return _listener is not None


def _value(v: Any) -> Any:
    """An attribute value OpenTelemetry accepts."""
    if isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, BaseException):
        return f"{type(v).__name__}: {v}"
    return str(v)


def _error_attrs(error: BaseException | None) -> dict[str, Any]:
    if error is None:
        return {}
    return {"exception.type": type(error).__qualname__, "exception.message": str(error)}


class _Tracing:
    """The listener: a [`_RunTrace`][taskflow.observe.otel._RunTrace] per run."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def run_started(self, run: events.ObservedRun) -> events.RunObserver:
        attrs: dict[str, Any] = {"taskflow.flow_id": run.flow_id, "taskflow.flow": run.flow_name}
        if run.budget != float("inf"):
            attrs["taskflow.timeout"] = run.budget
        span = self.tracer.start_span("taskflow.run", attributes=attrs)  # parent: the caller's
        return _RunTrace(run, span, self.tracer)

    def __repr__(self) -> str:
        return "<taskflow.otel tracing>"


class _RunTrace(events.RunObserver):
    """The spans of one run."""

    def __init__(self, run: events.ObservedRun, span: Span, tracer: trace.Tracer) -> None:
        self.run = run
        self.span = span
        self.tracer = tracer
        self.parent = trace.set_span_in_context(span)
        # executors in other processes: attempts start on the run's owner thread, in the caller's
        # own contextvars, which must not be changed
        self.attach = run.mode != "remote"
        self.lock = threading.Lock()  # guards open, returned, due, ended
        self.open: dict[int, Span] = {}  # node -> the span of its running attempt
        self.returned: set[int] = set()  # nodes whose deciding attempt returned (not abandoned)
        self.due: dict[int, float] = {}  # node -> when its next attempt was due (after a retry)
        self.detached: dict[int, Span] = {}  # detached node -> the span of its running attempt
        self.ended = False

    def attempt_started(self, i: int, attempt: int) -> None:
        run = self.run
        wr = run.results[i]
        if wr.state is not ResultState.DEFAULT or self.ended:
            return  # settled meanwhile: this attempt's outcome will be dropped
        now = clock.now()
        with self.lock:
            due = self.due.pop(i, None)
        if attempt == 1:
            queued, began = wr.queued_at, wr.started_at
        else:
            queued, began = due, now
        wait = max(0.0, began - queued) if queued is not None and began is not None else 0.0
        span = self.tracer.start_span("taskflow.node", context=self.parent, attributes={
            "taskflow.flow_id": run.flow_id, "taskflow.flow": run.flow_name,
            "taskflow.node": run.names[i], "taskflow.attempt": attempt,
            "taskflow.queue_wait": wait})
        with self.lock:
            stale = self.open.get(i)
            self.open[i] = span
        if stale is not None:  # pragma: no cover - an attempt starts only after the last ended
            self._end(stale, "EXCEPTION", None, abandoned=True)
        if self.attach:
            # the contextvars of this attempt only (a fresh copy per node): no detach needed
            otel_context.attach(trace.set_span_in_context(span))

    def attempt_ended(self, i: int, attempt: int, error: BaseException | None, fate: str) -> None:
        if fate == events.FINAL:
            with self.lock:
                self.returned.add(i)
            return
        with self.lock:
            span = self.open.pop(i, None)
        if span is None:
            return
        if fate == events.RETRY:
            self._end(span, "EXCEPTION", error, abandoned=False)
        else:  # LATE: the node ended without it and nobody closed its span yet
            self._end(span, self.run.results[i].state.name, None, abandoned=True)

    def node_settled(self, i: int) -> None:
        wr = self.run.results[i]
        with self.lock:
            span = self.open.pop(i, None)
            returned = i in self.returned
            self.returned.discard(i)
        state = wr.state
        if span is not None:
            if state is ResultState.CANCELLED:
                span.add_event("taskflow.cancelled", _error_attrs(wr.exception))
            self._end(span, state.name, wr.exception, abandoned=not returned)
        elif state in _FAILED or state is ResultState.CANCELLED:
            self.span.add_event("taskflow.node_ended", {
                "taskflow.node": self.run.names[i], "taskflow.state": state.name,
                **_error_attrs(wr.exception)})

    def event(self, i: int, name: str, attrs: dict[str, Any]) -> None:
        span: Span = self.span
        if i >= 0:
            with self.lock:
                span = self.open.get(i, self.span)
                if name == "retry":
                    self.due[i] = clock.now() + float(attrs.get("delay", 0.0))
            if span is self.span:
                attrs = {**attrs, "node": self.run.names[i]}
        fields: dict[str, Any] = {}
        for k, v in attrs.items():
            if v is None:
                continue
            if isinstance(v, BaseException):
                fields.update(_error_attrs(v))
            else:
                fields[f"taskflow.{k}"] = _value(v)
        span.add_event(f"taskflow.{name}", fields)

    def detached_started(self, i: int, attempt: int) -> None:
        run = self.run
        span = self.tracer.start_span("taskflow.node", context=self.parent, attributes={
            "taskflow.flow_id": run.flow_id, "taskflow.flow": run.flow_name,
            "taskflow.node": run.names[i], "taskflow.attempt": attempt,
            "taskflow.detached": True})
        with self.lock:
            self.detached[i] = span
        # the attempt's own contextvars (a fresh copy per attempt): no detach needed
        otel_context.attach(trace.set_span_in_context(span))

    def detached_retry(self, i: int, attempt: int, error: BaseException, delay: float) -> None:
        with self.lock:
            span = self.detached.pop(i, None)
        if span is not None:
            span.add_event("taskflow.retry", {"taskflow.attempt": attempt,
                                              "taskflow.delay": delay, **_error_attrs(error)})
            self._end(span, "EXCEPTION", error, abandoned=False)

    def detached_ended(self, i: int, result: WorkResult[Any]) -> None:
        with self.lock:
            span = self.detached.pop(i, None)
        running = span is not None
        if span is None:  # it ended before any attempt started (its timeout, a refusal)
            run = self.run
            span = self.tracer.start_span("taskflow.node", context=self.parent, attributes={
                "taskflow.flow_id": run.flow_id, "taskflow.flow": run.flow_name,
                "taskflow.node": run.names[i], "taskflow.attempt": result.attempts,
                "taskflow.detached": True})
        state = result.state
        self._end(span, state.name, result.exception,
                  abandoned=running and state is ResultState.TIMEOUT)

    def run_ended(self, result: FlowResult) -> None:
        with self.lock:
            self.ended = True
            left = list(self.open.items())
            self.open.clear()
        for i, span in left:  # attempts still running when the run ended: abandoned
            self._end(span, self.run.results[i].state.name, None, abandoned=True)
        status = result.status.name
        span = self.span
        span.set_attribute("taskflow.status", status)
        span.set_attribute("taskflow.elapsed", result.elapsed)
        if status in _RUN_FAILED:
            span.set_status(Status(StatusCode.ERROR, status))
        span.end()

    def _end(self, span: Span, state: str, error: BaseException | None, abandoned: bool) -> None:
        span.set_attribute("taskflow.state", state)
        span.set_attribute("taskflow.abandoned", abandoned)
        if state in ("EXCEPTION", "TIMEOUT"):
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{state}: {type(error).__name__}"))
            else:
                span.set_status(Status(StatusCode.ERROR, state))
        span.end()
