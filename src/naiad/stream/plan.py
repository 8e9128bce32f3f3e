"""The epoch plan: which rows of which blocks this rank reads, in which order, in what batches.

A pure function of the block row counts and (seed, epoch, shuffle, rank, world size, batch size,
drop_last). Workers execute the plan; they never decide it.

NOTE [ Exactly once across ranks ]
The blocks of all files, with their exact row counts, are permuted per (seed, epoch). Laid end
to end, the permuted blocks form one sequence of ``N`` rows; rank ``r`` of ``w`` takes the
contiguous range ``[r*N//w, (r+1)*N//w)`` of it, so the ranges partition the rows and their
sizes differ by at most one. A block that straddles two ranges is read by both ranks, each
keeping only its own rows. Every rank then yields the same number of batches
``ceil(max_rows / batch_size)``: a rank with one row fewer makes its last batches slightly
smaller instead of yielding one batch fewer, so collective operations (DDP's all-reduce) never
wait for a rank that has stopped. With ``drop_last=True`` every rank yields
``min_rows // batch_size`` full batches and the rest of its rows are not used in that epoch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any, NamedTuple

import numpy as np

from naiad.errors import ConfigError
from naiad.order.elastic import Leg, Segments, rank_share
from naiad.sources.base import Block

__all__ = [
    "GroupTask", "RankPlan", "ReadTask", "RestoreTask", "Task", "block_permutation", "block_runs", "group_rows",
    "group_tasks", "make_plan", "ordered_blocks", "rng_for", "tasks_for",
]

# Stream tags, so the block permutation and the shuffle buffer draw independent numbers.
TAG_BLOCKS = 0
TAG_BUFFER = 1


class ReadTask(NamedTuple):
    """Read rows ``lo:hi`` of ``block`` (plain data: this is what crosses to a worker).

    ``take``, when given, keeps only those rows of ``lo:hi`` (offsets from ``lo``, ascending):
    the scattered rows an elastic resume owes (NOTE [ Elastic resume ] in elastic.py).
    """

    block: Block
    lo: int
    hi: int
    take: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """Rows this task yields (before any bad row is skipped)."""
        return self.hi - self.lo if self.take is None else len(self.take)

    def row_numbers(self) -> np.ndarray:
        """The block's rows this task yields, ascending."""
        if self.take is None:
            return np.arange(self.lo, self.hi, dtype=np.int64)
        return self.lo + self.take

    def select(self, rows: np.ndarray) -> ReadTask:
        """The same read keeping only ``rows`` of its output (ascending)."""
        picked = self.lo + (rows if self.take is None else self.take[rows])
        return _take_task(self.block, picked)

    def without_first(self, k: int) -> ReadTask:
        """The same read less its first ``k`` rows (a resume starts inside it)."""
        if self.take is None:
            return ReadTask(self.block, self.lo + k, self.hi)
        return _take_task(self.block, self.lo + self.take[k:])


class GroupTask(NamedTuple):
    """Consecutive reads of the plan done as one task (NOTE [ Read groups ]): their rows come
    back as one chunk, in order."""

    reads: tuple[ReadTask, ...]

    @property
    def rows(self) -> int:
        """Rows this task yields (before any bad row is skipped)."""
        return sum(t.rows for t in self.reads)

    @property
    def block(self) -> Block:
        """The first read's block (for messages)."""
        return self.reads[0].block

    def parts(self, rows: np.ndarray) -> list[ReadTask]:
        """The reads that yield the group's output rows ``rows`` (ascending), one per block."""
        ends = np.cumsum([t.rows for t in self.reads])
        which = np.searchsorted(ends, rows, side="right")  # ascending, as ``rows`` are
        cuts = np.flatnonzero(np.diff(which)) + 1
        out = []
        for k, mine in zip(which[np.concatenate(([0], cuts))].tolist(), np.split(rows, cuts)):
            out.append(self.reads[k].select(mine - (int(ends[k - 1]) if k else 0)))
        return out

    def without_first(self, k: int) -> GroupTask:
        """The same reads less the group's first ``k`` rows."""
        reads = list(self.reads)
        while reads and k >= reads[0].rows:
            k -= reads.pop(0).rows
        if reads and k:
            reads[0] = reads[0].without_first(k)
        return GroupTask(tuple(reads))


Task = ReadTask | GroupTask
"""One step of a plan: a read, or a group of them."""


class RestoreTask(NamedTuple):
    """The reads of a resume's window as one task: the scattered rows a shuffle buffer held and
    owed, from many blocks, read (and for line formats parsed) at once."""

    reads: tuple[ReadTask, ...]

    @property
    def rows(self) -> int:
        """Rows this task yields."""
        return sum(t.rows for t in self.reads)


@dataclass(frozen=True)
class RankPlan:
    """One rank's share of one epoch.

    Attributes:
        tasks: the reads, in the order their rows enter the shuffle buffer.
        rows: rows this rank reads (the sum of ``hi - lo`` over ``tasks``).
        batch_sizes: the size of every batch this rank yields, in order.
        total_rows: rows over all ranks.
    """

    tasks: list[Task]
    rows: int
    batch_sizes: np.ndarray
    total_rows: int

    @property
    def num_batches(self) -> int:
        """Batches this rank yields (the same on every rank)."""
        return len(self.batch_sizes)


def rng_for(seed: int, epoch: int, *keys: int) -> np.random.Generator:
    """The generator for (seed, epoch, keys): independent streams, never the clock."""
    return np.random.default_rng(np.random.SeedSequence([seed % 2**64, epoch % 2**64, *keys]))


def block_permutation(num_blocks: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of the blocks in this epoch: a stratified permutation per (seed, epoch), or
    file order.

    NOTE [ Stratified block order ]
    A uniform permutation of K blocks leaves a trend between a block's place in the epoch and
    its place in the files of about 1/sqrt(K): |corr| 0.04 for 4,096 blocks, 0.07-0.16 for a
    Parquet file of 206 row groups. A file sorted by time or label then feeds the start of an
    epoch more of its start. So the blocks are cut into S = round(sqrt(K)) strata of consecutive
    blocks, each stratum is shuffled, and the r-th of a stratum's n blocks is placed at a random
    point of the stretch [r/n, (r+1)/n) of the epoch (jittered stratification): every stretch
    of about S blocks of the epoch comes from all over the files, strata one block longer than
    the others included. The trend left is the jitter's: |corr| at most 0.002 for 2,288 blocks,
    0.02 for 206 and 0.13 for 31 (50 seeds; uniform: 0.06, 0.16, 0.42). With a dozen blocks
    it is as noisy as a uniform order (a dozen blocks cannot be mixed). Every block is still
    read once, in an order that is new each epoch.

    Example:
        >>> sorted(block_permutation(10, seed=0, epoch=0, shuffle=True).tolist()) == list(range(10))
        True
    """
    if not shuffle:
        return np.arange(num_blocks)
    rng = rng_for(seed, epoch, TAG_BLOCKS)
    strata = max(1, round(num_blocks ** 0.5))
    bounds = (np.arange(strata + 1) * num_blocks) // strata
    sizes = np.diff(bounds)
    stratum = np.repeat(np.arange(strata), sizes)
    by_stratum = np.lexsort((rng.random(num_blocks), stratum))  # each stratum shuffled
    rank = np.empty(num_blocks, np.int64)
    rank[by_stratum] = np.arange(num_blocks) - bounds[stratum[by_stratum]]
    # The r-th of a stratum's n blocks goes at a random point of [r/n, (r+1)/n) of the epoch:
    # strata one block longer than others are spread out too, not left for a last round.
    return np.argsort((rank + rng.random(num_blocks)) / sizes[stratum], kind="stable")


RUNS_MIN = 16
"""The fewest runs a rank's share of an epoch is permuted in (NOTE [ Block runs ])."""


def block_runs(num_blocks: int, total_rows: int, buffer_rows: int, world_size: int = 1) -> int:
    """How many consecutive blocks the epoch permutation moves as one, for a shuffle buffer of
    ``buffer_rows`` (0: not shuffled) on each of ``world_size`` ranks.

    NOTE [ Block runs ]
    A block order mixes the rows the shuffle buffer does not: a rank's rows past its first
    ``buffer_rows`` enter the buffer as it empties, late in the epoch, so the order of the
    blocks they come from is what keeps the epoch's end from being the files' end. When the
    buffer holds most of a rank's rows, few units of order are needed: with a share ``u`` of
    the rows left out of the buffer, ``4096 * u**2`` of them (at least ``RUNS_MIN``) leave a
    |corr| of the epoch position with the row number under 0.01 and a batch span of 0.998, as
    for 4,096 blocks and a buffer of a sliver of the rows (measured on 135,135 rows of JSON
    Lines, 12 epochs each: u = 0.26 with 297 units 0.008 at most, with 19 units 0.041; u =
    0.10 with 19 units 0.018; u = 0.03 with 5 units 0.005, the noise of a full permutation).
    So the blocks, cut small enough for any buffer, are permuted in runs of consecutive ones
    (each run in file order), and the kept rows of a run lie side by side in memory (NOTE
    [ Kept blocks ]), not scattered over the source: a 10 MB source's epochs ran 6-10% faster
    in 1-4 MiB blocks, for the same order figures. The run follows the buffer and the world
    size, so a buffer given smaller than the default gets the single blocks its order needs;
    it is part of the plan, a pure function of the rows, the blocks and the epoch's first
    topology (an elastic resume keeps it). Only sources that never read before their rows are
    counted get runs (``planning.run_for``): one that may (``early.may_read_early``: files of
    ``early.EARLY_MIN_BYTES`` or more, tar shards) starts in an order that must not depend on
    the count.

    Example:
        >>> block_runs(297, 135_135, 131_072), block_runs(2_288, 2_027_027, 131_072)
        (18, 1)
    """
    if buffer_rows <= 0 or world_size < 1 or total_rows <= 0:
        return 1
    uncovered = max(0.0, 1.0 - buffer_rows * world_size / total_rows)
    if uncovered >= 0.5:
        return 1
    units = max(RUNS_MIN, math.ceil(4096 * uncovered**2)) * world_size
    return max(1, num_blocks // units)


def block_order(num_blocks: int, *, seed: int, epoch: int, shuffle: bool, run: int = 1) -> np.ndarray:
    """The blocks' indices in this epoch's order: :func:`block_permutation` of runs of about
    ``run`` consecutive blocks, each run in file order (NOTE [ Block runs ]).

    Example:
        >>> order = block_order(10, seed=0, epoch=0, shuffle=True, run=5)
        >>> sorted(order.tolist()) == list(range(10)) and order[0] in (0, 5)
        True
    """
    runs = num_blocks // run if shuffle and run > 1 else 0
    if runs <= 1:
        return block_permutation(num_blocks, seed=seed, epoch=epoch, shuffle=shuffle)
    bounds = (np.arange(runs + 1, dtype=np.int64) * num_blocks) // runs
    picked = block_permutation(runs, seed=seed, epoch=epoch, shuffle=True)
    return concat_ranges(bounds[picked], np.diff(bounds)[picked])


def _field(items: Sequence[Any], name: str) -> np.ndarray:
    """An int field of every item, as an array: a plan reads a few per block, and an epoch of a
    source in 64 KiB blocks has thousands (``map`` over ``attrgetter`` runs in C, a generator
    expression costs 3-4x as much per item)."""
    return np.fromiter(map(attrgetter(name), items), np.int64, count=len(items))


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each start and length, without a loop."""
    ends = np.cumsum(lengths)
    out: np.ndarray = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    return out


def ordered_blocks(blocks: Sequence[Block], *, seed: int, epoch: int, shuffle: bool, run: int = 1) -> list[Block]:
    """``blocks`` in this epoch's order (:func:`block_order`)."""
    return [blocks[i] for i in block_order(len(blocks), seed=seed, epoch=epoch, shuffle=shuffle, run=run).tolist()]


def make_plan(
    blocks: Sequence[Block],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    group_rows: int = 0,
    run: int = 1,
) -> RankPlan:
    """The plan of one rank for one epoch (see NOTE [ Exactly once across ranks ]); consecutive
    small reads are grouped up to ``group_rows`` rows (NOTE [ Read groups ]; 0: never), and the
    blocks permuted in runs of ``run`` (NOTE [ Block runs ]).

    Example:
        >>> from naiad.sources import Block
        >>> blocks = [Block("a", 0, 10, 10, 1), Block("b", 0, 7, 7, 1)]
        >>> plan = make_plan(blocks, seed=0, epoch=0, shuffle=False, rank=1, world_size=2,
        ...                  batch_size=4, drop_last=False)
        >>> [(t.block.path, t.lo, t.hi) for t in plan.tasks], plan.batch_sizes.tolist()
        ([('a', 8, 10), ('b', 0, 7)], [4, 4, 1])
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"`rank` must be in [0, world_size), got rank={rank}, world_size={world_size}.")
    if batch_size < 1:
        raise ConfigError(f"`batch_size` must be >= 1, got {batch_size}.")
    ordered = ordered_blocks(blocks, seed=seed, epoch=epoch, shuffle=shuffle, run=run)
    total = int(_field(ordered, "rows").sum())
    share, sizes = rank_share(Segments([(0, total)]), Leg(world_size, batch_size, drop_last, 0), rank)
    return RankPlan(group_tasks(tasks_for(ordered, share), group_rows), len(share), sizes, total)


def tasks_for(ordered: Sequence[Block], share: Any) -> list[ReadTask]:
    """The reads that yield the positions of ``share`` (a :class:`~naiad.order.elastic.Segments` over
    the blocks laid end to end in ``ordered``), in order: ranges cut at block boundaries, and
    scattered positions grouped by block."""
    rows = _field(ordered, "rows")
    starts = np.concatenate(([0], np.cumsum(rows)))
    tasks: list[ReadTask] = []
    for piece in share.pieces:
        if isinstance(piece, tuple):
            lo, hi = piece
            first = max(int(np.searchsorted(starts, lo, side="right")) - 1, 0)
            last = min(int(np.searchsorted(starts, hi, side="left")), len(ordered))
            # Whole arrays, then one constructor call per read: a range is most of an epoch's
            # blocks (2,288 for a 150 MB CSV), and a Python loop of NumPy scalars costs 10x.
            a = np.maximum(lo - starts[first:last], 0)
            b = np.minimum(hi - starts[first:last], rows[first:last])
            keep = np.flatnonzero(b > a)
            picked = ordered[first:last] if len(keep) == last - first else [ordered[first + k] for k in keep.tolist()]
            # tuple.__new__ straight, not ReadTask(): its __new__ is a Python function (2x the cost).
            tasks.extend(map(tuple.__new__, repeat(ReadTask), zip(picked, a[keep].tolist(), b[keep].tolist(), repeat(None))))
            continue
        which = np.searchsorted(starts, piece, side="right") - 1
        cuts = np.flatnonzero(np.diff(which)) + 1
        for run_pos, run_k in zip(np.split(piece, cuts), np.split(which, cuts)):
            k = int(run_k[0])
            tasks.append(_take_task(ordered[k], run_pos - int(starts[k])))
    return tasks


def _take_task(block: Block, rel: np.ndarray) -> ReadTask:
    """Read the rows ``rel`` (ascending offsets into ``block``): a range when they are one."""
    lo, hi = int(rel[0]), int(rel[-1]) + 1
    if hi - lo == len(rel):
        return ReadTask(block, lo, hi)
    return ReadTask(block, lo, hi, rel - lo)


def group_rows(buffer_rows: int) -> int:
    """How many rows a read group holds at most, for a shuffle buffer of ``buffer_rows`` (0: the
    stream is not shuffled): half of the buffer, so each exchange still mixes a chunk into
    twice as many rows, or 64 Ki rows in order.

    Each exchange costs the training thread a fixed share besides its rows. With a quarter of
    the default buffer, a shuffled 1 GB CSV epoch ran 8% slower (2.05 against 2.23M rows/s),
    for the same |corr| and batch span and a neighbour share of 9.4e-6 against 1.2e-5 (2e-6 for
    a uniform shuffle), bench/RESULTS.md."""
    return max(1, (buffer_rows or 1 << 17) // 2)


GROUP_MAX_BYTES = 4 << 20
"""The most bytes of a byte-range file one read group parses at once (a wide text row is big)."""


def group_tasks(tasks: Sequence[ReadTask], max_rows: int, max_bytes: int = GROUP_MAX_BYTES) -> list[Task]:
    """Runs of consecutive small reads joined into groups of at most ``max_rows`` rows and, for
    byte-range blocks, about ``max_bytes`` bytes; a read that is big enough stays alone.

    NOTE [ Read groups ]
    Small blocks shuffle well (the permutation scatters many of them and the buffer holds rows
    of many), but every read costs a parser call, a task and a buffer exchange, which for a
    CSV block of 2,000 rows is as much as parsing it. So the plan keeps its small blocks and
    joins consecutive reads into one task: the worker reads each block's bytes and parses them
    all in one call (line formats) or reads them one after another (others), and the shuffle
    buffer takes the group as one chunk. The grouping is part of the plan, a pure function of
    its reads and of the buffer's capacity (``group_rows``), so a resume and an elastic replay
    see the same chunks.
    """
    if max_rows <= 1:
        return list(tasks)
    n = _field(tasks, "hi") - _field(tasks, "lo")
    picked = np.fromiter(map(is_not, map(attrgetter("take"), tasks), repeat(None)), bool, count=len(tasks))
    for i in np.flatnonzero(picked).tolist():  # the scattered rows an elastic leg owes: few reads
        n[i] = len(tasks[i].take)
    size = _bytes_of_reads(tasks, n, max_bytes)
    # A group ends before the read that would take it past either bound (a read alone may).
    ends_rows, ends_bytes = np.cumsum(n), np.cumsum(size)
    out: list[Task] = []
    i, count = 0, len(tasks)
    while i < count:
        base_rows = int(ends_rows[i - 1]) if i else 0
        base_bytes = int(ends_bytes[i - 1]) if i else 0
        j = min(int(np.searchsorted(ends_rows, base_rows + max_rows, side="right")),
                int(np.searchsorted(ends_bytes, base_bytes + max_bytes, side="right")))
        j = max(j, i + 1)
        out.append(tasks[i] if j == i + 1 else GroupTask(tuple(tasks[i:j])))
        i = j
    return out


def _bytes_of_reads(tasks: Sequence[ReadTask], rows_read: np.ndarray, max_bytes: int) -> np.ndarray:
    """About how many bytes each read reads: its rows' share of a byte-range block. Row groups,
    record batches and row ranges count 0 (grouped by rows only); a compressed file, read whole,
    counts more than ``max_bytes``, so it is never grouped with another read."""
    blocks = list(map(attrgetter("block"), tasks))
    stops = _field(blocks, "stop")
    spans = np.where(stops >= 0, stops - _field(blocks, "start"), -1)
    rows = _field(blocks, "rows")
    out = np.zeros(len(tasks), np.int64)
    ranged = (rows > 0) & (spans > 1) & (spans != rows)
    out[ranged] = spans[ranged] * rows_read[ranged] // rows[ranged]
    out[spans < 0] = max_bytes + 1
    return out
