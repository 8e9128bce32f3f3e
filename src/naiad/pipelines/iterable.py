"""The IterableDataset pipeline: each worker walks its own iterator, as in torch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from naiad.errors import StateError
from naiad.parallel import HandlerFactory, WorkerPool
from naiad.worker import describe_iterable_task, iterable_handler_factory

__all__ = ["IterablePipeline"]


class IterablePipeline:
    """An ``IterableDataset``: a task asks a worker for its iterator's next batch."""

    kind = "iterable"
    stage = "fetch"

    def __init__(
        self, dataset: Any, collate_fn: Callable[[Any], Any], auto_collation: bool, batch_size: int | None,
        drop_last: bool,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.batch_size = batch_size
        self.drop_last = drop_last

    def handler_factory(self) -> HandlerFactory:
        return functools.partial(
            iterable_handler_factory, self.dataset, self.collate_fn, self.auto_collation, self.batch_size, self.drop_last,
        )

    def describe_task(self, task: Any) -> str:
        return describe_iterable_task(task)

    def num_batches(self) -> int:
        # torch's len() of a loader over an IterableDataset: the dataset's len() in batches.
        n = len(self.dataset)
        if self.auto_collation and self.batch_size is not None:
            n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return n

    def why_not_resumable(self) -> str | None:
        return "an IterableDataset keeps its position to itself"

    def open_pass(self, epoch: int, base_seed: int, resume: Mapping[str, Any] | None) -> IterablePass:
        return IterablePass(epoch)

    def start_state(self, epoch: int) -> dict[str, Any]:
        raise StateError(f"this loader cannot be resumed: {self.why_not_resumable()}.")

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        raise StateError(f"this loader cannot be resumed: {self.why_not_resumable()}.")


class IterablePass:
    """One pass: the workers' iterators walked in turn until each is exhausted."""

    start = 0

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        epoch = self.epoch
        return pool.imap_until_exhausted(lambda _w: epoch, prefetch=prefetch, in_order=in_order, epoch=epoch)

    def state(self, delivered: int) -> dict[str, Any]:
        raise StateError("this loader cannot be resumed: an IterableDataset keeps its position to itself.")

    def __len__(self) -> int:
        raise TypeError("the length of a pass over an IterableDataset is not known")
