"""Streaming a :class:`~naiad.sources.Source` as batches: :class:`BatchStream`, one epoch on one rank.

The calling process computes the plan (:mod:`naiad.stream.planning`), and the pass runs as a
chain of stages (NOTE [ Stream stages ] in stages.py): the tasks (from the plan, early reads or a
resume's restoring reads) through ``imap`` (a :class:`~naiad.parallel.WorkerPool`'s ordered
``imap``, or inline), the blocks that come back, in plan order, through the shuffle buffer
(:mod:`naiad.stream.shuffle`), the rows cut into the planned batches. Because the plan, the order
of the results and the buffer's draws do not depend on the workers, the batches are the same
whatever ``num_workers`` is. The stream's state is nested by stage and checked by a pure
function (NOTE [ Stream state layout ] in state.py).

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

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from naiad.errors import StateError
from naiad.order.elastic import Leg
from naiad.sources.base import Source
from naiad.sources.wrapper import FormatWrapper
from naiad.stream.batching import Batcher
from naiad.stream.early import EarlyReads, declined
from naiad.stream.ledger import BadRowLedger, BadRowTracker
from naiad.stream.options import (
    BUFFER_BYTES_BUDGET,
    DEFAULT_SHUFFLE_BUFFER_ROWS,
    FEW_BLOCKS,
    MIN_SAMPLE_BUFFER_ROWS,
    Batch,
    Imap,
    StreamCounters,
    StreamOptions,
    default_buffer_rows,
)
from naiad.stream.plan import RankPlan, group_rows
from naiad.stream.planning import (
    buffer_keys,
    current_leg,
    num_batches,
    plan_for,
    run_for,
    source_fingerprint,
)
from naiad.stream.replay import BufferReplay
from naiad.stream.restore import Restoring
from naiad.stream.shuffle import ShuffleBuffer
from naiad.stream.stages import (
    BatchStage,
    EarlyTasks,
    PlanTasks,
    ReadStage,
    RestoreTasks,
    ShuffleStage,
    StreamStages,
    TaskOrigin,
    run_stages,
)
from naiad.stream.state import (
    STREAM_STATE_VERSION,
    StreamFacts,
    StreamPosition,
    check_stream_state,
    stream_state,
)

__all__ = [
    "BUFFER_BYTES_BUDGET",
    "DEFAULT_SHUFFLE_BUFFER_ROWS",
    "FEW_BLOCKS",
    "MIN_SAMPLE_BUFFER_ROWS",
    "STREAM_STATE_VERSION",
    "BatchStream",
    "StreamCounters",
    "StreamOptions",
    "buffer_keys",
    "current_leg",
    "default_buffer_rows",
    "iter_batches",
    "num_batches",
    "plan_for",
    "run_for",
    "source_fingerprint",
    "start_state",
    "stream_facts",
]


def stream_facts(source: Source, options: StreamOptions, epoch: int) -> StreamFacts:
    """What a stored state of ``source``'s stream in ``epoch`` is checked against (``check_stream_state``):
    the options' seed and shuffle, the data's fingerprint and the plans of its legs (made once per
    source: the pass after the check finds them made)."""
    options = options.with_topology()

    def batches(leg: Leg, legs: Any) -> int:
        saved = replace(options, rank=0, world_size=leg.world_size, batch_size=leg.batch_size,
                        drop_last=leg.drop_last, shuffle_buffer=leg.buffer_rows or None)
        return plan_for(source, saved, epoch, legs).num_batches

    return StreamFacts(epoch, options.seed, options.shuffle, source_fingerprint(source), batches,
                       flat_refused=_flat_refused(source))


def _flat_refused(source: Source) -> str | None:
    """Why a version 7 state cannot resume ``source``'s stream, if it cannot: a wrapper over a
    source read before its count (tokenized tar shards) planned block runs in version 7 where
    its inner source permuted single blocks; version 8 plans as the inner source does."""
    if isinstance(source, FormatWrapper) and source.inner.traits.reads_before_count:
        return (f"{type(source).__name__} over {type(source.inner).__name__} permutes single blocks "
                "since version 8 (before, block runs): its order in that epoch differs")
    return None


def start_state(source: Source, options: StreamOptions, epoch: int, ledger: BadRowLedger) -> dict[str, Any]:
    """The state of ``source``'s stream before the first batch of ``epoch`` (``ledger``: the rows
    skipped in the epochs before), as :meth:`BatchStream.get_state` says it, without a stream."""
    options = options.with_topology()
    return stream_state(epoch=epoch, seed=options.seed, shuffle=options.shuffle, rank=options.topology()[0],
                        leg=current_leg(options), legs=(), source=source_fingerprint(source), bad_rows=0,
                        ledger=ledger.state(epoch, 0))


class BatchStream(Iterator[Batch]):
    """The batches of one epoch on this rank, ``dict[column, Tensor | list]`` after the
    transform, with a small resumable state (:meth:`get_state`).

    Its batches come from a chain of stages made at the first ``next()`` (NOTE [ Stream stages ]
    in stages.py); ``close()`` closes them.

    Args:
        source: what to read.
        options: batch size, shuffling, topology, transform.
        epoch: the epoch number (a new epoch is a new order).
        imap: runs ``stream.reads.make_handler_factory(source)``'s handler over tasks, results in order.
        counters: where the rows skipped by ``on_bad_rows="skip"`` are ledgered.
        state: a :meth:`get_state` to resume from, mid-epoch.

    Example:
        >>> from naiad.parallel import WorkerPool  # doctest: +SKIP
        >>> pool = WorkerPool(reads.make_handler_factory(src), num_workers=2)  # doctest: +SKIP
        >>> for batch in iter_batches(src, StreamOptions(batch_size=256, shuffle=True),
        ...                           epoch=0, imap=pool.imap): ...  # doctest: +SKIP
    """

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
        self._stages: StreamStages | None = None

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
            self._gen = run_stages(self._open)  # made at the first next()
        batch = next(self._gen)
        self.batches_yielded += 1
        return batch

    def close(self) -> None:
        """Stop reading: the stages close, from the batches back to the tasks (the pool drops
        results still owed for this stream)."""
        if self._gen is not None:
            self._gen.close()  # type: ignore[attr-defined]
        if self._stages is not None:
            self._stages.close()
        if self._tracker is not None:
            self._tracker.report()  # the pass's skipped rows, summarised in the log

    def skipped_late(self, batch: int, entries: list[dict[str, Any]]) -> None:
        """Count samples of yielded batch ``batch`` skipped after it was cut (a decode stage's:
        NOTE [ Small samples decode in the reads ] in decode.py) as the reads' skipped rows are:
        in the ledger, in the state's ``bad_rows``, against ``max_bad_rows``."""
        if self._tracker is not None:
            self._tracker.count(batch, entries)
        else:
            self.counters.ledger.record(self.epoch, batch, entries)

    def get_state(self, batches_yielded: int | None = None) -> dict[str, Any]:
        """JSON-able position, nested by stage (NOTE [ Stream state layout ] in state.py): the
        plan's inputs and legs, the data, the buffer, the batches yielded, the rows skipped.

        Args:
            batches_yielded: the position to describe, when the consumer is behind the stream
                (batches read ahead); default: the batches this stream has yielded.
        """
        if self.ended is not None:
            return dict(self.ended)
        k = self.batches_yielded if batches_yielded is None else batches_yielded
        tracker = self._tracker
        return stream_state(
            epoch=self.epoch, seed=self.options.seed, shuffle=self.options.shuffle, rank=self.rank,
            leg=current_leg(self.options, k), legs=self.legs, source=source_fingerprint(self.source),
            bad_rows=tracker.skipped_before(k, self.bad_rows) if tracker is not None else self.bad_rows,
            ledger=self.counters.ledger.state(self.epoch, k),
        )

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
        """Check ``state`` against this stream (``state.check_stream_state``) and take its
        position: the same leg when the topology is the same, else a new leg over what no old
        rank delivered."""
        at: StreamPosition = check_stream_state(state, stream_facts(self.source, self.options, self.epoch))
        self.legs = at.legs
        self._plan = None
        # The skipped rows counted so far survive the resume (the ledger is the saving rank's).
        self.counters.ledger = at.ledger
        self.bad_rows = at.bad_rows
        if at.saved.same_topology(current_leg(self.options)):
            self.batches_yielded = at.saved.batches
        elif not at.ended:  # elastic: a new leg over the rows still owed
            self.legs = [*at.legs, at.saved]
        else:  # the saved leg had ended: the epoch is over (drop_last's leftovers stay unused)
            self.ended = at.state

    # -- the chain of stages (NOTE [ Stream stages ] in stages.py) -----------------------------

    def _open(self) -> StreamStages | None:
        """The pass's chain of stages, or None where it has no batch to yield."""
        if self.ended is not None:
            return None
        o = self.options
        early = self._early_reads()
        # Early reads know no batch sizes until the count ends: all are batch_size but the last.
        sizes = self.plan.batch_sizes if early is None else None
        if sizes is not None and len(sizes) == 0:
            return None
        buffer = ShuffleBuffer(o.buffer_rows, buffer_keys(o.seed, self.epoch, self.rank, len(self.legs))) if o.shuffle else None
        batcher = Batcher(sizes, self.batches_yielded, self.source.empty_columns(), o.batch_size)
        if batcher.done:
            return None
        if sizes is not None and self.source.on_bad_rows == "skip":
            self._tracker = BadRowTracker(
                self.counters.ledger, self.epoch, self.source.max_bad_rows, int(sizes.sum()), self.bad_rows,
            )
        origin = self._origin(early, buffer, batcher)
        batches = BatchStage(batcher, tracker=self._tracker, index_column=o.index_column, epoch=self.epoch,
                             transform=o.transform)
        self._stages = StreamStages(origin, ReadStage(origin, self.imap, self._tracker), ShuffleStage(buffer, origin),
                                    batches)
        return self._stages

    def _origin(self, early: EarlyReads | None, buffer: ShuffleBuffer | None, batcher: Batcher) -> TaskOrigin:
        """Where the pass's tasks come from: early reads, a resume's restoring reads, or the plan."""
        if early is not None:
            return EarlyTasks(early, batcher, self._set_plan)
        plan = self.plan
        start = int(plan.batch_sizes[: self.batches_yielded].sum())
        if not start:
            return PlanTasks(plan)
        # A resume's owed rows, then its held rows, come first (NOTE [ Owed rows first ]).
        # Blocks decoded whole whatever rows are picked (row groups, compressed files) are read once.
        whole = self.source.traits.blocks_from_metadata or any(b.stop < 0 for b in self.source.blocks())
        restoring = Restoring(plan, BufferReplay.replay(plan, buffer, start), group_rows(self.options.buffer_rows),
                              int(plan.batch_sizes[self.batches_yielded]), in_steps=not whole)
        return RestoreTasks(restoring)

    def _set_plan(self, plan: RankPlan) -> None:
        self._plan = plan

    def _early_reads(self) -> EarlyReads | None:
        """Reads planned before the rows are counted: a fresh pass on one rank (NOTE [ Early reads ])."""
        if self._plan is not None:
            return None
        if self.batches_yielded or self.legs or self.world_size != 1:
            declined(self.source, "only a fresh pass on one rank reads early")
            return None
        if self.options.index_column is not None and not self.source.traits.keys_by_file:
            # a row's number in the source needs every block's count before the first read
            declined(self.source, "a worker-side transform keys rows by their number in the source")
            return None
        o = self.options
        return EarlyReads.start(self.source, seed=o.seed, epoch=self.epoch, shuffle=o.shuffle,
                                max_rows=group_rows(current_leg(o).buffer_rows), plan=lambda: self.plan)


iter_batches = BatchStream
"""One epoch's batches on this rank: a :class:`BatchStream`."""
