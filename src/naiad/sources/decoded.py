"""Parsed blocks kept in memory across epochs, for the formats whose parse costs the most.

NOTE [ Kept blocks ]
A CSV or JSON Lines epoch spends most of its time in the parser, a text epoch in splitting
lines into Python strings, and every later epoch parses the same blocks again in a new order.
When the source's rows, at their parsed width, fit a budget (``default_keep_bytes()``: 1/16 of
the memory this process may use, at most 1 GiB), the process that reads the blocks keeps each
one's parsed columns the first time and serves later reads from them: a later epoch of a 150 MB
CSV is a gather from memory instead of a parse (bench/RESULTS.md). It is all or nothing: a
source over the budget keeps nothing, so its memory stays bounded by the shuffle buffer;
``keep_parsed_bytes=0`` on the reader turns it off.

What is kept, and why it is safe:
- Only in the process whose threads read the blocks (the loop's read-ahead threads, inline
  reads, thread workers). A process worker keeps nothing: each would hold its own copy, and a
  block seldom goes to the same worker twice.
- Only whole blocks read without a skipped bad row: a block with one is parsed again at every
  read, so every epoch reports its skips in the ledger.
- The columns of one width and row shape (an int64 row id and float64 features alike; strings
  and other Python values in an object array, each row one object) share one array, laid out
  block after block in file order, each block its columns one after another. Every read from
  them is a copy: nothing outside holds a reference to the kept rows, so no in-place change of a
  batch reaches them. A read group of small blocks (about 60 ranges of 500 rows for 294 MB of
  JSON Lines in 64 KiB blocks) is then one slice per range for all those columns, from one
  stretch of memory, joined into a new array whose rows are the columns (each contiguous, in
  its own dtype). An epoch's gathers of ten columns, alone: 20-28 ms, against 36-54 with a slice
  per range from one array per dtype (the columns of a range far apart), 57-71 with one per
  column or an index ``take``; 1 MiB blocks (four ranges a group) 14-17 ms. A dict of slices
  per block, before all these, cost a quarter of a later epoch.
- Which rows a read returns, in which order, does not depend on whether they were kept: the plan
  is unchanged, and a kept block is the parse's own output.
- A read group of which only some blocks are kept parses just the others, keeps them, and
  gathers the whole group (``Source.read_group``). A first pass leaves blocks unkept when it is
  cut short (a ``break``, a resume) or read some before the rows were counted (NOTE [ Early
  reads ] in naiad/stream/early.py: the store's size needs the count); those few, scattered over the
  next epoch's groups, made it parse nearly every group again (3.0 s against 0.55 s for 294 MB
  of JSON Lines whose first 7% of blocks were early reads).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from naiad.sources.columns import as_array

__all__ = ["KeptBlocks", "default_keep_bytes", "usable_memory"]

_KEEP_CAP_BYTES = 1 << 30


def usable_memory() -> int:
    """The memory this process may use: the machine's, or its control group's limit when lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        total = 8 << 30
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
        break
    return int(total)


def default_keep_bytes() -> int:
    """The default budget for parsed blocks kept across epochs: 1/16 of :func:`usable_memory`,
    at most 1 GiB (a 150 MB CSV of ten float columns parses to about 160 MB)."""
    return min(_KEEP_CAP_BYTES, usable_memory() // 16)


def _raw(itemsize: int) -> np.dtype:
    """The dtype that holds any value ``itemsize`` bytes wide as its bytes."""
    return np.dtype(f"u{itemsize}") if itemsize in (1, 2, 4, 8) else np.dtype((np.void, itemsize))


class KeptBlocks:
    """Parsed columns of whole blocks, kept in file order up to a byte budget (NOTE [ Kept
    blocks ]).

    Args:
        blocks: every block of the source, in file order, with its rows.
        budget_bytes: the most the columns may take (estimated 64 bytes a string); over it,
            nothing is kept.

    Thread-safe: the read-ahead threads put and gather side by side (each block is written once,
    to its own rows)."""

    def __init__(self, blocks: Sequence[Any], budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        rows = np.fromiter((b.rows for b in blocks), np.int64, count=len(blocks))
        starts = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64) if len(blocks) else rows
        self.total_rows = int(rows.sum())
        self._start: dict[Any, int] = dict(zip(blocks, starts.tolist()))
        self._kept: set[Any] = set()
        # Columns of one width and row shape share one flat array, block after block, each block
        # its columns one after another (a view of shape (columns, rows, ...)): a range of a
        # block is one slice for all of them, from one stretch of memory (see gather).
        self._stacks: list[tuple[np.ndarray, int, tuple[int, ...]]] | None = None  # flat, columns, row shape
        self._where: dict[str, tuple[int, int]] = {}  # column -> (stack, column in it), in order
        self._views: dict[Any, tuple[np.ndarray, ...]] = {}  # block -> its view of each stack
        self._dtype: dict[str, np.dtype] = {}  # a column's own dtype (its stack holds raw bytes)
        self._full = False  # the columns would not fit the budget: keep nothing
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many blocks are kept."""
        return len(self._kept)

    def _allocate(self, columns: Mapping[str, np.ndarray | list[Any]]) -> bool:
        with self._lock:
            if self._stacks is None and not self._full:
                groups: dict[tuple[Any, ...], list[str]] = {}
                dtypes: dict[str, np.dtype] = {}
                size = 0
                for name, col in columns.items():
                    if isinstance(col, np.ndarray) and not col.dtype.hasobject:
                        # By width, not type: an int64 row id beside float64 features is one
                        # stack, so one slice a range (the gather's cost is mostly per slice).
                        dtypes[name] = col.dtype
                        key: tuple[Any, ...] = (_raw(col.itemsize), col.shape[1:])
                        size += self.total_rows * col.itemsize * math.prod(col.shape[1:])
                    else:
                        # Strings and other Python values in an object array, not a list: a gather
                        # is then a C loop (3-4x faster than a list comprehension, and it holds
                        # the GIL for that much less beside the training loop).
                        key = (np.dtype(object), ())
                        size += 64 * self.total_rows
                    groups.setdefault(key, []).append(name)
                if size > self.budget_bytes:
                    self._full = True
                else:
                    stacks: list[tuple[np.ndarray, int, tuple[int, ...]]] = []
                    where: dict[str, tuple[int, int]] = {}
                    for (dtype, shape), names in groups.items():
                        where.update((name, (len(stacks), i)) for i, name in enumerate(names))
                        count = len(names) * self.total_rows * math.prod(shape)
                        stacks.append((np.empty(count, dtype), len(names), shape))  # touched as written
                    self._where = {name: where[name] for name in columns}
                    self._dtype = dtypes
                    self._stacks, self.nbytes = stacks, size
            return self._stacks is not None

    def put(self, parts: Sequence[tuple[Any, int]], columns: Mapping[str, np.ndarray | list[Any]]) -> None:
        """Keep the columns of a read of whole blocks, one after another: ``parts`` is each
        block with its rows, in the order of the rows in ``columns``."""
        if self._full or not columns or not all(block in self._start and n == block.rows for block, n in parts):
            return  # a block's place is laid out for all its rows
        if self._stacks is None and not self._allocate(columns):
            return
        stacks = self._stacks
        assert stacks is not None
        if set(self._where) != set(columns):
            return
        arrays = {name: as_array(col) for name, col in columns.items()}  # a list: each value one object
        if any(arrays[name].dtype != dtype for name, dtype in self._dtype.items()):
            return  # not the columns the stacks were laid out for
        raw = {name: col.view(_raw(col.itemsize)) if name in self._dtype else col for name, col in arrays.items()}
        src = 0
        widths = [k * math.prod(shape) for _, k, shape in stacks]  # values a row takes in each stack
        for block, n in parts:
            at = self._start[block]
            views = tuple(flat[w * at:w * (at + n)].reshape(k, n, *shape) for (flat, k, shape), w in zip(stacks, widths))
            for name, col in raw.items():
                stack, i = self._where[name]
                views[stack][i] = col[src:src + n]
            self._views[block] = views
            src += n
        with self._lock:
            self._kept.update(b for b, _ in parts)

    def missing(self, blocks: Sequence[Any]) -> list[Any] | None:
        """Those of ``blocks`` not kept yet, once each, in order; None when they cannot be kept
        (the columns would not fit, or a block is not one of the source's)."""
        if self._full or not all(block in self._start for block in blocks):
            return None
        return list(dict.fromkeys(block for block in blocks if block not in self._kept))

    def gather(self, parts: Sequence[tuple[Any, int, int, np.ndarray | None]]) -> dict[str, np.ndarray | list[Any]] | None:
        """The rows of reads ``(block, lo, hi, take)`` (``take``: only these offsets from ``lo``)
        one after another, as new arrays, when every block is kept; else None."""
        stacks = self._stacks
        if stacks is None or not all(block in self._kept for block, _, _, _ in parts):
            return None
        views = self._views
        out = [
            np.concatenate([views[b][i][:, lo:hi] if take is None else views[b][i][:, lo + np.asarray(take, np.intp)]
                            for b, lo, hi, take in parts], axis=1)
            for i in range(len(stacks))
        ]
        # Each column a row of its stack's new array, in its own dtype: contiguous, and a copy.
        dtypes = self._dtype
        return {name: out[stack][row].view(dtypes[name]) if name in dtypes else out[stack][row]
                for name, (stack, row) in self._where.items()}
