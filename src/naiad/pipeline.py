"""The seam under the DataLoader: what every kind of pipeline provides.

NOTE [ Pipeline seam ]
``naiad.DataLoader`` drives three kinds of pipeline: a map-style dataset (index batches),
an IterableDataset (each worker walks its own iterator) and a streaming source (block reads
through a shuffle buffer). The loader and its per-pass iterator (epoch.py) know nothing of
which one they drive; they talk to it through two small protocols:

* :class:`Pipeline`, one per loader: how a worker builds its handler, how to describe a task in
  an error, the number of batches, whether and why not its position can be saved, and how to
  open one pass (an epoch, or the rest of one) from a position.
* :class:`PipelinePass`, one per pass: runs its tasks through a :class:`~naiad.parallel.WorkerPool`
  and turns their results into batches, and says its position after ``k`` delivered batches as
  plain JSON. Where its batches may leave out of plan order (``in_order=False``), the pass
  records which of them it delivered (NOTE [ Out-of-order delivery ] in delivered.py). The plan (which tasks, in which order, for which rank) is a pure function of the
  pipeline's inputs and the position, computed in the training process.

NOTE [ Decode in the workers ]
A batch transform whose placement puts it outside the loop (``naiad.decode_images``,
``naiad.decode_audio``, a user's transform declaring ``Placement("workers")`` or
``Placement("reads")``: NOTE [ Transform placement ] in transforms.py, :func:`naiad.transforms.place`)
is a worker-side transform: given as the loader's ``transform=``, the pipeline applies it, not
the loop (``Pipeline.batch_transform`` is the one a pipeline took). Every other callable is
applied as before, in the loop's process by epoch.py.

* Map-style: inside the worker, right after the fetch (dataset/worker.py), on the worker's
  share of the decode threads; the batch gets its dataset indices as the transform's key column
  (its placement's ``key``, ``__index__`` for the decoders) when the fetch gave none, and the
  pool's task carries the epoch and base seed.
* Stream: a transform placed in the reads (``Placement("reads")``), and small samples of one
  decoded shape (``decoded_row_bytes``), are transformed in the reads, in the read pool's
  workers, before the shuffle buffer (NOTE [ Small samples decode in the reads ] in
  stream/decode.py). Others: the batches are cut after the shuffle buffer in the loop's process,
  so the transform runs on a small ordered stage of threads a few batches ahead of the loop
  (NOTE [ Ordered stage ] in parallel/ahead.py), not in the read pool: decoded pixels would sit
  in the buffer, bigger than the encoded bytes, and the decoders release the GIL, so threads of
  the loop's process decode in parallel. A transform that holds the GIL (``decode_video``:
  ``Placement(holds_gil=True)``) has the batches sent from there to the loader's process
  workers instead, when it has some (NOTE [ Decode stage in the worker processes ] in
  stream/decode_workers.py). Measured (bench/bench_images.py, bench/RESULTS.md
  "Images end to end"): for JPEGs the stage did as well as decoding in worker processes, with
  less CPU per image (no pixels cross processes); for 28x28 PNGs, where the per-image Python
  under one GIL counts, the reads' worker processes did better, and ``naiad convert --decode``
  better still. Each batch carries ``__index__`` (the sample's key: its row number in the source,
  or for tar shards its shard's number times 2**32 plus its number in the shard, known before
  the other shards are indexed: ``stream.reads.row_keys``; read beside its columns and moved by
  the shuffle buffer like any column: stable across epochs, ranks, workers and resumes) and
  ``__epoch__``; the decode runs under the pass's base seed, so
  random crops are keyed by (seed, epoch, sample). A sample that does not decode is a skipped
  row with the reader's ``on_bad_rows="skip"`` (the batch keeps the others), else a
  ``DecodeError`` naming the shard or file and the key, which ends the pass as a read error does.
* IterableDataset: its batches have no position, so the transform runs in the loop's process
  as before (the decode itself still on the decode threads).

Its time is the telemetry stage ``"decode"``, apart from ``fetch`` and ``read``.

A loader state is ``{"version", "kind", "epoch", "batches_yielded", "base_seed",
"pipeline": {...}}``: the pipeline's part holds what its plan needs (topology, legs) and what
must match to resume (its data's fingerprint, the seed), and :func:`check_fields` compares it
with the current values, naming both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from naiad.errors import StateError
from naiad.order.delivered import DeliveryLog
from naiad.parallel import DeferredResults, HandlerFactory, WorkerPool
from naiad.parallel.read_ahead import ReadAheadTuner

__all__ = [
    "STATE_VERSION", "LazyPass", "Pipeline", "PipelinePass", "ReadsNothingAhead", "check_fields",
]

STATE_VERSION = 2
"""Version of the loader state; 2 added the kind, the base seed and elastic legs."""


class PipelinePass(Protocol):
    """One pass of a pipeline: an epoch, or the rest of one after a resume."""

    @property
    def start(self) -> int:
        """Batches of the epoch's current leg delivered before this pass began (a resume)."""
        ...

    @property
    def deliveries(self) -> DeliveryLog[Any] | None:
        """Which batches the pass delivered, where that is more than a count (NOTE [ Out-of-order
        delivery ]); None: its batches leave in plan order, and their count is the position."""
        ...

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        """Run the pass's tasks through ``pool``; yield its batches (in plan order unless
        ``in_order`` is False and the pass records its deliveries)."""
        ...

    def state(self, delivered: int) -> dict[str, Any]:
        """The pipeline's part of the state after ``delivered`` more batches of this pass."""
        ...

    def __len__(self) -> int:
        """Batches this pass yields."""
        ...


class Pipeline(Protocol):
    """One kind of pipeline under the DataLoader (see NOTE [ Pipeline seam ])."""

    kind: str
    """"map", "iterable" or "stream": the kind a state was saved from."""

    stage: str
    """The telemetry stage its workers' time counts as: "fetch" or "read"."""

    @property
    def strategy(self) -> str:
        """How its batches are built, as ``DataLoader.fetch_strategy`` says: "gather",
        "getitems" or "items" (map-style), "iterable" or "stream"."""
        ...

    sharded_by_loader: bool
    """Whether the loader's ``rank``/``world_size`` shard it (map-style); a stream is sharded by
    torch.distributed, an IterableDataset by the user."""

    batch_transform: Callable[[Any], Any] | None
    """The worker-side transform this pipeline applies itself (NOTE [ Decode in the workers ]);
    None: the loop's process applies the loader's transform, if any."""

    warns_past_length: bool
    """Whether torch warns when a pass yields more batches than ``len(loader)`` (an
    IterableDataset's length is the user's word, not the plan's)."""

    def read_ahead_threads(self) -> int:
        """Threads that read ahead of the loop when the loader has no workers (0: none)."""
        ...

    def read_ahead_tuner(self, threads: int, prefetch: int) -> ReadAheadTuner | None:
        """The tuner that decides whether those threads pay (None: they are not tuned)."""
        ...

    def read_ahead_info(self, threads: int) -> dict[str, Any]:
        """What ``DataLoader.workers_info`` says of the read-ahead threads."""
        ...

    def handler_factory(self) -> HandlerFactory:
        """A picklable factory that builds, in each worker, ``handler(task) -> result``."""
        ...

    def describe_task(self, task: Any) -> str:
        """A task in words, for error messages."""
        ...

    def num_batches(self) -> int:
        """Batches in a whole epoch on this rank (TypeError where unknown, as torch)."""
        ...

    def why_not_resumable(self) -> str | None:
        """None when a position can be saved and resumed, else the reason in words."""
        ...

    def open_pass(self, epoch: int, base_seed: int, resume: Mapping[str, Any] | None) -> PipelinePass:
        """Plan one pass of ``epoch``: from its start, or from a checked ``resume`` part."""
        ...

    def start_state(self, epoch: int) -> dict[str, Any]:
        """The pipeline's part of the state at the start of ``epoch``."""
        ...

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        """Raise StateError when a stored part cannot resume here, naming stored and current."""
        ...


class ReadsNothingAhead:
    """The read-ahead part of :class:`Pipeline` for a pipeline that reads nothing ahead: its
    batches come from the user's dataset, in workers or inline."""

    def read_ahead_threads(self) -> int:
        return 0

    def read_ahead_tuner(self, threads: int, prefetch: int) -> ReadAheadTuner | None:
        return None

    def read_ahead_info(self, threads: int) -> dict[str, Any]:
        return {}


def check_fields(stored: Mapping[str, Any], current: Mapping[str, Any], what: str, fix: str) -> None:
    """Raise a StateError naming every key whose stored value differs from the current one.

    Example:
        >>> check_fields({"seed": 1}, {"seed": 2}, "loader state", "make the loader with seed=1.")
        Traceback (most recent call last):
        ...
        naiad.errors.StateError: loader state 'seed': stored 1, current 2; make the loader with seed=1.
    """
    diffs = [
        f"{key!r}: stored {_shown(stored.get(key))}, current {_shown(value)}"
        for key, value in current.items()
        if stored.get(key) != value
    ]
    if diffs:
        raise StateError(f"{what} {'; '.join(diffs)}; {fix}")


def _shown(value: Any, limit: int = 500) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile state's value may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class LazyPass:
    """A pass whose plan is made at its first batch, with the epoch set by then.

    Trainers call ``iter(loader)`` before they set the epoch (Lightning calls ``set_epoch`` on
    the samplers after it); the pass's epoch is the one in force when its first batch is asked
    for, as with torch's samplers, which draw their order then too.
    """

    def __init__(self, opener: Callable[[int], PipelinePass], epoch: int) -> None:
        self._opener = opener
        self.epoch = epoch
        self.run: PipelinePass | None = None

    @property
    def opened(self) -> bool:
        """Whether the plan has been made (the epoch is then fixed)."""
        return self.run is not None

    def open(self) -> PipelinePass:
        """Make the plan now, for :attr:`epoch`."""
        if self.run is None:
            self.run = self._opener(self.epoch)
        return self.run

    @property
    def start(self) -> int:
        return self.open().start

    @property
    def deliveries(self) -> DeliveryLog[Any] | None:
        return self.run.deliveries if self.run is not None else None

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        # Not a generator: a batch's exception must pass through and leave the pass going on
        # (NOTE [ A failed task ] in parallel/pool.py).
        return DeferredResults(lambda: self.open().batches(pool, prefetch=prefetch, in_order=in_order))

    def state(self, delivered: int) -> dict[str, Any]:
        return self.open().state(delivered)

    def __len__(self) -> int:
        return len(self.open())
