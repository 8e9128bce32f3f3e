"""What a coverage check reports (:mod:`naiad.tools.coverage`): per epoch what was delivered, and how well
an epoch's delivery order is shuffled, from row numbers alone (vectorized over N rows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["CoverageReport", "EpochCoverage", "ShuffleQuality", "job_order", "shuffle_quality_of"]


@dataclass(frozen=True)
class ShuffleQuality:
    """The shuffle's quality in one epoch, over every rank.

    The *delivery order* is the order training consumes rows: step by step, and within a step
    rank 0's batch, then rank 1's, and so on. A row's *row number* is its place in the files,
    in file order.

    Attributes:
        spearman: Spearman rank correlation of delivery order with row number (about 0 for a
            uniform shuffle; near 1 when rows come in file order).
        pearson: Pearson correlation of the same.
        worst_rank_spearman: the largest ``|Spearman|`` of one rank's own delivery order with
            its row numbers (a rank reading its range in file order shows 1 here even when the
            job's figure is low).
        neighbour_share: of the pairs of rows next to each other in the files (rows ``i`` and
            ``i + 1``, both delivered), the share that one rank delivers one right after the other,
            in either order, batch boundaries ignored (about ``2 / N`` for a uniform shuffle, 1
            for file order).
        batch_span: the median over batches of ``(largest row number - smallest) / N`` (about
            ``(B - 1) / (B + 1)`` for a uniform shuffle of batches of ``B``; ``B / N`` for file
            order).
    """

    spearman: float
    pearson: float
    worst_rank_spearman: float
    neighbour_share: float
    batch_span: float

    def lines(self) -> list[str]:
        """The figures in words."""
        return [
            "shuffle quality, epoch 0 (file order / a uniform shuffle would give):",
            f"  correlation of delivery order with row number (1 / ~0): Spearman {self.spearman:+.4f}, "
            f"Pearson {self.pearson:+.4f}; worst single rank |Spearman| {self.worst_rank_spearman:.4f}",
            f"  file neighbours still delivered next to each other (100% / ~2/rows): {self.neighbour_share:.4%}",
            f"  batch span, median of (max row - min row) / rows (~batch/rows / ~(batch-1)/(batch+1)): "
            f"{self.batch_span:.4f}",
        ]


@dataclass(frozen=True)
class EpochCoverage:
    """What one epoch delivered over all ranks.

    Attributes:
        epoch: the epoch.
        batches_per_rank: batches every rank yielded (a resumed epoch: before + after the resume).
        rows_delivered: rows in those batches, over all ranks.
        rows_unused: rows no batch held (``drop_last``'s remainder; otherwise 0).
        resumed_after: for the resumed epoch, the batches every old rank delivered before it.
    """

    epoch: int
    batches_per_rank: int
    rows_delivered: int
    rows_unused: int
    resumed_after: int | None = None


@dataclass
class CoverageReport:
    """What :func:`check_coverage` found; ``ok`` when every check passed.

    Attributes:
        source: the source, in words.
        total_rows: rows in the source.
        files: files in the source.
        blocks: blocks (the units of reading and of block shuffling).
        settings: the configuration checked (plain values).
        batches_per_rank: batches every rank yields per epoch (before any resume).
        epochs: per epoch, what it delivered.
        quality: the shuffle's quality in epoch 0 (see :class:`ShuffleQuality`; None below 3 rows).
        stream_checks: what the real position stream was compared on.
        problems: every check that failed, in words (empty: all passed).
        seconds: the time the check took.
    """

    source: str
    total_rows: int
    files: int
    blocks: int
    settings: dict[str, Any]
    batches_per_rank: int
    epochs: list[EpochCoverage] = field(default_factory=list)
    quality: ShuffleQuality | None = None
    stream_checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able data (``ok`` included)."""
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def summary(self) -> str:
        """The report in words, one fact per line."""
        s = self.settings
        lines = [
            f"source: {self.source}: {self.total_rows:,} rows in {self.files} file(s), {self.blocks} block(s)",
            f"plan: world_size={s['world_size']}, batch_size={s['batch_size']}, drop_last={s['drop_last']}, "
            f"shuffle={s['shuffle']}" + (f" (buffer {s['shuffle_buffer_rows']:,} rows)" if s["shuffle"] else "")
            + f", seed={s['seed']}, epochs={s['epochs']}",
            f"batches per rank: {self.batches_per_rank:,} per epoch, the same on every rank",
        ]
        for e in self.epochs:
            resumed = "" if e.resumed_after is None else f" (resumed after {e.resumed_after:,} batches)"
            unused = f", {e.rows_unused:,} unused (drop_last)" if e.rows_unused else ""
            lines.append(f"epoch {e.epoch}{resumed}: {e.rows_delivered:,} rows delivered{unused}, "
                         f"{e.batches_per_rank:,} batches per rank")
        if s.get("resume_at") is not None:
            lines.append(f"resume at {s['resume_at']}: world_size={s['new_world_size']}, "
                         f"batch_size={s['new_batch_size']}, num_workers={s['new_num_workers']}")
        lines.append(f"num_workers={s['num_workers']}: workers do not enter the plan (checked by construction)")
        lines.extend(f"  {c}" for c in self.stream_checks)
        if self.quality is not None:
            lines.extend(self.quality.lines())
        lines.append(f"checked in {self.seconds:.2f} s")
        if self.ok:
            lines.append("OK: every row exactly once per epoch across all ranks, equal steps on every rank"
                         + (", the same after the resume" if s.get("resume_at") is not None else ""))
        else:
            lines.extend(f"FAILED: {p}" for p in self.problems)
        return "\n".join(lines)



def job_order(runs: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The row numbers of every rank's batches in delivery order (step-major, then rank).

    ``runs`` holds each rank's ``(rows, batch_sizes)``; every rank has the same number of batches.
    """
    world = len(runs)
    if not world:
        return np.zeros(0, np.int64)
    steps = len(runs[0][1])
    grid = np.stack([sizes for _, sizes in runs])  # (rank, step)
    # Where batch (step s, rank r) starts in the delivery order: the batches before it, step-major.
    starts = (np.cumsum(grid.T.ravel()) - grid.T.ravel()).reshape(steps, world).T
    out = np.empty(int(grid.sum()), np.int64)
    for r, (rows, sizes) in enumerate(runs):
        first = np.cumsum(sizes) - sizes  # where each batch starts in the rank's own rows
        dest = np.repeat(starts[r] - first, sizes) + np.arange(len(rows))
        out[dest] = rows
    return out


def shuffle_quality_of(runs: Sequence[tuple[np.ndarray, np.ndarray]], total_rows: int) -> ShuffleQuality:
    """The :class:`ShuffleQuality` of one epoch given each rank's ``(rows, batch_sizes)``."""
    order = job_order(runs)
    n = len(order)
    if n < 3 or total_rows < 3:
        return ShuffleQuality(0.0, 0.0, 0.0, 0.0, 0.0)
    order = order[(order >= 0) & (order < total_rows)]  # the coverage check reports the others
    position = np.arange(len(order), dtype=np.float64)
    if len(order) == total_rows:  # every row once: its rank is its row number
        ranks = order.astype(np.float64)
    else:  # drop_last left some out: ranks among the rows delivered, by counting
        seen = np.zeros(total_rows, bool)
        seen[order] = True
        ranks = (np.cumsum(seen) - 1)[order].astype(np.float64)
    worst = _worst_rank_spearman(runs, total_rows)
    return ShuffleQuality(
        spearman=_corr(position, ranks),
        pearson=_corr(position, order.astype(np.float64)),
        worst_rank_spearman=worst,
        neighbour_share=_neighbour_share(runs, total_rows),
        batch_span=_batch_span(runs, total_rows),
    )


def _worst_rank_spearman(runs: Sequence[tuple[np.ndarray, np.ndarray]], total_rows: int) -> float:
    """The largest ``|Spearman|`` of one rank's delivery order with its row numbers.

    A row's rank among its own rank's rows comes from one stable sort of the rows' rank labels
    (small integers: a radix sort, linear in N), not a sort per rank.
    """
    label = np.full(total_rows, len(runs), np.uint16 if len(runs) < 65535 else np.uint32)
    for r, (rows, _) in enumerate(runs):
        label[rows[(rows >= 0) & (rows < total_rows)]] = r
    by_rank = np.argsort(label, kind="stable")  # grouped by rank, row numbers ascending within each
    group_start = np.concatenate(([0], np.cumsum(np.bincount(label, minlength=len(runs) + 1))))
    own = np.empty(total_rows, np.int64)
    own[by_rank] = np.arange(total_rows) - group_start[label[by_rank]]
    worst = 0.0
    for rows, _ in runs:
        if len(rows) >= 3:
            ranks = own[np.clip(rows, 0, total_rows - 1)].astype(np.float64)
            worst = max(worst, abs(_corr(np.arange(len(rows), dtype=np.float64), ranks)))
    return worst


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r, 0 where either side is constant."""
    a = a - a.mean()
    b = b - b.mean()
    denom = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    return float(np.dot(a, b)) / denom if denom else 0.0


def _neighbour_share(runs: Sequence[tuple[np.ndarray, np.ndarray]], total_rows: int) -> float:
    rank_of = np.full(total_rows, -1, np.int32)
    index_of = np.zeros(total_rows, np.int64)
    for r, (rows, _) in enumerate(runs):
        rows = rows[(rows >= 0) & (rows < total_rows)]
        rank_of[rows] = r
        index_of[rows] = np.arange(len(rows))
    both = (rank_of[:-1] >= 0) & (rank_of[1:] >= 0)
    kept = both & (rank_of[:-1] == rank_of[1:]) & (np.abs(index_of[:-1] - index_of[1:]) == 1)
    pairs = int(both.sum())
    return int(kept.sum()) / pairs if pairs else 0.0


def _batch_span(runs: Sequence[tuple[np.ndarray, np.ndarray]], total_rows: int) -> float:
    spans = []
    for rows, sizes in runs:
        sizes = sizes[sizes > 0]
        if len(sizes) and len(rows) == int(sizes.sum()):
            starts = np.cumsum(sizes) - sizes
            spans.append(np.maximum.reduceat(rows, starts) - np.minimum.reduceat(rows, starts))
    return float(np.median(np.concatenate(spans))) / total_rows if spans else 0.0
