"""A stream's decode stage in the loader's worker processes, for a transform that holds the GIL.

NOTE [ Decode stage in the worker processes ]
A stream cuts its batches in the loop's process, after the shuffle buffer, and its decode stage
(``decode.DecodeAhead``) runs a worker-side transform there on threads (NOTE [ Decode in the
workers ] in pipeline.py). That serves decoders that release the GIL (a JPEG's libjpeg-turbo),
not one whose work is Python under the GIL: PyAV's per-frame loop (``decode_video``: the frame
iteration, ``reformat``, ``to_ndarray``, the paste into the clip) kept two stage threads to
about 1.35 of 2 cores, 0.73x of the bare decode's ceiling (bench/RESULTS.md, "Video clips").
Clips must not be decoded in the reads instead (NOTE [ Small samples decode in the reads ] in
decode.py): the shuffle buffer would hold decoded clips, tens of times the encoded bytes.

So a transform that declares ``Placement(holds_gil=True)``, placed on the stage
(``Placed.stage_in_processes``), runs in the loader's own worker processes when the pass's pool
has process workers (``num_workers > 0``, ``worker_mode="process"``, the default for such a
stream: arguments.py), and on the stage's threads otherwise (thread workers, read-ahead threads,
inline):

* the same pool as the reads, no second set of processes: the pipeline's handler
  (:func:`make_stage_handler_factory`) answers a read task as before and a :class:`DecodeTask`
  by running the transform. The batches cut in the loop's process (their encoded bytes, keys and
  ``__epoch__``) go to the workers as a second pass of the pool (``WorkerPool.imap``), its task
  iterator pulling batches from the stream, whose reads are the pool's first pass: the two passes
  share the workers, each result routed to its own pass (NOTE [ Passes sharing a pool ] in
  parallel/pool.py). A decode task queues behind the reads sent to its worker before it and the
  reverse; a read group yields several batches, so the reads rarely wait;
* results in the stream's order (``in_order=True``), ``prefetch`` per worker in flight; the wait
  for one is the pool's, under the loader's ``timeout`` (``PoolPass._wait``), and a worker that
  dies is a ``WorkerError`` or a restart as for a read;
* the transform runs under the pass's base seed and epoch, as on the stage: each task carries
  them, and the worker enters a context with that base seed, so draws keyed by (seed, epoch,
  sample) (NOTE [ Keyed sample randomness ] in media/keys.py) give the same pixels as the stage's
  threads, for any worker count and after an exact or elastic resume. Nothing is keyed by worker;
* tensor columns cross as NumPy arrays (pickled with the task: torch's own pickler would put
  each small key column in a shared-memory file of its own) and are tensors again in the worker,
  so the transform sees what it sees on the stage; its output comes back as any worker result
  (NOTE [ Batch transport ] in parallel/transport.py);
* a sample that does not decode is named in the worker (its shard or file from
  ``reads.row_keys``) and, with ``on_bad_rows="skip"``, comes back beside the batch without it,
  counted in the loop's thread as the stage counts it (``BatchStream.skipped_late``); else its
  ``DecodeError`` crosses to the loop and ends the pass, as on the stage;
* its time is the telemetry's ``decode`` stage, reported by the worker (``report_stage``);
* ``close()`` (the epoch's end, ``break``, an error, Ctrl-C) ends the decode pass, whose results
  still owed are dropped on arrival, then the stream's; the workers are the pool's, stopped with
  it as after any pass (docs/WORKERS.md), so no process outlives the loader.

The first batch waits for the pool's first ``prefetch`` x workers batches to be cut (the pass
fills its capacity before it delivers), not only its own as the stage's first does; the reads
those batches need are mostly in the shuffle buffer's first fill already.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from naiad.parallel import HandlerFactory, WorkerContext, WorkerPool
from naiad.parallel.context import report_stage
from naiad.sources.base import Source
from naiad.stream.batches import BatchStream
from naiad.stream.decode import KeyedDecode, seeded_context, without_rows

__all__ = ["DecodeInWorkers", "DecodeTask", "make_stage_handler_factory"]

Decoded = tuple[Any, list[dict[str, Any]], int]
"""A decode task's result: the transformed batch, its skipped samples' ledger entries, its number."""


@dataclasses.dataclass(frozen=True)
class DecodeTask:
    """One batch of a stream's decode stage, sent to a worker process (NOTE [ Decode stage in the
    worker processes ]).

    Attributes:
        number: the batch's number in the epoch (for the ledger and the messages).
        epoch: the pass's epoch.
        seed: the pass's base seed (the loader's, kept in its state): what the draws are keyed by.
        columns: the batch, its tensor columns as NumPy arrays.
        tensors: the names of the columns that were tensors (made tensors again in the worker).
    """

    number: int
    epoch: int
    seed: int
    columns: dict[str, Any]
    tensors: tuple[str, ...]

    @classmethod
    def of(cls, batch: Mapping[str, Any], number: int, epoch: int, seed: int) -> DecodeTask:
        """The task of a batch as the stream cut it (tensors, lists, ``__epoch__``)."""
        columns: dict[str, Any] = {}
        tensors: list[str] = []
        for name, value in batch.items():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                try:
                    value = value.numpy()  # zero-copy; a dtype NumPy lacks crosses as a tensor
                    tensors.append(name)
                except (TypeError, RuntimeError):
                    pass
            columns[name] = value
        return cls(number, epoch, seed, columns, tuple(tensors))

    def batch(self) -> dict[str, Any]:
        """The batch as the transform sees it on the stage: tensor columns as tensors."""
        names = set(self.tensors)
        return {name: torch.from_numpy(value) if name in names else value for name, value in self.columns.items()}


def make_stage_handler_factory(read_factory: HandlerFactory, source: Source, index_column: str,
                               transform: Callable[[Any], Any]) -> HandlerFactory:
    """A picklable factory that builds, in each worker, a handler answering the stream's read
    tasks with ``read_factory``'s handler and a :class:`DecodeTask` with ``transform`` (NOTE
    [ Decode stage in the worker processes ])."""
    return functools.partial(_build_stage_handler, read_factory, source, index_column, transform)


def _build_stage_handler(read_factory: HandlerFactory, source: Source, index_column: str,
                         transform: Callable[[Any], Any], context: WorkerContext) -> Callable[[Any], Any]:
    read = read_factory(context)
    decode = _decoder(source, index_column, transform)

    def handle(payload: Any) -> Any:
        return decode(payload) if isinstance(payload, DecodeTask) else read(payload)

    return handle


def _decoder(source: Source, index_column: str, transform: Callable[[Any], Any]) -> Callable[[DecodeTask], Decoded]:
    """``transform`` over one task's batch under its pass's base seed and epoch, as
    ``DecodeAhead._apply`` runs it on the stage's threads."""
    keyed = KeyedDecode(source, transform, index_column)

    def decode(task: DecodeTask) -> Decoded:
        batch = task.batch()
        t0 = time.perf_counter()
        try:
            # A failed batch stays here (``kept`` dropped): only the names cross.
            out, failed = keyed(batch, seeded_context(task.seed), task.epoch, f"batch {task.number} of epoch {task.epoch}")
        finally:
            report_stage("decode", time.perf_counter() - t0)
        return out, without_rows(failed), task.number

    return decode


def _tasks(stream: BatchStream, epoch: int, seed: int) -> Iterator[DecodeTask]:
    """The stream's batches as decode tasks, pulled on the loop's thread when the pool has room.
    A function of its own, not a method: the pool's pass holds this generator, and a generator
    holding the :class:`DecodeInWorkers` that holds the pass would be a reference cycle."""
    for batch in stream:
        yield DecodeTask.of(batch, stream.batches_yielded - 1, epoch, seed)


class DecodeInWorkers(Iterator[Any]):
    """A stream's batches through a worker-side transform in ``pool``'s worker processes, in the
    stream's order (NOTE [ Decode stage in the worker processes ]); the counterpart of
    ``decode.DecodeAhead``.

    Args:
        stream: the pass's batches (each with its key column and ``__epoch__``); its reads run
            on ``pool`` too.
        pool: the pass's pool, process workers built with :func:`make_stage_handler_factory`.
        base_seed: the pass's base seed.
        prefetch: decode tasks in flight per worker.
    """

    def __init__(self, stream: BatchStream, pool: WorkerPool, *, base_seed: int, prefetch: int) -> None:
        self.stream = stream
        self._results = pool.imap(_tasks(stream, stream.epoch, base_seed), prefetch=prefetch, in_order=True,
                                  epoch=stream.epoch)
        self._closed = False

    def __iter__(self) -> DecodeInWorkers:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            out, entries, number = next(self._results)
        except BaseException:
            # A failed decode ends the pass, as the stage's does (no batch is given up silently).
            self.close()
            raise
        if entries:  # in the loop's thread, counted as a read's skipped rows are
            self.stream.skipped_late(number, entries)
        return out

    def close(self) -> None:
        """End the decode pass (results still owed are dropped on arrival), then the stream."""
        if self._closed:
            return
        self._closed = True
        try:
            self._results.close()
        finally:
            self.stream.close()
