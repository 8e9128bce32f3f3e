"""``naiad inspect``: what naiad sees in some files, and how long a shuffled epoch of them takes.

Files and sizes, the format and its reader, the columns with the types naiad's batches will have,
the row count, the blocks (the unit of reading and of block shuffling) and their sizes, the first
rows, advice on what would stream better, and an estimate of a shuffled epoch's read time from
a short timed read of random blocks through the source. For samples (tar shards, an image
folder, a table with bytes) also their keys, extensions, image sizes and formats and the decode
time per image (inspect_samples.py), and for videos among them what a video folder's inspect
says (inspect_video_samples.py). docs/CONVERT.md, docs/VIDEO.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.sources.auto import _suffix, read
from naiad.sources.base import Block, Source
from naiad.sources.columns import is_ragged_numeric
from naiad.sources.images import ImageFolderSource, read_images
from naiad.sources.options import StorageLike
from naiad.sources.storage import size as object_size
from naiad.sources.webdataset import WebDatasetSource
from naiad.stream.batches import default_buffer_rows
from naiad.stream.plan import GroupTask, ReadTask, group_rows, group_tasks
from naiad.tools.inspect_samples import inspect_samples, sample_notes
from naiad.tools.inspect_video_samples import VideoLook, video_column_lines
from naiad.tools.progress import human_duration, json_safe
from naiad.tools.sample_media import is_image_folder, media_format, video_format

__all__ = ["InspectReport", "inspect_source"]

_FEW_BLOCKS = 64
_BIG_BLOCK_ROWS = 1 << 16
_TEXT = (".csv", ".tsv", ".jsonl", ".ndjson", ".txt")


@dataclass
class InspectReport:
    """What :func:`inspect_source` found (``as_dict()`` is the ``--json`` output).

    Attributes:
        source: what was asked for (a path, glob or URL).
        format: the files' suffix (``csv``) and ``reader``, the naiad reader that reads them.
        files: one ``{"path", "bytes"}`` per file, in reading order.
        columns: one ``{"name", "arrow_type", "dtype", "shape", "batch"}`` per column: ``dtype`` and
            ``shape`` of the column in a batch of ``n`` rows; ``batch`` is "tensor", "tensors" (a list
            of 1-D tensors, one per row, of shape ``(n, *)``: NOTE [ Ragged columns ]) or "list".
        rows: the row count (exact); ``count_s``: how long counting took (a text format's scan).
        blocks: ``{"count", "rows": {"min", "median", "max"}, "bytes": {...} or None}``.
        head: the first rows, as plain values.
        epoch: the timed read: ``{"blocks_read", "rows_read", "seconds", "rows_per_s",
            "epoch_s"}``; ``epoch_s`` is the estimate for every row, in one process.
        notes: advice (few blocks, big blocks, dictionary-encoded floats, large or small images...).
        samples: for a source with bytes (tar shards, an image folder, a table of images): keys,
            extensions, image sizes and formats, decode times (``inspect_samples``); else None.
    """

    source: str
    format: str
    reader: str
    files: list[dict[str, Any]]
    total_bytes: int
    columns: list[dict[str, Any]]
    rows: int
    count_s: float
    blocks: dict[str, Any]
    head: list[dict[str, Any]]
    epoch: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    samples: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-able data."""
        return asdict(self)

    def to_json(self) -> str:
        """The report as JSON (NaN written as null, so any JSON parser reads it)."""
        return json.dumps(json_safe(self.as_dict()), indent=2)

    def summary(self, max_files: int = 10) -> str:
        """The report in words, for a terminal."""
        from naiad.tools.progress import human_bytes

        lines = [f"{self.source}: {len(self.files)} file(s), {human_bytes(self.total_bytes)}, {self.format} "
                 f"(naiad.{self.reader})"]
        for f in self.files[:max_files]:
            lines.append(f"  {human_bytes(f['bytes']):>10}  {f['path']}")
        if len(self.files) > max_files:
            lines.append(f"  ... and {len(self.files) - max_files} more")
        lines.append(f"rows: {self.rows:,} (counted in {self.count_s:.2f} s)")
        lines.append("columns (as naiad's batches hold them):")
        width = max((len(c["name"]) for c in self.columns), default=4)
        for c in self.columns:
            lines.append(f"  {c['name']:<{width}}  {c['dtype']:<8} {c['batch']:<7} shape {c['shape']:<12} "
                         f"(arrow {c['arrow_type']})")
        b = self.blocks
        r = b["rows"]
        text = f"blocks: {b['count']:,}, rows per block min/median/max {r['min']:,}/{r['median']:,}/{r['max']:,}"
        if b["bytes"]:
            y = b["bytes"]
            text += f", bytes {human_bytes(y['min'])}/{human_bytes(y['median'])}/{human_bytes(y['max'])}"
        lines.append(text)
        if self.head:
            lines.append(f"first {len(self.head)} row(s):")
            lines += [f"  {json.dumps(json_safe(row), default=str)[:200]}" for row in self.head]
        e = self.epoch
        if e["rows_read"]:
            lines.append(
                f"timed read: {e['blocks_read']} random block(s), {e['rows_read']:,} rows in {e['seconds']:.3f} s "
                f"({e['rows_per_s']:,.0f} rows/s); a shuffled epoch reads in about {human_duration(e['epoch_s'])} in one "
                "process (workers divide it while reading is CPU-bound)"
            )
        if self.samples is not None:
            lines += _samples_summary(self.samples)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def inspect_source(paths: str | Sequence[str], *, storage: StorageLike = None,
                   head_rows: int = 5, time_budget_s: float = 1.0, max_blocks: int = 256, seed: int = 0,
                   images: int = 64, max_size: int = 256, video: VideoLook | None = None,
                   **reader_options: Any) -> InspectReport:
    """Inspect ``paths`` (a file, glob or URL naiad reads, or a folder of images): see
    :class:`InspectReport`.

    The timed read takes blocks in a seeded random order (as a shuffled epoch does) until
    ``time_budget_s`` has passed or ``max_blocks`` were read (at least one). For samples,
    ``images`` random images are looked at (their headers), some of them decoded for about
    ``time_budget_s``, and images whose longer side is at least twice ``max_size`` are also
    timed made that small (what ``naiad convert --max-size`` would do). Videos in a shard's
    members or a table's column are probed as ``video`` says (NOTE [ Videos in samples ]).

    Raises:
        SourceError: a file cannot be found or read, naming it.
        ConfigError: no reader for the files' suffix.
    """
    if is_image_folder(paths):
        assert isinstance(paths, str)
        source: Source = read_images(paths, **reader_options)
    else:
        source = read(paths, storage=storage, **reader_options)
    if isinstance(source, ImageFolderSource):
        files: list[dict[str, Any]] = [{"path": source.root, "bytes": source.parsed_bytes()}]
    else:
        files = [{"path": p, "bytes": object_size(p, store=source.storage)} for p in source.paths]
    began = time.perf_counter()
    blocks = source.blocks()
    count_s = time.perf_counter() - began
    suffix = "images" if isinstance(source, ImageFolderSource) else _suffix(source.paths[0])
    report = InspectReport(
        source=paths if isinstance(paths, str) else ", ".join(paths),
        format=suffix.lstrip("."), reader=_reader_name(source), files=files,
        total_bytes=sum(f["bytes"] for f in files), columns=_columns(source), rows=sum(b.rows for b in blocks),
        count_s=count_s, blocks=_block_sizes(source, blocks, suffix), head=_head(source, blocks, head_rows),
        epoch=_timed_read(source, blocks, time_budget_s, max_blocks, seed),
    )
    report.notes = _notes(source, report, suffix)
    report.samples = inspect_samples(source, images=images, max_size=max_size, time_budget_s=time_budget_s, seed=seed,
                                     video=video)
    if report.samples is not None:
        report.notes += sample_notes(report.samples)
    return report


_READER_NAMES = {ImageFolderSource: "read_images", WebDatasetSource: "read_webdataset"}


def _reader_name(source: Source) -> str:
    for kind, name in _READER_NAMES.items():
        if isinstance(source, kind):
            return name
    return f"read_{type(source).__name__.removesuffix('Source').lower()}"


def _columns(source: Source) -> list[dict[str, Any]]:
    empty = source.empty_columns()
    out = []
    for f in source.schema():
        col = empty.get(f.name)
        if isinstance(col, np.ndarray) and col.dtype != object:
            dtype, kind, shape = str(col.dtype), "tensor", ["n", *col.shape[1:]]
        elif is_ragged_numeric(f.type):  # a list of 1-D tensors, each row's own length
            dtype, kind, shape = str(np.dtype(f.type.value_type.to_pandas_dtype())), "tensors", ["n", "*"]
        else:
            text = pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            binary = pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) or pa.types.is_fixed_size_binary(f.type)
            dtype = "str" if text else ("bytes" if binary else "object")
            kind, shape = "list", ["n"]
        out.append({"name": f.name, "arrow_type": str(f.type), "dtype": dtype,
                    "shape": "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")", "batch": kind})
    return out


def _stats(values: Sequence[int]) -> dict[str, int]:
    if not values:
        return {"min": 0, "median": 0, "max": 0}
    arr = np.asarray(values)
    return {"min": int(arr.min()), "median": int(np.median(arr)), "max": int(arr.max())}


def _block_sizes(source: Source, blocks: list[Block], suffix: str) -> dict[str, Any]:
    nbytes: list[int] | None = None
    if isinstance(source, (WebDatasetSource, ImageFolderSource)):  # byte ranges of samples
        nbytes = [b.stop - b.start for b in blocks]
    elif suffix in _TEXT:
        sizes = {p: object_size(p, store=source.storage) for p in source.paths}
        nbytes = [(b.stop if b.stop >= 0 else sizes[b.path]) - b.start for b in blocks]
    elif suffix == ".parquet":
        from naiad.sources.parquet import open_parquet

        groups = [open_parquet(b.path, source.storage).metadata.row_group(b.start) for b in blocks]
        nbytes = [sum(g.column(i).total_compressed_size for i in range(g.num_columns)) for g in groups]
    return {"count": len(blocks), "rows": _stats([b.rows for b in blocks]),
            "bytes": _stats(nbytes) if nbytes is not None else None}


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray)):
        found = media_format(value) or video_format(value)
        if found is not None:
            return f"<{found[0]}, {len(value):,} bytes>"
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(value):,} bytes>"
    return value


def _head(source: Source, blocks: list[Block], n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for block in blocks:
        if len(rows) >= n:
            break
        data = source.read_block(block, 0, min(block.rows, n - len(rows))).columns
        count = len(next(iter(data.values()))) if data else 0
        rows += [{k: _plain(v[i]) for k, v in data.items()} for i in range(count)]
    return rows


def _timed_read(source: Source, blocks: list[Block], budget_s: float, max_blocks: int, seed: int) -> dict[str, Any]:
    # Random blocks read as a shuffled epoch reads them: joined into the plan's read groups,
    # each parsed in one call (NOTE [ Read groups ]); block by block, a CSV of small blocks
    # reads several times slower than an epoch does.
    order = np.random.default_rng(seed).permutation(len(blocks))[: max(max_blocks, 1)].tolist()
    reads = [ReadTask(blocks[i], 0, blocks[i].rows) for i in order]
    rows = done = 0
    began = time.perf_counter()
    elapsed = 0.0
    for task in group_tasks(reads, group_rows(default_buffer_rows(source))):
        group = task.reads if isinstance(task, GroupTask) else (task,)
        source.read_group([(t.block, t.lo, t.hi, None) for t in group])
        rows += task.rows
        done += len(group)
        elapsed = time.perf_counter() - began
        if elapsed >= budget_s:
            break
    total = sum(b.rows for b in blocks)
    rate = rows / elapsed if elapsed > 0 else 0.0
    return {"blocks_read": done, "rows_read": rows, "seconds": elapsed, "rows_per_s": rate,
            "epoch_s": total / rate if rate > 0 else 0.0}


def _notes(source: Source, report: InspectReport, suffix: str) -> list[str]:
    notes = []
    count, biggest = report.blocks["count"], report.blocks["rows"]["max"]
    if count < _FEW_BLOCKS and report.rows >= 64 * 1024:
        notes.append(f"only {count} block(s) for {report.rows:,} rows: a shuffled epoch's block permutation has "
                     "little to mix; `naiad convert --shuffle` writes row groups of about 1/4096 of the rows")
    if biggest > _BIG_BLOCK_ROWS and source.traits.blocks_from_metadata:
        notes.append(f"blocks of up to {biggest:,} rows: the shuffle buffer is sized to hold two of them "
                     "(memory); `naiad convert` writes smaller row groups (--row-group-rows)")
    if suffix == ".parquet":
        from naiad.sources.parquet import open_parquet

        meta = open_parquet(source.paths[0], source.storage).metadata
        if meta.num_row_groups:
            group = meta.row_group(0)
            floats = [group.column(i).path_in_schema for i in range(group.num_columns)
                      if group.column(i).physical_type in ("FLOAT", "DOUBLE") and group.column(i).has_dictionary_page]
            if floats:
                notes.append(f"float column(s) {floats[:8]} are dictionary-encoded: about twice the decode CPU of "
                             "plain pages (docs/STREAMING.md); `naiad convert` writes them plain")
    if suffix in _TEXT and any(b.stop < 0 for b in source.blocks()):
        notes.append("compressed text is read as one block per file (it cannot be entered in the middle); "
                     "`naiad convert` to Parquet or Arrow streams it in blocks")
    return notes


def _samples_summary(s: dict[str, Any]) -> list[str]:
    lines = [f"samples: {s['samples']:,} ({s['kind']})"]
    keys = s["keys"]
    if keys["column"]:
        lines.append(f"  keys ({keys['column']}): {', '.join(map(repr, keys['first']))}{', ...' if keys['first'] else ''}")
    if s["extensions"] is not None:
        lines.append("  extensions: " + ", ".join(f"{ext or '(none)'} {n:,}" for ext, n in s["extensions"].items()))
    for c in s["columns"]:
        if not c["sampled"]:
            continue
        w, h, b = c["width"], c["height"], c["bytes"]
        fmts = ", ".join(f"{k} {v}" for k, v in c["formats"].items())
        text = f"  {c['name']}: {c['sampled']} sampled: {fmts}"
        if w["max"]:
            modes = ", ".join(f"{k} {v}" for k, v in c["modes"].items())
            text += (f"; width {w['min']}/{w['median']}/{w['max']}, height {h['min']}/{h['median']}/{h['max']} "
                     f"(min/median/max); modes {modes}")
        text += f"; bytes median {b['median']:,}"
        lines.append(text)
        d = c["decode"]
        if d is not None:
            text = f"    decode: {d['ms_per_image']:.3f} ms per image on one thread ({d['images']} timed)"
            if d.get("max_size"):
                m = d["max_size"]
                text += f"; made --max-size {m['max_size']}: {m['ms_per_image']:.3f} ms ({m['speedup']:.1f}x faster)"
            lines.append(text)
        if c.get("videos"):
            lines += video_column_lines(c["videos"])
    return lines


