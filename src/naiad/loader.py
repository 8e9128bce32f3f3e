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

import copy
import dataclasses
import os
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, Sampler

from naiad.arguments import (
    LoaderOptions,
    OptionAttributes,
    ResolvedArguments,
    TorchArguments,
    WorkerMode,
    resolve_arguments,
)
from naiad.checkpoint import (
    PassRecord,
    build_state,
    check_pending,
    pass_position,
    read_state,
    refuse_pending,
    resumed_seed,
)
from naiad.dataset.fetch import choose_fetch
from naiad.dataset.iterable import IterablePipeline
from naiad.dataset.pipeline import MapPipeline
from naiad.dataset.sampling import SeededRandomSampler
from naiad.device.prefetch import DevicePrefetcher
from naiad.epoch import EpochIterator, PassProgress, pin_memory_enabled
from naiad.parallel import AutoTuner, RestartBudget, slots
from naiad.pipeline import LazyPass, Pipeline, PipelinePass
from naiad.pools import Pools, PoolSettings
from naiad.stream.batches import StreamCounters
from naiad.stream.pipeline import StreamPipeline
from naiad.telemetry import LoaderStats, Telemetry
from naiad.trainers import AccelerateHooks
from naiad.transforms import Compose, TransformLike, place, split

__all__ = ["DataLoader"]

T_co = TypeVar("T_co", covariant=True)


class DataLoader(AccelerateHooks, OptionAttributes, TorchDataLoader[T_co]):
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
        prefetch_factor, persistent_workers, pin_memory_device, in_order: as in torch; with
            process workers and batches quicker than a millisecond, ``prefetch_factor`` counts
            bundles of up to 8 batches (NOTE [ Task bundles ] in :mod:`naiad.parallel.passes`).
        seed: with ``shuffle=True``, shuffle by ``(seed, epoch)`` instead of torch's global
            random generator: reproducible, and the same whatever ``num_workers`` is. The epoch
            advances with each pass, or is named by :meth:`set_epoch`. Also seeds the workers.
        worker_mode: ``"process"`` or ``"thread"`` for work that releases the GIL (NumPy,
            PyArrow, torch ops). Default: processes (torch's behaviour) for datasets, threads for
            streaming sources, whose parsing is PyArrow's and releases the GIL (and results then
            need no copy through shared memory), but processes for a stream whose small images
            decode in its reads (NOTE [ Small samples decode in the reads ]) or whose decode
            holds the GIL (``naiad.decode_video``: NOTE [ Decode stage in the worker processes ]).
        read_ahead: for a streaming source left at ``num_workers=0``: threads that read and
            parse its blocks ahead of the training loop, in this process (they run no user
            code). None: two on a machine with two or more cores, none on one
            (:func:`naiad.stream.pipeline.default_read_ahead`); 0 reads between batches, on PyArrow's own threads.
        max_worker_restarts: process workers that may die (SIGKILL, the OOM killer, a segfault)
            and be replaced over the loader's life, the batches unchanged (docs/WORKERS.md,
            "Restarts"); 0: a dead worker is a :class:`~naiad.WorkerError`.

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
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
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
        transform: TransformLike = None,
        read_ahead: int | None = None,
        max_worker_restarts: int = 0,
    ) -> None:
        given = TorchArguments(
            batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, collate_fn=collate_fn, drop_last=drop_last, generator=generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
        )
        options = LoaderOptions(
            seed=seed, worker_mode=worker_mode, device=device, device_prefetch=device_prefetch, transform=transform,
            shuffle_buffer=shuffle_buffer, rank=rank, world_size=world_size, read_ahead=read_ahead,
            max_worker_restarts=max_worker_restarts,
        )
        args = resolve_arguments(dataset, given, options)
        # By keyword: a subclass or a trainer that re-instantiates the loader from its
        # attributes must not depend on the order of torch's positional parameters.
        super().__init__(
            dataset,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            **args.torch_kwargs,
        )
        if args.sharded is not None:
            # torch clears batch_size when a batch_sampler is given; the rank's batches are still
            # of this size (the last few a row smaller), so keep it visible.
            object.__setattr__(self, "batch_size", args.sharded[0])
            object.__setattr__(self, "drop_last", args.sharded[1])
        self.options = args.options
        self._tuner = args.tuner
        self._stream_counters = StreamCounters()
        self._pipeline = self._make_pipeline(dataset, args, collate_fn)
        for sampler in self._seeded_samplers():
            sampler.listener = weakref.WeakMethod(self._on_set_epoch)
        self._epoch = 0
        self._restarts = RestartBudget(self.options.max_worker_restarts)  # shared by the loader's pools
        self._pools = self._make_pools()
        self._telemetry = Telemetry()
        self._current: weakref.ReferenceType[Any] | None = None  # the pass in progress
        self._current_inner: weakref.ReferenceType[EpochIterator] | None = None
        self._last_pass: PassRecord | None = None
        self._pending: LazyPass | None = None  # the last pass begun, until it makes its plan
        self._resume: dict[str, Any] | None = None
        self._handoff: list[dict[str, Any] | None] | None = None  # the last pass's (see __iter__)

    def _make_pipeline(self, dataset: Any, args: ResolvedArguments, collate_fn: Callable[[Any], Any] | None) -> Pipeline:
        """The pipeline for the data (NOTE [ Pipeline seam ]); ``collate_fn`` as given (None: the
        default, which a map-style dataset may be gathered under)."""
        # NOTE [ Transform placement ], NOTE [ Transform lists ]: the part placed outside the loop
        # goes to the pipeline, the rest runs in the loop.
        head, self._loop_transform = split(self.options.transform)
        if args.stream_options is not None:
            placed = place(head if head is not None else self._loop_transform, "stream")
            # A transform may do its heavy part in the reads by wrapping the source (naiad.tokenize).
            source = placed.wrap(dataset) if placed.wrap is not None else dataset
            return StreamPipeline(source, args.stream_options, self._stream_counters, self.options.read_ahead,
                                  batch_transform=head)
        if isinstance(dataset, IterableDataset):  # no position to key a sample by: the loop applies it
            if head is not None:
                self._loop_transform = head if self._loop_transform is None else Compose([head, self._loop_transform])
            return IterablePipeline(
                dataset, self.collate_fn, self._auto_collation, self.batch_size, self.drop_last, self.num_workers,
            )
        in_workers = head
        strategy = choose_fetch(dataset, collate_fn, self._auto_collation)
        return MapPipeline(
            dataset, self.collate_fn, self._auto_collation, strategy, self.batch_sampler, self.sampler,
            0 if self.options.rank is None else int(self.options.rank), batch_transform=in_workers,
        )

    def _make_pools(self) -> Pools:
        # The pools ask the loader for its settings weakly: a bound method would make a cycle,
        # and persistent workers would outlive their loader until the cyclic collector ran.
        settings = weakref.WeakMethod(self._pool_settings)
        return Pools(lambda: settings()(), self._pipeline, getattr(self._pipeline, "dataset", self.dataset),  # type: ignore[misc]
                     self._tuner, self._restarts)

    def _pool_settings(self) -> PoolSettings:
        """The worker arguments a pass's pool is made with, as the loader has them now."""
        return PoolSettings(
            num_workers=self.num_workers, persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor, worker_mode=self.worker_mode,
            multiprocessing_context=self.multiprocessing_context, timeout=self.timeout,
            worker_init_fn=self.worker_init_fn, generator=self.generator, seed=self.seed,
            rank=0 if self.options.rank is None else int(self.options.rank),
        )

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline this loader drives (NOTE [ Pipeline seam ])."""
        return self._pipeline

    # ----------------------------------------------------------------------------------------

    @property
    def fetch_strategy(self) -> str:
        """How batches are built: "gather", "getitems", "items" (map-style), "iterable" or "stream"."""
        return self._pipeline.strategy

    def __len__(self) -> int:
        if self._pipeline.warns_past_length:  # torch records it, and warns if a pass yields more
            self._IterableDataset_len_called = len(self.dataset)  # type: ignore[assignment, arg-type]
        return self._pipeline.num_batches()

    def stats(self) -> LoaderStats:
        """What the loader did since it was made: batches, rows, the training loop's wait for data
        (total, per step, percentiles), and the time spent in each stage.

        ``fetch`` is dataset access and collation (in workers when there are any), ``read`` the
        reading and parsing of a streaming source's blocks, ``transfer`` the copy to ``device``.
        Rows skipped by ``on_bad_rows="skip"`` are in ``bad_rows`` (per file),
        ``bad_row_reasons`` and ``bad_row_ledger`` (each skipped row: file, line or row, column,
        reason), which a state dict carries over a resume.
        """
        inner = self._current_inner() if self._current_inner is not None else None
        if inner is not None:
            inner.flush_stage()
        ledger = self._stream_counters.ledger
        return dataclasses.replace(
            self._telemetry.stats(), workers=self.workers_info(), bad_rows=self.bad_rows,
            bad_row_reasons=ledger.by_reason(), bad_row_ledger=[dict(e) for e in ledger.entries],
        )

    def workers_info(self) -> dict[str, Any]:
        """How many workers run and why (the user's setting, or what ``"auto"`` chose),
        ``restarts``, ``max_restarts``, ``restart_log`` (:meth:`RestartBudget.stats`), and
        ``batch_slots``: the shared memory the process workers' batches cross through, mapped
        in this process for every loader's live workers (``slots``, ``bytes``; NOTE [ Batch
        transport ])."""
        if self._tuner is not None:
            return {"setting": "auto", **self._tuner.stats(), **self._restarts.stats(), "batch_slots": slots.memory()}
        info = {
            "setting": self.num_workers,
            "num_workers": self.num_workers,
            "mode": self.worker_mode if self.num_workers else "inline",
            "reason": "set by the user",
            **self._restarts.stats(),
            "batch_slots": slots.memory(),
        }
        threads = self.read_ahead_threads()
        if threads:
            info.update(self._pipeline.read_ahead_info(threads))
        return info

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
        """Make the next pass epoch ``epoch`` (its shuffle order, with ``seed``); also a pass
        already begun with ``iter()`` whose first batch has not been asked for, as trainers set
        the epoch after ``iter()`` (on the loader, or on its sampler as Lightning does)."""
        for sampler in self._seeded_samplers():
            sampler.set_epoch(epoch)
        self._on_set_epoch(int(epoch))

    def _seeded_samplers(self) -> list[SeededRandomSampler]:
        found = (self.sampler, getattr(self.batch_sampler, "sampler", None))
        return [s for s in found if isinstance(s, SeededRandomSampler)]

    def _on_set_epoch(self, epoch: int) -> None:
        pending = self._pending_pass()
        if pending is not None:
            pending.epoch = epoch
            self._epoch = epoch + 1
        else:
            self._epoch = epoch

    def _pending_pass(self) -> LazyPass | None:
        """The pass begun with ``iter()`` whose plan is not made yet (its epoch can move), while
        it is where the loader stands (also after its iterator was dropped)."""
        pending = self._pending
        if pending is None or pending.opened or self._epoch != pending.epoch + 1:
            return None
        return pending

    def __iter__(self) -> Any:
        self._check_sharded_for_accelerate(self._pipeline.sharded_by_loader, self.options.rank)
        epoch = self._epoch
        self._epoch += 1
        pool, owns_pool, base_seed, tuner = self._pools.for_pass(resumed_seed(self._resume, epoch), self._close_pass)
        progress = PassProgress(lagging=self.device is not None)
        # The pass refers to its loader weakly: the loader holds the pass (`_pending`), and a
        # cycle would keep the loader and its persistent workers alive until the cyclic
        # collector ran, not until the last reference went. A loader dropped before the pass
        # opens hands its pending resume over in __del__.
        owner = weakref.ref(self)
        pipeline = self._pipeline
        handoff: list[dict[str, Any] | None] = []
        self._handoff = handoff

        def open_pass(epoch: int) -> PipelinePass:
            loader = owner()
            if loader is not None:
                resume, loader._resume = loader._resume, None
            else:
                resume = handoff[0] if handoff else None
            if resume is not None and resume["epoch"] != epoch:
                resume = None  # set_epoch() moved on: that epoch starts afresh
            seed = resumed_seed(resume, epoch)  # the interrupted pass's, for its workers' draws
            seed = base_seed if seed is None else seed
            run = pipeline.open_pass(epoch, seed, None if resume is None else resume["pipeline"])
            progress.deliveries = run.deliveries  # which batches it delivered (NOTE [ Out-of-order delivery ])
            if loader is not None:
                loader._last_pass = PassRecord(epoch, run, progress, seed)
            return run

        pending = LazyPass(open_pass, epoch)
        self._pending = pending
        self._last_pass = None
        inner = EpochIterator(
            pending, epoch, pool, owns_pool=owns_pool, telemetry=self._telemetry, stage=self._pipeline.stage,
            prefetch=self.prefetch_factor or 2,
            transform=self._loop_transform,
            # Inline (no workers, none tuned in), batches leave in plan order whatever in_order says.
            in_order=self.in_order or (self.num_workers == 0 and tuner is None),
            pin=pin_memory_enabled(self.pin_memory), record_steps=self.device is None, tuner=tuner,
            progress=progress, reported_length=self._IterableDataset_len_called, dataset=self.dataset,
        )
        self._current_inner = weakref.ref(inner)
        outer: Any = inner
        if self.device is not None:
            outer = iter(
                DevicePrefetcher(inner, self.device, depth=self.device_prefetch, telemetry=self._telemetry,
                                 start_at_first_next=True)  # the pass takes an epoch set after iter()
            )
            outer.on_delivered = progress.receive
        self._current = weakref.ref(outer)
        return outer

    def close(self) -> None:
        """Stop the pass in progress and release the workers (persistent ones and read-ahead threads too).

        The loader stays usable: the next pass starts new workers. Called when the loader is
        garbage-collected; call it yourself to free the workers' memory and processes sooner.
        """
        self._close_pass()
        self._pools.close()

    def _close_pass(self) -> None:
        """End the pass in progress, if any: its next ``next()`` raises StopIteration."""
        outer = self._current() if self._current is not None else None
        inner = self._current_inner() if self._current_inner is not None else None
        if outer is not None and outer is not inner:
            outer.close()  # the device prefetcher first: its thread stops reading the pass
        if inner is not None:
            inner.close()

    # ----------------------------------------------------------------------------------------
    # Resumption.

    def state_dict(self, pending: int = 0) -> dict[str, Any]:
        """The loader's position as plain JSON-able data: the epoch, the batches delivered, and
        what the pipeline needs to plan the rest (its topology, legs, data fingerprint).

        Load it into a loader over the same data (:meth:`load_state_dict`) and the next pass
        continues exactly where this one stopped: the same remaining batches, in the same
        order, then the following epochs as they would have been. Loaded on another world
        size, batch size or shuffle buffer, the rest of the epoch delivers every row (index)
        not yet delivered exactly once across the new ranks (docs/CHECKPOINTING.md).

        The position is what the training loop received: taken inside the loop or after it
        left the loop with ``break`` (the pass's iterator dropped), it is the batches received
        so far; once every batch of the epoch was received, it is the next epoch's start; after
        :meth:`load_state_dict` and before the next pass, it is the state loaded. A loop that
        fetches ahead (nanoGPT's: the next batch is fetched before the step on this one ends)
        passes ``pending=k``, the batches it received and has not trained on: the state is the
        one before them, so a resume delivers them first (docs/CHECKPOINTING.md, "Loops that
        fetch ahead").

        Where the order cannot be known (a custom sampler or batch sampler, a RandomSampler
        with replacement) the state says so, and loading it starts that epoch afresh with a
        warning. An IterableDataset is resumed by count, per worker. With ``in_order=False``
        the state names the batches delivered, and on several ranks each rank's state is its
        own (docs/CHECKPOINTING.md, "Out of order").

        Raises:
            ConfigError: ``pending`` is not an int >= 0, or more than the batches the loop
                received since the pass began (or since the state loaded).
        """
        pending = check_pending(pending)
        waiting = self._pending_pass()
        epoch = waiting.epoch if waiting is not None else self._epoch
        if self._resume is not None and self._resume["epoch"] == epoch:
            refuse_pending(pending, 0, "since the state was loaded")
            return copy.deepcopy(self._resume)  # loaded, not started yet: still that position
        if waiting is not None:
            refuse_pending(pending, 0, "in the pass begun")
            return build_state(self._pipeline, None, loader_epoch=epoch, seed=self.seed)
        position = pass_position(
            self._last_pass, iterating=self._current is not None and self._current() is not None,
            loader_epoch=self._epoch, device=self.device is not None, pending=pending,
        )
        return build_state(self._pipeline, position, loader_epoch=self._epoch, seed=self.seed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass resumes mid-epoch where it stopped
        (on another topology: elastically, see :meth:`state_dict`).

        Raises:
            StateError: the state does not fit this loader; the message names the stored and
                the current value and what to change.
        """
        resume = read_state(self._pipeline, state)
        epoch = int(state["epoch"])
        self.set_epoch(epoch)
        self._last_pass = None
        self._resume = resume

    # ----------------------------------------------------------------------------------------

    def read_ahead_threads(self) -> int:
        """Threads that read a streaming source ahead of the loop while ``num_workers=0`` (the
        pass's own pool; they run no user code), else 0 (NOTE [ Pools across passes ])."""
        return self._pools.read_ahead_threads()

    # -- pickling: Lightning's ddp_spawn and copy.deepcopy send the loader, not its workers -----

    def __getstate__(self) -> dict[str, Any]:
        """The loader's recipe: its arguments, pipeline, epoch and pending resume; not its
        workers, the pass in progress or its telemetry (a copy starts with fresh ones)."""
        state = self.__dict__.copy()
        for runtime in ("_pools", "_current", "_current_inner", "_last_pass", "_pending", "_handoff"):
            state[runtime] = None
        state["_telemetry"] = None
        state["_restarts"] = RestartBudget(self.options.max_worker_restarts)  # a copy's own count
        if self._tuner is not None:
            state["_tuner"] = self._tuner.base_prefetch  # a fresh tuner measures again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        tuner_prefetch = state.get("_tuner")
        self.__dict__.update(state)  # past torch's __setattr__ guard, as unpickling does
        self.__dict__["_telemetry"] = Telemetry()
        for sampler in self._seeded_samplers():
            sampler.listener = weakref.WeakMethod(self._on_set_epoch)
        if tuner_prefetch is not None:
            self.__dict__["_tuner"] = AutoTuner(prefetch=int(tuner_prefetch))
        self.__dict__["_pools"] = self._make_pools()

    def __del__(self) -> None:
        handoff = getattr(self, "_handoff", None)
        if handoff is not None and not handoff:
            handoff.append(getattr(self, "_resume", None))  # for a pass begun and not yet opened
        pools = getattr(self, "_pools", None)
        current = getattr(self, "_current_inner", None)
        if pools is not None and (current is None or current() is None):
            # No pass uses the kept workers: stop them now. A live pass holds them, and they
            # stop when it goes (as torch's persistent workers go with their iterator).
            pools.close()
