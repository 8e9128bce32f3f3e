"""AutoTuner: choose the number of workers (and prefetch depth) from what the training loop waits.

NOTE [ Auto-tuning workers ]
The tuner watches two numbers per step: ``wait_s``, how long the training loop waited for its
batch, and ``step_s``, how long it worked on the previous one. It measures one setting for a
window of steps (after a few warm-up steps that absorb start-up and queue filling), then picks
the next setting to measure, and settles once it knows enough:

1. Inline (0 workers) first: the wait per step is then the cost ``c`` of building one batch.
   If the loop waits no more than ``target_wait_fraction`` of its time, or ``c`` is below what
   handing a batch over from a worker costs the training process anyway (``transfer_cost_s``,
   ~0.1-0.2 ms), workers cannot pay: settle on 0.
2. Otherwise jump to the predicted count ``ceil(c / step)`` (enough workers that building
   ``w`` batches overlaps ``w`` steps), clamped to ``[1, max_workers]``.
3. If the loop still waits and that count beat every smaller one by more than ``tolerance``,
   try one more (while ``max_workers`` allows); if the wait is gone, or the count did not beat
   the smaller ones (workers taking cores from the training loop), try one fewer.
4. Take the *fewest* workers whose throughput is within ``tolerance`` of the best measured
   (fewer workers cost less CPU and memory for the same speed), and measure one fewer than that
   until the count below is measured too. If the chosen setting still waits,
   try twice the prefetch depth once (it absorbs uneven batch costs) and keep it only if it
   raises throughput by more than ``tolerance``.

Every measured setting and the reason for the choice are in :meth:`AutoTuner.stats`. The
decisions depend only on the observed timings, so the logic is tested with synthetic ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from naiad.errors import ConfigError
from naiad.parallel.threads import usable_cores

__all__ = ["AutoTuner", "TunerDecision", "Trial"]


@dataclass(frozen=True)
class TunerDecision:
    """A setting the tuner asks for.

    Attributes:
        num_workers: workers to run (0: inline in the training process).
        prefetch: batches in flight per worker.
        reason: why, in words, with the measurements behind it.
        settled: False while the tuner is still measuring.
    """

    num_workers: int
    prefetch: int
    reason: str
    settled: bool


@dataclass
class Trial:
    """What one measured setting gave: totals over its window."""

    num_workers: int
    prefetch: int
    steps: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0

    @property
    def seconds(self) -> float:
        """Wall time of the window: waiting plus working."""
        return self.wait_s + self.step_s

    @property
    def steps_per_s(self) -> float:
        """Throughput of the training loop in this setting."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        """Share of the loop's time spent waiting for data."""
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_per_step_s(self) -> float:
        """Mean wait per step."""
        return self.wait_s / self.steps if self.steps else 0.0

    @property
    def step_per_step_s(self) -> float:
        """Mean work per step (the training step)."""
        return self.step_s / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {
            "num_workers": self.num_workers,
            "prefetch": self.prefetch,
            "steps": self.steps,
            "steps_per_s": round(self.steps_per_s, 3),
            "wait_fraction": round(self.wait_fraction, 4),
            "wait_per_step_s": self.wait_per_step_s,
            "step_s": self.step_per_step_s,
        }


class Resizable(Protocol):
    """What :meth:`AutoTuner.drive` needs of a pool (a :class:`~naiad.parallel.WorkerPool`)."""

    @property
    def workers_ready(self) -> bool: ...

    def resize(self, num_workers: int, *, prefetch: int | None = None) -> None: ...


def _default_max_workers() -> int:
    return max(1, min(usable_cores(), 16))


def _n(count: int) -> str:
    return f"{count} worker" if count == 1 else f"{count} workers"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


@dataclass
class _Window:
    trial: Trial
    skip: int
    started: float = field(default_factory=time.monotonic)


class AutoTuner:
    """Chooses ``num_workers`` and the prefetch depth while training runs (NOTE [ Auto-tuning workers ]).

    Feed it one observation per training step with :meth:`observe`, or let :meth:`drive` time
    a batch iterator and resize its pool. It starts inline (0 workers) and settles within a
    few hundred milliseconds to a few seconds of training.

    Args:
        max_workers: the most workers to try (default: the usable cores, at most 16).
        prefetch: batches in flight per worker to start with.
        target_wait_fraction: waiting no more than this share of the time counts as no wait.
        tolerance: throughputs within this fraction of the best count as equally fast.
        min_steps: steps per measured window, at least.
        min_window_s: seconds per window, at least (short steps need many to be measured).
        max_window_s: a window closes after this long once it has 2 steps (slow steps).
        max_window_steps: a window of ``min_steps`` closes after this many steps even before
            ``min_window_s`` (microsecond steps in small epochs would otherwise take many epochs).
        warmup_steps: steps ignored after each change (start-up and queue filling).
        transfer_cost_s: what handing one batch over from a worker costs the training
            process; batches cheaper than this to build are built inline.

    Example:
        >>> tuner = AutoTuner(max_workers=4, min_window_s=0.0)
        >>> for _ in range(40):  # building a batch: 5 µs, a step: 1 ms
        ...     _ = tuner.observe(5e-6, 1e-3)
        >>> tuner.decision.num_workers, tuner.decision.settled
        (0, True)
    """

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        prefetch: int = 2,
        target_wait_fraction: float = 0.05,
        tolerance: float = 0.05,
        min_steps: int = 16,
        min_window_s: float = 0.2,
        max_window_s: float = 3.0,
        max_window_steps: int = 256,
        warmup_steps: int = 3,
        transfer_cost_s: float = 150e-6,
    ) -> None:
        if max_workers is not None and max_workers < 0:
            raise ConfigError(f"`max_workers` must be >= 0, got {max_workers}.")
        if prefetch < 1:
            raise ConfigError(f"`prefetch` must be >= 1, got {prefetch}.")
        if not 0 < target_wait_fraction < 1:
            raise ConfigError(f"`target_wait_fraction` must be in (0, 1), got {target_wait_fraction}.")
        self.max_workers = _default_max_workers() if max_workers is None else max_workers
        self.base_prefetch = prefetch
        self.target = target_wait_fraction
        self.tolerance = tolerance
        self.min_steps = max(2, min_steps)
        self.min_window_s = min_window_s
        self.max_window_s = max_window_s
        self.max_window_steps = max(self.min_steps, max_window_steps)
        self.warmup_steps = warmup_steps
        self.transfer_cost_s = transfer_cost_s
        self.trials: dict[tuple[int, int], Trial] = {}
        self._decision = TunerDecision(0, prefetch, "measuring: no workers first", False)
        self._window: _Window | None = self._open(0, prefetch)
        self._after = Trial(0, prefetch)  # what the settled setting gives, for stats()

    # -- the decision ------------------------------------------------------------------------------

    @property
    def decision(self) -> TunerDecision:
        """The setting to run now."""
        return self._decision

    @property
    def settled(self) -> bool:
        """True once the tuner stopped measuring."""
        return self._decision.settled

    def _open(self, num_workers: int, prefetch: int) -> _Window:
        skip = self.warmup_steps + (prefetch * num_workers if num_workers else 0)
        return _Window(Trial(num_workers, prefetch), skip)

    def observe(self, wait_s: float, step_s: float) -> TunerDecision | None:
        """Record one training step: the wait for its batch and the work on it.

        Returns the new decision when the setting should change, else None.
        """
        window = self._window
        if window is None:  # settled: keep counting, for stats()
            self._after.steps += 1
            self._after.wait_s += wait_s
            self._after.step_s += step_s
            return None
        if window.skip > 0:
            window.skip -= 1
            window.started = time.monotonic()
            return None
        t = window.trial
        t.steps += 1
        t.wait_s += wait_s
        t.step_s += step_s
        elapsed = time.monotonic() - window.started
        seconds = max(elapsed, t.seconds)
        full = t.steps >= self.min_steps and (seconds >= self.min_window_s or t.steps >= self.max_window_steps)
        if not full and not (t.steps >= 2 and seconds >= self.max_window_s):
            return None
        self.trials[(t.num_workers, t.prefetch)] = t
        previous = self._decision
        self._decision = self._next(t)
        if self._decision.settled:
            self._window = None
            self._after = Trial(self._decision.num_workers, self._decision.prefetch)
        else:
            self._window = self._open(self._decision.num_workers, self._decision.prefetch)
        changed = (previous.num_workers, previous.prefetch) != (
            self._decision.num_workers,
            self._decision.prefetch,
        )
        return self._decision if changed or self._decision.settled else None

    def _measuring(self, num_workers: int, prefetch: int, why: str) -> TunerDecision:
        return TunerDecision(num_workers, prefetch, f"measuring {_n(num_workers)}: {why}", False)

    def _next(self, t: Trial) -> TunerDecision:
        w, p = t.num_workers, t.prefetch
        if p != self.base_prefetch:  # the prefetch trial decides itself
            return self._settle_prefetch(t)
        if w == 0 and len(self.trials) == 1:
            return self._after_inline(t)
        fewer = [x.steps_per_s for x in self.trials.values() if x.num_workers < w]
        paying = t.steps_per_s > (1 + self.tolerance) * max(fewer, default=0.0)
        if t.wait_fraction > self.target and paying:
            if w < self.max_workers and (w + 1, p) not in self.trials:
                return self._measuring(w + 1, p, f"{w} still waits {t.wait_fraction:.0%} of the time")
        elif w > 1 and (w - 1, p) not in self.trials:
            # The wait is gone, or these workers cost more than they bring (cores taken from
            # the training loop): fewer may do as well.
            return self._measuring(w - 1, p, f"checking whether {w - 1} do as well as {w}")
        return self._finish()

    def _after_inline(self, t: Trial) -> TunerDecision:
        build = t.wait_per_step_s
        if t.wait_fraction <= self.target:
            return TunerDecision(
                0, self.base_prefetch,
                f"0 workers: building a batch in the training process takes {_us(build)}, "
                f"{t.wait_fraction:.1%} of each step ({_us(t.step_per_step_s)} of work): "
                "nothing to gain from workers.",
                True,
            )
        if build <= self.transfer_cost_s:
            return TunerDecision(
                0, self.base_prefetch,
                f"0 workers: building a batch takes {_us(build)} in the training process, less "
                f"than handing one over from a worker costs it (~{_us(self.transfer_cost_s)}): "
                "workers would slow the loop down.",
                True,
            )
        if self.max_workers == 0:
            return TunerDecision(0, self.base_prefetch, "0 workers: max_workers is 0.", True)
        guess = math.ceil(round(build / max(t.step_per_step_s, 1e-9), 6))  # 2.0000001 is 2
        guess = max(1, min(self.max_workers, guess))
        return self._measuring(
            guess, self.base_prefetch,
            f"with none the loop waits {t.wait_fraction:.0%} of the time ({_us(build)} per batch "
            f"against {_us(t.step_per_step_s)} of work)",
        )

    def _choose(self) -> Trial:
        best = max(x.steps_per_s for x in self.trials.values())
        fast = [x for x in self.trials.values() if x.steps_per_s >= (1 - self.tolerance) * best]
        return min(fast, key=lambda x: (x.num_workers, x.prefetch))

    def _summary(self) -> str:
        return "; ".join(
            f"{_n(x.num_workers)}/prefetch {x.prefetch}: {x.steps_per_s:,.0f} steps/s, "
            f"waiting {x.wait_fraction:.0%}"
            for x in sorted(self.trials.values(), key=lambda x: (x.num_workers, x.prefetch))
        )

    def _finish(self) -> TunerDecision:
        chosen = self._choose()
        w, p = chosen.num_workers, chosen.prefetch
        if w > 1 and (w - 1, p) not in self.trials:
            return self._measuring(w - 1, p, f"checking whether {w - 1} are as fast as {w}")
        if w > 0 and chosen.wait_fraction > self.target and (w, 2 * p) not in self.trials:
            return self._measuring(w, 2 * p, f"{w} still waits {chosen.wait_fraction:.0%}; trying prefetch {2 * p}")
        return self._settled_on(chosen)

    def _settle_prefetch(self, t: Trial) -> TunerDecision:
        base = self.trials.get((t.num_workers, self.base_prefetch))
        if base is not None and t.steps_per_s <= (1 + self.tolerance) * base.steps_per_s:
            return self._settled_on(base, note=f" A deeper prefetch ({t.prefetch}) did not help.")
        return self._settled_on(t)

    def _settled_on(self, chosen: Trial, note: str = "") -> TunerDecision:
        inline = self.trials.get((0, self.base_prefetch))
        gain = ""
        if inline is not None and chosen.num_workers > 0 and inline.steps_per_s > 0:
            gain = f", {chosen.steps_per_s / inline.steps_per_s:.1f}x the throughput of 0 workers"
        if chosen.wait_fraction <= self.target:
            head = f"{_n(chosen.num_workers)} (prefetch {chosen.prefetch}): the fewest that remove the wait{gain}."
        else:
            head = (
                f"{_n(chosen.num_workers)} (prefetch {chosen.prefetch}): the fewest within "
                f"{self.tolerance:.0%} of the best throughput{gain}; the loop still waits "
                f"{chosen.wait_fraction:.0%} of the time, so loading is the bottleneck here."
            )
        return TunerDecision(chosen.num_workers, chosen.prefetch, f"{head}{note} Measured: {self._summary()}.", True)

    # -- driving a pool ----------------------------------------------------------------------------

    def drive(self, pool: Resizable, batches: Iterable[Any]) -> Iterator[Any]:
        """Yield ``batches``, timing the wait for each and the step between, resizing ``pool``.

        This is how a loader uses the tuner: build the pool with ``decision.num_workers`` and
        ``decision.prefetch``, then iterate ``tuner.drive(pool, pool.imap(tasks))``. The pool
        must be one ``imap`` can resize during a pass (:meth:`WorkerPool.resize`). A batch's
        exception passes through and, when ``batches`` goes on after one (a pool's results do,
        NOTE [ A failed task ]), so does this iterator.
        """
        return _Driven(self, pool, iter(batches))

    def stats(self) -> dict[str, Any]:
        """What was chosen and why, with every measured setting (JSON-able)."""
        d = self._decision
        return {
            "num_workers": d.num_workers,
            "prefetch": d.prefetch,
            "settled": d.settled,
            "reason": d.reason,
            "trials": [t.as_dict() for t in sorted(self.trials.values(), key=lambda x: (x.num_workers, x.prefetch))],
            "since_settled": self._after.as_dict() if d.settled else None,
        }


class _Driven(Iterator[Any]):
    """:meth:`AutoTuner.drive`'s iterator: a class, not a generator, so that a batch's exception
    can pass through it and the next ``next()`` still goes on."""

    def __init__(self, tuner: AutoTuner, pool: Resizable, batches: Iterator[Any]) -> None:
        self._tuner = tuner
        self._pool = pool
        self._it = batches
        self._started = False
        self._closed = False
        self._yielded_at: float | None = None

    @property
    def alive(self) -> bool:
        """Whether ``next()`` can still give batches (see :class:`~naiad.parallel.PoolResults`)."""
        return not self._closed and bool(getattr(self._it, "alive", False))

    def __iter__(self) -> _Driven:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        tuner = self._tuner
        if not self._started:  # the pool is put in the tuner's setting when the pass starts
            self._started = True
            d = tuner.decision
            self._pool.resize(d.num_workers, prefetch=d.prefetch)
        t0 = time.perf_counter()  # the loop just asked: its step ended now
        try:
            batch = next(self._it)
        except StopIteration:
            self.close()
            raise
        except BaseException:
            self._yielded_at = None  # a failed batch's wait is not a step to measure
            if not self.alive:
                self.close()
            raise
        t1 = time.perf_counter()
        if self._yielded_at is not None:
            wait_s, step_s = t1 - t0, t0 - self._yielded_at
            if tuner._window is None:
                tuner.observe(wait_s, step_s)
            # Steps while new workers start would measure their start-up, not the setting.
            elif self._pool.workers_ready:
                change = tuner.observe(wait_s, step_s)
                if change is not None:
                    self._pool.resize(change.num_workers, prefetch=change.prefetch)
        self._yielded_at = time.perf_counter()
        return batch

    def close(self) -> None:
        """Stop: close the batches' iterator."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


