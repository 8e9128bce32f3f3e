"""The messages between a WorkerPool and its workers: what crosses each way, and how.

NOTE [ Worker protocol ]
Each worker has a task channel (main -> worker) and a result channel (worker -> main): for a
process worker, the two directions of one socket pair; for a thread worker, two queues.

A task is a :data:`Task`, ``(seq, payload, key)``. ``seq`` comes from the pool's one counter
(``WorkerSet.seq``), so it is unique for the pool's life: a result that belongs to an abandoned
pass (a ``break``) is recognised and dropped. ``key`` is the task's :data:`TaskKey`, ``(pass id,
epoch)``, or ``(pass id, epoch, the task's own seed keys)``: at the first task of each pass, and
at every task with its own seed keys, a worker starts its generators afresh (NOTE [ Worker
randomness ] in :mod:`naiad.parallel.context`). :data:`STOP` instead of a task asks the worker to return
once the tasks before it are answered. A worker answers every task with exactly one
:data:`Reply`, ``(kind, seq, value, stage_seconds)``, in the order it was sent its tasks:

    (Kind.OK, seq, result, stage_seconds)    the handler returned
    (Kind.EXHAUSTED, seq, None, {})          the handler raised Exhausted (an iterable ran out)
    (Kind.ERROR, seq, RemoteError, {})       the handler raised; re-raised in the consumer, and
                                             the iteration goes on with the next task (as torch's)

and, before any of them, one start-up message about no task (``seq`` is :data:`NO_TASK`):
``(Kind.READY, NO_TASK, None, {})`` once it built its handler, or ``(Kind.START_FAILED, NO_TASK,
RemoteError, {})`` when ``prepare``, ``worker_init_fn`` or the factory raised, after which it
returns. A backend hands the pool each worker's messages as :data:`Message`, ``(worker_id,
kind, seq, value, stage_seconds)``, and adds its own news of a worker, also about no task:
``Kind.RETIRED`` (it ended after it was asked to return: with exit code 0, or ended by naiad
when asking failed; the value is its exit code), ``Kind.DIED`` (any other end; its exit code)
and ``Kind.UNREADABLE`` (a message from it could not be received here; the value is the
exception that says why, raised in the consumer: it ends the pass).

A process worker may be sent a *bundle*, a list of tasks in one message (NOTE [ Task bundles ]
in :mod:`naiad.parallel.passes`); it runs them in turn and answers with the list of their
replies in one message, each reply the one the task would have had alone.

On the wire a process worker sends a kind as its number (:func:`to_wire`), which the backend
turns back into the :class:`Kind` (:func:`from_wire`): an Enum member pickles as a reference to
its class, a few microseconds a message on each side, where a small int costs what the short
strings that named the kinds before did; a number that names no kind is a WorkerError naming
it. Thread workers put their messages on a queue as they are. The rest of a message is plain
tuples, ints and dicts.

The main process waits on the workers' sockets *and* the process sentinels together
(``select.poll``), so a worker that dies is seen at once, not after a
timeout; its buffered results are drained first, then a WorkerError names the worker, its exit
code and the task it held, or, within a restart budget, the worker is replaced and sent again
the tasks it owed (NOTE [ Worker restarts ] in :mod:`naiad.parallel.restart`). A failed task
fails only itself (NOTE [ A failed task ] in :mod:`naiad.parallel.results`). A process worker's
tasks and results share one socket pair; the main process writes tasks without ever blocking
(NOTE [ Task channel ] in :mod:`naiad.parallel.channel`), so it never waits on a full socket
while a worker waits on sending it a result. Results' arrays cross through the worker's batch
slots (NOTE [ Batch transport ]); a worker's new slot is announced with a :attr:`Kind.SLOT`
message before the result that first uses it. :class:`~naiad.parallel.workers.WorkerSet` keeps the workers
and what each owes; a :class:`~naiad.parallel.passes.PoolPass` keeps one pass's tasks and the
order of their delivery.
"""

from __future__ import annotations

import enum
import pickle
import traceback
from typing import Any, Final

from naiad.errors import WorkerError, add_note

__all__ = [
    "ANSWERS",
    "ERROR",
    "EXHAUSTED",
    "NO_TASK",
    "OK",
    "STOP",
    "Exhausted",
    "Kind",
    "Message",
    "RemoteError",
    "Reply",
    "Seq",
    "Task",
    "TaskKey",
    "Wire",
    "add_note",
    "add_seconds",
    "from_wire",
    "task_entropy",
    "to_wire",
]


class Kind(enum.Enum):
    """What a message from (or about) a worker says (NOTE [ Worker protocol ]).

    The value is the number that stands for the kind on the wire (:func:`to_wire`).
    """

    OK = 0
    """A task's result: the value is the handler's return value."""
    EXHAUSTED = 1
    """The handler raised :class:`Exhausted`: the worker's iterable ran out (no value)."""
    ERROR = 2
    """The handler raised: a :class:`RemoteError` (inline, the exception itself)."""
    READY = 3
    """The worker built its handler and takes tasks (about no task)."""
    START_FAILED = 4
    """The worker could not build its handler: a :class:`RemoteError` (about no task)."""
    RETIRED = 5
    """The backend's: the worker ended after it was asked to return; the value is its exit code."""
    DIED = 6
    """The backend's: the worker ended any other way (a death); the value is its exit code."""
    UNREADABLE = 7
    """The backend's: a message from the worker could not be received: the exception saying why."""
    SLOT = 8
    """The transport's, about no task: the worker made a shared-memory slot, ``(token, index,
    size)``; its descriptor follows on the channel. The backend takes it; the pool never sees
    it (NOTE [ Batch transport ])."""

    # Members are singletons (unpickling and from_wire give back the same object), so identity
    # is their equality; Enum's own __hash__ is a Python-level call, and the pool asks per message.
    __hash__ = object.__hash__


# Before Python 3.12 an Enum's metaclass has a __getattr__, which makes each ``Kind.OK`` a
# Python-level call (60 ns on 3.11); the paths that run per task read these instead.
OK: Final = Kind.OK
EXHAUSTED: Final = Kind.EXHAUSTED
ERROR: Final = Kind.ERROR

ANSWERS: Final[frozenset[Kind]] = frozenset({Kind.OK, Kind.EXHAUSTED, Kind.ERROR})
"""The kinds that answer a task (their ``seq`` is the task's); the others are about no task."""

Seq = int
"""A task's sequence number, >= 0: unique for the pool's life (NOTE [ Worker protocol ])."""

NO_TASK: Final[Seq] = -1
"""The ``seq`` of a message about no task: a worker's start-up message, and the backend's
news of a worker (how it ended, a message from it that could not be received)."""

TaskKey = tuple[int, int] | tuple[int, int, tuple[int, ...]]
"""``(pass id, epoch)``, or ``(pass id, epoch, the task's own seed keys)``: what a worker
reseeds from (NOTE [ Worker randomness ])."""

Task = tuple[Seq, Any, TaskKey]
"""``(seq, payload, key)``: one task, main process to worker."""

STOP: Final = None
"""Sent instead of a task: return once the tasks before it are answered."""

Reply = tuple[Kind, Seq, Any, dict[str, float]]
"""``(kind, seq, value, stage_seconds)``: a worker's message, in the worker."""

Wire = tuple[int, Seq, Any, dict[str, float]]
"""A :data:`Reply` as it crosses a process's socket: the kind as its number."""

Message = tuple[int, Kind, Seq, Any, dict[str, float]]
"""``(worker_id, kind, seq, value, stage_seconds)``: a message as a backend hands it to the pool."""

_BY_NUMBER: Final[dict[int, Kind]] = {kind.value: kind for kind in Kind}


def task_entropy(key: TaskKey) -> tuple[int, ...] | None:
    """The task's own seed keys, or None for a task that draws from its pass's sequence."""
    return key[2] if len(key) > 2 else None


def to_wire(reply: Reply) -> Wire:
    """``reply`` as it crosses a socket: the kind as its number (NOTE [ Worker protocol ])."""
    kind, seq, value, stages = reply
    return kind._value_, seq, value, stages  # ``.value`` is a Python-level property: per task


def from_wire(worker_id: int, wire: Wire) -> Message:
    """The :data:`Message` of worker ``worker_id`` that crossed its socket as ``wire``."""
    number, seq, value, stages = wire
    try:
        return worker_id, _BY_NUMBER[number], seq, value, stages
    except (KeyError, TypeError):
        raise _unknown_kind(number) from None


def _unknown_kind(number: object) -> WorkerError:
    known = ", ".join(f"{kind.value} ({kind.name})" for kind in Kind)
    return WorkerError(
        f"naiad: a worker sent a message of unknown kind {number!r}; the kinds are {known}. "
        "A worker runs the training process's naiad, so this is a bug in naiad: please report it."
    )


def add_seconds(total: dict[str, float], stages: dict[str, float]) -> None:
    """Add a reply's stage seconds into a running total."""
    for stage, seconds in stages.items():
        total[stage] = total.get(stage, 0.0) + seconds


class Exhausted(Exception):
    """Raised by a handler to say this worker has nothing more to give (an iterable ran out)."""


class RemoteError:
    """An exception raised in a worker, carried to the consumer with its type, message and traceback.

    NOTE [ Tracebacks cross processes only ]
    A thread worker's exception stays the object itself, its traceback the frames it ran: it is
    put into words (and its object into bytes) only when it is pickled to cross from a process
    worker. Besides saving the work, a thread must never format a traceback: on Python 3.11,
    ``traceback.format_exception`` calls ``ast.parse`` to place its carets, and up to 3.11.7 the
    parser's depth counter is one per interpreter (CPython gh-106905), so a parse in a worker
    thread beside one in the training thread (pytest's import of a module, a compiler's reading
    of source) raised ``SystemError: AST constructor recursion depth mismatch`` in the training
    thread.
    """

    def __init__(self, exc: BaseException) -> None:
        self._exc: BaseException | None = exc  # None once it crossed from another process
        self.type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.message = str(exc)
        self.tb = ""
        self.payload: bytes | None = None

    def __getstate__(self) -> dict[str, Any]:
        exc = self._exc
        state = {"type_name": self.type_name, "message": self.message, "tb": self.tb, "payload": self.payload}
        if exc is not None:  # pickled in the worker's process: its one chance to say what happened
            state["tb"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            try:
                # Most exceptions pickle; keeping the object keeps its type, args, notes and attributes.
                state["payload"] = pickle.dumps(exc)
            except Exception:
                state["payload"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._exc = None
        self.type_name, self.message = state["type_name"], state["message"]
        self.tb, self.payload = state["tb"], state["payload"]

    def rebuild(self) -> BaseException:
        """The exception to raise in the consumer (the same type whenever it can be rebuilt; a
        thread worker's, the object itself with its own traceback)."""
        if self._exc is not None:
            return self._exc
        exc: BaseException | None = None
        if self.payload is not None:
            try:
                exc = pickle.loads(self.payload)  # our own worker's bytes, never user input
            except Exception:
                exc = None
        if exc is None:
            exc = RuntimeError(f"{self.type_name}: {self.message}")
        add_note(exc, "Traceback in the worker:\n" + self.tb.rstrip())
        return exc
