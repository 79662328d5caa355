"""What ``conductor.load`` costs when a SUB_WORKFLOW's name is an expression: every definition of
``workflows=`` is a candidate and is compiled at load.

    PYTHONPATH=. python benchmarks/conductor_load.py

Loads Conductor's own ``workflow_with_sub_workflow_1_integration_test.json`` with one candidate,
then with all of the definitions in ``tests/conductor_fixtures/conductor-oss/test-harness``.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from taskflow.declare import conductor

HERE = pathlib.Path(__file__).resolve().parents[1]
OWN = HERE / "tests" / "conductor_fixtures" / "conductor-oss" / "test-harness"


class AnyTask(Mapping[str, Callable[[dict[str, Any]], Any]]):
    """A registry with a task for every name."""

    def __getitem__(self, name: str) -> Callable[[dict[str, Any]], Any]:
        return dict

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def main(rounds: int = 20) -> None:
    defs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(OWN.glob("*.json"))]
    top = json.loads((OWN / "workflow_with_sub_workflow_1_integration_test.json").read_text())
    one = [d for d in defs if d["name"] == "integration_test_wf"]
    for label, candidates in (("1 candidate", one), (f"{len(defs)} candidates", defs)):
        began = time.perf_counter()
        for _ in range(rounds):
            conductor.load(top, AnyTask(), workflows=candidates)
        print(f"{label:>14}: {(time.perf_counter() - began) / rounds * 1000:.1f} ms per load")


if __name__ == "__main__":
    from loguru import logger

    logger.remove()  # the candidates' field warnings
    main()
