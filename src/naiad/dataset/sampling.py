"""Index plans for map-style datasets: which indices, batch by batch, in which order.

torch's samplers hand out one Python int at a time and ``BatchSampler`` groups them in a Python
loop. For the samplers torch builds itself (``SequentialSampler``, ``RandomSampler`` without
replacement, under ``BatchSampler``) and for naiad's :class:`SeededRandomSampler`, naiad computes
the epoch's whole index array at once and slices it into batches; the indices, and the draws
from torch's random generators, are exactly those torch would make. Any other sampler is
iterated as torch iterates it.
"""

from __future__ import annotations

import base64
import binascii
import weakref
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

from naiad.errors import ConfigError, StateError
from naiad.order.elastic import state_int
from naiad.order.ranks import batch_sizes, rank_bounds

__all__ = [
    "IndexPlan",
    "SeededRandomSampler",
    "ShardedBatchSampler",
    "check_recipe",
    "epoch_permutation",
    "plan_batches",
]


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``range(n)`` for ``(seed, epoch)``: a pure function, int64."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**63, epoch])))
    return rng.permutation(n).astype(np.int64, copy=False)


class SeededRandomSampler(Sampler[int]):
    """Shuffles a map-style dataset by ``(seed, epoch)``, the same for any number of workers.

    The epoch advances each time the sampler is iterated, unless :meth:`set_epoch` names it,
    as with ``DistributedSampler``.

    Args:
        data_source: the dataset (only its length is used).
        seed: the shuffle seed.

    Example:
        >>> s = SeededRandomSampler(range(5), seed=0)
        >>> sorted(s) == list(range(5))
        True
    """

    def __init__(self, data_source: Sized, seed: int) -> None:
        self.data_source = data_source
        self.seed = int(seed)
        self.epoch = 0
        # The loader that owns this sampler hears of set_epoch() calls made on the sampler
        # itself (trainers call it on `loader.sampler`), weakly: the loader owns the sampler.
        self.listener: weakref.WeakMethod[Callable[[int], None]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order on the next iteration."""
        self.epoch = int(epoch)
        listener = self.listener() if self.listener is not None else None
        if listener is not None:
            listener(self.epoch)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "listener": None}

    def next_epoch(self) -> int:
        """The epoch the next iteration uses; the one after it is ``epoch + 1`` unless set."""
        epoch = self.epoch
        self.epoch = epoch + 1
        return epoch

    def permutation(self, epoch: int) -> np.ndarray:
        """The index order of ``epoch``."""
        return epoch_permutation(len(self.data_source), self.seed, epoch)

    def __iter__(self) -> Iterator[int]:
        yield from self.permutation(self.next_epoch()).tolist()

    def __len__(self) -> int:
        return len(self.data_source)


class ShardedBatchSampler(Sampler[list[int]]):
    """This rank's batches of a map-style dataset: every index exactly once across ranks, and the
    same number of batches on every rank (see NOTE [ Exactly once across ranks ] in plan.py).

    The epoch's order (``SeededRandomSampler`` or sequential) is the same on every rank; rank
    ``r`` takes the contiguous range ``[r*N//w, (r+1)*N//w)`` of it. Every rank yields
    ``ceil(max_rows / batch_size)`` batches: a rank with one row fewer makes its last batches a
    row smaller instead of stopping early, so DDP's collectives never wait on a finished rank,
    and, unlike ``DistributedSampler``, no sample is repeated to pad. With ``drop_last`` every
    rank yields ``min_rows // batch_size`` full batches.

    Args:
        sampler: a ``SequentialSampler`` or a :class:`SeededRandomSampler`.
        batch_size: rows per full batch.
        drop_last: keep only full batches.
        rank: this process's rank, in ``[0, world_size)``.
        world_size: the number of ranks.

    Example:
        >>> from torch.utils.data import SequentialSampler
        >>> [list(map(int, b)) for b in ShardedBatchSampler(SequentialSampler(range(7)), 2, False, 1, 2)]
        [[3, 4], [5, 6]]
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool, rank: int, world_size: int) -> None:
        if not isinstance(sampler, (SequentialSampler, SeededRandomSampler)):
            raise ConfigError(
                f"sharding by rank needs the same order on every rank: no shuffle, or `seed=`; got {type(sampler).__name__}."
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"`batch_size` must be an int >= 1 with `rank`/`world_size`, got {batch_size!r}.")
        if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"`rank` must be in [0, world_size), got rank={rank!r}, world_size={world_size!r}.")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size

    def _sizes(self, n: int) -> tuple[int, int, np.ndarray]:
        bounds = rank_bounds(n, self.world_size)
        lo, hi = int(bounds[self.rank]), int(bounds[self.rank + 1])
        sizes_all = np.diff(bounds)
        if self.drop_last:
            count = int(sizes_all.min()) // self.batch_size
            return lo, lo + count * self.batch_size, np.full(count, self.batch_size, np.int64)
        count = -(-int(sizes_all.max()) // self.batch_size)
        return lo, hi, batch_sizes(hi - lo, count, self.batch_size)

    def batches(self) -> Iterator[np.ndarray]:
        """The next epoch's batches for this rank, as int64 arrays (advances a seeded epoch)."""
        indices, _ = _sampler_indices(self.sampler)
        assert indices is not None
        lo, hi, sizes = self._sizes(len(indices))
        mine = indices[lo:hi]
        ends = np.cumsum(sizes)
        return (mine[e - s : e] for s, e in zip(sizes.tolist(), ends.tolist()))

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches():
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self._sizes(len(self.sampler))[2])


def _random_sampler_indices(sampler: RandomSampler, recipe: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """The indices ``iter(sampler)`` would yield, drawing the same random numbers in the same
    order, and the recipe that draws them again (for a resume): the seed torch drew for the
    sampler's own generator, or the state of the user's generator before the draw."""
    n = len(sampler.data_source)
    own_generator = sampler.generator is None
    if recipe is not None:  # a resume: the same draws, from a private generator
        generator = torch.Generator()
        if "seed" in recipe:
            generator.manual_seed(int(recipe["seed"]))
        else:
            state = np.frombuffer(base64.b64decode(recipe["generator_state"]), np.uint8).copy()
            generator.set_state(torch.from_numpy(state))
        own_generator = "seed" in recipe
    elif own_generator:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
        recipe = {"seed": seed}
    else:
        generator = sampler.generator
        recipe = {"generator_state": base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")}
    num_samples = sampler.num_samples
    parts = [torch.randperm(n, generator=generator) for _ in range(num_samples // n)]
    # torch always draws one more permutation for the remainder, even an empty one. Drawn from
    # the user's generator it moves that generator's state, so it is drawn too; from the
    # sampler's own throw-away generator nobody can see it, so a full randperm is saved.
    if num_samples % n or not own_generator:
        parts.append(torch.randperm(n, generator=generator)[: num_samples % n])
    return (torch.cat(parts).numpy() if len(parts) > 1 else parts[0].numpy()), recipe


# A CPU generator's state is 5,056 bytes (6,744 characters of base64) in torch 2.x: a bound well
# past it, so a hostile state's long string is refused before it is decoded.
_MAX_GENERATOR_STATE_CHARS = 1 << 16
_RECIPE_FORMS = '{"seed": an int in [0, 2**64 - 1]} or {"generator_state": a torch CPU generator\'s state in base64}'


def check_recipe(recipe: Any, what: str = "loader state order") -> None:
    """Raise a StateError unless ``recipe`` is a draw :func:`_random_sampler_indices` can make
    again: ``{"seed": int}`` (torch's own generator) or ``{"generator_state": base64}`` (a given
    generator's state, which torch itself must accept). Checked when a state is loaded, so a
    damaged or hostile one fails there, naming the field, not at the first batch.

    Example:
        >>> check_recipe({"seed": 7})
        >>> check_recipe({"seed": "7"})
        Traceback (most recent call last):
        ...
        naiad.errors.StateError: loader state order seed: stored '7', expected an int in [0, 18446744073709551615].
    """
    fix = "the state was damaged or edited: resume from another checkpoint, or start the epoch afresh."
    if not isinstance(recipe, Mapping) or len(recipe) != 1 or not ({"seed", "generator_state"} & set(recipe)):
        shown = f"a dict with the keys {sorted(map(str, recipe))[:4]!r:.120}" if isinstance(recipe, Mapping) else type(recipe).__name__
        raise StateError(f"{what}: stored {shown}, expected {_RECIPE_FORMS}; {fix}")
    if "seed" in recipe:
        state_int(recipe["seed"], f"{what} seed", 0, 2**64 - 1)  # what Generator.manual_seed takes, once each
        return
    encoded = recipe["generator_state"]
    if not isinstance(encoded, str) or len(encoded) > _MAX_GENERATOR_STATE_CHARS:
        shown = f"a string of {len(encoded):,} characters" if isinstance(encoded, str) else type(encoded).__name__
        raise StateError(f"{what} generator_state: stored {shown}, expected a torch CPU generator's state in base64; {fix}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise StateError(f"{what} generator_state: stored {encoded!r:.60}, which is not base64; {fix}") from None
    try:
        torch.Generator().set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8))
    except RuntimeError as exc:
        raise StateError(f"{what} generator_state: stored {len(raw)} bytes that torch refuses as a CPU generator's "
                         f"state ({str(exc).splitlines()[0]:.160}); {fix}") from None


class IndexPlan:
    """One epoch of index batches, as NumPy int64 arrays (fast path) or the sampler's lists.

    ``recipe`` says how a random order was drawn (see :func:`epoch_order`), for a resume.
    """

    def __init__(self, batches: Iterator[Any], recipe: dict[str, Any] | None = None) -> None:
        self.batches = batches
        self.recipe = recipe

    def __iter__(self) -> Iterator[Any]:
        return self.batches


def _slices(indices: np.ndarray, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
    n = len(indices)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield indices[start : start + batch_size]


def plan_batches(batch_sampler: Any, sampler: Any, auto_collation: bool) -> IndexPlan:
    """The index batches of one epoch, computed at once where torch's semantics allow.

    Must be called where torch's iterator would first draw from the sampler, so that random
    generators are consumed in the same order as torch's DataLoader.
    """
    if auto_collation:
        if type(batch_sampler) is ShardedBatchSampler:
            return IndexPlan(batch_sampler.batches())
        if type(batch_sampler) is BatchSampler:
            indices, recipe = _sampler_indices(batch_sampler.sampler)
            if indices is not None:
                if batch_sampler.batch_size <= 0:
                    raise ConfigError(f"`batch_size` must be >= 1, got {batch_sampler.batch_size}.")
                return IndexPlan(_slices(indices, batch_sampler.batch_size, batch_sampler.drop_last), recipe)
        return IndexPlan(iter(batch_sampler))
    indices, recipe = _sampler_indices(sampler)
    if indices is not None:
        return IndexPlan(iter(indices.tolist()), recipe)
    return IndexPlan(iter(sampler))


def _sampler_indices(sampler: Any) -> tuple[np.ndarray | None, dict[str, Any] | None]:
    kind = type(sampler)
    if kind is SequentialSampler:
        return np.arange(len(sampler.data_source), dtype=np.int64), None
    if kind is RandomSampler and not sampler.replacement:
        return _random_sampler_indices(sampler)
    if kind is SeededRandomSampler:
        return sampler.permutation(sampler.next_epoch()), None
    return None, None


def known_order(sampler: Any) -> bool:
    """Whether :func:`epoch_order` can draw ``sampler``'s order again."""
    kind = type(sampler)
    return kind in (SequentialSampler, SeededRandomSampler) or (kind is RandomSampler and not sampler.replacement)


def epoch_order(sampler: Any, epoch: int, recipe: dict[str, Any] | None) -> np.ndarray:
    """The index order of one epoch of a sampler of known order, drawn again for a resume
    (a RandomSampler from the ``recipe`` recorded when the epoch was first drawn); moves no
    generator but a SeededRandomSampler's epoch, as a fresh pass would."""
    kind = type(sampler)
    if kind is SequentialSampler:
        return np.arange(len(sampler.data_source), dtype=np.int64)
    if kind is SeededRandomSampler:
        sampler.epoch = epoch + 1  # as next_epoch() leaves it (not set_epoch: no listener)
        order: np.ndarray = sampler.permutation(epoch)
        return order
    if kind is RandomSampler and recipe is not None:
        return _random_sampler_indices(sampler, recipe)[0]
    raise StateError(f"the order of {kind.__name__} cannot be drawn again.")
