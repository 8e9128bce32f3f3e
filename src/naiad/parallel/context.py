"""What a worker knows about itself, and its random generators.

NOTE [ Worker randomness ]
Randomness in a worker is a pure function of ``(seed, epoch, rank, worker)``:
``numpy.random.SeedSequence([seed, epoch, rank, worker])``. ``seed`` is the pool's base seed
(the loader's ``seed``, or the int64 torch draws per iterator); ``epoch`` travels with every
task, so a persistent worker starts each epoch from fresh state even though the process lives
on. (A pass, not only a change of epoch, starts fresh: going over epoch 3 twice draws the same
numbers twice.) Two ways to use it:

* Process workers reseed Python's ``random``, NumPy's global generator and torch's default
  generator at the first task of each pass, so unmodified augmentation code (``random.random()``,
  ``np.random.rand()``, ``torch.rand()``) differs between workers, differs between epochs and
  repeats between runs. (Map-style tasks that run user code carry their own sequence,
  ``SeedSequence([seed, epoch, rank, leg, batch])``, and are reseeded per task.)
* Unless the user gave a ``worker_init_fn``: then the global generators are the user's. A
  worker starts seeded exactly as torch's (``base_seed + worker_id``; NumPy from torch's
  ``_generate_state``), ``worker_init_fn`` runs, and naiad never reseeds them after it, so the
  user's seeding stands and draws equal torch's, as in torch. :func:`worker_rng` stays keyed by
  the task or pass either way.
* :func:`worker_rng` returns a ``numpy.random.Generator`` for the calling worker and epoch. It
  is the only per-worker stream in thread workers (the global generators are shared by every
  thread of the process, the training loop's included, so naiad never reseeds them from a
  thread) and inline (``num_workers=0``, where reseeding would change the training loop's own
  random draws; torch does not reseed there either).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import numpy as np

__all__ = ["WorkerContext", "epoch_seed_sequence", "get_worker_context", "task_seed_sequence", "worker_rng"]

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class WorkerContext:
    """What a handler factory knows about the worker it runs in.

    Attributes:
        worker_id: 0 .. num_workers - 1 (0 when running inline).
        num_workers: the pool's worker count when this worker started (0 when running inline).
        seed: this worker's seed, derived from the pool's base seed and the worker id (what
            ``torch.utils.data.get_worker_info().seed`` reports).
        mode: "process", "thread" or "inline".
        base_seed: the pool's base seed, the first key of the per-epoch seed sequence.
        rank: the distributed rank (0 on one machine), the third key.
    """

    worker_id: int
    num_workers: int
    seed: int
    mode: str = "inline"
    base_seed: int = 0
    rank: int = 0

    def rng(self, *keys: int) -> np.random.Generator:
        """A NumPy generator for this worker and ``keys``, never from the clock."""
        return np.random.default_rng(np.random.SeedSequence([self.seed & _MASK64, self.worker_id, *keys]))

    def seed_sequence(self, epoch: int) -> np.random.SeedSequence:
        """``SeedSequence([base_seed, epoch, rank, worker_id])``: this worker's randomness in ``epoch``."""
        return epoch_seed_sequence(self.base_seed, epoch, self.rank, self.worker_id)


def epoch_seed_sequence(seed: int, epoch: int, rank: int, worker: int) -> np.random.SeedSequence:
    """The seed sequence of one worker in one epoch (see NOTE [ Worker randomness ])."""
    # SeedSequence takes non-negative ints only; torch's drawn base seed may be negative.
    return np.random.SeedSequence([seed & _MASK64, epoch & _MASK64, rank & _MASK64, worker & _MASK64])


def task_seed_sequence(entropy: tuple[int, ...]) -> np.random.SeedSequence:
    """The seed sequence of one task: ``SeedSequence([seed, epoch, rank, *task])``."""
    return np.random.SeedSequence([int(v) & _MASK64 for v in entropy])


def seed_globals(sequence: np.random.SeedSequence) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch's CPU generator."""
    import torch

    # Independent children, so the three generators' streams are unrelated to each other.
    py, npy, pt = (
        np.random.SeedSequence(sequence.entropy, spawn_key=(*sequence.spawn_key, i)) for i in range(3)
    )
    random.seed(int.from_bytes(py.generate_state(4, np.uint32).tobytes(), "little"))
    np.random.seed(npy.generate_state(4, np.uint32))
    # The CPU generator only: torch.manual_seed also visits every accelerator's generators,
    # which costs 0.3 ms, far more than the rest; workers never draw on a GPU.
    torch.default_generator.manual_seed(int(pt.generate_state(1, np.uint64)[0] >> 1))


# The calling thread's worker, its current epoch, and its generator for that epoch.
_local = threading.local()


def get_worker_context() -> WorkerContext | None:
    """The :class:`WorkerContext` of the calling worker, or None outside naiad's workers.

    Inline (``num_workers=0``) it answers while naiad runs the handler, with ``mode="inline"``.
    """
    return getattr(_local, "context", None)


def current_epoch() -> int | None:
    """The epoch of the task the calling worker runs, or None outside naiad's workers."""
    return getattr(_local, "epoch", None)


def report_stage(stage: str, seconds: float) -> None:
    """Count ``seconds`` of the calling thread's current task as ``stage`` (e.g. "decode"):
    the pool sends it back with the task's result, and the loader's telemetry shows the stage
    apart from the rest of the worker's time."""
    stages = getattr(_local, "stages", None)
    if stages is None:
        stages = _local.stages = {}
    stages[stage] = stages.get(stage, 0.0) + seconds


def take_stages() -> dict[str, float]:
    """The stage seconds :func:`report_stage` gathered on the calling thread since the last take."""
    stages = getattr(_local, "stages", None)
    _local.stages = None
    return stages or {}


Frame = tuple["WorkerContext | None", "int | None", "np.random.Generator | None", "tuple[int, ...] | None"]


def enter(
    context: WorkerContext | None,
    epoch: int | None,
    rng: np.random.Generator | None = None,
    *,
    fresh: bool = False,
    entropy: tuple[int, ...] | None = None,
) -> Frame:
    """Make ``context`` and ``epoch`` the calling thread's; return the previous frame.

    The thread's generator for :func:`worker_rng` is kept while context and epoch stay the
    same (and ``fresh`` is False), replaced by ``rng`` when given, and dropped otherwise.
    """
    previous: Frame = (
        getattr(_local, "context", None),
        getattr(_local, "epoch", None),
        getattr(_local, "rng", None),
        getattr(_local, "entropy", None),
    )
    if rng is not None:
        _local.rng = rng
    elif fresh or epoch != previous[1] or context is not previous[0]:
        _local.rng = None
    _local.context = context
    _local.epoch = epoch
    _local.entropy = entropy  # a task's own seed sequence (NOTE [ Worker randomness ])
    return previous


def leave(previous: Frame) -> np.random.Generator | None:
    """Restore ``previous`` (from :func:`enter`); return the generator the left frame used.

    Everything :func:`enter` set is put back, so a worker that runs another's handler inside
    its own task (a nested pool inline, a decode) goes on with its own randomness after it.
    """
    used = getattr(_local, "rng", None)
    _local.context, _local.epoch, _local.rng, _local.entropy = previous
    return used


def worker_rng() -> np.random.Generator:
    """A NumPy generator for the calling worker and the current epoch.

    Seeded by ``SeedSequence([seed, epoch, rank, worker])``: it differs between workers and
    between epochs, and repeats between runs with the same seed. Successive calls within one
    epoch return the same generator, so its draws go on rather than repeat. Works in process
    and thread workers and inline; outside naiad's workers it returns a generator seeded from
    NumPy's global generator (so ``np.random.seed`` makes it repeatable).

    Example:
        >>> import numpy as np
        >>> class Noisy(torch.utils.data.Dataset):  # doctest: +SKIP
        ...     def __getitem__(self, i):
        ...         return x[i] + naiad.worker_rng().normal(size=x.shape[1])
    """
    context = get_worker_context()
    if context is None:
        return np.random.default_rng(np.random.randint(0, 2**63, dtype=np.int64))
    rng = getattr(_local, "rng", None)
    if rng is None:
        entropy = getattr(_local, "entropy", None)
        if entropy is not None:
            rng = _local.rng = np.random.default_rng(task_seed_sequence(entropy))
        else:
            epoch = getattr(_local, "epoch", None) or 0
            rng = _local.rng = np.random.default_rng(context.seed_sequence(epoch))
    return rng
