"""A helper thread that holds a pool's lock while a test makes calls that must not wait for it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conftest import LONG


@contextmanager
def lock_held_elsewhere(pool: Any, patience: float) -> Iterator[None]:
    """Run the body while another thread holds ``pool._lock``; fail if the body waited for it.

    The holder lets go after ``patience`` seconds at most, so a body that waits for the lock
    makes the test fail instead of hang.
    """
    held, release = threading.Event(), threading.Event()
    gave_up: list[bool] = []

    def hold() -> None:
        with pool._lock:
            held.set()
            if not release.wait(patience):
                gave_up.append(True)

    holder = threading.Thread(target=hold, name="taskflow-test-lock-holder")
    holder.start()
    assert held.wait(LONG)
    try:
        yield
    finally:
        release.set()
        holder.join(LONG)
    assert not gave_up, "the call waited for the pool's lock held by another thread"
