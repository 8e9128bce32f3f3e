"""Arrow IPC files (Feather v2): one block per record batch, memory-mapped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.base import (
    Block,
    BlockData,
    DTypes,
    OnBadRows,
    PathLike,
    ReaderCache,
    Source,
    apply_dtypes,
    cast_to_schema,
    check_columns_present,
    check_no_nulls,
    indexed_blocks,
    resolve_dtypes,
    select_columns,
    table_to_columns,
)
from naiad.sources.cache import CacheDir
from naiad.sources.ipc_footer import ipc_batch_rows
from naiad.sources.storage import RetryPolicy

__all__ = ["ArrowSource", "read_arrow"]

def read_arrow(
    paths: PathLike,
    *,
    columns: Sequence[str] | None = None,
    dtypes: DTypes = None,
    on_bad_rows: OnBadRows = "raise",
    max_bad_rows: int | float | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    cache_dir: CacheDir = None,
    cache_bytes: int | None = None,
) -> ArrowSource:
    """A lazy source over Arrow IPC *file* format (Feather v2) files; a block is a record batch.

    Files are memory-mapped, so reading a block copies only the rows a batch needs. The IPC
    *stream* format has no index of its batches; convert it with ``pyarrow.ipc.new_file``.

    Args:
        paths: a file, a glob or a list of them; files are read in this order.
        columns: read only these columns (output keeps file order).
        dtypes: a mapping column -> dtype, or one dtype for every numeric column.
        on_bad_rows: what a null in an integer column does: "raise" or "skip" (and count).
        max_bad_rows: with ``on_bad_rows="skip"``, the most rows an epoch may skip (per rank):
            a count, or a fraction (float) of the rows the rank reads; past it, a SourceError
            summarises the skipped rows (docs/STREAMING.md, "Bad input").
        storage_options: for URLs (``s3://``, ``gs://``, ...): options of the fsspec filesystem
            (credentials, ``endpoint_url``...; docs/STORAGE.md); None: the environment's.
        retry: how transient errors of remote reads are retried (None: ``RetryPolicy()``).
        cache_dir: for URLs: a folder where fetched blocks are kept on local disk, shared by the
            workers and processes of the machine, so later epochs read them locally ("auto":
            naiad's user cache folder); None: no cache (docs/STORAGE.md, "Local cache").
        cache_bytes: the cache's bound in bytes, least recently used blocks evicted past it
            (None: half the disk's free space).

    Example:
        >>> ds = naiad.read_arrow("train.arrow")  # doctest: +SKIP
    """
    return ArrowSource(paths, columns=columns, dtypes=dtypes, on_bad_rows=on_bad_rows, max_bad_rows=max_bad_rows, storage_options=storage_options, retry=retry, cache_dir=cache_dir, cache_bytes=cache_bytes)


def _open(path: str) -> pa.ipc.RecordBatchFileReader:
    if storage.is_remote(path):
        # The footer now; each record batch later with range reads of that batch alone.
        return pa.ipc.open_file(storage.RangeFile(path))
    return pa.ipc.open_file(pa.memory_map(path, "r"))


_READERS = ReaderCache(
    _open,
    "Arrow IPC file",
    "is it truncated, or in the stream format?",
)


def open_ipc(path: str) -> pa.ipc.RecordBatchFileReader:
    """A cached, memory-mapped IPC file reader (per thread), or a SourceError."""
    return _READERS.get(path)


class ArrowSource(Source):
    """Arrow IPC files cut into record batches (see :func:`read_arrow`)."""

    blocks_from_metadata = True

    def __init__(
        self,
        paths: PathLike,
        *,
        columns: Sequence[str] | None = None,
        dtypes: DTypes = None,
        on_bad_rows: OnBadRows = "raise",
        max_bad_rows: int | float | None = None,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        cache_dir: CacheDir = None,
        cache_bytes: int | None = None,
    ) -> None:
        super().__init__(paths, on_bad_rows=on_bad_rows, max_bad_rows=max_bad_rows, storage_options=storage_options, retry=retry, cache_dir=cache_dir, cache_bytes=cache_bytes)
        self._selected = list(columns) if columns is not None else None
        self._dtypes_arg = dtypes
        self.schema()  # the schema is metadata: check columns and dtypes now

    def _read_schema(self) -> pa.Schema:
        schema = select_columns(open_ipc(self.paths[0]).schema, self._selected, self.paths[0])
        return apply_dtypes(schema, resolve_dtypes(self._dtypes_arg, schema.names))

    def _file_blocks(self, path: str) -> list[Block]:
        reader = open_ipc(path)
        check_columns_present(self.schema().names, reader.schema.names, path, self.paths[0])
        if storage.is_remote(path):
            # Fetching each batch to count its rows would download the file: read the counts
            # from the footer and each batch's metadata instead.
            return indexed_blocks(path, ipc_batch_rows(path))
        # Memory-mapped: reading a batch's header touches no column data.
        counts = []
        for i in range(reader.num_record_batches):
            try:
                counts.append(reader.get_batch(i).num_rows)
            except (OSError, pa.ArrowException) as exc:
                raise SourceError(f"cannot read record batch {i} ({exc}); is the file truncated?", path=path) from None
        return indexed_blocks(path, counts)

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        schema = self.schema()
        try:
            batch = open_ipc(block.path).get_batch(block.start)
            # A damaged file can hold offsets that point outside the memory map: reading them
            # would crash the process (SIGBUS, SIGSEGV), so every batch is checked first.
            batch.validate(full=True)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot read record batch {block.start} ({exc}); is the file truncated?", path=block.path) from None
        table = pa.Table.from_batches([batch.slice(lo, hi - lo)]).select(schema.names)
        table = cast_to_schema(table, schema, f"record batch {block.start}", block.path)
        table, bad = check_no_nulls(table, block, lo, self.on_bad_rows)
        return BlockData(table_to_columns(table), bad)
