"""The worker side of a stream: what a worker does with one task of a plan.

A task (a block range, a read group, a resume's scattered rows) becomes its rows as NumPy
columns and the rows it skipped; the handler is built inside each worker from a picklable
factory (NOTE [ Worker protocol ]).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from naiad.parallel import HandlerFactory, WorkerContext
from naiad.sources.base import Source
from naiad.stream.plan import GroupTask, RestoreTask, Task

__all__ = ["FileRowKeys", "RowKeys", "RowNumbers", "make_handler_factory", "read_task", "row_keys"]


def make_handler_factory(source: Source, index_column: str | None = None) -> HandlerFactory:
    """A picklable factory that builds, in each worker, ``handler(ReadTask) -> (columns, bad)``
    (``bad``: the skipped rows, as in :attr:`BlockData.bad`).

    ``columns`` is a plain dict of NumPy arrays (numeric; they cross processes through shared
    memory) and lists (strings and other values). With ``index_column``, one more int64 column:
    each good row's key (:func:`row_keys`).
    """
    return functools.partial(_build_handler, source, index_column)


class RowKeys(Protocol):
    """What keys a stream's rows for a worker-side transform (NOTE [ Decode in the workers ] in
    pipeline.py): a stable int64 per row, the same in every epoch, on every rank and worker and
    after a resume."""

    def of(self, task: Task | RestoreTask) -> np.ndarray:
        """The keys of the rows ``task`` asks for, in the order it yields them."""

    def locate(self, rows: np.ndarray) -> list[tuple[str, int]]:
        """Each key's file and its row (sample) in that file."""


def row_keys(source: Source) -> RowKeys:
    """The keys of ``source``'s rows: :class:`FileRowKeys` for a format that keys its rows by file
    (``traits.keys_by_file``: tar shards), else :class:`RowNumbers`, which needs the rows counted."""
    return FileRowKeys(source.paths) if source.traits.keys_by_file else RowNumbers(source)


class FileRowKeys:
    """Each row's key is its file's number (its place in the source's files) times 2**32 plus its
    row in that file (a block's ``first_line`` is its first row's): known from the block alone,
    so reads keyed so start before the other files are counted (NOTE [ Early reads ] in
    early.py). Keys ascend in the source's order, as row numbers do, without being dense."""

    SHIFT = 32

    def __init__(self, paths: Sequence[str]) -> None:
        self._paths = list(paths)
        self._number = {path: i for i, path in enumerate(self._paths)}

    def of(self, task: Task | RestoreTask) -> np.ndarray:
        """The keys of the rows ``task`` asks for, in the order it yields them."""
        reads = task.reads if isinstance(task, (RestoreTask, GroupTask)) else (task,)
        parts = [(self._number[t.block.path] << self.SHIFT) + t.block.first_line + t.row_numbers() for t in reads]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def locate(self, rows: np.ndarray) -> list[tuple[str, int]]:
        """Each key's file and its row (sample) in that file."""
        keys = np.asarray(rows, np.int64)
        return [(self._paths[f], int(r)) for f, r in zip((keys >> self.SHIFT).tolist(), (keys & 0xFFFFFFFF).tolist(), strict=True)]


class RowNumbers:
    """Each block's first row in the source (its blocks in source order, as the coverage check's
    ``PositionSource`` numbers them): a row's number is stable across epochs, ranks, workers and
    resumes, so it keys a sample's random crop (NOTE [ Decode in the workers ] in pipeline.py)."""

    def __init__(self, source: Source) -> None:
        blocks = list(source.blocks())
        counts = np.fromiter((b.rows for b in blocks), np.int64, count=len(blocks))
        starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.start = {b: int(s) for b, s in zip(blocks, starts[:-1].tolist(), strict=True)}
        firsts: dict[str, int] = {}
        for b in blocks:
            firsts.setdefault(b.path, self.start[b])
        self._paths = list(firsts)
        self._file_starts = np.asarray(list(firsts.values()), np.int64)

    def of(self, task: Task | RestoreTask) -> np.ndarray:
        """The source row numbers of the rows ``task`` asks for, in the order it yields them."""
        reads = task.reads if isinstance(task, (RestoreTask, GroupTask)) else (task,)
        parts = [self.start[t.block] + t.row_numbers() for t in reads]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def locate(self, rows: np.ndarray) -> list[tuple[str, int]]:
        """Each source row number's file and its row (sample) in that file."""
        which = np.searchsorted(self._file_starts, rows, side="right") - 1
        return [(self._paths[w], int(r - self._file_starts[w])) for w, r in zip(which.tolist(), rows.tolist(), strict=True)]


def _build_handler(source: Source, index_column: str | None,
                   context: WorkerContext) -> Callable[[Any], tuple[dict[str, Any], list[dict[str, Any]]]]:
    if context.mode == "process":
        # Arrow hands out read-only NumPy views; the pool copies them into shared memory, so
        # torch's warning about non-writable arrays is noise there.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        source.keep_nothing()  # this worker's own copy (NOTE [ Kept blocks ])
    # Inline there is no other worker, so PyArrow may use its own threads on a block.
    read = functools.partial(read_task, source, context.num_workers == 0)
    if index_column is None:
        return read
    numbers = row_keys(source)

    def read_numbered(task: Task | RestoreTask) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        columns, bad = read(task)
        rows = numbers.of(task)
        if bad:  # the good rows' numbers: a skipped row's placeholder gets one later (ledger.py)
            keep = np.ones(len(rows), bool)
            keep[[e["at"] for e in bad]] = False
            rows = rows[keep]
        columns[index_column] = rows
        return columns, bad

    return read_numbered


def read_task(source: Source, use_threads: bool, task: Task | RestoreTask) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What a worker does with one task of a plan: its rows as columns, and the rows it skipped."""
    if isinstance(task, RestoreTask):  # a resume's window: only the rows it restores
        data = source.read_rows_many([(t.block, t.row_numbers()) for t in task.reads], use_threads=use_threads)
    elif isinstance(task, GroupTask):  # consecutive small reads, in one go (NOTE [ Read groups ])
        data = source.read_group([(t.block, t.lo, t.hi, t.take) for t in task.reads], use_threads=use_threads)
    elif task.take is None:
        data = source.read_block(task.block, task.lo, task.hi, use_threads=use_threads)
    else:  # the scattered rows an elastic leg owes
        data = source.read_rows(task.block, task.row_numbers(), use_threads=use_threads)
    return dict(data.columns), list(data.bad)  # plain dict, list and tuple: WorkerPool looks inside
