"""Arrow IPC files (Feather v2): blocks are record batches, or slices of big ones, memory-mapped."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.base import Source
from naiad.sources.columnar import ReaderCache, check_no_nulls, indexed_blocks
from naiad.sources.columns import (
    DTypes,
    apply_dtypes,
    cast_to_schema,
    check_columns_present,
    resolve_dtypes,
    select_columns,
    table_to_columns,
)
from naiad.sources.contract import Block, BlockData, GroupPart, SourceTraits, default_block_rows
from naiad.sources.ipc_footer import ipc_batch_rows
from naiad.sources.media import (
    has_binary,
    is_media_struct,
    media_access,
    media_schema,
    resolve_media,
)
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.paths import PathLike
from naiad.sources.storage import Storage
from naiad.trust.paths import MediaAccess

__all__ = ["ArrowSource", "read_arrow"]

def _open(path: str, store: Storage | None) -> pa.ipc.RecordBatchFileReader:
    if storage.is_remote(path):
        # The footer now; each record batch later with range reads of that batch alone.
        return pa.ipc.open_file(storage.RangeFile(path, storage.needs_store(path, store)))
    return pa.ipc.open_file(pa.memory_map(path, "r"))


_READERS = ReaderCache(
    _open,
    "Arrow IPC file",
    "is it truncated, or in the stream format?",
)


def open_ipc(path: str, store: Storage | None = None) -> pa.ipc.RecordBatchFileReader:
    """A cached, memory-mapped IPC file reader (per thread; an object's read through ``store``,
    its source's Storage), or a SourceError."""
    return _READERS.get(path, store)


class ArrowSource(Source):
    """A lazy source over Arrow IPC *file* format (Feather v2) files; a block is a record batch,
    or a slice of a big one: ``naiad.read_arrow``.

    Files are memory-mapped, so reading a block copies only the rows a batch needs. The IPC
    *stream* format has no index of its batches; convert it with ``pyarrow.ipc.new_file``.
    Binary columns and ``{bytes, path}`` media structs read as in :class:`ParquetSource`.

    Args:
        paths, columns, dtypes, storage, media: as every reader takes them
            (:class:`~naiad.Source`).
        on_bad_rows: what a null in an integer column, or a media struct with neither bytes
            nor a file it may read, does: as every reader's.
        block_rows: the most rows of a block: a bigger record batch is read as slices of it,
            each a block of the shuffle (None: about 1/4096 of the source's rows, between 1,024
            and 65,536, for local files; remote files keep whole batches, which are what one
            range read fetches). NOTE [ Record batch slices ].

    Example:
        >>> ds = naiad.read_arrow("train.arrow")  # doctest: +SKIP
    """

    reader_name = "read_arrow"
    traits = SourceTraits(blocks_from_metadata=True)

    def __init__(
        self,
        paths: PathLike,
        *,
        columns: Sequence[str] | None = None,
        dtypes: DTypes = None,
        on_bad_rows: BadRows = "raise",
        block_rows: int | None = None,
        storage: StorageLike = None,
        media: MediaAccess | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__(paths, on_bad_rows=on_bad_rows, storage=storage, deprecated=deprecated)
        if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1):
            raise ConfigError(f"`block_rows` must be an int >= 1 or None, got {block_rows!r}.")
        self.block_rows = block_rows
        # Per file, the first row of each record batch: a block's offset in its batch is its
        # first row less its batch's.
        self._batch_first_row: dict[str, list[int]] = {}
        self._batches: dict[tuple[str, int], pa.RecordBatch] = {}
        self._selected = list(columns) if columns is not None else None
        self._dtypes_arg = dtypes
        self.media = media_access(media)
        self.schema()  # the schema is metadata: check columns and dtypes now

    def _read_schema(self) -> pa.Schema:
        schema = media_schema(select_columns(open_ipc(self.paths[0], self.storage).schema, self._selected, self.paths[0]))
        return apply_dtypes(schema, resolve_dtypes(self._dtypes_arg, schema.names))

    def sample_bytes(self) -> int | None:
        """With a column of bytes, the first file's bytes per row; else None."""
        path = self.paths[0]
        if not has_binary(open_ipc(path, self.storage).schema):
            return None
        if storage.is_remote(path):
            rows = sum(ipc_batch_rows(path, self.storage))
        else:
            reader = open_ipc(path, self.storage)
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        return max(1, storage.size(path, store=self.storage) // max(rows, 1))

    def _file_blocks(self, path: str) -> list[Block]:
        reader = open_ipc(path, self.storage)
        check_columns_present(self.schema().names, reader.schema.names, path, self.paths[0])
        if storage.is_remote(path):
            # Fetching each batch to count its rows would download the file: read the counts
            # from the footer and each batch's metadata instead.
            counts = ipc_batch_rows(path, self.storage)
            step = self.block_rows
        else:
            # Memory-mapped: reading a batch's header touches no column data.
            counts = []
            for i in range(reader.num_record_batches):
                try:
                    counts.append(reader.get_batch(i).num_rows)
                except (OSError, pa.ArrowException) as exc:
                    raise SourceError(f"cannot read record batch {i} ({exc}); is the file truncated?", path=path) from None
            step = self.block_rows or default_block_rows(sum(counts), os.path.getsize(path), self.local_bytes())
        self._batch_first_row[path] = np.concatenate([[0], np.cumsum(counts)]).tolist()
        return sliced_blocks(indexed_blocks(path, counts), step)

    def _batch(self, block: Block) -> pa.RecordBatch:
        """``block``'s record batch, checked, with the schema's columns (kept per local file:
        a memory-mapped batch costs no memory, and a batch of many slices is checked once)."""
        key = (block.path, block.start)
        batch = self._batches.get(key)
        if batch is None:
            try:
                batch = open_ipc(block.path, self.storage).get_batch(block.start)
                # A damaged file can hold offsets that point outside the memory map: reading
                # them would crash the process (SIGBUS, SIGSEGV), so every batch is checked first.
                batch.validate(full=True)
            except (OSError, pa.ArrowException) as exc:
                raise SourceError(f"cannot read record batch {block.start} ({exc}); is the file truncated?", path=block.path) from None
            batch = batch.select(self.schema().names)
            if not storage.is_remote(block.path):
                self._batches[key] = batch
        return batch

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_batches"] = {}  # views of this process's memory maps
        return state

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        schema = self.schema()
        piece = self._batch(block).slice(self._offset(block) + lo, hi - lo)
        table, no_bytes = resolve_media(pa.Table.from_batches([piece]), block.path, self.storage, block.first_line + lo,
                                        self.on_bad_rows == "skip", self.media)
        table = cast_to_schema(table, schema, f"record batch {block.start}", block.path)
        table, bad = check_no_nulls(table, block, lo, self.on_bad_rows, no_bytes)
        return BlockData(table_to_columns(table), bad)

    def _offset(self, block: Block) -> int:
        """Where ``block`` starts in its record batch (0 unless the batch is sliced)."""
        if block.path not in self._batch_first_row:
            self.blocks()
        return block.first_line - self._batch_first_row[block.path][block.start]

    def _group_table(self, parts: list[GroupPart], use_threads: bool) -> pa.Table | None:
        """The group as one table of zero-copy slices of its (memory-mapped, checked) batches."""
        try:
            table = pa.Table.from_batches([self._batch(block).slice(self._offset(block) + lo, hi - lo)
                                           for block, lo, hi, _ in parts])
        except SourceError:
            return None
        if any(is_media_struct(t) for t in table.schema.types):
            if len({b.path for b, _, _, _ in parts}) > 1:
                return None  # read one by one: each file's relative paths are its own
            table, no_bytes = resolve_media(table, parts[0][0].path, self.storage, 0, True, self.media)
            if no_bytes:
                return None  # read one by one: that path names the row or skips it
        return table


def sliced_blocks(blocks: list[Block], step: int | None) -> list[Block]:
    """Record batches of more than ``step`` rows cut into near-equal slices of at most ``step``.

    NOTE [ Record batch slices ]
    A block shuffle mixes no better than its blocks are many: writers put 64 Ki to 1 Mi rows in
    a record batch, so a file has tens of batches, and the correlation of a row's place in the
    epoch with its place in the file stays about ``1/sqrt(blocks)`` whatever the buffer. A
    memory-mapped batch is sliced without copying or decoding, so a slice costs what a small
    batch costs, and big batches become many blocks (the same 1/4096 of the file as ``.npy``
    row ranges). A remote batch is one range read of its body, so remote files keep whole
    batches unless ``block_rows`` asks otherwise.
    """
    if not step:
        return blocks
    out = []
    for b in blocks:
        pieces = -(-b.rows // step)
        if pieces <= 1:
            out.append(b)
            continue
        edges = np.linspace(0, b.rows, pieces + 1).astype(np.int64).tolist()
        out += [Block(b.path, b.start, b.stop, hi - lo, b.first_line + lo) for lo, hi in zip(edges, edges[1:])]
    return out


read_arrow = ArrowSource
