"""Reading samples of tar shards: range reads of runs of samples, and their members as columns.

NOTE [ Shard reads ]
A read is samples of one or more shards: a block's, a read group's blocks (NOTE [ Read groups ]
in plan.py), a resume's scattered samples. Each shard's samples are fetched as one range read
per run of consecutive samples (their member index says where a run starts and ends); then all
the bytes are one buffer and every column is made once for the whole read, not once per
shard: each extension's members are slices of the buffer (``samples.byte_slices``), decoded
by Arrow over the column, and the keys one ``take`` from the shards' key bytes. A read group
of 45 shards of 10 samples was 45 times that work, one shard after another (about 0.5 ms a
shard, most of the reading of a source of small shards).
Columns of bytes and text become object arrays by ``samples.objects`` (no pandas import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.columns import Columns
from naiad.sources.contract import BlockData, OnBadRows, bad_entry
from naiad.sources.readahead import io_map
from naiad.sources.samples import byte_slices, decode_members, indices
from naiad.sources.tarindex import ShardIndex
from naiad.trust.paths import decode_names

__all__ = ["KEY", "read_samples"]

KEY = "__key__"
"""The column of the samples' keys, as WebDataset names it."""

Ask = tuple[str, ShardIndex, np.ndarray]
"""Samples of one shard to read: (its path, its member index, sample numbers, ascending)."""


def read_samples(asks: Sequence[Ask], schema: pa.Schema, on_bad_rows: OnBadRows,
                 store: storage.Storage | None) -> BlockData:
    """The samples ``asks`` asks for (at least one), in order, as the columns of ``schema``
    (NOTE [ Shard reads ]); a bad sample (a member missing, two of one extension, one that does
    not decode) raised, or with ``on_bad_rows="skip"`` left out and returned as an entry at its
    position.

    Raises:
        SourceError: naming the shard, the key, the sample and the extension.
    """
    asks = [a for a in asks if len(a[2])]
    for path, index, rows in asks:
        if rows[-1] >= len(index):
            raise SourceError(f"sample {int(rows[-1])} asked for, the shard has {len(index)}; did it change?", path=path)
    fetched = io_map(lambda a: _fetch(a, store), asks) if any(storage.is_remote(a[0]) for a in asks) else [_fetch(a, store) for a in asks]
    sizes = np.array([len(rows) for _, _, rows in asks], np.int64)
    first = np.concatenate(([0], np.cumsum(sizes)))  # each ask's first position among the rows
    buf = pa.py_buffer(fetched[0][0] if len(fetched) == 1 else b"".join(b for b, _ in fetched))
    bad: dict[int, tuple[str, str]] = {}  # position among the rows -> (column, reason)
    offsets, lengths = _member_spans(asks, fetched, [f.name for f in schema if f.name != KEY], first, bad)
    good = np.ones(int(first[-1]), bool)
    good[list(bad)] = False
    keep = np.flatnonzero(good)  # decoded: rows with every member
    decoded: dict[str, np.ndarray] = {}
    for field in schema:
        if field.name == KEY:
            continue
        values = byte_slices(buf, np.concatenate(offsets[field.name])[keep], np.concatenate(lengths[field.name])[keep])
        decoded[field.name], failed = decode_members(field, values)
        for j, reason in failed:
            bad.setdefault(int(keep[j]), (field.name, f"has a .{field.name} that {reason}"))
    good[list(bad)] = False
    still = good[keep]  # of the decoded rows, those no column failed
    columns: Columns = {KEY: _keys(asks, good, first)}
    for name, values in decoded.items():
        columns[name] = values if still.all() else values[still]
    if not bad:
        return BlockData(columns)
    return BlockData(columns, _bad(asks, first, bad, on_bad_rows))


Spans = dict[str, list[np.ndarray]]
"""Per column, per ask: each sample's member offsets in the joined bytes (or its sizes)."""


def _member_spans(asks: Sequence[Ask], fetched: Sequence[tuple[bytes, np.ndarray | int]], names: list[str],
                  first: np.ndarray, bad: dict[int, tuple[str, str]]) -> tuple[Spans, Spans]:
    """Each column's members as offsets into the joined bytes and sizes, per ask; a sample with
    two members of one extension, or missing a column's, put in ``bad`` (its first problem)."""
    byte_at = np.concatenate(([0], np.cumsum([len(b) for b, _ in fetched])))
    offsets: Spans = {name: [] for name in names}
    lengths: Spans = {name: [] for name in names}
    for k, ((_, index, rows), (_, shift)) in enumerate(zip(asks, fetched, strict=True)):
        # A few NumPy calls an ask and column; the checks look at each bad sample alone.
        if index.flags[rows].any():
            for i in np.flatnonzero(index.flags[rows]).tolist():
                bad[int(first[k]) + i] = ("", "has two members with the same extension")
        for name in names:
            e = index.ext_row(name)
            offs = index.offsets[e, rows] if e >= 0 else np.full(len(rows), -1, np.int64)
            missing = offs < 0
            if missing.any():
                _name_missing(index, rows, np.flatnonzero(missing), name, int(first[k]), bad)
                offs = np.where(missing, -1 - shift - byte_at[k], offs)  # -1 once shifted (never read)
            offsets[name].append(offs + (shift + byte_at[k]))
            lengths[name].append(index.sizes[e, rows] if e >= 0 else np.zeros(len(rows), np.int64))
    return offsets, lengths


def _name_missing(index: ShardIndex, rows: np.ndarray, missing: np.ndarray, name: str, first: int,
                  bad: dict[int, tuple[str, str]]) -> None:
    """The samples at ``missing`` (of ``rows``) lack a ``.name`` member: each bad, with what it has."""
    for i in missing.tolist():
        if first + i not in bad:
            have = ", ".join(x for j, x in enumerate(index.exts) if index.offsets[j, rows[i]] >= 0)
            bad[first + i] = (name, f"has no .{name} member (it has: {have or 'none'})")


def _fetch(ask: Ask, store: storage.Storage | None) -> tuple[bytes, np.ndarray | int]:
    """The bytes of an ask's samples, one range read per run of consecutive samples, joined;
    and per sample (or for all, when they are one run) the shift from a file offset to its
    place in the joined bytes."""
    path, index, rows = ask
    first, last = int(rows[0]), int(rows[-1])
    if last - first + 1 == len(rows):  # one run: a whole block, or a range of one
        a, b = int(index.starts[first]), int(index.ends[last])
        return _read(path, a, b, store), -a
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    firsts = rows[np.concatenate(([0], cuts))]
    lasts = rows[np.concatenate((cuts - 1, [len(rows) - 1]))]
    lo, hi = index.starts[firsts], index.ends[lasts]
    parts = [_read(path, a, b, store) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    at = np.concatenate(([0], np.cumsum(hi - lo)[:-1]))
    run = np.repeat(np.arange(len(firsts)), np.diff(np.concatenate(([0], cuts, [len(rows)]))))
    return b"".join(parts), (at - lo)[run]


def _read(path: str, a: int, b: int, store: storage.Storage | None) -> bytes:
    """Bytes ``a:b`` of a shard, all of them (else the shard changed since it was indexed)."""
    data = storage.read_range(path, a, b, store=store)
    if len(data) != b - a:
        raise SourceError(f"expected {b - a:,} bytes at offset {a:,}, read {len(data):,}: the shard is cut "
                          "short or changed since it was indexed.", path=path)
    return data


def _keys(asks: Sequence[Ask], good: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The good samples' keys: one string array over the shards' key bytes, one take."""
    indexes = [index for _, index, _ in asks]
    key_at = np.concatenate(([0], np.cumsum([len(i.key_bytes) for i in indexes])))
    row_at = np.concatenate(([0], np.cumsum([len(i) for i in indexes])))
    ends = np.concatenate([i.key_ends + key_at[k] for k, i in enumerate(indexes)] + [np.zeros(0, np.int64)])
    data = indexes[0].key_bytes if len(indexes) == 1 else np.concatenate([i.key_bytes for i in indexes])
    names = pa.Array.from_buffers(pa.large_binary(), int(row_at[-1]),
                                  [None, pa.py_buffer(np.concatenate(([0], ends)).astype(np.int64)), pa.py_buffer(data)])
    rows = np.concatenate([rows + row_at[k] for k, (_, _, rows) in enumerate(asks)])
    return decode_names(names.take(indices(rows[good])))  # NOTE [ Names as bytes ]


def _bad(asks: Sequence[Ask], first: np.ndarray, bad: dict[int, tuple[str, str]], on_bad_rows: OnBadRows) -> tuple[dict[str, Any], ...]:
    """The bad samples as ledger entries at their positions, or the first one raised."""
    def where(i: int) -> tuple[str, ShardIndex, int]:
        k = int(np.searchsorted(first, i, side="right")) - 1
        path, index, rows = asks[k]
        return path, index, int(rows[i - first[k]])

    if on_bad_rows == "raise":
        i = min(bad)
        column, reason = bad[i]
        path, index, row = where(i)
        raise SourceError(
            f"sample {index.key(row)!r} (sample {row} of the shard) {reason}; pass "
            "on_bad_rows='skip' to skip such samples.", path=path, column=column or None)
    out = []
    for i in sorted(bad):
        path, index, row = where(i)
        out.append(bad_entry(i, path, bad[i][1], row=row, key=index.key(row), column=bad[i][0] or None))
    return tuple(out)
