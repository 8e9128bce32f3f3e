"""What a loader reports: :class:`LoaderStats` and its parts, plain values made by
:meth:`naiad.telemetry.Telemetry.stats` and ``naiad.DataLoader.stats()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoaderStats", "StageStats", "WaitStats"]


@dataclass(frozen=True)
class WaitStats:
    """How long the training loop waited in ``next()`` for its batches.

    Attributes:
        total_s: all waits added up.
        mean_s: ``total_s / steps``.
        p50_s: median wait (within 1.1%).
        p90_s: 90th percentile.
        p99_s: 99th percentile.
        max_s: the longest wait (exact).
    """

    total_s: float = 0.0
    mean_s: float = 0.0
    p50_s: float = 0.0
    p90_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0


@dataclass(frozen=True)
class StageStats:
    """Time spent in one stage of the pipeline (summed over threads and workers).

    Attributes:
        seconds: total time; stages run in parallel in workers, so it can exceed the wall time.
        count: how many times the stage ran (batches, blocks, files, as the stage counts).
    """

    seconds: float = 0.0
    count: int = 0

    @property
    def mean_s(self) -> float:
        """Mean seconds per run of the stage (0.0 when it never ran)."""
        return self.seconds / self.count if self.count else 0.0


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's telemetry, from :meth:`Telemetry.stats`.

    Attributes:
        batches: batches handed to the training loop.
        rows: rows in those batches.
        elapsed_s: wall time from the start of the first wait to the end of the last step.
        wait: the training loop's time blocked in ``next()``: the *exposed* loading time.
        stages: time per stage, by name in alphabetical order. A loader records its workers'
            time (inline: the time each batch takes to make) as ``"read"`` for a streaming
            source or ``"fetch"`` for a dataset, and ``"transfer"`` with ``device=``.
        workers: set by a loader: how many workers run and why (what ``num_workers="auto"``
            chose, with the settings it measured), and the workers restarted: ``restarts`` (a
            count), ``max_restarts`` and ``restart_log`` (per restart: ``worker``, ``pid``,
            ``exitcode``, ``task``, ``epoch``), and ``batch_slots``: the shared memory process
            workers' batches cross through, mapped in this process (``slots``, ``bytes``).
        bad_rows: set by a loader: rows a streaming source skipped (``on_bad_rows="skip"``),
            per file.
        bad_row_reasons: the same, per reason, the commonest first.
        bad_row_ledger: the first 1,000 skipped rows, each a dict: ``file``, ``line`` (text
            formats) or ``row`` (columnar), ``column`` when known, ``reason`` and ``epoch``, in
            the order their batches were delivered (NOTE [ Bad rows keep their positions ]).

    Example:
        >>> from naiad.telemetry import Telemetry
        >>> tel = Telemetry()
        >>> tel.record_step(0.004, rows=32)
        >>> stats = tel.stats()
        >>> stats.wait.total_s
        0.004
        >>> sorted(stats.to_dict())
        ['bad_row_ledger', 'bad_row_reasons', 'bad_rows', 'batches', 'batches_per_s', 'elapsed_s', 'rows', 'rows_per_s', 'stages', 'wait', 'wait_fraction', 'workers']
    """

    batches: int = 0
    rows: int = 0
    elapsed_s: float = 0.0
    wait: WaitStats = field(default_factory=WaitStats)
    stages: dict[str, StageStats] = field(default_factory=dict)
    workers: dict[str, Any] = field(default_factory=dict)
    bad_rows: dict[str, int] = field(default_factory=dict)
    bad_row_reasons: dict[str, int] = field(default_factory=dict)
    bad_row_ledger: list[dict[str, Any]] = field(default_factory=list)

    @property
    def wait_fraction(self) -> float:
        """Share of the training loop's wall time spent waiting for data (0.0 .. 1.0)."""
        return min(1.0, self.wait.total_s / self.elapsed_s) if self.elapsed_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches delivered per second of ``elapsed_s``."""
        return self.batches / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        """Rows delivered per second of ``elapsed_s``."""
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The stats as plain JSON-able values (seconds as floats)."""
        return {
            "batches": self.batches,
            "rows": self.rows,
            "elapsed_s": self.elapsed_s,
            "batches_per_s": self.batches_per_s,
            "rows_per_s": self.rows_per_s,
            "wait_fraction": self.wait_fraction,
            "wait": {
                "total_s": self.wait.total_s,
                "mean_s": self.wait.mean_s,
                "p50_s": self.wait.p50_s,
                "p90_s": self.wait.p90_s,
                "p99_s": self.wait.p99_s,
                "max_s": self.wait.max_s,
            },
            "stages": {
                name: {"seconds": s.seconds, "count": s.count, "mean_s": s.mean_s}
                for name, s in self.stages.items()
            },
            "workers": dict(self.workers),
            "bad_rows": dict(self.bad_rows),
            "bad_row_reasons": dict(self.bad_row_reasons),
            "bad_row_ledger": [dict(e) for e in self.bad_row_ledger],
        }

    def __str__(self) -> str:
        w = self.wait
        lines = [
            f"batches {self.batches:,}   rows {self.rows:,}   elapsed {self.elapsed_s:.3f} s"
            f"   {self.batches_per_s:,.1f} batches/s   {self.rows_per_s:,.0f} rows/s",
            f"waiting for data: {w.total_s:.3f} s ({self.wait_fraction:.1%} of the loop)",
            "",
            f"{'wait per step':<16}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
            f"{'  ms':<16}"
            + "".join(f"{v * 1e3:>10.3f}" for v in (w.mean_s, w.p50_s, w.p90_s, w.p99_s, w.max_s)),
        ]
        if self.stages:
            lines += ["", f"{'stage':<16}{'total s':>10}{'count':>10}{'mean ms':>10}"]
            for name, s in self.stages.items():
                lines.append(f"{name:<16}{s.seconds:>10.3f}{s.count:>10,}{s.mean_s * 1e3:>10.3f}")
        if self.workers:
            lines += ["", f"workers: {self.workers.get('num_workers')} ({self.workers.get('reason', '')})"]
            if self.workers.get("restarts"):
                codes = ", ".join(str(e.get("exitcode")) for e in self.workers.get("restart_log", []))
                lines.append(f"workers restarted: {self.workers['restarts']} (exit codes {codes})")
        if self.bad_rows:
            skipped = ", ".join(f"{path}: {n:,}" for path, n in self.bad_rows.items())
            lines += ["", f"bad rows skipped: {sum(self.bad_rows.values()):,} ({skipped})"]
            for reason, n in list(self.bad_row_reasons.items())[:3]:
                lines.append(f"  {n:,} x {reason:.160}")
        return "\n".join(lines)
