"""One ``os.register_at_fork`` for every object of the library that owns a lock or a thread.

A fork (``gunicorn --preload``, ``multiprocessing`` with the fork start method, a process pool
on Linux) copies the whole process into a child that has only the thread that forked. Every
lock another thread held at that moment stays locked for ever in the child, and every
background thread (a pool's workers, a monitor's sampling thread, the engine's timer and
coordinator) is simply absent there. So each such object registers here, once, when it is
created, and the child repairs it before any code of the child runs:

* ``register(obj)`` calls ``obj._after_fork_in_child()`` in the child (another method name
  with ``after_in_child=``). The method gives the object new locks and the state it should have
  in the child (empty queues, fresh counts, no threads; a thread the object needs is started
  there again, or on first use).
* ``register(obj, hold="_lock")`` also holds the lock in that attribute across the fork: the
  forking thread acquires it just before the fork and releases it just after, in the parent.
  The child's copy of the object's state is then never caught half-updated by another thread.
  Locks are taken in registration order and released in reverse; no registered object takes
  another's lock while it holds its own, so the order cannot deadlock.

Objects are held weakly: registering costs nothing once the object is gone. Module-level
singletons (the engine's timer and coordinator) stay registered as long as their module lives.
Hooks run in registration order; one that raises does not stop the others (the first error is
raised again once all have run, so Python reports it).
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["register"]

# object -> (the method the child calls, the attribute of the lock held across the fork)
_registered: weakref.WeakKeyDictionary[object, tuple[str, str | None]] = (
    weakref.WeakKeyDictionary()
)
# guards _registered against registrations from other threads while a fork snapshots it
_registry_lock = threading.Lock()
# (object, method, lock held or None) for the fork in progress; only the forking thread uses it
_forking: list[tuple[object, str, threading.Lock | None]] = []


def register(
    obj: object, *, after_in_child: str = "_after_fork_in_child", hold: str | None = None,
) -> None:
    """Have ``getattr(obj, after_in_child)()`` called in the child of every later fork.

    Args:
        obj: Any hashable, weakly referenceable object; it stays registered while it lives.
        after_in_child: The name of the method to call in the child (no arguments).
        hold: The name of an attribute holding a ``threading.Lock`` (or ``RLock``) of ``obj``
            to hold across the fork. The child's hook must replace that lock: the child's
            copy is still held by the thread that forked.

    Raises:
        TypeError: ``obj`` has no such method.
    """
    if not callable(getattr(obj, after_in_child, None)):
        raise TypeError(f"{type(obj).__name__!r} has no method {after_in_child!r} to call after fork")
    with _registry_lock:
        _registered[obj] = (after_in_child, hold)


def _before_fork() -> None:
    _registry_lock.acquire()  # released on both sides of the fork
    forking: list[tuple[object, str, threading.Lock | None]] = []
    for obj, (method, hold) in list(_registered.items()):
        lock: threading.Lock | None = getattr(obj, hold) if hold is not None else None
        if lock is not None:
            lock.acquire()
        forking.append((obj, method, lock))
    _forking[:] = forking


def _after_fork_in_parent() -> None:
    for _, _, lock in reversed(_forking):
        if lock is not None:
            lock.release()
    _forking.clear()
    _registry_lock.release()


def _after_fork_in_child() -> None:
    # the child has one thread, this one: nothing else can touch the registered objects
    first: BaseException | None = None
    for obj, method, _ in _forking:
        try:
            getattr(obj, method)()
        except BaseException as exc:  # noqa: BLE001 - the other objects must be repaired too
            first = first or exc
    _forking.clear()
    _registry_lock.release()  # a plain Lock has no owner: the child's copy is released here
    if first is not None:
        raise first


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
