"""WorkerPool: run a handler over a stream of tasks in processes or threads, results in order.

NOTE [ Worker protocol ]
Each worker owns a task channel (main -> worker) and the main process owns one result channel
per worker (worker -> main). Tasks are ``(seq, payload, (pass_id, epoch))``; ``seq`` numbers are
unique for the pool's lifetime, so a result that belongs to an abandoned epoch (a ``break``) is
recognised and dropped; at the first task of each pass a worker reseeds its generators from the
epoch (NOTE [ Worker randomness ] in :mod:`naiad.parallel.context`). A worker answers every task
with exactly one message:

    ("ok", seq, result, stage_seconds)    the handler returned
    ("exhausted", seq, None, {})          the handler raised Exhausted (an iterable ran out)
    ("error", seq, RemoteError, {})       the handler raised; re-raised in the consumer, and the
                                          iteration goes on with the next task (as torch's)

plus one ("ready", -1, None, {}) or ("error", -1, RemoteError, {}) after building its handler.
The main process waits on the result channels *and* the process sentinels together
(``multiprocessing.connection.wait``), so a worker that dies is seen at once, not after a
timeout; its buffered results are drained first, then a WorkerError names the worker, its exit
code and the task it held, or, within a restart budget, the worker is replaced and sent again
the tasks it owed (NOTE [ Worker restarts ] in :mod:`naiad.parallel.restart`). A failed task
fails only itself (NOTE [ A failed task ] in :mod:`naiad.parallel.results`). Tasks go through
``multiprocessing.Queue`` (a feeder thread), so the main process never blocks on a full pipe
while a worker blocks on sending its result. Results travel inline or through shared memory by
size (NOTE [ Batch transport ]). :class:`~naiad.parallel.workers.WorkerSet` keeps the workers
and what each owes; the pool keeps the passes.

NOTE [ Resizing ]
``resize(n)`` changes the number of workers while an ``imap`` runs, and ordered delivery stays
exact because order is kept by ``seq``, never by worker. New tasks go round-robin to the
*active* workers; a worker taken out of the rotation is *retiring*: it finishes the tasks it
owes (the pool counts them per worker), and only when it owes none is it sent ``None`` and
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

Teardown escalates: a ``None`` task asks each worker to return, then join with a timeout, then
terminate, then kill; a worker that cannot be asked (its stop message fails to send) is
terminated, then killed. Workers ignore SIGINT (Ctrl-C reaches the main process, which tears them
down) and return when their parent is gone, so no worker outlives the training process.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing as mp
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from naiad.errors import ConfigError, WorkerError
from naiad.parallel.backend import (
    POLL_S,
    Exhausted,
    ProcessBackend,
    RemoteError,
    add_note,
    worker_seed,
)
from naiad.parallel.context import (
    WorkerContext,
    enter,
    get_worker_context,
    leave,
    take_stages,
    worker_rng,
)
from naiad.parallel.restart import RestartBudget
from naiad.parallel.results import DeferredResults, Failed, PoolResults
from naiad.parallel.thread_backend import ThreadBackend
from naiad.parallel.workers import Done, Pending, WorkerSet

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

HandlerFactory = Callable[[WorkerContext], Callable[[Any], Any]]
"""Builds, inside a worker, the callable that turns one task payload into one result."""

OnDeliver = Callable[[int, Any], None]
"""Told ``(worker, payload)`` of each task just before its result (or its exception) is
delivered: out of order, how a pass knows which of its tasks it has delivered."""

INLINE = -1  # the "worker" of a task run in the calling thread


@dataclass(frozen=True)
class Pinned:
    """A task that must run on one given worker (its payload is passed to the handler)."""

    worker_id: int
    payload: Any


def _make_backend(
    mode: str, factory: HandlerFactory, mp_context: str | Any | None, base_seed: int, rank: int,
    worker_init_fn: Callable[[int], None] | None, prepare: Callable[[WorkerContext], None] | None,
) -> ProcessBackend | ThreadBackend:
    if mode == "thread":
        return ThreadBackend(factory, base_seed, rank, worker_init_fn, prepare)
    mp_ctx = mp.get_context(mp_context) if mp_context is None or isinstance(mp_context, str) else mp_context
    return ProcessBackend(factory, mp_ctx, base_seed, rank, worker_init_fn, prepare)


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
        self._factory = factory
        self._worker_mode = mode
        self._worker_init_fn = worker_init_fn
        self._prepare = prepare
        self._init_inline = init_inline
        self._describe = describe
        self._inline_handler: Callable[[Any], Any] | None = None
        self._inline_context = WorkerContext(0, 0, worker_seed(base_seed, 0), "inline", base_seed, rank)
        self._inline_rng: Any = None
        self._inline_rng_key: tuple[int, int] | None = None
        # The backend factory holds what a backend needs, never the pool: the pool's workers
        # then go when the pool does, by reference counting alone (no cycle to wait for).
        make_backend = functools.partial(_make_backend, mode, factory, multiprocessing_context, base_seed, rank,
                                         worker_init_fn, prepare)
        self._workers = WorkerSet(make_backend, process=mode == "process", describe=describe, restarts=restarts)
        self._active = self._workers.active  # the same list: workers that take new tasks
        self._passes = 0
        self._pass_ids = itertools.count()
        self._prefetch: int | None = None  # set by resize(); overrides imap's argument
        self._walking_iterators = False
        self._walk_results: weakref.ReferenceType[PoolResults] | None = None
        self._closed = False
        if num_workers == 0:
            self._build_inline_handler()
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

    def _build_inline_handler(self) -> Callable[[Any], Any]:
        if self._inline_handler is None:
            previous = enter(self._inline_context, None)
            try:
                if self._prepare is not None:
                    self._prepare(self._inline_context)
                if self._worker_init_fn is not None and self._init_inline:
                    self._worker_init_fn(0)
                self._inline_handler = self._factory(self._inline_context)
            finally:
                leave(previous)
        return self._inline_handler

    def resize(self, num_workers: int, *, prefetch: int | None = None) -> None:
        """Change the number of workers (and tasks in flight per worker), also during a pass.

        Delivery order is unaffected: results are ordered by task, not by worker. Workers taken
        out finish the tasks they hold before they leave; ``num_workers=0`` runs the following
        tasks inline. See NOTE [ Resizing ].

        Args:
            num_workers: the new number of workers, >= 0.
            prefetch: tasks in flight per worker from now on; None keeps the current value.
        """
        if self._closed:
            raise ConfigError("this WorkerPool is closed.")
        if num_workers < 0:
            raise ConfigError(f"`num_workers` must be >= 0, got {num_workers}.")
        if prefetch is not None:
            if prefetch < 1:
                raise ConfigError(f"`prefetch` must be >= 1, got {prefetch}.")
            self._prefetch = prefetch
        if num_workers == len(self._active):
            return
        if self._walking_iterators:
            raise ConfigError(
                "cannot resize a WorkerPool during imap_until_exhausted: each worker walks its "
                "own iterator. Resize between passes."
            )
        if num_workers > len(self._active):
            self._workers.grow(num_workers)
        else:
            self._workers.shrink(num_workers)
        self.num_workers = num_workers
        self.mode = self._worker_mode if num_workers > 0 else "inline"

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

    def _pass_key(self, epoch: int | None) -> tuple[int, int]:
        # (pass id, epoch): workers start fresh generators at each new key.
        if epoch is None:
            epoch = self._passes
        self._passes = epoch + 1
        return next(self._pass_ids), epoch

    def imap(
        self,
        tasks: Iterable[Any],
        *,
        prefetch: int = 2,
        in_order: bool = True,
        epoch: int | None = None,
        task_seed: Callable[[Any], tuple[int, ...] | None] | None = None,
        on_deliver: OnDeliver | None = None,
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
        """
        if self._closed:
            raise ConfigError("this WorkerPool is closed.")
        key = self._pass_key(epoch)
        it = iter(tasks)
        if self._workers.backend is None:
            return PoolResults(self._imap_inline(it, prefetch, in_order, key, task_seed, on_deliver))
        return PoolResults(self._drive(self._assign(it, in_order), prefetch, in_order, key,
                                       task_seed=task_seed, on_deliver=on_deliver))

    def _assign(self, tasks: Iterator[Any], in_order: bool = True) -> Iterator[tuple[int, Any]]:
        k = 0
        for task in tasks:
            if isinstance(task, Pinned):
                yield task.worker_id, task.payload
                continue
            active = self._active  # read at every task: resize() may change it
            if not active:
                yield INLINE, task
                continue
            yield (active[k % len(active)] if in_order else self._workers.least_busy(active)), task
            k += 1

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
        if self._closed:
            raise ConfigError("this WorkerPool is closed.")
        earlier = self._walk_results() if self._walk_results is not None else None
        if earlier is not None:
            # Each worker walks one iterator: a new walk ends the one before (NOTE [ Passes
            # sharing a pool ]); its next next() raises StopIteration.
            earlier.close()
        key = self._pass_key(epoch)
        if not self._active:
            return PoolResults(self._imap_inline_until_exhausted(payload_for, key, on_deliver))
        workers = list(self._active)
        active = {w: True for w in workers}
        cycle = itertools.cycle(workers)

        def assign() -> Iterator[tuple[int, Any]]:
            while any(active.values()):
                if in_order:
                    for _ in range(len(workers)):
                        w = next(cycle)
                        if active[w]:
                            break
                else:
                    w = self._workers.least_busy([v for v in workers if active[v]])
                yield w, payload_for(w)

        results = PoolResults(self._walk(assign(), prefetch, in_order, key, active, payload_for, on_deliver))
        self._walk_results = weakref.ref(results)
        return results

    def _walk(
        self,
        assign: Iterator[tuple[int, Any]],
        prefetch: int,
        in_order: bool,
        key: tuple[int, int],
        active: dict[int, bool],
        payload_for: Callable[[int], Any],
        on_deliver: OnDeliver | None = None,
    ) -> Iterator[Any]:
        self._walking_iterators = True
        self._workers.walk_payload = payload_for
        self._workers.ledger.start_walk(key)  # a restarted worker walks its iterator again to here
        try:
            yield from self._drive(assign, prefetch, in_order, key, active=active,
                                   on_deliver=on_deliver)
        finally:
            if self._workers.ledger.walk_key == key:  # not a later walk's (a walk ends the one before)
                self._walking_iterators = False
                self._workers.walk_payload = None
                self._workers.ledger.start_walk(None)

    def _call_inline(self, payload: Any, key: tuple[int, int], entropy: tuple[int, ...] | None = None) -> Any:
        handler = self._build_inline_handler()
        # Inline, the calling thread is the worker only during the call; its worker_rng()
        # stream is kept here between calls of a pass so draws go on instead of restarting
        # (unless the task has its own seed sequence).
        rng = self._inline_rng if self._inline_rng_key == key and entropy is None else None
        previous = enter(self._inline_context, key[1], rng, fresh=rng is None, entropy=entropy)
        try:
            return handler(payload)
        except Exhausted:
            raise
        except Exception as exc:
            add_note(exc, f"naiad: raised in the main process while loading {self._describe(payload)}")
            raise
        finally:
            self._inline_rng, self._inline_rng_key = leave(previous), key
            seconds = self._workers.stage_seconds
            for stage, s in take_stages().items():  # parts the handler timed apart (report_stage)
                seconds[stage] = seconds.get(stage, 0.0) + s

    def _imap_inline(
        self, tasks: Iterator[Any], prefetch: int, in_order: bool, key: tuple[int, int],
        task_seed: Callable[[Any], tuple[int, ...] | None] | None = None,
        on_deliver: OnDeliver | None = None,
    ) -> Iterator[Any]:
        for task in tasks:
            payload = task.payload if isinstance(task, Pinned) else task
            try:
                result = self._call_inline(payload, key, task_seed(payload) if task_seed else None)
            except Exhausted:
                return
            except Exception as exc:  # NOTE [ A failed task ]
                result = Failed(exc)
            if on_deliver is not None:
                on_deliver(INLINE, payload)
            yield result
            if self._active:  # resized: the workers take the rest of this pass
                yield from self._drive(self._assign(tasks, in_order), prefetch, in_order, key,
                                       task_seed=task_seed, on_deliver=on_deliver)
                return

    def _imap_inline_until_exhausted(self, payload_for: Callable[[int], Any], key: tuple[int, int],
                                     on_deliver: OnDeliver | None = None) -> Iterator[Any]:
        while True:
            payload = payload_for(0)
            try:
                result = self._call_inline(payload, key)
            except Exhausted:
                return
            except Exception as exc:  # NOTE [ A failed task ]: the iterator decides what follows
                result = Failed(exc)
            if on_deliver is not None:
                on_deliver(0, payload)
            yield result

    def _drive(
        self,
        assignments: Iterator[tuple[int, Any]],
        prefetch: int,
        in_order: bool,
        key: tuple[int, int],
        *,
        active: dict[int, bool] | None = None,
        task_seed: Callable[[Any], tuple[int, ...] | None] | None = None,
        on_deliver: OnDeliver | None = None,
    ) -> Iterator[Any]:
        workers = self._workers
        backend = workers.ensure_backend()
        pending: Pending = {}
        order: deque[int] = deque()
        done: Done = {}
        exhausted_input = False

        def capacity() -> int:
            per_worker = self._prefetch or max(1, prefetch)
            return per_worker * len(self._active) if self._active else 1

        def refill() -> None:
            nonlocal exhausted_input
            while not exhausted_input and len(pending) < capacity():
                try:
                    w, payload = next(assignments)
                except StopIteration:
                    exhausted_input = True
                    return
                seq = next(workers.seq)
                entropy = task_seed(payload) if task_seed is not None else None
                if w == INLINE:
                    try:
                        done[seq] = ("ok", self._call_inline(payload, key, entropy))
                    except Exhausted:
                        done[seq] = ("exhausted", None)
                    except Exception as exc:  # raised in turn, after the results before it
                        done[seq] = ("raise", exc)
                else:
                    workers.send(w, seq, payload, key if entropy is None else (*key, entropy))
                pending[seq] = (w, payload)
                order.append(seq)

        try:
            if workers.restarts.limit:  # a worker that died between passes is replaced before it is sent work
                workers.receive(backend.poll(0), pending, done)
            refill()
            while pending or done:
                # Deliver what is deliverable.
                while order and (order[0] in done if in_order else done):
                    seq = order.popleft() if in_order else next(iter(done))
                    if not in_order:
                        order.remove(seq)
                    kind, value = done.pop(seq)
                    w, payload = pending.pop(seq)
                    if on_deliver is not None and kind != "exhausted":
                        on_deliver(w, payload)
                    if kind == "ok":
                        yield value
                    elif kind == "exhausted":
                        if active is not None:
                            active[w] = False
                        elif w == INLINE:
                            return
                    elif kind == "raise":  # NOTE [ A failed task ]
                        yield Failed(value)
                    else:  # error
                        exc = value.rebuild()
                        add_note(exc, f"naiad: raised in worker {w} (pid {backend.pid(w)}) while loading {self._describe(payload)}")
                        yield Failed(exc)
                        del exc
                    refill()
                if not pending:
                    break
                self._collect(backend, pending, done)
                workers.reap()
        finally:
            # Results still owed for this iteration are dropped (now if parked, else on arrival).
            workers.abandon(pending, done)

    def _collect(self, backend: Any, pending: Pending, done: Done) -> None:
        workers = self._workers
        if workers.adopt(pending, done):  # received while another pass waited
            return
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            if workers.receive(backend.poll(wait_s), pending, done):
                return
            workers.check_alive(pending, done)
            if deadline is not None and time.monotonic() >= deadline:
                w, payload = next((t for s, t in pending.items() if s not in done), next(iter(pending.values())))
                doing = f"while loading {self._describe(payload)}"
                # torch's words first, so code that matches them keeps working.
                raise WorkerError(
                    f"DataLoader timed out after {self.timeout_s} seconds: no result from naiad "
                    f"worker {w} {doing}; raise `timeout` or find what blocks the dataset.",
                    worker_id=w,
                    task=doing,
                )

    def close(self) -> None:
        """Stop the workers: ask, wait, then terminate and kill. Safe to call more than once."""
        self._closed = True
        self._workers.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
