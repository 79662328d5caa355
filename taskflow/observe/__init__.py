"""Reading runs and pools: statistics across runs ([`stats`][taskflow.observe.stats]), traces
([`otel`][taskflow.observe.otel]), HTML pages and diagrams (``html``,
``viz``), the web view (``web``), the pool monitor and
its snapshots (``monitor``, ``snapshots``) and their
Prometheus export (``prometheus``).

``taskflow.stats``, ``taskflow.otel`` and ``taskflow.web`` name these modules from the package
root. The engine is seen only through its instrumentation ([`taskflow.engine.events`][taskflow.engine.events]).
"""
