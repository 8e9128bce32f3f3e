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

import dataclasses
import functools
import os
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, Sampler

from naiad.device import DevicePrefetcher
from naiad.epoch import EpochIterator, describe_read_task
from naiad.errors import ConfigError, StateError
from naiad.fetch import FetchStrategy, choose_fetch
from naiad.parallel import AutoTuner, WorkerContext, WorkerPool
from naiad.sampling import SeededRandomSampler, ShardedBatchSampler
from naiad.sources.base import Source
from naiad.stream import (
    StreamCounters,
    StreamOptions,
    iter_batches,
    make_handler_factory,
    num_batches,
)
from naiad.telemetry import LoaderStats, Telemetry
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
        worker_mode: ``"process"`` or ``"thread"`` for work that releases the GIL (NumPy,
            PyArrow, torch ops). Default: processes (torch's behaviour) for datasets, threads for
            streaming sources, whose parsing is PyArrow's and releases the GIL (and results then
            need no copy through shared memory).

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
        num_workers: int | Literal["auto"] = 0,
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
        worker_mode: WorkerMode | None = None,
        device: str | torch.device | None = None,
        device_prefetch: int = 2,
        shuffle_buffer: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if worker_mode is None:
            worker_mode = "thread" if isinstance(dataset, Source) else "process"
        if worker_mode not in ("process", "thread"):
            raise ConfigError(f"`worker_mode` must be 'process' or 'thread', got {worker_mode!r}.")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ConfigError(f"`seed` must be an int, got {type(seed).__name__}.")
        source = dataset if isinstance(dataset, Source) else None
        stream_options: StreamOptions | None = None
        if source is not None:
            for name, given in (("sampler", sampler), ("batch_sampler", batch_sampler), ("collate_fn", collate_fn)):
                if given is not None:
                    raise ConfigError(
                        f"`{name}` does not apply to a streaming source ({type(source).__name__}): "
                        "the plan orders its blocks; use `shuffle`, `seed` and `transform`."
                    )
            if batch_size is None:
                raise ConfigError("a streaming source needs an int `batch_size`, got None.")
            stream_options = StreamOptions(
                batch_size=batch_size,
                shuffle=bool(shuffle),
                seed=0 if seed is None else int(seed),  # 0, not random: every rank must agree
                shuffle_buffer=shuffle_buffer,
                drop_last=drop_last,
                rank=rank,
                world_size=world_size,
                transform=transform,
            )
            shuffle = None  # the stream shuffles; torch's sampler stays sequential and unused
        else:
            if shuffle_buffer is not None:
                raise ConfigError(
                    "`shuffle_buffer` applies to streaming sources (naiad.read_csv and friends); "
                    f"a map-style dataset is shuffled as a whole, got shuffle_buffer={shuffle_buffer!r}."
                )
            if (rank is None) != (world_size is None):
                raise ConfigError(f"give both `rank` and `world_size` or neither, got rank={rank!r}, world_size={world_size!r}.")
        if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or device_prefetch < 1:
            raise ConfigError(f"`device_prefetch` must be an int >= 1, got {device_prefetch!r}.")
        iterable = isinstance(dataset, IterableDataset)
        tuner: AutoTuner | None = None
        if num_workers == "auto":
            if iterable:
                raise ConfigError(
                    "`num_workers='auto'` needs a map-style dataset or a streaming source: the "
                    "workers of an IterableDataset each walk their own iterator and cannot be "
                    "added or removed mid-epoch. Pass an int."
                )
            tuner = AutoTuner(prefetch=prefetch_factor or 2)
            # torch's constructor checks these against num_workers=0; the tuner owns them now.
            num_workers, prefetch_factor, persistent_workers = 0, None, False
        elif isinstance(num_workers, str):
            raise ConfigError(f"`num_workers` must be an int >= 0 or 'auto', got {num_workers!r}.")
        if seed is not None and shuffle and not iterable and sampler is None and batch_sampler is None:
            if generator is not None:
                raise ConfigError(
                    "`seed` and `generator` both choose the shuffle order; pass one of them."
                )
            sampler = SeededRandomSampler(dataset, int(seed))
            shuffle = False
        sharded_batch_size: int | None = None
        if source is None and rank is not None and world_size is not None:
            if iterable or sampler is not None and not isinstance(sampler, SeededRandomSampler) or batch_sampler is not None:
                raise ConfigError(
                    "`rank`/`world_size` shard a map-style dataset by naiad's own order; they do "
                    "not combine with an IterableDataset, a custom `sampler` or a `batch_sampler`."
                )
            if shuffle:
                raise ConfigError(
                    "`shuffle=True` with `rank`/`world_size` needs `seed=`: every rank must draw "
                    "the same order (torch's global generator differs between processes)."
                )
            order = sampler if sampler is not None else torch.utils.data.SequentialSampler(dataset)
            if batch_size is None:
                raise ConfigError("`rank`/`world_size` need an int `batch_size`, got None.")
            batch_sampler = ShardedBatchSampler(order, batch_size, drop_last, int(rank), int(world_size))
            sharded_batch_size, sharded_drop_last = batch_size, drop_last
            batch_size, sampler, drop_last = 1, None, False
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
        if sharded_batch_size is not None:
            # torch clears batch_size when a batch_sampler is given; the rank's batches are still
            # of this size (the last few a row smaller), so keep it visible.
            object.__setattr__(self, "batch_size", sharded_batch_size)
            object.__setattr__(self, "drop_last", sharded_drop_last)
        self._tuner = tuner
        self._rank = 0 if rank is None else int(rank)
        self.seed = None if seed is None else int(seed)
        self.worker_mode: WorkerMode = worker_mode
        self.device = device
        self.device_prefetch = device_prefetch
        self.transform = transform
        self._source = source
        self._stream_options = stream_options
        self._stream_counters = StreamCounters()
        self._iterable = iterable
        self._fetch_strategy: FetchStrategy | None = (
            None if iterable or source is not None else choose_fetch(dataset, collate_fn, self._auto_collation)
        )
        self._pool: WorkerPool | None = None  # kept across epochs with persistent_workers
        self._epoch = 0
        self._telemetry = Telemetry()
        self._current: weakref.ReferenceType[Any] | None = None  # the pass in progress
        self._current_inner: weakref.ReferenceType[EpochIterator] | None = None
        self._resume: dict[str, Any] | None = None

    # ----------------------------------------------------------------------------------------

    @property
    def fetch_strategy(self) -> str:
        """How batches are built: "gather", "getitems", "items" (map-style), "iterable" or "stream"."""
        if self._source is not None:
            return "stream"
        return self._fetch_strategy or "iterable"

    def __len__(self) -> int:
        if self._source is not None:
            assert self._stream_options is not None
            return num_batches(self._source, self._stream_options)
        return super().__len__()

    def stats(self) -> LoaderStats:
        """What the loader did since it was made: batches, rows, the training loop's wait for data
        (total, per step, percentiles), and the time spent in each stage.

        ``fetch`` is dataset access and collation (in workers when there are any), ``read`` the
        reading and parsing of a streaming source's blocks, ``transfer`` the copy to ``device``.
        Rows skipped by ``on_bad_rows="skip"`` are in :attr:`bad_rows`.
        """
        inner = self._current_inner() if self._current_inner is not None else None
        if inner is not None:
            inner.flush_stage()
        return dataclasses.replace(self._telemetry.stats(), workers=self.workers_info(), bad_rows=self.bad_rows)

    def workers_info(self) -> dict[str, Any]:
        """How many workers run and why: the user's setting, or what ``"auto"`` chose and measured."""
        if self._tuner is not None:
            return {"setting": "auto", **self._tuner.stats()}
        return {
            "setting": self.num_workers,
            "num_workers": self.num_workers,
            "mode": self.worker_mode if self.num_workers else "inline",
            "reason": "set by the user",
        }

    @property
    def bad_rows(self) -> dict[str, int]:
        """Rows a streaming source skipped (``on_bad_rows="skip"``), per file."""
        return dict(self._stream_counters.bad_rows_by_file)

    def export_trace(self, path: str | os.PathLike[str]) -> str:
        """Write the loader's recent timeline as Chrome trace JSON (open it in Perfetto)."""
        return str(self._telemetry.export_chrome_trace(path))

    @property
    def epoch(self) -> int:
        """The epoch the next pass over the loader will be."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (its shuffle order, with ``seed``)."""
        self._epoch = int(epoch)
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(sampler, SeededRandomSampler):
                sampler.set_epoch(epoch)

    def __iter__(self) -> Any:
        epoch = self._epoch
        self._epoch += 1
        resume, self._resume = self._resume, None
        skip = 0
        stream_state = None
        if resume is not None and resume["epoch"] == epoch:
            skip = int(resume["batches_yielded"])
            stream_state = resume.get("stream")
        inner = EpochIterator(self, epoch, skip, record_steps=self.device is None, stream_state=stream_state)
        self._current_inner = weakref.ref(inner)
        outer: Any = inner
        if self.device is not None:
            outer = iter(
                DevicePrefetcher(inner, self.device, depth=self.device_prefetch, telemetry=self._telemetry)
            )
        self._current = weakref.ref(outer)
        return outer

    # ----------------------------------------------------------------------------------------
    # Resumption.

    def _resumable_why_not(self) -> str | None:
        if self._iterable:
            return "an IterableDataset keeps its position to itself"
        if self._source is not None:
            return None
        sampler = self.sampler
        if isinstance(self.batch_sampler, ShardedBatchSampler):
            return None
        if self._auto_collation and type(self.batch_sampler) is not torch.utils.data.BatchSampler:
            return f"the custom batch_sampler {type(self.batch_sampler).__name__} has no known order"
        if isinstance(sampler, (SeededRandomSampler, torch.utils.data.SequentialSampler)):
            return None
        if type(sampler) is torch.utils.data.RandomSampler:
            return "shuffle=True draws its order from torch's global generator; pass `seed=` for an order that can be resumed"
        return f"the sampler {type(sampler).__name__} has no known order"

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as plain JSON-able data: the epoch and the batches delivered.

        Load it into a loader made with the same arguments (:meth:`load_state_dict`) and the
        next pass continues exactly where this one stopped: the same remaining batches, in the
        same order, then the following epochs as they would have been.

        Raises:
            StateError: the order cannot be replayed (an IterableDataset, torch's global-RNG
                shuffle without ``seed=``, or a custom sampler).
        """
        why = self._resumable_why_not()
        if why is not None:
            raise StateError(f"this loader cannot be resumed: {why}.")
        outer = self._current() if self._current is not None else None
        inner = self._current_inner() if self._current_inner is not None else None
        stream: dict[str, Any] | None = None
        if outer is not None and inner is not None and not inner.finished:
            epoch, delivered = inner.epoch, int(getattr(outer, "delivered", inner.delivered)) + inner.skipped
            stream = inner.stream_state(delivered)
        else:
            epoch, delivered = self._epoch, 0
        state: dict[str, Any] = {
            "version": 1,
            "epoch": epoch,
            "batches_yielded": delivered,
            "seed": self.seed if self._source is None else self._stream_options.seed,  # type: ignore[union-attr]
            "num_batches": len(self),
        }
        if stream is not None:
            state["stream"] = stream  # the plan's inputs, and what was skipped, checked on resume
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass resumes mid-epoch where it stopped."""
        why = self._resumable_why_not()
        if why is not None:
            raise StateError(f"this loader cannot be resumed: {why}.")
        if not isinstance(state, dict) or state.get("version") != 1:
            raise StateError(f"unknown loader state: expected a dict with version 1, got {state!r:.200}.")
        current = self.state_dict()
        for key in ("seed", "num_batches"):
            if state.get(key) != current[key]:
                raise StateError(
                    f"the state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={current[key]!r}; make the loader with the same arguments."
                )
        if not 0 <= int(state["batches_yielded"]) <= current["num_batches"]:
            raise StateError(f"`batches_yielded` must be in [0, {current['num_batches']}], got {state['batches_yielded']!r}.")
        if self._source is not None and state.get("stream") is not None:
            assert self._stream_options is not None
            # The stream checks its own part now (plan inputs, rows it skipped), not at iter().
            iter_batches(self._source, self._stream_options, epoch=int(state["epoch"]), imap=lambda tasks: iter(()), state=state["stream"])
        self.set_epoch(int(state["epoch"]))
        self._resume = dict(state)

    # ----------------------------------------------------------------------------------------

    def _base_seed(self) -> int:
        # torch draws one int64 from `generator` (or the global generator) per iterator, before
        # the sampler's first draw; drawing it the same way keeps shuffles identical to torch's.
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        return drawn if self.seed is None else self.seed

    def _make_pool(self, base_seed: int) -> WorkerPool:
        factory: Callable[[WorkerContext], Callable[[Any], Any]]
        describe: Callable[[Any], str]
        if self._source is not None:
            factory = make_handler_factory(self._source)
            describe = describe_read_task
        elif self._iterable:
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
        tuner = self._tuner
        return WorkerPool(
            factory,
            num_workers=self.num_workers if tuner is None else tuner.decision.num_workers,
            mode=self.worker_mode,
            multiprocessing_context=self.multiprocessing_context,
            timeout_s=self.timeout or None,
            worker_init_fn=self.worker_init_fn if self.num_workers > 0 or tuner is not None else None,
            base_seed=base_seed,
            describe=describe,
            rank=self._rank,
            init_inline=tuner is None,  # with "auto", only real workers run worker_init_fn
        )

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
