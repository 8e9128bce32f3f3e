"""Telemetry: where a loader's time goes, cheap enough to leave on.

A :class:`Telemetry` recorder is owned by a loader. Its stages record how long each part of the
pipeline took (``read``, ``parse``, ``shuffle``, ``collate``, ``transfer``, or any name), and the
loader records each ``next()`` the training loop makes with :meth:`Telemetry.record_step`: how
long the loop *waited* for its batch, and how many rows it got. :meth:`Telemetry.stats` turns that
into a :class:`LoaderStats`; :meth:`Telemetry.export_chrome_trace` writes the recent events as a
Chrome trace (open it in https://ui.perfetto.dev or ``chrome://tracing``).

Cost and memory are bounded, whatever the length of the run:

* recording takes no lock (each thread has its own totals, merged by ``stats()``): a step costs
  a handful of float operations and one ``deque.append``, under half a microsecond (see
  ``bench/bench_overlap.py``), so telemetry stays under 2% of a loader that delivers 10,000
  batches a second;
* the wait distribution is a histogram with logarithmic buckets (32 per octave, so a percentile is
  within 1.1% of the true value; the maximum is exact) instead of a list of every wait;
* trace events live in a ring buffer of ``trace_events`` entries: the trace shows the most
  recent events, the totals count them all.

Example:
    >>> tel = Telemetry()
    >>> with tel.span("collate"):
    ...     pass
    >>> tel.add("parse", 0.002, count=4)   # measured in a worker, shipped back
    >>> tel.record_step(wait_s=0.001, rows=256)
    >>> s = tel.stats()
    >>> (s.batches, s.rows, s.stages["parse"].count)
    (1, 256, 4)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from naiad.errors import ConfigError
from naiad.stats import LoaderStats, StageStats, WaitStats

__all__ = ["LoaderStats", "StageStats", "Telemetry", "WaitStats"]

# Wait histogram: bucket i holds waits in [2**((i-1)/32 + _LOG2_LO), 2**(i/32 + _LOG2_LO)); bucket
# 0 holds everything below 2**_LOG2_LO (60 ns, including exact zeros). 32 buckets per
# octave bound the relative error of a percentile (the bucket's geometric middle) by
# 2**(1/64) - 1 = 1.1%; the range reaches
# 2**(_BUCKETS/32) * 60 ns, more than a day, in under 1,500 ints.
_PER_OCTAVE = 32
_LOG2_LO = math.log2(60e-9)
_BUCKETS = 40 * _PER_OCTAVE
_STEP_TRACK = "training loop"
# Step waits are folded into the histogram this many at a time (see _Accumulator).
_FOLD_STEPS = 1024


_perf = time.perf_counter


class _Span:
    """The context manager :meth:`Telemetry.span` returns (a class: cheaper than a generator)."""

    __slots__ = ("_telemetry", "_stage", "_t0")

    def __init__(self, telemetry: Telemetry, stage: str) -> None:
        self._telemetry = telemetry
        self._stage = stage
        self._t0 = 0.0

    def __enter__(self) -> _Span:
        self._t0 = _perf()
        return self

    def __exit__(self, *exc: object) -> None:
        self._telemetry.end(self._stage, self._t0)


class _Accumulator:
    """One thread's totals. Only its own thread writes it, so recording needs no lock.

    Step waits are appended to ``pending`` (an ``array('d')``: a C double, no object) and folded
    into the histogram and totals ``_FOLD_STEPS`` at a time with NumPy; the fold and
    :meth:`snapshot` share ``fold_lock``, so a reader sees a step either pending or folded, never
    both or neither.
    """

    __slots__ = (
        "track",
        "stages",
        "rows",
        "first_start",
        "last_end",
        "pending",
        "fold_lock",
        "steps",
        "wait_total",
        "wait_max",
        "hist",
    )

    def __init__(self, track: str) -> None:
        self.track = track
        self.stages: dict[str, list[float]] = {}  # stage -> [seconds, count]
        self.rows = 0
        self.first_start = math.inf
        self.last_end = -math.inf
        self.pending = array("d")
        self.fold_lock = threading.Lock()
        self.steps = 0
        self.wait_total = 0.0
        self.wait_max = 0.0
        self.hist = np.zeros(_BUCKETS + 1, dtype=np.int64)

    def fold(self) -> None:
        """Move the pending waits into the histogram and totals (called by the owner thread)."""
        waits = np.frombuffer(self.pending.tobytes(), dtype=np.float64)
        counts = _bucket_counts(waits)
        with self.fold_lock:
            self.hist += counts
            self.steps += len(waits)
            self.wait_total += float(waits.sum())
            self.wait_max = max(self.wait_max, float(waits.max(initial=0.0)))
            self.pending = array("d")

    def snapshot(self) -> tuple[int, float, float, np.ndarray]:
        """(steps, total wait, max wait, histogram), pending waits included."""
        with self.fold_lock:
            # tobytes() copies in one C call, under the GIL: the owner cannot append meanwhile.
            waits = np.frombuffer(self.pending.tobytes(), dtype=np.float64)
            steps, total, wmax, hist = self.steps, self.wait_total, self.wait_max, self.hist.copy()
        if len(waits):
            hist += _bucket_counts(waits)
            steps += len(waits)
            total += float(waits.sum())
            wmax = max(wmax, float(waits.max()))
        return steps, total, wmax, hist


def _bucket_counts(waits: np.ndarray) -> np.ndarray:
    """How many of ``waits`` fall into each histogram bucket (see ``_PER_OCTAVE``)."""
    index = np.zeros(len(waits), dtype=np.intp)
    positive = waits > 0.0
    x = (np.log2(waits[positive]) - _LOG2_LO) * _PER_OCTAVE
    # Below the first edge: bucket 0; past the last: the overflow bucket _BUCKETS.
    index[positive] = np.where(x < 0.0, 0, np.minimum(np.floor(np.maximum(x, 0.0)) + 1, _BUCKETS))
    return np.bincount(index, minlength=_BUCKETS + 1)


class Telemetry:
    """Records stage times and training-loop waits; thread-safe, bounded memory.

    NOTE [ Telemetry without locks ]
    Each thread that records gets its own accumulator (a ``threading.local``), so the hot
    path takes no lock and two threads never race on one total; :meth:`stats` merges the
    accumulators. It may see a thread's accumulator mid-update (a step counted, its wait not
    yet): a snapshot at most one call behind per thread, never a lost update. Trace events go
    into one ``deque(maxlen=...)``, whose ``append`` is atomic.

    Times come from ``time.perf_counter()``, which on Linux and macOS is a system-wide monotonic
    clock, so a worker process can send ``start_s`` values that line up with this process's.

    Args:
        trace_events: size of the ring buffer of trace events (0 keeps none: totals only).

    Example:
        >>> tel = Telemetry(trace_events=1000)
        >>> t0 = tel.begin()
        >>> tel.end("transfer", t0)
        >>> tel.stats().stages["transfer"].count
        1
    """

    def __init__(self, *, trace_events: int = 100_000) -> None:
        if trace_events < 0:
            raise ConfigError(f"`trace_events` must be >= 0, got {trace_events}.")
        self._trace_events = trace_events
        self._lock = threading.Lock()  # guards the list of accumulators, not the recording
        self._events: deque[tuple[str, float, float, str]] = deque(maxlen=trace_events)
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded so far (for example between epochs or benchmark phases)."""
        with self._lock:
            # A fresh threading.local: every thread starts a fresh accumulator on its next call.
            self._local = threading.local()
            self._accumulators: list[_Accumulator] = []
            self._events.clear()
            self._origin = _perf()

    def _new_accumulator(self) -> _Accumulator:
        acc = _Accumulator(threading.current_thread().name)
        with self._lock:
            self._accumulators.append(acc)
        self._local.acc = acc
        return acc

    # -- recording ----------------------------------------------------------------------------

    def span(self, stage: str) -> _Span:
        """A context manager that times its body as one run of ``stage`` in this thread.

        Example:
            >>> tel = Telemetry()
            >>> with tel.span("shuffle"):
            ...     _ = sorted(range(100))
        """
        return _Span(self, stage)

    # ``time.perf_counter`` itself, not a wrapper: one Python call less on the hot path.
    begin: Callable[[], float] = staticmethod(time.perf_counter)
    """The start time to pass to :meth:`end` (``time.perf_counter()``): the cheapest way to time a stage."""

    def end(self, stage: str, start_s: float) -> None:
        """Record one run of ``stage`` that began at ``start_s`` (from :meth:`begin`) and ends now."""
        seconds = _perf() - start_s
        try:
            acc = self._local.acc
        except AttributeError:
            acc = self._new_accumulator()
        total = acc.stages.get(stage)
        if total is None:
            acc.stages[stage] = [seconds, 1]
        else:
            total[0] += seconds
            total[1] += 1
        self._events.append((stage, start_s, seconds, acc.track))

    def add(
        self,
        stage: str,
        seconds: float,
        count: int = 1,
        *,
        start_s: float | None = None,
        track: str | None = None,
    ) -> None:
        """Add time measured elsewhere, for example in a worker process, to ``stage``.

        Args:
            stage: the stage name.
            seconds: time spent, in total, over ``count`` runs.
            count: how many runs ``seconds`` covers.
            start_s: when the work began, on the ``time.perf_counter()`` clock; given, the work
                also appears in the trace (as one event of ``seconds``).
            track: the trace row it appears on, for example ``"worker 3"``; default: the
                calling thread's name.
        """
        try:
            acc = self._local.acc
        except AttributeError:
            acc = self._new_accumulator()
        total = acc.stages.get(stage)
        if total is None:
            acc.stages[stage] = [seconds, count]
        else:
            total[0] += seconds
            total[1] += count
        if start_s is not None:
            self._events.append((stage, start_s, seconds, track or acc.track))

    def add_stages(self, seconds_by_stage: Mapping[str, float], count: int = 1) -> None:
        """Add several stages' times at once, for example the timings a worker ships with a batch.

        One call instead of one :meth:`add` per stage: the cheaper form on a per-batch path.

        Example:
            >>> tel = Telemetry()
            >>> tel.add_stages({"read": 0.002, "parse": 0.001})
            >>> {name: s.count for name, s in tel.stats().stages.items()}
            {'parse': 1, 'read': 1}
        """
        try:
            acc = self._local.acc
        except AttributeError:
            acc = self._new_accumulator()
        stages = acc.stages
        for stage, seconds in seconds_by_stage.items():
            total = stages.get(stage)
            if total is None:
                stages[stage] = [seconds, count]
            else:
                total[0] += seconds
                total[1] += count

    def record_step(self, wait_s: float, rows: int = 0) -> None:
        """Record one ``next()`` of the training loop that waited ``wait_s`` for ``rows`` rows.

        Call it when ``next()`` returns; the wait is taken to have ended now.
        """
        now = _perf()
        try:
            acc = self._local.acc
        except AttributeError:
            acc = self._new_accumulator()
        pending = acc.pending
        pending.append(wait_s)
        acc.rows += rows
        start = now - wait_s
        if start < acc.first_start:
            acc.first_start = start
        acc.last_end = now
        if len(pending) >= _FOLD_STEPS:
            acc.fold()
        self._events.append(("wait", start, wait_s, _STEP_TRACK))

    # -- reading ------------------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """A snapshot of everything recorded since creation or :meth:`reset`, all threads merged."""
        with self._lock:
            accumulators = list(self._accumulators)
        steps = rows = 0
        total = wmax = 0.0
        first, last = math.inf, -math.inf
        hist = np.zeros(_BUCKETS + 1, dtype=np.int64)
        stages: dict[str, list[float]] = {}
        for acc in accumulators:
            a_steps, a_total, a_max, a_hist = acc.snapshot()
            steps += a_steps
            total += a_total
            wmax = max(wmax, a_max)
            hist += a_hist
            rows += acc.rows
            first = min(first, acc.first_start)
            last = max(last, acc.last_end)
            for name, (sec, cnt) in list(acc.stages.items()):
                merged = stages.setdefault(name, [0.0, 0])
                merged[0] += sec
                merged[1] += cnt
        counts = hist.tolist()
        p50, p90, p99 = (_percentile(counts, steps, q, wmax) for q in (0.50, 0.90, 0.99))
        wait = WaitStats(
            total_s=total,
            mean_s=total / steps if steps else 0.0,
            p50_s=p50,
            p90_s=p90,
            p99_s=p99,
            max_s=wmax,
        )
        return LoaderStats(
            batches=steps,
            rows=rows,
            elapsed_s=last - first if steps else 0.0,
            wait=wait,
            stages={name: StageStats(stages[name][0], int(stages[name][1])) for name in sorted(stages)},
        )

    def trace_events(self) -> list[dict[str, Any]]:
        """The buffered events in Chrome trace event format (complete ``"X"`` events, in µs)."""
        events = list(self._events)  # a copy first: other threads keep appending
        origin = self._origin
        pid = os.getpid()
        tids: dict[str, int] = {_STEP_TRACK: 0}
        out: list[dict[str, Any]] = []
        for stage, start_s, seconds, track in events:
            tid = tids.setdefault(track, len(tids))
            out.append(
                {
                    "name": stage,
                    "cat": "naiad",
                    "ph": "X",
                    "ts": round((start_s - origin) * 1e6, 3),
                    "dur": round(max(seconds, 0.0) * 1e6, 3),
                    "pid": pid,
                    "tid": tid,
                }
            )
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "naiad"}}
        ]
        meta += [
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}}
            for track, tid in tids.items()
        ]
        return meta + sorted(out, key=lambda e: e["ts"])

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write the buffered events as Chrome trace JSON to ``path`` and return the path.

        One row per thread or worker (the training loop's waits on the first row), one box per
        stage run. Open the file in https://ui.perfetto.dev or ``chrome://tracing``.
        """
        target = Path(path)
        doc = {
            "traceEvents": self.trace_events(),
            "displayTimeUnit": "ms",
            "otherData": {"producer": "naiad", "ring_buffer_events": self._trace_events},
        }
        # A fresh temporary name beside it (O_EXCL): "trace.json.tmp" in /tmp could be a planted link.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)  # never leave a half-written trace behind
        except BaseException:
            os.unlink(tmp)
            raise
        return target


def _percentile(hist: Iterable[int], n: int, q: float, max_s: float) -> float:
    """The ``q`` quantile of the histogram: the geometric middle of the bucket that holds it."""
    if n == 0:
        return 0.0
    rank = max(1, math.ceil(q * n))
    seen = 0
    for i, c in enumerate(hist):
        seen += c
        if seen >= rank:
            if i == 0:
                return 0.0  # below 60 ns: indistinguishable from no wait at all
            if i == _BUCKETS:
                return max_s  # the overflow bucket has no upper edge
            mid: float = 2.0 ** (_LOG2_LO + (i - 0.5) / _PER_OCTAVE)
            return min(mid, max_s)
    return max_s
