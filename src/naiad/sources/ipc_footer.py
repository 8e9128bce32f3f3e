"""Row counts of an Arrow IPC file's record batches without reading their bodies.

PyArrow's reader only gives a batch's row count with the batch itself (its body), which for a
remote object means downloading the file to cut it into blocks. The counts are in metadata:
the file's footer lists every batch's (offset, metadata length, body length), and each batch's
metadata message holds its row count. Both are flatbuffers, read here with a few lines of
struct unpacking (the layout is fixed by the Arrow IPC format's ``File.fbs``/``Message.fbs``).
The same reading of a message's metadata walks a stream file's headers (sources/ipc_stream.py).
Every position is checked to lie inside the bytes read, so damaged metadata is a ValueError (a
SourceError from the callers), never a read of other bytes.
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

from naiad.errors import SourceError
from naiad.sources import storage

__all__ = ["RECORD_BATCH", "SCHEMA", "DICTIONARY_BATCH", "ipc_batch_rows", "message_header"]

_MAGIC = b"ARROW1"
# The MessageHeader union's kinds: NONE, Schema, DictionaryBatch, RecordBatch, Tensor, SparseTensor.
SCHEMA, DICTIONARY_BATCH, RECORD_BATCH = 1, 2, 3


def _unpack(fmt: str, buf: bytes, pos: int) -> int:
    """One value at ``pos``, which must lie inside ``buf`` (``struct`` counts a negative
    position from the end: a damaged offset would read other bytes)."""
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError(f"a flatbuffer offset ({pos}) points outside its {len(buf)} bytes")
    return int(struct.unpack_from(fmt, buf, pos)[0])


def _table_field(buf: bytes, table: int, field: int) -> int | None:
    """The absolute position of ``field`` of the flatbuffer table at ``table``, or None if absent."""
    vtable = table - _unpack("<i", buf, table)
    vt_size = _unpack("<H", buf, vtable)
    slot = 4 + 2 * field
    if slot + 2 > vt_size:
        return None
    off = _unpack("<H", buf, vtable + slot)
    return table + off if off else None


def _deref(buf: bytes, pos: int) -> int:
    return pos + _unpack("<I", buf, pos)


def footer_blocks(footer: bytes) -> list[tuple[int, int]]:
    """(offset, metadata length) of every record batch listed in an IPC file's footer."""
    root = _deref(footer, 0)
    pos = _table_field(footer, root, 3)  # Footer.recordBatches: [Block]
    if pos is None:
        return []
    vec = _deref(footer, pos)
    n = _unpack("<I", footer, vec)
    if vec + 4 + 24 * n > len(footer):
        raise ValueError(f"the footer lists {n} record batches, more than its {len(footer)} bytes hold")
    # struct Block { offset: long; metaDataLength: int; (4 bytes padding) bodyLength: long }
    return [struct.unpack_from("<qi", footer, vec + 4 + 24 * i) for i in range(n)]


def message_header(fb: bytes) -> tuple[int, int, int]:
    """(kind, body length, rows) of one message's flatbuffer metadata (without its prefix): the
    kind is the MessageHeader union's (:data:`SCHEMA`, :data:`RECORD_BATCH`...), rows a record
    batch's (else 0).

    Raises:
        ValueError: an offset outside the metadata.
    """
    root = _deref(fb, 0)
    at = _table_field(fb, root, 1)  # Message.header_type
    kind = 0 if at is None else _unpack("<B", fb, at)
    at = _table_field(fb, root, 3)  # Message.bodyLength
    body = 0 if at is None else _unpack("<q", fb, at)
    rows = 0
    header = _table_field(fb, root, 2)  # Message.header
    if kind == RECORD_BATCH and header is not None:
        at = _table_field(fb, _deref(fb, header), 0)  # RecordBatch.length
        rows = 0 if at is None else _unpack("<q", fb, at)
    return kind, body, rows


def message_rows(meta: bytes) -> int:
    """The row count in one record batch's encapsulated metadata message."""
    start = 8 if meta[:4] == b"\xff\xff\xff\xff" else 4  # continuation marker, then int32 size
    kind, _, rows = message_header(meta[start:])
    if kind != RECORD_BATCH:
        raise ValueError("a listed record batch is not a record batch message")
    return rows


def ipc_batch_rows(path: str, store: storage.Storage | None = None) -> list[int]:
    """Rows of each record batch of an Arrow IPC file (local, or remote through ``store``, its
    source's Storage): footer and metadata only.

    Raises:
        SourceError: not an IPC file (the stream format has no footer), or a damaged one.
    """
    size = storage.size(path, store=store)
    tail = storage.read_range(path, max(0, size - 10), size, store=store)
    if size < 18 or tail[-6:] != _MAGIC:
        raise SourceError("not an Arrow IPC file (no ARROW1 footer): is it in the stream format?", path=path)
    footer_len = struct.unpack_from("<i", tail, 0)[0]
    if not 0 < footer_len <= size - 18:
        raise SourceError(f"damaged Arrow IPC footer (length {footer_len}).", path=path)
    try:
        blocks = footer_blocks(storage.read_range(path, size - 10 - footer_len, size - 10, store=store))
        # One small request per batch, several at once: latency, not bandwidth, is their cost.
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(blocks)))) as pool:
            metas = list(pool.map(lambda b: storage.read_range(path, b[0], b[0] + b[1], store=store), blocks))
        return [message_rows(m) for m in metas]
    except (struct.error, ValueError, IndexError) as exc:
        raise SourceError(f"damaged Arrow IPC metadata ({exc}).", path=path) from None
