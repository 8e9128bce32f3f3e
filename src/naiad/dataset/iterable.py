"""The IterableDataset pipeline: each worker walks its own iterator, as in torch.

An IterableDataset keeps its position to itself, so a resume fast-forwards by count: the
pass reads and drops the batches already delivered. That is exact when the dataset yields
the same samples in the same order in each pass of an epoch (with the same ``num_workers``,
whose interleaving decides the batches' order), and costs the reading of what is skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from naiad.dataset.worker import describe_iterable_task, iterable_handler_factory
from naiad.errors import StateError
from naiad.parallel import HandlerFactory, WorkerPool
from naiad.pipeline import ReadsNothingAhead, check_fields

__all__ = ["IterablePipeline"]


class IterablePipeline(ReadsNothingAhead):
    """An ``IterableDataset``: a task asks a worker for its iterator's next batch."""

    kind = "iterable"
    stage = "fetch"
    strategy = "iterable"
    sharded_by_loader = False
    warns_past_length = True

    def __init__(
        self, dataset: Any, collate_fn: Callable[[Any], Any], auto_collation: bool, batch_size: int | None,
        drop_last: bool,
        num_workers: int,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_workers = num_workers

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
        return None

    def open_pass(self, epoch: int, base_seed: int, resume: Mapping[str, Any] | None) -> IterablePass:
        return IterablePass(epoch, int(resume["batches"]) if resume is not None else 0, self.num_workers)

    def start_state(self, epoch: int) -> dict[str, Any]:
        return {"batches": 0, "num_workers": self.num_workers, "fast_forward": True}

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        check_fields(part, {"num_workers": self.num_workers}, "loader state",
                     "an IterableDataset resumes by skipping batches, whose order depends on the number "
                     "of workers; make the loader with the same num_workers.")
        if not isinstance(part.get("batches"), int) or part["batches"] < 0:
            raise StateError(f"loader state batches: stored {part.get('batches')!r}, expected an int >= 0.")


class IterablePass:
    """One pass: the workers' iterators walked in turn until each is exhausted, after skipping
    the batches a resumed pass had delivered."""

    def __init__(self, epoch: int, start: int, num_workers: int) -> None:
        self.epoch = epoch
        self.start = start
        self.num_workers = num_workers

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        epoch = self.epoch
        it = pool.imap_until_exhausted(lambda _w: epoch, prefetch=prefetch, in_order=in_order, epoch=epoch)
        for _ in range(self.start):  # fast-forward: read and drop what was delivered
            try:
                if next(it, _END) is _END:
                    break
            except Exception:
                # A batch that failed in the interrupted pass fails again here; it was not
                # delivered then either, and the pass goes on after it, as torch's does.
                if not getattr(it, "alive", False):
                    raise
        return it

    def state(self, delivered: int) -> dict[str, Any]:
        return {"batches": self.start + delivered, "num_workers": self.num_workers, "fast_forward": True}

    def __len__(self) -> int:
        raise TypeError("the length of a pass over an IterableDataset is not known")


_END = object()
