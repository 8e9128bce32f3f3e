"""ReadAheadTuner: whether a streaming source's read-ahead threads pay, from where the CPU time goes.

NOTE [ Tuned read-ahead ]
A streaming source left at ``num_workers=0`` is read ahead by up to two threads of the training
process. On an idle machine they win (a CSV parse overlaps the loop), but with a CPU-bound
training step on every core they only compete with it: torch's threads wait for the one that
lost its core, and a 150 MB CSV ran at 0.79x of reading inline (bench/RESULTS.md, "The defaults
under contention"). Which way wins depends on the step, which only the running loop shows.
:class:`ReadAheadTuner` looks at where the process's CPU time goes, once, after the first second
of reading (counted from when a fresh source's rows are, NOTE [ Early reads ]): the read-ahead
threads' CPU time (each read's ``time.thread_time``, reported by the pool as the ``worker_cpu``
stage) against the rest of the process (``time.process_time`` less that). When the rest keeps nearly every core busy (at least ``cores - 0.5``: torch's threads in a
CPU step) the threads go and the reads run inline; otherwise they stay. An A/B comparison of
windows was tried first and rejected: windows of a few hundred batches differ by 10-20% on a
shared machine, and the edges of an epoch (filling and draining the shuffle buffer: 128 batches
without a read) land in one window and not the other, so it picked inline on an idle machine. The
decision stays with the loader across epochs; its reason and numbers are in
``loader.stats().workers``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from naiad.parallel.autotune import AutoTuner, Trial, TunerDecision
from naiad.parallel.threads import usable_cores

__all__ = ["ReadAheadTuner"]


class ReadAheadTuner(AutoTuner):
    """Decides whether a streaming source's read-ahead threads pay, from where the process's CPU
    time goes while the loop runs (NOTE [ Tuned read-ahead ]).

    After the first ``delay_s`` seconds of steps (start-up, the first reads) from when
    ``settled()`` holds (a fresh source's rows counted beside the reads, NOTE [ Early reads ] in
    naiad/stream/early.py: that count's CPU time is neither the reads' nor the step's), one window of at
    least ``window_s`` seconds and two reads runs with ``threads`` threads. If the rest of the
    process (the training step's threads and the loop: its CPU time less the read-ahead
    threads') kept nearly every core busy, the threads only compete with the step: read inline
    from then on. Otherwise keep the threads. CPU time is counted, not compared between windows,
    so the decision does not hang on the machine's noise.

    Args:
        threads: the read-ahead threads to run when they pay.
        batches_per_read: about how many batches one read yields.
        prefetch: reads in flight per thread.
        reads_cpu: the read-ahead threads' CPU seconds so far (the pool's ``worker_cpu`` stage).
        cores: the cores there are (default: the usable ones).
        delay_s, window_s: how long to wait before measuring, and to measure.
        settled: whether the process's start-up work beside the loop is over (default: always).
        clock, process_cpu: wall time and the process's CPU time (tests pass their own).
    """

    def __init__(self, threads: int, batches_per_read: int, prefetch: int = 2, *,
                 reads_cpu: Callable[[], float] | None = None, cores: int | None = None,
                 delay_s: float = 1.0, window_s: float = 0.5, settled: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic, process_cpu: Callable[[], float] = time.process_time) -> None:
        super().__init__(max_workers=threads, prefetch=prefetch, min_steps=max(16, 2 * max(1, batches_per_read)),
                         min_window_s=window_s, transfer_cost_s=0.0)
        self.threads = threads
        self.cores = cores or usable_cores()
        self.delay_s = delay_s
        self._source_settled = settled
        self.reads_cpu: Callable[[], float] = reads_cpu or (lambda: 0.0)
        self._decision = TunerDecision(threads, prefetch, f"measuring where the CPU time goes with {threads} read-ahead threads", False)
        self._clock = clock
        self._process_cpu = process_cpu
        self._began: float | None = None
        self._mark: tuple[float, float, float] | None = None

    def observe(self, wait_s: float, step_s: float) -> TunerDecision | None:
        """Record one training step; returns the decision once it is made."""
        window = self._window
        if window is None:  # decided: keep counting, for stats()
            return super().observe(wait_s, step_s)
        now = self._clock()
        if self._began is None:
            if not self._source_settled():
                return None
            self._began = now
        if now - self._began < self.delay_s:
            return None
        if self._mark is None:
            self._mark = (now, self._process_cpu(), self.reads_cpu())
            return None
        t = window.trial
        t.steps += 1
        t.wait_s += wait_s
        t.step_s += step_s
        wall = now - self._mark[0]
        if wall < self.min_window_s or t.steps < self.min_steps:
            return None
        reads = self.reads_cpu() - self._mark[2]
        rest = max(0.0, self._process_cpu() - self._mark[1] - reads) / wall
        self.trials[(t.num_workers, t.prefetch)] = t
        p = self.base_prefetch
        measured = (f"over {wall:.2f} s the read-ahead threads used {reads / wall:.2f} cores and the rest of the "
                    f"process {rest:.2f} of {self.cores}")
        if rest >= self.cores - 0.5:
            self._decision = TunerDecision(0, p, f"0 threads, reading inline: the training step keeps the cores busy "
                                                 f"({measured}); threads would only compete with it.", True)
        else:
            self._decision = TunerDecision(self.threads, p, f"{self.threads} read-ahead threads: the training step "
                                                            f"leaves cores free ({measured}).", True)
        self._window = None
        self._after = Trial(self._decision.num_workers, p)
        return self._decision
