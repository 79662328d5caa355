"""Node kinds built on the model: switches (:mod:`~taskflow.kinds.switch`), Conductor-style
fork/join (:mod:`~taskflow.kinds.forkjoin`) and bounded dynamic fan-out
(:mod:`~taskflow.kinds.fanout`). The names are exported from ``taskflow``.
"""
