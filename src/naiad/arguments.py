"""naiad.DataLoader's arguments: naiad's own checked, torch's adjusted before torch sees them.

The loader hands torch's constructor what torch should store (its checks and attributes stay
torch's own); this module decides what that is: a seeded shuffle becomes a
:class:`~naiad.dataset.sampling.SeededRandomSampler`, ``rank``/``world_size`` a
:class:`~naiad.dataset.sampling.ShardedBatchSampler`, a streaming source keeps torch's sampler
sequential and unused, ``num_workers="auto"`` an :class:`~naiad.parallel.AutoTuner`.

A ``torch.utils.data.DistributedSampler`` given to naiad (trainers inject one: Lightning's
``use_distributed_sampler``, Accelerate's ``prepare``) is read as a description of the sharding
(its rank, number of replicas, shuffle and seed) and naiad shards by its own plan: every sample
exactly once per epoch and the same number of batches on every rank, where the sampler would
pad with repeated samples (docs/TRAINERS.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torch.utils.data.distributed import DistributedSampler

from naiad.dataset.sampling import SeededRandomSampler, ShardedBatchSampler
from naiad.errors import ConfigError
from naiad.parallel import AutoTuner
from naiad.pipeline import worker_side
from naiad.sources.base import Source
from naiad.stream.batches import StreamOptions
from naiad.stream.decode import decodes_in_reads

__all__ = ["ResolvedArguments", "WorkerMode", "resolve_arguments"]

WorkerMode = Literal["process", "thread"]


@dataclass
class ResolvedArguments:
    """What the loader passes on to torch, and what naiad keeps for itself."""

    torch_kwargs: dict[str, Any]
    worker_mode: WorkerMode
    seed: int | None
    rank: int | None
    world_size: int | None
    stream_options: StreamOptions | None
    tuner: AutoTuner | None
    sharded: tuple[int, bool] | None  # (batch_size, drop_last) a ShardedBatchSampler hides from torch


def resolve_arguments(
    dataset: Any,
    *,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    num_workers: int | str,
    collate_fn: Callable[[Any], Any] | None,
    drop_last: bool,
    generator: torch.Generator | None,
    prefetch_factor: int | None,
    persistent_workers: bool,
    worker_mode: WorkerMode | None,
    seed: int | None,
    device_prefetch: int,
    shuffle_buffer: int | None,
    rank: int | None,
    world_size: int | None,
    max_worker_restarts: int = 0,
    transform: Any = None,
) -> ResolvedArguments:
    """Check naiad's arguments and turn them into torch's; raises ConfigError naming the fix."""
    source = dataset if isinstance(dataset, Source) else None
    iterable = isinstance(dataset, IterableDataset)
    if worker_mode is None:
        # A stream's reads mostly release the GIL (files, PyArrow's parsers): threads serve them.
        # Small images decoded in the reads do not (NOTE [ Small samples decode in the reads ]).
        small = worker_side(transform) and decodes_in_reads(transform)
        worker_mode = "thread" if source is not None and not small else "process"
    if worker_mode not in ("process", "thread"):
        raise ConfigError(f"`worker_mode` must be 'process' or 'thread', got {worker_mode!r}.")
    if seed is not None and not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"`seed` must be an int, got {type(seed).__name__}.")
    if isinstance(max_worker_restarts, bool) or not isinstance(max_worker_restarts, (int, np.integer)) or max_worker_restarts < 0:
        raise ConfigError(f"`max_worker_restarts` must be an int >= 0, got {max_worker_restarts!r}.")
    if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or device_prefetch < 1:
        raise ConfigError(f"`device_prefetch` must be an int >= 1, got {device_prefetch!r}.")
    if isinstance(sampler, DistributedSampler) and batch_sampler is None and not iterable:
        shuffle, seed, rank, world_size = _adopt_distributed_sampler(sampler, seed, rank, world_size)
        sampler = None
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
        )  # the transform runs in the pass, as for every pipeline
        shuffle = None  # the stream shuffles; torch's sampler stays sequential and unused
    else:
        if shuffle_buffer is not None:
            raise ConfigError(
                "`shuffle_buffer` applies to streaming sources (naiad.read_csv and friends); "
                f"a map-style dataset is shuffled as a whole, got shuffle_buffer={shuffle_buffer!r}."
            )
        if (rank is None) != (world_size is None):
            raise ConfigError(f"give both `rank` and `world_size` or neither, got rank={rank!r}, world_size={world_size!r}.")
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
            raise ConfigError("`seed` and `generator` both choose the shuffle order; pass one of them.")
        sampler = SeededRandomSampler(dataset, int(seed))
        shuffle = False
    sharded: tuple[int, bool] | None = None
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
        sharded = (batch_size, drop_last)
        batch_size, sampler, drop_last = 1, None, False
    if iterable and worker_mode == "thread" and isinstance(num_workers, int) and num_workers > 0:
        raise ConfigError(
            "`worker_mode='thread'` does not support an IterableDataset: "
            "torch.utils.data.get_worker_info() cannot tell threads apart, so every thread "
            "would read the whole dataset. Use worker_mode='process'."
        )
    torch_kwargs = {
        "batch_size": batch_size, "shuffle": shuffle, "sampler": sampler, "batch_sampler": batch_sampler,
        "num_workers": num_workers, "drop_last": drop_last, "prefetch_factor": prefetch_factor,
        "persistent_workers": persistent_workers,
    }
    return ResolvedArguments(
        torch_kwargs, worker_mode, None if seed is None else int(seed), rank, world_size, stream_options, tuner,
        sharded,
    )


def _adopt_distributed_sampler(
    sampler: DistributedSampler, seed: int | None, rank: int | None, world_size: int | None,
) -> tuple[bool, int | None, int, int]:
    """(shuffle, seed, rank, world_size) from a DistributedSampler: naiad shards by its own plan."""
    if rank is not None and (rank, world_size) != (sampler.rank, sampler.num_replicas):
        raise ConfigError(
            f"`rank`/`world_size` ({rank}, {world_size}) disagree with the DistributedSampler given "
            f"(rank {sampler.rank} of {sampler.num_replicas}); pass one of them."
        )
    shuffle = bool(sampler.shuffle)
    if shuffle and seed is None:
        seed = int(sampler.seed)  # every rank's sampler has the same seed: the same order
    return shuffle, seed, int(sampler.rank), int(sampler.num_replicas)
