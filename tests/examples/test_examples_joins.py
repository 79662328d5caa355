"""examples/notifications.py and examples/risk_switch.py run and show what they claim to show."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest
from conftest import LONG

from taskflow import ResultState

ROOT = Path(__file__).resolve().parents[2]


@cache
def example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` once (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_joins_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["notifications", "risk_switch"])
def test_example_runs_as_a_script(name: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=env, check=False)

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.strip()


# -- notifications: Conductor's fork/join with join_on excluding HTTP ---------------------------


def test_notifications_joins_email_and_sms_only(capsys: pytest.CaptureFixture[str]) -> None:
    result = example("notifications").main(order="o-9", user="u-1")

    assert result.ok
    joined = result.outputs["notification_join"]
    assert list(joined.results) == ["email_notification", "sms_notification"]
    assert joined.complete and joined.failed == {} and joined.missing == []
    assert joined.results["sms_notification"]["message_id"] == "sms-u-1"
    assert result.outputs["record_notifications"] == {
        "delivered": ["email_notification", "sms_notification"], "failed": [], "complete": True}
    assert result.outputs["http_notification"]["status"] == 202, "the webhook still ran"
    assert result.outputs["my_fork_join"] is None
    assert "record_notifications" in capsys.readouterr().out


def test_notifications_next_step_does_not_wait_for_the_webhook(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    module = example("notifications")
    recorded = threading.Event()
    webhook: dict[str, bool] = {}

    def slow_webhook(payload):
        # holds the HTTP branch until the step after the join has run: if the join waited for
        # HTTP this would only return after LONG and the flag below would be False
        webhook["next_step_ran_first"] = recorded.wait(LONG)
        return {"channel": "http", "status": 202, "to": payload["to"]}

    monkeypatch.setattr(module, "call_webhook", slow_webhook)
    monkeypatch.setattr(module, "store_summary", lambda summary: recorded.set())
    try:
        result = module.main()
    finally:
        recorded.set()

    assert webhook == {"next_step_ran_first": True}
    wr = {n: result.result_of(n) for n in ("record_notifications", "http_notification")}
    assert wr["record_notifications"].finished_at <= wr["http_notification"].finished_at
    assert wr["http_notification"].state is ResultState.SUCCESS, "start waited for the branch"


def test_notifications_failed_sms_fails_the_join_and_the_next_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    module = example("notifications")

    def down(payload):
        raise ConnectionError("sms gateway down")

    monkeypatch.setattr(module, "send_sms", down)
    with pytest.raises(ConnectionError, match="sms gateway down"):
        module.main()


# -- risk_switch: a switch ----------------------------------------------------------------------

BRANCHES = ("charge", "queue_review", "reject_order")


@pytest.mark.parametrize("kwargs, ran, outcome, decision", [
    ({"amount": 120.0}, "charge", "charged", "approve"),
    ({"amount": 900.0}, "queue_review", "in_review", "manual_review"),
    ({"amount": 1900.0}, "reject_order", "rejected", "reject"),
    ({"amount": 120.0, "stock": 1}, "reject_order", "rejected", "reject"),
    ({"amount": 120.0, "risk_model": "v2-preview"}, "queue_review", "in_review", "escalate"),
], ids=["approve", "review", "reject", "out-of-stock", "unknown-decision-goes-to-review"])
def test_risk_switch_runs_exactly_one_branch(kwargs, ran, outcome, decision,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    result = example("risk_switch").main(**kwargs)

    assert result.ok
    states = result.states()
    for branch in BRANCHES:
        expected = ResultState.SUCCESS if branch == ran else ResultState.SKIPPED
        assert states[branch] is expected, branch
        if branch != ran:
            assert result.result_of(branch).attempts == 0, "an unchosen branch never runs"
    assert result.outputs["notify_customer"] == f"order o-7: {outcome}"
    assert result.outputs["route"] == decision
    assert result.outputs["audit"]["decision"] == decision, "the audit always runs"
    # charging waited for both checks
    route = result.result_of("route")
    for check in ("risk_check", "inventory_check"):
        assert route.started_at >= result.result_of(check).finished_at
    assert outcome in capsys.readouterr().out
