"""Worker-side handlers of naiad.DataLoader: built inside each worker, they turn a task into a batch.

``map_handler_factory`` serves map-style datasets (a task is ``(batch_number, indices)``);
``iterable_handler_factory`` serves an IterableDataset (a task is the epoch number; each worker
walks its own iterator, as in torch). Both make ``torch.utils.data.get_worker_info()`` answer
inside process workers, so datasets that shard themselves by worker keep working.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from naiad.fetch import FetchStrategy, make_fetch
from naiad.parallel import Exhausted, WorkerContext

__all__ = [
    "describe_iterable_task",
    "describe_map_task",
    "iterable_handler_factory",
    "map_handler_factory",
]


def _set_torch_worker_info(context: WorkerContext, dataset: Any) -> None:
    # Datasets shard themselves with torch.utils.data.get_worker_info(); it reads this module
    # global, which torch's own workers set the same way.
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=context.worker_id, num_workers=context.num_workers, seed=context.seed, dataset=dataset
    )


def map_handler_factory(
    dataset: Any,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
    strategy: FetchStrategy | None,
    context: WorkerContext,
) -> Callable[[Any], Any]:
    if context.mode == "process":
        _set_torch_worker_info(context, dataset)
    fetch = make_fetch(dataset, collate_fn, auto_collation, strategy)

    def handle(task: tuple[int, Any]) -> Any:
        return fetch(task[1])

    return handle


def iterable_handler_factory(
    dataset: Any,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
    batch_size: int | None,
    drop_last: bool,
    context: WorkerContext,
) -> Callable[[Any], Any]:
    if context.mode == "process":
        _set_torch_worker_info(context, dataset)
    state: dict[str, Any] = {"epoch": None, "it": None, "ended": False}

    def handle(epoch: int) -> Any:
        if state["epoch"] != epoch:  # a new pass (persistent workers): a fresh iterator
            state.update(epoch=epoch, it=iter(dataset), ended=False)
        if state["ended"]:
            raise Exhausted
        it = state["it"]
        if not auto_collation:
            try:
                item = next(it)
            except StopIteration:
                state["ended"] = True
                raise Exhausted from None
            return collate_fn(item)
        assert batch_size is not None
        data = list(itertools.islice(it, batch_size))
        if len(data) < batch_size:
            state["ended"] = True
        if not data or (drop_last and len(data) < batch_size):
            raise Exhausted
        return collate_fn(data)

    return handle


def describe_map_task(task: Any) -> str:
    number, indices = task
    if isinstance(indices, (list, np.ndarray)):
        shown = ", ".join(str(int(i)) for i in indices[:8])
        more = f", ... ({len(indices)} in all)" if len(indices) > 8 else ""
        return f"batch {number} (indices [{shown}{more}])"
    return f"batch {number} (index {indices!r})"


def describe_iterable_task(epoch: Any) -> str:
    return f"the next batch of the IterableDataset (epoch {epoch})"
