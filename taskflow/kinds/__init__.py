"""Node kinds built on the model: switches (``switch``), Conductor-style
fork/join (``forkjoin``) and bounded dynamic fan-out
(``fanout``). The names are exported from ``taskflow``.
"""
