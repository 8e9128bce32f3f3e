"""The reads a resumed stream makes before it goes on with its plan, and where their rows go.

NOTE [ Owed rows first ]
A stream resumed mid-epoch (NOTE [ Mid-epoch resume ] in stream.py) reads again two sets of
rows: those still owed to batches by the exchange in progress (up to one chunk, a quarter of
the buffer with read groups) and those the buffer held (all of it). The next batches are cut from
the owed rows alone, and the held rows are needed only when the next chunk arrives, to be
exchanged. So the reads come in three steps, each a few tasks the workers (or read-ahead
threads) run side by side: the rows of the first batch, the rest of the owed rows, the held
rows. The first batch leaves once its own rows are in, the others while the held rows are
parsed, and those are put back in their slots before the next chunk is pushed. The held rows'
reads are worked out on a helper thread meanwhile. Nothing changes in what is emitted or in
which order: only when each read happens. (A resume whose owed rows do not fill the next batch
waits for the held rows too: a position near the end of an exchange.)

A CSV resume spends most of its reading on the newline scan of the blocks it picks rows from,
whatever the number of rows: the rows restored from older blocks are few per block. So the
first batch's rows (from fewer blocks than all the owed rows) are read alone, and every step is
cut into tasks of about the same cost, counting each block read (``READ_COST_ROWS``) as well
as the rows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from naiad.errors import StateError
from naiad.parallel.threads import start_beside
from naiad.plan import GroupTask, RankPlan, ReadTask, RestoreTask, Task
from naiad.shuffle import BufferReplay, ShuffleBuffer
from naiad.sources.base import concat_columns

__all__ = ["FIRST_PIECES", "OWED_PIECES", "READ_COST_ROWS", "Restoring", "Window", "split_even", "window"]

FIRST_PIECES = 2
"""Tasks the first batch's rows are read in (side by side: their cost is the scan of many blocks)."""

OWED_PIECES = 4
"""Tasks the other owed rows are read in."""


class Window(NamedTuple):
    """The reads that yield the rows at some stream positions, in ascending position, and where
    each position's row lands among the rows they yield."""

    reads: list[ReadTask]
    at: np.ndarray

    @property
    def rows(self) -> int:
        """Rows the reads yield."""
        return len(self.at)

    def place(self, arrays: dict[str, np.ndarray], lo: int = 0, hi: int | None = None) -> dict[str, np.ndarray]:
        """The rows the reads yielded (one chunk, in their order), in the order of the positions
        (of positions ``lo:hi`` only, when given: each part its own arrays).

        Raises:
            StateError: rows were skipped as bad among them (their positions would shift).
        """
        n = len(next(iter(arrays.values()))) if arrays else 0
        if n != len(self.at):
            raise StateError(
                f"cannot resume mid-epoch exactly: {len(self.at) - n} bad row(s) of {self.reads[0].block.path} "
                "and the other files to restore were skipped; resume at the start of the epoch instead."
            )
        at = self.at[lo:hi]
        return {k: np.take(v, at, axis=0) for k, v in arrays.items()}


def window(replay: BufferReplay, positions: np.ndarray) -> Window:
    """The reads that yield the rows at stream ``positions`` again (some of ``replay.held`` or
    ``replay.owed``, distinct)."""
    tasks, offsets = replay.tasks, replay.offsets
    if not len(positions):
        return Window([], np.zeros(0, np.int64))
    lo, span = int(positions.min()), int(positions.max()) - int(positions.min()) + 1
    if span <= 8 * len(positions):
        # Distinct positions in a short range: sorted by marking them (a pass over the range),
        # not by a comparison sort (a 2 Mi-row buffer's 3 Mi positions: 0.34 s to 0.05 s).
        mark = np.full(span, -1, np.int64)
        mark[positions - lo] = np.arange(len(positions))
        present = np.flatnonzero(mark >= 0)
        order, needed = mark[present], present + lo
    else:
        order = np.argsort(positions)  # distinct: any sort is stable
        needed = positions[order]
    at = np.empty(len(positions), np.int64)
    at[order] = np.arange(len(positions))
    # The plan's reads from the first task needed to the last, laid end to end.
    first = int(np.searchsorted(offsets, needed[0], side="right")) - 1
    last = int(np.searchsorted(offsets, needed[-1], side="right")) - 1
    reads = [r for t in tasks[first : last + 1] for r in (t.reads if isinstance(t, GroupTask) else (t,))]
    starts = int(offsets[first]) + np.concatenate(([0], np.cumsum([r.rows for r in reads])))
    # Only the rows needed are read again, grouped by the read that yields them.
    which = np.searchsorted(starts, needed, side="right") - 1
    cuts = np.flatnonzero(np.diff(which)) + 1
    heads = np.concatenate(([0], cuts))
    rel = needed - starts[which]
    return Window([reads[k].select(r) for k, r in zip(which[heads].tolist(), np.split(rel, cuts))], at)


READ_COST_ROWS = 150
"""What reading a block costs beside its rows, counted in rows: a CSV block's newline scan costs
about as much as parsing 150 of its rows (64 KiB blocks of 2,000 rows)."""


def split_even(reads: Sequence[ReadTask], pieces: int) -> list[list[ReadTask]]:
    """``reads`` cut into at most ``pieces`` consecutive runs of about the same cost (each read
    whole): its rows and :data:`READ_COST_ROWS` per read. Rows restored from older blocks are
    few per block, so the cost is not in proportion to the rows alone."""
    cost = np.cumsum([r.rows + READ_COST_ROWS for r in reads])
    if not len(cost):
        return []
    piece = (cost - 1) * pieces // int(cost[-1])  # the piece each read ends in
    cuts = (np.flatnonzero(np.diff(piece)) + 1).tolist()
    return [list(reads[a:b]) for a, b in zip([0, *cuts], [*cuts, len(reads)])]


class _Step:
    """One step of a restore: a window of rows read again in some tasks, the first ``owed`` of
    which go to the batches and the others to the buffer."""

    def __init__(self, window: Window, tasks: list[RestoreTask], owed: int) -> None:
        self.window = window
        self.tasks = tasks
        self.owed = owed


def _step(replay: BufferReplay, positions: np.ndarray, *, pieces: int = 0, max_cost: int = 0,
          held: bool = False, owed: int | None = None) -> _Step:
    """The reads of ``positions`` (owed rows, else ``held`` ones, else the ``owed`` first of
    them) in ``pieces`` tasks, or in tasks of about ``max_cost`` each."""
    found = window(replay, positions)
    if not pieces:
        pieces = -(-sum(r.rows + READ_COST_ROWS for r in found.reads) // max(max_cost, 1))
    owed = (0 if held else len(positions)) if owed is None else owed
    return _Step(found, [RestoreTask(tuple(p)) for p in split_even(found.reads, pieces)], owed)


class Restoring:
    """The tasks of a resumed stream's pass (NOTE [ Owed rows first ]): the reads of the first
    batch's rows, of the other owed rows and of the held rows, then the plan's from where it
    stood; and what each of the restoring results becomes.

    Args:
        plan: the stream's plan.
        replay: where the stream stands (:meth:`BufferReplay.replay`).
        max_rows: about the cost of a task of held rows, in rows (the plan's read group size).
        first_rows: the rows of the first batch to cut.
        in_steps: read in three steps; else all in one (for blocks decoded whole whatever rows
            are picked: Parquet row groups, Arrow record batches, compressed files).
    """

    def __init__(self, plan: RankPlan, replay: BufferReplay, max_rows: int, first_rows: int, *, in_steps: bool = True) -> None:
        self.plan = plan
        self.replay = replay
        owed = replay.owed
        if not in_steps:  # one step: blocks decoded whole (row groups, compressed files) once
            both = np.concatenate((owed, replay.held))
            self.steps = [_step(replay, both, max_cost=max_rows, owed=len(owed))]
            self._held = start_beside(functools.partial(_step, replay, owed[:0], held=True))
        else:
            # The first batch's rows alone when the owed rows are many more, in two tasks.
            first = first_rows if len(owed) > 2 * first_rows else len(owed)
            self.steps = [_step(replay, owed[:first], pieces=FIRST_PIECES)] if first else []
            if first < len(owed):
                self.steps.append(_step(replay, owed[first:], pieces=OWED_PIECES))
            # The held rows' reads are worked out beside this thread while it hands out the others.
            self._held = start_beside(functools.partial(_step, replay, replay.held, max_cost=max_rows, held=True))
        self._known = sum(len(s.tasks) for s in self.steps)  # restoring tasks known so far
        self.issued: list[Task | RestoreTask] = []  # the tasks handed out so far, in order
        self._step_index = 0
        self._pieces: list[dict[str, np.ndarray]] = []

    @property
    def owed_tasks(self) -> list[RestoreTask]:
        """The tasks that read the owed rows, in order."""
        return [t for s in self.steps if s.owed for t in s.tasks]

    def tasks(self) -> Iterator[Task | RestoreTask]:
        """Every task of the pass, in order."""
        for task in self._tasks():
            self.issued.append(task)
            yield task

    def _tasks(self) -> Iterator[Task | RestoreTask]:
        for step in self.steps:
            yield from step.tasks
        held = self._held()
        self.steps.append(held)
        self._known += len(held.tasks)
        yield from held.tasks
        if self.replay.remainder is not None:
            yield self.replay.remainder
        yield from self.plan.tasks[self.replay.next_task :]

    def restores(self, i: int) -> bool:
        """Whether result ``i`` is one of the restoring reads' (its task has been handed out)."""
        return i < self._known

    def take(self, arrays: dict[str, np.ndarray], buffer: ShuffleBuffer | None) -> dict[str, Any]:
        """The next result of the restoring reads: once a step's results are all in, its rows in
        the order they are owed (else nothing); held rows go to ``buffer``."""
        self._pieces.append(arrays)
        step = self.steps[self._step_index]
        if len(self._pieces) < len(step.tasks):
            return {}
        joined = self._pieces[0] if len(self._pieces) == 1 else concat_columns(self._pieces)
        self._pieces = []
        self._step_index += 1
        if step.owed == step.window.rows:
            return step.window.place(joined)  # type: ignore[arg-type]  # array columns stay arrays
        # Held rows (after the owed ones when a step reads both) go back to the buffer, taken
        # apart from the owed ones so the buffer can keep their arrays as its slots.
        self.replay.install(buffer, step.window.place(joined, step.owed))  # type: ignore[arg-type]
        return step.window.place(joined, 0, step.owed)  # type: ignore[arg-type]
