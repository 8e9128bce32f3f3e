"""The reads a resumed stream makes before it goes on with its plan, and where their rows go.

NOTE [ Owed rows first ]
A stream resumed mid-epoch (NOTE [ Mid-epoch resume ] in stream.py) reads again two sets of
rows: those still owed to batches by the exchange in progress (up to one chunk, a quarter of
the buffer with read groups) and those the buffer held (all of it). The next batches are cut from
the owed rows alone, and the held rows are needed only when the next chunk arrives, to be
exchanged. So the owed rows are read first, in a few small tasks, and leave as batches at once;
the held rows follow in their own tasks, which the workers (or read-ahead threads) parse while
those batches are consumed, and are put back in their slots before the next chunk is pushed.
Nothing changes in what is emitted or in which order: only when each read happens. (A resume
whose owed rows do not fill the next batch waits for the held rows too, as before; that is a
position near the end of an exchange.)

A CSV resume spends most of its reading on the scan of the blocks for their lines, whatever the
number of rows picked from them; the owed rows come from nearly every block the held rows come
from, so splitting the owed reads in several tasks is what lets the workers scan side by side.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from naiad.plan import RankPlan, ReadTask, RestoreTask, Task
from naiad.shuffle import BufferReplay, ShuffleBuffer
from naiad.sources.base import concat_columns

__all__ = ["OWED_PIECES", "Restoring", "split_even", "split_reads"]

OWED_PIECES = 4
"""Tasks the owed rows are read in (side by side: their cost is the scan of many blocks)."""


def split_reads(reads: Sequence[ReadTask], max_rows: int) -> list[list[ReadTask]]:
    """``reads`` cut into consecutive runs of about ``max_rows`` rows (each read whole)."""
    out: list[list[ReadTask]] = []
    rows = 0
    for r in reads:
        if not out or rows + r.rows > max_rows:
            out.append([])
            rows = 0
        out[-1].append(r)
        rows += r.rows
    return out


def split_even(reads: Sequence[ReadTask], pieces: int) -> list[list[ReadTask]]:
    """``reads`` cut into at most ``pieces`` consecutive runs of about as many rows each."""
    rows = np.cumsum([r.rows for r in reads])
    if not len(rows):
        return []
    piece = (rows - 1) * pieces // max(int(rows[-1]), 1)  # the piece each read ends in
    cuts = (np.flatnonzero(np.diff(piece)) + 1).tolist()
    return [list(reads[a:b]) for a, b in zip([0, *cuts], [*cuts, len(reads)])]


class Restoring:
    """The tasks of a resumed stream's pass (NOTE [ Owed rows first ]): the reads of its owed
    rows, of its held rows, then the plan's from where it stood; and what each of the restoring
    results becomes.

    Args:
        plan: the stream's plan.
        replay: where the stream stands (:meth:`BufferReplay.replay`).
        max_rows: rows per task of held rows (the plan's read group size).
    """

    def __init__(self, plan: RankPlan, replay: BufferReplay, max_rows: int) -> None:
        self.plan = plan
        self.replay = replay
        self.max_rows = max_rows
        self.owed_tasks = [RestoreTask(tuple(p)) for p in split_even(replay.owed_reads, OWED_PIECES)]
        self.held_tasks: list[RestoreTask] | None = None  # worked out when the tasks reach them
        self.issued: list[Task | RestoreTask] = []  # the tasks handed out so far, in order
        self._pieces: list[dict[str, np.ndarray]] = []

    def tasks(self) -> Iterator[Task | RestoreTask]:
        """Every task of the pass, in order. The held rows' reads are worked out when the first
        of them is asked for: by then the owed rows' reads are under way."""
        for task in self._tasks():
            self.issued.append(task)
            yield task

    def _tasks(self) -> Iterator[Task | RestoreTask]:
        yield from self.owed_tasks
        self.held_tasks = [RestoreTask(tuple(p)) for p in split_reads(self.replay.held_reads, self.max_rows)]
        yield from self.held_tasks
        if self.replay.remainder is not None:
            yield self.replay.remainder
        yield from self.plan.tasks[self.replay.next_task :]

    def restores(self, i: int) -> bool:
        """Whether result ``i`` is one of the restoring reads' (its task has been handed out)."""
        owed = len(self.owed_tasks)
        return i < owed or (self.held_tasks is not None and i < owed + len(self.held_tasks))

    def take(self, i: int, arrays: dict[str, np.ndarray], buffer: ShuffleBuffer | None) -> dict[str, Any]:
        """Result ``i`` of the restoring reads: the owed rows, in order, once all of them have
        come (else nothing); the held rows go to ``buffer`` once all of them have come."""
        self._pieces.append(arrays)
        owed = len(self.owed_tasks)
        last = owed - 1 if i < owed else owed + len(self.held_tasks or ()) - 1
        if i < last:
            return {}
        joined = self._pieces[0] if len(self._pieces) == 1 else concat_columns(self._pieces)
        self._pieces = []
        columns: dict[str, np.ndarray] = joined  # type: ignore[assignment]  # array columns stay arrays
        if i < owed:
            return self.replay.owed_rows(columns)
        self.replay.install(buffer, columns)
        return {}
