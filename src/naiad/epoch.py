"""One pass over a naiad DataLoader: the plan's tasks through the worker pool to the training loop.

An :class:`EpochIterator` is what ``iter(naiad.DataLoader(...))`` returns (wrapped in a
``DevicePrefetcher`` when the loader has a ``device``). It builds or borrows the loader's
:class:`~naiad.parallel.WorkerPool`, feeds it the epoch's tasks (index batches, a stream's block
reads, or an IterableDataset's "next batch"), applies the transform and pinning, counts what it
delivered (for ``state_dict``), and records the training loop's waits in the loader's telemetry.
"""

from __future__ import annotations

import functools
import itertools
import time
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from naiad.parallel import WorkerPool
from naiad.sampling import plan_batches
from naiad.stream import iter_batches
from naiad.tree import count_rows, map_tensors

if TYPE_CHECKING:
    from naiad.loader import DataLoader

__all__ = ["EpochIterator", "describe_read_task"]


class EpochIterator:
    """One pass (epoch) over a naiad DataLoader: drives the pool, times the waits, closes cleanly."""

    def __init__(
        self,
        loader: DataLoader,
        epoch: int,
        skip: int = 0,
        *,
        record_steps: bool = True,
        stream_state: dict[str, Any] | None = None,
    ) -> None:
        self._loader = loader
        self.epoch = epoch
        self.delivered = 0
        self.skipped = skip
        self.finished = False
        self._telemetry = loader._telemetry
        self._record_steps = record_steps
        self._pin = pin_memory_enabled(loader)
        # A tuned pool lives across passes too: the tuner keeps what it learnt.
        persistent = (loader.persistent_workers and loader.num_workers > 0) or loader._tuner is not None
        # torch draws the base seed once per iterator, or once per persistent iterator.
        if not persistent or loader._pool is None:
            base_seed = loader._base_seed()
            if persistent:
                loader._pool = loader._make_pool(base_seed)
        self._own_pool: WorkerPool | None = None
        if persistent:
            pool = loader._pool
            assert pool is not None
        else:
            pool = self._own_pool = loader._make_pool(base_seed)
        self._pool = pool
        self._stage = "read" if loader._source is not None else "fetch"
        self._worker_s = pool.stage_seconds.get("worker", 0.0)
        self._stage_s, self._stage_n = 0.0, 0
        prefetch = loader.prefetch_factor or 2
        self._batches: Iterator[Any]
        if loader._source is not None:
            assert loader._stream_options is not None
            self._batches = iter_batches(
                loader._source,
                loader._stream_options,
                epoch=epoch,
                imap=functools.partial(pool.imap, prefetch=prefetch, in_order=True, epoch=epoch),
                counters=loader._stream_counters,
                state=_resume_stream_state(loader, epoch, skip, stream_state) if skip else None,
            )
        elif loader._iterable:
            self._batches = pool.imap_until_exhausted(
                lambda _w: epoch, prefetch=prefetch, in_order=loader.in_order, epoch=epoch
            )
        else:
            plan = plan_batches(loader.batch_sampler, loader.sampler, loader._auto_collation)
            # Resuming skips the delivered batches' indices without fetching them.
            tasks = itertools.islice(enumerate(plan), skip, None)
            self._batches = pool.imap(tasks, prefetch=prefetch, in_order=loader.in_order, epoch=epoch)
        if loader._tuner is not None:
            self._batches = loader._tuner.drive(pool, self._batches)
        self._done = False

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        try:
            batch = next(self._batches)
        except StopIteration:
            self.finished = True
            self.close()
            raise
        except BaseException:
            self.close()
            raise
        # Stage time accumulates here and reaches the telemetry in flush_stage(): a lock and a
        # dict update per batch would cost more than the 2% telemetry is allowed.
        self._stage_n += 1
        if self._pool.num_workers == 0:
            self._stage_s += time.perf_counter() - t0
        transform = self._loader.transform
        if transform is not None and self._loader._source is None:
            batch = transform(batch)
        if self._pin:
            batch = map_tensors(torch.Tensor.pin_memory, batch)
        self.delivered += 1
        if self._record_steps:
            self._telemetry.record_step(time.perf_counter() - t0, count_rows(batch) or 0)
        return batch

    def stream_state(self, delivered: int) -> dict[str, Any] | None:
        """The stream's own state at ``delivered`` batches (None for datasets)."""
        get_state = getattr(self._batches, "get_state", None)
        if get_state is None:
            return None
        return {**get_state(), "batches_yielded": delivered}

    def flush_stage(self) -> None:
        """Hand the stage time gathered since the last flush to the loader's telemetry."""
        if self._stage_n == 0:
            return
        if self._pool.num_workers == 0:
            seconds = self._stage_s
        else:  # measured in the workers, summed by the pool
            worker_s = self._pool.stage_seconds.get("worker", 0.0)
            seconds, self._worker_s = worker_s - self._worker_s, worker_s
        self._telemetry.add(self._stage, seconds, self._stage_n)
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


def describe_read_task(task: Any) -> str:
    block = getattr(task, "block", None)
    if block is None:
        return f"block {task!r:.300}"
    return f"{block.path} (block from {block.start} to {block.stop}, its rows {task.lo}:{task.hi})"


def _resume_stream_state(
    loader: DataLoader, epoch: int, skip: int, saved: dict[str, Any] | None
) -> dict[str, Any]:
    """The state a resumed stream starts from: the saved stream's own (it knows what it skipped),
    else the plan's inputs as this loader has them."""
    if saved is not None:
        return {**saved, "batches_yielded": skip}
    assert loader._source is not None and loader._stream_options is not None
    probe = iter_batches(loader._source, loader._stream_options, epoch=epoch, imap=lambda tasks: iter(()))
    return {**probe.get_state(), "batches_yielded": skip}


def pin_memory_enabled(loader: DataLoader) -> bool:
    if not loader.pin_memory:
        return False
    if not torch.cuda.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=3,
        )
        return False
    return True
