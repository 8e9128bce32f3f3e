"""Streaming a :class:`~naiad.sources.Source` as batches: plan -> workers read -> shuffle -> batch.

The calling process computes the plan (:mod:`naiad.plan`), hands the read tasks to ``imap``
(a :class:`~naiad.parallel.WorkerPool`'s ordered ``imap``, or inline), passes the blocks that
come back, in plan order, through the shuffle buffer (:mod:`naiad.shuffle`) and cuts the rows
into the planned batches. Because the plan, the order of the results and the buffer's draws do
not depend on the workers, the batches are the same whatever ``num_workers`` is.

NOTE [ Mid-epoch resume ]
A stream's state is a handful of integers: the plan's inputs and the number of batches
yielded. To resume after ``k`` batches, the shuffle buffer is first run over row *positions*
only (no I/O; its random draws depend only on chunk sizes), which tells which positions it
holds and which are still owed from the chunk it was emitting. Only the blocks that hold those
rows (the window since the oldest one) are read again, their rows put back in their slots, and
the stream continues. Rows skipped by ``on_bad_rows="skip"`` shift positions, so a state taken
after skipping rows is refused (StateError) instead of resumed inexactly.
"""

from __future__ import annotations

import functools
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from naiad.errors import ConfigError, StateError
from naiad.parallel import HandlerFactory, WorkerContext
from naiad.plan import TAG_BUFFER, RankPlan, ReadTask, make_plan, rng_for
from naiad.shuffle import BufferReplay, ShuffleBuffer, as_array
from naiad.sources.base import Source

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER_ROWS",
    "BatchStream",
    "PackXY",
    "StreamCounters",
    "StreamOptions",
    "iter_batches",
    "make_handler_factory",
    "num_batches",
    "pack_xy",
]

DEFAULT_SHUFFLE_BUFFER_ROWS = 1 << 17
"""131,072 rows: about 9 MB for ten float64 columns; raise it for better mixing on big data."""

Batch = dict[str, Any]
Imap = Callable[[Iterable[Any]], Iterator[Any]]


@dataclass(frozen=True)
class StreamOptions:
    """How to stream a source (the loader builds this from its own arguments).

    Attributes:
        batch_size: rows per batch.
        shuffle: permute blocks per (seed, epoch) and pass rows through the shuffle buffer.
        seed: the base of every random draw.
        shuffle_buffer: buffer capacity in rows (None: ``DEFAULT_SHUFFLE_BUFFER_ROWS``).
        drop_last: yield only full batches (the same number on every rank).
        rank: this process's rank (None: from torch.distributed when initialised, else 0).
        world_size: number of ranks (None: from torch.distributed when initialised, else 1).
        transform: called on every whole batch dict (after conversion to tensors).
    """

    batch_size: int = 1
    shuffle: bool = False
    seed: int = 0
    shuffle_buffer: int | None = None
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    transform: Callable[[Batch], Any] | None = None

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


@dataclass
class StreamCounters:
    """What a stream has done, for the loader's stats; updated in the calling process.

    Attributes:
        blocks_read: read tasks completed.
        rows_read: rows that came back from the workers.
        rows_yielded: rows in yielded batches.
        batches: batches yielded.
        bad_rows: rows skipped by ``on_bad_rows="skip"``.
        bad_rows_by_file: the same, per file.
    """

    blocks_read: int = 0
    rows_read: int = 0
    rows_yielded: int = 0
    batches: int = 0
    bad_rows: int = 0
    bad_rows_by_file: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain data."""
        return {
            "blocks_read": self.blocks_read, "rows_read": self.rows_read,
            "rows_yielded": self.rows_yielded, "batches": self.batches,
            "bad_rows": self.bad_rows, "bad_rows_by_file": dict(self.bad_rows_by_file),
        }


# -- the worker side -------------------------------------------------------------------------


def make_handler_factory(source: Source) -> HandlerFactory:
    """A picklable factory that builds, in each worker, ``handler(ReadTask) -> (columns, bad_rows)``.

    ``columns`` is a plain dict of NumPy arrays (numeric; they cross processes through shared
    memory) and lists (strings and other values).
    """
    return functools.partial(_build_handler, source)


def _build_handler(source: Source, context: WorkerContext) -> Callable[[Any], tuple[dict[str, Any], int]]:
    if context.mode == "process":
        # Arrow hands out read-only NumPy views; the pool copies them into shared memory, so
        # torch's warning about non-writable arrays is noise there.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    # Inline there is no other worker, so PyArrow may use its own threads on a block.
    return functools.partial(_read_task, source, context.num_workers == 0)


def _read_task(source: Source, use_threads: bool, task: ReadTask) -> tuple[dict[str, Any], int]:
    block, lo, hi = task
    data = source.read_block(block, lo, hi, use_threads=use_threads)
    return dict(data.columns), data.bad_rows  # plain dict and tuple: WorkerPool looks inside


# -- the calling side ------------------------------------------------------------------------


def plan_for(source: Source, options: StreamOptions, epoch: int) -> RankPlan:
    """This rank's plan for ``epoch`` (counts the source's rows the first time)."""
    rank, world_size = options.topology()
    return make_plan(
        source.blocks(), seed=options.seed, epoch=epoch, shuffle=options.shuffle, rank=rank,
        world_size=world_size, batch_size=options.batch_size, drop_last=options.drop_last,
    )


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
        imap: runs ``make_handler_factory(source)``'s handler over tasks, results in order.
        counters: updated as blocks arrive and batches leave.
        state: a :meth:`BatchStream.get_state` to resume from, mid-epoch.

    Example:
        >>> from naiad.parallel import WorkerPool  # doctest: +SKIP
        >>> pool = WorkerPool(make_handler_factory(src), num_workers=2)  # doctest: +SKIP
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
        self.options = options
        self.epoch = epoch
        self.counters = counters if counters is not None else StreamCounters()
        self.plan = plan_for(source, options, epoch)
        self.rank, self.world_size = options.topology()
        self.batches_yielded = 0
        self.bad_rows = 0  # skipped in this stream (a mid-epoch resume cannot replay them)
        if state is not None:
            self._check_state(state)
            self.batches_yielded = int(state["batches_yielded"])
        self._imap = imap
        self._gen: Iterator[Batch] | None = None

    def __len__(self) -> int:
        return self.plan.num_batches - self.batches_yielded

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

    def get_state(self) -> dict[str, Any]:
        """JSON-able position: the plan's inputs and the batches yielded so far."""
        return {
            "version": 1, "epoch": self.epoch, "batches_yielded": self.batches_yielded,
            "bad_rows": self.bad_rows, **self._plan_key(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`get_state` (before the first batch; same as ``iter_batches(state=)``).

        Raises:
            StateError: the state does not fit this stream (stored and current values shown),
                or this stream has started.
        """
        if self._gen is not None:
            raise StateError("set_state() after iteration started; make a new stream with `state=`.")
        self._check_state(state)
        self.batches_yielded = int(state["batches_yielded"])

    def _plan_key(self) -> dict[str, Any]:
        o = self.options
        return {
            "seed": o.seed, "shuffle": o.shuffle, "batch_size": o.batch_size, "drop_last": o.drop_last,
            "buffer_rows": o.buffer_rows if o.shuffle else 0, "rank": self.rank,
            "world_size": self.world_size, "total_rows": self.plan.total_rows,
        }

    def _check_state(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != 1:
            raise StateError(f"stream state version: stored {state.get('version')!r}, current 1.")
        if state.get("epoch") != self.epoch:
            raise StateError(f"stream state epoch: stored {state.get('epoch')!r}, current {self.epoch}.")
        if state.get("bad_rows", 0) and state.get("batches_yielded"):
            # Skipped rows shift every later position, so the replay would misplace rows.
            raise StateError(
                f"stream state bad_rows: stored {state['bad_rows']}, resumable 0; this epoch skipped bad "
                "rows before the checkpoint, so it can only restart at the epoch's start."
            )
        for key, current in self._plan_key().items():
            if state.get(key) != current:
                raise StateError(
                    f"stream state {key!r}: stored {state.get(key)!r}, current {current!r}; a mid-epoch "
                    "resume needs the same data, seed and topology (resume at an epoch boundary instead)."
                )
        k = state.get("batches_yielded")
        if not isinstance(k, int) or not 0 <= k <= self.plan.num_batches:
            raise StateError(f"stream state batches_yielded: stored {k!r}, current plan has {self.plan.num_batches}.")

    # -- the pipeline --------------------------------------------------------------------------

    def _generate(self) -> Iterator[Batch]:
        plan, o = self.plan, self.options
        sizes = plan.batch_sizes
        if len(sizes) == 0:
            return
        start = int(sizes[: self.batches_yielded].sum())
        buffer = ShuffleBuffer(o.buffer_rows, rng_for(o.seed, self.epoch, self.rank, TAG_BUFFER)) if o.shuffle else None
        batcher = _Batcher(sizes, self.batches_yielded, self.source.empty_columns())
        if batcher.done:
            return
        restore = BufferReplay.replay(plan, buffer, start) if start else BufferReplay.nothing()
        tasks = restore.window + plan.tasks[restore.next_task :]
        if not restore.window:
            batcher.add(restore.finish(buffer))
        results = self._imap(tasks)
        try:
            for i, (task, (columns, bad)) in enumerate(zip(tasks, results)):
                self._count(task, columns, bad)
                arrays = {name: as_array(col) for name, col in columns.items()}
                if i < len(restore.window):
                    restore.put(arrays)
                    if i == len(restore.window) - 1:
                        batcher.add(restore.finish(buffer))
                        yield from self._emit(batcher.ready())
                    continue
                for chunk in buffer.push(arrays) if buffer is not None else [arrays]:
                    batcher.add(chunk)
                    yield from self._emit(batcher.ready())
                if batcher.done:
                    return  # drop_last: the remaining rows are not used this epoch
            if buffer is not None:
                batcher.add(buffer.flush())
            yield from self._emit(batcher.ready())
            yield from self._emit(batcher.finish())
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()

    def _count(self, task: ReadTask, columns: dict[str, Any], bad: int) -> None:
        c = self.counters
        c.blocks_read += 1
        c.rows_read += len(next(iter(columns.values()))) if columns else 0
        if bad:
            self.bad_rows += bad
            c.bad_rows += bad
            c.bad_rows_by_file[task.block.path] = c.bad_rows_by_file.get(task.block.path, 0) + bad

    def _emit(self, batches: Iterable[dict[str, np.ndarray]]) -> Iterator[Batch]:
        transform = self.options.transform
        for arrays in batches:
            batch = to_torch(arrays)
            n = len(next(iter(arrays.values()))) if arrays else 0
            self.counters.rows_yielded += n
            self.counters.batches += 1
            yield transform(batch) if transform is not None else batch


def to_torch(arrays: Mapping[str, np.ndarray]) -> Batch:
    """NumPy columns to tensors (zero-copy where the array is writable); object columns to lists."""
    out: Batch = {}
    for name, arr in arrays.items():
        if arr.dtype == object:
            out[name] = arr.tolist()
        else:
            if not arr.flags.writeable or not arr.flags.c_contiguous:
                arr = np.array(arr)  # a view of a memory map or of Arrow memory
            out[name] = torch.from_numpy(arr)
    return out


class _Batcher:
    """Cuts a stream of row chunks into the planned batch sizes."""

    def __init__(self, sizes: np.ndarray, first: int, empty: Mapping[str, Any]) -> None:
        self.sizes = sizes
        self.next = first
        self.chunks: deque[dict[str, np.ndarray]] = deque()
        self.rows = 0
        self.empty = {name: as_array(col) for name, col in empty.items()}

    @property
    def done(self) -> bool:
        return self.next >= len(self.sizes)

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        n = len(next(iter(chunk.values()))) if chunk else 0
        if n:
            self.chunks.append(chunk)
            self.rows += n

    def ready(self) -> Iterator[dict[str, np.ndarray]]:
        while not self.done and self.rows >= self.sizes[self.next]:
            yield self._take(int(self.sizes[self.next]))

    def finish(self) -> Iterator[dict[str, np.ndarray]]:
        # Rows were skipped as bad: the last batches are short (even empty) rather than
        # missing, so every rank still yields the planned number of batches.
        while not self.done:
            yield self._take(min(self.rows, int(self.sizes[self.next])))

    def _take(self, k: int) -> dict[str, np.ndarray]:
        self.next += 1
        if k == 0:
            return dict(self.empty)
        pieces: list[dict[str, np.ndarray]] = []
        need = k
        while need:
            head = self.chunks[0]
            n = len(next(iter(head.values())))
            if n <= need:
                pieces.append(self.chunks.popleft())
                need -= n
            else:
                pieces.append({name: col[:need] for name, col in head.items()})
                self.chunks[0] = {name: col[need:] for name, col in head.items()}
                need = 0
        self.rows -= k
        if len(pieces) == 1:
            return pieces[0]
        return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}


def pack_xy(
    label: str | None = None,
    features: Sequence[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    label_dtype: torch.dtype | None = None,
) -> PackXY:
    """A per-batch transform that packs feature columns into ``x`` and the label into ``y``.

    Args:
        label: the label column (None: the last column, as in ``x = cols[:-1]; y = cols[-1]``).
        features: the feature columns in order (None: every column but the label).
        dtype: the dtype of ``x``.
        label_dtype: the dtype of ``y`` (None: keep the column's; use float32 for BCE losses).

    Example:
        >>> t = pack_xy(label="y")
        >>> out = t({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3, 4]), "y": torch.tensor([0, 1])})
        >>> out["x"].tolist(), out["y"].tolist()
        ([[1.0, 3.0], [2.0, 4.0]], [0, 1])
    """
    return PackXY(label, tuple(features) if features is not None else None, dtype, label_dtype)


@dataclass(frozen=True)
class PackXY:
    """The transform made by :func:`pack_xy` (picklable; runs on whole batches)."""

    label: str | None
    features: tuple[str, ...] | None
    dtype: torch.dtype
    label_dtype: torch.dtype | None

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        names = list(batch)
        label = self.label if self.label is not None else names[-1]
        if label not in batch:
            raise ConfigError(f"pack_xy: `label` {label!r} is not a column; the columns are {names}.")
        features = self.features if self.features is not None else [n for n in names if n != label]
        missing = [f for f in features if f not in batch]
        if missing:
            raise ConfigError(f"pack_xy: feature column(s) {missing} not in the batch; the columns are {names}.")
        cols = []
        for f in features:
            t = batch[f]
            if not isinstance(t, torch.Tensor):
                raise ConfigError(f"pack_xy: column {f!r} is not numeric; leave it out with `features=`.")
            cols.append(t.reshape(len(t), -1).to(self.dtype))
        y = batch[label]
        if self.label_dtype is not None:
            y = y.to(self.label_dtype)
        return {"x": torch.cat(cols, dim=1), "y": y}
