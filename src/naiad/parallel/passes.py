"""One pass of a WorkerPool: which worker takes each task, and the results delivered in task
order or as they complete.

A :class:`PoolPass` keeps the tasks of one ``imap`` (or walk) in flight up to the pool's
capacity, waits on the workers, and delivers: in order, the oldest task's result once it is in;
out of order, whichever came first. The workers themselves, and the messages that come back
from them, are the :class:`~naiad.parallel.workers.WorkerSet`'s (NOTE [ Worker protocol ] in
:mod:`naiad.parallel.protocol`); a pool's life and size are :mod:`naiad.parallel.pool`'s.

NOTE [ Task bundles ]
A task and its reply each cost a message: on a 2-core machine about 100 µs of CPU a task
between the two processes (the pickles, the syscalls, waking the other side), more than a
vectorised batch costs to make (a token batch of 32 x 1024: about 60 µs). A pass that says its
results do not depend on which worker runs a task (``bundle=True``: its randomness is keyed by
task, or it has none) lets the pool send a process worker several consecutive tasks in one
message: the worker runs them in turn and sends their replies in one message, their results in
one batch slot. In order only (out of order, a slow task must hold back no other, and a bundle
would queue its neighbours behind it), and not when a ``worker_init_fn`` owns the workers'
generators while the tasks draw (their draws then follow the worker, as torch's do). Nothing
else changes: each task keeps its own sequence number, reply, exception, delivery and place in
the restart ledger; a worker that dies is sent its unanswered tasks again one by one. A process
worker writes the number of each task it begins into a shared integer, so a death inside a
bundle is told, and charged to (NOTE [ Worker restarts ]), the task it died on.

A bundle holds ``BUNDLE_S / task time`` tasks, at most ``MAX_BUNDLE``, from the running mean of
the time a task takes in its worker: tasks of a millisecond or more go alone, and the first
tasks of a pool, before any time is known, go alone too (the first batch is not held back). A
worker is given one bundle of consecutive tasks at a time (in order, the workers in turn), and
a pass keeps ``prefetch`` bundles in flight per worker; it tops up only when a whole bundle fits.
A bundle's replies come together, so a pass's ``timeout_s`` covers the whole bundle: tasks that
together took about a millisecond when it was sent, the risk being a run of them each turning
slow at once.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from naiad.errors import WorkerError
from naiad.parallel.inline import InlineWorker
from naiad.parallel.protocol import (
    EXHAUSTED,
    OK,
    Exhausted,
    RemoteError,
    Seq,
    TaskKey,
    add_note,
)
from naiad.parallel.results import Failed
from naiad.parallel.worker_process import POLL_S
from naiad.parallel.workers import INLINE, Done, Pending, WorkerSet

__all__ = ["BUNDLE_S", "MAX_BUNDLE", "OnDeliver", "PassOptions", "Pinned", "PoolPass", "assign_tasks", "bundle_size",
           "run_inline", "walk_assignments"]

BUNDLE_S = 1e-3
"""The worker time a bundle of tasks aims at (NOTE [ Task bundles ])."""
MAX_BUNDLE = 8
"""The most tasks in one bundle."""

OnDeliver = Callable[[int, Any], None]
"""Told ``(worker, payload)`` of each task just before its result (or its exception) is
delivered: out of order, how a pass knows which of its tasks it has delivered."""

Assignments = Iterator[tuple[int, Any]]
"""``(worker, payload)`` per task, in submit order; the worker is ``INLINE`` for the calling thread."""


_NO_RESULT: Any = object()  # what a task that says its iterable ran out delivers: nothing


@dataclass(frozen=True)
class Pinned:
    """A task that must run on one given worker (its payload is passed to the handler)."""

    worker_id: int
    payload: Any


@dataclass(frozen=True)
class PassOptions:
    """What one pass was asked for (see ``WorkerPool.imap``).

    Attributes:
        prefetch: tasks in flight per worker (unless the pool's resize set its own).
        in_order: deliver in task order; False: as results complete.
        key: ``(pass id, epoch)``: what the workers reseed from (NOTE [ Worker randomness ]).
        task_seed: a task's own seed keys, from its payload (None: the pass's sequence).
        on_deliver: told each task just before its result is delivered.
        walking: while workers walk their own iterators, which of them have not run out yet.
        bundle: results do not depend on which worker runs a task, so tasks may go to a process
            worker several at a time (NOTE [ Task bundles ]).
    """

    prefetch: int
    in_order: bool
    key: TaskKey
    task_seed: Callable[[Any], tuple[int, ...] | None] | None = None
    on_deliver: OnDeliver | None = None
    walking: dict[int, bool] | None = None
    bundle: bool = False


def assign_tasks(tasks: Iterator[Any], active: list[int], in_order: bool,
                 least_busy: Callable[[list[int]], int], run: Callable[[], int] = lambda: 1) -> Assignments:
    """Each task's worker: a :class:`Pinned` task's own; else, in order, task k to the k-th
    active worker in turn (a worker's tasks, and its draws, repeat between runs), out of order
    the least busy; with no active worker, the calling thread. ``active`` is read at every
    task: a resize changes it during the pass. ``run()``, read as a worker's turn starts, is how
    many consecutive tasks it takes (a bundle's: NOTE [ Task bundles ])."""
    k = 0
    w, left = INLINE, 0
    for task in tasks:
        if isinstance(task, Pinned):
            yield task.worker_id, task.payload
        elif not active:
            yield INLINE, task
        else:
            if left <= 0 or w not in active:
                w, left = (active[k % len(active)] if in_order else least_busy(active)), run()
                k += 1
            left -= 1
            yield w, task


def bundle_size(options: PassOptions, workers: WorkerSet) -> int:
    """Tasks per message to a worker now (NOTE [ Task bundles ])."""
    took = workers.task_seconds
    if not options.bundle or took is None or not workers.takes_bundles:
        return 1
    return max(1, min(MAX_BUNDLE, int(BUNDLE_S / max(took, 1e-6))))


def walk_assignments(going: dict[int, bool], in_order: bool, least_busy: Callable[[list[int]], int],
                     payload_for: Callable[[int], Any]) -> Assignments:
    """Ask the workers whose iterator has not run out (``going``) in turn, out of order the
    least busy of them, with ``payload_for(worker)``, until none is left."""
    workers = list(going)
    cycle = itertools.cycle(workers)
    while any(going.values()):
        if in_order:
            w = next(v for v in itertools.islice(cycle, len(workers)) if going[v])
        else:
            w = least_busy([v for v in workers if going[v]])
        yield w, payload_for(w)


def run_inline(inline: InlineWorker, options: PassOptions, payloads: Iterable[Any], worker: int,
               until: Callable[[], bool] = lambda: False) -> Generator[Any, None, bool]:
    """Run ``payloads`` in the calling thread in turn, each result (or its exception, as
    :class:`Failed`) yielded before the next runs; ``on_deliver`` is told ``worker``. Returns
    True when a task said its iterable ran out, and ends early when ``until()`` turns True."""
    key, task_seed, on_deliver = options.key, options.task_seed, options.on_deliver
    for payload in payloads:
        try:
            result = inline.call(payload, key, task_seed(payload) if task_seed is not None else None)
        except Exhausted:
            return True
        except Exception as exc:  # NOTE [ A failed task ]
            result = Failed(exc)
        if on_deliver is not None:
            on_deliver(worker, payload)
        yield result
        if until():
            break
    return False


class PoolPass:
    """One pass over a pool's workers: tasks out up to ``capacity()``, results back in order.

    Args:
        workers: the pool's workers.
        inline: runs the tasks assigned to the calling thread.
        options: what the pass was asked for.
        capacity: how many tasks may be in flight now (the pool's size and prefetch can change
            during the pass: NOTE [ Resizing ]).
        describe: turns a payload into words for notes and errors.
        timeout_s: the longest wait for one result (None: as long as the workers live).
    """

    def __init__(
        self, workers: WorkerSet, inline: InlineWorker, options: PassOptions, *, capacity: Callable[[], int],
        describe: Callable[[Any], str], timeout_s: float | None,
    ) -> None:
        self._workers = workers
        self._inline = inline
        self._options = options
        self._capacity = capacity
        self._describe = describe
        self._timeout_s = timeout_s
        self._pending: Pending = {}
        self._done: Done = {}
        self._order: deque[Seq] = deque()  # in order: the tasks not yet delivered, in submit order
        self._assignments: Assignments = iter(())
        self._ended = False  # an inline task said its iterable ran out: the pass ends there
        self._unsent: dict[int, list[tuple[int, Any, TaskKey]]] = {}  # bundles being filled, by worker

    def run(self, assignments: Assignments) -> Iterator[Any]:
        """Run the pass: each result, or a failed task's exception as :class:`Failed` (NOTE [ A
        failed task ]); results still owed when it ends are dropped on arrival."""
        self._assignments = assignments
        workers = self._workers
        backend = workers.ensure_backend()
        try:
            if workers.restarts.limit:  # a worker that died between passes is replaced before it is sent work
                workers.receive(backend.poll(0), self._pending, self._done)
            self._refill()
            while self._pending:
                seq = self._next_ready()
                if seq is None:  # nothing to deliver yet
                    self._wait()
                    workers.reap()
                    continue
                # In a list popped as it is yielded: held here while the loop runs, a batch the
                # loop dropped would keep its slot a batch longer (NOTE [ Slot release ]).
                result = [self._deliver(seq)]
                if self._ended:
                    return
                if result[0] is not _NO_RESULT:
                    yield result.pop()
                self._refill()
        finally:
            # Results still owed for this pass are dropped (now if parked, else on arrival).
            workers.abandon(self._pending, self._done)

    def _refill(self) -> None:
        """Send tasks (or run inline ones) until the pass has ``capacity()`` in flight (times
        the bundle size: ``prefetch`` bundles per worker); with bundles, only once a whole one fits."""
        k = bundle_size(self._options, self._workers)
        capacity = self._capacity() * k
        if len(self._pending) > capacity - k:
            return
        try:
            while len(self._pending) < capacity:
                assignment = next(self._assignments, None)
                if assignment is None:
                    break
                self._submit(*assignment, k)
        finally:
            for w in list(self._unsent):  # every task counted in flight is sent before any wait
                self._workers.send_tasks(w, self._unsent.pop(w))

    def _submit(self, w: int, payload: Any, bundle: int = 1) -> None:
        options = self._options
        seq = next(self._workers.seq)
        entropy = options.task_seed(payload) if options.task_seed is not None else None
        key = options.key if entropy is None else (*options.key, entropy)
        if w == INLINE:
            self._done[seq] = self._inline.answer(payload, options.key, entropy)
        elif bundle > 1:
            self._unsent.setdefault(w, []).append((seq, payload, key))
        else:
            self._workers.send(w, seq, payload, key)
        self._pending[seq] = (w, payload)
        if options.in_order:
            self._order.append(seq)
        if len(self._unsent.get(w, ())) >= bundle > 1:
            self._workers.send_tasks(w, self._unsent.pop(w))

    def _next_ready(self) -> Seq | None:
        """The task whose result is delivered next, if its result is in."""
        if not self._options.in_order:
            return next(iter(self._done), None)  # the first received
        if self._order and self._order[0] in self._done:
            return self._order.popleft()
        return None

    def _deliver(self, seq: Seq) -> Any:
        """Take task ``seq``'s answer: its result, or its exception as :class:`Failed`, told to
        ``on_deliver`` first; ``_NO_RESULT`` when it says its worker's iterable ran out."""
        kind, value = self._done.pop(seq)
        w, payload = self._pending.pop(seq)
        if kind is EXHAUSTED:
            self._exhausted(w)
            return _NO_RESULT
        if self._options.on_deliver is not None:
            self._options.on_deliver(w, payload)
        if kind is OK:
            return value
        if isinstance(value, RemoteError):  # a worker's: rebuilt here, noted with where it ran
            value = value.rebuild()
            pid = self._workers.ensure_backend().pid(w)
            add_note(value, f"naiad: raised in worker {w} (pid {pid}) while loading {self._describe(payload)}")
        return Failed(value)  # inline, the exception itself, noted already

    def _exhausted(self, w: int) -> None:
        """Worker ``w``'s iterable ran out: a walk asks it no more; inline, the pass ends."""
        walking = self._options.walking
        if walking is not None:
            walking[w] = False
        elif w == INLINE:
            self._ended = True

    def _wait(self) -> None:
        """Wait for the next result of this pass (one another pass received counts), up to the timeout."""
        workers = self._workers
        if workers.adopt(self._pending, self._done):  # received while another pass waited
            return
        backend = workers.ensure_backend()
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        while True:
            wait_s = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            if workers.receive(backend.poll(wait_s), self._pending, self._done):
                return
            workers.check_alive(self._pending, self._done)
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timed_out()

    def _timed_out(self) -> WorkerError:
        """The WorkerError of a wait past the timeout, naming the worker and the task it was on."""
        waiting = ((w, p) for seq, (w, p) in self._pending.items() if seq not in self._done)
        w, payload = next(waiting, next(iter(self._pending.values())))
        doing = f"while loading {self._describe(payload)}"
        # torch's words first, so code that matches them keeps working.
        return WorkerError(
            f"DataLoader timed out after {self._timeout_s} seconds: no result from naiad "
            f"worker {w} {doing}; raise `timeout` or find what blocks the dataset.",
            worker_id=w,
            task=doing,
        )
