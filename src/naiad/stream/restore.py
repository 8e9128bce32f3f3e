"""The reads a resumed stream makes before it goes on with its plan, and where their rows go.

NOTE [ Owed rows first ]
A stream resumed mid-epoch (NOTE [ Mid-epoch resume ] in stream.py) reads again two sets of
rows: those still owed to batches by the exchange in progress (up to one chunk, half of
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

Blocks decoded whole whatever rows are picked (Parquet row groups, Arrow record batches,
compressed files) are read once: the blocks that hold any of the first batch's rows first
(every row needed from them, owed or held), then the others. The buffer's rows are geometric in
age, so the first batch's rows come from about ``log2(batch)`` of the blocks a 2 Mi-row buffer
of 1 Mi-row groups needs, not all of them.

Each result's owed rows are put in place as it arrives (a scatter into the owed rows' arrays).
Its held rows wait until the buffer takes its next rows (``Restoring.settle``): the batches
before then need none of them. They go in as read, and the buffer adopts those arrays as its
slots with a map from slot to row (its ``view``) instead of a gather into slot order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from naiad.errors import StateError
from naiad.parallel.threads import start_beside
from naiad.sources.columns import concat_columns
from naiad.stream.plan import GroupTask, RankPlan, ReadTask, RestoreTask, Task
from naiad.stream.replay import BufferReplay
from naiad.stream.shuffle import ShuffleBuffer

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
    n = len(positions)
    bits = max(n - 1, 1).bit_length()
    if span.bit_length() + bits <= 63:
        # Each position with its index packed into one int64, sorted by value: NumPy's sort of
        # plain integers is vectorised, its argsort is not (a 2 Mi-row buffer's 3 Mi positions:
        # 0.5 s to 0.1 s).
        keys = (positions - lo) << bits
        keys |= np.arange(n)
        keys.sort()
        order, needed = keys & ((1 << bits) - 1), (keys >> bits) + lo
    else:
        order = np.argsort(positions)  # distinct: any sort is stable
        needed = positions[order]
    at = np.empty(n, np.int64)
    at[order] = np.arange(n)
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


def split_even(reads: Sequence[ReadTask], pieces: int, *, whole: bool = False) -> list[list[ReadTask]]:
    """``reads`` cut into at most ``pieces`` consecutive runs of about the same cost (each read
    whole): its rows and :data:`READ_COST_ROWS` per read, or the rows of its block when blocks
    are decoded ``whole``. Rows restored from older blocks are few per block, so the cost is not
    in proportion to the rows alone."""
    cost = np.cumsum([(r.block.rows if whole else r.rows) + READ_COST_ROWS for r in reads])
    if not len(cost):
        return []
    piece = (cost - 1) * pieces // int(cost[-1])  # the piece each read ends in
    cuts = (np.flatnonzero(np.diff(piece)) + 1).tolist()
    return [list(reads[a:b]) for a, b in zip([0, *cuts], [*cuts, len(reads)])]


def _inverse(at: np.ndarray) -> np.ndarray:
    """The permutation undone: ``out[at[i]] = i``."""
    out = np.empty(len(at), np.int64)
    out[at] = np.arange(len(at))
    return out


class _Step:
    """One step of a restore: reads in some tasks, and where each row they yield goes
    (``dest``, in the order they yield them: ``d < owed`` is owed row ``d``, else held slot
    ``d - owed``); once it and the steps before are in, the owed rows ``:ready`` are complete."""

    def __init__(self, tasks: list[RestoreTask], dest: np.ndarray, ready: int = 0) -> None:
        self.tasks = tasks
        self.dest = dest
        self.ready = ready


def _step(replay: BufferReplay, positions: np.ndarray, offset: int, *, pieces: int = 0, max_cost: int = 0) -> _Step:
    """The reads of ``positions`` (whose destinations are ``offset`` on) in ``pieces`` tasks, or
    in tasks of about ``max_cost`` each."""
    found = window(replay, positions)
    if not pieces:
        pieces = -(-sum(r.rows + READ_COST_ROWS for r in found.reads) // max(max_cost, 1))
    return _Step([RestoreTask(tuple(p)) for p in split_even(found.reads, pieces)], offset + _inverse(found.at))


def _whole_steps(replay: BufferReplay, first: int, max_cost: int) -> list[_Step]:
    """The steps of a restore from blocks decoded whole: the blocks of the owed rows ``:first``
    with every row needed from them, then the other blocks (NOTE [ Owed rows first ])."""
    owed = len(replay.owed)
    found = window(replay, np.concatenate((replay.owed, replay.held)))
    dest = _inverse(found.at)
    starts = np.concatenate(([0], np.cumsum([r.rows for r in found.reads]))).astype(np.int64)
    early = np.zeros(len(found.reads), bool)
    if first and len(found.reads) > 1:
        early[np.searchsorted(starts, found.at[:first], side="right") - 1] = True
    else:
        early[:] = True
    steps = []
    for part in (early, ~early):
        ks = np.flatnonzero(part)
        if not len(ks):
            continue
        reads = [found.reads[k] for k in ks]
        pieces = -(-sum(r.block.rows + READ_COST_ROWS for r in reads) // max(max_cost, 1))
        d = np.concatenate([dest[starts[k] : starts[k + 1]] for k in ks])
        steps.append(_Step([RestoreTask(tuple(p)) for p in split_even(reads, pieces, whole=True)], d))
    covered = np.zeros(owed, bool)  # the owed rows the steps so far read
    for step in steps:
        covered[step.dest[step.dest < owed]] = True
        step.ready = int(np.argmin(covered)) if not covered.all() else owed
    return steps


class Restoring:
    """The tasks of a resumed stream's pass (NOTE [ Owed rows first ]): the reads of the first
    batch's rows, of the other owed rows and of the held rows, then the plan's from where it
    stood; and what each of the restoring results becomes.

    Args:
        plan: the stream's plan.
        replay: where the stream stands (:meth:`BufferReplay.replay`).
        max_rows: about the cost of a task of held rows, in rows (the plan's read group size).
        first_rows: the rows of the first batch to cut.
        in_steps: read the first batch's rows, the other owed rows and the held rows in three
            steps; else each block once (blocks decoded whole whatever rows are picked: Parquet
            row groups, Arrow record batches, compressed files), those of the first batch first.
    """

    def __init__(self, plan: RankPlan, replay: BufferReplay, max_rows: int, first_rows: int, *, in_steps: bool = True) -> None:
        self.plan = plan
        self.replay = replay
        owed = replay.owed
        self._owed = len(owed)
        first = first_rows if len(owed) > 2 * first_rows else len(owed)
        if not in_steps:
            self.steps = _whole_steps(replay, first, max_rows)
            self._held: Any = None
        else:
            # The first batch's rows alone when the owed rows are many more, in two tasks.
            self.steps = [_step(replay, owed[:first], 0, pieces=FIRST_PIECES)] if first else []
            if first < len(owed):
                self.steps.append(_step(replay, owed[first:], first, pieces=OWED_PIECES))
            for step, ready in zip(self.steps, (first, len(owed))):
                step.ready = ready
            # The held rows' reads are worked out beside this thread while it hands out the others.
            self._held = start_beside(functools.partial(_step, replay, replay.held, len(owed), max_cost=max_rows))
        self._known = sum(len(s.tasks) for s in self.steps)  # restoring tasks known so far
        self.issued: list[Task | RestoreTask] = []  # the tasks handed out so far, in order
        self._step_index = 0
        self._task_index = 0  # of the step in progress
        self._at = 0  # rows of the step in progress put in place so far
        self._emitted = 0  # owed rows handed to the batches
        self._owed_rows: dict[str, np.ndarray] | None = None
        self._held_rows: list[dict[str, np.ndarray]] = []
        self._held_dest: list[np.ndarray] = []

    def tasks(self) -> Iterator[Task | RestoreTask]:
        """Every task of the pass, in order."""
        for task in self._tasks():
            self.issued.append(task)
            yield task

    def _tasks(self) -> Iterator[Task | RestoreTask]:
        for step in list(self.steps):
            yield from step.tasks
        if self._held is not None:
            held = self._held()
            held.ready = self._owed
            self.steps.append(held)
            self._held = None  # known: the last step
            self._known += len(held.tasks)
            yield from held.tasks
        if self.replay.remainder is not None:
            yield self.replay.remainder
        yield from self.plan.tasks[self.replay.next_task :]

    def restores(self, i: int) -> bool:
        """Whether result ``i`` is one of the restoring reads' (its task has been handed out)."""
        return i < self._known

    def take(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """The next result of the restoring reads, put in place: once a step's results are all
        in, the owed rows it completes, in their order (else nothing). The held rows wait for
        :meth:`settle`.

        Raises:
            StateError: rows were skipped as bad among them (their positions would shift).
        """
        step = self.steps[self._step_index]
        task = step.tasks[self._task_index]
        n = len(next(iter(arrays.values()))) if arrays else 0
        if n != task.rows:
            raise StateError(
                f"cannot resume mid-epoch exactly: {task.rows - n} bad row(s) of {task.reads[0].block.path} "
                "and the other files to restore were skipped; resume at the start of the epoch instead."
            )
        self._place(arrays, step.dest[self._at : self._at + n])
        self._at += n
        self._task_index += 1
        if self._task_index < len(step.tasks):
            return {}
        self._step_index += 1
        self._task_index = self._at = 0
        lo, self._emitted = self._emitted, max(self._emitted, step.ready)
        if self._owed_rows is None or lo == self._emitted:
            return {}
        return {k: v[lo : self._emitted] for k, v in self._owed_rows.items()}

    def _place(self, arrays: dict[str, np.ndarray], dest: np.ndarray) -> None:
        """Owed rows read into the owed rows' arrays (at ``dest``); results with held rows kept
        for :meth:`settle`."""
        if not len(dest):
            return
        owed = dest < self._owed
        every = bool(owed.all())
        if every or owed.any():
            if self._owed_rows is None:
                self._owed_rows = {k: np.empty((self._owed, *v.shape[1:]), v.dtype) for k, v in arrays.items()}
            at = dest if every else dest[owed]
            for k, v in arrays.items():
                self._owed_rows[k][at] = v if every else v[owed]
        if not every:
            self._held_rows.append(arrays)
            self._held_dest.append(dest)

    def settle(self, buffer: ShuffleBuffer | None) -> None:
        """Put the held rows, once read, back in ``buffer``, in the order read with the slot of each:
        before the next rows are pushed (so after the first batches, which need only owed rows)."""
        if not self._held_rows:
            return
        rows = self._held_rows[0] if len(self._held_rows) == 1 else concat_columns(self._held_rows)
        dest = np.concatenate(self._held_dest)
        self._held_rows, self._held_dest = [], []
        held = dest >= self._owed
        if not held.all():
            rows = {k: v[held] for k, v in rows.items()}
            dest = dest[held]
        self.replay.install(buffer, rows, dest - self._owed)  # type: ignore[arg-type]  # array columns stay arrays
