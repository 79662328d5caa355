"""What a call made on this thread may take: the clamp both clients apply.

``for_call(cap)`` is asked by a client right before a request goes out (on the thread making
it). Inside an attempt of a run it answers the attempt's time left, at most ``cap`` (the
caller's own timeout), with the headers that carry it on, and notes the clamp in the run when
the deadline, not ``cap``, set it; elsewhere None, and the call is left as it is. It holds no
lock and keeps no state: the run's watch (``taskflow.engine.attempts``) records the clamp.
"""

from __future__ import annotations

from typing import NamedTuple

from taskflow.model.context import attempt_context, note_clamp
from taskflow.model.deadlines import deadline_headers_for

__all__ = ["Clamp", "for_call", "smaller"]


class Clamp(NamedTuple):
    """The limit of one call: at most ``seconds`` per phase, and the headers to send."""

    seconds: float
    headers: dict[str, str]


def for_call(cap: float | None) -> Clamp | None:
    """The clamp of a call made now on this thread (None: leave it as it is).

    Raises:
        BudgetExhaustedError: the attempt has no time left (do not send the request).
    """
    ctx = attempt_context()
    if ctx is None:
        return None
    seconds = ctx.timeout(cap if cap is not None and cap > 0 else None)
    if seconds is None:
        return None  # no deadline, no timeout of the caller's: nothing to pass on
    if cap is None or seconds < cap:
        note_clamp(ctx, seconds)
    return Clamp(seconds, deadline_headers_for(seconds))


def smaller(value: object, seconds: float) -> float:
    """``seconds``, or the caller's own timeout ``value`` when that is a smaller number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < seconds:
        return float(value)
    return seconds
