"""The engine: how one run of a compiled plan executes (see ``run.py`` for the algorithm).

Modules: ``run`` (the node state table, settling, closing), ``loops`` (worker loops, shared with
fan-out), ``inline`` (nested runs on the caller's thread), ``remote`` (executors in other
processes: the coordinator and the code that runs there), ``executors`` (the only code that looks
inside an executor), ``timer`` (the process-wide deadline thread) and ``events`` (the
instrumentation points: who watches runs and what they are told). Nothing is re-exported here,
so importing one module never imports the others.
"""
