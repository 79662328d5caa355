"""gunicorn's configuration for ``test_now_gunicorn.py``: the guide's recipe, with the dump
written to the file ``TASKFLOW_DUMP_FILE`` names (instead of the worker's standard error)."""

from __future__ import annotations

import os
import signal
from typing import Any

import taskflow.observe

worker_class = "gthread"
workers = 1
threads = 8


def post_worker_init(worker: Any) -> None:
    dump = open(os.environ["TASKFLOW_DUMP_FILE"], "a")  # kept open: the handler writes to it
    taskflow.observe.dump_on_signal(signal.SIGPROF, file=dump)
