"""Reading runs and pools: statistics across runs (:mod:`~taskflow.observe.stats`), traces
(:mod:`~taskflow.observe.otel`), HTML pages and diagrams (:mod:`~taskflow.observe.html`,
:mod:`~taskflow.observe.viz`), the web view (:mod:`~taskflow.observe.web`), the pool monitor and
its snapshots (:mod:`~taskflow.observe.monitor`, :mod:`~taskflow.observe.snapshots`) and their
Prometheus export (:mod:`~taskflow.observe.prometheus`).

``taskflow.stats``, ``taskflow.otel`` and ``taskflow.web`` name these modules from the package
root. The engine is seen only through its instrumentation (:mod:`taskflow.engine.events`).
"""
