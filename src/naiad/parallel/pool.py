"""WorkerPool: run a handler over a stream of tasks in processes or threads, results in order.

The pool owns its workers' life and size; a pass's tasks and the order of their delivery are
:mod:`naiad.parallel.passes`'s, the workers and their messages :mod:`naiad.parallel.workers`'s,
and what crosses between the pool and a worker is NOTE [ Worker protocol ] in
:mod:`naiad.parallel.protocol`. Resizes go to the ``naiad.workers`` logger at INFO.

NOTE [ Resizing ]
``resize(n)`` changes the number of workers while an ``imap`` runs, and ordered delivery stays
exact because order is kept by ``seq``, never by worker. New tasks go round-robin to the
*active* workers; a worker taken out of the rotation is *retiring*: it finishes the tasks it
owes (the pool counts them per worker), and only when it owes none is it sent ``STOP`` and
leaves with exit code 0, which is reported as "retired", not as a death. (It must not leave
earlier: a result in shared memory can only be received while its sender lives.) With no
active worker the pool runs tasks inline, in submit order, between the workers' results; a
pool built with ``num_workers=0`` starts inline and hands the rest of the pass to workers at
the first resize. ``imap_until_exhausted`` walks each worker's own iterator, so it cannot
resize; ``resize`` during one raises ConfigError.

NOTE [ Passes sharing a pool ]
A pool outlives a pass (persistent workers, ``num_workers="auto"``, read-ahead threads), so two
of its passes can be live at once: ``it = iter(loader); next(it); list(loader); list(it)``.
Every pass waits on the same backend, so the one that waits receives the others' results too.
It keeps them aside (``WorkerSet.parked``, by ``seq``), and the pass they belong to takes them
before it waits itself; a pass that ends drops what was kept for it and marks the rest stale.
Without this a pass that received another's results dropped them, and the other waited forever.
A worker that dies is replaced (within the restart budget) and sent again what it owed every
live pass; without a restart, a pass that still waits on it raises its WorkerError instead of
waiting (``check_alive``). Walks are the exception: each worker walks one iterator, so a new
``imap_until_exhausted`` ends the walk before it (its next ``next()`` raises StopIteration).
The loader decides what concurrent passes mean (docs/WORKERS.md, "Two passes at once").

Teardown escalates: a ``STOP`` task asks each worker to return, then join with a timeout, then
terminate, then kill; a worker that cannot be asked (its stop message fails to send) is
terminated, then killed. Workers ignore SIGINT (Ctrl-C reaches the main process, which tears them
down) and return when their parent is gone, so no worker outlives the training process. How
each worker ended goes to the ``naiad.workers`` logger: DEBUG when it returned, INFO when it had
to be terminated or killed (or, a thread, left running).
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing as mp
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from naiad.errors import ConfigError
from naiad.parallel.backend import ProcessBackend
from naiad.parallel.context import WorkerContext, get_worker_context, worker_rng
from naiad.parallel.inline import InlineWorker
from naiad.parallel.passes import (
    OnDeliver,
    PassOptions,
    Pinned,
    PoolPass,
    assign_tasks,
    bundle_size,
    run_inline,
    walk_assignments,
)
from naiad.parallel.protocol import Exhausted, RemoteError, TaskKey, add_note
from naiad.parallel.restart import RestartBudget
from naiad.parallel.results import DeferredResults, PoolResults
from naiad.parallel.thread_backend import ThreadBackend
from naiad.parallel.worker_side import HandlerFactory, WorkerSpec
from naiad.parallel.workers import INLINE, WorkerSet

__all__ = [
    "Exhausted",
    "HandlerFactory",
    "DeferredResults",
    "Pinned",
    "PoolResults",
    "RemoteError",
    "RestartBudget",
    "WorkerContext",
    "WorkerPool",
    "add_note",
    "get_worker_context",
    "worker_rng",
]

_LOG = logging.getLogger("naiad.workers")


def _make_backend(mode: str, spec: WorkerSpec, mp_context: str | Any | None) -> ProcessBackend | ThreadBackend:
    if mode == "thread":
        return ThreadBackend(spec)
    mp_ctx = mp.get_context(mp_context) if mp_context is None or isinstance(mp_context, str) else mp_context
    return ProcessBackend(spec, mp_ctx)


class WorkerPool:
    """Runs ``handler(payload)`` over a stream of tasks in worker processes or threads.

    The handler is built in each worker by ``factory(WorkerContext)``; the factory must be
    picklable for process workers under spawn/forkserver (a top-level function or a
    ``functools.partial`` of one). Results come back in task order (``in_order=True``) or as
    they complete. An exception in the handler is re-raised in the consumer with its own type
    and a note naming the worker and the task; a worker that dies raises :class:`WorkerError`.
    The number of workers can change between or during passes (:meth:`resize`).

    Args:
        factory: builds the handler inside each worker.
        num_workers: 0 runs the handler inline in the calling thread.
        mode: "process" or "thread".
        multiprocessing_context: a start method name or a multiprocessing context.
        timeout_s: the longest wait for one result; None or 0 waits as long as the workers live.
        worker_init_fn: called with the worker id in each worker before the factory. When
            given, naiad leaves the global random generators to it (NOTE [ Worker randomness ]).
        base_seed: seeds each worker's ``random``, ``numpy`` and ``torch`` generators, with the
            epoch and rank (NOTE [ Worker randomness ]).
        prepare: called with the :class:`WorkerContext` in each worker (and inline) before
            ``worker_init_fn``: the loader makes ``torch.utils.data.get_worker_info()`` answer
            there, so ``worker_init_fn`` can use it. Picklable, like ``factory``.
        describe: turns a payload into words for error messages.
        rank: the distributed rank, a key of each worker's seed sequence.
        init_inline: call ``worker_init_fn(0)`` when running inline; False keeps it for real
            workers only, as torch does (a loader whose worker count is tuned starts inline).
        restarts: the budget of worker restarts (shared between pools to count them together);
            None allows none: a dead worker is a WorkerError (NOTE [ Worker restarts ]).

    Example:
        >>> pool = WorkerPool(lambda ctx: (lambda x: x * x), num_workers=0)
        >>> list(pool.imap(range(4)))
        [0, 1, 4, 9]
    """

    def __init__(
        self,
        factory: HandlerFactory,
        *,
        num_workers: int,
        mode: Literal["process", "thread"] = "process",
        multiprocessing_context: str | Any | None = None,
        timeout_s: float | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        base_seed: int = 0,
        describe: Callable[[Any], str] = lambda payload: f"task {payload!r:.200}",
        rank: int = 0,
        init_inline: bool = True,
        prepare: Callable[[WorkerContext], None] | None = None,
        restarts: RestartBudget | None = None,
    ) -> None:
        if num_workers < 0:
            raise ConfigError(f"`num_workers` must be >= 0, got {num_workers}.")
        if mode not in ("process", "thread"):
            raise ConfigError(f"`worker_mode` must be 'process' or 'thread', got {mode!r}.")
        self.num_workers = num_workers
        self.mode = mode if num_workers > 0 else "inline"
        self.timeout_s = timeout_s or None
        self._worker_mode = mode
        self._describe = describe
        # A worker_init_fn owns the workers' global generators: no task reseeds them, so a
        # task's draws depend on the worker and the tasks it ran before (NOTE [ Worker randomness ]).
        self._reseeds_per_task = worker_init_fn is None
        spec = WorkerSpec(factory, worker_init_fn, prepare, base_seed, rank)
        # The backend factory holds what a backend needs, never the pool: the pool's workers
        # then go when the pool does, by reference counting alone (no cycle to wait for).
        make_backend = functools.partial(_make_backend, mode, spec, multiprocessing_context)
        self._workers = WorkerSet(make_backend, process=mode == "process", describe=describe, restarts=restarts)
        self._inline = InlineWorker(spec, describe=describe, init=init_inline,
                                    stage_seconds=self._workers.stage_seconds)
        self._active = self._workers.active  # the same list: workers that take new tasks
        self._passes = 0
        self._pass_ids = itertools.count()
        self._prefetch: int | None = None  # set by resize(); overrides imap's argument
        self._walk_results: weakref.ReferenceType[PoolResults] | None = None
        self._closed = False
        if num_workers == 0:
            self._inline.handler()
        else:
            self._workers.grow(num_workers)

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Seconds the workers reported per stage (``"worker"``: running handlers), summed."""
        return self._workers.stage_seconds

    @property
    def restarts(self) -> RestartBudget:
        """The restart budget: allowed, done, and each restart (NOTE [ Worker restarts ])."""
        return self._workers.restarts

    # -- workers -------------------------------------------------------------------------------

    def resize(self, num_workers: int, *, prefetch: int | None = None) -> None:
        """Change the number of workers (and tasks in flight per worker), also during a pass.

        Delivery order is unaffected: results are ordered by task, not by worker. Workers taken
        out finish the tasks they hold before they leave; ``num_workers=0`` runs the following
        tasks inline. See NOTE [ Resizing ].

        Args:
            num_workers: the new number of workers, >= 0.
            prefetch: tasks in flight per worker from now on; None keeps the current value.
        """
        self._check_open()
        if num_workers < 0:
            raise ConfigError(f"`num_workers` must be >= 0, got {num_workers}.")
        if prefetch is not None and prefetch < 1:
            raise ConfigError(f"`prefetch` must be >= 1, got {prefetch}.")
        self._prefetch = prefetch if prefetch is not None else self._prefetch
        before = len(self._active)
        if num_workers == before:
            return
        if self._workers.walking:
            raise ConfigError(
                "cannot resize a WorkerPool during imap_until_exhausted: each worker walks its "
                "own iterator. Resize between passes."
            )
        if num_workers > before:
            self._workers.grow(num_workers)
        else:
            self._workers.shrink(num_workers)
        self.num_workers = num_workers
        self.mode = self._worker_mode if num_workers > 0 else "inline"
        _LOG.info("pool resized from %d to %d workers (%s)", before, num_workers, self.mode)

    @property
    def workers_ready(self) -> bool:
        """True once every active worker has built its handler (always True inline)."""
        return all(w in self._workers.ready for w in self._active)

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the active workers (the main process's for threads; empty inline)."""
        return self._workers.pids()

    @property
    def worker_handles(self) -> list[Any]:
        """Every worker this pool started and has not replaced, as ``multiprocessing.Process``
        (``threading.Thread`` in thread mode) objects, stopped ones included; empty inline.
        They stay usable after :meth:`close` (``join``, ``is_alive``, ``exitcode``)."""
        backend = self._workers.backend
        return [] if backend is None else backend.handles()

    # -- passes --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this WorkerPool is closed.")

    def _pass_key(self, epoch: int | None) -> TaskKey:
        # (pass id, epoch): workers start fresh generators at each new key.
        if epoch is None:
            epoch = self._passes
        self._passes = epoch + 1
        return next(self._pass_ids), epoch

    def _capacity(self, prefetch: int) -> int:
        """Tasks a pass may have in flight now: ``prefetch`` per active worker (a resize's own
        prefetch first), or one at a time inline."""
        per_worker = self._prefetch or max(1, prefetch)
        return per_worker * len(self._active) if self._active else 1

    def imap(
        self,
        tasks: Iterable[Any],
        *,
        prefetch: int = 2,
        in_order: bool = True,
        epoch: int | None = None,
        task_seed: Callable[[Any], tuple[int, ...] | None] | None = None,
        on_deliver: OnDeliver | None = None,
        bundle: bool = False,
    ) -> PoolResults:
        """Yield ``handler(payload)`` for each task, at most ``prefetch`` tasks ahead per worker.

        A task is a payload or a :class:`Pinned` payload for one given worker. In order, task k
        goes to worker k mod num_workers (so a worker's sequence of tasks, and its random draws,
        repeat between runs); out of order (``in_order=False``), each task goes to the worker
        with the fewest tasks in hand, so a slow task holds back no others. ``epoch`` keys the
        workers' random generators (NOTE [ Worker randomness ]); by default it counts this
        pool's passes. ``task_seed(payload)``, when given, names a task's own seed sequence: its
        random draws then depend on the task alone, not on the worker that runs it. A task's
        exception is raised by ``next()``, and the next ``next()`` goes on with the following
        tasks (NOTE [ A failed task ]). ``on_deliver(worker, payload)``, when given, is called
        just before each task's result or exception is delivered (the worker is -1 inline).
        ``bundle=True`` says the results do not depend on which worker runs a task (its
        randomness is keyed by ``task_seed``, or it has none): small tasks may then go to process
        workers several at a time, each still answered alone (NOTE [ Task bundles ]); never out
        of order, nor with a ``task_seed`` in a pool whose ``worker_init_fn`` owns the generators.
        """
        self._check_open()
        # Out of order a slow task must hold back no other: a bundle would queue its neighbours.
        bundle = bundle and in_order and (task_seed is None or self._reseeds_per_task)
        options = PassOptions(prefetch, in_order, self._pass_key(epoch), task_seed, on_deliver, bundle=bundle)
        it = iter(tasks)
        if self._workers.backend is None:
            return PoolResults(self._imap_inline(it, options))
        return PoolResults(self._run_tasks(it, options))

    def _pass(self, options: PassOptions) -> PoolPass:
        capacity = functools.partial(self._capacity, options.prefetch)
        return PoolPass(self._workers, self._inline, options, capacity=capacity, describe=self._describe,
                        timeout_s=self.timeout_s)

    def _run_tasks(self, tasks: Iterator[Any], options: PassOptions) -> Iterator[Any]:
        # A worker's turn is a bundle's worth of consecutive tasks (one, without bundles).
        assignments = assign_tasks(tasks, self._active, options.in_order, self._workers.least_busy,
                                   run=functools.partial(bundle_size, options, self._workers))
        return self._pass(options).run(assignments)

    def _imap_inline(self, tasks: Iterator[Any], options: PassOptions) -> Iterator[Any]:
        payloads = (task.payload if isinstance(task, Pinned) else task for task in tasks)
        exhausted = yield from run_inline(self._inline, options, payloads, INLINE, until=lambda: bool(self._active))
        if not exhausted and self._active:  # resized: the workers take the rest of this pass
            yield from self._run_tasks(tasks, options)

    def imap_until_exhausted(
        self,
        payload_for: Callable[[int], Any],
        *,
        prefetch: int = 2,
        in_order: bool = True,
        epoch: int | None = None,
        on_deliver: OnDeliver | None = None,
    ) -> PoolResults:
        """Ask the workers in turn for results until every one of them raised :class:`Exhausted`.

        Task k goes to the next worker that has not yet reported exhaustion (out of order: the
        one of them with the fewest tasks in hand), with payload ``payload_for(worker_id)``;
        this is how each worker walks its own copy of an iterable. ``on_deliver`` as in
        :meth:`imap` (inline, the worker is 0).
        """
        self._check_open()
        earlier = self._walk_results() if self._walk_results is not None else None
        if earlier is not None:
            # Each worker walks one iterator: a new walk ends the one before (NOTE [ Passes
            # sharing a pool ]); its next next() raises StopIteration.
            earlier.close()
        key = self._pass_key(epoch)
        if not self._active:
            options = PassOptions(prefetch, in_order, key, on_deliver=on_deliver)
            payloads = (payload_for(0) for _ in itertools.count())
            return PoolResults(run_inline(self._inline, options, payloads, 0))
        going = {w: True for w in self._active}  # the workers whose iterator has not run out
        options = PassOptions(prefetch, in_order, key, on_deliver=on_deliver, walking=going)
        assignments = walk_assignments(going, in_order, self._workers.least_busy, payload_for)
        results = PoolResults(self._walk(assignments, options, payload_for))
        self._walk_results = weakref.ref(results)
        return results

    def _walk(self, assignments: Iterator[tuple[int, Any]], options: PassOptions,
              payload_for: Callable[[int], Any]) -> Iterator[Any]:
        self._workers.start_walk(options.key, payload_for)  # a restarted worker walks again to here
        try:
            yield from self._pass(options).run(assignments)
        finally:
            self._workers.end_walk(options.key)  # unless a later walk ended this one

    def close(self) -> None:
        """Stop the workers: ask, wait, then terminate and kill. Safe to call more than once."""
        self._closed = True
        self._workers.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
