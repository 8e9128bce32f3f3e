"""The map-style pipeline: index batches from the sampler, fetched a batch at a time in workers.

The order of an epoch is known for torch's ``SequentialSampler`` and naiad's seeded shuffle
(``seed=``), alone or sharded by rank (:class:`~naiad.dataset.sampling.ShardedBatchSampler`): then a
position is a handful of integers, a resume skips the delivered batches without fetching them,
and a state saved on another world size or batch size resumes elastically
(NOTE [ Elastic resume ] in elastic.py). Other samplers are iterated as torch iterates them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler

from naiad.dataset.fetch import FetchStrategy
from naiad.dataset.sampling import (
    SeededRandomSampler,
    ShardedBatchSampler,
    check_recipe,
    epoch_order,
    known_order,
    plan_batches,
)
from naiad.dataset.worker import describe_map_task, map_handler_factory
from naiad.errors import StateError
from naiad.order.elastic import Leg, Segments, epoch_sequence, iter_legs, no_buffer, rank_share
from naiad.parallel import HandlerFactory, WorkerPool
from naiad.pipeline import ReadsNothingAhead, check_fields

__all__ = ["MapPipeline"]


class MapPipeline(ReadsNothingAhead):
    """A map-style dataset: tasks are ``(batch_number, indices)``, one fetch each."""

    kind = "map"
    stage = "fetch"
    sharded_by_loader = True
    warns_past_length = False

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
        strategy: FetchStrategy,
        batch_sampler: Any,
        sampler: Any,
        rank: int,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.strategy = strategy
        self.batch_sampler = batch_sampler
        self.sampler = sampler
        self.rank = rank

    def handler_factory(self) -> HandlerFactory:
        return functools.partial(map_handler_factory, self.dataset, self.collate_fn, self.auto_collation, self.strategy)

    def describe_task(self, task: Any) -> str:
        return describe_map_task(task)

    def num_batches(self) -> int:
        return len(self.batch_sampler) if self.auto_collation else len(self.sampler)

    # -- the order ----------------------------------------------------------------------------

    def _order_sampler(self) -> Any:
        bs = self.batch_sampler
        if type(bs) is ShardedBatchSampler:
            return bs.sampler
        if self.auto_collation and type(bs) is BatchSampler:
            return bs.sampler
        if not self.auto_collation:
            return self.sampler
        return None

    def _leg(self) -> Leg | None:
        """The topology of this loader's plan, when its order is known (else None)."""
        sampler = self._order_sampler()
        if sampler is None or not known_order(sampler):
            return None
        bs = self.batch_sampler
        if type(bs) is ShardedBatchSampler:
            return Leg(bs.world_size, bs.batch_size, bs.drop_last, 0)
        if self.auto_collation:
            return Leg(1, bs.batch_size, bs.drop_last, 0)
        return Leg(1, 1, False, 0)

    def why_not_resumable(self) -> str | None:
        if self._leg() is not None:
            return None
        sampler = self._order_sampler()
        if sampler is None:
            return f"the custom batch_sampler {type(self.batch_sampler).__name__} has no known order"
        if type(sampler) is torch.utils.data.RandomSampler:
            return "a RandomSampler with replacement draws an order naiad does not record"
        return f"the sampler {type(sampler).__name__} has no known order"

    def order_seed(self) -> int | None:
        """The seed of the epoch's order (None: sequential)."""
        sampler = self._order_sampler()
        return sampler.seed if isinstance(sampler, SeededRandomSampler) else None

    def plan_rank(self) -> int:
        """The rank this loader's plan is for (0 unless sharded with `rank=`)."""
        bs = self.batch_sampler
        return bs.rank if type(bs) is ShardedBatchSampler else 0

    # -- passes -------------------------------------------------------------------------------

    def start_state(self, epoch: int) -> dict[str, Any]:
        leg = self._leg()
        assert leg is not None  # the loader asks only when resumable
        return {"seed": self.order_seed(), "length": len(self.dataset), **leg.as_dict(), "legs": []}

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        if not isinstance(part, Mapping):
            raise StateError(f"map-style state: expected a dict, got {part!r:.200}.")
        check_fields(part, {"seed": self.order_seed(), "length": len(self.dataset)}, "loader state",
                     "a resume needs the same dataset length and seed; make the loader as it was.")
        legs = list(iter_legs(part.get("legs", [])))
        saved = Leg.from_dict(part)
        total = len(epoch_sequence(len(self.dataset), legs, lambda i: no_buffer))
        _, sizes = rank_share(Segments([(0, total)]), saved, 0)
        if saved.batches > len(sizes):
            raise StateError(f"loader state batches_yielded: stored {saved.batches}, its plan has {len(sizes)}.")
        drawn = type(self._order_sampler()) is torch.utils.data.RandomSampler
        order = part.get("order")
        if order is not None:
            if not drawn:
                raise StateError("loader state order: stored a recorded shuffle (torch's shuffle without `seed=`), "
                                 "current none (no shuffle); make the loader with shuffle=True and no `seed=`, as it was.")
            check_recipe(order)  # the resume draws from it: refused here, not at the first batch
        elif drawn and (saved.batches or legs):
            raise StateError("loader state order: stored none, but a shuffle without `seed=` needs the recorded draw.")

    def open_pass(self, epoch: int, base_seed: int, resume: Mapping[str, Any] | None) -> MapPass:
        current = self._leg()
        legs = list(iter_legs(resume.get("legs", []))) if resume is not None else []
        saved = Leg.from_dict(resume) if resume is not None else None
        if saved is None or current is None or (not legs and saved.batches == 0 and saved.same_topology(current)):
            # torch's own path: the sampler draws its order where torch's iterator would.
            plan = plan_batches(self.batch_sampler, self.sampler, self.auto_collation)
            return MapPass(enumerate(plan), 0, len(self.batch_sampler) if self.auto_collation else len(self.sampler),
                           self, epoch, base_seed, [], current, plan.recipe)
        assert resume is not None
        if saved.same_topology(current):
            start = saved.batches
        else:  # elastic: a new leg over the indices no old rank delivered
            legs, start = [*legs, saved], 0
        order = epoch_order(self._order_sampler(), epoch, resume.get("order"))
        n = len(self.dataset)
        sequence = epoch_sequence(n, legs, lambda i: no_buffer)
        share, sizes = rank_share(sequence, current, self.plan_rank())
        positions = share.to_array()
        indices = order[positions]
        ends = np.cumsum(sizes)
        batches = (indices[e - s : e] for s, e in zip(sizes.tolist(), ends.tolist()))
        if not self.auto_collation:
            batches = (int(b[0]) for b in batches)
        tasks = itertools.islice(enumerate(batches), start, None)
        return MapPass(tasks, start, len(sizes), self, epoch, base_seed, legs, current, resume.get("order"))


class MapPass:
    """One pass over a map-style dataset: its index batches as tasks, fetched by the pool."""

    def __init__(
        self, tasks: Iterator[tuple[int, Any]], start: int, total: int, pipeline: MapPipeline, epoch: int,
        base_seed: int, legs: list[Leg], leg: Leg | None, order: dict[str, Any] | None = None,
    ) -> None:
        self.tasks = tasks
        self.start = start
        self.total = total
        self.pipeline = pipeline
        self.epoch = epoch
        self.base_seed = base_seed
        self.legs = legs
        self.leg = leg
        self.order = order  # how a random order was drawn (torch's shuffle without seed=)

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        # Gathering runs no user code, so only the other strategies pay for per-task seeding.
        task_seed = None if self.pipeline.strategy == "gather" else self._task_seed
        return pool.imap(self.tasks, prefetch=prefetch, in_order=in_order, epoch=self.epoch, task_seed=task_seed)

    def _task_seed(self, task: tuple[int, Any]) -> tuple[int, ...]:
        # NOTE [ Worker randomness ]: (seed, epoch, rank, leg, batch), whoever runs the task.
        return (self.base_seed, self.epoch, self.pipeline.plan_rank(), len(self.legs), task[0])

    def state(self, delivered: int) -> dict[str, Any]:
        assert self.leg is not None
        leg = Leg(self.leg.world_size, self.leg.batch_size, self.leg.drop_last, 0, self.start + delivered)
        state = {"seed": self.pipeline.order_seed(), "length": len(self.pipeline.dataset), **leg.as_dict(),
                 "legs": [x.as_dict() for x in self.legs]}
        if self.order is not None:
            state["order"] = self.order
        return state

    def __len__(self) -> int:
        return self.total - self.start
