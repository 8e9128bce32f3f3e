"""The worker pool a loader's passes run on: made for one pass, or kept across passes.

NOTE [ Pools across passes ]
A pass needs a pool of workers; which one, and whether it outlives the pass, is one of four
regimes, chosen at each ``iter()``:

* **per pass** (the default, as torch's workers): a new pool, owned and closed by its pass;
* **persistent** (``persistent_workers=True`` with workers): one pool kept across passes; a new
  ``iter()`` ends the pass before (docs/WORKERS.md, "Two passes at once": torch keeps one iterator per
  loader and resets it), and the pass owns nothing;
* **tuned** (``num_workers="auto"``): one pool kept across passes, so the tuner keeps what it
  learnt; its passes stay independent, as torch's iterators without persistent workers are,
  and share the pool (NOTE [ Passes sharing a pool ] in parallel/pool.py);
* **read-ahead** (a streaming source at ``num_workers=0``): threads that run no user code and
  hold no pass's state, kept across passes so that a short epoch does not pay for starting and
  joining them, each pass with its read-ahead tuner.

A kept pool's workers draw with the base seed they started with; a resumed pass draws with the
interrupted pass's (a decode's random crops are keyed by it), so kept workers of another seed
start again. torch draws the base seed once per iterator, or once per persistent iterator, and
so does this: the generator moves on as torch's does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch

from naiad.dataset.worker import prepare_worker
from naiad.parallel import AutoTuner, RestartBudget, WorkerPool
from naiad.pipeline import Pipeline
from naiad.process_state import ProcessLocal

__all__ = ["PassPool", "PoolSettings", "Pools"]


@dataclass(frozen=True)
class PoolSettings:
    """What a loader's pools are made with: torch's worker arguments and naiad's, as the loader
    has them when a pass begins (torch lets some be set after construction)."""

    num_workers: int
    persistent_workers: bool
    prefetch_factor: int | None
    worker_mode: Literal["process", "thread"]
    multiprocessing_context: Any
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    generator: torch.Generator | None
    seed: int | None
    rank: int


class PassPool(NamedTuple):
    """A pass's pool: the pool, whether the pass owns it (and closes it), the pass's base seed,
    and the tuner that resizes the pool during the pass, if any."""

    pool: WorkerPool
    owned: bool
    base_seed: int
    tuner: AutoTuner | None


class _KeptPool:
    """A loader's pool kept across passes, and the base seed its workers started with."""

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.seed = 0


class Pools:
    """The pools of one loader's passes (NOTE [ Pools across passes ]).

    Args:
        settings: the loader's worker arguments, asked at each pass.
        pipeline: the loader's pipeline (its handler, its read-ahead threads and tuner).
        dataset: what a worker is set up for (``prepare_worker``: torch's worker info).
        tuner: ``num_workers="auto"``'s tuner, or None.
        restarts: the worker restarts the loader's pools share.
    """

    def __init__(self, settings: Callable[[], PoolSettings], pipeline: Pipeline, dataset: Any,
                 tuner: AutoTuner | None, restarts: RestartBudget) -> None:
        self._settings = settings
        self.pipeline = pipeline
        self.dataset = dataset
        self.tuner = tuner
        self.restarts = restarts
        # This process's: a forked child has none of its parent's workers or threads.
        self._kept = ProcessLocal(_KeptPool, name="naiad loader kept pool")

    @property
    def kept(self) -> WorkerPool | None:
        """The pool kept across passes (persistent, tuned, read-ahead), if any, this process's
        (NOTE [ Per-process state ])."""
        return self._kept.get().pool

    @property
    def settings(self) -> PoolSettings:
        """The loader's worker arguments now."""
        return self._settings()

    @property
    def persistent(self) -> bool:
        """Whether the workers outlive a pass: asked to persist, or tuned ("auto")."""
        s = self.settings
        return (s.persistent_workers and s.num_workers > 0) or self.tuner is not None

    def for_pass(self, resumed_seed: int | None, end_pass: Callable[[], None]) -> PassPool:
        """The next pass's pool (``resumed_seed``: a pending resume's base seed; ``end_pass``
        ends the pass in progress, where a new one must end it first)."""
        s = self.settings
        ends_before = s.persistent_workers and s.num_workers > 0
        kept = self._kept.get()
        if self.persistent and kept.pool is not None:
            if resumed_seed is None or resumed_seed == kept.seed:
                if ends_before:
                    end_pass()  # docs/WORKERS.md, "Two passes at once"
                return PassPool(kept.pool, False, kept.seed, self.tuner)
            if ends_before:
                end_pass()
            self.close()  # kept workers of another seed start again
        base_seed = self._base_seed() if resumed_seed is None else self._drawn(resumed_seed)
        threads = self.read_ahead_threads()
        if threads:
            return self._read_ahead(base_seed, threads)
        if kept.pool is not None and not self.persistent:
            # Read-ahead threads of an earlier pass, no longer wanted (the rows turned out to
            # fit in the shuffle buffer, or all but one read group of them).
            self.close()
        pool = self._make(base_seed)
        if self.persistent:
            kept.pool, kept.seed = pool, base_seed
        return PassPool(pool, not self.persistent, base_seed, self.tuner)

    def _read_ahead(self, base_seed: int, threads: int) -> PassPool:
        ahead_tuner = self.pipeline.read_ahead_tuner(threads, self.settings.prefetch_factor or 2)
        kept = self._kept.get()
        if kept.pool is None:
            kept.pool = self._make(base_seed)
        if ahead_tuner is not None:
            stages = kept.pool.stage_seconds
            ahead_tuner.reads_cpu = lambda: stages.get("worker_cpu", 0.0)
        return PassPool(kept.pool, False, base_seed, ahead_tuner)

    def _base_seed(self) -> int:
        # torch draws one int64 from `generator` (or the global generator) per iterator, before
        # the sampler's first draw; drawing it the same way keeps shuffles identical to torch's.
        s = self.settings
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=s.generator).item())
        return drawn if s.seed is None else s.seed

    def _drawn(self, resumed_seed: int) -> int:
        """A resumed pass's base seed, the generator moved on as a fresh pass's would."""
        self._base_seed()
        return resumed_seed

    def read_ahead_threads(self) -> int:
        """Threads that read a streaming source ahead of the loop while ``num_workers=0`` (the
        pass's own pool; they run no user code), else 0. The stream pipeline decides how many
        (:meth:`naiad.stream.pipeline.StreamPipeline.read_ahead_threads`); other pipelines read
        nothing ahead."""
        if self.settings.num_workers or self.tuner is not None:
            return 0
        return self.pipeline.read_ahead_threads()

    def _make(self, base_seed: int) -> WorkerPool:
        s, tuner = self.settings, self.tuner
        workers = s.num_workers if tuner is None else tuner.decision.num_workers
        threads = self.read_ahead_threads()
        # The default read-ahead starts where its tuner stands (all its threads, or inline).
        ahead_tuner = self.pipeline.read_ahead_tuner(threads, s.prefetch_factor or 2) if threads else None
        read_ahead = ahead_tuner.decision.num_workers if ahead_tuner is not None else threads
        return WorkerPool(
            self.pipeline.handler_factory(),
            num_workers=read_ahead or workers,
            mode="thread" if threads else s.worker_mode,
            multiprocessing_context=s.multiprocessing_context,
            timeout_s=s.timeout or None,
            worker_init_fn=s.worker_init_fn if s.num_workers > 0 or tuner is not None else None,
            base_seed=base_seed,
            describe=self.pipeline.describe_task,
            rank=s.rank,
            init_inline=tuner is None,  # with "auto", only real workers run worker_init_fn
            prepare=functools.partial(prepare_worker, self.dataset),
            restarts=self.restarts,
        )

    def close(self) -> None:
        """Close the kept pool, if any (the next pass starts new workers)."""
        kept = self._kept.get()
        if kept.pool is not None:
            kept.pool.close()
            kept.pool = None
