"""What ``naiad tune`` sweeps and prints: the settings, the recommendation, the table and the
comparison with the defaults (which default the recommendation would change)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Settings within this fraction of the best throughput count as equally fast.
TOLERANCE = 0.05

CORR_AIM = 0.02
"""The most ``|corr(position in the epoch, row number)|`` a recommended setting may have."""
SPAN_AIM = 0.98
"""The least batch span a recommended setting may have, as a share of a full permutation's.

The batch span is the median over batches of (max row - min row) / N. For a full permutation it
is about ``(b - 1) / (b + 1)`` for batches of ``b`` rows (the expected range of ``b`` uniform
draws): 0.998 for 1024, 0.94 for 32. The aim is 98% of that (0.978 for batches of 1024)."""
SLACK = 0.01
"""How much worse than the defaults' own figures a setting may measure when the defaults miss
the aim: the figures of two epochs vary by about this much between equally good settings."""


def full_permutation_span(batch_size: int) -> float:
    """The batch span of a full permutation for batches of ``batch_size`` rows (large N)."""
    return (batch_size - 1) / (batch_size + 1)


def size_words(nbytes: int) -> str:
    """``4194304`` -> ``"4 MiB"``, ``1572864`` -> ``"1.5 MiB"``, ``65538`` -> ``"64 KiB"``, ``1000`` -> ``"1000 B"``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.3g} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class Setting:
    """One point of the sweep; ``block_bytes`` and ``shuffle_buffer`` None mean the default."""

    num_workers: int
    worker_mode: str
    prefetch_factor: int | None
    block_bytes: int | None = None
    shuffle_buffer: int | None = None

    def words(self) -> str:
        """The DataLoader call that makes this setting, e.g. ``naiad.DataLoader(..., num_workers=0)``."""
        source = "..." if self.block_bytes is None else f"naiad.read(..., block_bytes={self.block_bytes})"
        parts = [source, f"num_workers={self.num_workers}"]
        if self.num_workers:
            parts += [f"worker_mode={self.worker_mode!r}", f"prefetch_factor={self.prefetch_factor}"]
        if self.shuffle_buffer is not None:
            parts.append(f"shuffle_buffer={self.shuffle_buffer}")
        return f"naiad.DataLoader({', '.join(parts)})"

    def cost(self) -> tuple[int, int, int, int, int]:
        # Fewer workers first (a thread shares the process's memory, a process does not), then
        # the defaults of block and buffer before a changed one: a smaller block shuffles better.
        return (
            self.num_workers, 0 if self.worker_mode == "thread" else 1, self.prefetch_factor or 0,
            self.block_bytes or 0, 0 if self.shuffle_buffer is None else 1,
        )


DEFAULTS = Setting(0, "inline", None)
"""What ``naiad.DataLoader(naiad.read(path), batch_size=B, shuffle=True, seed=0)`` gets."""


@dataclass
class Measurement:
    """What one setting gave."""

    setting: Setting
    rows_per_s: float
    wait_ms_per_step: float
    cpu_percent: float
    peak_mem_mb: float
    first_batch_s: float
    steps: int
    corr: float | None = None
    """``corr(position in the epoch, row number)``, the largest in magnitude over the setting's
    first two epochs (None: not known, a map-style dataset, whose sampler draws a full
    permutation)."""
    span: float | None = None
    """The least batch span over the same epochs (None as for ``corr``)."""

    def mixes(self, bar: QualityBar | None) -> bool:
        """Whether this setting shuffles at least as well as ``bar`` asks (None, or no figures: yes)."""
        if bar is None or self.corr is None or self.span is None:
            return True
        return abs(self.corr) <= bar.corr and self.span >= bar.span

    def as_json(self) -> dict[str, Any]:
        """The setting's fields and the figures, flat."""
        return {**asdict(self.setting), **{k: v for k, v in asdict(self).items() if k != "setting"}}


@dataclass(frozen=True)
class QualityBar:
    """The shuffle quality a recommendation must keep: ``|corr| <= corr`` and ``span >= span``."""

    corr: float
    span: float

    def words(self) -> str:
        """``|corr| <= 0.02 and batch span >= 0.98``."""
        return f"|corr| <= {self.corr:.3g} and batch span >= {self.span:.3g}"


def quality_bar(corr: float | None, span: float | None, batch_size: int) -> QualityBar:
    """The aim (:data:`CORR_AIM`, :data:`SPAN_AIM`), or, where the defaults' figures ``corr`` and
    ``span`` miss it, those less :data:`SLACK`: a recommendation never mixes less than both.

    A faster setting that mixes less is a trade, not a better setting: larger blocks keep more
    rows of the file together in a batch (4 MiB blocks of a 150 MB CSV: batch span 0.92 against
    0.995), and which of the two a model needs is the user's call (``--any-order``).
    """
    most, least = CORR_AIM, SPAN_AIM * full_permutation_span(batch_size)
    if corr is not None and abs(corr) > most:
        most = abs(corr) + SLACK
    if span is not None and span < least:
        least = span - SLACK
    return QualityBar(round(most, 4), round(least, 4))


def recommend(results: list[Measurement], bar: QualityBar | None = None) -> Measurement:
    """The cheapest setting within 5% of the best throughput among those that mix as well as
    ``bar`` (all of them when none does, or without a bar)."""
    pool = [r for r in results if r.mixes(bar)] or results
    best = max(r.rows_per_s for r in pool)
    fast = [r for r in pool if r.rows_per_s >= (1 - TOLERANCE) * best]
    return min(fast, key=lambda r: r.setting.cost())


def format_table(results: list[Measurement], chosen: Measurement, *, blocks: bool, buffers: bool,
                 bar: QualityBar | None = None) -> str:
    """The sweep as an aligned text table; the recommended row is starred, and a row that mixes
    less than ``bar`` is marked ``-``.

    ``blocks`` and ``buffers`` add the block size and shuffle buffer columns (streaming sources);
    the quality columns come with any figures.
    """
    quality = any(r.span is not None for r in results)
    header = ["", "workers", "mode", "prefetch"]
    header += ["block"] * blocks + ["buffer"] * buffers
    header += ["rows/s", "wait/step ms", "CPU %", "peak mem MB", "first batch s"]
    header += ["corr", "span"] * quality
    rows = []
    for r in results:
        s = r.setting
        row = [
            "*" if r is chosen else ("" if r.mixes(bar) else "-"),
            str(s.num_workers),
            s.worker_mode if s.num_workers else "-",
            str(s.prefetch_factor) if s.prefetch_factor else "-",
        ]
        if blocks:
            row.append("auto" if s.block_bytes is None else size_words(s.block_bytes))
        if buffers:
            row.append("auto" if s.shuffle_buffer is None else f"{s.shuffle_buffer:,}")
        row += [
            f"{r.rows_per_s:,.0f}",
            f"{r.wait_ms_per_step:.3f}",
            f"{r.cpu_percent:.0f}",
            f"{r.peak_mem_mb:,.0f}",
            f"{r.first_batch_s:.2f}",
        ]
        if quality:
            row += ["-" if r.corr is None else f"{r.corr:+.3f}", "-" if r.span is None else f"{r.span:.3f}"]
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def changes(chosen: Setting, default_block: int | None, default_buffer: int | None) -> list[dict[str, Any]]:
    """The options in which ``chosen`` differs from :data:`DEFAULTS`, each with both values and words.

    ``default_block`` and ``default_buffer`` are what the defaults resolve to (None: unknown),
    for the words only; the ``"default"`` value of a block or buffer is None (the reader's).
    """
    out: list[dict[str, Any]] = []
    if chosen.block_bytes is not None:
        was = f"default {size_words(default_block)}" if default_block else "default"
        out.append({"option": "block_bytes", "default": None, "recommended": chosen.block_bytes,
                    "words": f"block_bytes ({was} -> {size_words(chosen.block_bytes)})"})
    if chosen.shuffle_buffer is not None:
        was = f"default {default_buffer:,}" if default_buffer else "default"
        out.append({"option": "shuffle_buffer", "default": None, "recommended": chosen.shuffle_buffer,
                    "words": f"shuffle_buffer ({was} -> {chosen.shuffle_buffer:,} rows)"})
    if chosen.num_workers:
        how = ("threads" if chosen.worker_mode == "thread" else "processes") + (f", prefetch_factor={chosen.prefetch_factor}" if chosen.prefetch_factor != 2 else "")
        out.append({"option": "num_workers", "default": 0, "recommended": chosen.num_workers,
                    "worker_mode": chosen.worker_mode, "prefetch_factor": chosen.prefetch_factor,
                    "words": f"num_workers (0 -> {chosen.num_workers}, {how})"})
    return out


def defaults_report(
    results: list[Measurement], defaults: Measurement, chosen: Measurement, call: str,
    default_block: int | None, default_buffer: int | None, bar: QualityBar | None = None,
) -> tuple[list[str], list[dict[str, Any]]]:
    """The lines printed after the recommendation, and the changes it makes to the defaults.

    ``call`` is the defaults' DataLoader call, in words. The defaults are compared with the best
    setting that mixes as well as ``bar``; the changes are empty when they are within 5% of it.
    A faster setting that mixes less is named, with its figures, and not counted.
    """
    pool = [r for r in results if r.mixes(bar)] or results
    best = max(max(r.rows_per_s for r in pool), defaults.rows_per_s)
    share = defaults.rows_per_s / best if best > 0 else 1.0
    gain = chosen.rows_per_s / defaults.rows_per_s if defaults.rows_per_s > 0 else float("inf")
    what = ["num_workers=0"]
    if default_block:
        what.append(f"blocks of {size_words(default_block)}")
    if default_buffer:
        what.append(f"a buffer of {default_buffer:,} rows")
    lines = [
        f"\nDefaults: {call} ({', '.join(what)}): {defaults.rows_per_s:,.0f} rows/s; "
        f"the recommendation measures {gain:.2f}x that."
    ]
    fastest = max(results, key=lambda r: r.rows_per_s)
    if bar is not None and not fastest.mixes(bar) and fastest.rows_per_s > chosen.rows_per_s:
        lines.append(
            f"Faster but mixing less: {fastest.setting.words()} at {fastest.rows_per_s:,.0f} rows/s "
            f"({fastest.rows_per_s / defaults.rows_per_s:.2f}x the defaults), corr {fastest.corr:+.3f} and batch span "
            f"{fastest.span:.3f}, against {bar.words()}; not recommended (--any-order ranks by speed alone)."
        )
    todo = changes(chosen.setting, default_block, default_buffer)
    if share >= 1 - TOLERANCE or not todo:
        lines.append(f"The defaults are within {TOLERANCE:.0%} of the best ({share:.2f}x): nothing to change.")
        return lines, []
    lines.append(f"Defaults reach {share:.2f}x the best; the recommendation changes " + " and ".join(c["words"] for c in todo) + ".")
    bigger_block = chosen.setting.block_bytes is not None and (default_block is None or chosen.setting.block_bytes > default_block)
    smaller_buffer = chosen.setting.shuffle_buffer is not None and default_buffer is not None and chosen.setting.shuffle_buffer < default_buffer
    if bigger_block or smaller_buffer:
        lines.append("Note: bigger blocks and smaller buffers shuffle less (rows of a block stay close together "
                     "in the epoch); check the trade-off if the order matters.")
    return lines, todo
