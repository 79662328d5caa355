"""Seed 002's exercise: check 100 files in parallel and publish them only if the fan-in allows it.

One ``FanOutNode`` (``check_files``) checks every file of the listing, at most 8 at a time, each
within ``ITEM_TIMEOUT``, the whole fan-out within ``DEADLINE``; ``publish`` runs after it. Every
file has a stable id (its name), so the fan-in counts files, not messages. What goes wrong:

* ``file-099``'s storage read hangs: after ``ITEM_TIMEOUT`` it is *failed* (``ItemTimeoutError``)
  and another item loop takes its place, so the other files keep 8 checks in flight;
* ``file-100`` comes on the listing's last page, which arrives late: its check is still running at
  the deadline, so it is *missing*; its result arrives after the fan-in and changes nothing;
* the queue delivers ``file-050`` twice (at-least-once delivery): it is checked once and counted in
  ``duplicates``, never twice towards the quorum.

With ``policy="all"`` the fan-out ends TIMEOUT at the deadline and ``publish`` fails fast: nothing
is published. With a 95 % quorum, 98 of 100 files passed: ``publish`` runs, publishes the 98 and
holds the failed and missing ones for reconciliation. Under the quorum, publication is still
blocked by more than 5 files failed or missing, by a listing that fails or is not read to its end
by the deadline (the set of files is then unknown: 95 % of what?), and by the flow's budget
running out.

Run it with ``python examples/fanout_files.py`` (about 1 s).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import (
    FanInResult,
    FanOutNode,
    FlowResult,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
)

FILES = [f"file-{i:03d}" for i in range(1, 101)]
MAX_CONCURRENCY = 8
ITEM_TIMEOUT = 0.25  # seconds one file's check may take
DEADLINE = 0.4  # seconds the whole fan-out may take (the node's timeout)
BUDGET = 5.0  # seconds the whole flow may take
# the listing's last page (file-100) arrives this late: before the deadline, but so late that
# file-100's check (which takes longer than ITEM_TIMEOUT) is still within it at the deadline
LAST_PAGE_DELAY = 0.2


class Storage:
    """A stand-in for the file store and the queue that lists its files."""

    def __init__(self) -> None:
        self.stuck = threading.Event()  # file-099's read hangs until this is set
        self.slow = threading.Event()  # file-100's check finishes when this is set
        self.returned = {"file-099": threading.Event(), "file-100": threading.Event()}
        self.checked_050 = threading.Event()
        self.checks: Counter[str] = Counter()
        self.lock = threading.Lock()

    def listing(self) -> Iterator[tuple[str, str]]:
        """``(file id, path)`` pairs, read lazily page by page, with one redelivery."""
        for name in FILES[:99]:
            yield name, f"/data/{name}"
            if name == "file-060":  # the queue redelivers file-050 after it was checked
                self.checked_050.wait(BUDGET)
                yield "file-050", "/data/file-050"
        time.sleep(LAST_PAGE_DELAY)  # stands in for a slow listing page
        yield "file-100", "/data/file-100"

    def check(self, path: str) -> str:
        name = path.rsplit("/", 1)[1]
        with self.lock:
            self.checks[name] += 1
        time.sleep(0.002)  # stands in for reading and validating the file
        if name == "file-099":
            self.stuck.wait(BUDGET)
            self.returned[name].set()
        elif name == "file-100":
            self.slow.wait(BUDGET)
            self.returned[name].set()
        elif name == "file-050":
            self.checked_050.set()
        return f"crc32:{zlib.crc32(name.encode()):08x}"

    def release(self) -> None:
        """Let the stuck and the slow checks finish (after the flow) and wait for them."""
        self.stuck.set()
        self.slow.set()
        for event in self.returned.values():
            event.wait(BUDGET)


class CheckFiles(FanOutNode[Storage]):
    """Check every file of the listing; the fan-in is keyed by file name."""

    def items(self, ctx: TaskContext, storage: Storage) -> Iterator[tuple[str, str]]:
        return storage.listing()

    def work(self, ctx: TaskContext, path: str) -> str:
        return self.param.check(path)


class Publish(SchedulingNode[None, dict[str, Any]]):
    """Publish the files that passed; hold the failed and missing ones for reconciliation."""

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        fan_in: FanInResult = ctx.result_of("check_files")
        return {
            "published": sorted(fan_in.succeeded),
            "held": {**{k: "failed" for k in fan_in.failed}, **{k: "missing" for k in fan_in.missing}},
        }


def run(policy: str | float, storage: Storage, executor: ThreadPoolExecutor) -> FlowResult:
    check = CheckFiles(storage, name="check_files", max_concurrency=MAX_CONCURRENCY,
                       item_timeout=ITEM_TIMEOUT, timeout=DEADLINE, policy=policy)
    check >> Publish(name="publish")
    return TaskScheduling.start(check, executor=executor, timeout=BUDGET)


def fan_in_of(result: FlowResult) -> FanInResult:
    """The fan-in of ``check_files`` (its result in every outcome: SUCCESS, EXCEPTION, TIMEOUT)."""
    fan_in = result["check_files"].work_result.result
    assert isinstance(fan_in, FanInResult)
    return fan_in


def summarize(policy: str | float, result: FlowResult, storage: Storage) -> None:
    label = "'all' (every file must pass)" if policy == "all" else f"{policy:g} (quorum)"
    wr = result["check_files"].work_result
    fan_in = fan_in_of(result)
    took = (wr.finished_at or 0.0) - (wr.started_at or 0.0)
    print(f"policy {label}:")
    print(f"  check_files  {wr.state.name} after {took:.2f} s: {len(fan_in.succeeded)} passed, "
          f"{len(fan_in.failed)} failed, {len(fan_in.missing)} missing, "
          f"{fan_in.duplicates} duplicate delivery ignored, complete={fan_in.complete}")
    for name, exc in fan_in.failed.items():
        print(f"    failed   {name}: {type(exc).__name__}: {exc}")
    for name in fan_in.missing:
        print(f"    missing  {name} (still being checked at the deadline)")
    print(f"    file-050 checked {storage.checks['file-050']} time(s), delivered twice")
    pub = result["publish"].work_result
    if pub.state.name == "SUCCESS" and pub.result is not None:
        held = ", ".join(f"{k} ({v})" for k, v in sorted(pub.result["held"].items()))
        print(f"  publish      SUCCESS: published {len(pub.result['published'])} files; "
              f"held for reconciliation: {held or 'none'}")
    else:
        print(f"  publish      {pub.state.name}: nothing published "
              f"({type(pub.exception).__name__})")


def main() -> FlowResult:
    """Run the exercise with ``policy="all"``, then with a 95 % quorum; return the latter."""
    result: FlowResult | None = None
    for policy in ("all", 0.95):
        storage = Storage()
        with ThreadPoolExecutor(MAX_CONCURRENCY + 2, thread_name_prefix="files") as pool:
            try:
                result = run(policy, storage, pool)
                summarize(policy, result, storage)
                fan_in = fan_in_of(result)
                before = (dict(fan_in.succeeded), dict(fan_in.failed), list(fan_in.missing))
            finally:
                storage.release()  # the late results arrive now, after the fan-in
        unchanged = before == (fan_in.succeeded, fan_in.failed, fan_in.missing)
        print(f"  late results of file-099 and file-100 arrived after the fan-in: "
              f"{'dropped, fan-in unchanged' if unchanged else 'CHANGED THE FAN-IN (bug)'}\n")
    print("Under the 95 % quorum publication is still blocked by: more than 5 files failed or "
          "missing,\na listing that fails or is not read to its end by the deadline (95 % of "
          "what?),\nand the flow's budget running out.")
    assert result is not None
    return result


if __name__ == "__main__":
    main()
