"""What the coverage check runs its plans over (NOTE [ Coverage check ] in coverage.py): a
source's blocks as row numbers, and the topology of a stretch of training."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError
from naiad.sources.base import Block, BlockData, Source
from naiad.stream.batches import StreamOptions, default_buffer_rows
from naiad.stream.plan import GroupTask, Task

__all__ = ["PositionSource", "Topology"]


class PositionSource(Source):
    """A source's blocks with one column, ``row``: each row's number in file order, not read.

    What the coverage check streams (NOTE [ Coverage check ]): the same plan as the source's,
    with row numbers where the data would be.

    Attributes:
        loader_buffer_rows: the shuffle buffer a loader of the source takes by default
            (:func:`~naiad.stream.batches.default_buffer_rows` of the source, not of its row numbers: one
            int64 column, whose blocks are not metadata's, would get another).
    """

    def __init__(self, source: Source) -> None:
        super().__init__(source.paths, storage=source.storage, expand=False)  # the files as they are
        self.loader_buffer_rows = default_buffer_rows(source)
        # The plan asks the traits and the local size (single blocks for a source read before
        # its count: tar shards): the source's answers, or the check plans another epoch.
        self.traits = replace(source.traits, keeps_parsed=False)
        self._local_bytes = source.local_bytes()
        self._schema = pa.schema([("row", pa.int64())])
        self._blocks = list(source.blocks())
        counts = np.fromiter((b.rows for b in self._blocks), np.int64, count=len(self._blocks))
        starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.total_rows = int(starts[-1])
        self._start = {b: int(s) for b, s in zip(self._blocks, starts[:-1].tolist())}
        first_row: dict[str, int] = {}
        for b in self._blocks:
            first_row.setdefault(b.path, self._start[b])
        self._file_starts = list(first_row.items())

    def local_bytes(self) -> int | None:
        """The source's local bytes (what decides whether its first reads may come before its count)."""
        return self._local_bytes

    def with_loader_buffer(self, topology: Topology) -> Topology:
        """``topology`` with :attr:`loader_buffer_rows` where its buffer is the default (None)."""
        if topology.shuffle_buffer is not None:
            return topology
        return replace(topology, shuffle_buffer=self.loader_buffer_rows)

    def _read_schema(self) -> pa.Schema:
        return self._schema

    def _file_blocks(self, path: str) -> list[Block]:
        return [b for b in self.blocks() if b.path == path]

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        start = self._start[block]
        return BlockData({"row": np.arange(start + lo, start + hi, dtype=np.int64)})

    def rows_of(self, task: Task) -> np.ndarray:
        """The row numbers a read (or a read group) yields, in order."""
        if isinstance(task, GroupTask):
            return np.concatenate([self.rows_of(t) for t in task.reads])
        return self._start[task.block] + task.row_numbers()

    def where(self, row: int) -> str:
        """A row number in words: its file and its row there (0-based, counted in rows)."""
        path, first = self._file_starts[0] if self._file_starts else ("?", 0)
        for p, s in self._file_starts:
            if s > row:
                break
            path, first = p, s
        return f"row {row} ({os.path.basename(path)}, its row {row - first})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()  # the blocks are the whole of this source: keep them


@dataclass(frozen=True)
class Topology:
    """The ranks, workers and batches of a stretch of training.

    Attributes:
        world_size: ranks.
        num_workers: worker processes (or threads) per rank; they never change the order.
        batch_size: rows per full batch.
        drop_last: only full batches, the same number on every rank.
        shuffle_buffer: the shuffle buffer's rows (None: the loader's default).
    """

    world_size: int = 1
    num_workers: int = 0
    batch_size: int = 1
    drop_last: bool = False
    shuffle_buffer: int | None = None

    def __post_init__(self) -> None:
        for name in ("world_size", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"`{name}` must be an int >= 1, got {value!r}.")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"`num_workers` must be an int >= 0, got {self.num_workers!r}.")
        if self.shuffle_buffer is not None and self.shuffle_buffer < 1:
            raise ConfigError(f"`shuffle_buffer` must be >= 1, got {self.shuffle_buffer}.")

    def options(self, rank: int, *, seed: int, shuffle: bool) -> StreamOptions:
        """The stream options of rank ``rank``."""
        return StreamOptions(batch_size=self.batch_size, shuffle=shuffle, seed=seed, shuffle_buffer=self.shuffle_buffer,
                             drop_last=self.drop_last, rank=rank, world_size=self.world_size)
