"""Executors a user owns: [`ThreadPool`][taskflow.pools.threadpool.ThreadPool], a JUC-style thread pool
(bounded queue, rejection policies, live resizing), and
[`MonitoredExecutor`][taskflow.pools.monitored.MonitoredExecutor], which counts the tasks of any executor.

Both return [`PoolMetrics`][taskflow.metrics.PoolMetrics] snapshots; watching them over time is
[`PoolMonitor`][taskflow.observe.monitor.PoolMonitor]'s job. This part imports nothing of taskflow but
its leaves (errors, metric models, fork hooks). The names are exported from ``taskflow``.
"""
