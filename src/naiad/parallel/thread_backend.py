"""Thread workers behind a WorkerPool: the same protocol as the process backend (NOTE [ Worker
protocol ] in :mod:`naiad.parallel.protocol`), in the training process, for sources whose reads
release the GIL (PyArrow's parsers and decoders, NumPy's copies)."""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from naiad.parallel.backend import JOIN_TIMEOUT_S
from naiad.parallel.context import WorkerContext
from naiad.parallel.protocol import STOP, Message, Reply, Task, TaskKey
from naiad.parallel.worker_side import WorkerSpec, serve

__all__ = ["ThreadBackend"]

_LOG = logging.getLogger("naiad.workers")


class ThreadBackend:
    """Worker threads sharing one result queue; workers start and stop by id."""

    def __init__(self, spec: WorkerSpec) -> None:
        self._spec = spec
        self.results: queue.Queue[Message] = queue.Queue()
        self.task_queues: list[queue.Queue[Task | None]] = []
        self.threads: list[threading.Thread] = []
        self.dead: set[int] = set()
        self.stopping: set[int] = set()
        self._finalizer = weakref.finalize(self, _shutdown_threads, self.threads, self.task_queues)
        _LIVE_THREAD_BACKENDS.add(self)

    def start(self, w: int, num_workers: int) -> None:
        """Start worker ``w`` (a stopped worker of that id finishes on its own queue)."""
        tasks: queue.Queue[Task | None] = queue.Queue()
        # The thread holds what it needs, not the backend: a pool dropped without close() is
        # collected, and its finalizer stops the threads.
        t = threading.Thread(
            target=_thread_worker_main,
            args=(self._spec, self._spec.context(w, num_workers, "thread"), tasks, self.results),
            name=f"naiad-worker-{w}",
            daemon=True,
        )
        t.start()
        if w < len(self.threads):
            self.threads[w], self.task_queues[w] = t, tasks
        else:
            self.threads.append(t)
            self.task_queues.append(tasks)
        self.dead.discard(w)
        self.stopping.discard(w)

    def stop(self, w: int) -> None:
        """Ask worker ``w`` to return once its queued tasks are done."""
        self.stopping.add(w)
        self.task_queues[w].put(STOP)

    def submit(self, worker_id: int, seq: int, payload: Any, key: TaskKey) -> None:
        """Queue a task; ``key`` is (pass id, epoch) or (pass id, epoch, the task's seed keys)."""
        self.task_queues[worker_id].put((seq, payload, key))

    def poll(self, timeout_s: float) -> list[Message]:
        """The workers' messages, waiting up to ``timeout_s`` for the first."""
        try:
            out = [self.results.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out

    def pid(self, worker_id: int) -> int | None:
        """The training process's id: thread workers run in it."""
        return os.getpid()

    def running(self, worker_id: int) -> int | None:
        """None: a thread worker is sent no bundles, so the first task it owes is the one it runs."""
        return None

    def exitcode(self, worker_id: int) -> int | None:
        """Thread workers have no exit code."""
        return None

    def handles(self) -> list[Any]:
        """The workers' ``threading.Thread`` objects (``join``, ``is_alive``)."""
        return list(self.threads)

    def close(self) -> None:
        """Stop the workers: ask, then wait a bounded time (a thread cannot be killed)."""
        self._finalizer()


def _thread_worker_main(spec: WorkerSpec, context: WorkerContext, tasks: queue.Queue[Task | None],
                        results: queue.Queue[Message]) -> None:
    w = context.worker_id

    def send(reply: Reply) -> bool:
        results.put((w, *reply))
        return True

    # Only worker_rng() follows the pass here: the global generators belong to every thread
    # of the process, the training loop's included (NOTE [ Worker randomness ]).
    serve(spec, context, _queued_tasks(tasks), send, reseed=False)


def _queued_tasks(tasks: queue.Queue[Task | None]) -> Iterator[Task]:
    # Unbounded: an idle worker waits for its next task; every way a pool ends (close(),
    # its collection, interpreter exit) puts the STOP that ends this loop.
    while (task := tasks.get()) is not STOP:
        yield task


_LIVE_THREAD_BACKENDS: weakref.WeakSet[ThreadBackend] = weakref.WeakSet()


EXIT_JOIN_S = 10.0


@atexit.register
def _join_threads_at_exit() -> None:
    """Let worker threads finish the task they are in before the interpreter goes. They are
    daemons, so exit does not wait for them, and one still inside PyArrow when PyArrow's own
    thread pools are torn down aborts the whole process ("terminate called without an active
    exception"): drop their queued tasks, ask them to stop, wait a bounded time."""
    deadline = time.monotonic() + EXIT_JOIN_S
    threads: list[threading.Thread] = []
    for backend in list(_LIVE_THREAD_BACKENDS):
        for tq in backend.task_queues:
            try:
                while True:
                    tq.get_nowait()
            except queue.Empty:
                pass
            tq.put(STOP)
        threads += [t for t in backend.threads if t.is_alive()]
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))


def _shutdown_threads(threads: list[threading.Thread], task_queues: list[queue.Queue[Task | None]]) -> None:
    running = [t for t in threads if t.is_alive()]
    for tq in task_queues:
        tq.put(STOP)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    me = threading.current_thread()
    for t in running:
        if t is me:
            # The loader was collected in one of its own workers (the cyclic collector runs in
            # whichever thread allocates): that thread leaves at its next task, the STOP above.
            continue
        # A thread stuck in user code cannot be killed; it is a daemon and dies with the process.
        t.join(timeout=max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            _LOG.info("%s (a thread) still runs after teardown's %.1f s: left to end with the process "
                      "(a thread cannot be killed)", t.name, JOIN_TIMEOUT_S)
        else:
            _LOG.debug("%s (a thread) returned at teardown", t.name)
