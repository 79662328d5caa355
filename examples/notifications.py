"""Conductor's FORK_JOIN example: email, SMS and HTTP notifications in parallel.

The Conductor workflow::

    {"type": "FORK_JOIN", "taskReferenceName": "my_fork_join_ref", "forkTasks": [
        [process_notification_payload_email, email_notification_ref],
        [process_notification_payload_sms,   sms_notification_ref],
        [process_notification_payload_http,  http_notification_ref]]},
    {"type": "JOIN", "taskReferenceName": "notification_join_ref",
     "joinOn": ["email_notification_ref", "sms_notification_ref"]}

becomes one ``fork_join`` call. Each branch is a serial chain (build the payload, then send it);
the three branches run in parallel; the join waits only for email and SMS, so the workflow's
next step (``record_notifications``) runs as soon as those two are sent. The HTTP webhook is the
"best effort" channel left out of ``join_on``: it keeps running without blocking the next step,
and ``TaskScheduling.start`` returns once it has finished too (a run is over when every node is).

The join's result is a ``JoinOutput`` keyed by node name, like Conductor's join output keyed by
task reference name, plus what failed and what is missing. Run it with
``python examples/notifications.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from taskflow import (
    FlowResult,
    JoinNode,
    JoinOutput,
    SchedulingNode,
    TaskContext,
    TaskScheduling,
    fork_join,
)

# -- the providers (module functions, so a test can stand in for them) ---------------------------


def send_email(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.020)  # the mail provider's API
    return {"channel": "email", "message_id": f"em-{payload['user']}", "to": payload["to"]}


def send_sms(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.030)  # the SMS gateway
    return {"channel": "sms", "message_id": f"sms-{payload['user']}", "to": payload["to"]}


def call_webhook(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.150)  # a partner's slow, unreliable endpoint
    return {"channel": "http", "status": 202, "to": payload["to"]}


def store_summary(summary: dict[str, Any]) -> None:
    """Where the workflow's next step writes what was delivered (a database in real life)."""


def deliver(channel: str, payload: dict[str, Any]) -> dict[str, Any]:
    if channel == "email":
        return send_email(payload)
    if channel == "sms":
        return send_sms(payload)
    return call_webhook(payload)


ADDRESSES = {"email": "ada@example.com", "sms": "+44 20 7946 0000", "http": "https://partner.example/hook"}


# -- the tasks ----------------------------------------------------------------------------------


class ProcessNotificationPayload(SchedulingNode[str, dict[str, Any]]):
    """Build one channel's payload from the event in the context (param: the channel)."""

    def task(self, ctx: TaskContext, param: str) -> dict[str, Any]:
        event = ctx["event"]
        return {"user": event["user"], "to": ADDRESSES[param],
                "text": f"Your order {event['order']} has shipped"}


class SendNotification(SchedulingNode[str, dict[str, Any]]):
    """Send the payload built by the branch's first node (param: the channel)."""

    def task(self, ctx: TaskContext, param: str) -> dict[str, Any]:
        return deliver(param, ctx.result_of(f"process_notification_payload_{param}"))


class RecordNotifications(SchedulingNode[None, dict[str, Any]]):
    """The workflow's next step: record what the join saw."""

    def task(self, ctx: TaskContext, param: None) -> dict[str, Any]:
        joined: JoinOutput = ctx.result_of("notification_join")
        summary = {"delivered": sorted(joined.results), "failed": sorted(joined.failed),
                   "complete": joined.complete}
        store_summary(summary)
        return summary


def build() -> SchedulingNode[Any, Any]:
    """The workflow: the fork/join and the step after the join; returns the node to start."""
    branches = [
        [ProcessNotificationPayload(channel, name=f"process_notification_payload_{channel}"),
         SendNotification(channel, name=f"{channel}_notification")]
        for channel in ("email", "sms", "http")
    ]
    fork = fork_join(branches, join=JoinNode(name="notification_join"),
                     join_on=["email_notification", "sms_notification"], fork_name="my_fork_join")
    fork.join_node >> RecordNotifications(name="record_notifications")
    return fork


WORKFLOW = build()


def main(order: str = "o-1001", user: str = "u-42") -> FlowResult:
    """Notify one user that their order shipped; print when each step finished."""
    ctx = TaskContext(event={"order": order, "user": user})
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="notify") as pool:
        result = TaskScheduling.start(WORKFLOW, executor=pool, timeout=2.0, context=ctx)
    result.raise_for_failure()
    t0 = result.started_at
    print(f"order {order}: notifications sent in {result.elapsed * 1000:.0f} ms")
    for name in ("email_notification", "sms_notification", "notification_join",
                 "record_notifications", "http_notification"):
        wr = result.result_of(name)
        assert wr.finished_at is not None
        print(f"  {name:<22} done at {(wr.finished_at - t0) * 1000:5.0f} ms")
    print(f"  next step recorded {result.outputs['record_notifications']}; the webhook, left out "
          "of join_on, did not hold it up")
    return result


if __name__ == "__main__":
    main()
