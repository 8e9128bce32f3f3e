"""``naiad convert``: any readable source to Parquet or Arrow IPC shards made for streaming.

The input is read through naiad's own readers (any format, local or URL, the same errors) a block
at a time, so memory stays bounded whatever the input's size; the output is shards of
``rows_per_shard`` rows in row groups sized for block shuffling, float columns without
dictionary pages, optionally in a seeded global permutation (NOTE [ External shuffle ] in
convert_shuffle.py), written atomically (NOTE [ Atomic shards ] in convert_write.py) with a
manifest of row counts and SHA-256 checksums. docs/CONVERT.md.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, NaiadError, SourceError
from naiad.sources.auto import READERS, _suffix
from naiad.sources.base import Source
from naiad.sources.columns import Columns, is_pixel_field, pixel_array
from naiad.sources.paths import expand_paths
from naiad.sources.storage import Storage, is_remote
from naiad.tools.convert_samples import (
    SampleBatches,
    check_sample_options,
    checked_schema,
    estimated_row_bytes,
    is_sample_source,
    sample_group_rows,
)
from naiad.tools.convert_shuffle import BucketSpill, bucket_count
from naiad.tools.convert_tar import TarShardSet
from naiad.tools.convert_write import Destination, OutputFormat, ShardInfo, ShardSet, format_of
from naiad.tools.sample_media import is_image_folder

__all__ = ["ConvertOptions", "ConvertResult", "ProgressFn", "convert", "default_row_group_rows", "to_batch"]

ProgressFn = Callable[[str, int, int, int], None]
"""Called as ``progress(stage, rows_done, rows_total, bytes_written)``; stage is "convert", or
"scatter" then "write" for a shuffle."""

MANIFEST_VERSION = 1
_BAD_EXAMPLES = 20


@dataclass(frozen=True)
class ConvertOptions:
    """How :func:`convert` writes (every field has a default; docs/CONVERT.md).

    Attributes:
        format: "parquet", "arrow" (IPC file) or "webdataset" (tar shards of samples); None:
            from the destination's suffix, else Parquet.
        rows_per_shard: rows (samples) per output file; None: one file.
        row_group_rows: rows per Parquet row group or IPC record batch (the streaming block);
            None: :func:`default_row_group_rows` of the row count.
        shuffle: write the rows in a seeded global permutation.
        seed: the permutation's seed.
        memory_bytes: the memory a shuffle may use (about half of it on average).
        columns: keep only these columns (file order kept).
        dtypes: column types for the reader (a mapping or one type for every numeric column).
        on_bad_rows: "raise" (a SourceError naming the file and line or row) or "skip" (counted).
        compression: Parquet codec (default "snappy") or IPC codec ("lz4", "zstd"; default none,
            so the files can be memory-mapped without decoding).
        overwrite: replace shards and a manifest already at the destination.
        storage_options: fsspec options for a URL source (and destination, unless
            ``output_storage_options`` is given); never written to the manifest.
        output_storage_options: fsspec options for a URL destination.
        tmp_dir: where a shuffle's temporary buckets go; None: a private folder in the
            destination's folder (local) or the system's temporary folder (URL).
        max_size: samples: images whose longer side exceeds this many pixels are made smaller
            and encoded again (JPEG as JPEG at ``quality``, others as PNG).
        quality: the JPEG quality of images made smaller (1-100).
        decode: samples: store images decoded, a uint8 ``[C, H, W]`` per row (Parquet or Arrow;
            every image the size of the first), read back by naiad as ``[B, C, H, W]``.
        mode: with ``decode``, "L", "RGB" or "RGBA"; None: from the first image.
    """

    format: Literal["parquet", "arrow", "webdataset"] | None = None
    rows_per_shard: int | None = None
    row_group_rows: int | None = None
    shuffle: bool = False
    seed: int = 0
    memory_bytes: int = 1 << 30
    columns: Sequence[str] | None = None
    dtypes: Mapping[str, Any] | str | None = None
    on_bad_rows: Literal["raise", "skip"] = "raise"
    compression: str | None = None
    overwrite: bool = False
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    output_storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    tmp_dir: str | None = None
    max_size: int | None = None
    quality: int = 90
    decode: bool = False
    mode: str | None = None

    def __post_init__(self) -> None:
        for name in ("rows_per_shard", "row_group_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"`{name}` must be an int >= 1, got {value!r}.")
        if self.memory_bytes < 1 << 20:
            raise ConfigError(f"`memory_bytes` must be >= 1 MiB, got {self.memory_bytes}.")
        if self.on_bad_rows not in ("raise", "skip"):
            raise ConfigError(f"`on_bad_rows` must be 'raise' or 'skip', got {self.on_bad_rows!r}.")
        check_sample_options(self.max_size, self.quality)


@dataclass
class ConvertResult:
    """What :func:`convert` wrote: the shards, the rows, the skipped rows and the manifest."""

    shards: list[ShardInfo]
    rows: int
    bad_rows: int
    seconds: float
    manifest_path: str
    manifest: dict[str, Any]


def default_row_group_rows(total_rows: int) -> int:
    """About 1/4096 of the rows, between 1,024 and 65,536: thousands of blocks for the epoch's
    block permutation on a large input, and never so small that per-group overhead (metadata, one
    decode call, one plan task) shows, nor past the 64 Ki rows docs/STREAMING.md measured to mix
    well in the default shuffle buffer (which holds two such groups)."""
    return min(1 << 16, max(1 << 10, total_rows // 4096))


def convert(src: str | Sequence[str], dst: str, options: ConvertOptions | None = None, *,
            progress: ProgressFn | None = None) -> ConvertResult:
    """Convert ``src`` (a file, glob or URL of any format naiad reads, or a folder of images) to
    shards at ``dst``.

    ``dst`` is a file name (``out/train.parquet``: that file, or ``train-00000.parquet``, ...
    with ``rows_per_shard``) or a folder (``out/``, ``s3://bucket/train/``: ``part-00000.parquet``,
    ...). A manifest (``train.manifest.json`` or ``manifest.json``) is written last.

    Samples (an image folder, tar shards, a table with a column of bytes) are converted as
    samples (NOTE [ Sample conversion ] in convert_samples.py): to tar shards the ``webdataset``
    library reads (``.tar``, ``format="webdataset"``), or to Parquet with the images as
    Hugging Face ``datasets``' ``Image`` feature.

    Raises:
        SourceError: bad input, naming the file and line or row (unless ``on_bad_rows="skip"``).
        ConfigError: bad options, or files already at ``dst`` without ``overwrite``.

    Example:
        >>> convert("train.csv", "out/train.parquet", ConvertOptions(rows_per_shard=1_000_000, shuffle=True))  # doctest: +SKIP
    """
    opts = options or ConvertOptions()
    began = time.monotonic()
    source = open_source(src, opts)
    fmt = format_of(dst, opts.format)
    total = len(source)  # a text source's newline scan: exact row counts before any row is written
    samples, schema, group_rows = _output_of(source, opts, fmt, total)
    out_storage = Storage(opts.output_storage_options if opts.output_storage_options is not None else opts.storage_options)
    dest = Destination(dst, fmt, sharded=opts.rows_per_shard is not None, storage=out_storage)
    existing = dest.existing()
    if existing and not opts.overwrite:
        raise ConfigError(f"{dest.join(existing[0])} exists; pass --overwrite (overwrite=True) to replace "
                          f"{'it' if len(existing) == 1 else f'it and {len(existing) - 1} other file(s)'}.")
    shards, compression = _shard_set(dest, fmt, schema, opts, group_rows)
    reading = _Reading(source, schema, samples.convert if samples is not None else None)
    buckets, written = _write_all(reading, shards, opts, dst, total, progress)
    for name in existing:  # stale shards of an earlier, larger convert
        if name not in {s.file for s in written} and name != dest.manifest_name:
            dest.remove(dest.join(name))
    rows = sum(s.rows for s in written)
    if samples is not None:  # images that failed to shrink or decode, after the reader's bad rows
        reading.bad_rows += samples.bad_rows
        reading.bad_examples = (reading.bad_examples + samples.bad_examples)[:_BAD_EXAMPLES]
    manifest = {
        "version": MANIFEST_VERSION,
        "format": fmt,
        "rows": rows,
        "bad_rows": reading.bad_rows,
        "bad_row_examples": reading.bad_examples,
        "shards": [s.as_dict() for s in written],
        "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
        "source": {"paths": list(source.paths), "rows": total},
        "options": {**{k: v for k, v in asdict(opts).items() if "storage_options" not in k},
                    "format": fmt, "row_group_rows": group_rows, "compression": compression or "none",
                    **({"buckets": buckets} if opts.shuffle else {})},
        "naiad": _version(),
    }
    if samples is not None:
        manifest["samples"] = {"key": "__key__", "images": samples.images,
                               **({"decoded": samples.decoded} if samples.decoded else {})}
    dest.write_json(dest.manifest_name, manifest)
    return ConvertResult(written, rows, reading.bad_rows, time.monotonic() - began, dest.join(dest.manifest_name), manifest)


def _output_of(source: Source, opts: ConvertOptions, fmt: str,
               total: int) -> tuple[SampleBatches | None, pa.Schema, int]:
    """What the shards hold: the samples' conversion (None for a table without a column of
    bytes), the output schema, and the rows of a row group."""
    if is_sample_source(source, fmt):
        samples = SampleBatches(source, fmt, columns=opts.columns, max_size=opts.max_size, quality=opts.quality,
                                decode=opts.decode, mode=opts.mode, on_bad_rows=opts.on_bad_rows, total_rows=total)
        group_rows = opts.row_group_rows or sample_group_rows(total, estimated_row_bytes(source, samples.decoded))
        return samples, samples.schema, group_rows
    if opts.max_size is not None or opts.decode:
        raise ConfigError(f"`max_size` and `decode` apply to images; {source.paths[0]} has no column of bytes "
                          f"(its columns: {source.schema().names}).")
    return None, output_schema(source, opts.columns), opts.row_group_rows or default_row_group_rows(total)


def _shard_set(dest: Destination, fmt: OutputFormat, schema: pa.Schema, opts: ConvertOptions,
               group_rows: int) -> tuple[ShardSet | TarShardSet, str | None]:
    """The shards' writer for ``fmt``, and the compression it writes with (None: none)."""
    if fmt == "webdataset":
        if opts.compression not in (None, "none"):
            raise ConfigError(f"tar shards are not compressed (their images are already); got `compression` {opts.compression!r}.")
        return TarShardSet(dest, schema, rows_per_shard=opts.rows_per_shard), None
    compression = opts.compression if opts.compression is not None else ("snappy" if fmt == "parquet" else None)
    shards = ShardSet(dest, fmt, schema, row_group_rows=group_rows, rows_per_shard=opts.rows_per_shard,
                      compression=None if compression == "none" else compression)
    return shards, compression


def _write_all(reading: _Reading, shards: ShardSet | TarShardSet, opts: ConvertOptions, dst: str, total: int,
               progress: ProgressFn | None) -> tuple[int, list[Any]]:
    """Every row read into the shards, shuffled or in order: the shuffle's buckets (0 without)
    and the shards written; on any failure the shards written so far are removed."""
    buckets = 0
    try:
        if opts.shuffle:
            buckets = _shuffle(reading, shards, opts, dst, total, progress)
        else:
            for batch, _ in reading.chunks(0):
                shards.add(batch)
                if progress:
                    progress("convert", reading.rows_read, total, shards.bytes_written)
        return buckets, shards.finish()
    except BaseException as exc:
        shards.abort()
        if isinstance(exc, (OSError, pa.ArrowException)) and not isinstance(exc, NaiadError):
            # Read errors are the readers' SourceErrors already: this one is the destination's.
            raise SourceError(f"cannot write the shards: {type(exc).__name__}: {exc}", path=dst) from exc
        raise


def _spill_folder(opts: ConvertOptions, dst: str) -> str | None:
    """Where the shuffle's buckets go: ``tmp_dir``, else beside a local destination (the same
    disk), else the system's temporary folder (None)."""
    folder = opts.tmp_dir
    if folder is None and not is_remote(dst):
        folder = os.path.dirname(os.path.abspath(dst.rstrip("/"))) if not dst.endswith("/") else os.path.abspath(dst)
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
    return folder


def _shuffle(reading: _Reading, shards: ShardSet | TarShardSet, opts: ConvertOptions, dst: str, total: int,
             progress: ProgressFn | None) -> int:
    """NOTE [ External shuffle ] in convert_shuffle.py: scatter into buckets, then gather."""
    tmp = tempfile.mkdtemp(prefix=".naiad-convert-", dir=_spill_folder(opts, dst))
    spill: BucketSpill | None = None
    try:
        for batch, positions in reading.chunks(opts.memory_bytes // 4):
            if spill is None:
                per_row = batch.nbytes / max(1, batch.num_rows)
                spill = BucketSpill(tmp, shards.schema, bucket_count(per_row * total, opts.memory_bytes), opts.seed)
            assert positions is not None
            spill.scatter(batch, positions)
            if progress:
                progress("scatter", reading.rows_read, total, 0)
        if spill is None:
            return 0
        _gather(spill, shards, total - reading.bad_rows, progress)
        return spill.buckets
    finally:
        if spill is not None:
            spill.close()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


def _gather(spill: BucketSpill, shards: ShardSet | TarShardSet, kept: int, progress: ProgressFn | None) -> None:
    """The buckets, each shuffled in memory, written to the shards in bucket order."""
    for table in spill.tables():
        for batch in table.to_batches():
            shards.add(batch)
        if progress:
            progress("write", shards.rows_written, kept, shards.bytes_written)


MakeBatch = Callable[[Columns, np.ndarray, str], tuple[pa.RecordBatch, np.ndarray]]
"""A block's columns, its rows' input positions and its file -> (batch, the positions kept)."""


class _Reading:
    """The source read block by block, as record batches of the output schema; counts skipped rows."""

    def __init__(self, source: Source, schema: pa.Schema, make: MakeBatch | None = None) -> None:
        self.source = source
        self.schema = schema
        self.make = make or (lambda columns, positions, _: (to_batch(columns, schema), positions))
        self.rows_read = 0
        self.bad_rows = 0
        self.bad_examples: list[dict[str, Any]] = []

    def chunks(self, min_bytes: int) -> Iterator[tuple[pa.RecordBatch, np.ndarray | None]]:
        """Batches of at least ``min_bytes`` (0: one per block), with their rows' input positions
        (the position a skipped row had is not reused: positions are the input's)."""
        pending: list[pa.RecordBatch] = []
        positions: list[np.ndarray] = []
        size = 0
        start = 0
        for block in self.source.blocks():
            data = self.source.read_block(block, use_threads=True)
            pos = np.arange(start, start + block.rows, dtype=np.int64)
            if data.bad:
                self.bad_rows += len(data.bad)
                room = _BAD_EXAMPLES - len(self.bad_examples)
                self.bad_examples += [{k: v for k, v in e.items() if k != "at"} for e in data.bad[:max(0, room)]]
                keep = np.ones(block.rows, bool)
                keep[[e["at"] for e in data.bad]] = False
                pos = pos[keep]
            batch, pos = self.make(data.columns, pos, block.path)
            start += block.rows
            self.rows_read += block.rows
            if min_bytes <= 0:
                yield batch, pos
                continue
            pending.append(batch)
            positions.append(pos)
            size += batch.nbytes
            if size >= min_bytes:
                yield _concat(pending, self.schema), np.concatenate(positions)
                pending, positions, size = [], [], 0
        if pending:
            yield _concat(pending, self.schema), np.concatenate(positions)


def _concat(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema=schema).combine_chunks().to_batches()[0]


def open_source(src: str | Sequence[str], opts: ConvertOptions) -> Source:
    """The reader for ``src``'s suffix with the options it takes (``columns``, ``dtypes``,
    ``on_bad_rows``), or ``naiad.read_images`` for a folder of images; ``columns`` a reader does
    not take are selected after reading."""
    if is_image_folder(src):
        from naiad.sources.images import read_images

        assert isinstance(src, (str, os.PathLike))
        return read_images(src, on_bad_rows=opts.on_bad_rows)
    storage = Storage(opts.storage_options)
    files = expand_paths(src, storage)
    suffixes = {_suffix(f) for f in files}
    if len(suffixes) > 1 or next(iter(suffixes)) not in READERS:
        raise ConfigError(f"naiad convert reads one format at a time, one of {', '.join(sorted(READERS))}; "
                          f"got {', '.join(sorted(suffixes)) or 'files without a suffix'}.")
    reader, implied = READERS[suffixes.pop()]
    accepted = inspect.signature(reader).parameters
    kw: dict[str, Any] = dict(implied)
    for name, value in (("columns", opts.columns), ("dtypes", opts.dtypes), ("on_bad_rows", opts.on_bad_rows)):
        if name in accepted:
            kw[name] = value
        elif name == "dtypes" and value is not None:
            raise ConfigError(f"naiad.{reader.reader_name} takes no `dtypes`; its column is text.")
    return reader(files, **kw, storage=storage)


def output_schema(source: Source, columns: Sequence[str] | None) -> pa.Schema:
    """The shards' schema: the source's, where an array column of shape (rows, d1, ...) becomes a
    fixed-size list of d1 * ... values (the shape kept in the field's ``naiad.shape`` metadata
    when it has more than one axis), which naiad's readers give back as (rows, width) arrays.
    A pixel column (``fixed_size_binary`` with a ``naiad.shape``: ``--decode``) stays one."""
    schema = checked_schema(source, columns)
    empty = source.empty_columns()
    fields = []
    for f in schema:
        if columns is not None and f.name not in columns:
            continue
        col, t, meta = empty.get(f.name), f.type, f.metadata
        if isinstance(col, np.ndarray) and col.ndim > 1 and not pa.types.is_fixed_size_list(t) and not is_pixel_field(f):
            t = pa.list_(t, math.prod(col.shape[1:]))
            if col.ndim > 2:
                meta = {b"naiad.shape": json.dumps(list(col.shape[1:])).encode()}
        fields.append(pa.field(f.name, t, metadata=meta))
    return pa.schema(fields)


def to_batch(columns: Columns, schema: pa.Schema) -> pa.RecordBatch:
    """A reader's columns as a record batch of ``schema`` (NumPy columns without a copy)."""
    arrays = []
    for f in schema:
        col = columns[f.name]
        if isinstance(col, np.ndarray):
            if is_pixel_field(f):
                arrays.append(pixel_array(col, f))
                continue
            if col.ndim > 1:
                flat = pa.array(np.ascontiguousarray(col).reshape(-1))
                arr: pa.Array = pa.FixedSizeListArray.from_arrays(flat, math.prod(col.shape[1:]))
            else:
                arr = pa.array(col)
            if arr.type != f.type:
                arr = arr.cast(f.type)
        else:
            arr = pa.array(col, type=f.type)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _version() -> str:
    from naiad._version import __version__

    return __version__
