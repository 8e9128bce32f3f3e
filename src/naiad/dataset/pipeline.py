"""The map-style pipeline: index batches from the sampler, fetched a batch at a time in workers.

The order of an epoch is known for torch's ``SequentialSampler`` and naiad's seeded shuffle
(``seed=``), alone or sharded by rank (:class:`~naiad.dataset.sampling.ShardedBatchSampler`): then a
position is a handful of integers, a resume skips the delivered batches without fetching them,
and a state saved on another world size or batch size resumes elastically
(NOTE [ Elastic resume ] in elastic.py). Other samplers are iterated as torch iterates them.

With ``in_order=False`` batches leave as they complete, so a pass records which plan batches it
delivered: the contiguous prefix and the runs beyond it (NOTE [ Out-of-order delivery ] in
delivered.py). A state then holds those runs, and its rank: on more than one rank, each rank's
deliveries are its own, so each rank resumes from its own state, with the same topology.

NOTE [ Dataset fingerprint ]
A map-style state names its dataset by its length alone, which is all a plain ``Dataset`` says
of itself. A dataset whose order or contents depend on more (a mixture's seed, weights and
sources: naiad.mix) says so with a method on its class, ``state_fingerprint() -> dict`` of JSON
values; the state stores it under ``"dataset"`` and a resume compares it key by key
(:func:`~naiad.pipeline.check_fields`), so a state saved over other data is a StateError naming
both values, not a run that trains on other windows than it thinks. A state with a fingerprint
loaded over a dataset without one (or the reverse) is refused the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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
from naiad.order.delivered import BatchRuns, DeliveryLog
from naiad.order.elastic import (
    Leftovers,
    Leg,
    Segments,
    epoch_sequence,
    iter_legs,
    no_buffer,
    rank_share,
    state_int,
)
from naiad.parallel import HandlerFactory, WorkerPool
from naiad.pipeline import ReadsNothingAhead, check_fields

__all__ = ["MapPipeline"]

MAX_RUNS = 1 << 16
"""The most runs of batches delivered beyond the prefix a stored leg may hold (in practice the
tasks that were in flight, plus one)."""


@dataclass(frozen=True)
class StoredLeg:
    """A leg of a map-style state: its topology and count (``leg.batches``: the prefix of plan
    batches delivered) and the runs of batches delivered beyond that prefix (``in_order=False``)."""

    leg: Leg
    beyond: tuple[tuple[int, int], ...] = ()

    def delivered(self) -> BatchRuns:
        """The batches its rank delivered."""
        return BatchRuns.of(self.leg.batches, self.beyond)

    def as_dict(self) -> dict[str, Any]:
        out = self.leg.as_dict()
        if self.beyond:
            out["beyond"] = [list(r) for r in self.beyond]
        return out

    def leftovers(self) -> Leftovers:
        """What its rank delivered, as :data:`~naiad.order.elastic.Leftovers`: the offsets of the
        batches it skipped over (still owed) and the offsets up to its last delivered batch."""
        if not self.beyond:
            return no_buffer
        runs = self.delivered()

        def leftovers(rank: int, share: Segments, sizes: np.ndarray, delivered: int) -> tuple[np.ndarray, int]:
            last = self.beyond[-1][1]
            if last > len(sizes):
                raise StateError(f"loader state beyond: stored a run up to batch {last}, its plan has {len(sizes)}.")
            ends = np.cumsum(sizes)
            missing = np.fromiter(runs.missing(self.leg.batches, last), np.int64)
            lengths = sizes[missing]
            ramp = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            return np.repeat(ends[missing] - lengths, lengths) + ramp, int(ends[last - 1])

        return leftovers


def read_beyond(data: Any, prefix: int, what: str) -> tuple[tuple[int, int], ...]:
    """Runs ``[[a, b], ...]`` of batches delivered beyond a prefix of ``prefix`` batches, read
    strictly: ascending, apart, after the prefix (its batch ``prefix`` was not delivered)."""
    if not isinstance(data, list) or len(data) > MAX_RUNS:
        shown = f"a list of {len(data)} runs" if isinstance(data, list) else f"{data!r:.80}"
        raise StateError(f"{what}: stored {shown}, expected a list of at most {MAX_RUNS} [start, stop] runs.")
    runs: list[tuple[int, int]] = []
    after = prefix
    for item in data:
        if not isinstance(item, list) or len(item) != 2:
            raise StateError(f"{what}: stored a run {item!r:.80}, expected [start, stop].")
        a = state_int(item[0], f"{what} run start", after + 1)
        b = state_int(item[1], f"{what} run stop", a + 1)
        runs.append((a, b))
        after = b
    return tuple(runs)


@dataclass(frozen=True)
class StoredPart:
    """A map-style state's pipeline part, read strictly (the fields that say where it stands)."""

    legs: list[StoredLeg]
    saved: StoredLeg
    rank: int | None  # set when the state holds one rank's deliveries (`in_order=False`)

    @classmethod
    def read(cls, part: Mapping[str, Any]) -> StoredPart:
        legs: list[StoredLeg] = []
        raw = part.get("legs", [])
        for i, leg in enumerate(iter_legs(raw)):
            beyond = read_beyond(raw[i]["beyond"], leg.batches, f"loader state legs[{i}] beyond") if "beyond" in raw[i] else ()
            if beyond and leg.world_size != 1:
                raise StateError(f"loader state legs[{i}]: stored world_size {leg.world_size} with runs beyond its "
                                 "prefix, which only a leg of one rank can have.")
            legs.append(StoredLeg(leg, beyond))
        saved = Leg.from_dict(part)
        beyond = read_beyond(part["beyond"], saved.batches, "loader state beyond") if "beyond" in part else ()
        rank: int | None = None
        if "in_order" in part:
            if part["in_order"] is not False:
                raise StateError(f"loader state in_order: stored {part['in_order']!r:.80}, expected false (or no key).")
            rank = state_int(part.get("rank"), "loader state rank", 0, saved.world_size - 1)
        elif beyond and saved.world_size != 1:
            raise StateError("loader state beyond: stored runs beyond the prefix on more than one rank without the "
                             "rank they belong to (in_order, rank).")
        return cls(legs, StoredLeg(saved, beyond), rank)

    def sequence(self, length: int) -> Segments:
        """The positions of the epoch left to the saved leg (after the finished legs)."""
        return epoch_sequence(length, [x.leg for x in self.legs], lambda i: self.legs[i].leftovers())


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
        batch_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.batch_transform = batch_transform  # applied in the workers (NOTE [ Decode in the workers ])
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.strategy = strategy
        self.batch_sampler = batch_sampler
        self.sampler = sampler
        self.rank = rank

    def handler_factory(self) -> HandlerFactory:
        return functools.partial(map_handler_factory, self.dataset, self.collate_fn, self.auto_collation, self.strategy,
                                 transform=self.batch_transform)

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

    def dataset_fingerprint(self) -> dict[str, Any] | None:
        """The dataset's ``state_fingerprint()``, when its class defines one (NOTE [ Dataset
        fingerprint ]); None otherwise."""
        if not callable(getattr(type(self.dataset), "state_fingerprint", None)):
            return None
        fingerprint: dict[str, Any] = self.dataset.state_fingerprint()
        return fingerprint

    def fields(self) -> dict[str, Any]:
        """What a state of this loader must match: the order's seed, the dataset's length and,
        where it has one, its fingerprint."""
        fingerprint = self.dataset_fingerprint()
        return {"seed": self.order_seed(), "length": len(self.dataset),
                **({"dataset": fingerprint} if fingerprint is not None else {})}

    def plan_rank(self) -> int:
        """The rank this loader's plan is for (0 unless sharded with `rank=`)."""
        bs = self.batch_sampler
        return bs.rank if type(bs) is ShardedBatchSampler else 0

    # -- passes -------------------------------------------------------------------------------

    def start_state(self, epoch: int) -> dict[str, Any]:
        leg = self._leg()
        assert leg is not None  # the loader asks only when resumable
        return {**self.fields(), **leg.as_dict(), "legs": []}

    def check_state(self, part: Mapping[str, Any], epoch: int) -> None:
        if not isinstance(part, Mapping):
            raise StateError(f"map-style state: expected a dict, got {part!r:.200}.")
        # The dataset's fingerprint first: where it differs, it says why the length differs too.
        self._check_fingerprint(part.get("dataset"))
        check_fields(part, {"seed": self.order_seed(), "length": len(self.dataset)}, "loader state",
                     "a resume needs the same dataset length and seed; make the loader as it was.")
        stored = StoredPart.read(part)
        saved = stored.saved.leg
        total = len(stored.sequence(len(self.dataset)))
        _, sizes = rank_share(Segments([(0, total)]), saved, 0)
        if saved.batches > len(sizes):
            raise StateError(f"loader state batches_yielded: stored {saved.batches}, its plan has {len(sizes)}.")
        if stored.saved.beyond and stored.saved.beyond[-1][1] > len(sizes):
            raise StateError(f"loader state beyond: stored a run up to batch {stored.saved.beyond[-1][1]}, its plan "
                             f"has {len(sizes)}.")
        drawn = type(self._order_sampler()) is torch.utils.data.RandomSampler
        order = part.get("order")
        if order is not None:
            if not drawn:
                raise StateError("loader state order: stored a recorded shuffle (torch's shuffle without `seed=`), "
                                 "current none (no shuffle); make the loader with shuffle=True and no `seed=`, as it was.")
            check_recipe(order)  # the resume draws from it: refused here, not at the first batch
        elif drawn and (saved.batches or stored.legs or stored.saved.beyond):
            raise StateError("loader state order: stored none, but a shuffle without `seed=` needs the recorded draw.")
        self._check_rank(stored)

    def _check_fingerprint(self, stored: Any) -> None:
        """NOTE [ Dataset fingerprint ]: the stored one, key by key, against the dataset's."""
        current = self.dataset_fingerprint()
        if current is None and stored is None:
            return
        if current is None or not isinstance(stored, Mapping):
            theirs = "none" if current is None else f"a {current.get('of', type(self.dataset).__name__)} dataset"
            raise StateError(f"loader state dataset: stored {stored!r:.200}, current {theirs}; the state was saved "
                             "over another dataset: load it into a loader over the dataset it was saved from.")
        check_fields(stored, current, "loader state dataset",
                     f"the state was saved over other data: make the dataset ({current.get('of', 'it')}) as it was "
                     "when the state was saved, or start a new run.")

    def _check_rank(self, stored: StoredPart) -> None:
        """A state of one rank's deliveries (``in_order=False`` on more than one rank) resumes
        that rank with the same topology; anything else would lose or repeat batches."""
        saved = stored.saved.leg
        if stored.rank is None or saved.world_size == 1:
            return
        current = self._leg()
        if current is not None and not saved.same_topology(current):
            raise StateError(
                f"loader state in_order: stored false on {saved.world_size} ranks (batch_size "
                f"{saved.batch_size}, drop_last {saved.drop_last}), current world_size {current.world_size}, "
                f"batch_size {current.batch_size}, drop_last {current.drop_last}; a state saved with "
                f"in_order=False holds only its own rank's deliveries, so another topology cannot tell what "
                "the other ranks delivered. Resume with the saved world_size, batch_size and drop_last (each "
                "rank loading its own state), or save with in_order=True for an elastic resume."
            )
        if stored.rank != self.plan_rank():
            raise StateError(
                f"loader state rank: stored {stored.rank}, current {self.plan_rank()}; a state saved with "
                "in_order=False on several ranks holds one rank's deliveries: load each rank's own "
                "state_dict() (or save with in_order=True, whose state every rank can load)."
            )

    def open_pass(self, epoch: int, base_seed: int, resume: Mapping[str, Any] | None) -> MapPass:
        current = self._leg()
        stored = StoredPart.read(resume) if resume is not None and current is not None else None
        if stored is None or current is None or (not stored.legs and not stored.saved.beyond
                                                 and stored.saved.leg.batches == 0
                                                 and stored.saved.leg.same_topology(current)):
            # torch's own path: the sampler draws its order where torch's iterator would.
            plan = plan_batches(self.batch_sampler, self.sampler, self.auto_collation)
            return MapPass(enumerate(plan), len(self.batch_sampler) if self.auto_collation else len(self.sampler),
                           self, epoch, base_seed, [], current, plan.recipe, BatchRuns(), stored is not None
                           and stored.rank is not None)
        assert resume is not None and current is not None
        legs = stored.legs
        # One rank's deliveries stay that rank's while its leg goes on; a new leg (elastic) is
        # planned alike on every new rank from the finished one, so it starts in step again.
        per_rank = stored.rank is not None
        if stored.saved.leg.same_topology(current):
            delivered = stored.saved.delivered()
        else:  # elastic: a new leg over the indices no old rank delivered
            legs, delivered, per_rank = [*legs, stored.saved], BatchRuns(), False
        order = epoch_order(self._order_sampler(), epoch, resume.get("order"))
        sequence = StoredPart(legs, stored.saved, None).sequence(len(self.dataset))
        share, sizes = rank_share(sequence, current, self.plan_rank())
        indices = order[share.to_array()]
        ends = np.cumsum(sizes)
        auto_collation = self.auto_collation

        def task(j: int) -> tuple[int, Any]:
            batch = indices[ends[j] - sizes[j] : ends[j]]
            return j, (batch if auto_collation else int(batch[0]))

        tasks = (task(j) for j in delivered.missing(0, len(sizes)))  # the batches not delivered, in plan order
        return MapPass(tasks, len(sizes), self, epoch, base_seed, legs, current, resume.get("order"), delivered,
                       per_rank)


class MapPass:
    """One pass over a map-style dataset: its index batches as tasks ``(plan batch, indices)``,
    fetched by the pool; with a known order, it records the plan batches it delivered."""

    def __init__(
        self, tasks: Iterator[tuple[int, Any]], total: int, pipeline: MapPipeline, epoch: int,
        base_seed: int, legs: Sequence[StoredLeg], leg: Leg | None, order: dict[str, Any] | None,
        delivered: BatchRuns, per_rank: bool,
    ) -> None:
        self.tasks = tasks
        self.start = len(delivered)  # batches of the leg delivered before this pass
        self.total = total
        self.pipeline = pipeline
        self.epoch = epoch
        self.base_seed = base_seed
        self.legs = list(legs)
        self.leg = leg
        self.order = order  # how a random order was drawn (torch's shuffle without seed=)
        self.deliveries: DeliveryLog[BatchRuns] | None = DeliveryLog(delivered) if leg is not None else None
        self.per_rank = per_rank  # delivered out of plan order (now or before a resume): one rank's state
        # In plan order after a contiguous prefix, the count says which batches were delivered.
        self._counted = delivered.prefix == self.start

    def batches(self, pool: WorkerPool, *, prefetch: int, in_order: bool) -> Iterator[Any]:
        # Gathering runs no user code, so only the other strategies pay for per-task seeding.
        task_seed = None if self.pipeline.strategy == "gather" else self._task_seed
        log = self.deliveries
        self._counted = self._counted and in_order
        if self._counted:
            log = None
        if not in_order:
            self.per_rank = True

        def delivered(worker: int, task: tuple[int, Any]) -> None:
            # NOTE [ Out-of-order delivery ]: which plan batch leaves, told by the pool.
            log.add(task[0])  # type: ignore[union-attr]

        # Gathering draws nothing, and the other strategies' draws are keyed by task (unless a
        # worker_init_fn owns the generators: the pool then sends no bundles), so small batches
        # may travel in bundles.
        return pool.imap(self.tasks, prefetch=prefetch, in_order=in_order, epoch=self.epoch, task_seed=task_seed,
                         on_deliver=delivered if log is not None else None, bundle=True)

    def _task_seed(self, task: tuple[int, Any]) -> tuple[int, ...]:
        # NOTE [ Worker randomness ]: (seed, epoch, rank, leg, batch), whoever runs the task.
        return (self.base_seed, self.epoch, self.pipeline.plan_rank(), len(self.legs), task[0])

    def state(self, delivered: int) -> dict[str, Any]:
        assert self.leg is not None and self.deliveries is not None
        runs = BatchRuns.of(self.start + delivered, ()) if self._counted else self.deliveries.at(delivered)
        leg = Leg(self.leg.world_size, self.leg.batch_size, self.leg.drop_last, 0, runs.prefix)
        state: dict[str, Any] = {**self.pipeline.fields(), **leg.as_dict(), "legs": [x.as_dict() for x in self.legs]}
        beyond = runs.beyond()
        if beyond:
            state["beyond"] = beyond
        if self.per_rank:
            state["in_order"] = False
            state["rank"] = self.pipeline.plan_rank()
        if self.order is not None:
            state["order"] = self.order
        return state

    def __len__(self) -> int:
        return self.total - self.start
