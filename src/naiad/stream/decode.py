"""A stream's samples through a worker-side batch transform (a decode): small fixed-size samples
in the reads, the others a few batches ahead of the loop on an ordered stage of threads (NOTE
[ Decode in the workers ] in pipeline.py), or, for a transform that holds the GIL, in the
loader's process workers (decode_workers.py, NOTE [ Decode stage in the worker processes ]).

NOTE [ Small samples decode in the reads ]
The stream cuts its batches in the loop's process, after the shuffle buffer. A decode there runs
on threads of that process, which serve images that release the GIL for most of their decode (a
JPEG of hundreds of pixels a side). A small image does not: a 28x28 PNG costs tens of
microseconds, most of it Python under the GIL (Pillow's open, the per-image bookkeeping), so
threads of one process decode it at one core's speed, whatever the cores (measured:
bench/RESULTS.md, "Images end to end"). Such samples are decoded in the reads instead, in the
read pool's workers (processes with ``num_workers``), before the shuffle buffer, when the decode
gives every sample the same shape of at most ``READ_DECODE_MAX_BYTES`` (a fixed ``size``: its
placement's ``decoded_row_bytes``), and any transform placed there (``Placement("reads")``):

* the buffer then holds pixels, no bigger than the encoded bytes by much at that size, and its
  default size counts the decoded bytes (``default_buffer_rows``); every row it holds is decoded
  before the first batch, where the stage decodes only the first batch's;
* a sample's random crop is keyed by (seed, epoch, its key: ``reads.row_keys``) wherever it is
  decoded, so the pixels are the same as on the stage; each read task carries the pass's epoch
  and base seed (:class:`SeededRead`), not the worker's;
* a resume reads the buffer's held rows again, and decodes them again: the same pixels;
* a sample that does not decode is a bad row of its read with ``on_bad_rows="skip"`` (NOTE [ Bad
  rows keep their positions ] in ledger.py: it keeps its position, is ledgered when its batch
  is cut, and counts toward ``max_bad_rows``), else a :class:`~naiad.errors.DecodeError` naming
  its shard or file and key, which ends the pass as a read error does.

Elsewhere :class:`DecodeAhead` runs the transform on :class:`~naiad.parallel.ahead.OrderedStage`
threads under the pass's base seed and epoch, and results leave in the stream's order; its
skipped samples are counted as the read's are (``BatchStream.skipped_late``). The loop's wait for
a decoded batch is under the loader's ``timeout`` (NOTE [ Stage deadline ] in parallel/ahead.py),
as a read's is under the pool's; in the reads the pool's deadline covers the decode too.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from naiad.errors import DecodeError
from naiad.media.rows import release_threads
from naiad.parallel import HandlerFactory, WorkerContext
from naiad.parallel.ahead import OrderedStage
from naiad.parallel.context import enter, get_worker_context, leave, report_stage
from naiad.sources.base import Source
from naiad.sources.contract import bad_entry
from naiad.stream.batches import BatchStream
from naiad.stream.plan import GroupTask, RestoreTask, Task
from naiad.stream.reads import RowKeys, make_handler_factory, row_keys
from naiad.transforms import READ_DECODE_MAX_BYTES  # where the limit is decided: transforms.place

__all__ = ["READ_DECODE_MAX_BYTES", "DecodeAhead", "SeededRead", "make_decoding_handler_factory"]

STAGE_THREADS = 2
"""Batches decoded at once: each spreads its images over the decode threads (NOTE [ Decode
threads ]); a second keeps the cores busy while the first waits on its slowest image."""


class DecodeAhead(Iterator[Any]):
    """``transform`` over ``stream``'s batches, ``depth`` batches ahead, in order.

    Args:
        stream: the pass's batches (each with ``index_column`` and ``__epoch__``).
        transform: the worker-side transform (placed on the stage: ``naiad.transforms.place``).
        index_column: the column of the samples' keys (``reads.row_keys``).
        base_seed: the pass's base seed (the loader's, kept in its state): the crops' seed.
        depth: batches in flight ahead of the loop.
        stage_seconds: where the decode time is added (the pool's, read by the telemetry).
        timeout_s: the longest wait for one decoded batch (the pool's, the loader's
            ``timeout``); None waits as long as the decode runs (NOTE [ Stage deadline ]).
    """

    def __init__(self, stream: BatchStream, transform: Callable[[Any], Any], *, index_column: str,
                 base_seed: int, depth: int, stage_seconds: dict[str, float],
                 timeout_s: float | None = None) -> None:
        self.stream = stream
        self.transform = transform
        self.context = WorkerContext(0, 0, base_seed, "inline", base_seed, stream.rank)
        self._decode = KeyedDecode(stream.source, transform, index_column)
        self.stage_seconds = stage_seconds
        self._stage: OrderedStage[tuple[int, Any], tuple[Any, list[dict[str, Any]], int, float]] = OrderedStage(
            self._numbered(), self._apply, threads=STAGE_THREADS, depth=max(STAGE_THREADS, depth), name="naiad-decode-stage",
            timeout_s=timeout_s, describe=self._describe,
        )

    def _numbered(self) -> Iterator[tuple[int, Any]]:
        for batch in self.stream:
            yield self.stream.batches_yielded - 1, batch

    def __iter__(self) -> DecodeAhead:
        return self

    def __next__(self) -> Any:
        out, entries, number, seconds = next(self._stage)
        self.stage_seconds["decode"] = self.stage_seconds.get("decode", 0.0) + seconds
        if entries:  # in the loop's thread, counted as a read's skipped rows are
            self.stream.skipped_late(number, entries)
        return out

    def close(self) -> None:
        """Stop the stage and the stream; the decode threads end (NOTE [ Decode threads ])."""
        self._stage.close()
        self.stream.close()
        release_threads()

    def _describe(self, item: tuple[int, Any]) -> str:
        return f"the decode of batch {item[0]} of epoch {self.stream.epoch} by {self.transform!r:.200}"

    # -- on a stage thread --------------------------------------------------------------------

    def _apply(self, item: tuple[int, Any]) -> tuple[Any, list[dict[str, Any]], int, float]:
        number, batch = item
        t0 = time.perf_counter()
        out, failed = self._decode(batch, self.context, self.stream.epoch, f"batch {number} of epoch {self.stream.epoch}",
                                   chain=True)
        return out, without_rows(failed), number, time.perf_counter() - t0


# -- in the reads (NOTE [ Small samples decode in the reads ]) ------------------------------------


@dataclasses.dataclass(frozen=True)
class SeededRead:
    """A read task of a stream that decodes in its reads, with what the decode draws from: the
    pass's epoch and base seed (the loader's, kept in its state), not the worker's."""

    task: Task | GroupTask | RestoreTask
    epoch: int
    seed: int


def make_decoding_handler_factory(source: Source, index_column: str, transform: Callable[[Any], Any]) -> HandlerFactory:
    """A picklable factory that builds, in each worker, ``handler(SeededRead) -> (columns, bad)``:
    the read (:func:`~naiad.stream.reads.make_handler_factory`), then ``transform`` over its rows,
    its samples that do not decode added to ``bad`` (with ``on_bad_rows="skip"``) or raised."""
    return functools.partial(_build_decoding_handler, make_handler_factory(source, index_column), source,
                             index_column, transform)


def _build_decoding_handler(read_factory: HandlerFactory, source: Source, index_column: str,
                            transform: Callable[[Any], Any],
                            context: WorkerContext) -> Callable[[SeededRead], tuple[dict[str, Any], list[dict[str, Any]]]]:
    read = read_factory(context)
    decode = KeyedDecode(source, transform, index_column)

    def handle(seeded: SeededRead) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        columns, bad = read(seeded.task)
        t0 = time.perf_counter()
        batch = {**columns, "__epoch__": seeded.epoch}
        try:
            out, failed = decode(batch, seeded_context(seeded.seed), seeded.epoch, f"epoch {seeded.epoch}")
        finally:
            report_stage("decode", time.perf_counter() - t0)
        if failed:
            bad = _merge(bad, failed, len(batch[index_column]))
        elif index_column not in out:  # it kept only its own columns: the stream needs the keys
            out = {**out, index_column: batch[index_column]}
        out.pop("__epoch__", None)
        # NumPy columns: they cross processes through shared memory (NOTE [ Worker protocol ]).
        return {name: col.numpy() if isinstance(col, torch.Tensor) else col for name, col in out.items()}, bad

    return handle


def _merge(bad: list[dict[str, Any]], failed: list[dict[str, Any]], good: int) -> list[dict[str, Any]]:
    """The read's skipped rows and the samples that did not decode, each ``at`` its position among
    the rows the task asked for (a failed sample's ``at`` counts the read's good rows only)."""
    asked = np.delete(np.arange(good + len(bad)), [e["at"] for e in bad])
    return bad + [{**e, "at": int(asked[e["at"]])} for e in failed]


# -- the transform under a pass's seed and epoch, what did not decode named ---------------------


def seeded_context(seed: int) -> WorkerContext:
    """The calling worker's context with ``seed`` as its base seed (an inline one outside a
    worker): the pass's seed, which a sample's keyed draws come from, not the worker's."""
    current = get_worker_context()
    return WorkerContext(0, 0, seed, "inline", seed, 0) if current is None else dataclasses.replace(current, base_seed=seed)


class KeyedDecode:
    """A stream's worker-side transform over one batch under a pass's context and epoch; a
    sample that does not decode is named (its shard or file and key) and either raised or, with
    ``on_bad_rows="skip"``, returned as a ledger entry beside the batch without it. The decode
    stage's threads, the worker processes and the reads run it alike.

    Args:
        source: the stream's source (its skip policy, and where its samples' numbers come from).
        transform: the transform.
        index_column: the column of the samples' keys (``reads.row_keys``).
    """

    def __init__(self, source: Source, transform: Callable[[Any], Any], index_column: str) -> None:
        self.source, self.transform, self.index_column = source, transform, index_column
        self.skip = source.on_bad_rows == "skip"
        self._numbers: RowKeys | None = None  # made at the first failure: most batches have none

    def __call__(self, batch: Mapping[str, Any], context: WorkerContext, epoch: int, where: str, *,
                 chain: bool = False) -> tuple[Any, list[dict[str, Any]]]:
        """``(transform(batch), [])``, or the batch without its failed samples and their entries
        (``at``: each one's row in ``batch``); a DecodeError naming them ``where``, chained to the
        transform's when ``chain`` (the stage's threads), else with only the names."""
        previous = enter(context, epoch)
        try:
            try:
                return self.transform(batch), []
            except DecodeError as exc:
                if self._numbers is None:
                    self._numbers = row_keys(self.source)
                failed = failed_samples(exc, batch, self.index_column, self._numbers)
                if not self.skip or exc.kept is None:
                    raise named_error(exc, failed, where, keep=chain) from (exc if chain else None)
                return exc.kept, failed
        finally:
            leave(previous)


def without_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ledger entries without their ``at`` (a row of the batch that is no longer there)."""
    return [{k: v for k, v in e.items() if k != "at"} for e in entries]


# -- naming what did not decode -----------------------------------------------------------------


def failed_samples(exc: DecodeError, batch: Mapping[str, Any], index_column: str, numbers: RowKeys) -> list[dict[str, Any]]:
    """A ledger entry for each sample of ``batch`` that did not decode (``at``: its row in the
    batch): its shard or file, its sample number there, its key and the decoder's complaint."""
    index = batch[index_column]
    rows = np.asarray(index.numpy() if hasattr(index, "numpy") else index, np.int64)[exc.rows]
    places = numbers.locate(rows)
    names = _sample_keys(batch, exc)
    return [bad_entry(at, path, reason, row=row, key=name, column=exc.column)
            for at, (path, row), name, reason in zip(exc.rows, places, names, exc.reasons, strict=True)]


def named_error(exc: DecodeError, failed: list[dict[str, Any]], where: str, *, keep: bool = False) -> DecodeError:
    """``exc`` again, naming each failed sample's shard or file (a pass ends on it); its ``kept``
    only with ``keep`` (a worker's error crosses processes: the batch stays behind)."""
    shown = "; ".join(f"{e['file']} (sample {e['row']}, {e['key']})" for e in failed[:5])
    error = DecodeError(
        f"{where}, from {shown}: {exc} Give the reader on_bad_rows=\"skip\" to ledger such samples and "
        "keep the rest of the batch.",
        rows=exc.rows, keys=exc.keys, reasons=exc.reasons, kept=exc.kept if keep else None,
    )
    error.path = failed[0]["file"] if failed else None
    error.column = exc.column
    return error


def _sample_keys(batch: Any, exc: DecodeError) -> list[str]:
    """Each failed sample's key: its ``__key__`` (tar shards), else its ``path`` (a folder), else
    the name the error gave it."""
    for column in ("__key__", "path"):
        values = batch.get(column) if hasattr(batch, "get") else None
        if values is not None and not isinstance(values, (str, bytes)):
            return [str(values[i]) for i in exc.rows]
    return list(exc.keys)
