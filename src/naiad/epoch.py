"""One pass over a naiad DataLoader: a pipeline pass's tasks through the worker pool to the loop.

An :class:`EpochIterator` is what ``iter(naiad.DataLoader(...))`` returns (wrapped in a
``DevicePrefetcher`` when the loader has a ``device``). It holds the pass
(:class:`~naiad.pipeline.PipelinePass`: the plan and how results become batches), the
:class:`~naiad.parallel.WorkerPool`, the telemetry and the position; it applies the transform
and pinning, counts what it delivered (for ``state_dict``), and records the training loop's
waits. It knows nothing of the loader.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from naiad.device.tree import count_rows, map_tensors
from naiad.errors import WorkerError
from naiad.order.delivered import DeliveryLog
from naiad.parallel import AutoTuner, WorkerPool
from naiad.pipeline import PipelinePass
from naiad.telemetry import Telemetry

__all__ = ["EpochIterator", "PassProgress", "pin_memory_enabled"]


@dataclass
class PassProgress:
    """How far one pass got: batches delivered, and whether its end was reached.

    The loader keeps it after the pass's iterator is gone (a ``break`` drops it), so that
    ``state_dict()`` taken after the loop still knows where the pass stopped.

    ``delivered`` is the position in the pass's plan: the batches handed over *and* those whose
    exception ``next()`` raised in their place (``failed``), since the loop carries on after
    one, as with torch's iterator; a resume continues after a failed batch, as the
    uninterrupted run did, and never fetches it again.

    ``deliveries`` is the pass's record of *which* batches it delivered, where their order may
    differ from the plan's (NOTE [ Out-of-order delivery ] in pipelines/delivered.py): the
    deliveries the training loop has received are folded into it here, the rest kept in order.
    """

    delivered: int = 0
    finished: bool = False
    received: int = 0  # with a device prefetcher: the batches it handed to the training loop
    failed: int = 0  # batches whose exception was raised instead (counted in `delivered` too)
    lagging: bool = False  # a device prefetcher stands between the pass and the training loop
    deliveries: DeliveryLog[Any] | None = None

    def deliver(self, *, failed: bool = False) -> None:
        """Note one more batch delivered by the pass (or its exception raised in its place)."""
        self.delivered += 1
        if failed:
            self.failed += 1
        if not self.lagging and self.deliveries is not None:
            self.deliveries.settle(self.delivered)

    def receive(self, count: int) -> None:
        """Note that the training loop has received ``count`` batches of this pass."""
        self.received = count
        if self.deliveries is not None:
            self.deliveries.settle(count)


class EpochIterator:
    """One pass (epoch) over a naiad DataLoader: drives the pool, times the waits, closes cleanly.

    Args:
        run: the pipeline's pass.
        epoch: the epoch it belongs to.
        pool: the workers; closed with the pass when ``owns_pool``.
        telemetry: where waits and stage times go.
        stage: the stage the workers' time counts as ("fetch" or "read").
        prefetch: tasks in flight per worker.
        in_order: deliver in plan order (torch's ``in_order``).
        transform: called on each batch in the training process (None: none).
        pin: pin each batch's tensors.
        record_steps: record the loop's waits here (False when a device prefetcher does).
        tuner: the ``num_workers="auto"`` tuner that drives the pool, if any.
        progress: where the pass counts what it delivered (kept by the loader past a ``break``).
        reported_length: for an IterableDataset, the ``len(dataset)`` that ``len(loader)``
            reported before this pass (torch's ``_IterableDataset_len_called``): yielding more
            batches than that warns, as torch does.
        dataset: the dataset, named in that warning.
    """

    def __init__(
        self,
        run: PipelinePass,
        epoch: int,
        pool: WorkerPool,
        *,
        owns_pool: bool,
        telemetry: Telemetry,
        stage: str,
        prefetch: int,
        in_order: bool,
        transform: Callable[[Any], Any] | None = None,
        pin: bool = False,
        record_steps: bool = True,
        tuner: AutoTuner | None = None,
        progress: PassProgress | None = None,
        reported_length: int | None = None,
        dataset: Any = None,
    ) -> None:
        self.run = run
        self.epoch = epoch
        self.progress = progress if progress is not None else PassProgress()
        self._pool = pool
        self._own_pool: WorkerPool | None = pool if owns_pool else None
        self._telemetry = telemetry
        self._stage = stage
        self._transform = transform
        self._pin = pin
        self._record_steps = record_steps
        self._worker_s = pool.stage_seconds.get("worker", 0.0)
        self._decode_s = pool.stage_seconds.get("decode", 0.0)
        self._stage_s, self._stage_n = 0.0, 0
        self._batches: Iterator[Any] = run.batches(pool, prefetch=prefetch, in_order=in_order)
        if tuner is not None:
            self._batches = tuner.drive(pool, self._batches)
        self._reported_length = reported_length
        self._dataset = dataset
        self._yielded = 0  # batches returned (torch's _num_yielded)
        self._done = False

    def __iter__(self) -> EpochIterator:
        return self

    @property
    def delivered(self) -> int:
        """Batches this pass has handed over."""
        return self.progress.delivered

    @property
    def finished(self) -> bool:
        """Whether this pass reached its end (raised StopIteration)."""
        return self.progress.finished

    def __len__(self) -> int:
        return len(self.run)

    @property
    def _workers(self) -> list[Any]:
        # torch's private list of an iterator's worker processes, which code (torch's own
        # tests among it) joins after dropping the iterator: the pool's Process objects
        # (Thread objects in thread mode; none inline), usable after the workers stopped.
        return self._pool.worker_handles

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        try:
            batch = next(self._batches)
        except StopIteration:
            self.progress.finished = True
            self.close()
            raise
        except BaseException as exc:
            goes_on = getattr(self._batches, "alive", False)
            if goes_on and isinstance(exc, Exception) and not isinstance(exc, WorkerError):
                # NOTE [ A failed task ]: the batch raised (the dataset or collate_fn), and the
                # pass goes on with the next one, as torch's iterator does. Its place in the
                # plan is passed; it is not a delivered batch.
                self.progress.deliver(failed=True)
            else:  # a dead worker, a timeout, Ctrl-C, an error that ends the pass
                self.close()
            raise
        # Stage time accumulates here and reaches the telemetry in flush_stage(): a lock and a
        # dict update per batch would cost more than the 2% telemetry is allowed.
        self._stage_n += 1
        if self._pool.num_workers == 0:
            self._stage_s += time.perf_counter() - t0
        if self._transform is not None:
            batch = self._transform(batch)
        if self._pin:
            batch = map_tensors(torch.Tensor.pin_memory, batch)
        self.progress.deliver()
        if self._record_steps:
            self._telemetry.record_step(time.perf_counter() - t0, count_rows(batch) or 0)
        self._yielded += 1
        if self._reported_length is not None and self._yielded > self._reported_length:
            self._warn_length()
        return batch

    def _warn_length(self) -> None:
        # torch's warning, word for word (it compares batches with len(dataset), as here).
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be {self._reported_length}"
            f"(when accessing len(dataloader)), but {self._yielded} samples have been fetched. "
        )
        if self._pool.num_workers > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
            )
        warnings.warn(message, stacklevel=3)

    def state(self, delivered: int) -> dict[str, Any]:
        """The pipeline's part of the state after ``delivered`` batches reached the consumer."""
        return self.run.state(delivered)

    def flush_stage(self) -> None:
        """Hand the stage time gathered since the last flush to the telemetry."""
        if self._stage_n == 0:
            return
        # A worker-side transform's time (NOTE [ Decode in the workers ]) is its own stage.
        decode_s = self._pool.stage_seconds.get("decode", 0.0)
        decode, self._decode_s = decode_s - self._decode_s, decode_s
        if self._pool.num_workers == 0:
            seconds = self._stage_s
        else:  # measured in the workers, summed by the pool
            worker_s = self._pool.stage_seconds.get("worker", 0.0)
            seconds, self._worker_s = worker_s - self._worker_s, worker_s
        if self._stage == "fetch":  # decoded inside the fetch's task: not fetch time
            seconds = max(0.0, seconds - decode)
        self._telemetry.add(self._stage, seconds, self._stage_n)
        if decode > 0:
            self._telemetry.add("decode", decode, self._stage_n)
        self._stage_s, self._stage_n = 0.0, 0

    def close(self) -> None:
        """Stop this pass: workers that are not persistent are shut down."""
        if self._done:
            return
        self._done = True
        self.flush_stage()
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
        if self._own_pool is not None:
            self._own_pool.close()
            self._own_pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def pin_memory_enabled(pin_memory: bool) -> bool:
    """Whether to pin: asked for, and an accelerator is there (torch's warning otherwise)."""
    if not pin_memory:
        return False
    if not torch.cuda.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=3,
        )
        return False
    return True
