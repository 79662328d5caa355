"""Conductor's notification workflow, run in-process with ``taskflow.conductor``.

``notification_workflow.json`` beside this file is a plain Conductor definition: a FORK_JOIN with
three branches (build the payload, then send it by email, SMS or HTTP) and a JOIN whose
``joinOn`` lists only the email and SMS tasks, then a task that records what was delivered::

    my_fork_join_ref -> process_notification_payload_email -> email_notification_ref --\\
                     -> process_notification_payload_sms   -> sms_notification_ref   ---> notification_join_ref
                     -> process_notification_payload_http  -> http_notification_ref         -> record_notifications_ref

The HTTP channel is left out of ``joinOn``: the join and ``record_notifications_ref`` go on as
soon as email and SMS are sent, while the slow HTTP callback keeps running; the run ends when it
is done too. Here the Conductor workers are small Python functions in ``REGISTRY`` (task
``name`` -> ``fn(input) -> output``).

Run it with ``python examples/conductor_notifications.py``, or from the command line::

    python -m taskflow run examples/notification_workflow.json --import-file-dir \\
        --registry conductor_notifications --input '{"user": "ann", "message": "hi"}'
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from taskflow import FlowResult, conductor

DEFINITION = Path(__file__).with_name("notification_workflow.json")
HTTP_LATENCY = 0.05  # seconds the HTTP callback takes: the join does not wait for it

_ADDRESSES = {
    "email": "{user}@example.com",
    "sms": "+1-425-555-0189",
    "http": "https://hooks.example.com/notify/{user}",
}


# -- the workers: task name -> fn(input) -> output ---------------------------------------------


def process_notification_payload(task_input: dict[str, Any]) -> dict[str, Any]:
    channel = task_input["channel"]
    user = task_input["user"]
    return {
        "address": _ADDRESSES[channel].format(user=user),
        "body": f"Hello {user}: {task_input['message']}",
    }


def email_notification(task_input: dict[str, Any]) -> dict[str, Any]:
    return {"email_sent_to": task_input["to"], "email_sent_at": time.time()}


def sms_notification(task_input: dict[str, Any]) -> dict[str, Any]:
    return {"sms_sent_to": task_input["to"], "sms_sent_at": time.time()}


def http_notification(task_input: dict[str, Any]) -> dict[str, Any]:
    time.sleep(HTTP_LATENCY)  # a slow callback that the workflow does not wait for
    return {"status": 200, "url": task_input["url"]}


def record_notifications(task_input: dict[str, Any]) -> dict[str, Any]:
    return {"recorded": sorted(task_input["delivered"]), "user": task_input["user"]}


REGISTRY: dict[str, conductor.TaskFn] = {
    "process_notification_payload": process_notification_payload,
    "email_notification": email_notification,
    "sms_notification": sms_notification,
    "http_notification": http_notification,
    "record_notifications": record_notifications,
}


def main(
    executor: Executor | None = None,
    registry: Mapping[str, conductor.TaskFn] | None = None,
    workflow_input: Mapping[str, Any] | None = None,
) -> FlowResult:
    """Load the definition, run it once and print what happened; returns the FlowResult.

    Args:
        executor: the pool to run on (a 4-thread pool, shut down after the run, if None).
        registry: the workers (``REGISTRY`` if None); tests swap some of them.
        workflow_input: the workflow input (a default user and message if None).
    """
    workflow = conductor.load(DEFINITION, dict(registry or REGISTRY))
    given = {"user": "ann", "message": "your order has shipped"}
    workflow_input = dict(workflow_input or given)
    pool = executor or ThreadPoolExecutor(max_workers=4, thread_name_prefix="notify")
    try:
        result = workflow.start(workflow_input, executor=pool)
    finally:
        if executor is None:
            pool.shutdown(wait=True)
    print(f"workflow {workflow.name!r}: {workflow.status(result)} in {result.elapsed * 1000:.1f} ms")
    print("join output:", result.outputs.get("notification_join_ref"))
    print("workflow output:", workflow.output(result, workflow_input))
    print("\nflowchart of the run:\n")
    print(workflow.to_mermaid(result))
    return result


if __name__ == "__main__":
    main()
