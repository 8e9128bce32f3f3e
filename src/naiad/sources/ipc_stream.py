"""Arrow IPC *stream* files: where each record batch lies and how many rows it holds, from one walk
of the message headers, kept in the index folder; a record batch read alone at its offset.

NOTE [ Stream walk ]
The IPC file format ends with a footer that lists its record batches (sources/ipc_footer.py); the
stream format, which Hugging Face ``datasets`` writes for its cache files and ``save_to_disk``
shards (``data-00000-of-00001.arrow``), has none: it is a schema message, then messages one
after another, each an 8-byte prefix (``0xFFFFFFFF``, then the metadata's length; before Arrow
0.15 the length alone), the flatbuffer metadata and the body, whose length the metadata gives.
So a stream is cut into blocks by walking its headers once: read a message's prefix and
metadata, note its offset, length and (for a record batch) its rows, and jump over its body. No
body is read, so a remote file costs one small range read per record batch and a local one a
``pread`` each (a 64 KiB window covers several small messages at once).

The walk's result is a few integers a batch, kept as an ``.npz`` of plain arrays in the index
folder like the other indexes (NOTE [ Block index ] in index.py: keyed by the file's path and
checked against its size and modification time or ETag), so a new process, every rank and a
resume skip the walk. The file is untrusted and so is a kept index: every length is checked
against the file's size before anything is read or allocated (a message's metadata at most
``MAX_METADATA_BYTES``), a kept index is used only when its messages lie in order inside the
file, and a batch read later must hold the rows its index says, or it is a SourceError naming
the file and the batch. Dictionary batches are refused: a record batch of a dictionary-encoded
column cannot be read alone (``datasets`` writes none).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.columnar import ReaderCache
from naiad.sources.index import IndexDir, load_arrays, save_arrays
from naiad.sources.ipc_footer import DICTIONARY_BATCH, RECORD_BATCH, SCHEMA, message_header
from naiad.trust.kept import miss

__all__ = ["MAX_METADATA_BYTES", "StreamFile", "is_stream_file", "open_stream_file", "walk_stream"]

MAX_METADATA_BYTES = 64 << 20
"""The largest metadata of one message a walk reads (a schema of a million columns is ~100 MB;
``datasets`` writes a few hundred bytes)."""

_WINDOW = 64 << 10  # one read at a message's start: its prefix and metadata, and small messages after it
_INDEX_PARAMS = {"ipc_stream": 1}


class StreamFile:
    """One stream file's schema and record batches, read as a ``pyarrow.ipc`` file reader reads a
    file's: ``schema``, ``num_record_batches``, ``get_batch(i)`` (NOTE [ Stream walk ]).

    Plain data (arrays and a schema), so it travels with its source into the workers.

    Attributes:
        path: the file or object.
        schema: the stream's own schema (every column).
        offsets, lengths, rows: per record batch, its message's first byte, its length (prefix,
            metadata and body) and its rows.
    """

    def __init__(self, path: str, schema: pa.Schema, offsets: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> None:
        self.path = path
        self.schema = schema
        self.offsets, self.lengths, self.rows = offsets, lengths, rows

    @property
    def num_record_batches(self) -> int:
        """The record batches of the stream."""
        return len(self.offsets)

    def get_batch(self, i: int, store: storage.Storage | None = None) -> pa.RecordBatch:
        """Record batch ``i``, read alone: a view of this thread's memory map of a local file, one
        range read of an object through ``store`` (its source's Storage).

        Raises:
            SourceError: the batch is not where the index says, or holds other rows.
        """
        off, n = int(self.offsets[i]), int(self.lengths[i])
        if storage.is_remote(self.path):
            buf = pa.py_buffer(storage.read_range(self.path, off, off + n, store=store))
        else:
            whole = _MAPS.get(self.path)
            if off + n > whole.size:
                raise SourceError(f"record batch {i} ends at byte {off + n:,}, past the file's end ({whole.size:,}): "
                                  "was the file truncated?", path=self.path)
            buf = whole.slice(off, n)
        if buf.size != n:
            raise SourceError(f"record batch {i}: {buf.size:,} bytes read of {n:,}; was the file truncated?", path=self.path)
        message = pa.ipc.read_message(buf)
        if message.type != "record batch":
            raise SourceError(f"message {i} is a {message.type}, not a record batch: the file changed since it was "
                              "indexed?", path=self.path)
        batch = pa.ipc.read_record_batch(message, self.schema)
        if batch.num_rows != int(self.rows[i]):
            raise SourceError(f"record batch {i} holds {batch.num_rows} rows, its index {int(self.rows[i])}: the "
                              "file changed since it was indexed?", path=self.path)
        return batch

    def __repr__(self) -> str:
        return f"StreamFile({self.path!r}, {self.num_record_batches} record batches)"


def _map_whole(path: str, store: storage.Storage | None) -> pa.Buffer:
    # The whole file as one zero-copy buffer: a batch is a slice of it, with no seek to share.
    return pa.memory_map(path, "r").read_buffer()


_MAPS = ReaderCache(_map_whole, "Arrow IPC stream file", "is it truncated?")


def is_stream_file(path: str, store: storage.Storage | None = None) -> bool:
    """Whether ``path`` is not in the IPC *file* format (which starts with ``ARROW1``): a stream,
    or something else, which its walk names."""
    return storage.read_range(path, 0, 6, store=store) != b"ARROW1"


class _Window:
    """Bytes of a file read through one window at a time (NOTE [ Stream walk ])."""

    def __init__(self, path: str, store: storage.Storage | None, size: int) -> None:
        self.path, self.store, self.size = path, store, size
        self.start, self.data = 0, b""

    def read(self, pos: int, n: int) -> bytes:
        if not (self.start <= pos and pos + n <= self.start + len(self.data)):
            self.start = pos
            self.data = storage.read_range(self.path, pos, min(self.size, pos + max(n, _WINDOW)), store=self.store)
        return self.data[pos - self.start:pos - self.start + n]


def _message(window: _Window, pos: int) -> tuple[int, int, int, int, int] | None:
    """(kind, prefix length, metadata length, body length, rows) of the message at ``pos``, or
    None at the end of the stream (its end marker, or the end of the file)."""
    prefix = window.read(pos, 8)
    if not prefix:
        return None
    if len(prefix) < 4:
        raise ValueError(f"{len(prefix)} stray bytes at byte {pos:,}")
    marker = struct.unpack_from("<i", prefix, 0)[0]
    head = 4
    if marker == -1:  # the continuation marker, then the length
        if len(prefix) < 8:
            raise ValueError(f"a message prefix cut short at byte {pos:,}")
        marker, head = struct.unpack_from("<i", prefix, 4)[0], 8
    if marker == 0:
        return None
    if not 0 < marker <= min(MAX_METADATA_BYTES, window.size - pos - head):
        raise ValueError(f"the message at byte {pos:,} claims {marker:,} bytes of metadata")
    kind, body, rows = message_header(window.read(pos + head, marker))
    if body < 0 or pos + head + marker + body > window.size or rows < 0:
        raise ValueError(f"the message at byte {pos:,} claims a body of {body:,} bytes ({rows} rows) past the "
                         f"file's end ({window.size:,} bytes)")
    return kind, head, marker, body, rows


def walk_stream(path: str, store: storage.Storage | None = None) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """One walk of a stream file's message headers (NOTE [ Stream walk ]): the schema message's
    length, and per record batch its offset, its message's length and its rows (int64 arrays).

    Raises:
        SourceError: not an Arrow IPC stream, a damaged one, or one with dictionary batches.
    """
    size = storage.size(path, store=store)
    window = _Window(path, store, size)
    offsets: list[int] = []
    lengths: list[int] = []
    rows: list[int] = []
    schema_len, pos = 0, 0
    try:
        while pos < size:
            found = _message(window, pos)
            if found is None:
                break
            kind, head, meta, body, n = found
            end = pos + head + meta + body
            if pos == 0 and kind != SCHEMA:
                raise ValueError("it does not start with a schema message")
            if pos == 0:
                schema_len = end
            elif kind == RECORD_BATCH:
                offsets.append(pos)
                lengths.append(end - pos)
                rows.append(n)
            elif kind == DICTIONARY_BATCH:
                raise SourceError("a dictionary-encoded column: its record batches cannot be read one by one from "
                                  "the stream format; write the table as an IPC file (pyarrow.ipc.new_file) or "
                                  "Parquet.", path=path)
            else:
                raise ValueError(f"the message at byte {pos:,} is of kind {kind}, not a record batch")
            pos = end
    except (ValueError, struct.error) as exc:
        what = "not an Arrow IPC file or stream" if pos == 0 else "a damaged Arrow IPC stream"
        raise SourceError(f"{what} ({exc}).", path=path) from None
    if schema_len == 0:
        raise SourceError("not an Arrow IPC file or stream (it is empty).", path=path)
    return schema_len, np.array(offsets, np.int64), np.array(lengths, np.int64), np.array(rows, np.int64)


def _checked(arrays: dict[str, Any], size: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
    """A kept walk's arrays if they describe messages in order inside a file of ``size`` bytes."""
    try:
        schema_len = int(arrays["schema"])
        offsets, lengths, rows = (arrays[k] for k in ("offsets", "lengths", "rows"))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(isinstance(a, np.ndarray) and a.dtype == np.int64 and a.ndim == 1 and len(a) == len(offsets)
               for a in (offsets, lengths, rows)):
        return None
    ends = offsets + lengths
    starts = np.concatenate([np.array([schema_len], np.int64), ends])[:len(offsets)]  # each where the last ends
    if not (0 < schema_len <= size and np.array_equal(offsets, starts) and np.all(lengths >= 8)
            and np.all(ends <= size) and np.all(rows >= 0)):
        return None
    return schema_len, offsets, lengths, rows


def _schema(path: str, schema_len: int, store: storage.Storage | None) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(storage.read_range(path, 0, schema_len, store=store)))
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"not a readable Arrow IPC stream: its schema ({exc}).", path=path) from None


def open_stream_file(path: str, store: storage.Storage | None = None, index_dir: IndexDir = None) -> StreamFile:
    """``path``'s :class:`StreamFile`: its walk kept in ``index_dir`` (as the block index's,
    NOTE [ Block index ]) where it is still the file's, else walked now and kept.

    Raises:
        SourceError: not an Arrow IPC stream, or a damaged one.
    """
    kept = load_arrays(index_dir, path, _INDEX_PARAMS, store)
    walk = None if kept is None else _checked(kept, int(kept["__size__"]))
    if kept is not None and walk is None:
        miss(path, "it is not a plausible walk of the file", what="the kept record batch index of")
    if walk is None:
        walk = walk_stream(path, store)
        schema_len, offsets, lengths, rows = walk
        save_arrays(index_dir, path, _INDEX_PARAMS,
                    {"schema": np.array(schema_len, np.int64), "offsets": offsets, "lengths": lengths, "rows": rows}, store)
    schema_len, offsets, lengths, rows = walk
    return StreamFile(path, _schema(path, schema_len, store), offsets, lengths, rows)
