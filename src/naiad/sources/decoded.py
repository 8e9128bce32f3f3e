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
- The rows are copied in file order (a block at its first row's place; strings and other Python
  values in an object array, each row one object) into one array per dtype and row shape, a
  column per row of it, and every read from them is a copy: nothing outside holds a reference to
  the kept rows, so no in-place change of a batch reaches them. A read group of small blocks
  (about 60 ranges of 500 rows for 294 MB of JSON Lines in 64 KiB blocks) is then one slice per
  range for all the columns of a dtype, joined into a new array whose rows are the columns, each
  contiguous. A slice per range per column cost 2x as much (63 against 28 ms for an epoch's
  gathers of ten columns; an index ``take`` 50 ms), and a dict of slices per block, before that,
  a quarter of a later epoch.
- Which rows a read returns, in which order, does not depend on whether they were kept: the plan
  is unchanged, and a kept block is the parse's own output.
- A read group of which only some blocks are kept parses just the others, keeps them, and
  gathers the whole group (``Source.read_group``). A first pass leaves blocks unkept when it is
  cut short (a ``break``, a resume) or read some before the rows were counted (NOTE [ Early
  reads ] in naiad/early.py: the store's size needs the count); those few, scattered over the
  next epoch's groups, made it parse nearly every group again (3.0 s against 0.55 s for 294 MB
  of JSON Lines whose first 7% of blocks were early reads).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from naiad.shuffle import as_array

__all__ = ["KeptBlocks", "concat_ranges", "default_keep_bytes", "usable_memory"]

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


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each start and length, without a loop."""
    ends = np.cumsum(lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` with each one that starts where the one before ends joined to it: the blocks
    of a run follow one another (NOTE [ Block runs ] in plan.py)."""
    out = spans[:1]
    for a, z in spans[1:]:
        if a == out[-1][1]:
            out[-1] = (out[-1][0], z)
        else:
            out.append((a, z))
    return out


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
        # Columns of one dtype and row shape share one array, a column per row of it: a range of
        # rows is then one slice for all of them (see gather).
        self._stacks: list[np.ndarray] | None = None
        self._where: dict[str, tuple[int, int]] = {}  # column -> (stack, row in it), in order
        self._full = False  # the columns would not fit the budget: keep nothing
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many blocks are kept."""
        return len(self._kept)

    def _allocate(self, columns: Mapping[str, np.ndarray | list]) -> bool:
        with self._lock:
            if self._stacks is None and not self._full:
                groups: dict[tuple[Any, ...], list[str]] = {}
                size = 0
                for name, col in columns.items():
                    if isinstance(col, np.ndarray) and col.dtype != object:
                        key: tuple[Any, ...] = (col.dtype, col.shape[1:])
                        size += self.total_rows * col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
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
                    stacks: list[np.ndarray] = []
                    for (dtype, shape), names in groups.items():
                        for i, name in enumerate(names):
                            self._where[name] = (len(stacks), i)
                        stacks.append(np.empty((len(names), self.total_rows, *shape), dtype))  # touched as written
                    self._where = {name: self._where[name] for name in columns}
                    self._stacks, self.nbytes = stacks, size
            return self._stacks is not None

    def put(self, parts: Sequence[tuple[Any, int]], columns: Mapping[str, np.ndarray | list]) -> None:
        """Keep the columns of a read of whole blocks, one after another: ``parts`` is each
        block with its rows, in the order of the rows in ``columns``."""
        if self._full or not columns or not all(block in self._start for block, _ in parts):
            return
        if self._stacks is None and not self._allocate(columns):
            return
        stacks = self._stacks
        assert stacks is not None
        if set(self._where) != set(columns):
            return
        # One slice per block (as in gather): faster than a scatter through an index.
        moves = []
        src = 0
        for block, n in parts:
            moves.append((self._start[block], src, n))
            src += n
        for name, col in columns.items():
            stack, row = self._where[name]
            dst = stacks[stack][row]
            col = as_array(col)  # a list: each value one object, whatever it holds
            for at, frm, n in moves:
                dst[at:at + n] = col[frm:frm + n]
        with self._lock:
            self._kept.update(b for b, _ in parts)

    def missing(self, blocks: Sequence[Any]) -> list[Any] | None:
        """Those of ``blocks`` not kept yet, once each, in order; None when they cannot be kept
        (the columns would not fit, or a block is not one of the source's)."""
        if self._full or not all(block in self._start for block in blocks):
            return None
        return list(dict.fromkeys(block for block in blocks if block not in self._kept))

    def gather(self, parts: Sequence[tuple[Any, int, int, np.ndarray | None]]) -> dict[str, np.ndarray | list] | None:
        """The rows of reads ``(block, lo, hi, take)`` (``take``: only these offsets from ``lo``)
        one after another, as new arrays, when every block is kept; else None."""
        stacks = self._stacks
        if stacks is None or not all(block in self._kept for block, _, _, _ in parts):
            return None
        if all(take is None for _, _, _, take in parts):
            # A slice per range for all the columns of a stack: a read group of 64 KiB blocks of
            # JSON Lines is about 60 ranges of 500 rows, and a slice per range per column (or a
            # take through one index) cost twice as much (bench/RESULTS.md).
            spans = _joined([(self._start[b] + lo, self._start[b] + hi) for b, lo, hi, _ in parts])
            out = [np.concatenate([stack[:, a:z] for a, z in spans], axis=1) for stack in stacks]
        else:
            index = np.concatenate([
                np.arange(self._start[b] + lo, self._start[b] + hi, dtype=np.int64) if take is None
                else self._start[b] + lo + np.asarray(take, np.int64)
                for b, lo, hi, take in parts
            ])
            out = [stack.take(index, axis=1) for stack in stacks]
        # Each column a row of its stack's new array: contiguous, and a copy.
        return {name: out[stack][row] for name, (stack, row) in self._where.items()}
