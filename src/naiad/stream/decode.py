"""A stream's batches through a worker-side batch transform (a decode), a few batches ahead of the
loop on an ordered stage of threads (NOTE [ Decode in the workers ] in pipeline.py).

The stream cuts its batches in the loop's process, after the shuffle buffer; each carries
``__index__`` (the samples' keys, ``reads.row_keys``) and ``__epoch__``. Here the transform runs
on :class:`~naiad.parallel.ahead.OrderedStage` threads, under a worker context with the pass's
base seed and epoch, so random crops are keyed by (seed, epoch, sample) whichever thread decodes
them; results leave in the stream's order. Samples that do not decode are ledgered with the
reader's ``on_bad_rows="skip"`` (their shard or file, row and key; the batch keeps the rest) or
raised as a :class:`~naiad.errors.DecodeError` naming the shard or file, which ends the pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from naiad.errors import DecodeError
from naiad.parallel import WorkerContext
from naiad.parallel.ahead import OrderedStage
from naiad.parallel.context import enter, leave
from naiad.stream.batches import BatchStream
from naiad.stream.reads import RowKeys, row_keys

__all__ = ["DecodeAhead"]

STAGE_THREADS = 2
"""Batches decoded at once: each spreads its images over the decode threads (NOTE [ Decode
threads ]); a second keeps the cores busy while the first waits on its slowest image."""


class DecodeAhead(Iterator[Any]):
    """``transform`` over ``stream``'s batches, ``depth`` batches ahead, in order.

    Args:
        stream: the pass's batches (each with ``index_column`` and ``__epoch__``).
        transform: the worker-side transform (``runs_in_workers``).
        index_column: the column of the samples' keys (``reads.row_keys``).
        base_seed: the pass's base seed (the loader's, kept in its state): the crops' seed.
        depth: batches in flight ahead of the loop.
        stage_seconds: where the decode time is added (the pool's, read by the telemetry).
    """

    def __init__(self, stream: BatchStream, transform: Callable[[Any], Any], *, index_column: str,
                 base_seed: int, depth: int, stage_seconds: dict[str, float]) -> None:
        self.stream = stream
        self.transform = transform
        self.index_column = index_column
        self.context = WorkerContext(0, 0, base_seed, "inline", base_seed, stream.rank)
        self.skip = stream.source.on_bad_rows == "skip"
        self.stage_seconds = stage_seconds
        self._numbers: RowKeys | None = None
        self._stage: OrderedStage[tuple[int, Any], tuple[Any, list[dict[str, Any]], int, float]] = OrderedStage(
            self._numbered(), self._apply, threads=STAGE_THREADS, depth=max(STAGE_THREADS, depth), name="naiad-decode-stage",
        )

    def _numbered(self) -> Iterator[tuple[int, Any]]:
        for batch in self.stream:
            yield self.stream.batches_yielded - 1, batch

    def __iter__(self) -> DecodeAhead:
        return self

    def __next__(self) -> Any:
        out, entries, number, seconds = next(self._stage)
        self.stage_seconds["decode"] = self.stage_seconds.get("decode", 0.0) + seconds
        if entries:  # in the loop's thread: the ledger is the stream's (NOTE [ Bad rows keep their positions ])
            self.stream.counters.ledger.record(self.stream.epoch, number, entries)
        return out

    def close(self) -> None:
        """Stop the stage and the stream."""
        self._stage.close()
        self.stream.close()

    # -- on a stage thread --------------------------------------------------------------------

    def _apply(self, item: tuple[int, Any]) -> tuple[Any, list[dict[str, Any]], int, float]:
        number, batch = item
        t0 = time.perf_counter()
        previous = enter(self.context, self.stream.epoch)
        try:
            try:
                return self.transform(batch), [], number, time.perf_counter() - t0
            except DecodeError as exc:
                kept, entries = self._failed(exc, batch, number)
                return kept, entries, number, time.perf_counter() - t0
        finally:
            leave(previous)

    def _failed(self, exc: DecodeError, batch: Any, number: int) -> tuple[Any, list[dict[str, Any]]]:
        """The ledger entries of a batch's samples that did not decode, and the batch without
        them; or, without ``on_bad_rows="skip"``, the error naming their shard or file."""
        if self._numbers is None:
            self._numbers = row_keys(self.stream.source)
        index = batch[self.index_column]
        rows = np.asarray(index.numpy() if hasattr(index, "numpy") else index, np.int64)[exc.rows]
        places = self._numbers.locate(rows)
        names = _sample_keys(batch, exc)
        if not self.skip or exc.kept is None:
            where = "; ".join(f"{path} (sample {row}, {name})" for (path, row), name in list(zip(places, names, strict=True))[:5])
            error = DecodeError(
                f"batch {number} of epoch {self.stream.epoch}, from {where}: {exc} Give the reader "
                "on_bad_rows=\"skip\" to ledger such samples and keep the rest of the batch.",
                rows=exc.rows, keys=exc.keys, reasons=exc.reasons, kept=exc.kept,
            )
            error.path = places[0][0] if places else None
            error.column = exc.column
            raise error from exc
        entries = [
            {"file": path, "row": row, "key": name, "column": exc.column, "reason": reason}
            for (path, row), name, reason in zip(places, names, exc.reasons, strict=True)
        ]
        return exc.kept, entries


def _sample_keys(batch: Any, exc: DecodeError) -> list[str]:
    """Each failed sample's key: its ``__key__`` (tar shards), else its ``path`` (a folder), else
    the name the error gave it."""
    for column in ("__key__", "path"):
        values = batch.get(column) if hasattr(batch, "get") else None
        if values is not None and not isinstance(values, (str, bytes)):
            return [str(values[i]) for i in exc.rows]
    return list(exc.keys)
