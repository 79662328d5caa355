"""Statistics across runs: which node eats the budget, how often, and is it on the critical path.

``FlowStats.record_run(result)`` reads one finished run (the ``WorkResult`` of each node and the
fathers of each, by index: no per-run node copies are made) and adds, per flow and node
(``stats.enable()`` has the engine call it at the end of every run, under the run's flow name;
it is off by default, see below):

* counts by state (``SUCCESS``, ``EXCEPTION``, ...);
* a sliding window (the last ``window`` runs of that node) of its duration and its queue wait,
  from which ``snapshot()`` reports p50/p90/p99;
* cumulative histograms of durations per state, for Prometheus
  (``taskflow_node_duration_seconds{flow,node,state}``);
* how often the node was on its run's critical path ([`critical_path`][taskflow.observe.stats.critical_path]).

A detached node (``detach=True``) is counted twice: ``DETACHED`` when its run ends (handed
off), then by its final state (``SUCCESS``, ``EXCEPTION``, ``TIMEOUT``) with its duration when
it ends, possibly after the run returned (``record_run`` adds a callback to its Future).

Memory is bounded: a window is a fixed-size ring, and at most ``max_series`` (flow, node) pairs
are kept (results of later ones are only counted, in ``dropped_results``). Recording is
lock-light: everything is computed from the result first, then one short critical section per
run appends the figures under that flow's lock (percentiles are sorted only when a snapshot is
taken). ``benchmarks/stats_overhead.py`` measures the cost.

Why recording is opt-in: it costs about 1 µs per node per run, on the thread that finishes the
run and before ``start`` returns; for a flow of no-op nodes that is 10-25% of the run, for a
flow of real backend calls (milliseconds each) nothing measurable. ``benchmarks/overhead.py
--stats`` shows the per-node figure.

A [`RunLog`][taskflow.observe.stats.RunLog] (``stats.runs``) keeps the most recent and the slowest runs themselves, for
the web view (``taskflow.observe.web``). Kept runs hold their nodes, results and exceptions (with
tracebacks) alive, so keep its sizes small.

The module also holds a process-wide instance: ``taskflow.observe.stats.record_run(result)``,
``taskflow.observe.stats.snapshot()``, ``taskflow.observe.stats.to_prometheus()`` use [`STATS`][taskflow.observe.stats.STATS].
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from taskflow import clock
from taskflow.engine import events
from taskflow.exposition import format_label as _label
from taskflow.exposition import format_number as _num
from taskflow.metrics import Percentiles
from taskflow.model.result import ResultState, detached_future

if TYPE_CHECKING:
    from concurrent.futures import Future

    from taskflow.model.result import FlowResult, RunRecord, WorkResult

__all__ = [
    "DEFAULT_BUCKETS",
    "STATS",
    "FlowStats",
    "FlowStatsModel",
    "KeptRun",
    "NodeStatsModel",
    "PrometheusCollector",
    "RunLog",
    "StatsSnapshot",
    "critical_path",
    "disable",
    "enable",
    "flow_name_of",
    "record_run",
    "snapshot",
    "to_prometheus",
]

_DETACHED = ResultState.DETACHED

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
"""Upper bounds (seconds) of the duration histograms; ``+Inf`` is added."""

# (node, state name, duration, its bucket, queue wait, its bucket) of one node in one run
_Figure = tuple[str, str, "float | None", int, "float | None", int]


def flow_name_of(result: FlowResult) -> str:
    """The flow name of a run: its ``flow_name``, else (an empty graph) its first node's."""
    return result.flow_name or next(iter(result), "")


def critical_path(result: FlowResult) -> list[str]:
    """The chain of nodes that decided when the run ended, first to last.

    It ends at the node that ran and finished last (a node cancelled because a join no longer
    needed it only when nothing else ran); from each node it steps to the father that finished
    last before the node was queued (the one it was waiting for: for ``Join.ANY`` the father
    that fired it, not a slower one it did not need; fathers cancelled because a join no longer
    needed them come last). Nodes that never started are not on it. An empty list when nothing
    ran.
    """
    run = result._run
    last: tuple[bool, float, int] | None = None
    for i, wr in enumerate(run.results):
        finished = wr.finished_at
        if wr.started_at is None or finished is None:
            continue
        rank = (wr.state is not ResultState.CANCELLED, finished, i)
        if last is None or rank[:2] > last[:2]:
            last = rank
    names = run.names
    return [] if last is None else [names[i] for i in _walk_back(run, last[2])]


def _walk_back(run: RunRecord, end: int) -> list[int]:
    """The critical path ending at node ``end``, as node indices (see [`critical_path`][taskflow.observe.stats.critical_path])."""
    results = run.results
    path = [end]
    seen = {end}
    i = end
    while True:
        wr = results[i]
        ready = wr.queued_at if wr.queued_at is not None else wr.started_at
        best: tuple[bool, float, int] | None = None
        for f in run.fathers_of(i):
            fwr = results[f]
            finished = fwr.finished_at
            if fwr.started_at is None or finished is None:
                continue
            if ready is not None and finished > ready:
                continue  # finished after this node was ready: it did not hold it back
            # a father cancelled because a join no longer needed it did not hold the node back
            rank = (fwr.state is not ResultState.CANCELLED, finished, f)
            if best is None or rank[:2] > best[:2]:
                best = rank
        if best is None or best[2] in seen:
            break
        i = best[2]
        path.append(i)
        seen.add(i)
    path.reverse()
    return path


class _Window:
    """The last ``size`` samples (a ring; no lock: the owner's lock guards it)."""

    __slots__ = ("data", "n", "size")

    def __init__(self, size: int) -> None:
        self.data: list[float] = []
        self.n = 0  # samples ever added
        self.size = size


class _Histogram:
    """Per-bucket counts (not cumulative), sum and count."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self, n_buckets: int) -> None:
        self.buckets = [0] * (n_buckets + 1)  # last one: above the top bound
        self.sum = 0.0
        self.count = 0


class _NodeSeries:
    __slots__ = ("counts", "critical", "duration", "ended_later", "hist", "wait", "wait_hist")

    def __init__(self, window: int, n_buckets: int) -> None:
        self.counts: dict[str, int] = {}
        self.duration = _Window(window)
        self.wait = _Window(window)
        self.hist: dict[str, _Histogram] = {}  # by state
        self.wait_hist = _Histogram(n_buckets)
        self.critical = 0
        self.ended_later = 0  # final outcomes of detached nodes (their run counted DETACHED)


class _FlowSeries:
    __slots__ = ("by_status", "dropped", "elapsed", "elapsed_hist", "lock", "nodes", "runs")

    def __init__(self, window: int, n_buckets: int) -> None:
        self.lock = threading.Lock()  # guards every field below and the nodes' series
        self.nodes: dict[str, _NodeSeries] = {}
        self.runs = 0
        self.dropped = 0  # node results of untracked nodes (max_series reached)
        self.by_status: dict[str, int] = {}
        self.elapsed = _Window(window)
        self.elapsed_hist = _Histogram(n_buckets)


class NodeStatsModel(BaseModel):
    """One node of one flow across the recorded runs."""

    model_config = ConfigDict(frozen=True)

    node: str
    runs: int
    """Runs of the flow this node took part in."""
    counts: dict[str, int]
    """Runs by the state the node ended in (a detached node: ``DETACHED`` when its run ended,
    then its final state when it ended; ``runs`` counts it once)."""
    duration: Percentiles | None
    """Seconds from first start to end over the window (nodes that started)."""
    queue_wait: Percentiles | None
    """Seconds between being queued and starting, over the window."""
    critical: int
    """Runs in which the node was on the critical path."""
    critical_share: float
    """``critical / runs``."""


class FlowStatsModel(BaseModel):
    """One flow across the recorded runs."""

    model_config = ConfigDict(frozen=True)

    flow: str
    runs: int
    by_status: dict[str, int]
    elapsed: Percentiles | None
    nodes: list[NodeStatsModel]


class StatsSnapshot(BaseModel):
    """What a [`FlowStats`][taskflow.observe.stats.FlowStats] knows at one moment (``FlowStats.snapshot()``)."""

    model_config = ConfigDict(frozen=True)

    timestamp: float
    """``time.time()`` of the snapshot."""
    window: int
    dropped_results: int
    """Node results not recorded because ``max_series`` (flow, node) pairs were tracked."""
    flows: list[FlowStatsModel]


class KeptRun:
    """A run kept by a [`RunLog`][taskflow.observe.stats.RunLog]: the result and what lists show about it."""

    __slots__ = ("elapsed", "finished_at", "flow", "flow_id", "result", "status")

    def __init__(self, result: FlowResult, flow: str, status: str) -> None:
        self.result = result
        self.flow = flow
        self.flow_id = result.flow_id
        self.status = status
        self.elapsed = result.elapsed
        self.finished_at = clock.wall()


class RunLog:
    """The most recent and the slowest runs, bounded.

    Args:
        recent: How many of the latest runs to keep.
        slowest: How many of the slowest runs (by ``elapsed``) to keep, over the whole life of
            the log.

    Thread-safe; ``add`` is O(log slowest) under one short lock.
    """

    def __init__(self, recent: int = 20, slowest: int = 10) -> None:
        if recent < 0 or slowest < 0:
            raise ValueError(f"recent and slowest must be >= 0, got {recent!r} and {slowest!r}")
        self._lock = threading.Lock()  # guards _recent, _slowest
        self._recent: deque[KeptRun] = deque(maxlen=recent) if recent else deque(maxlen=0)
        self._slowest: list[tuple[float, int, KeptRun]] = []  # min-heap on elapsed
        self._slowest_n = slowest
        self._seq = itertools.count()

    def add(self, result: FlowResult, flow: str | None = None, status: str | None = None) -> None:
        """Keep ``result`` (as recent, and as slow if it is among the slowest)."""
        kept = KeptRun(result, flow if flow is not None else flow_name_of(result),
                       status if status is not None else result.status.name)
        entry = (kept.elapsed, next(self._seq), kept)
        with self._lock:
            self._recent.append(kept)
            if self._slowest_n:
                if len(self._slowest) < self._slowest_n:
                    heapq.heappush(self._slowest, entry)
                elif entry[0] > self._slowest[0][0]:
                    heapq.heapreplace(self._slowest, entry)

    def recent(self) -> list[KeptRun]:
        """Kept recent runs, newest first."""
        with self._lock:
            return list(reversed(self._recent))

    def slowest(self) -> list[KeptRun]:
        """Kept slowest runs, slowest first."""
        with self._lock:
            entries = list(self._slowest)
        return [k for _, _, k in sorted(entries, key=lambda e: (-e[0], e[1]))]

    def get(self, flow_id: str) -> KeptRun | None:
        """The kept run with this id, or None."""
        with self._lock:
            for k in self._recent:
                if k.flow_id == flow_id:
                    return k
            for _, _, k in self._slowest:
                if k.flow_id == flow_id:
                    return k
        return None

    def clear(self) -> None:
        """Forget every kept run."""
        with self._lock:
            self._recent.clear()
            self._slowest.clear()


class FlowStats:
    """Statistics per flow and node across runs (see the module docstring).

    Args:
        window: Samples kept per node for the percentiles (the last ``window`` runs).
        buckets: Upper bounds of the histograms, in seconds, increasing.
        max_series: At most this many (flow, node) pairs are tracked; bounded memory when node
            names are made per request.
        runs: Where whole runs are kept for the web view; ``None`` keeps none. Default: a
            [`RunLog`][taskflow.observe.stats.RunLog] with its default sizes.
    """

    def __init__(
        self,
        *,
        window: int = 1024,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        max_series: int = 10_000,
        runs: RunLog | None | bool = True,
    ) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        bounds = tuple(float(b) for b in buckets)
        if not bounds or any(b <= a for a, b in itertools.pairwise(bounds)) or bounds[0] <= 0:
            raise ValueError(f"buckets must be positive and increasing, got {buckets!r}")
        if not isinstance(max_series, int) or max_series < 1:
            raise ValueError(f"max_series must be a positive int, got {max_series!r}")
        self.window = window
        self.buckets = bounds
        self.max_series = max_series
        self.runs: RunLog | None = RunLog() if runs is True else (runs or None)
        self._lock = threading.Lock()  # guards _flows (creation only), _series, _full
        self._flows: dict[str, _FlowSeries] = {}
        self._series = 0
        self._full = False  # max_series reached: unknown nodes are counted, not tracked
        self._feed = _Feed(self)

    def record_run(self, result: FlowResult, *, flow: str | None = None) -> None:
        """Add one finished run.

        Args:
            result: The run (read through its public API only).
            flow: The flow's name (default: [`flow_name_of`][taskflow.observe.stats.flow_name_of]).

        Cost: one pass over the nodes, one walk of the critical path and one short lock; see
        ``benchmarks/stats_overhead.py``. Safe to call from any thread.
        """
        name = flow if flow is not None else flow_name_of(result)
        status = result.status.name
        buckets = self.buckets
        # everything that needs no lock first: per node (name, state, duration, its bucket,
        # queue wait, its bucket), and the end of the critical path
        figures: list[_Figure] = []
        run = result._run
        names = run.names
        last: tuple[bool, float, int] | None = None
        handed_off: list[int] = []
        for i, wr in enumerate(run.results):
            node_name = names[i]
            state = wr.state
            started, queued, finished = wr.started_at, wr.queued_at, wr.finished_at
            if state is _DETACHED:  # handed off: its duration comes when it ends
                handed_off.append(i)
                finished = None
            if started is not None and finished is not None:
                took = finished - started
                duration: float | None = took
                d_bucket = bisect.bisect_left(buckets, took)
                rank = (state is not ResultState.CANCELLED, finished, i)
                if last is None or rank[:2] > last[:2]:
                    last = rank
            else:
                duration, d_bucket = None, 0
            if started is not None and queued is not None:
                waited = started - queued
                wait: float | None = waited
                w_bucket = bisect.bisect_left(buckets, waited)
            else:
                wait, w_bucket = None, 0
            figures.append((node_name, state._value_, duration, d_bucket, wait, w_bucket))
        on_path = [] if last is None else [names[i] for i in _walk_back(run, last[2])]
        elapsed = result.elapsed
        e_bucket = bisect.bisect_left(buckets, elapsed)
        series = self._flows.get(name)
        if series is None:
            with self._lock:
                series = self._flows.setdefault(name, _FlowSeries(self.window, len(buckets)))
        new_nodes: list[str] = []
        full = self._full
        with series.lock:
            series.runs += 1
            series.by_status[status] = series.by_status.get(status, 0) + 1
            _sample(series.elapsed, series.elapsed_hist, e_bucket, elapsed)
            nodes = series.nodes
            # _add() inlined: this loop is the hot path (one pass per node per run)
            for fig in figures:
                node_name, state_name, duration, d_bucket, wait, w_bucket = fig
                ns = nodes.get(node_name)
                if ns is None:
                    if full:
                        series.dropped += 1
                    else:
                        new_nodes.append(node_name)
                    continue
                counts = ns.counts
                counts[state_name] = counts.get(state_name, 0) + 1
                if duration is not None:
                    h = ns.hist.get(state_name)
                    if h is None:
                        h = ns.hist[state_name] = _Histogram(len(buckets))
                    _sample(ns.duration, h, d_bucket, duration)
                if wait is not None:
                    _sample(ns.wait, ns.wait_hist, w_bucket, wait)
            for node_name in on_path:
                ns = nodes.get(node_name)
                if ns is not None:
                    ns.critical += 1
        if new_nodes:
            self._add_new(series, set(new_nodes), figures, on_path)
        if self.runs is not None:
            self.runs.add(result, name, status)
        for i in handed_off:
            fut = detached_future(run, i)
            if fut is not None:
                fut.add_done_callback(partial(self._record_detached, name, names[i]))

    def _record_detached(self, flow: str, node: str, fut: Future[WorkResult[Any]]) -> None:
        """A detached node of a recorded run ended (the thread that ended it): count its
        final state and its duration."""
        wr = fut.result()
        duration = wr.duration
        bucket = 0 if duration is None else bisect.bisect_left(self.buckets, duration)
        series = self._flows.get(flow)
        if series is None:
            return
        with series.lock:
            ns = series.nodes.get(node)
            if ns is None:
                series.dropped += 1
                return
            ns.ended_later += 1
            _add(ns, (node, wr.state._value_, duration, bucket, None, 0))

    def enable(self) -> None:
        """Record every run started from now on, at its end, under its flow name (the engine
        calls [`record_run`][taskflow.observe.stats.FlowStats.record_run] before ``start`` returns). Idempotent."""
        events.add_listener(self._feed)

    def disable(self) -> None:
        """Stop recording runs started from now on."""
        events.remove_listener(self._feed)

    @property
    def enabled(self) -> bool:
        """Whether runs are recorded as they end ([`enable`][taskflow.observe.stats.FlowStats.enable])."""
        return self._feed in events.LISTENERS

    def _add_new(self, series: _FlowSeries, names: set[str], figures: list[_Figure],
                 on_path: list[str]) -> None:
        """First sight of some nodes of a flow: create their series within ``max_series``."""
        with self._lock:
            room = self.max_series - self._series
            allowed = set(sorted(names)[: max(room, 0)])
            self._series += len(allowed)
            self._full = self._series >= self.max_series
        with series.lock:
            series.dropped += len(names) - len(allowed)
            for fig in figures:
                node_name = fig[0]
                if node_name not in allowed:
                    continue
                ns = series.nodes.get(node_name)
                if ns is None:
                    ns = series.nodes[node_name] = _NodeSeries(self.window, len(self.buckets))
                else:  # another thread created it meanwhile: give its slot back
                    with self._lock:
                        self._series -= 1
                        self._full = self._series >= self.max_series
                _add(ns, fig)
                if node_name in on_path:
                    ns.critical += 1

    def _items(self) -> list[tuple[str, _FlowSeries]]:
        with self._lock:
            return sorted(self._flows.items())

    def snapshot(self) -> StatsSnapshot:
        """A pydantic model of every flow and node (percentiles over the window)."""
        flows = []
        dropped = 0
        for name, series in self._items():
            with series.lock:
                dropped += series.dropped
                runs = series.runs
                by_status = dict(series.by_status)
                elapsed = list(series.elapsed.data)
                nodes = [
                    (n, dict(ns.counts), list(ns.duration.data), list(ns.wait.data), ns.critical,
                     ns.ended_later)
                    for n, ns in sorted(series.nodes.items())
                ]
            models = []
            for n, counts, durations, waits, critical, later in nodes:
                seen = sum(counts.values()) - later
                models.append(NodeStatsModel(
                    node=n, runs=seen, counts=counts, duration=Percentiles.of(durations),
                    queue_wait=Percentiles.of(waits), critical=critical,
                    critical_share=critical / seen if seen else 0.0,
                ))
            flows.append(FlowStatsModel(flow=name, runs=runs, by_status=by_status,
                                        elapsed=Percentiles.of(elapsed), nodes=models))
        return StatsSnapshot(timestamp=clock.wall(), window=self.window,
                             dropped_results=dropped, flows=flows)

    def _histograms(self) -> Iterator[tuple[str, str, dict[str, str], list[int], float, int]]:
        """(family, help, labels, per-bucket counts, sum, count) for every histogram series."""
        for name, series in self._items():
            with series.lock:
                rows = [
                    ("flow_duration_seconds", {"flow": name}, series.elapsed_hist),
                ]
                for n, ns in sorted(series.nodes.items()):
                    for state, h in sorted(ns.hist.items()):
                        rows.append(("node_duration_seconds",
                                     {"flow": name, "node": n, "state": state}, h))
                    if ns.wait_hist.count:
                        rows.append(("node_queue_wait_seconds", {"flow": name, "node": n},
                                     ns.wait_hist))
                copied = [(f, labels, list(h.buckets), h.sum, h.count) for f, labels, h in rows]
            for family, labels, counts, total, count in copied:
                yield family, _HELP[family], labels, counts, total, count

    def _counters(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        for name, series in self._items():
            with series.lock:
                rows: list[tuple[str, dict[str, str], float]] = [
                    ("flow_runs_total", {"flow": name, "status": s}, float(c))
                    for s, c in sorted(series.by_status.items())
                ]
                for n, ns in sorted(series.nodes.items()):
                    rows += [("node_results_total", {"flow": name, "node": n, "state": s},
                              float(c)) for s, c in sorted(ns.counts.items())]
                    rows.append(("node_critical_path_total", {"flow": name, "node": n},
                                 float(ns.critical)))
            for family, labels, value in rows:
                yield family, _HELP[family], labels, value

    def to_prometheus(self, *, prefix: str = "taskflow") -> str:
        """The statistics in the Prometheus text exposition format.

        Histograms ``<prefix>_node_duration_seconds{flow,node,state}``,
        ``<prefix>_node_queue_wait_seconds{flow,node}``, ``<prefix>_flow_duration_seconds{flow}``
        (cumulative since the stats were created, not windowed) and counters
        ``<prefix>_node_results_total{flow,node,state}``,
        ``<prefix>_node_critical_path_total{flow,node}``, ``<prefix>_flow_runs_total{flow,status}``.
        Label values are escaped as the format requires (backslash, quote, newline).
        """
        out: list[str] = []
        families: dict[str, list[str]] = {}
        helps: dict[str, tuple[str, str]] = {}
        for family, help_text, labels, counts, total, count in self._histograms():
            helps[family] = ("histogram", help_text)
            lines = families.setdefault(family, [])
            metric = f"{prefix}_{family}"
            cumulative = 0
            for bound, c in zip((*self.buckets, float("inf")), counts, strict=True):
                cumulative += c
                le = "+Inf" if bound == float("inf") else _num(bound)
                lines.append(f"{metric}_bucket{_labels({**labels, 'le': le})} {cumulative}")
            lines.append(f"{metric}_sum{_labels(labels)} {_num(total)}")
            lines.append(f"{metric}_count{_labels(labels)} {count}")
        for family, help_text, labels, value in self._counters():
            helps[family] = ("counter", help_text)
            families.setdefault(family, []).append(
                f"{prefix}_{family}{_labels(labels)} {_num(value)}")
        for family, lines in families.items():
            kind, help_text = helps[family]
            out.append(f"# HELP {prefix}_{family} {help_text}")
            out.append(f"# TYPE {prefix}_{family} {kind}")
            out.extend(lines)
        return "\n".join(out) + "\n" if out else ""

    def collector(self, *, prefix: str = "taskflow") -> PrometheusCollector:
        """A ``prometheus_client`` collector of these statistics (``REGISTRY.register(...)``)."""
        return PrometheusCollector(self, prefix=prefix)

    def reset(self) -> None:
        """Forget everything (and the kept runs)."""
        with self._lock:
            self._flows = {}
            self._series = 0
            self._full = False
        if self.runs is not None:
            self.runs.clear()


_HELP = {
    "flow_duration_seconds": "Elapsed time of whole runs.",
    "node_duration_seconds": "Time from a node's first start to its end, by final state.",
    "node_queue_wait_seconds": "Time a node waited between being queued and starting.",
    "flow_runs_total": "Runs recorded, by status.",
    "node_results_total": "Node outcomes, by final state.",
    "node_critical_path_total": "Runs in which the node was on the critical path.",
}


def _sample(win: _Window, h: _Histogram, bucket: int, value: float) -> None:
    """Add ``value`` to a window and a histogram (the caller holds the flow's lock)."""
    if win.n < win.size:
        win.data.append(value)
    else:
        win.data[win.n % win.size] = value
    win.n += 1
    h.buckets[bucket] += 1
    h.sum += value
    h.count += 1


def _add(ns: _NodeSeries, fig: _Figure) -> None:
    """Apply one node's figures (the caller holds the flow's lock)."""
    _, state, duration, d_bucket, wait, w_bucket = fig
    counts = ns.counts
    counts[state] = counts.get(state, 0) + 1
    if duration is not None:
        h = ns.hist.get(state)
        if h is None:
            h = ns.hist[state] = _Histogram(len(ns.wait_hist.buckets) - 1)
        _sample(ns.duration, h, d_bucket, duration)
    if wait is not None:
        _sample(ns.wait, ns.wait_hist, w_bucket, wait)


class _Feed(events.RunObserver):
    """What [`FlowStats.enable`][taskflow.observe.stats.FlowStats.enable] registers: watches every run, told only of its end."""

    per_node = False

    def __init__(self, stats: FlowStats) -> None:
        self.stats = stats

    def run_started(self, run: events.ObservedRun) -> events.RunObserver:
        return self

    def run_ended(self, result: FlowResult) -> None:
        self.stats.record_run(result, flow=result.flow_name or None)

    def __repr__(self) -> str:
        return f"<taskflow.observe.stats feed of {self.stats!r}>"


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f"{k}={_label(v)}" for k, v in labels.items()) + "}"


class PrometheusCollector:
    """A ``prometheus_client`` collector of a [`FlowStats`][taskflow.observe.stats.FlowStats] (extra ``[prometheus]``).

    ``prometheus_client.REGISTRY.register(PrometheusCollector(stats))``; each scrape reads the
    statistics anew. prometheus_client is imported on the first ``collect``.
    """

    def __init__(self, stats: FlowStats, *, prefix: str = "taskflow") -> None:
        self.stats = stats
        self.prefix = prefix

    def collect(self) -> Iterable[Any]:
        """The metric families (prometheus_client ``Metric`` objects) for one scrape."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        bounds = [*("+Inf" if b == float("inf") else _num(b) for b in self.stats.buckets),
                  "+Inf"]
        hists: dict[str, HistogramMetricFamily] = {}
        for family, help_text, labels, counts, total, _count in self.stats._histograms():
            fam = hists.get(family)
            if fam is None:
                fam = hists[family] = HistogramMetricFamily(
                    f"{self.prefix}_{family}", help_text, labels=list(labels))
            cumulative = list(itertools.accumulate(counts))
            fam.add_metric(list(labels.values()), list(zip(bounds, cumulative, strict=True)), total)
        counters: dict[str, CounterMetricFamily] = {}
        for family, help_text, labels, value in self.stats._counters():
            cfam = counters.get(family)
            if cfam is None:
                cfam = counters[family] = CounterMetricFamily(
                    f"{self.prefix}_{family}", help_text, labels=list(labels))
            cfam.add_metric(list(labels.values()), value)
        return [*hists.values(), *counters.values()]


STATS = FlowStats()
"""The process-wide statistics (``taskflow.observe.stats.record_run`` etc. use it)."""


def enable() -> None:
    """Record every run in the process-wide [`STATS`][taskflow.observe.stats.STATS] as it ends (``STATS.enable()``)."""
    STATS.enable()


def disable() -> None:
    """Stop recording runs in [`STATS`][taskflow.observe.stats.STATS] (``STATS.disable()``)."""
    STATS.disable()


def record_run(result: FlowResult, *, flow: str | None = None) -> None:
    """Record ``result`` in the process-wide [`STATS`][taskflow.observe.stats.STATS]."""
    STATS.record_run(result, flow=flow)


def snapshot() -> StatsSnapshot:
    """A snapshot of the process-wide [`STATS`][taskflow.observe.stats.STATS]."""
    return STATS.snapshot()


def to_prometheus(*, prefix: str = "taskflow") -> str:
    """The process-wide [`STATS`][taskflow.observe.stats.STATS] in the Prometheus text format."""
    return STATS.to_prometheus(prefix=prefix)
