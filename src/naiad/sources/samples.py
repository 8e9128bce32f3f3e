"""What the readers of samples (tar shards, image folders) share: blocks cut on a byte grid, byte
slices of a read as one column, and the per-extension decoding of members into columns.

NOTE [ Sample blocks ]
A sample (an image and its label) is far bigger than a table's row, and a file of them (a tar
shard of 1 GB) far bigger than a read should be. So the blocks are byte ranges on a grid of
``block_bytes`` (about 1/4096 of the source, between 1 MiB and 32 MiB): a block holds the
samples whose first byte lies in its range, and its row count is the number of such samples.
A read of a block is one range read of its samples' bytes; the plan permutes the blocks and the
shuffle buffer mixes their samples, as for a CSV's byte-range blocks. The grid follows from the
file's size alone, so a fresh pass on one rank can plan its first reads before the shards are
indexed (``_early_cut``, NOTE [ Early reads ] in naiad/stream/early.py): each block's samples are
counted by indexing its shard when it is first read, and the other shards are indexed beside
the reads. A block on the grid may hold no sample (one sample bigger than the grid step): it
is never read, but it keeps its place, so the early cut and the counted one are the same list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.sources.contract import Block

__all__ = [
    "INT_EXTENSIONS", "MIN_BLOCK_BYTES", "MAX_BLOCK_BYTES", "byte_slices", "decode_members", "extension_type",
    "grid_blocks", "grid_edges", "indices", "objects", "sample_block_bytes",
]

MIN_BLOCK_BYTES = 1 << 20
MAX_BLOCK_BYTES = 32 << 20

INT_EXTENSIONS = frozenset({"cls", "idx", "id", "index"})
"""Extensions read as int64 (a decimal number as text, as WebDataset writes a class)."""

_KIND = "naiad.kind"  # a field's metadata: how its members are decoded


def sample_block_bytes(source_bytes: int) -> int:
    """The grid step of a source of ``source_bytes``: about 1/4096 of it, between
    ``MIN_BLOCK_BYTES`` and ``MAX_BLOCK_BYTES`` (NOTE [ Sample blocks ])."""
    return int(min(MAX_BLOCK_BYTES, max(MIN_BLOCK_BYTES, source_bytes // 4096)))


def grid_edges(size: int, step: int) -> np.ndarray:
    """The grid's block edges over ``size`` bytes: 0, step, 2 step, ..., size."""
    if size <= 0:
        return np.zeros(2, np.int64)
    return np.append(np.arange(0, size, step, dtype=np.int64), size)


def grid_blocks(path: str, starts: np.ndarray, size: int, step: int) -> list[Block]:
    """The blocks of one file on the grid: each holds the samples whose first byte (``starts``,
    ascending) lies in its range; ``first_line`` is its first sample's number (0-based)."""
    edges = grid_edges(size, step)
    firsts = np.searchsorted(starts, edges).tolist()
    bounds = edges.tolist()
    return [Block(path, a, b, hi - lo, lo) for a, b, lo, hi in zip(bounds, bounds[1:], firsts, firsts[1:])]


def early_grid(path: str, size: int, step: int) -> list[Block]:
    """The grid's blocks before their samples are counted (rows -1, first sample 0)."""
    bounds = grid_edges(size, step).tolist()
    return [Block(path, a, b, -1, 0) for a, b in zip(bounds, bounds[1:])]


def byte_slices(buf: pa.Buffer, offsets: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """``buf[offsets[i]:offsets[i] + sizes[i]]`` for each i as one Arrow binary array, with no
    loop in Python: the slices must ascend without overlapping (members of one extension in a
    tar do), so with the gaps between them they are one array of ``2n - 1`` values over
    ``buf``, and every other one is taken."""
    n = len(offsets)
    if n == 0:
        return pa.Array.from_buffers(pa.large_binary(), 0, [None, pa.py_buffer(np.zeros(1, np.int64)), pa.py_buffer(b"")])
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = offsets
    bounds[1::2] = offsets + sizes
    both = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), buf])
    return both.take(indices(np.arange(0, 2 * n - 1, 2, dtype=np.int64)))


def indices(rows: np.ndarray) -> pa.Array:
    """``rows`` as an Arrow int64 array (for a ``take``), without a copy and without
    ``pyarrow.array``, which imports pandas the first time a process calls it (0.2-0.4 s)."""
    rows = np.ascontiguousarray(rows, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def objects(values: pa.Array) -> np.ndarray:
    """An Arrow array's values (bytes, text) as a NumPy object array. Through ``to_pylist``, not
    PyArrow's ``to_numpy``, whose conversion of binary and string arrays imports pandas: 0.2-0.4
    s at a process's first read of samples (every worker process's), for nothing it needs."""
    out = np.empty(len(values), object)
    out[:] = values.to_pylist()
    return out


def extension_type(ext: str) -> pa.Field:
    """The column a member extension becomes: int64 for ``cls``/``idx``/``id``/``index``, str
    for ``txt``, parsed JSON for ``json`` (an Arrow string field marked so), bytes otherwise."""
    if ext in INT_EXTENSIONS:
        return pa.field(ext, pa.int64(), metadata={_KIND: "int"})
    if ext == "txt":
        return pa.field(ext, pa.string(), metadata={_KIND: "text"})
    if ext == "json":
        return pa.field(ext, pa.string(), metadata={_KIND: "json"})
    return pa.field(ext, pa.binary(), metadata={_KIND: "bytes"})


def decode_members(field: pa.Field, values: pa.Array) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """A column's members (binary) decoded as ``field`` says (:func:`extension_type`), and the
    rows that do not decode with the reason: ``(values of every row, [(row, reason)])``; a bad
    row's value is a placeholder the caller drops. The common case is columnar (Arrow's UTF-8
    check and integer parse over the whole column); only JSON, and a column that fails, go row
    by row."""
    import pyarrow.compute as pc  # on first use: its import is a third of naiad's
    kind = (field.metadata or {}).get(_KIND.encode(), b"bytes").decode()
    if kind == "bytes":
        return objects(values), []
    if kind == "int":
        try:
            text = pc.utf8_trim_whitespace(values.cast(pa.large_string()))
            ints = pc.cast(text, pa.int64())  # no nulls: a view of its buffer (to_numpy imports pandas)
            return np.frombuffer(ints.buffers()[1], np.int64, count=len(ints), offset=ints.offset * 8), []
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _ints_row_by_row(values.to_pylist())
    if kind == "text":
        try:
            return objects(values.cast(pa.large_string())), []
        except pa.ArrowInvalid:
            return _text_row_by_row(values.to_pylist())
    return _json_row_by_row(values.to_pylist())


def _ints_row_by_row(raw: Sequence[bytes]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    out = np.zeros(len(raw), np.int64)
    bad: list[tuple[int, str]] = []
    for i, v in enumerate(raw):
        try:
            out[i] = int(v)
        except (ValueError, OverflowError):
            bad.append((i, f"is not an integer ({bytes(v[:40])!r})"))
    return out, bad


def _text_row_by_row(raw: Sequence[bytes]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    out: list[Any] = []
    bad: list[tuple[int, str]] = []
    for i, v in enumerate(raw):
        try:
            out.append(v.decode("utf-8"))
        except UnicodeDecodeError as exc:
            out.append("")
            bad.append((i, f"is not UTF-8 text ({exc.reason} at byte {exc.start})"))
    return np.fromiter(out, object, count=len(out)), bad


def _json_row_by_row(raw: Sequence[bytes]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    out: list[Any] = []
    bad: list[tuple[int, str]] = []
    for i, v in enumerate(raw):
        try:
            out.append(json.loads(v))
        except (ValueError, RecursionError) as exc:
            out.append(None)
            bad.append((i, f"is not JSON ({exc})"))
    return np.fromiter(out, object, count=len(out)), bad
