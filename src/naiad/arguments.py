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

import dataclasses
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
from naiad.sources.base import Source
from naiad.stream.batches import StreamOptions
from naiad.transforms import TransformLike, place

__all__ = ["LoaderOptions", "OptionAttributes", "ResolvedArguments", "TorchArguments", "WorkerMode", "resolve_arguments"]

WorkerMode = Literal["process", "thread"]


@dataclass(frozen=True)
class LoaderOptions:
    """naiad's own options of a DataLoader (torch's are torch's attributes).

    Attributes:
        seed: the shuffle and worker seed (None: torch's generators decide).
        worker_mode: "process" or "thread" (None before :func:`resolve_arguments`: the
            default for the data).
        device: where batches go (None: stay on the CPU).
        device_prefetch: batches copied ahead to ``device``.
        transform: called on every batch: in the training process, or by the pipeline for a
            transform placed outside the loop (:func:`naiad.transforms.place`, NOTE [ Transform
            placement ]). One whose placement has a ``wrap`` (:func:`naiad.tokenize`) also wraps
            a streaming source, so that its heavy part runs where the source is read, in the workers.
            A list runs its members in order, its leading worker-side ones together in the
            workers (NOTE [ Transform lists ]).
        shuffle_buffer: a streaming source's shuffle buffer, in rows (None: the default).
        rank: the rank a map-style dataset is sharded for (None: not sharded).
        world_size: the number of ranks it is sharded over.
        read_ahead: threads that read a streaming source ahead when ``num_workers=0`` (None:
            the stream's default, :func:`naiad.stream.pipeline.default_read_ahead`).
        max_worker_restarts: worker restarts allowed (NOTE [ Worker restarts ]).
    """

    seed: int | None = None
    worker_mode: WorkerMode | None = "process"
    device: str | torch.device | None = None
    device_prefetch: int = 2
    transform: TransformLike = None
    shuffle_buffer: int | None = None
    rank: int | None = None
    world_size: int | None = None
    read_ahead: int | None = None
    max_worker_restarts: int = 0


class OptionAttributes:
    """naiad's options as attributes of the loader (``loader.seed``, ``loader.device``...), as
    torch's arguments are torch's attributes."""

    options: LoaderOptions

    @property
    def seed(self) -> int | None:
        """The shuffle and worker seed given (None: torch's generators decide)."""
        return self.options.seed

    @property
    def worker_mode(self) -> WorkerMode:
        """"process" or "thread"."""
        return self.options.worker_mode  # type: ignore[return-value]  # resolved at construction

    @property
    def device(self) -> str | torch.device | None:
        """Where batches are copied to (None: they stay where they are built)."""
        return self.options.device

    @property
    def device_prefetch(self) -> int:
        """Batches copied ahead to ``device``."""
        return self.options.device_prefetch

    @property
    def transform(self) -> TransformLike:
        """Called on every batch: in the training process, or where its placement puts it
        (``naiad.decode_images``, a transform declaring ``Placement("workers")``): in the workers,
        a stream's reads or its decode stage (NOTE [ Transform placement ] in transforms.py); a
        list runs its members in order (NOTE [ Transform lists ])."""
        return self.options.transform


@dataclass
class TorchArguments:
    """The arguments of torch's DataLoader that naiad reads and may adjust before torch stores
    them (the others go to torch as they are)."""

    batch_size: int | None
    shuffle: bool | None
    sampler: Any
    batch_sampler: Any
    num_workers: int | str
    collate_fn: Callable[[Any], Any] | None
    drop_last: bool
    generator: torch.Generator | None
    prefetch_factor: int | None
    persistent_workers: bool

    def for_torch(self) -> dict[str, Any]:
        """What torch's constructor is given of these (collate_fn and generator go as given)."""
        return {
            "batch_size": self.batch_size, "shuffle": self.shuffle, "sampler": self.sampler,
            "batch_sampler": self.batch_sampler, "num_workers": self.num_workers, "drop_last": self.drop_last,
            "prefetch_factor": self.prefetch_factor, "persistent_workers": self.persistent_workers,
        }


@dataclass
class ResolvedArguments:
    """What the loader passes on to torch, and what naiad keeps for itself."""

    torch_kwargs: dict[str, Any]
    options: LoaderOptions
    stream_options: StreamOptions | None
    tuner: AutoTuner | None
    sharded: tuple[int, bool] | None  # (batch_size, drop_last) a ShardedBatchSampler hides from torch


def resolve_arguments(dataset: Any, given: TorchArguments, options: LoaderOptions) -> ResolvedArguments:
    """Check naiad's arguments and turn them into torch's; raises ConfigError naming the fix.

    ``given`` is not changed: the adjusted copy goes to torch."""
    args = dataclasses.replace(given)
    options = _checked(dataset, options)
    iterable = isinstance(dataset, IterableDataset)
    if isinstance(args.sampler, DistributedSampler) and args.batch_sampler is None and not iterable:
        options = _adopt_distributed_sampler(args, options)
    stream_options = None
    if isinstance(dataset, Source):
        stream_options = _stream_options(dataset, args, options)
    else:
        _check_map_style(options)
    tuner = _auto_workers(args, iterable)
    _seeded_shuffle(dataset, args, options.seed, iterable)
    sharded = None if stream_options is not None else _shard(dataset, args, options, iterable)
    if iterable and options.worker_mode == "thread" and isinstance(args.num_workers, int) and args.num_workers > 0:
        raise ConfigError(
            "`worker_mode='thread'` does not support an IterableDataset: "
            "torch.utils.data.get_worker_info() cannot tell threads apart, so every thread "
            "would read the whole dataset. Use worker_mode='process'."
        )
    return ResolvedArguments(args.for_torch(), options, stream_options, tuner, sharded)


def _checked(dataset: Any, options: LoaderOptions) -> LoaderOptions:
    """naiad's options checked, the worker mode's default chosen for the data."""
    worker_mode = options.worker_mode
    if worker_mode is None:
        # A stream's reads mostly release the GIL (files, PyArrow's parsers): threads serve them.
        # A transform in the reads (small images: NOTE [ Small samples decode in the reads ]), or
        # one on the decode stage that holds the GIL (video clips: NOTE [ Decode stage in the
        # worker processes ]), runs Python under the GIL: processes serve it.
        placed = place(options.transform, "stream") if isinstance(dataset, Source) else None
        threads = placed is not None and placed.runs != "reads" and not placed.stage_in_processes
        worker_mode = "thread" if threads else "process"
    if worker_mode not in ("process", "thread"):
        raise ConfigError(f"`worker_mode` must be 'process' or 'thread', got {worker_mode!r}.")
    seed, restarts = options.seed, options.max_worker_restarts
    if seed is not None and not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"`seed` must be an int, got {type(seed).__name__}.")
    if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 0:
        raise ConfigError(f"`max_worker_restarts` must be an int >= 0, got {restarts!r}.")
    prefetch = options.device_prefetch
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ConfigError(f"`device_prefetch` must be an int >= 1, got {prefetch!r}.")
    ahead = options.read_ahead
    if ahead is not None and (not isinstance(ahead, int) or ahead < 0):
        raise ConfigError(f"`read_ahead` must be an int >= 0 or None, got {ahead!r}.")
    return dataclasses.replace(options, worker_mode=worker_mode, seed=None if seed is None else int(seed),
                               max_worker_restarts=int(restarts))


def _stream_options(source: Source, args: TorchArguments, options: LoaderOptions) -> StreamOptions:
    """A streaming source's options; torch's sampler stays sequential and unused (the plan orders
    the blocks)."""
    for name, given in (("sampler", args.sampler), ("batch_sampler", args.batch_sampler), ("collate_fn", args.collate_fn)):
        if given is not None:
            raise ConfigError(
                f"`{name}` does not apply to a streaming source ({type(source).__name__}): "
                "the plan orders its blocks; use `shuffle`, `seed` and `transform`."
            )
    if args.batch_size is None:
        raise ConfigError("a streaming source needs an int `batch_size`, got None.")
    stream = StreamOptions(
        batch_size=args.batch_size,
        shuffle=bool(args.shuffle),
        seed=0 if options.seed is None else options.seed,  # 0, not random: every rank must agree
        shuffle_buffer=options.shuffle_buffer,
        drop_last=args.drop_last,
        rank=options.rank,
        world_size=options.world_size,
    )  # the transform runs in the pass, as for every pipeline
    args.shuffle = None
    return stream


def _check_map_style(options: LoaderOptions) -> None:
    if options.shuffle_buffer is not None:
        raise ConfigError(
            "`shuffle_buffer` applies to streaming sources (naiad.read_csv and friends); "
            f"a map-style dataset is shuffled as a whole, got shuffle_buffer={options.shuffle_buffer!r}."
        )
    if (options.rank is None) != (options.world_size is None):
        raise ConfigError(f"give both `rank` and `world_size` or neither, got rank={options.rank!r}, "
                          f"world_size={options.world_size!r}.")


def _auto_workers(args: TorchArguments, iterable: bool) -> AutoTuner | None:
    """``num_workers="auto"`` as an AutoTuner (torch is told 0 workers: the tuner owns them)."""
    if args.num_workers != "auto":
        if isinstance(args.num_workers, str):
            raise ConfigError(f"`num_workers` must be an int >= 0 or 'auto', got {args.num_workers!r}.")
        return None
    if iterable:
        raise ConfigError(
            "`num_workers='auto'` needs a map-style dataset or a streaming source: the "
            "workers of an IterableDataset each walk their own iterator and cannot be "
            "added or removed mid-epoch. Pass an int."
        )
    tuner = AutoTuner(prefetch=args.prefetch_factor or 2)
    # torch's constructor checks these against num_workers=0; the tuner owns them now.
    args.num_workers, args.prefetch_factor, args.persistent_workers = 0, None, False
    return tuner


def _seeded_shuffle(dataset: Any, args: TorchArguments, seed: int | None, iterable: bool) -> None:
    """``shuffle=True`` with ``seed`` as a SeededRandomSampler: a pure function of (seed, epoch)."""
    if seed is None or not args.shuffle or iterable or args.sampler is not None or args.batch_sampler is not None:
        return
    if args.generator is not None:
        raise ConfigError("`seed` and `generator` both choose the shuffle order; pass one of them.")
    args.sampler = SeededRandomSampler(dataset, seed)
    args.shuffle = False


def _shard(dataset: Any, args: TorchArguments, options: LoaderOptions, iterable: bool) -> tuple[int, bool] | None:
    """``rank``/``world_size`` of a map-style dataset as a ShardedBatchSampler; the
    (batch_size, drop_last) it hides from torch, or None when not sharded."""
    rank, world_size = options.rank, options.world_size
    if rank is None or world_size is None:
        return None
    custom = args.sampler is not None and not isinstance(args.sampler, SeededRandomSampler)
    if iterable or custom or args.batch_sampler is not None:
        raise ConfigError(
            "`rank`/`world_size` shard a map-style dataset by naiad's own order; they do "
            "not combine with an IterableDataset, a custom `sampler` or a `batch_sampler`."
        )
    if args.shuffle:
        raise ConfigError(
            "`shuffle=True` with `rank`/`world_size` needs `seed=`: every rank must draw "
            "the same order (torch's global generator differs between processes)."
        )
    if args.batch_size is None:
        raise ConfigError("`rank`/`world_size` need an int `batch_size`, got None.")
    order = args.sampler if args.sampler is not None else torch.utils.data.SequentialSampler(dataset)
    args.batch_sampler = ShardedBatchSampler(order, args.batch_size, args.drop_last, int(rank), int(world_size))
    sharded = (args.batch_size, args.drop_last)
    args.batch_size, args.sampler, args.drop_last = 1, None, False
    return sharded


def _adopt_distributed_sampler(args: TorchArguments, options: LoaderOptions) -> LoaderOptions:
    """A DistributedSampler read as the sharding (rank, world size, shuffle, seed): naiad shards
    by its own plan, and the sampler goes."""
    sampler: DistributedSampler[Any] = args.sampler
    if options.rank is not None and (options.rank, options.world_size) != (sampler.rank, sampler.num_replicas):
        raise ConfigError(
            f"`rank`/`world_size` ({options.rank}, {options.world_size}) disagree with the DistributedSampler given "
            f"(rank {sampler.rank} of {sampler.num_replicas}); pass one of them."
        )
    args.shuffle, args.sampler = bool(sampler.shuffle), None
    seed = options.seed
    if args.shuffle and seed is None:
        seed = int(sampler.seed)  # every rank's sampler has the same seed: the same order
    return dataclasses.replace(options, seed=seed, rank=int(sampler.rank), world_size=int(sampler.num_replicas))
