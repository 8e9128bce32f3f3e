"""Streaming a :class:`~naiad.sources.Source` as batches: plan -> workers read -> shuffle -> batch.

The calling process computes the plan (:mod:`naiad.stream.plan`), hands the read tasks to ``imap``
(a :class:`~naiad.parallel.WorkerPool`'s ordered ``imap``, or inline), passes the blocks that
come back, in plan order, through the shuffle buffer (:mod:`naiad.stream.shuffle`) and cuts the rows
into the planned batches. Because the plan, the order of the results and the buffer's draws do
not depend on the workers, the batches are the same whatever ``num_workers`` is.

NOTE [ Mid-epoch resume ]
A stream's state is a handful of integers: the plan's inputs, the data's fingerprint, the legs
of the epoch (NOTE [ Elastic resume ] in elastic.py) and the number of batches yielded. To
resume after ``k`` batches, the shuffle buffer's draws are made again over row *positions* only
(no I/O; each exchange's draw depends only on its seed keys and size), backwards from the
exchange in progress until every slot is accounted for, which tells which positions it holds and
which are still owed from the chunk it was emitting (``BufferReplay``). Only those rows are read
again, the owed ones first (NOTE [ Owed rows first ] in restore.py), the held ones put back in
their slots, and the stream continues. Rows skipped by ``on_bad_rows="skip"`` keep their positions
until their batch is cut, so a resume after skipped rows is as exact as any (NOTE [ Bad rows keep
their positions ] in ledger.py).
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import numpy as np
import torch

from naiad.errors import ConfigError, StateError
from naiad.order.elastic import (
    Leftovers,
    Leg,
    Segments,
    epoch_sequence,
    iter_legs,
    no_buffer,
    rank_share,
)
from naiad.sources.base import Source
from naiad.sources.columns import row_bytes
from naiad.stream.batching import Batcher, to_torch
from naiad.stream.early import EarlyReads, may_read_early
from naiad.stream.ledger import BadRowLedger, BadRowTracker
from naiad.stream.plan import (
    TAG_BUFFER,
    RankPlan,
    block_runs,
    group_rows,
    group_tasks,
    make_plan,
    ordered_blocks,
    tasks_for,
)
from naiad.stream.replay import BufferReplay
from naiad.stream.restore import Restoring
from naiad.stream.shuffle import ShuffleBuffer, as_array

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER_ROWS",
    "default_buffer_rows",
    "BatchStream",
    "StreamCounters",
    "StreamOptions",
    "iter_batches",
    "num_batches",
]

DEFAULT_SHUFFLE_BUFFER_ROWS = 1 << 17
"""131,072 rows: about 9 MB for ten float64 columns; raise it for better mixing on big data."""

BUFFER_BYTES_BUDGET = 256 << 20
"""The most memory a default shuffle buffer grows to for a source in big blocks, or of samples."""

MIN_SAMPLE_BUFFER_ROWS = 64
"""The fewest rows a default buffer of big samples holds (64 photos of 2 MB: 128 MB)."""

FEW_BLOCKS = 256
"""Below this many blocks, a source read from metadata whose rows fit ``BUFFER_BYTES_BUDGET`` is
shuffled whole (see :func:`default_buffer_rows`): about 200 blocks leave the stratified block
order a correlation of 0.02 with the file's, fewer more."""


def default_buffer_rows(source: Source, *, decoded_bytes: int | None = None) -> int:
    """The shuffle buffer a stream gets when none is given.

    ``DEFAULT_SHUFFLE_BUFFER_ROWS``, or, for a source whose blocks metadata describes and may be
    big (Parquet row groups, Arrow record batches: ``pq.write_table`` writes groups of 1 Mi
    rows), room for two of its largest blocks, up to about 256 MiB of rows. A buffer smaller
    than a block hands out a block's rows nearly in file order (measured with 1 Mi-row groups and
    the 131,072-row buffer: correlation of epoch position with row number 0.996, batch span
    0.065); two blocks' worth mixes them (bench/RESULTS.md, "Defaults").

    Such a source with fewer than ``FEW_BLOCKS`` blocks whose rows all fit in the same 256 MiB
    gets room for every row: a full permutation. Few blocks leave the block order close to the
    file's whatever it is (31 row groups of 64 Ki rows, two of them in the buffer: correlation
    -0.042, batch span 0.916), and the whole table costs no more memory than the budget already
    allows one big block.

    A source of samples (images, audio: ``Source.sample_bytes()``, known without counting every
    file) gets what fits the same 256 MiB at its bytes per row, between ``MIN_SAMPLE_BUFFER_ROWS``
    and ``DEFAULT_SHUFFLE_BUFFER_ROWS``: 131,072 ImageNet JPEGs would hold 14 GB (WebDataset's
    default buffer is 1,000 samples; this is about 2,400 of 110 KB). Samples decoded before the
    buffer (``decoded_bytes`` each: NOTE [ Small samples decode in the reads ] in decode.py) count
    at the larger of their two sizes.
    """
    samples = source.sample_bytes() if decoded_bytes is None else max(source.sample_bytes() or 0, decoded_bytes)
    width = max(row_bytes(source.schema()), samples or 0, 1)
    if not source.traits.blocks_from_metadata:
        if samples is None:
            return DEFAULT_SHUFFLE_BUFFER_ROWS
        return int(max(MIN_SAMPLE_BUFFER_ROWS, min(DEFAULT_SHUFFLE_BUFFER_ROWS, BUFFER_BYTES_BUDGET // width)))
    blocks = source.blocks()
    biggest = max((b.rows for b in blocks), default=0)
    cap = BUFFER_BYTES_BUDGET // width
    total = sum(b.rows for b in blocks)
    floor = DEFAULT_SHUFFLE_BUFFER_ROWS if samples is None else min(
        DEFAULT_SHUFFLE_BUFFER_ROWS, max(MIN_SAMPLE_BUFFER_ROWS, cap))
    if len(blocks) < FEW_BLOCKS and total <= cap:
        return int(max(floor, total))
    return int(max(floor, min(2 * biggest, cap)))


STREAM_STATE_VERSION = 7
"""Version 2 added the data's fingerprint and the epoch's legs (elastic resume); version 3 the
read groups (NOTE [ Read groups ]), which change the shuffle buffer's chunks; version 4 the keyed
permutation big buffers draw from (NOTE [ Keyed permutation ]), which changes their order;
version 5 read groups of half the buffer, not a quarter (``plan.group_rows``), and the stratified
block order (NOTE [ Stratified block order ]); version 6 the runs of blocks a buffer that holds
most of the rows permutes (NOTE [ Block runs ]); version 7 tar shards of any size permute single
blocks (their first reads come before the count: ``early.may_read_early``) and key their samples
by shard and sample (``reads.FileRowKeys``), which changes their order and their crops."""

Batch = dict[str, Any]
Imap = Callable[[Iterable[Any]], Iterator[Any]]


@dataclass(frozen=True)
class StreamOptions:
    """How to stream a source (the loader builds this from its own arguments).

    Attributes:
        batch_size: rows per batch.
        shuffle: permute blocks per (seed, epoch) and pass rows through the shuffle buffer.
        seed: the base of every random draw.
        shuffle_buffer: buffer capacity in rows (None: ``DEFAULT_SHUFFLE_BUFFER_ROWS``; the
            loader first replaces None by :func:`default_buffer_rows` of its source).
        drop_last: yield only full batches (the same number on every rank).
        rank: this process's rank (None: from torch.distributed when initialised, else 0).
        world_size: number of ranks (None: from torch.distributed when initialised, else 1).
        transform: called on every whole batch dict (after conversion to tensors).
        index_column: when set, every batch carries this int64 column, each sample's key
            (``reads.row_keys``: its row number in the source, its blocks in source order, or
            its file's number and its row in the file), read beside its columns, and
            ``__epoch__`` (NOTE [ Decode in the workers ] in pipeline.py).
    """

    batch_size: int = 1
    shuffle: bool = False
    seed: int = 0
    shuffle_buffer: int | None = None
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    transform: Callable[[Batch], Any] | None = None
    index_column: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"`batch_size` must be an int >= 1, got {self.batch_size!r}.")
        if self.shuffle_buffer is not None and self.shuffle_buffer < 1:
            raise ConfigError(f"`shuffle_buffer` must be >= 1, got {self.shuffle_buffer}.")
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError(f"give both `rank` and `world_size` or neither, got rank={self.rank}, world_size={self.world_size}.")
        if self.world_size is not None and self.rank is not None and not 0 <= self.rank < self.world_size:
            raise ConfigError(f"`rank` must be in [0, world_size), got rank={self.rank}, world_size={self.world_size}.")

    @property
    def buffer_rows(self) -> int:
        """The shuffle buffer's capacity in rows."""
        return self.shuffle_buffer or DEFAULT_SHUFFLE_BUFFER_ROWS

    def topology(self) -> tuple[int, int]:
        """(rank, world_size): as given, else torch.distributed's when initialised, else (0, 1)."""
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def with_topology(self) -> StreamOptions:
        """These options with the rank and world size read now, once (see :meth:`topology`).

        A pass plans with the topology it began on: a state taken after
        ``torch.distributed.destroy_process_group()`` (as a script's last checkpoint often is)
        still names the world size the pass was planned with, not the 1 read there.
        """
        rank, world_size = self.topology()
        return replace(self, rank=rank, world_size=world_size)


@dataclass
class StreamCounters:
    """What a stream records for the loader's stats; updated in the calling process.

    Attributes:
        ledger: the rows skipped by ``on_bad_rows="skip"`` in yielded batches.
    """

    ledger: BadRowLedger = field(default_factory=BadRowLedger)

    @property
    def bad_rows(self) -> int:
        """Rows skipped by ``on_bad_rows="skip"``."""
        return self.ledger.total

    @property
    def bad_rows_by_file(self) -> dict[str, int]:
        """Rows skipped, per file."""
        return self.ledger.by_file()


# -- the calling side ------------------------------------------------------------------------


_PER_SOURCE: weakref.WeakKeyDictionary[Source, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()
T = TypeVar("T")


def _per_source(source: Source, key: tuple[Any, ...], make: Callable[[], T]) -> T:
    """``make()``, remembered for ``source`` under ``key`` (a pure function of both: the last
    few results per source, gone with the source)."""
    memo = _PER_SOURCE.setdefault(source, {})
    if key not in memo:
        memo[key] = make()
        if len(memo) > 8:
            memo.pop(next(iter(memo)))
    return cast(T, memo[key])


def plan_for(source: Source, options: StreamOptions, epoch: int, legs: Sequence[Leg] = ()) -> RankPlan:
    """This rank's plan for ``epoch`` (counts the source's rows the first time), or for the leg
    after ``legs`` when the epoch was resumed on another topology (NOTE [ Elastic resume ])."""
    rank, world_size = options.topology()
    source.prepare()  # the row count and the schema, at once
    if not legs:
        # A plan is a pure function of these (its block runs too: of the source, the buffer and
        # the world size): made once per source (a load_state_dict checks the saved one, the
        # pass after it runs it, len() counts its batches).
        buffer = current_leg(options).buffer_rows
        key = ("plan", options.seed, epoch, options.shuffle, rank, world_size, options.batch_size,
               options.drop_last, buffer, len(source.blocks()))
        return _per_source(source, key, lambda: make_plan(
            source.blocks(), seed=options.seed, epoch=epoch, shuffle=options.shuffle, rank=rank,
            world_size=world_size, batch_size=options.batch_size, drop_last=options.drop_last,
            group_rows=group_rows(buffer), run=run_for(source, buffer, world_size),
        ))
    blocks = source.blocks()
    # The epoch's order is its first leg's, whatever topology resumed it (NOTE [ Block runs ]).
    run = run_for(source, legs[0].buffer_rows, legs[0].world_size)
    ordered = ordered_blocks(blocks, seed=options.seed, epoch=epoch, shuffle=options.shuffle, run=run)
    total = sum(b.rows for b in ordered)

    def leftovers_for(i: int) -> Leftovers:
        leg = legs[i]
        if not leg.buffer_rows:
            return no_buffer

        def replay(rank: int, share: Segments, sizes: np.ndarray, delivered: int) -> tuple[np.ndarray, int]:
            plan = RankPlan(group_tasks(tasks_for(ordered, share), group_rows(leg.buffer_rows)), len(share), sizes, total)
            buffer = ShuffleBuffer(leg.buffer_rows, buffer_keys(options.seed, epoch, rank, i))
            restore = BufferReplay.replay(plan, buffer, delivered)
            return np.concatenate((restore.held, restore.owed)), restore.consumed

        return replay

    # The positions the legs left are the same for every new rank: worked out once per source
    # (a job's ranks, a load_state_dict and the pass after it all ask).
    legs_key = ("legs", options.seed, epoch, options.shuffle, tuple(legs), len(blocks), total)
    sequence = _per_source(source, legs_key, lambda: epoch_sequence(total, legs, leftovers_for))
    leg = current_leg(options)
    share, sizes = rank_share(sequence, leg, rank)
    return RankPlan(group_tasks(tasks_for(ordered, share), group_rows(leg.buffer_rows)), len(share), sizes, total)


def run_for(source: Source, buffer_rows: int, world_size: int) -> int:
    """How many consecutive blocks of ``source`` its epoch permutation moves as one
    (``plan.block_runs``): one for a source whose first reads may come before its rows are
    counted (``early.may_read_early``, NOTE [ Early reads ]), in the order of single blocks."""
    if may_read_early(source):
        return 1
    return block_runs(len(source.blocks()), len(source), buffer_rows, world_size)


def current_leg(options: StreamOptions, batches: int = 0) -> Leg:
    """The leg ``options`` run (its topology), with ``batches`` delivered."""
    _, world_size = options.topology()
    return Leg(world_size, options.batch_size, options.drop_last, options.buffer_rows if options.shuffle else 0, batches)


def buffer_keys(seed: int, epoch: int, rank: int, leg: int) -> tuple[int, ...]:
    """The seed keys of the shuffle buffer's draws for one rank in one leg of an epoch."""
    return (seed % 2**64, epoch % 2**64, rank, TAG_BUFFER, leg)


def source_fingerprint(source: Source) -> dict[str, Any]:
    """What identifies the data of a stream in a state: files, rows, columns, blocks (the plan
    permutes them: another ``block_bytes`` is another plan) and a digest of the file names (not
    directories: a job may mount its data elsewhere), row counts and columns."""
    rows_per_file: dict[str, int] = {}
    for b in source.blocks():
        rows_per_file[b.path] = rows_per_file.get(b.path, 0) + b.rows
    digest = hashlib.sha1()
    for path, n in rows_per_file.items():
        digest.update(f"{os.path.basename(path)}\0{n}\n".encode())
    digest.update("\0".join(source.column_names).encode())
    return {
        "files": len(source.paths), "total_rows": sum(rows_per_file.values()),
        "columns": len(source.column_names), "blocks": len(source.blocks()), "digest": digest.hexdigest()[:16],
    }


def num_batches(source: Source, options: StreamOptions) -> int:
    """Batches per epoch on this rank (the same on every rank and every epoch)."""
    return plan_for(source, options, 0).num_batches


def iter_batches(
    source: Source,
    options: StreamOptions,
    *,
    epoch: int,
    imap: Imap,
    counters: StreamCounters | None = None,
    state: Mapping[str, Any] | None = None,
) -> BatchStream:
    """The batches of one epoch on this rank: ``dict[column, Tensor | list]`` after the transform.

    Args:
        source: what to read.
        options: batch size, shuffling, topology, transform.
        epoch: the epoch number (a new epoch is a new order).
        imap: runs ``stream.reads.make_handler_factory(source)``'s handler over tasks, results in order.
        counters: where the rows skipped by ``on_bad_rows="skip"`` are ledgered.
        state: a :meth:`BatchStream.get_state` to resume from, mid-epoch.

    Example:
        >>> from naiad.parallel import WorkerPool  # doctest: +SKIP
        >>> pool = WorkerPool(reads.make_handler_factory(src), num_workers=2)  # doctest: +SKIP
        >>> for batch in iter_batches(src, StreamOptions(batch_size=256, shuffle=True),
        ...                           epoch=0, imap=pool.imap): ...  # doctest: +SKIP
    """
    return BatchStream(source, options, epoch=epoch, imap=imap, counters=counters, state=state)


class BatchStream(Iterator[Batch]):
    """One epoch of batches on one rank, with a small resumable state (see :func:`iter_batches`)."""

    def __init__(
        self,
        source: Source,
        options: StreamOptions,
        *,
        epoch: int,
        imap: Imap,
        counters: StreamCounters | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        self.source = source
        self.options = options = options.with_topology()  # read once: the pass's plan, state and legs
        self.epoch = epoch
        self.counters = counters if counters is not None else StreamCounters()
        self.rank, self.world_size = options.topology()
        self.batches_yielded = 0
        self.bad_rows = 0  # rows of this epoch skipped before this stream's first batch (a resume's)
        self._tracker: BadRowTracker | None = None
        self.legs: list[Leg] = []  # the epoch's finished legs (NOTE [ Elastic resume ])
        self._plan: RankPlan | None = None
        # Resumed after the last batch of a leg on another topology: that state, kept as it is.
        self.ended: dict[str, Any] | None = None
        if state is not None:
            self._adopt(state)
        self.imap = imap
        self._gen: Iterator[Batch] | None = None

    @property
    def plan(self) -> RankPlan:
        """This rank's plan for the epoch's current leg (computed on first use)."""
        if self._plan is None:
            self._plan = plan_for(self.source, self.options, self.epoch, self.legs)
        return self._plan

    def __len__(self) -> int:
        return 0 if self.ended is not None else self.plan.num_batches - self.batches_yielded

    def __next__(self) -> Batch:
        if self._gen is None:
            self._gen = self._generate()
        batch = next(self._gen)
        self.batches_yielded += 1
        return batch

    def close(self) -> None:
        """Stop reading (the pool drops results still owed for this stream)."""
        if self._gen is not None:
            self._gen.close()  # type: ignore[attr-defined]

    def skipped_late(self, batch: int, entries: list[dict[str, Any]]) -> None:
        """Count samples of yielded batch ``batch`` skipped after it was cut (a decode stage's:
        NOTE [ Small samples decode in the reads ] in decode.py) as the reads' skipped rows are:
        in the ledger, in the state's ``bad_rows``, against ``max_bad_rows``."""
        if self._tracker is not None:
            self._tracker.count(batch, entries)
        else:
            self.counters.ledger.record(self.epoch, batch, entries)

    def get_state(self, batches_yielded: int | None = None) -> dict[str, Any]:
        """JSON-able position: the data, the plan's inputs, the legs and the batches yielded.

        Args:
            batches_yielded: the position to describe, when the consumer is behind the stream
                (batches read ahead); default: the batches this stream has yielded.
        """
        if self.ended is not None:
            return dict(self.ended)
        leg = current_leg(self.options)
        k = self.batches_yielded if batches_yielded is None else batches_yielded
        tracker = self._tracker
        return {
            "version": STREAM_STATE_VERSION, "epoch": self.epoch, "batches_yielded": k,
            "bad_rows": tracker.skipped_before(k, self.bad_rows) if tracker is not None else self.bad_rows,
            "bad_row_ledger": self.counters.ledger.state(self.epoch, k),
            "seed": self.options.seed, "shuffle": self.options.shuffle,
            **source_fingerprint(self.source), "rank": self.rank, "world_size": leg.world_size,
            "batch_size": leg.batch_size, "drop_last": leg.drop_last, "buffer_rows": leg.buffer_rows,
            "legs": [x.as_dict() for x in self.legs],
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`get_state` (before the first batch; same as ``iter_batches(state=)``).

        Raises:
            StateError: the state does not fit this stream (stored and current values shown),
                or this stream has started.
        """
        if self._gen is not None:
            raise StateError("set_state() after iteration started; make a new stream with `state=`.")
        self._adopt(state)

    def _adopt(self, state: Mapping[str, Any]) -> None:
        """Check ``state`` against this stream and take its position: the same leg when the
        topology is the same, else a new leg over what no old rank delivered."""
        if not isinstance(state, Mapping) or state.get("version") != STREAM_STATE_VERSION:
            got = state.get("version") if isinstance(state, Mapping) else state
            raise StateError(
                f"stream state version: stored {got!r:.80}, current {STREAM_STATE_VERSION}; a state saved by "
                "another version of naiad cannot resume mid-epoch (its shuffle or plan differ): start the "
                "epoch again, e.g. a fresh loader with `set_epoch(epoch)`."
            )
        if state.get("epoch") != self.epoch:
            raise StateError(f"stream state epoch: stored {state.get('epoch')!r}, current {self.epoch}.")
        current = {"seed": self.options.seed, "shuffle": self.options.shuffle, **source_fingerprint(self.source)}
        for key, value in current.items():
            if key == "blocks" and key not in state:
                continue  # saved before states named their block count
            if state.get(key) != value:
                raise StateError(
                    f"stream state {key!r}: stored {state.get(key)!r}, current {value!r}; a mid-epoch "
                    "resume needs the same files (rows, columns), blocks (`block_bytes`, `block_rows`) "
                    "and the same seed and shuffle; make the loader as it was, or resume at an epoch boundary."
                )
        legs = list(iter_legs(state.get("legs", [])))
        saved = Leg.from_dict(state, batches_key="batches_yielded")
        k = saved.batches
        skipped = state.get("bad_rows", 0)
        if not isinstance(skipped, int) or isinstance(skipped, bool) or skipped < 0:
            raise StateError(f"stream state bad_rows: stored {skipped!r:.80}, expected an int >= 0.")
        ledger = BadRowLedger()
        if "bad_row_ledger" in state:  # states of naiad before the ledger have none
            ledger.load(state["bad_row_ledger"])
        self.legs = legs
        self._plan = None
        saved_plan = plan_for(self.source, replace(self.options, rank=0, world_size=saved.world_size,
                                                   batch_size=saved.batch_size, drop_last=saved.drop_last,
                                                   shuffle_buffer=saved.buffer_rows or None), self.epoch, legs)
        if not 0 <= k <= saved_plan.num_batches:
            raise StateError(f"stream state batches_yielded: stored {k!r}, its plan has {saved_plan.num_batches}.")
        # The skipped rows counted so far survive the resume (the ledger is the saving rank's).
        self.counters.ledger = ledger
        self.bad_rows = skipped
        if saved.same_topology(current_leg(self.options)):
            self.batches_yielded = k
        elif k < saved_plan.num_batches:  # elastic: a new leg over the rows still owed
            self.legs = [*legs, saved]
        else:  # the saved leg had ended: the epoch is over (drop_last's leftovers stay unused)
            self.ended = dict(state)

    # -- the pipeline --------------------------------------------------------------------------

    def _early_reads(self) -> EarlyReads | None:
        """Reads planned before the rows are counted: a fresh pass on one rank (NOTE [ Early reads ])."""
        if self._plan is not None or self.batches_yielded or self.legs or self.world_size != 1:
            return None
        if self.options.index_column is not None and not self.source.traits.keys_by_file:
            return None  # a row's number in the source needs every block's count before the first read
        o = self.options
        return EarlyReads.start(self.source, seed=o.seed, epoch=self.epoch, shuffle=o.shuffle,
                                max_rows=group_rows(current_leg(o).buffer_rows), plan=lambda: self.plan)

    def _generate(self) -> Iterator[Batch]:
        if self.ended is not None:
            return
        o = self.options
        early = self._early_reads()
        # Early reads know no batch sizes until the count ends: all are batch_size but the last.
        sizes = self.plan.batch_sizes if early is None else None
        if sizes is not None and len(sizes) == 0:
            return
        start = int(sizes[: self.batches_yielded].sum()) if sizes is not None else 0
        buffer = ShuffleBuffer(o.buffer_rows, buffer_keys(o.seed, self.epoch, self.rank, len(self.legs))) if o.shuffle else None
        batcher = Batcher(sizes, self.batches_yielded, self.source.empty_columns(), o.batch_size)
        if batcher.done:
            return
        tracker = None
        if sizes is not None and self.source.on_bad_rows == "skip":
            tracker = self._tracker = BadRowTracker(
                self.counters.ledger, self.epoch, self.source.max_bad_rows, int(sizes.sum()), self.bad_rows,
            )
        restoring: Restoring | None = None
        if early is None:
            plan = self.plan
            restore = BufferReplay.replay(plan, buffer, start) if start else BufferReplay.nothing()
            # A resume's owed rows, then its held rows, come first (NOTE [ Owed rows first ]).
            # Blocks decoded whole whatever rows are picked (row groups, compressed files) are read once.
            whole = self.source.traits.blocks_from_metadata or any(b.stop < 0 for b in self.source.blocks())
            restoring = Restoring(plan, restore, group_rows(o.buffer_rows), int(plan.batch_sizes[self.batches_yielded]),
                                  in_steps=not whole)
            results = self.imap(restoring.tasks())
        else:
            results = self.imap(early.tasks())
        try:
            for i, (columns, bad) in enumerate(results if early is None else early.checked(iter(results))):
                arrays = {name: as_array(col) for name, col in columns.items()}
                if tracker is not None:  # skipped rows keep their positions until their batch
                    arrays = tracker.tag(arrays, bad)
                if restoring is not None and restoring.restores(i):
                    batcher.add(restoring.take(arrays))
                    yield from self._emit(batcher.ready())
                    continue
                if restoring is not None:
                    restoring.settle(buffer)  # the held rows, back in the buffer before it takes more
                if early is not None and early.plan is not None:
                    self._adopt_plan(early, batcher)
                for chunk in buffer.push(arrays) if buffer is not None else [arrays]:
                    batcher.add(chunk)
                    yield from self._emit(batcher.ready())
                if batcher.done:
                    return  # drop_last: the remaining rows are not used this epoch
            if early is not None:
                self._adopt_plan(early, batcher)  # waits for the count, if it still runs
            if buffer is not None:
                if restoring is not None:
                    restoring.settle(buffer)
                for chunk in buffer.drain():  # a chunk at a time: the next batch waits for one
                    batcher.add(chunk)
                    yield from self._emit(batcher.ready())
            yield from self._emit(batcher.ready())
            yield from self._emit(batcher.finish())
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()

    def _adopt_plan(self, early: EarlyReads, batcher: Batcher) -> None:
        """The pass's plan, once early reads have it: this stream's, and its batch sizes."""
        if batcher.sizes is None:
            self._plan = early.resolve()
            batcher.sizes = self._plan.batch_sizes

    def _emit(self, batches: Iterable[dict[str, np.ndarray]]) -> Iterator[Batch]:
        transform = self.options.transform
        for arrays in batches:
            if self._tracker is not None:  # the batch being cut is batch number batches_yielded
                arrays = self._tracker.untag(arrays, self.batches_yielded)
            index = self.options.index_column
            if index is not None and index not in arrays:  # an empty batch (every row skipped)
                arrays = {**arrays, index: np.zeros(0, np.int64)}
            batch = to_torch(arrays)
            if index is not None:
                batch["__epoch__"] = self.epoch
            yield transform(batch) if transform is not None else batch
