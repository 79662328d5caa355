"""Reading runs and pools: statistics across runs ([`stats`][taskflow.observe.stats]), traces
([`otel`][taskflow.observe.otel]), HTML pages and diagrams (``html``,
``viz``), the web view (``web``), the pool monitor and
its snapshots (``monitor``, ``snapshots``) and their
Prometheus export (``prometheus``), and what is running now (``now``: ``inflight()``,
``abandoned()``, ``dump()``, ``dump_on_signal()``).

``taskflow.stats``, ``taskflow.otel`` and ``taskflow.web`` name these modules from the package
root. The engine is seen only through its instrumentation ([`taskflow.engine.events`][taskflow.engine.events])
and its registry of runs in progress (``taskflow.engine.inflight``, read by ``now``).
"""

from taskflow.observe.now import (
    AbandonedAttempt,
    NodeNow,
    RunNow,
    abandoned,
    abandoned_warning,
    dump,
    dump_on_signal,
    inflight,
    set_abandoned_warning,
)

__all__ = ["AbandonedAttempt", "NodeNow", "RunNow", "abandoned", "abandoned_warning", "dump",
           "dump_on_signal", "inflight", "set_abandoned_warning"]
