"""Worker-side handlers of naiad.DataLoader: built inside each worker, they turn a task into a batch.

``map_handler_factory`` serves map-style datasets (a task is ``(batch_number, indices)``);
``iterable_handler_factory`` serves an IterableDataset (a task is the epoch number; each worker
walks its own iterator, as in torch). :func:`prepare_worker` runs first, before the user's
``worker_init_fn``, as torch's worker loop does: it makes ``torch.utils.data.get_worker_info()``
answer inside process workers, so datasets and ``worker_init_fn`` that shard by worker keep
working, and it shards a DataPipe graph (``.sharding_filter()``) across workers and ranks.

:class:`WorkerLocal` is how a user sends a *recipe* for a dataset instead of the dataset: only
the factory crosses the process boundary, and each worker builds its own instance (open files,
database connections, decoders, large lookup tables) once, when it starts. :func:`columnar`
lays a list of samples out as arrays, so forked workers share it instead of copying it.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from naiad.dataset.fetch import ArrayDataset, FetchStrategy, describe_indices, make_fetch
from naiad.errors import ConfigError
from naiad.parallel import Exhausted, WorkerContext
from naiad.parallel.context import epoch_seed_sequence, report_stage
from naiad.process_state import ProcessLocal
from naiad.transforms import place

__all__ = [
    "WorkerLocal",
    "columnar",
    "describe_iterable_task",
    "describe_map_task",
    "iterable_handler_factory",
    "map_handler_factory",
    "prepare_worker",
]


def _set_torch_worker_info(context: WorkerContext, dataset: Any) -> None:
    # Datasets shard themselves with torch.utils.data.get_worker_info(); it reads this module
    # global, which torch's own workers set the same way.
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=context.worker_id, num_workers=context.num_workers, seed=context.seed, dataset=dataset
    )


def _distributed() -> tuple[int, int]:
    """(world size, rank) of the default process group, as torch's DataLoader reads them."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _is_datapipe(dataset: Any) -> bool:
    try:
        from torch.utils.data import IterDataPipe, MapDataPipe
    except ImportError:  # pragma: no cover - a torch without DataPipes
        return False
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def prepare_worker(dataset: Any, context: WorkerContext) -> None:
    """Set a worker up as torch's worker loop does, before ``worker_init_fn`` runs.

    In a process worker, ``torch.utils.data.get_worker_info()`` answers from here on (its
    ``dataset`` is the worker's copy, the one its batches come from), so the per-worker split
    from torch's IterableDataset documentation works in ``worker_init_fn``. A DataPipe graph
    is sharded as torch shards it (``graph_settings.apply_sharding``): across the workers of
    every rank in a process worker, across ranks inline. Thread workers share one process, and
    ``get_worker_info()`` reads one process-wide variable, so it stays None there (use
    :func:`naiad.parallel.get_worker_context`).
    """
    if context.mode == "thread":
        return
    datapipe = _is_datapipe(dataset)
    world_size, rank = _distributed() if datapipe else (1, 0)
    if context.mode == "process":
        _set_torch_worker_info(context, dataset)
        if datapipe:
            from torch.utils.data.graph_settings import apply_sharding

            apply_sharding(dataset, context.num_workers * world_size, context.worker_id * world_size + rank)
    elif datapipe:  # inline: torch's single-process iterator shards by rank only
        from torch.utils.data.graph_settings import apply_sharding

        apply_sharding(dataset, world_size, rank)


def _datapipe_seeded(dataset: Any, base_seed: int, epoch: int) -> Any:
    """An IterDataPipe with its random operations (``.shuffle()``) seeded for this pass.

    Every worker seeds them alike, from (base seed, epoch), as torch seeds them from a seed it
    shares between workers: a shuffle before ``.sharding_filter()`` must be the same permutation
    in every worker, or samples repeat and go missing.
    """
    import torch
    from torch.utils.data import IterDataPipe
    from torch.utils.data.graph_settings import apply_random_seed

    if not isinstance(dataset, IterDataPipe):
        return dataset
    shared = epoch_seed_sequence(base_seed, epoch, 0, 0).generate_state(1, np.uint64)[0] >> 1
    return apply_random_seed(dataset, torch.Generator().manual_seed(int(shared)))


class WorkerLocal(Dataset[Any]):
    """A map-style dataset built by ``factory()`` inside each worker, not in the training process.

    Use it when a dataset holds state that should not be pickled into every worker or shared
    across a fork: open file handles, a database or HTTP session, a decoder, a big index built
    at start-up. Only ``factory`` crosses the process boundary (under any start method), and
    naiad's DataLoader calls it once per worker when the worker starts (once per thread in
    thread mode, once in the training process with ``num_workers=0``), so an error in it is
    reported as a start-up error of that worker. Inside ``factory``,
    ``torch.utils.data.get_worker_info()`` names the worker. The batches are those of the built
    dataset, fetched the fastest way it allows (a ``TensorDataset`` built this way is gathered
    a batch at a time). It works with torch's DataLoader too: each process builds its instance
    on first use.

    Args:
        factory: a picklable zero-argument callable (a top-level function or a
            ``functools.partial`` of one) returning a map-style dataset.
        length: the dataset's length, known without building it (the sampler needs it in the
            training process).

    Example:
        >>> import functools, torch
        >>> from torch.utils.data import TensorDataset
        >>> def open_table(n):  # runs in each worker
        ...     return TensorDataset(torch.arange(n))
        >>> ds = WorkerLocal(functools.partial(open_table, 6), length=6)
        >>> [b[0].tolist() for b in naiad.DataLoader(ds, batch_size=4)]  # doctest: +SKIP
        [[0, 1, 2, 3], [4, 5]]
    """

    def __init__(self, factory: Callable[[], Any], length: int) -> None:
        if not callable(factory):
            raise ConfigError(f"WorkerLocal: `factory` must be callable, got {type(factory).__name__}.")
        if int(length) < 0:
            raise ConfigError(f"WorkerLocal: `length` must be >= 0, got {length}.")
        self.factory = factory
        self.length = int(length)
        # A partial of a function, not a bound method: no reference cycle through the instance.
        self._local = ProcessLocal(functools.partial(_built, factory, self.length), name="naiad.WorkerLocal")

    def build(self) -> Any:
        """A new instance from ``factory()``, checked against ``length``."""
        return _built(self.factory, self.length)

    def local(self) -> Any:
        """This process's instance, built on first use (a forked child builds its own: NOTE
        [ Per-process state ])."""
        return self._local.get()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.local()[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        inner = self.local()
        getitems = getattr(inner, "__getitems__", None)
        if getitems is not None:
            return list(getitems(indices))
        return [inner[i] for i in indices]

    def __getstate__(self) -> dict[str, Any]:
        # Only the recipe travels; each process builds its own instance.
        return {"factory": self.factory, "length": self.length}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["factory"], state["length"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"WorkerLocal({self.factory!r}, length={self.length})"


def _built(factory: Callable[[], Any], length: int) -> Any:
    dataset = factory()
    try:
        n = len(dataset)
    except TypeError:
        raise ConfigError(
            f"WorkerLocal: the factory must return a map-style dataset with __len__, "
            f"got {type(dataset).__name__}."
        ) from None
    if n != length:
        raise ConfigError(
            f"WorkerLocal: the factory built a dataset of length {n}, but `length` is "
            f"{length}; pass length={n}."
        )
    return dataset


def columnar(samples: Sequence[Any]) -> ArrayDataset | np.ndarray:
    """Turn a list of samples into an :class:`~naiad.ArrayDataset`: one NumPy array per field.

    A list of millions of small tuples or dicts is the classic way worker processes run out of
    memory: every sample is a handful of Python objects, and merely *reading* one in a forked
    worker writes its reference counts, so the worker gets its own copy of each memory page it
    touches (copy-on-read). After one epoch each worker holds a copy of most of the list. An
    ArrayDataset keeps the same data in a few large arrays with no per-row objects: a forked
    worker reads them without writing to them, so the pages stay shared, and batches are
    gathered with one vectorized index per column. Call it once, before making the loader; the
    batches are the ones ``default_collate`` builds from the original samples.

    Args:
        samples: tuples (or lists) of the same length, or dicts with the same keys, whose fields
            are numbers, booleans, or NumPy arrays / tensors of one shape per field; or single
            numbers / arrays / tensors, which give one NumPy array (a dataset as it is).

    Example:
        >>> ds = columnar([(1, 0.5), (2, 1.5), (3, 2.5)])
        >>> [c.dtype for c in ds.columns], ds[1]
        ([dtype('int64'), dtype('float64')], (np.int64(2), np.float64(1.5)))
    """
    if len(samples) == 0:
        raise ConfigError("columnar: `samples` is empty; there is nothing to lay out.")
    first = samples[0]
    if isinstance(first, Mapping):
        keys = list(first.keys())
        fields = {k: _column([s[k] for s in samples], repr(k)) for k in keys}
        return ArrayDataset(fields)
    if isinstance(first, (tuple, list)):
        width = len(first)
        if any(len(s) != width for s in samples):
            raise ConfigError(f"columnar: every sample needs {width} fields, like the first one.")
        # zip(*...) walks the list once in C; this runs once, before training.
        return ArrayDataset(*(_column(list(col), f"field {i}") for i, col in enumerate(zip(*samples))))
    # Single arrays or numbers: one array, which the loader gathers as a whole.
    return _column(list(samples), "sample")


def _column(values: list[Any], name: str) -> np.ndarray:
    import torch

    v0 = values[0]
    if isinstance(v0, torch.Tensor):
        out = torch.stack(values).numpy()
    elif isinstance(v0, np.ndarray):
        out = np.stack(values)
    else:
        out = np.asarray(values)
        if isinstance(v0, bool):
            out = out.astype(np.bool_)
    if out.dtype.kind not in "biufc":
        raise ConfigError(
            f"columnar: {name} holds {type(v0).__name__} values (dtype {out.dtype}); only numbers, "
            "booleans and numeric arrays can be laid out as columns. Keep text in a separate "
            "pyarrow array and look it up by index."
        )
    return out


def map_handler_factory(
    dataset: Any,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
    strategy: FetchStrategy | None,
    context: WorkerContext,
    transform: Callable[[Any], Any] | None = None,
) -> Callable[[Any], Any]:
    """Build, in a worker, ``handle((batch_number, indices)) -> batch``: the fetch, then the
    worker-side ``transform`` when given (NOTE [ Decode in the workers ] in pipeline.py)."""
    if context.mode == "process":
        _set_torch_worker_info(context, dataset)  # again: a pool made without prepare_worker
    if isinstance(dataset, WorkerLocal):
        # Threads share a process, so each builds its own; processes and inline use theirs.
        dataset = dataset.build() if context.mode == "thread" else dataset.local()
        if context.mode == "process":
            _set_torch_worker_info(context, dataset)
        strategy = None  # the fastest way for what was built, not for the wrapper
    fetch = make_fetch(dataset, collate_fn, auto_collation, strategy)
    if transform is None:

        def handle(task: tuple[int, Any]) -> Any:
            return fetch(task[1])

        return handle

    key = place(transform, "map").key  # the key column it reads, if any (NOTE [ Transform placement ])

    def handle_and_transform(task: tuple[int, Any]) -> Any:
        # NOTE [ Decode in the workers ]: the batch transform right after the fetch, in the worker;
        # the dataset indices are the samples' keys (the pool's task gives the epoch and seed).
        batch = fetch(task[1])
        # Without auto-collation (batch_size=None) the loader yields samples: one is decoded
        # as a batch of one, and handed out as a sample again.
        single = not auto_collation and isinstance(batch, Mapping)
        if single:
            batch = {name: [value] for name, value in batch.items()}
        if isinstance(batch, Mapping) and key is not None and key not in batch:
            indices = np.asarray(task[1], dtype=np.int64).reshape(-1)
            batch = {**batch, key: torch.from_numpy(indices)}
        t0 = time.perf_counter()
        try:
            out = transform(batch)
        finally:
            report_stage("decode", time.perf_counter() - t0)
        return {name: value[0] for name, value in out.items()} if single and isinstance(out, Mapping) else out

    return handle_and_transform


def iterable_handler_factory(
    dataset: Any,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
    batch_size: int | None,
    drop_last: bool,
    context: WorkerContext,
) -> Callable[[Any], Any]:
    if context.mode == "process":
        _set_torch_worker_info(context, dataset)  # again: a pool made without prepare_worker
    state: dict[str, Any] = {"epoch": None, "it": None, "ended": False}

    def handle(epoch: int) -> Any:
        # After an exception the iterator is asked again, as torch's worker does: a generator
        # that raised is finished and ends this worker's part; an iterator object may go on.
        if state["epoch"] != epoch:  # a new pass (persistent workers): a fresh iterator
            source = _datapipe_seeded(dataset, context.base_seed, epoch)
            state.update(epoch=epoch, it=iter(source), ended=False)
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
        return f"batch {number} (indices {describe_indices(indices)})"
    return f"batch {number} (index {indices!r})"


def describe_iterable_task(epoch: Any) -> str:
    return f"the next batch of the IterableDataset (epoch {epoch})"
