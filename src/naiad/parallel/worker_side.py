"""What runs inside a worker, process or thread: its handler built from a :class:`WorkerSpec`,
then one reply per task until it is told to stop (NOTE [ Worker protocol ] in
:mod:`naiad.parallel.protocol`).

The process worker's own set-up (signals, the heap, torch's seeding, its pipe) is in
:mod:`naiad.parallel.backend`, the thread worker's queues in :mod:`naiad.parallel.thread_backend`;
both then :func:`serve`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from naiad.parallel.context import (
    WorkerContext,
    enter,
    seed_globals,
    take_stages,
    task_seed_sequence,
)
from naiad.parallel.protocol import (
    ERROR,
    EXHAUSTED,
    NO_TASK,
    OK,
    Exhausted,
    Kind,
    RemoteError,
    Reply,
    Task,
    TaskKey,
    task_entropy,
)

__all__ = ["Handler", "HandlerFactory", "InitFn", "PrepareFn", "WorkerSpec", "run_task", "serve", "worker_seed"]

Handler = Callable[[Any], Any]
"""Turns one task payload into one result, inside a worker."""

HandlerFactory = Callable[[WorkerContext], Handler]
"""Builds, inside a worker, the callable that turns one task payload into one result."""

InitFn = Callable[[int], None] | None
PrepareFn = Callable[[WorkerContext], None] | None


def worker_seed(base_seed: int, worker_id: int) -> int:
    """The per-worker seed a :class:`WorkerContext` reports (and that seeds a worker at start).

    torch's: ``base_seed + worker_id`` (what its ``get_worker_info().seed`` reports).
    """
    return base_seed + worker_id


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a pool is built from; it crosses into each process worker once, so
    its functions must pickle under spawn and forkserver.

    Attributes:
        factory: builds the handler inside the worker.
        worker_init_fn: called with the worker id before the factory (None: none).
        prepare: called with the :class:`WorkerContext` before ``worker_init_fn`` (None: none).
        base_seed: the pool's base seed (NOTE [ Worker randomness ]).
        rank: the distributed rank, a key of each worker's seed sequence.
    """

    factory: HandlerFactory
    worker_init_fn: InitFn = None
    prepare: PrepareFn = None
    base_seed: int = 0
    rank: int = 0

    def context(self, worker_id: int, num_workers: int, mode: str) -> WorkerContext:
        """What worker ``worker_id`` of ``num_workers`` knows about itself."""
        seed = worker_seed(self.base_seed, worker_id)
        return WorkerContext(worker_id, num_workers, seed, mode, self.base_seed, self.rank)

    def build(self, context: WorkerContext, *, init: bool = True) -> Handler:
        """Set the worker up and build its handler: ``prepare``, ``worker_init_fn`` (unless
        ``init`` is False), then the factory."""
        if self.prepare is not None:
            self.prepare(context)
        if init and self.worker_init_fn is not None:
            self.worker_init_fn(context.worker_id)
        return self.factory(context)


def run_task(handler: Handler, seq: int, payload: Any) -> Reply:
    """Run one task; the reply that answers it."""
    t0, c0 = time.perf_counter(), time.thread_time()
    take_stages()  # a failed task's leftovers are not this one's
    try:
        result = handler(payload)
    except Exhausted:
        return EXHAUSTED, seq, None, {}
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the consumer
        return ERROR, seq, RemoteError(exc), {}
    # Wall and CPU time: a thread's CPU time is what the read-ahead tuner weighs against the
    # rest of the process (NOTE [ Tuned read-ahead ]).
    stages = {"worker": time.perf_counter() - t0, "worker_cpu": time.thread_time() - c0}
    stages.update(take_stages())  # parts of the task the handler timed apart (report_stage)
    return OK, seq, result, stages


def enter_task(context: WorkerContext, key: TaskKey, current: TaskKey | None) -> bool:
    """Make the task's pass (or its own seed keys) the calling worker's, after a task of
    ``current``; whether its randomness starts fresh (NOTE [ Worker randomness ])."""
    entropy = task_entropy(key)
    if entropy is None and key == current:
        return False  # the same pass: its generators go on (whatever ran inside put them back)
    enter(context, key[1], fresh=True, entropy=entropy)
    return True


def _seed_globals_for(context: WorkerContext, key: TaskKey) -> None:
    entropy = task_entropy(key)
    seed_globals(task_seed_sequence(entropy) if entropy is not None else context.seed_sequence(key[1]))


def serve(
    spec: WorkerSpec, context: WorkerContext, tasks: Iterator[Task | list[Task]], send: Callable[[Reply], bool], *,
    reseed: bool, send_bundle: Callable[[list[Reply]], bool] | None = None,
    started: Callable[[int], None] | None = None,
) -> None:
    """A worker's life once its process or thread is set up: build the handler and say so,
    then answer each task of ``tasks`` until they end.

    Args:
        spec: what the handler is built from.
        context: the worker's own.
        tasks: the tasks sent to it, ending when it is told to stop (or its parent is gone);
            a list of tasks is a bundle (NOTE [ Task bundles ] in :mod:`naiad.parallel.passes`).
        send: sends a reply; False when nobody will read it (the main process is gone).
        send_bundle: sends a bundle's replies in one message (a worker sent bundles has it).
        started: told each task's sequence number as it begins (a process worker's, so that the
            training process knows which task of a bundle its death interrupted).
        reseed: reseed Python's, NumPy's and torch's global generators when a task's randomness
            starts fresh: process workers without a ``worker_init_fn`` (NOTE [ Worker
            randomness ]); threads share the generators with the training loop, so never there.
    """
    enter(context, None)
    try:
        handler = spec.build(context)
    except BaseException as exc:  # noqa: BLE001 - the pool raises it, noted "while starting"
        send((Kind.START_FAILED, NO_TASK, RemoteError(exc), {}))
        return
    if not send((Kind.READY, NO_TASK, None, {})):
        return
    current: TaskKey | None = None

    def answer(task: Task) -> Reply:
        nonlocal current
        seq, payload, key = task
        if enter_task(context, key, current) and reseed:
            _seed_globals_for(context, key)
        current = key
        if started is not None:
            started(seq)
        return run_task(handler, seq, payload)

    for task in tasks:
        if type(task) is list:  # a bundle: its replies go back together
            assert send_bundle is not None, "a bundle sent to a worker that cannot answer one"
            if not send_bundle([answer(one) for one in task]):
                return
        elif not send(answer(cast(Task, task))):
            return
