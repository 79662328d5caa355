"""The streamed product page of an example app, for a real gunicorn started by a test.

``TASKFLOW_PAGE_APP`` names the example (``flask`` or ``django``); the backend calls named in
``TASKFLOW_PAGE_GATED`` (comma-separated) wait until a file of that name exists in the folder
``TASKFLOW_PAGE_GATES``, or until their run is cancelled: then they write ``<name>.cancelled``
there. The test process, not the clock, orders the server's work. The budget is long for the
same reason. gunicorn imports this module (``gated_page_server:app``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KIND = os.environ["TASKFLOW_PAGE_APP"]
GATES = Path(os.environ["TASKFLOW_PAGE_GATES"])
GATED = set(filter(None, os.environ.get("TASKFLOW_PAGE_GATED", "").split(",")))


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Django resolves its URLs and middleware by module name
    spec.loader.exec_module(module)
    return module


example = _load(f"{KIND}_page_example", EXAMPLES / f"{KIND}_app.py")
real_backend = example.backend


def gated_backend(ctx: Any, call: str, seconds: float) -> None:
    if call not in GATED:
        return real_backend(ctx, call, seconds)
    ctx.on_cancel(lambda: (GATES / f"{call}.cancelled").touch())
    (GATES / f"{call}.entered").touch()
    while not (GATES / call).exists():
        if ctx.cancelled:
            return None
        time.sleep(0.005)
    return None


example.backend = gated_backend
example.STREAM_BUDGET = 60.0
app = example.app if KIND == "flask" else example.application
