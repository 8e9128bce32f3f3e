"""The IterableDataset pipeline: each worker walks its own iterator, as in torch.

An IterableDataset keeps its position to itself, so a resume fast-forwards: the pass reads and
drops the batches already delivered. Each worker walks its own iterator, and what it delivered
is always a prefix of its own batches, in order or not (NOTE [ Out-of-order delivery ] in
delivered.py), so the state counts the batches *per worker* and a resume drops each worker's own
count, whatever order the workers' results arrive in. That is exact when the dataset yields the
same samples in the same order in each pass of an epoch (with the same ``num_workers``, which
decides each worker's share), and costs the reading of what is skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from naiad.dataset.worker import describe_iterable_task, iterable_handler_factory
from naiad.errors import StateError
from naiad.order.delivered import DeliveryLog, WorkerCounts
from naiad.order.elastic import state_int
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
    batch_transform: Callable[[Any], Any] | None = None  # no position to key a sample by: applied in the loop

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
        if resume is None:
            return IterablePass(epoch, 0, self.num_workers, [0] * max(1, self.num_workers))
        workers = read_workers(resume, self.num_workers)
        return IterablePass(epoch, int(resume["batches"]), self.num_workers, workers)

    def start_state(self, epoch: int) -> dict[str, Any]:
        return {"batches": 0, "num_workers": self.num_workers, "fast_forward": True,
                "workers": [0] * max(1, self.num_workers)}

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        check_fields(part, {"num_workers": self.num_workers}, "loader state",
                     "an IterableDataset resumes by skipping batches, whose order depends on the number "
                     "of workers; make the loader with the same num_workers.")
        state_int(part.get("batches"), "loader state batches")
        read_workers(part, self.num_workers)


def read_workers(part: Mapping[str, Any], num_workers: int) -> list[int] | None:
    """The batches each worker delivered, read strictly from a state (None: a state of naiad
    before they were counted, whose ``batches`` were delivered in order)."""
    if "workers" not in part:
        return None
    stored = part["workers"]
    slots = max(1, num_workers)  # inline, the process walks the one iterator
    if not isinstance(stored, list) or len(stored) != slots:
        shown = f"a list of {len(stored)}" if isinstance(stored, list) else f"{stored!r:.80}"
        raise StateError(f"loader state workers: stored {shown}, expected a list of {slots} counts (one per worker).")
    counts = [state_int(c, f"loader state workers[{w}]") for w, c in enumerate(stored)]
    if sum(counts) != part.get("batches"):
        raise StateError(f"loader state workers: stored counts summing to {sum(counts)}, but batches is "
                         f"{part.get('batches')!r:.80}; they must agree.")
    return counts


class IterablePass:
    """One pass: the workers' iterators walked until each is exhausted, after skipping the
    batches a resumed pass had delivered, each worker its own count."""

    def __init__(self, epoch: int, start: int, num_workers: int, workers: list[int] | None) -> None:
        self.epoch = epoch
        self.start = start
        self.num_workers = num_workers
        self._skip = workers  # per worker, batches to drop (None: `start` in order, an older state)
        slots = max(1, num_workers)
        self.deliveries: DeliveryLog[WorkerCounts] = DeliveryLog(WorkerCounts(workers or [0] * slots))

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        epoch = self.epoch
        log = self.deliveries
        if self._skip is None:
            return self._skip_in_order(pool, prefetch)
        skip = list(self._skip)
        skipping = [False]

        def delivered(worker: int, payload: Any) -> None:
            # NOTE [ Out-of-order delivery ]: a worker's results arrive in its own order, so its
            # first `skip[worker]` ones are the batches it delivered before the resume.
            skipping[0] = skip[worker] > 0
            if skipping[0]:
                skip[worker] -= 1
            else:
                log.add(worker)

        it = pool.imap_until_exhausted(lambda _w: epoch, prefetch=prefetch, in_order=in_order, epoch=epoch,
                                       on_deliver=delivered)
        return _Skipping(it, skipping) if any(skip) else it

    def _skip_in_order(self, pool: WorkerPool, prefetch: int) -> Iterator[Any]:
        """A state of naiad before per-worker counts: its ``start`` batches were the first in
        order, so the pass walks in order, drops them, and counts whose they were."""
        epoch = self.epoch
        log = self.deliveries
        skipping = [True]

        def delivered(worker: int, payload: Any) -> None:
            if skipping[0]:
                log.add_settled(worker)
            else:
                log.add(worker)

        it = pool.imap_until_exhausted(lambda _w: epoch, prefetch=prefetch, in_order=True, epoch=epoch,
                                       on_deliver=delivered)
        for _ in range(self.start):  # fast-forward: read and drop what was delivered
            try:
                if next(it, _END) is _END:
                    break
            except Exception:
                # A batch that failed in the interrupted pass fails again here; it was not
                # delivered then either, and the pass goes on after it, as torch's does.
                if not getattr(it, "alive", False):
                    raise
        skipping[0] = False
        return it

    def state(self, delivered: int) -> dict[str, Any]:
        counts = self.deliveries.at(delivered).counts
        return {"batches": sum(counts), "num_workers": self.num_workers, "fast_forward": True, "workers": counts}

    def __len__(self) -> int:
        raise TypeError("the length of a pass over an IterableDataset is not known")


class _Skipping(Iterator[Any]):
    """A resumed pass's results less the ones each worker had delivered before: a class, not a
    generator, so that a batch's exception passes through and the pass goes on after it
    (NOTE [ A failed task ] in parallel/results.py)."""

    def __init__(self, results: Iterator[Any], skipping: list[bool]) -> None:
        self._results = results
        self._skipping = skipping  # set by the pool's on_deliver for the result it is about to give

    @property
    def alive(self) -> bool:
        return bool(getattr(self._results, "alive", False))

    def __iter__(self) -> _Skipping:
        return self

    def __next__(self) -> Any:
        while True:
            self._skipping[0] = False
            try:
                item = next(self._results)
            except Exception:
                # A skipped batch that failed in the interrupted pass fails again: not delivered
                # then either, so it is dropped too.
                if self._skipping[0] and self.alive:
                    continue
                raise
            if not self._skipping[0]:
                return item

    def close(self) -> None:
        close = getattr(self._results, "close", None)
        if close is not None:
            close()


_END = object()
