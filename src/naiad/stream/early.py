"""The first reads of a fresh source, planned while its rows are still being counted.

NOTE [ Early reads ]
A plan needs every block's row count (NOTE [ Exactly once across ranks ] in plan.py), and a
CSV, JSON Lines or text file has none until a newline scan has read all of it: about 0.5 s for
2 GB on two cores, before the first batch; a tar shard has none until its headers are walked
(NOTE [ Member index ] in tarindex.py): a second for a thousand small shards, minutes for a
terabyte of them behind a URL. But one rank's plan of a fresh epoch needs much less to begin:

* The blocks' byte ranges, and so their number and the epoch's block order, come from the bytes
  near the steps' ends alone (``scan.early_cut``: NOTE [ Newline scan ]'s rule, searched back
  from each grid point), or, for shards, from their sizes alone (NOTE [ Sample blocks ]).
* On a single rank, from the start of an epoch, the plan reads every row of every block in
  that order, grouped greedily (NOTE [ Read groups ]): a group is known once the rows of its
  blocks and of the next are, and each block can be counted alone (``scan.span_rows``; a
  shard's block by walking that shard: ``Source.early_block``).
* Batches are all ``batch_size`` but the last.

So the full count runs on a thread of its own (``Source.count_beside``) while the reads start
from these early tasks; once the count ends, the early tasks are checked against the plan it
gives (the same reads, in the same groups) and the rest of the pass is that plan's. The order
is the plan's own, whichever came first: a resume, ``len()`` and a state see only the plan.
Which sources read early is a property of the data alone (``may_read_early``), and such a
source's plan permutes single blocks whether or not it read early, so a resume and every rank
plan the same.

Two things the count alone knows wait for it. The line numbers that errors name: an early
read that fails is read again from its planned block once the count ends, so the message names
the right line. And the epoch's rows: the batch sizes, the number of batches (``len()``). A
row's number in the source needs every block before it counted too, so a worker-side transform,
which keys rows by it (``__index__``), reads early only over a format that keys rows by file
(``keys_by_file``: tar shards, their shard and sample, ``reads.FileRowKeys``).
Early reads are made only from the start of an epoch on one rank, with ``on_bad_rows="raise"``
(skipped rows are tracked against the rank's rows), for local plain files of at least
``EARLY_MIN_BYTES`` without a block index entry and for tar shards of any size
(``reads_before_count``), and never past the first half of the blocks.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from naiad.errors import SourceError
from naiad.sources.base import Block, Source
from naiad.stream.plan import (
    GROUP_MAX_BYTES,
    GroupTask,
    RankPlan,
    ReadTask,
    Task,
    block_permutation,
    group_tasks,
)
from naiad.stream.reads import read_task  # the read a worker makes

__all__ = ["EARLY_MIN_BYTES", "EarlyReads", "declined", "may_read_early"]

_LOG = logging.getLogger("naiad.stream")

EARLY_MIN_BYTES = 256 << 20
"""Sources smaller than this are counted before their first read: the count then takes less
than the first batch's reads (about 80 ms for 256 MiB on two cores, against two read groups of
a CSV), and a 150 MB CSV's first epoch measured 0.90-0.94x as fast with early reads as without
(bench/RESULTS.md, "early reads")."""


def may_read_early(source: Source) -> bool:
    """Whether a fresh pass over ``source`` may read before its rows are counted: a format whose
    count costs more than the first reads (``traits.reads_before_count``: tar shards, whatever their
    size, local or remote), else local files of ``EARLY_MIN_BYTES`` or more. Such a source's plan
    permutes single blocks (NOTE [ Block runs ] in plan.py), since the early reads cannot know
    the count; it is a property of the data alone, so a resume or another rank plans the same."""
    return source.traits.reads_before_count or (source.local_bytes() or 0) >= EARLY_MIN_BYTES


def declined(source: Source, reason: str) -> None:
    """Log at DEBUG on ``naiad.stream`` why a pass over ``source`` waits for the count instead of
    reading early (NOTE [ Early reads ]), where it could have: a source not yet counted whose
    data would read early. The caller's pass then has no early reads (None)."""
    if _LOG.isEnabledFor(logging.DEBUG) and not source.counted() and may_read_early(source):
        _LOG.debug("naiad: %r waits for its count before its first read (no early reads): %s.", source, reason)


class EarlyReads:
    """A fresh pass's tasks on one rank, from before the rows are counted (NOTE [ Early reads ]).

    Args:
        source: the source, its count started beside (``count_beside``).
        blocks: its :meth:`~naiad.sources.Source.early_blocks`.
        seed, epoch, shuffle: the plan's.
        max_rows: the read groups' rows (``plan.group_rows``).
        plan: the pass's plan, made once the rows are counted (waits for the count).
    """

    def __init__(self, source: Source, blocks: list[Block], *, seed: int, epoch: int, shuffle: bool, max_rows: int,
                 plan: Callable[[], RankPlan]) -> None:
        self.source = source
        self.blocks = blocks
        self.order = block_permutation(len(blocks), seed=seed, epoch=epoch, shuffle=shuffle)
        self.max_rows = max_rows
        self._plan = plan
        self.plan: RankPlan | None = None  # once resolved
        self.early: list[Task] = []  # the early tasks handed out

    @classmethod
    def start(cls, source: Source, *, seed: int, epoch: int, shuffle: bool, max_rows: int,
              plan: Callable[[], RankPlan]) -> EarlyReads | None:
        """Early reads for ``source`` with its count started beside, or None where they do not
        apply to the source (NOTE [ Early reads ])."""
        if source.on_bad_rows != "raise":
            declined(source, "skipped rows are tracked against the rank's rows, known once counted (on_bad_rows)")
            return None
        if not may_read_early(source):
            if _LOG.isEnabledFor(logging.DEBUG) and not source.counted():
                _LOG.debug("naiad: %r is counted before its first read: its files are local and smaller than "
                           "EARLY_MIN_BYTES (%d MiB together).", source, EARLY_MIN_BYTES >> 20)
            return None
        blocks = source.early_blocks()
        if blocks is None or len(blocks) < 4:
            declined(source, "the format gives no early blocks" if blocks is None
                     else f"{len(blocks)} early blocks, fewer than 4")
            return None
        source.count_beside()
        return cls(source, blocks, seed=seed, epoch=epoch, shuffle=shuffle, max_rows=max_rows, plan=plan)

    def tasks(self) -> Iterator[Task]:
        """Every task of the pass, in order: early ones while the count runs, then the plan's."""
        yield from self._tasks()

    def _tasks(self) -> Iterator[Task]:
        pending: list[ReadTask] = []
        rows_in = bytes_in = 0  # of the pending reads
        k, stop = 0, len(self.order) // 2  # the end of an epoch is the plan's (drop_last trims it)
        while not self.source.counted():
            # The first group is known once the reads after it are: when the pending ones pass
            # either bound of a group (plan.group_tasks cuts before the read that would).
            while not (len(pending) > 1 and (rows_in > self.max_rows or bytes_in > GROUP_MAX_BYTES)) and k < stop:
                block = self.source.early_block(self.blocks[int(self.order[k])])
                k += 1
                rows = block.rows
                if rows:  # a block of blank lines only (no sample) is never read (as in plan.tasks_for)
                    pending.append(ReadTask(block, 0, rows))
                    rows_in, bytes_in = rows_in + rows, bytes_in + block.stop - block.start
            groups = group_tasks(pending, self.max_rows)
            if len(groups) < 2:
                break
            first = groups[0]
            taken = pending[: len(first.reads) if isinstance(first, GroupTask) else 1]
            pending = pending[len(taken):]
            rows_in -= sum(t.rows for t in taken)
            bytes_in -= sum(t.block.stop - t.block.start for t in taken)
            self.early.append(first)
            yield first
        yield from self.resolve().tasks[len(self.early):]

    def resolve(self) -> RankPlan:
        """The pass's plan (waits for the count), its first tasks checked against the early ones."""
        if self.plan is None:
            plan = self._plan()
            if [_key(t) for t in plan.tasks[: len(self.early)]] != [_key(t) for t in self.early]:
                raise RuntimeError("naiad: the early reads differ from the plan; please report this with the file's size "
                                   "and the loader's arguments.")
            self.plan = plan
        return self.plan

    def planned(self, i: int) -> Task:
        """Task ``i`` as the plan has it (waits for the count): an early one with its lines."""
        return self.resolve().tasks[i]

    def checked(self, results: Iterator[Any]) -> Iterator[Any]:
        """``results`` in order, an early read's error raised again from its planned task, whose
        blocks know their lines (NOTE [ Early reads ]): the message names the right one."""
        for i in itertools.count():
            try:
                result = next(results)
            except StopIteration:
                return
            except SourceError:
                if i < len(self.early):
                    self._read_again(i)
                raise
            yield result

    def _read_again(self, i: int) -> None:

        try:
            read_task(self.source, False, self.planned(i))
        except SourceError as again:
            raise again from None


def _key(task: Task) -> tuple[Any, ...]:
    """What a task reads (not its blocks' first lines)."""
    reads = task.reads if isinstance(task, GroupTask) else (task,)
    return tuple((t.block[:4], t.lo, t.hi, None if t.take is None else np.asarray(t.take).tolist()) for t in reads)
