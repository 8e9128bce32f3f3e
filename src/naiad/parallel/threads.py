"""A helper thread for splitting one vectorized step across cores: column work in the shuffle buffer,
and a resume's planning of its later reads while its first ones run (``start_beside``).

NumPy releases the GIL inside fancy indexing, so gathering and scattering some of a batch's
columns on a second thread while the calling thread does the rest (and draws the next exchange)
takes about half the time on two cores (``run_beside``). The work is the same whoever does it
and the random draws stay in the calling thread, so results and their order do not change.

Also how many cores a step may spread over (``usable_cores``, ``thread_cores``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["one_core_each", "run_beside", "start_beside", "thread_cores", "usable_cores"]

T = TypeVar("T")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


_local = threading.local()


def thread_cores() -> int:
    """The cores a step running in this thread may spread its work over: every usable one,
    or one in a thread that already shares them with its siblings (:func:`one_core_each`)."""
    return int(getattr(_local, "cores", 0)) or usable_cores()


def one_core_each() -> None:
    """Mark this thread as one of a pool that already uses every core (a pool's initializer):
    what it runs then splits no further (threads inside threads only fight over the cores)."""
    _local.cores = 1


_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_pid = -1


def _helper() -> ThreadPoolExecutor:
    global _executor, _executor_pid
    with _lock:
        # A forked child inherits the object but not its thread: make a new one there.
        if _executor is None or _executor_pid != os.getpid():
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="naiad-columns")
            _executor_pid = os.getpid()
        return _executor


def run_beside(here: Callable[[], T], there: Callable[[], Any]) -> tuple[T, Any]:
    """``(here(), there())`` with ``there`` on the helper thread while ``here`` runs in this one.

    On a single core both run here, ``there`` first. An exception from either is raised here,
    after both have finished.
    """
    if (os.cpu_count() or 1) < 2:
        second = there()
        return here(), second
    future = _helper().submit(there)
    try:
        first = here()
    finally:
        second = future.result()  # wait even on an error: the helper writes the same arrays
    return first, second


def start_beside(work: Callable[[], T]) -> Callable[[], T]:
    """Start ``work()`` on the helper thread; returns the function that waits for its result (and
    raises its exception). On a single core ``work`` runs when that function is first called."""
    if (os.cpu_count() or 1) < 2:
        done: list[T] = []

        def later() -> T:
            if not done:
                done.append(work())
            return done[0]

        return later
    return _helper().submit(work).result
