"""naiad.DataLoader: torch's DataLoader, a batch at a time.

The loader ties the stages together and is the only iterable users touch:

    plan (sampling.py: which indices, batch by batch)
      -> fetch (fetch.py: one call per batch where possible), in workers (parallel/)
      -> pin memory / device prefetch -> the training loop, timed (telemetry)

It subclasses ``torch.utils.data.DataLoader`` and lets torch's constructor check and store
every argument, so arguments, defaults, errors and attributes are torch's own, and code that
tests ``isinstance(loader, torch.utils.data.DataLoader)`` keeps working.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, Sampler

from naiad.errors import ConfigError
from naiad.fetch import FetchStrategy, choose_fetch
from naiad.parallel import WorkerContext, WorkerPool
from naiad.sampling import SeededRandomSampler, plan_batches
from naiad.tree import map_tensors
from naiad.worker import (
    describe_iterable_task,
    describe_map_task,
    iterable_handler_factory,
    map_handler_factory,
)

__all__ = ["DataLoader"]

WorkerMode = Literal["process", "thread"]


class DataLoader(TorchDataLoader):
    """A drop-in replacement for ``torch.utils.data.DataLoader`` that fetches a batch at a time.

    Every argument of torch's DataLoader is accepted with the same meaning and default, and the
    same dataset and configuration yield the same batches. naiad adds keyword-only options.

    What is faster: for tensors, NumPy arrays, ``TensorDataset``, :class:`~naiad.ArrayDataset`
    (and ``Subset`` of them) with the default collate function, each batch is one vectorized
    index per column; a dataset with ``__getitems__`` is called once per batch; index plans of
    torch's own samplers are computed a whole epoch at a time. Other datasets take torch's
    per-sample path, in naiad's workers.

    Args:
        dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
        pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
        prefetch_factor, persistent_workers, pin_memory_device, in_order: as in torch.
        seed: with ``shuffle=True``, shuffle by ``(seed, epoch)`` instead of torch's global
            random generator: reproducible, and the same whatever ``num_workers`` is. The epoch
            advances with each pass, or is named by :meth:`set_epoch`. Also seeds the workers.
        worker_mode: ``"process"`` (torch's behaviour) or ``"thread"`` for datasets whose work
            releases the GIL (NumPy, PyArrow, torch ops).

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> ds = TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
        >>> [y.tolist() for _, y in DataLoader(ds, batch_size=2)]
        [[0, 1], [2, 3], [4]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler[list] | Iterable[list] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        worker_mode: WorkerMode = "process",
    ) -> None:
        if worker_mode not in ("process", "thread"):
            raise ConfigError(f"`worker_mode` must be 'process' or 'thread', got {worker_mode!r}.")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ConfigError(f"`seed` must be an int, got {type(seed).__name__}.")
        iterable = isinstance(dataset, IterableDataset)
        if seed is not None and shuffle and not iterable and sampler is None and batch_sampler is None:
            if generator is not None:
                raise ConfigError(
                    "`seed` and `generator` both choose the shuffle order; pass one of them."
                )
            sampler = SeededRandomSampler(dataset, int(seed))
            shuffle = False
        if iterable and worker_mode == "thread" and num_workers > 0:
            raise ConfigError(
                "`worker_mode='thread'` does not support an IterableDataset: "
                "torch.utils.data.get_worker_info() cannot tell threads apart, so every thread "
                "would read the whole dataset. Use worker_mode='process'."
            )
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        self.seed = None if seed is None else int(seed)
        self.worker_mode: WorkerMode = worker_mode
        self._iterable = iterable
        self._fetch_strategy: FetchStrategy | None = (
            None if iterable else choose_fetch(dataset, collate_fn, self._auto_collation)
        )
        self._pool: WorkerPool | None = None  # kept across epochs with persistent_workers
        self._epoch = 0
        self._wait_s = 0.0
        self._steps = 0

    # ----------------------------------------------------------------------------------------

    @property
    def fetch_strategy(self) -> str:
        """How batches are built: "gather", "getitems", "items" (map-style) or "iterable"."""
        return self._fetch_strategy or "iterable"

    @property
    def epoch(self) -> int:
        """The epoch the next pass over the loader will be."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (its shuffle order, with ``seed``)."""
        self._epoch = int(epoch)
        if isinstance(self.sampler, SeededRandomSampler):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> _LoaderIterator:  # type: ignore[override]
        epoch = self._epoch
        self._epoch += 1
        return _LoaderIterator(self, epoch)

    # ----------------------------------------------------------------------------------------

    def _base_seed(self) -> int:
        # torch draws one int64 from `generator` (or the global generator) per iterator, before
        # the sampler's first draw; drawing it the same way keeps shuffles identical to torch's.
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        return drawn if self.seed is None else self.seed

    def _make_pool(self, base_seed: int) -> WorkerPool:
        factory: Callable[[WorkerContext], Callable[[Any], Any]]
        describe: Callable[[Any], str]
        if self._iterable:
            factory = functools.partial(
                iterable_handler_factory,
                self.dataset,
                self.collate_fn,
                self._auto_collation,
                self.batch_size,
                self.drop_last,
            )
            describe = describe_iterable_task
        else:
            factory = functools.partial(
                map_handler_factory,
                self.dataset,
                self.collate_fn,
                self._auto_collation,
                self._fetch_strategy,
            )
            describe = describe_map_task
        return WorkerPool(
            factory,
            num_workers=self.num_workers,
            mode=self.worker_mode,
            multiprocessing_context=self.multiprocessing_context,
            timeout_s=self.timeout or None,
            worker_init_fn=self.worker_init_fn if self.num_workers > 0 else None,
            base_seed=base_seed,
            describe=describe,
        )

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()


# --------------------------------------------------------------------------------------------


class _LoaderIterator:
    """One pass over a naiad DataLoader."""

    def __init__(self, loader: DataLoader, epoch: int) -> None:
        self._loader = loader
        self.epoch = epoch
        self._pin = _pin_memory_enabled(loader)
        persistent = loader.persistent_workers and loader.num_workers > 0
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
        prefetch = loader.prefetch_factor or 2
        if loader._iterable:
            self._batches = pool.imap_until_exhausted(
                lambda _w: epoch, prefetch=prefetch, in_order=loader.in_order
            )
        else:
            plan = plan_batches(loader.batch_sampler, loader.sampler, loader._auto_collation)
            tasks = enumerate(plan)
            self._batches = pool.imap(tasks, prefetch=prefetch, in_order=loader.in_order)
        self._done = False

    def __iter__(self) -> _LoaderIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        try:
            batch = next(self._batches)
        except BaseException:
            self.close()
            raise
        if self._pin:
            batch = map_tensors(torch.Tensor.pin_memory, batch)
        loader = self._loader
        loader._wait_s += time.perf_counter() - t0
        loader._steps += 1
        return batch

    def close(self) -> None:
        """Stop this pass: workers that are not persistent are shut down."""
        if self._done:
            return
        self._done = True
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


def _pin_memory_enabled(loader: DataLoader) -> bool:
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
