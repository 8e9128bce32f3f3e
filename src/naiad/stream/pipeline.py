"""The streaming pipeline: a Source's blocks through the plan, the workers and the shuffle buffer.

It also owns its read-ahead policy: with ``num_workers=0`` a stream is read and parsed ahead of
the loop on a few threads (:func:`default_read_ahead`), none where every read comes before the
first batch anyway, and the default's threads are measured against reading inline while the loop
runs (NOTE [ Tuned read-ahead ] in parallel/read_ahead.py). The loader asks; it checks no kind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from naiad.media.rows import release_threads
from naiad.parallel import HandlerFactory, WorkerPool
from naiad.parallel.read_ahead import ReadAheadTuner
from naiad.parallel.threads import usable_cores
from naiad.sources.base import Source
from naiad.sources.storage import is_remote
from naiad.stream.batches import (
    BatchStream,
    StreamCounters,
    StreamOptions,
    default_buffer_rows,
    num_batches,
    start_state,
    stream_facts,
)
from naiad.stream.decode import (
    DecodeAhead,
    SeededRead,
    make_decoding_handler_factory,
)
from naiad.stream.decode_workers import DecodeInWorkers, DecodeTask, make_stage_handler_factory
from naiad.stream.plan import GroupTask, RestoreTask, group_rows
from naiad.stream.reads import make_handler_factory
from naiad.stream.state import check_stream_state
from naiad.transforms import place

__all__ = ["StreamPipeline", "default_read_ahead"]


def default_read_ahead(remote: bool = False) -> int:
    """Read-ahead threads of a streaming source with ``num_workers=0``: two where there are two
    cores or more (one parses while the other's block is handed over), none on one core. A
    source with URLs gets twice the cores, 4 to 8: its threads mostly wait on requests, and a
    Parquet row group or a big block is a task of its own, so only more tasks in flight hide
    the latency (docs/STORAGE.md, "Read-ahead")."""
    cores = usable_cores()
    if remote:
        return min(8, max(4, 2 * cores))
    return 2 if cores >= 2 else 0


class StreamPipeline:
    """A :class:`~naiad.Source` streamed in batches (see :mod:`naiad.stream.batches`)."""

    kind = "stream"
    stage = "read"
    strategy = "stream"
    sharded_by_loader = False
    warns_past_length = False

    def __init__(self, source: Source, options: StreamOptions, counters: StreamCounters,
                 read_ahead: int | None = None, batch_transform: Callable[[Any], Any] | None = None) -> None:
        """``read_ahead``: the user's read-ahead threads (None: the default, tuned);
        ``batch_transform``: a worker-side transform (NOTE [ Decode in the workers ]), run in
        the reads for small fixed-size samples, else on the pass's decode stage, with their
        samples' keys (NOTE [ Small samples decode in the reads ] in decode.py); a stage
        transform that holds the GIL runs in the worker processes, when there are some (NOTE
        [ Decode stage in the worker processes ] in decode_workers.py)."""
        self.source = source
        self.batch_transform = batch_transform
        placed = place(batch_transform, "stream")  # NOTE [ Transform placement ] in transforms.py
        self.decode_in_reads = batch_transform is not None and placed.runs == "reads"
        self.stage_in_processes = batch_transform is not None and placed.stage_in_processes
        if batch_transform is not None and options.index_column is None:
            options = replace(options, index_column=placed.key or "__index__")
        if options.shuffle and options.shuffle_buffer is None:
            decoded = placed.decoded_row_bytes if self.decode_in_reads else None
            options = replace(options, shuffle_buffer=default_buffer_rows(source, decoded_bytes=decoded))
        self.options = options
        self.counters = counters
        self.read_ahead = read_ahead
        self._ahead_tuner: ReadAheadTuner | None = None  # the default's (NOTE [ Tuned read-ahead ])
        self._planned: StreamOptions | None = None  # the options of the last pass, its topology read then

    # -- the read-ahead policy ---------------------------------------------------------------

    def _reads_urls(self) -> bool:
        """Whether the source has a remote file (its read-ahead waits on requests)."""
        return any(is_remote(p) for p in self.source.paths)

    def read_ahead_threads(self) -> int:
        """Threads that read ahead of a loader without workers: the user's ``read_ahead``, else
        none where every read but at most one comes before the first batch (read inline, on
        PyArrow's threads: 10 MB files ran 1.07-1.21x the read-ahead threads, bench/RESULTS.md),
        else :func:`default_read_ahead`."""
        if self.read_ahead is not None:
            return self.read_ahead
        if self.reads_before_first_batch():
            return 0
        return default_read_ahead(remote=self._reads_urls())

    def read_ahead_tuner(self, threads: int, prefetch: int) -> ReadAheadTuner | None:
        """The default threads' tuner, made once and kept across passes (it keeps what it
        learnt); None where the user set ``read_ahead``, or for URLs, whose threads mostly wait
        on requests."""
        if self.read_ahead is not None or self._reads_urls():
            return None
        if self._ahead_tuner is None:
            self._ahead_tuner = ReadAheadTuner(threads, self.batches_per_read(), prefetch, settled=self.settled)
        return self._ahead_tuner

    def read_ahead_info(self, threads: int) -> dict[str, Any]:
        ahead = self._ahead_tuner
        if ahead is not None:
            return {"read_ahead": ahead.decision.num_workers,
                    "reason": f"the default: {threads} read-ahead thread(s) where they pay: {ahead.decision.reason}",
                    "read_ahead_tuning": ahead.stats()}
        return {"read_ahead": threads, "reason": f"{threads} thread(s) read the stream ahead (`read_ahead=`)"}

    # -- passes ------------------------------------------------------------------------------

    def handler_factory(self) -> HandlerFactory:
        if self.decode_in_reads:
            assert self.batch_transform is not None and self.options.index_column is not None
            return make_decoding_handler_factory(self.source, self.options.index_column, self.batch_transform)
        reads = make_handler_factory(self.source, self.options.index_column)
        if self.stage_in_processes:  # the workers answer the decode stage's tasks too
            assert self.batch_transform is not None and self.options.index_column is not None
            return make_stage_handler_factory(reads, self.source, self.options.index_column, self.batch_transform)
        return reads

    def describe_task(self, task: Any) -> str:
        if isinstance(task, SeededRead):
            return self.describe_task(task.task)
        if isinstance(task, DecodeTask):
            return f"the decode of batch {task.number} of epoch {task.epoch} by {self.batch_transform!r:.200}"
        if isinstance(task, RestoreTask):
            files = sorted({t.block.path for t in task.reads})
            return f"the {task.rows} rows a resume restores from {len(task.reads)} block(s) of {', '.join(files[:3])}"
        if isinstance(task, GroupTask):
            first, last = task.reads[0], task.reads[-1]
            return (f"{len(task.reads)} blocks read as one group, from {first.block.path} (block from {first.block.start}) "
                    f"to {last.block.path} (block from {last.block.start})")
        block = getattr(task, "block", None)
        if block is None:
            return f"block {task!r:.300}"
        return f"{block.path} (block from {block.start} to {block.stop}, its rows {task.lo}:{task.hi})"

    def num_batches(self) -> int:
        return num_batches(self.source, self.options)

    def reads_before_first_batch(self) -> bool:
        """Whether a shuffled epoch makes all its reads but at most one before its first batch:
        its rows fit in the shuffle buffer and one read group more (known without a scan; else
        False). Threads reading ahead then overlap (almost) nothing with the training loop."""
        rows = self.source.known_rows() if self.options.shuffle else None
        buffer = self.options.shuffle_buffer or 0
        return rows is not None and rows <= buffer + group_rows(buffer)

    def batches_per_read(self) -> int:
        """About how many batches one read task of a pass yields (a read group: NOTE [ Read
        groups ] in plan.py), what a measurement of the reads must span."""
        buffer = self.options.buffer_rows if self.options.shuffle else 0
        return max(1, group_rows(buffer) // max(1, self.options.batch_size))

    def settled(self) -> bool:
        """Whether the source's rows are counted: a count beside the first reads (NOTE [ Early
        reads ]) is CPU time of the process that is neither the reads' nor the step's."""
        return self.source.counted()

    def why_not_resumable(self) -> str | None:
        return None

    def open_pass(self, epoch: int, base_seed: int, resume: Mapping[str, Any] | None) -> StreamPass:
        stream = BatchStream(self.source, self.options, epoch=epoch, imap=_unset, counters=self.counters, state=resume)
        self._planned = stream.options  # the topology is read once per pass, here
        return StreamPass(stream, self.batch_transform, base_seed, in_reads=self.decode_in_reads,
                          in_processes=self.stage_in_processes)

    def start_state(self, epoch: int) -> dict[str, Any]:
        # The counters' ledger goes into the state: the rows skipped so far survive a resume.
        # After a pass, the next epoch starts on that pass's topology: a state taken once
        # torch.distributed is torn down must not say world size 1 (the epoch's order
        # depends on the world size, NOTE [ Block runs ] in plan.py).
        options = self._planned or self.options
        return start_state(self.source, options, epoch, self.counters.ledger)

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        # A pure check of the data, seed and position (replaying any legs), no pass made.
        check_stream_state(part, stream_facts(self.source, self.options, epoch))


class _DecodedInReads(Iterator[Any]):
    """The batches of a stream that decodes in its reads. A batch of no rows (each one skipped)
    never met the decode (it is the source's empty columns), so it meets it here: its empty
    columns in the transformed shape."""

    def __init__(self, stream: BatchStream, transform: Any) -> None:
        self.stream = stream
        self.transform = transform
        self.index = stream.options.index_column  # every batch carries its keys, an empty one too

    def __iter__(self) -> _DecodedInReads:
        return self

    def __next__(self) -> Any:
        batch = next(self.stream)
        if self.index is not None and len(batch[self.index]) == 0:
            batch = self.transform(batch)
        return batch

    def close(self) -> None:
        """Stop the stream; this process's decode threads end (NOTE [ Decode threads ])."""
        self.stream.close()
        release_threads()


def _unset(tasks: Any) -> Iterator[Any]:
    raise RuntimeError("this stream was opened to plan, not to read")


class StreamPass:
    """One pass of a stream: its :class:`~naiad.stream.batches.BatchStream` run through the pool."""

    deliveries = None  # always in plan order: the count is the position

    def __init__(self, stream: BatchStream, transform: Callable[[Any], Any] | None = None, base_seed: int = 0,
                 *, in_reads: bool = False, in_processes: bool = False) -> None:
        """``in_reads``: ``transform`` runs in the reads (NOTE [ Small samples decode in the reads ]);
        ``in_processes``: on the decode stage, in the pool's worker processes when it has some
        (NOTE [ Decode stage in the worker processes ])."""
        self.stream = stream
        self.start = stream.batches_yielded
        self.transform = transform
        self.base_seed = base_seed
        self.in_reads = in_reads
        self.in_processes = in_processes

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        # Block reads run no user code: no per-task seeding, and always in plan order (the
        # shuffle buffer needs its chunks in order, whatever `in_order` says).
        imap = functools.partial(pool.imap, prefetch=prefetch, in_order=True, epoch=self.stream.epoch)
        self.stream.imap = imap
        index = self.stream.options.index_column
        if self.transform is None or index is None:
            return self.stream
        if self.in_reads:
            epoch, seed = self.stream.epoch, self.base_seed
            self.stream.imap = lambda tasks: imap(SeededRead(task, epoch, seed) for task in tasks)
            return _DecodedInReads(self.stream, self.transform)
        if self.in_processes and pool.mode == "process":
            # NOTE [ Decode stage in the worker processes ]: the same workers as the reads.
            return DecodeInWorkers(self.stream, pool, base_seed=self.base_seed, prefetch=prefetch)
        # NOTE [ Decode in the workers ]: the decode a few batches ahead, on threads, in order.
        # NOTE [ Stage deadline ]: the loop's wait for a decoded batch has the pool's bound.
        return DecodeAhead(self.stream, self.transform, index_column=index, base_seed=self.base_seed,
                           depth=prefetch, stage_seconds=pool.stage_seconds, timeout_s=pool.timeout_s)

    def state(self, delivered: int) -> dict[str, Any]:
        return self.stream.get_state(batches_yielded=self.start + delivered)

    def __len__(self) -> int:
        # From where the pass began, as a map-style pass counts (the stream's own len() is what
        # it still owes); asked when a state needs it, perhaps after some batches.
        return len(self.stream) + self.stream.batches_yielded - self.start
