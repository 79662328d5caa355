"""Start-up cost of the JavaScript engine behind Conductor INLINE/LAMBDA tasks (mini-racer).

Run: ``PYTHONPATH=. python benchmarks/conductor_js.py``. Prints the one-off import cost, the
first evaluation (V8 initialisation), and the per-evaluation cost (a fresh isolate each time,
as taskflow runs every script), beside a plain Python call as the baseline of the same run.
"""

from __future__ import annotations

import statistics
import time


def main(n: int = 200) -> None:
    t0 = time.perf_counter()
    import py_mini_racer  # noqa: F401

    t1 = time.perf_counter()
    from taskflow.declare.conductor.boundaries import Limits
    from taskflow.declare.conductor.tasks.javascript import evaluate

    limits = Limits()
    t2 = time.perf_counter()
    evaluate("bench", "$.a + 1", {"a": 1}, limits)
    t3 = time.perf_counter()
    per: list[float] = []
    for _ in range(n):
        s = time.perf_counter()
        evaluate("bench", "$.a + 1", {"a": 1}, limits)
        per.append(time.perf_counter() - s)
    def plus_one(d: dict[str, int]) -> int:
        return d["a"] + 1

    base: list[float] = []
    for _ in range(n):
        s = time.perf_counter()
        plus_one({"a": 1})
        base.append(time.perf_counter() - s)
    print(f"import py_mini_racer:           {(t1 - t0) * 1e3:7.1f} ms (once per process)")
    print(f"first evaluation (V8 init):     {(t3 - t2) * 1e3:7.1f} ms (once per process)")
    print(f"evaluation, fresh isolate:      {statistics.median(per) * 1e3:7.2f} ms median, "
          f"p90 {statistics.quantiles(per, n=10)[-1] * 1e3:.2f} ms (n={n})")
    print(f"baseline python call:           {statistics.median(base) * 1e6:7.2f} us median")


if __name__ == "__main__":
    main()
