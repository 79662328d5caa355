"""gunicorn settings for the Flask and Django examples: threaded workers and one pool per worker.

Use it from the repository's root::

    gunicorn -c examples/gunicorn.conf.py --bind 127.0.0.1:8000 examples.flask_app:app
    gunicorn -c examples/gunicorn.conf.py --bind 127.0.0.1:8000 examples.django_app:application

**The worker class.** A request handler that calls ``TaskScheduling.start`` blocks its thread for
at most the flow's budget while the nodes run on the application's shared pool. Use the
``gthread`` worker (a thread per request, ``threads`` of them per worker process). The ``sync``
worker serves one request per process at a time, which is correct but wastes the pool; gevent
or eventlet workers monkey-patch threads, which taskflow's timer and pools do not expect.

**Sizing the pool** (``POOL = ThreadPool(...)`` in the app module, one per worker process)::

    pool threads per process >= threads x width

``threads`` is the number of requests one worker serves at once (below) and ``width`` the most
nodes of one flow that can run at the same time: 4 for the examples' product page (``price``,
``stock``, ``reviews`` and ``recommendations`` run together), so 8 request threads need
``ThreadPool(32)``. A smaller pool makes requests queue for pool threads, and the queueing
counts against each request's budget: they end in 504s under load rather than running late.
``pool.metrics()`` (``GET /pool`` in the examples) shows the queue wait; a pool whose
``queue_wait_s`` p99 is a sizeable share of the budget is too small. Nodes cut by the budget keep
their pool thread until they return (a thread cannot be killed), so leave headroom when backends
can hang: ``abandoned_running`` counts such threads.

**Preloading** (``--preload``, ``preload_app = True``) imports the app module once in the master
and then forks the workers, and a fork copies only the thread that forks. These apps work either
way: taskflow repairs its own objects in each worker (``taskflow/_fork.py``), so the module's
``ThreadPool`` comes back empty and starts threads on demand, and its running ``PoolMonitor``
samples the worker's own process with a sampling thread of its own. What a fork does not repair
is a stdlib ``ThreadPoolExecutor`` (or a ``MonitoredExecutor`` around one) that ran a task
before the fork: the worker's copy believes it has the master's threads and never runs a task.
Create such a pool after the fork, in the ``post_fork`` hook below or lazily on the first
request, or use ``ThreadPool``.
"""

from __future__ import annotations

import multiprocessing

# the examples' pools are ThreadPool(32): threads (8) x the page's width (4), see above
worker_class = "gthread"
threads = 8
# one process per core is plenty for I/O-bound handlers: the waiting happens in threads
workers = max(2, multiprocessing.cpu_count())
# a request blocks its thread for at most the budget (0.5 s in the examples), far below this
timeout = 30
graceful_timeout = 10
# gunicorn's default; True works too for these apps (see the docstring)
preload_app = False
# only this machine, unless the command line says otherwise (--bind)
bind = ["127.0.0.1:8000"]
accesslog = "-"


def post_worker_init(worker: object) -> None:
    """Each worker, once the app is loaded: log lines as JSON at INFO, the production setting
    (the examples' ``production_logging()``; taskflow writes a line only for a failed node)."""
    import sys

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="INFO", serialize=True)


def post_fork(server: object, worker: object) -> None:
    """Where to create a pool a fork would break, if you preload (see the docstring).

    The examples need nothing here: their ``ThreadPool`` and ``PoolMonitor`` are repaired in
    each worker, preloaded or not.
    """
