"""Row counts of an Arrow IPC file's record batches without reading their bodies.

PyArrow's reader only gives a batch's row count with the batch itself (its body), which for a
remote object means downloading the file to cut it into blocks. The counts are in metadata:
the file's footer lists every batch's (offset, metadata length, body length), and each batch's
metadata message holds its row count. Both are flatbuffers, read here with a few lines of
struct unpacking (the layout is fixed by the Arrow IPC format's ``File.fbs``/``Message.fbs``).
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

from naiad.errors import SourceError
from naiad.sources import storage

__all__ = ["ipc_batch_rows"]

_MAGIC = b"ARROW1"
_RECORD_BATCH = 3  # MessageHeader union: NONE, Schema, DictionaryBatch, RecordBatch, ...


def _table_field(buf: bytes, table: int, field: int) -> int | None:
    """The absolute position of ``field`` of the flatbuffer table at ``table``, or None if absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    vt_size = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * field
    if slot + 2 > vt_size:
        return None
    off = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + off if off else None


def _deref(buf: bytes, pos: int) -> int:
    return pos + struct.unpack_from("<I", buf, pos)[0]


def footer_blocks(footer: bytes) -> list[tuple[int, int]]:
    """(offset, metadata length) of every record batch listed in an IPC file's footer."""
    root = _deref(footer, 0)
    pos = _table_field(footer, root, 3)  # Footer.recordBatches: [Block]
    if pos is None:
        return []
    vec = _deref(footer, pos)
    n = struct.unpack_from("<I", footer, vec)[0]
    # struct Block { offset: long; metaDataLength: int; (4 bytes padding) bodyLength: long }
    return [struct.unpack_from("<qi", footer, vec + 4 + 24 * i) for i in range(n)]


def message_rows(meta: bytes) -> int:
    """The row count in one record batch's encapsulated metadata message."""
    start = 8 if meta[:4] == b"\xff\xff\xff\xff" else 4  # continuation marker, then int32 size
    fb = meta[start:]
    root = _deref(fb, 0)
    kind = _table_field(fb, root, 1)  # Message.header_type
    if kind is None or fb[kind] != _RECORD_BATCH:
        raise ValueError("a listed record batch is not a record batch message")
    header = _table_field(fb, root, 2)  # Message.header
    if header is None:
        return 0
    length = _table_field(fb, _deref(fb, header), 0)  # RecordBatch.length
    return 0 if length is None else int(struct.unpack_from("<q", fb, length)[0])


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
