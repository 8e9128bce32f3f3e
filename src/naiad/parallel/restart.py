"""Worker restarts: the tasks each worker owes, the restart budget, and the errors of a death.

NOTE [ Worker restarts ]
With a restart budget (``naiad.DataLoader(max_worker_restarts=N)``) a process worker that dies
(SIGKILL, the OOM killer, a segfault, ``os._exit``) is replaced, at most N times over the
budget's life, and the pass delivers exactly the results of an uninterrupted one, in the same
order. That holds because a task is pure: the plan, in the main process, decides every task,
and a task's random draws come from its own seed sequence or from its pass's (NOTE [ Worker
randomness ]), never from what the worker did before it.

* The pool notes, per worker, the tasks sent and not yet answered, in the order sent
  (:class:`TaskLedger`). A worker answers its tasks in that order, so at its death the first
  one it owes is the one it was running; the others were waiting in its queue. What it sent
  before dying is received first (the backend drains its pipe before reporting the death).
* The worker is started again under the same id (the same ``WorkerContext``, so
  ``get_worker_info()`` answers the same) and is sent the tasks it owed, with the same sequence
  numbers and keys, so ordered delivery waits for them as it waited before. Tasks of an
  abandoned pass are dropped instead.
* A worker that walks its own iterator (an IterableDataset) holds a position: the number of
  results it gave in the walk. The new worker first walks that many again, their results
  dropped, then the tasks owed. The replay is exact when the iterator depends only on the
  worker (its id, seed, ``get_worker_info()``) and the epoch, as torch's per-worker split does.
* Each death spends one restart of the :class:`RestartBudget`, which a loader shares between
  the pools it makes. With none left the death is a WorkerError, as without restarts. A task
  that was running at two deaths is not sent a third time: a task that ends its worker every
  time would spend the budget for nothing, so the WorkerError names it. A worker that dies
  while starting charges no task.
* Thread workers do not die on their own (an exception fails its task only) and inline there
  is no worker, so restarts concern process workers.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from naiad.errors import WorkerError
from naiad.parallel.protocol import TaskKey

__all__ = [
    "DEATHS_PER_TASK", "MAX_LOG", "RestartBudget", "TaskLedger", "death_error", "doing_words", "ended_words",
    "repeated_death_error",
]

MAX_LOG = 100
"""Restarts described one by one in :meth:`RestartBudget.stats`; later ones are only counted."""

DEATHS_PER_TASK = 2
"""A task running at this many deaths is reported instead of being sent again."""


class RestartBudget:
    """How many worker restarts are allowed, and the ones done; shared by a loader's pools.

    Attributes:
        limit: restarts allowed in all (0: a death is a WorkerError at once).
        count: restarts done.
        log: one dict per restart (the first :data:`MAX_LOG`): ``worker``, ``pid``,
            ``exitcode`` (negative: the signal), ``task`` (what it was doing, in words), ``epoch``.
    """

    def __init__(self, limit: int = 0) -> None:
        self.limit = int(limit)
        self.count = 0
        self.log: list[dict[str, Any]] = []

    @property
    def left(self) -> int:
        """Restarts still allowed."""
        return max(0, self.limit - self.count)

    def spend(self, entry: dict[str, Any]) -> None:
        """Count one restart, described by ``entry``."""
        self.count += 1
        if len(self.log) < MAX_LOG:
            self.log.append(entry)

    def stats(self) -> dict[str, Any]:
        """``{"max_restarts", "restarts", "restart_log"}`` as plain values."""
        return {"max_restarts": self.limit, "restarts": self.count, "restart_log": [dict(e) for e in self.log]}


Sent = tuple[int, Any, TaskKey]  # (seq, payload, key) of one task sent to a worker


class TaskLedger:
    """The tasks each worker owes, in the order sent, and what a restart must replay."""

    def __init__(self) -> None:
        self._owed: dict[int, dict[int, tuple[Any, TaskKey]]] = {}
        self._walk_key: TaskKey | None = None
        self._walked: dict[int, int] = {}  # results each worker gave in the walk in progress
        self._deaths: dict[int, int] = {}  # seq -> deaths while it was running

    def owed(self, w: int) -> int:
        """How many tasks worker ``w`` has not answered."""
        return len(self._owed.get(w, ()))

    def sent(self, w: int, seq: int, payload: Any, key: TaskKey) -> None:
        """Note a task sent to worker ``w``."""
        self._owed.setdefault(w, {})[seq] = (payload, key)

    def answered(self, w: int, seq: int) -> None:
        """Note worker ``w``'s answer to task ``seq``."""
        entry = self._owed.get(w, {}).pop(seq, None)
        if entry is not None and self._walk_key is not None and entry[1][:2] == self._walk_key[:2]:
            self._walked[w] = self._walked.get(w, 0) + 1

    def take(self, w: int) -> list[Sent]:
        """Everything worker ``w`` owes, in the order sent, now owed by nobody."""
        owed = self._owed.pop(w, {})
        return [(seq, payload, key) for seq, (payload, key) in owed.items()]

    def start_walk(self, key: TaskKey | None) -> None:
        """Count each worker's results from now on (``key`` is the walk's pass), or stop (None)."""
        self._walk_key = key
        self._walked = {}

    @property
    def walk_key(self) -> TaskKey | None:
        """The pass of the walk in progress (None: no walk)."""
        return self._walk_key

    def walked(self, w: int) -> int:
        """Results worker ``w`` gave in the walk in progress; its count starts again at 0."""
        return self._walked.pop(w, 0) if self._walk_key is not None else 0

    def charge(self, seq: int) -> int:
        """One more death while task ``seq`` ran; how many in all."""
        self._deaths[seq] = self._deaths.get(seq, 0) + 1
        return self._deaths[seq]


def ended_words(exitcode: int | None) -> str:
    """How a worker ended, in naiad's words: ``"killed by signal SIGKILL"``, ``"exited with code 3"``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _how(pid: int | None, exitcode: int | None) -> tuple[str, str]:
    """(torch's words, naiad's words) for how a worker ended."""
    if exitcode is None or exitcode >= 0:
        return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}. ", ended_words(exitcode)
    try:
        signal.Signals(-exitcode)  # a number Python has no signal for is given as the number
        described = signal.strsignal(-exitcode) or str(-exitcode)
    except ValueError:
        described = str(-exitcode)
    return f"DataLoader worker (pid {pid}) is killed by signal: {described}. ", ended_words(exitcode)


def death_error(
    w: int, pid: int | None, exitcode: int | None, doing: str, *, starting: bool, process: bool,
    budget: RestartBudget | None = None,
) -> WorkerError:
    """The WorkerError for a worker that died ``doing`` (``"while loading batch 5 ..."``)."""
    # torch's words first (code that matches "DataLoader worker (pid" keeps working), then naiad's.
    torch_words, how = _how(pid, exitcode)
    hint = ""
    if exitcode == -signal.SIGKILL:
        hint = " (SIGKILL often means the out-of-memory killer: fewer workers or smaller batches use less memory)"
    elif starting and process:
        hint = (
            " (under the spawn or forkserver start method this is often "
            "the dataset or a function failing to unpickle in the worker, such as a class "
            "defined in an interactive __main__; the worker's stderr says why)"
        )
    spent = ""
    if budget is not None and budget.limit > 0:
        spent = f"; the worker restarts allowed were all used (max_worker_restarts={budget.limit})"
    return WorkerError(
        f"{torch_words}naiad worker {w} (pid {pid}) {how} {doing}{hint}{spent}.",
        worker_id=w,
        exitcode=exitcode,
        task=doing,
    )


def repeated_death_error(w: int, pid: int | None, exitcode: int | None, doing: str, deaths: int) -> WorkerError:
    """The WorkerError for a task that was running at ``deaths`` deaths of its worker."""
    torch_words, how = _how(pid, exitcode)
    return WorkerError(
        f"{torch_words}naiad worker {w} (pid {pid}) {how} {doing}, the task it was running at "
        f"{deaths} deaths: it ends its worker every time, so it is not sent again; find what in "
        "that data ends the process (a native crash, memory, os._exit).",
        worker_id=w,
        exitcode=exitcode,
        task=doing,
    )


def doing_words(describe: Callable[[Any], str], held: list[Any], starting: bool) -> str:
    """What a worker was doing, in words: ``"while loading ..."`` (the first payload ``held``),
    ``"while starting"`` or ``"while idle"``."""
    if starting:  # it never built its handler: whatever it was sent, it did not begin it
        return "while starting"
    return f"while loading {describe(held[0])}" if held else "while idle"
