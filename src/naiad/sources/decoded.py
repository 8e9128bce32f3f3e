"""Parsed blocks kept in memory across epochs, for the formats whose parse costs the most.

NOTE [ Kept blocks ]
A CSV or JSON Lines epoch spends most of its time in the parser, and every later epoch parses
the same blocks again in a new order. When the source's rows, at their parsed width, fit a
budget (``default_keep_bytes()``: 1/16 of the memory this process may use, at most 1 GiB), the
process that reads the blocks keeps each one's parsed columns the first time and serves later
reads from them: a later epoch of a 150 MB CSV is a gather from memory instead of a parse
(bench/RESULTS.md). It is all or nothing: a source over the budget keeps nothing, so its memory
stays bounded by the shuffle buffer; ``keep_parsed_bytes=0`` on the reader turns it off.

What is kept, and why it is safe:
- Only in the process whose threads read the blocks (the loop's read-ahead threads, inline
  reads, thread workers). A process worker keeps nothing: each would hold its own copy, and a
  block seldom goes to the same worker twice.
- Only whole blocks read without a skipped bad row: a block with one is parsed again at every
  read, so every epoch reports its skips in the ledger.
- The arrays are marked read-only before they are kept, the ones handed on included: whatever
  reaches the training loop is copied from them (``stream.to_torch`` copies a read-only array),
  so no in-place change of a batch reaches the kept rows. A read of several blocks joins copies.
- Which rows a read returns, in which order, does not depend on whether they were kept: the plan
  is unchanged, and a kept block is the parse's own output.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

import numpy as np

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


def _nbytes(columns: Mapping[str, np.ndarray | list]) -> int:
    total = 0
    for col in columns.values():
        total += col.nbytes if isinstance(col, np.ndarray) and col.dtype != object else 64 * len(col)
    return total


def _rows_of(col: np.ndarray | list, lo: int, hi: int, take: np.ndarray | None) -> np.ndarray | list:
    if take is None:
        return col[lo:hi]
    if isinstance(col, np.ndarray):
        return col[lo + take]
    return [col[i] for i in (lo + take).tolist()]


def _freeze(columns: Mapping[str, np.ndarray | list]) -> None:
    for col in columns.values():
        if isinstance(col, np.ndarray):
            col.flags.writeable = False


class KeptBlocks:
    """Parsed columns of whole blocks, by block, up to a byte budget (NOTE [ Kept blocks ]).

    Thread-safe: the read-ahead threads put and get side by side. Past the budget (the estimate
    that allowed keeping was short, e.g. strings longer than guessed) nothing more is kept."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        self._blocks: dict[object, dict[str, np.ndarray | list]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, block: object) -> dict[str, np.ndarray | list] | None:
        """The kept columns of ``block`` (read-only; do not change a list), or None."""
        return self._blocks.get(block)

    def gather(self, parts: Sequence[tuple[object, int, int, np.ndarray | None]]) -> dict[str, np.ndarray | list] | None:
        """The rows of reads ``(block, lo, hi, take)`` (``take``: only these offsets from ``lo``)
        one after another, when every block is kept; else None. One whole block comes back as
        kept (read-only); anything else is a fresh copy."""
        kept = []
        for block, lo, hi, take in parts:
            columns = self._blocks.get(block)
            if columns is None:
                return None
            kept.append((columns, lo, hi, take))
        if len(kept) == 1:
            columns, lo, hi, take = kept[0]
            first = next(iter(columns.values()), None)
            if take is None and lo == 0 and (first is None or hi == len(first)):
                return columns
        out: dict[str, np.ndarray | list] = {}
        for name in kept[0][0]:
            pieces = [_rows_of(columns[name], lo, hi, take) for columns, lo, hi, take in kept]
            if isinstance(pieces[0], np.ndarray):
                out[name] = np.concatenate(pieces) if len(pieces) > 1 else np.array(pieces[0])
            else:
                out[name] = [v for piece in pieces for v in piece]
        return out

    def put(self, parts: Sequence[tuple[object, int]], columns: Mapping[str, np.ndarray | list]) -> None:
        """Keep the columns of a read of whole blocks, one after another: ``parts`` is each
        block with its rows, in the order of the rows in ``columns``."""
        if self.nbytes >= self.budget_bytes:
            return
        _freeze(columns)
        start = 0
        pieces = []
        for block, rows in parts:
            pieces.append((block, {name: col[start:start + rows] for name, col in columns.items()}))
            start += rows
        size = _nbytes(columns)
        with self._lock:
            if self.nbytes + size > self.budget_bytes:
                self.nbytes = self.budget_bytes  # full: the estimate was short
                return
            self.nbytes += size
            for block, piece in pieces:
                self._blocks[block] = piece

    def clear(self) -> None:
        """Forget every kept block."""
        with self._lock:
            self._blocks.clear()
            self.nbytes = 0
