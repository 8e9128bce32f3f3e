"""Parquet files: one block per row group, row counts from the footer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.base import Source
from naiad.sources.columnar import ReaderCache, check_no_nulls, indexed_blocks
from naiad.sources.columns import (
    DTypes,
    apply_dtypes,
    cast_to_schema,
    check_columns_present,
    is_ragged_numeric,
    resolve_dtypes,
    row_bytes,
    select_columns,
    table_to_columns,
)
from naiad.sources.contract import Block, BlockData, GroupPart, SourceTraits
from naiad.sources.media import has_variable_rows, media_access, media_schema, resolve_media
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.paths import PathLike
from naiad.sources.storage import Storage
from naiad.trust.paths import MediaAccess

__all__ = ["ParquetSource", "read_parquet"]

def _open(path: str, store: Storage | None) -> pq.ParquetFile:
    if storage.is_remote(path):
        # The footer now (range reads from the end); a row group later fetches only the column
        # chunks asked for, coalesced into few requests by pre_buffer.
        return pq.ParquetFile(storage.RangeFile(path, storage.needs_store(path, store)), pre_buffer=True)
    return pq.ParquetFile(path, memory_map=True)


# Opening a Parquet file parses its footer, which is not free for wide files: keep it open.
_READERS = ReaderCache(_open, "Parquet file", "is it truncated?")


def open_parquet(path: str, store: Storage | None = None) -> pq.ParquetFile:
    """A cached :class:`pyarrow.parquet.ParquetFile` (per thread; an object's read through
    ``store``, its source's Storage), or a SourceError."""
    return _READERS.get(path, store)


class ParquetSource(Source):
    """A lazy source over Parquet files (a path, a glob or a list); a block is a row group:
    ``naiad.read_parquet``.

    Only footers are read until iteration. Shuffling permutes row groups and mixes rows in the
    shuffle buffer, so files written with small row groups (say 64k rows) shuffle better.

    A binary column reaches a batch as a list of ``bytes``; the ``{bytes, path}`` struct that
    Hugging Face ``datasets`` writes for its ``Image`` and ``Audio`` features as one column of
    bytes: the embedded bytes, or the file at ``path`` (relative to the Parquet file's folder)
    when only the path is there (NOTE [ Media structs ], docs/SAMPLES.md).

    Args:
        paths, columns, dtypes, storage, media: as every reader takes them
            (:class:`~naiad.Source`).
        on_bad_rows: what a null in an integer column, or a media struct with neither bytes
            nor a file it may read, does: as every reader's.

    Example:
        >>> ds = naiad.read_parquet("train/*.parquet", columns=["x", "y"])  # doctest: +SKIP
    """

    reader_name = "read_parquet"
    traits = SourceTraits(blocks_from_metadata=True)

    def __init__(
        self,
        paths: PathLike,
        *,
        columns: Sequence[str] | None = None,
        dtypes: DTypes = None,
        on_bad_rows: BadRows = "raise",
        storage: StorageLike = None,
        media: MediaAccess | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__(paths, on_bad_rows=on_bad_rows, storage=storage, deprecated=deprecated)
        self._selected = list(columns) if columns is not None else None
        self._dtypes_arg = dtypes
        self.media = media_access(media)
        self.schema()  # the footer is metadata: check columns and dtypes now

    def _read_schema(self) -> pa.Schema:
        schema = open_parquet(self.paths[0], self.storage).schema_arrow
        schema = media_schema(select_columns(schema, self._selected, self.paths[0]))
        return apply_dtypes(schema, resolve_dtypes(self._dtypes_arg, schema.names))

    def sample_bytes(self) -> int | None:
        """With a column of bytes or a ragged one (``has_variable_rows``), the first file's bytes
        per row, from its footer: its pages' uncompressed size, or a ragged column's values at
        their width if more (dictionary pages hold token ids in a byte or two, a batch in four or
        eight); rows of images or of tokens weigh what their values do. Else None."""
        pf = open_parquet(self.paths[0], self.storage)
        schema, meta = pf.schema_arrow, pf.metadata
        if not has_variable_rows(schema) or not meta.num_rows:
            return None
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        nbytes: int = sum(g.total_byte_size for g in groups)
        widths = {f.name: max(1, f.type.value_type.bit_width // 8) for f in schema if is_ragged_numeric(f.type)}
        leaves = [(j, widths[name]) for j in range(meta.num_columns)
                  if (name := meta.schema.column(j).path.split(".")[0]) in widths]
        values: int = sum(g.column(j).num_values * width for g in groups for j, width in leaves)
        rows: int = meta.num_rows
        fixed = row_bytes(pa.schema([f for f in schema if f.name not in widths])) * rows
        return max(1, max(nbytes, values + fixed) // rows)

    def _file_blocks(self, path: str) -> list[Block]:
        pf = open_parquet(path, self.storage)
        check_columns_present(self.schema().names, pf.schema_arrow.names, path, self.paths[0])
        meta = pf.metadata
        return indexed_blocks(path, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)])

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        schema = self.schema()
        try:
            table = open_parquet(block.path, self.storage).read_row_group(block.start, columns=schema.names, use_threads=use_threads)
            # A damaged page can decode to strings that are not UTF-8: a SourceError here, not a
            # UnicodeDecodeError when the column is read.
            table.validate(full=True)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot read row group {block.start} ({exc}); is the file truncated?", path=block.path) from None
        if (lo, hi) != (0, block.rows):
            table = table.slice(lo, hi - lo)
        table, no_bytes = resolve_media(table, block.path, self.storage, block.first_line + lo, self.on_bad_rows == "skip", self.media)
        table = cast_to_schema(table, schema, f"row group {block.start}", block.path)
        table, bad = check_no_nulls(table, block, lo, self.on_bad_rows, no_bytes)
        return BlockData(table_to_columns(table), bad)

    def _group_table(self, parts: list[GroupPart], use_threads: bool) -> pa.Table | None:
        """The group's row groups decoded by one ``read_row_groups`` call per file, the slices
        put in the plan's order without copying. A call per row group costs about as much as
        decoding 4,000 rows of ten float columns, so files in small row groups (what ``naiad
        convert`` writes for block shuffling) read at half speed one group at a time."""
        by_file: dict[str, list[int]] = {}
        for i, (block, *_) in enumerate(parts):
            by_file.setdefault(block.path, []).append(i)
        pieces: list[pa.Table] = [pa.table({})] * len(parts)
        try:
            for path, members in by_file.items():
                table = open_parquet(path, self.storage).read_row_groups(
                    [parts[i][0].start for i in members], columns=self.schema().names, use_threads=use_threads)
                table.validate(full=True)
                starts = np.cumsum([0] + [parts[i][0].rows for i in members])
                for i, start in zip(members, starts.tolist()):
                    block, lo, hi, _ = parts[i]
                    pieces[i], no_bytes = resolve_media(table.slice(start + lo, hi - lo), path, self.storage,
                                                        block.first_line + lo, True, self.media)
                    if no_bytes:
                        return None  # read one by one: that path names the row or skips it
        except (OSError, pa.ArrowException):
            return None
        return pa.concat_tables(pieces)


read_parquet = ParquetSource
