"""Arrow IPC files (Feather v2) and streams: blocks are record batches, or slices of big ones,
memory-mapped."""

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
    missing_columns,
    missing_reason,
    null_rows,
    resolve_dtypes,
    select_columns,
    table_to_columns,
)
from naiad.sources.contract import (
    Block,
    BlockData,
    GroupPart,
    SourceTraits,
    bad_entry,
    default_block_rows,
)
from naiad.sources.index import IndexDir, check_index_dir
from naiad.sources.ipc_footer import ipc_batch_rows
from naiad.sources.ipc_stream import StreamFile, is_stream_file, open_stream_file
from naiad.sources.media import (
    has_variable_rows,
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


_READERS = ReaderCache(_open, "Arrow IPC file", "is it truncated?")


def open_ipc(path: str, store: Storage | None = None) -> pa.ipc.RecordBatchFileReader:
    """A cached, memory-mapped IPC file reader (per thread; an object's read through ``store``,
    its source's Storage), or a SourceError."""
    return _READERS.get(path, store)


class ArrowSource(Source):
    """A lazy source over Arrow IPC files, in the *file* format (Feather v2) or the *stream*
    format (what Hugging Face ``datasets`` writes: its cache files, ``save_to_disk`` shards); a
    block is a record batch, or a slice of a big one: ``naiad.read_arrow``.

    Files are memory-mapped, so reading a block copies only the rows a batch needs. A stream has
    no footer listing its batches: one walk of its message headers finds them (no body read),
    kept in the index folder (NOTE [ Stream walk ] in sources/ipc_stream.py). Binary columns and
    ``{bytes, path}`` media structs read as in :class:`ParquetSource`.

    Args:
        paths, columns, dtypes, storage, media, index_dir: as every reader takes them
            (:class:`~naiad.Source`); ``index_dir`` keeps the walks of stream files.
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
        index_dir: IndexDir = None,
        **deprecated: Any,
    ) -> None:
        super().__init__(paths, on_bad_rows=on_bad_rows, storage=storage, deprecated=deprecated)
        self.index_dir = check_index_dir(index_dir)
        # Per file, its StreamFile (the stream format), or None (the file format): plain data,
        # so the workers' copies read without walking again.
        self._streams: dict[str, StreamFile | None] = {}
        self._starts: tuple[np.ndarray, ...] | None = None  # _batch_starts(), once
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

    def _stream(self, path: str) -> StreamFile | None:
        """``path``'s StreamFile when it is in the stream format (walked, or its walk kept), else
        None: a file-format file, read through :func:`open_ipc`."""
        if path not in self._streams:
            try:
                stream = is_stream_file(path, self.storage)
            except FileNotFoundError:
                raise SourceError("file not found.", path=path) from None
            except OSError as exc:
                raise SourceError(f"cannot read the file ({exc}).", path=path) from None
            self._streams[path] = open_stream_file(path, self.storage, self.index_dir) if stream else None
        return self._streams[path]

    def file_schema(self, path: str) -> pa.Schema:
        """The schema of one of the source's files, as stored (every column, its own types)."""
        stream = self._stream(path)
        return open_ipc(path, self.storage).schema if stream is None else stream.schema

    def _read_schema(self) -> pa.Schema:
        schema = media_schema(select_columns(self.file_schema(self.paths[0]), self._selected, self.paths[0]))
        return apply_dtypes(schema, resolve_dtypes(self._dtypes_arg, schema.names))

    def sample_bytes(self) -> int | None:
        """With a column of bytes or a ragged one (``has_variable_rows``), the first file's bytes
        per row; else None."""
        path = self.paths[0]
        if not has_variable_rows(self.file_schema(path)):
            return None
        stream = self._stream(path)
        if stream is not None:
            rows = int(stream.rows.sum())
        elif storage.is_remote(path):
            rows = sum(ipc_batch_rows(path, self.storage))
        else:
            reader = open_ipc(path, self.storage)
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        return max(1, storage.size(path, store=self.storage) // max(rows, 1))

    def _file_blocks(self, path: str) -> list[Block]:
        check_columns_present(self.schema().names, self.file_schema(path).names, path, self.paths[0])
        stream = self._stream(path)
        if stream is not None:
            # The walk's counts (NOTE [ Stream walk ]); a local stream is sliced as a local file.
            counts = stream.rows.tolist()
            step = self.block_rows
            if step is None and not storage.is_remote(path):
                step = default_block_rows(sum(counts), os.path.getsize(path), self.local_bytes())
        elif storage.is_remote(path):
            # Fetching each batch to count its rows would download the file: read the counts
            # from the footer and each batch's metadata instead.
            counts = ipc_batch_rows(path, self.storage)
            step = self.block_rows
        else:
            # Memory-mapped: reading a batch's header touches no column data.
            reader = open_ipc(path, self.storage)
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
                stream = self._stream(block.path)
                batch = (open_ipc(block.path, self.storage).get_batch(block.start) if stream is None
                         else stream.get_batch(block.start, self.storage))
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
        state["_starts"] = None  # made again from _batch_first_row, which travels
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

    # -- rows by their number in the source: what a source of a mapping of these reads ---------

    def _batch_starts(self) -> tuple[np.ndarray, ...]:
        """(each record batch's first row in the source, its file's number, its number in the
        file, each file's first row): from the counts made once, which travel to the workers."""
        if self._starts is None:
            if any(p not in self._batch_first_row for p in self.paths):
                self.blocks()
            per_file = [np.asarray(self._batch_first_row[p], np.int64) for p in self.paths]
            file_starts = np.concatenate([[0], np.cumsum([f[-1] for f in per_file])]).astype(np.int64)
            self._starts = (
                np.concatenate([f[:-1] + s for f, s in zip(per_file, file_starts.tolist())]),
                np.concatenate([np.full(len(f) - 1, k, np.int64) for k, f in enumerate(per_file)]),
                np.concatenate([np.arange(len(f) - 1, dtype=np.int64) for f in per_file]),
                file_starts,
            )
        return self._starts

    def read_positions(self, rows: np.ndarray, *, use_threads: bool = False) -> BlockData:
        """The rows numbered ``rows`` across the files in order (any order, repeats allowed), as
        one read: each file's record batches viewed together and taken from at once (a run of
        consecutive rows is a slice: no copy), media resolved and bad rows skipped or raised as
        a block's read does, each named by its file and its row there. What a source whose rows
        are a mapping of these reads through (``naiad.read_hf`` over an indices mapping).

        Raises:
            SourceError: naming the file, the row and the problem.
        """
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return BlockData(self.empty_columns())
        starts, files, numbers, file_starts = self._batch_starts()
        if rows.min() < 0 or rows.max() >= file_starts[-1]:
            raise ConfigError(f"rows must be within 0:{int(file_starts[-1])}, got {int(rows.min())}..{int(rows.max())}.")
        at = np.searchsorted(starts, rows, "right") - 1  # each row's record batch (empty ones never)
        file_of = files[at]
        pieces: list[pa.Table] = []
        order: list[np.ndarray] = []
        no_bytes: dict[int, tuple[str, str]] = {}
        for f in np.unique(file_of).tolist():
            sel = np.flatnonzero(file_of == f) if files[-1] != files[0] else np.arange(len(rows))
            path = self.paths[f]
            used, inverse = np.unique(at[sel], return_inverse=True)
            batches = [self._batch(Block(path, int(numbers[g]), int(numbers[g]) + 1, 0, int(starts[g] - file_starts[f])))
                       for g in used.tolist()]
            first = np.concatenate([[0], np.cumsum([b.num_rows for b in batches])[:-1]]).astype(np.int64)
            local = first[inverse] + rows[sel] - starts[at[sel]]
            table = pa.Table.from_batches(batches)
            if np.all(np.diff(local) == 1):
                table = table.slice(int(local[0]), len(local))
            else:
                table = table.take(pa.array(local))
            table, missing = resolve_media(table, path, self.storage, 0, True, self.media)
            no_bytes.update({int(sel[r]): v for r, v in missing.items()})
            pieces.append(cast_to_schema(table, self.schema(), "record batches", path))
            order.append(sel)
        table = pieces[0]
        if len(pieces) > 1:  # the files' rows in the order asked
            table = pa.concat_tables(pieces).take(pa.array(np.argsort(np.concatenate(order), kind="stable")))
        return self._positions_checked(table, rows, file_of, file_starts, no_bytes)

    def _positions_checked(self, table: pa.Table, rows: np.ndarray, file_of: np.ndarray, file_starts: np.ndarray,
                           no_bytes: dict[int, tuple[str, str]]) -> BlockData:
        """``table`` less its bad rows (a null in an integer column, a media struct with no
        bytes), each raised or kept as an entry naming its file and its row there."""
        bad = np.union1d(null_rows(table), np.fromiter(no_bytes, np.int64, count=len(no_bytes)))
        if not bad.size:
            return BlockData(table_to_columns(table), ())
        names = missing_columns(table)
        entries = []
        for i in bad.tolist():
            path, row = self.paths[file_of[i]], int(rows[i] - file_starts[file_of[i]])
            column, reason = no_bytes.get(i) or (names[i], missing_reason(names[i], table.schema.field(names[i]).type))
            if self.on_bad_rows == "raise":
                raise SourceError(f"row {row}: {reason}; pass on_bad_rows='skip' to skip such rows.", path=path, column=column)
            entries.append(bad_entry(i, path, reason, row=row, column=column))
        keep = np.ones(table.num_rows, bool)
        keep[bad] = False
        return BlockData(table_to_columns(table.filter(pa.array(keep))), tuple(entries))


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
