"""The workers of a WorkerPool: which run, which take new tasks, what each owes, and their messages.

A :class:`WorkerSet` starts and retires workers by id (NOTE [ Resizing ] in
:mod:`naiad.parallel.pool`), sends tasks and notes what each worker owes, takes in the
backend's messages (NOTE [ Worker protocol ] in :mod:`naiad.parallel.protocol`), and replaces a
worker that died when the restart budget allows (NOTE [ Worker restarts ] in
:mod:`naiad.parallel.restart`). The pool keeps the passes: which task goes where, and the order
results are delivered in (:mod:`naiad.parallel.passes`).

Worker starts, retirements and restarts go to the ``naiad.workers`` logger: starts and
retirements at INFO, a restart (a worker died) at WARNING.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Final

from naiad.errors import WorkerError
from naiad.parallel.backend import ProcessBackend
from naiad.parallel.protocol import ANSWERS, Kind, Message, Seq, TaskKey, add_note, add_seconds
from naiad.parallel.restart import (
    DEATHS_PER_TASK,
    RestartBudget,
    TaskLedger,
    death_error,
    doing_words,
    ended_words,
    repeated_death_error,
)
from naiad.parallel.thread_backend import ThreadBackend

__all__ = ["INLINE", "Done", "Pending", "WorkerSet"]

INLINE: Final = -1
"""The worker id of a task run in the calling thread (what ``on_deliver`` is told inline)."""

Pending = dict[Seq, tuple[int, Any]]  # seq -> (worker, payload) of a pass, in submit order
Done = dict[Seq, tuple[Kind, Any]]  # seq -> (kind, value) received and not yet delivered
Backend = ProcessBackend | ThreadBackend

_LOG = logging.getLogger("naiad.workers")


class WorkerSet:
    """A pool's workers by id, what each owes, and what becomes of them.

    Attributes:
        active: workers that take new tasks, in round-robin order.
        retiring: out of the rotation, still owing results.
        ready: workers that built their handler.
        stale: sequence numbers of abandoned passes, still owed by workers.
        parked: results received for a pass other than the one that waited, until that pass
            takes them (NOTE [ Passes sharing a pool ] in :mod:`naiad.parallel.pool`).
        restarts: the restart budget (NOTE [ Worker restarts ]).
        stage_seconds: time the workers reported per stage.
        task_seconds: a running mean of a task's time in its worker (None before the first).
        walk_payload: while workers walk their own iterators, the payload of worker ``w``'s next task.
    """

    def __init__(
        self, make_backend: Callable[[], Backend], *, process: bool, describe: Callable[[Any], str],
        restarts: RestartBudget | None,
    ) -> None:
        self._make_backend = make_backend
        self._mode = "process" if process else "thread"
        self._describe = describe
        self.backend: Backend | None = None
        self.active: list[int] = []
        self.retiring: set[int] = set()
        self.ready: set[int] = set()
        self.stale: set[int] = set()
        self.parked: Done = {}
        self.ledger = TaskLedger()
        self.restarts = restarts if restarts is not None else RestartBudget(0)
        self.stage_seconds: dict[str, float] = {}
        self.task_seconds: float | None = None
        self.seq = itertools.count()  # unique for the pool's lifetime (NOTE [ Worker protocol ])
        self.walk_payload: Callable[[int], Any] | None = None
        self._started_with: dict[int, int] = {}  # the worker count each worker started with

    def ensure_backend(self) -> Backend:
        """The backend, made at the first need."""
        if self.backend is None:
            self.backend = self._make_backend()
        return self.backend

    def _start(self, w: int, num_workers: int) -> None:
        """Start worker ``w`` of ``num_workers`` (again, after a death: the same context)."""
        backend = self.ensure_backend()
        self.ready.discard(w)
        backend.start(w, num_workers)
        self._started_with[w] = num_workers
        _LOG.info("worker %d: started, pid %s, %s mode", w, backend.pid(w), self._mode)

    def grow(self, target: int) -> None:
        """Bring the active workers up to ``target``: retiring ones first, then new ones."""
        while len(self.active) < target:
            w = min(set(range(target + len(self.retiring) + 1)) - set(self.active))
            if w in self.retiring:  # still running and owing: back into the rotation
                self.retiring.discard(w)
            else:
                self._start(w, target)
                self.ledger.take(w)
            self.active.append(w)
        self.active.sort()

    def shrink(self, target: int) -> None:
        """Take workers out of the rotation down to ``target``; they leave once they owe nothing."""
        self.retiring.update(self.active[target:])
        del self.active[target:]
        self.reap()

    def reap(self) -> None:
        """Retiring workers that owe nothing may go (NOTE [ Resizing ])."""
        for w in sorted(self.retiring):
            if self.ledger.owed(w) == 0 and self.backend is not None:
                self.backend.stop(w)
                self.retiring.discard(w)

    def least_busy(self, workers: list[int]) -> int:
        """The worker with the fewest tasks in hand (the first on a tie): out of order, work
        flows around a slow task instead of queueing behind it, as torch's in_order=False."""
        return min(workers, key=self.ledger.owed)

    def pids(self) -> list[int | None]:
        """Process ids of the active workers (the main process's for threads; empty inline)."""
        if self.backend is None:
            return []
        return [self.backend.pid(w) for w in self.active]

    def send(self, w: int, seq: int, payload: Any, key: TaskKey) -> None:
        """Send worker ``w`` a task (raises the WorkerError of a worker known dead)."""
        self.send_tasks(w, [(seq, payload, key)])

    def send_tasks(self, w: int, tasks: list[tuple[int, Any, TaskKey]]) -> None:
        """Send worker ``w`` tasks, several in one message (a bundle: NOTE [ Task bundles ] in
        :mod:`naiad.parallel.passes`; process workers only); raises as :meth:`send`."""
        backend = self.ensure_backend()
        if w in backend.dead:
            raise self.death_error(w, None, [])
        if len(tasks) == 1:
            backend.submit(w, *tasks[0])
        else:
            assert isinstance(backend, ProcessBackend)
            backend.submit_bundle(w, tasks)
        for seq, payload, key in tasks:
            self.ledger.sent(w, seq, payload, key)

    @property
    def takes_bundles(self) -> bool:
        """Whether tasks may go out in bundles: process workers, where a message costs more than
        a small task (NOTE [ Task bundles ] in :mod:`naiad.parallel.passes`)."""
        return isinstance(self.ensure_backend(), ProcessBackend)

    def start_walk(self, key: TaskKey, payload_for: Callable[[int], Any]) -> None:
        """Workers walk their own iterators in pass ``key``: a restarted one walks again to where
        it was (NOTE [ Worker restarts ]), and the pool cannot resize until the walk ends."""
        self.walk_payload = payload_for
        self.ledger.start_walk(key)

    def end_walk(self, key: TaskKey) -> None:
        """The walk of pass ``key`` ended (unless a later walk has taken its place already)."""
        if self.ledger.walk_key == key:
            self.walk_payload = None
            self.ledger.start_walk(None)

    @property
    def walking(self) -> bool:
        """Whether workers walk their own iterators now (:meth:`start_walk`)."""
        return self.ledger.walk_key is not None

    def receive(self, messages: list[Message], pending: Pending, done: Done) -> bool:
        """Take the backend's messages in (answers to ``pending``'s tasks into ``done``); whether one came."""
        got = False
        for w, kind, seq, value, stages in messages:
            if kind in ANSWERS:
                got = self._file_answer(w, kind, seq, value, stages, pending, done) or got
            else:
                self._on_news(w, kind, value, pending, done)
        return got

    def _file_answer(
        self, w: int, kind: Kind, seq: Seq, value: Any, stages: dict[str, float], pending: Pending, done: Done,
    ) -> bool:
        """Note a task's answer and put it where it belongs: into ``done`` (whether it went
        there), dropped (an abandoned pass's), or parked for another live pass."""
        self.ledger.answered(w, seq)
        add_seconds(self.stage_seconds, stages)
        took = stages.get("worker")
        if took is not None:
            # Quick to follow: a worker's first tasks pay its start-up (slots made, pages faulted).
            self.task_seconds = took if self.task_seconds is None else 0.75 * self.task_seconds + 0.25 * took
        if seq in self.stale:
            self.stale.discard(seq)
            return False
        if seq in pending:
            done[seq] = (kind, value)
            return True
        self.parked[seq] = (kind, value)  # another live pass's (NOTE [ Passes sharing a pool ])
        return False

    def _on_news(self, w: int, kind: Kind, value: Any, pending: Pending, done: Done) -> None:
        """What a message about worker ``w`` itself, not about a task, means."""
        if kind is Kind.READY:
            self.ready.add(w)
        elif kind is Kind.RETIRED:
            _LOG.info("worker %d: retired, exit code %s", w, value)
        elif kind is Kind.DIED:
            self.on_death(w, value, pending, done)
        elif kind is Kind.START_FAILED:  # it could not build its handler
            exc = value.rebuild()
            add_note(exc, f"naiad: raised in worker {w} while starting (worker_init_fn or dataset set-up)")
            raise exc
        else:  # Kind.UNREADABLE: the exception that says why
            add_note(value, f"naiad: raised receiving a message from worker {w}")
            raise value

    def adopt(self, pending: Pending, done: Done) -> bool:
        """Move the results parked for ``pending``'s pass into ``done``; whether there were any."""
        mine = [seq for seq in self.parked if seq in pending]
        for seq in mine:
            done[seq] = self.parked.pop(seq)
        return bool(mine)

    def abandon(self, pending: Pending, done: Done) -> None:
        """A pass ends with results owed: drop those parked, and those still to come on arrival."""
        for seq, (w, _) in pending.items():
            if seq in done or w == INLINE:
                continue
            if self.parked.pop(seq, None) is None:
                self.stale.add(seq)

    def check_alive(self, pending: Pending, done: Done) -> None:
        """Raise the WorkerError of a dead worker that owes ``pending``'s pass a result: it died
        while another pass was receiving and was not replaced (NOTE [ Passes sharing a pool ])."""
        backend = self.backend
        if backend is None or not backend.dead:
            return
        for seq, (w, _) in pending.items():
            if seq not in done and w in backend.dead:
                raise self.death_error(w, backend.exitcode(w), _held(w, pending, done, backend.running(w)))

    def death_error(self, w: int, exitcode: int | None, held: list[Any]) -> WorkerError:
        """The WorkerError of worker ``w``'s death, ``held`` the payloads of the tasks it owed."""
        starting = w not in self.ready
        doing = doing_words(self._describe, held, starting)
        pid = self.backend.pid(w) if self.backend is not None else None
        return death_error(w, pid, exitcode, doing, starting=starting, process=self._mode == "process",
                           budget=self.restarts)

    def on_death(self, w: int, exitcode: int | None, pending: Pending, done: Done) -> None:
        """Start worker ``w`` again and send it what it owed, or raise why not (NOTE [ Worker restarts ])."""
        backend = self.ensure_backend()
        owed = self._owed_by(w, done)
        if self.restarts.limit and w not in self.active and w not in self.retiring and not owed:
            _LOG.info("worker %d: %s after it was taken out, owing nothing; not replaced", w, ended_words(exitcode))
            return
        running = backend.running(w)
        if not self.restarts.left:
            raise self.death_error(w, exitcode, _held(w, pending, done, running))
        starting = w not in self.ready
        # The task it died on: the one it began last (of a bundle, not always the first owed).
        first = next((t for t in owed if t[0] == running), owed[0] if owed else None)
        doing = doing_words(self._describe, [first[1]] if first is not None else [], starting)
        pid = backend.pid(w)
        if first is not None and not starting:
            deaths = self.ledger.charge(first[0])
            if deaths >= DEATHS_PER_TASK:
                raise repeated_death_error(w, pid, exitcode, doing, deaths)
        epoch = first[2][1] if first is not None else None
        self.restarts.spend({"worker": w, "pid": pid, "exitcode": exitcode, "task": doing, "epoch": epoch})
        _LOG.warning("worker %d (pid %s) %s %s; started again, %d of max_worker_restarts=%d left",
                     w, pid, ended_words(exitcode), doing, self.restarts.left, self.restarts.limit)
        self._start(w, self._started_with.get(w, len(self.active)))
        self._replay_walk(w)
        for seq, payload, key in owed:
            self.send(w, seq, payload, key)

    def _owed_by(self, w: int, done: Done) -> list[tuple[Seq, Any, TaskKey]]:
        """What dead worker ``w`` owes that a new one must answer: an abandoned pass's tasks (and
        a walk's replayed ones) are dropped; every live pass's are kept, this pass's and any
        other's (NOTE [ Passes sharing a pool ])."""
        owed = self.ledger.take(w)
        abandoned = {seq for seq, _, _ in owed if seq in self.stale}
        self.stale.difference_update(abandoned)
        return [t for t in owed if t[0] not in abandoned and t[0] not in done and t[0] not in self.parked]

    def _replay_walk(self, w: int) -> None:
        """A restarted worker walks its iterator again to where the dead one was, its results dropped."""
        walk_key = self.ledger.walk_key
        if walk_key is None or self.walk_payload is None:
            return
        for _ in range(self.ledger.walked(w)):
            seq = next(self.seq)
            self.stale.add(seq)
            self.send(w, seq, self.walk_payload(w), walk_key)

    def close(self) -> None:
        """Stop the workers: ask, wait, then terminate and kill."""
        if self.backend is not None:
            self.backend.close()


def _held(w: int, pending: Pending, done: Done, running: int | None = None) -> list[Any]:
    """The payloads of ``pending``'s tasks that worker ``w`` has not answered, in the order sent,
    but the one it ran (``running``) first."""
    held = [(seq, payload) for seq, (v, payload) in pending.items() if v == w and seq not in done]
    held.sort(key=lambda task: task[0] != running)  # stable: the rest stay in the order sent
    return [payload for _, payload in held]
