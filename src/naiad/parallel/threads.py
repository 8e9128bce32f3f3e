"""A helper thread for splitting one vectorized step across cores: column work in the shuffle buffer,
and a resume's planning of its later reads while its first ones run (``start_beside``).

NumPy releases the GIL inside fancy indexing, so gathering and scattering some of a batch's
columns on a second thread while the calling thread does the rest (and draws the next exchange)
takes about half the time on two cores (``run_beside``). The work is the same whoever does it
and the random draws stay in the calling thread, so results and their order do not change.

Also how many cores a step may spread over (``usable_cores``, ``thread_cores``), and
:class:`DaemonThreads`, the executor of the threads that run user code (a decode) and so must
never hold the interpreter's exit.

NOTE [ Daemon threads ]
``concurrent.futures.ThreadPoolExecutor`` joins every one of its threads at interpreter exit, with
no bound (it registers that join with threading's exit hooks). A decoder stuck for good on one
hostile file then keeps the training process alive after the loader's timeout error has been
raised and the script has ended. The threads that run such code (the decode threads,
media/rows.py; a stream's decode stage, parallel/ahead.py) are therefore :class:`DaemonThreads`:

* daemon threads, so exit never waits on them without a bound;
* at exit, every live executor is shut down, its queued calls dropped, and its threads joined
  for ``EXIT_JOIN_S`` in all: a thread still inside native code while the interpreter and its
  libraries are torn down can abort the process (PyArrow's pools did: ``_join_threads_at_exit``
  in thread_backend.py), so a busy thread gets that long to finish its call; one still busy
  then is stuck, and left;
* ``shutdown()`` takes no new calls, lets the calls already queued run (a ``None`` queued after
  them ends each thread in turn) and waits for none of them unless asked, with a bound: a
  thread cannot be interrupted, so an owner that gave up on a call leaves its thread behind,
  a daemon, rather than wait for it;
* after a fork the child holds the object but none of its threads: owners make a new one there.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from naiad.process_state import per_process

__all__ = ["DaemonThreads", "one_core_each", "run_beside", "start_beside", "thread_cores", "usable_cores"]

T = TypeVar("T")

EXIT_JOIN_S = 2.0
"""How long interpreter exit waits, in all, for the :class:`DaemonThreads` still running a call
(NOTE [ Daemon threads ]): a batch's decode takes milliseconds to a few hundred; past this the
call is stuck, and its thread is left."""


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


# One helper thread per process; a forked child inherits the executor but not its thread, so it
# makes its own (NOTE [ Per-process state ]).
_helper = per_process(
    "naiad.parallel.threads helper",
    lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="naiad-columns"),
)


def run_beside(here: Callable[[], T], there: Callable[[], Any]) -> tuple[T, Any]:
    """``(here(), there())`` with ``there`` on the helper thread while ``here`` runs in this one.

    On a single core both run here, ``there`` first. An exception from either is raised here,
    after both have finished.
    """
    if (os.cpu_count() or 1) < 2:
        second = there()
        return here(), second
    future = _helper.get().submit(there)
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
    return _helper.get().submit(work).result


_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class DaemonThreads:
    """A small executor of daemon threads that never hold the interpreter's exit (NOTE [ Daemon
    threads ]): up to ``size`` threads, started as calls need them, each running ``initializer``
    first; calls start in the order submitted.

    Example:
        >>> pool = DaemonThreads(2, name="naiad-example")
        >>> pool.submit(pow, 2, 10).result()
        1024
        >>> pool.shutdown()
    """

    def __init__(self, size: int, *, name: str, initializer: Callable[[], None] | None = None) -> None:
        self.size = max(1, int(size))
        self.name = name
        self._initializer = initializer
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one release per thread waiting for a call
        # Reentrant: the cyclic collector may run a finalizer that shuts this pool down in the
        # thread that is submitting to it (the call queued before the None still runs).
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        _LIVE.add(self)

    @property
    def closed(self) -> bool:
        """Whether it was shut down (by its owner, or at exit): it takes no more calls."""
        return self._closed

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a thread; its result or exception in the returned future.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot take a call after shutdown()")
            self._queue.put((future, fn, args))
            # A thread waiting for a call takes this one; else start one, up to the size.
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.size:
                thread = threading.Thread(target=self._run, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _run(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while True:
            # Unbounded: an idle thread waits for its next call; shutdown() (also at exit)
            # queues the None that ends it.
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # for the next thread
                return
            future, fn, args = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                    future.set_exception(exc)
            del future, fn, args  # nothing of a finished call outlives it here
            self._idle.release()

    def shutdown(self, wait_s: float = 0.0) -> None:
        """Take no more calls; the queued ones still run, then the threads end. Waits up to
        ``wait_s`` seconds in all for them (0: not at all); a thread still busy then is left."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        self._join(time.monotonic() + wait_s)

    def _join(self, deadline: float) -> None:
        me = threading.current_thread()
        for thread in list(self._threads):
            if thread is not me and thread.is_alive() and time.monotonic() < deadline:
                thread.join(max(0.0, deadline - time.monotonic()))


_LIVE: weakref.WeakSet[DaemonThreads] = weakref.WeakSet()


@atexit.register
def _shutdown_at_exit() -> None:
    """Every live :class:`DaemonThreads` shut down, its queued calls dropped (cancelled), and the
    exit waits ``EXIT_JOIN_S`` in all for the threads to end (NOTE [ Daemon threads ]): idle
    ones end at once, busy ones when their call returns; one still busy then is stuck, and left."""
    deadline = time.monotonic() + EXIT_JOIN_S
    for pool in list(_LIVE):
        # No lock here: in a forked child that exits through Python, another thread may have
        # held it at the fork. Its threads are not alive there, and nothing is queued.
        if not any(t.is_alive() for t in list(pool._threads)):
            continue
        pool._closed = True
        while True:
            try:
                item = pool._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        pool._queue.put(None)
        pool._join(deadline)
