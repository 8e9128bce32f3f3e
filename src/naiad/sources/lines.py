"""Line-oriented files (CSV, JSONL, text): cutting into byte-range blocks, and reading them.

NOTE [ Byte-range blocks ]
A text file is cut into blocks of about ``block_bytes`` that end just after a newline, so every
block holds whole lines and can be parsed on its own. The cut and the row count of every block
come from one scan of the file before the first epoch (NOTE [ Newline scan ] in scan.py),
kept in the block index for the next process (NOTE [ Block index ]). This is why a
newline inside a quoted CSV value is unsupported unless the reader is told about it
(``newlines_in_values=True``), in which case each file is a single block.

Compressed files (gzip, zstd, bz2, lz4) cannot be entered in the middle, so each is one block;
its rows are counted by decompressing it once.
(Bad-row isolation: NOTE [ Bad rows ] in badlines.py.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypedDict

import numpy as np
import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.contract import Block, BlockData, GroupPart
from naiad.sources.index import IndexDir, load_index, save_index
from naiad.sources.readahead import io_map
from naiad.sources.scan import early_cut, header_end, scan_plain, span_rows
from naiad.sources.storage import Storage

__all__ = [
    "CutArgs", "LineBlocks", "block_bytes_for", "default_block_bytes", "detect_compression", "early_file_cut", "early_rows", "parse_group_lines", "parse_selected_lines", "read_block_bytes", "read_selected_lines", "row_spans", "scan_file", "select_rows", "slice_rows",
]

_COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".lz4": "lz4"}


class CutArgs(TypedDict):
    """How a line-based source cuts one file (the arguments of :func:`scan_file`)."""

    block_bytes: int
    header_lines: int
    compression: str | None
    keep_blank: bool
    whole: bool
    index_dir: IndexDir


class LineBlocks:
    """The blocks of a line-based source (CSV, JSON Lines, text), which says how it cuts a file
    (``_cut_args``): by the newline scan, or before the rows are counted for the reads that
    start beside it (NOTE [ Early reads ] in naiad/stream/early.py)."""

    storage: Storage  # the Source's: how its objects are read (NOTE [ Remote files in workers ])

    def _cut_args(self, path: str) -> CutArgs:
        raise NotImplementedError

    def _file_blocks(self, path: str) -> list[Block]:
        return scan_file(path, **self._cut_args(path), store=self.storage)

    def _early_cut(self, path: str) -> list[Block] | None:
        return early_file_cut(path, **self._cut_args(path))

    def early_rows(self, block: Block) -> int:
        """The rows of a block of ``early_blocks()``, counted alone as the scan counts them."""
        return early_rows(block, self._cut_args(block.path)["keep_blank"])


def detect_compression(path: str, compression: str | None) -> str | None:
    """The codec for ``path``: ``compression`` if given, else from the extension ("infer")."""
    if compression != "infer":
        return compression
    return _COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def _decompress(path: str, codec: str, store: Storage | None) -> bytes:
    try:
        with storage.input_stream(path, compression=codec, store=store) as stream:
            return bytes(stream.read())
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"cannot decompress ({codec}): {exc}; is the file truncated?", path=path) from None


def default_block_bytes(paths: Sequence[str], store: Storage | None = None) -> int:
    """About 1/4096 of the bytes of ``paths`` together, between 64 KiB and 4 MiB.

    Blocks are what the epoch permutation shuffles: the more there are, the less a row's place
    in the epoch says about its place in the files (the correlation of the two falls as one over
    the square root of the count: about 0.015 for 4,096 blocks). It is the source's count that
    matters, not a file's: eight files of 250 MB cut at 1/4096 each made 31,000 blocks, and a
    plan of 90-160 ms an epoch, where the same 2 GB in one file makes 3,900. Small blocks cost
    little since consecutive reads are parsed together (NOTE [ Read groups ] in plan.py); below
    64 KiB the scan and the plan would hold more blocks than they are worth. Objects are
    sized through ``store``, their source's Storage.
    """
    size = 0
    for path in paths:
        try:
            size += storage.size(path, store=store)
        except OSError:
            pass
    return _block_of(size)


def _block_of(source_bytes: int) -> int:
    return int(min(4 << 20, max(64 << 10, source_bytes // 4096)))


def block_bytes_for(path: str, block_bytes: int | None, source_bytes: int | None, store: Storage | None = None) -> int:
    """The block size to cut ``path`` into: ``block_bytes`` if given, else about 1/4096 of the
    source's bytes (``source_bytes``, its local files together: ``Source.local_bytes``), or of
    the file alone when that is None (a remote file's size may cost a request, and a source of
    many shards would pay one per shard first), between 64 KiB and 4 MiB."""
    if block_bytes:
        return block_bytes
    return default_block_bytes([path], store) if source_bytes is None else _block_of(source_bytes)


def count_rows(buf: bytes | memoryview, keep_blank: bool) -> int:
    """Rows in ``buf``: its lines, less blank ones unless ``keep_blank`` (text samples)."""
    data = bytes(buf)
    n = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if keep_blank or not (
        data.startswith((b"\n", b"\r\n")) or data in (b"\r",) or data.endswith(b"\n\r") or b"\n\n" in data or b"\n\r\n" in data
    ):
        return n
    return len(row_spans(data, keep_blank)[0])


def row_spans(buf: bytes, keep_blank: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte start, byte end (newline excluded) and 0-based line number of every row in ``buf``."""
    arr = np.frombuffer(buf, np.uint8)
    nl = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(buf)]))
    if len(buf) == 0 or buf[-1:] == b"\n":
        starts, ends = starts[:-1], ends[:-1]  # nothing after the final newline
    lines = np.arange(len(starts))
    if not keep_blank and len(starts):
        length = ends - starts
        cr = (length > 0) & (arr[np.maximum(ends - 1, 0)] == 13)
        keep = (length - cr) > 0
        starts, ends, lines = starts[keep], ends[keep], lines[keep]
    return starts, ends, lines


def scan_file(
    path: str, *, block_bytes: int, header_lines: int, compression: str | None, keep_blank: bool, whole: bool,
    index_dir: IndexDir = False, store: Storage | None = None,
) -> list[Block]:
    """Cut ``path`` into blocks of whole lines of about ``block_bytes``, counting rows.

    Args:
        header_lines: lines at the top that are not rows (1 for a CSV header).
        compression: the codec (None: plain); a compressed file is one block.
        keep_blank: count blank lines as rows (text) or not (CSV, JSONL: the parsers skip them).
        whole: one block per file (quoted newlines allowed).
        index_dir: where the cut is persisted and looked up (NOTE [ Block index ]); False: never.
        store: the source's Storage, through which an object is read (a local file needs none).
    """
    codec = detect_compression(path, compression)
    if codec is not None or whole:
        if codec is not None:
            data = _decompress(path, codec, store)
        else:
            data = storage.read_range(path, 0, -1, store=store)
        start = header_end(data, header_lines, path) if header_lines else 0
        return [Block(path, start, -1, count_rows(memoryview(data)[start:], keep_blank), 1 + header_lines)]
    params = _cut_params(block_bytes, header_lines, keep_blank)
    entries = load_index(index_dir, path, params, store)
    if entries is not None and not _cut_holds(path, entries, block_bytes, header_lines, keep_blank, store):
        entries = None  # a stale or forged entry: scan again
    if entries is None:
        entries = scan_plain(path, block_bytes, header_lines, keep_blank, store)
        save_index(index_dir, path, params, entries, store)
    return [Block(path, a, b, n, line) for a, b, n, line in entries]


def _cut_params(block_bytes: int, header_lines: int, keep_blank: bool) -> dict[str, object]:
    """What a stored cut is keyed by besides the file (NOTE [ Block index ])."""
    return {"cut": "lines", "block_bytes": block_bytes, "header_lines": header_lines, "keep_blank": keep_blank}


def early_file_cut(
    path: str, *, block_bytes: int, header_lines: int, compression: str | None, keep_blank: bool, whole: bool,
    index_dir: IndexDir = False,
) -> list[Block] | None:
    """The blocks :func:`scan_file` would cut ``path`` into, before their rows are counted (rows
    -1, first line 0), for the reads that start beside the scan (NOTE [ Early reads ] in
    naiad/stream/early.py); None where that does not pay: a compressed or remote file, one block per
    file, or a cut the block index already holds (read in a moment)."""
    if whole or storage.is_remote(path) or detect_compression(path, compression) is not None:
        return None
    if load_index(index_dir, path, _cut_params(block_bytes, header_lines, keep_blank)) is not None:
        return None
    return [Block(path, a, b, -1, 0) for a, b in early_cut(path, block_bytes, header_lines)]


def early_rows(block: Block, keep_blank: bool) -> int:
    """The rows of a block of :func:`early_file_cut`, counted alone as the scan counts them."""
    return span_rows(block.path, block.start, block.stop, keep_blank)


def _cut_holds(path: str, entries: Sequence[tuple[int, int, int, int]], block_bytes: int, header_lines: int,
               keep_blank: bool, store: Storage | None) -> bool:
    """Whether a stored cut of ``path`` starts after its header, every block starts a line (a
    boundary inside a line would split a row in two: one byte read per block), and a block said
    to hold no rows holds none (the plan never reads it, so its count is checked here; any
    other count is checked as the block is parsed)."""
    if storage.is_remote(path):
        return _remote_cut_holds(path, entries, header_lines, keep_blank, storage.needs_store(path, store))
    try:
        with open(path, "rb") as f:
            head = f.read(max(block_bytes, 1 << 16)) if header_lines else b""
            if entries[0][0] != (header_end(head, header_lines, path) if header_lines else 0):
                return False
            for start, stop, rows, _ in entries:
                if start:
                    f.seek(start - 1)
                    if f.read(1) != b"\n":
                        return False
                if rows == 0:
                    f.seek(start)
                    if count_rows(memoryview(f.read(stop - start)), keep_blank):
                        return False
    except (OSError, SourceError):
        return False
    return True


def _remote_cut_holds(path: str, entries: Sequence[tuple[int, int, int, int]], header_lines: int, keep_blank: bool,
                      store: Storage) -> bool:
    """:func:`_cut_holds` for an object, without a request per block: the header (the range a
    CSV reader reads anyway, so a cached one costs nothing) and the blocks said to be empty
    here; that every block ends a line is checked as it is read (:func:`read_block_bytes`)."""
    try:
        if header_lines:
            head = storage.read_range(path, 0, min(store.stat(path).size, 1 << 16), store=store)
            if entries[0][0] != header_end(head, header_lines, path):
                return False
        return not any(rows == 0 and count_rows(storage.read_range(path, start, stop, store=store), keep_blank)
                       for start, stop, rows, _ in entries)
    except (OSError, SourceError):
        return False


def read_block_bytes(block: Block, compression: str | None, store: Storage | None = None) -> bytes:
    """The bytes of ``block`` (decompressing the whole file when it is compressed); an object's
    through ``store``, its source's Storage."""
    codec = detect_compression(block.path, compression)
    try:
        if codec is not None:
            return _decompress(block.path, codec, store)[block.start :]
        data = storage.read_range(block.path, block.start, block.stop, store=store)
        if block.stop < 0:
            return data
    except FileNotFoundError:
        raise SourceError("file not found (was it deleted after the source was made?).", path=block.path) from None
    if len(data) != block.stop - block.start:
        raise SourceError(
            f"expected {block.stop - block.start} bytes at offset {block.start}, read {len(data)}: "
            "the file shrank after it was scanned.",
            path=block.path,
        )
    if data and data[-1:] != b"\n" and storage.is_remote(block.path) and block.stop != storage.size(block.path, store=store):
        # A stored cut of an object is not checked byte by byte when loaded (a request per block).
        raise SourceError(f"the block at bytes {block.start}-{block.stop} ends inside a line: the block index "
                          "does not fit the object; remove it from the index folder.", path=block.path)
    return data


def read_blocks_bytes(blocks: Sequence[Block], compression: str | None, store: Storage | None = None) -> list[bytes]:
    """The bytes of each block, in order; remote ones fetched at once (NOTE [ Remote read-ahead ])."""
    if len(blocks) > 1 and any(storage.is_remote(b.path) for b in blocks):
        return io_map(lambda b: read_block_bytes(b, compression, store), blocks)
    return [read_block_bytes(b, compression, store) for b in blocks]


def slice_rows(buf: bytes, lo: int, hi: int, rows: int, keep_blank: bool) -> tuple[bytes, int]:
    """Bytes of rows ``lo:hi`` of ``buf`` and the 0-based line of the first one."""
    if lo == 0 and hi == rows:
        return buf, 0
    starts, _, lines = row_spans(buf, keep_blank)
    if len(starts) != rows:
        raise SourceError(f"expected {rows} rows in this block, found {len(starts)}: the file changed after it was scanned.")
    if lo == hi:
        return b"", 0
    end = int(starts[hi]) if hi < rows else len(buf)
    return buf[int(starts[lo]) : end], int(lines[lo])


def select_rows(buf: bytes, rows: np.ndarray, total: int, keep_blank: bool) -> tuple[bytes, int]:
    """Bytes of the rows ``rows`` (ascending row numbers of ``buf``), one per line, and the
    0-based line of the first: only these lines are parsed, the rest of the block is just scanned
    for newlines (what an elastic or mid-epoch resume reads: scattered rows of many blocks)."""
    starts, ends, lines = row_spans(buf, keep_blank)
    if len(starts) != total:
        raise SourceError(f"expected {total} rows in this block, found {len(starts)}: the file changed after it was scanned.")
    if len(rows) == 0:
        return b"", 0
    # Each run of consecutive rows is one contiguous byte range (its rows with their newlines):
    # join those slices, found by one vectorized pass; a newline is added after the last row
    # when the block does not end in one. (A byte-level take, a 64-bit index per byte, is 3x slower.)
    src = buf if buf.endswith(b"\n") else buf + b"\n"
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    run_first = rows[np.concatenate(([0], breaks))]
    run_last = rows[np.concatenate((breaks - 1, [len(rows) - 1]))]
    picked = b"".join([src[a:b] for a, b in zip(starts[run_first].tolist(), (ends[run_last] + 1).tolist())])
    return picked, int(lines[rows[0]])


def read_selected_lines(parts: list[tuple[Block, np.ndarray]], compression: str | None, keep_blank: bool,
                        store: Storage | None = None) -> bytes:
    """The selected lines of every part, one buffer of whole lines (for one parse)."""
    bufs = read_blocks_bytes([block for block, _ in parts], compression, store)
    picked = _select_many(bufs, parts, keep_blank)
    if picked is not None:
        return picked
    # Blank lines, or counts that differ from the scan's: block by block, which skips the one
    # and names the other.
    return b"".join(select_rows(buf, rows, block.rows, keep_blank)[0] for buf, (block, rows) in zip(bufs, parts))


def _select_many(bufs: list[bytes], parts: list[tuple[Block, np.ndarray]], keep_blank: bool) -> bytes | None:
    """:func:`select_rows` over many blocks at once, for blocks whose every line is a row (the
    common case: no blank line); None otherwise.

    A resume picks a few rows from each of hundreds of blocks, so what it costs is the blocks'
    newline scan and the steps per block: here one NumPy pass per block finds its newlines,
    and the rows' byte ranges of all the blocks come from a few passes over all their newlines.
    """
    bufs = [b if not b or b.endswith(b"\n") else b + b"\n" for b in bufs]  # a file's last line
    nls = [np.flatnonzero(np.frombuffer(b, np.uint8) == 10) for b in bufs]
    counts = np.fromiter(map(len, nls), np.int64, count=len(nls))
    if not np.array_equal(counts, np.fromiter((block.rows for block, _ in parts), np.int64, count=len(parts))):
        return None
    nl = np.concatenate(nls)
    first = np.cumsum(counts) - counts  # each block's first line among all the lines
    starts = np.empty_like(nl)
    starts[1:] = nl[:-1] + 1
    starts[first[counts > 0]] = 0
    if not keep_blank:
        length = nl - starts
        if np.any(length == 0):
            return None
        one = np.flatnonzero(length == 1)  # a one-byte line: a row, unless it is a lone CR
        if len(one):
            block_of = np.searchsorted(first, one, side="right") - 1
            for b in np.unique(block_of).tolist():
                if np.any(np.frombuffer(bufs[b], np.uint8)[starts[one[block_of == b]]] == 13):
                    return None
    rows = np.concatenate([r for _, r in parts])
    block_id = np.repeat(np.arange(len(parts)), [len(r) for _, r in parts])
    line = first[block_id] + rows
    # Each run of consecutive rows of one block is one byte range (with its newlines).
    breaks = np.flatnonzero((np.diff(line) != 1) | (np.diff(block_id) != 0)) + 1
    run_first = np.concatenate(([0], breaks))
    run_last = np.concatenate((breaks - 1, [len(line) - 1]))
    a, b, which = starts[line[run_first]].tolist(), (nl[line[run_last]] + 1).tolist(), block_id[run_first].tolist()
    return b"".join([bufs[i][x:y] for i, x, y in zip(which, a, b)])


def parse_selected_lines(
    parts: list[tuple[Block, np.ndarray]], compression: str | None, keep_blank: bool,
    parse: Callable[[bytes, int], BlockData], store: Storage | None = None,
) -> BlockData | None:
    """A resume's scattered rows of line-based blocks: scan each block for newlines and parse only
    the selected lines, all at once with ``parse(buffer, rows)``. None when reading part by part
    (each part's span, then its rows) is the better way: one dense part, or a problem in the lines,
    which that path names with its exact line."""
    if len(parts) == 1 and len(parts[0][1]) * 2 > int(parts[0][1][-1] - parts[0][1][0]) + 1:
        return None
    return _parse_clean(parse, read_selected_lines(parts, compression, keep_blank, store), sum(len(rows) for _, rows in parts))


def parse_group_lines(
    parts: list[GroupPart], compression: str | None, keep_blank: bool, parse: Callable[[bytes, int], BlockData],
    store: Storage | None = None,
) -> BlockData | None:
    """A read group of line-based blocks (NOTE [ Read groups ] in plan.py): each part's lines
    cut from its block's bytes, all parsed at once with ``parse(buffer, rows)``. None when
    reading part by part is the better way: a compressed file, or a problem in the lines, which
    that path names with its exact line (and skips with its exact count)."""
    if any(block.stop < 0 for block, _, _, _ in parts):
        return None
    pieces = []
    datas = read_blocks_bytes([block for block, _, _, _ in parts], compression, store)
    for buf, (block, lo, hi, take) in zip(datas, parts, strict=True):
        if take is None:
            piece = slice_rows(buf, lo, hi, block.rows, keep_blank)[0]
        else:
            piece = select_rows(buf, lo + take, block.rows, keep_blank)[0]
        if piece and not piece.endswith(b"\n"):
            piece += b"\n"  # a file's last line: the next part's first line must not join it
        pieces.append(piece)
    return _parse_clean(parse, b"".join(pieces), sum(hi - lo if take is None else len(take) for _, lo, hi, take in parts))


def _parse_clean(parse: Callable[[bytes, int], BlockData], buf: bytes, rows: int) -> BlockData | None:
    """``parse(buf, rows)`` when every line is good; None when a line is not (the caller then
    reads part by part, which names the line's file and number exactly, or skips it)."""
    try:
        data = parse(buf, rows)
    except SourceError:
        return None
    return None if data.bad_rows else data
