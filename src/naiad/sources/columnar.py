"""What the columnar formats (Parquet, Arrow IPC) share: one block per row group or record
batch, open file readers per thread, and rows with a null where NumPy has none."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import SourceError
from naiad.process_state import ProcessLocal
from naiad.sources.columns import is_ragged_numeric, missing_columns, missing_reason, null_rows
from naiad.sources.contract import Block, OnBadRows, bad_entry
from naiad.sources.openfiles import open_files_budget
from naiad.sources.storage import Storage, is_remote

__all__ = ["ReaderCache", "check_no_nulls", "indexed_blocks"]


def check_no_nulls(table: pa.Table, block: Block, lo: int, on_bad_rows: OnBadRows,
                   also_bad: Mapping[int, tuple[str, str]] | None = None) -> tuple[pa.Table, tuple[dict[str, Any], ...]]:
    """Drop (or report) rows with a value NumPy cannot hold (``missing_values``: a null in an
    integer or bool column, a null or gapped row of a ragged integer column); returns (table,
    their entries).

    For columnar formats, where a row number is exact; text formats find such rows line by line.
    ``also_bad``: rows found bad before (a media struct with no bytes: ``media.resolve_media``),
    ``{row: (column, reason)}``, skipped with the others.
    """
    bad = null_rows(table)
    if also_bad:
        bad = np.union1d(bad, np.fromiter(also_bad, np.int64, count=len(also_bad)))
    if bad.size == 0:
        return table, ()
    names = missing_columns(table)
    also = also_bad or {}
    if on_bad_rows == "raise":
        i = int(bad[0])
        column = names[i]
        if i in also and not column:
            column, reason, fix = *also[i], "pass on_bad_rows='skip' to skip such rows"
        elif is_ragged_numeric(t := table.schema.field(column).type):
            reason, fix = missing_reason(column, t), "pass on_bad_rows='skip' to skip such rows"
        else:
            reason, fix = missing_reason(column, t), f"pass dtypes={{{column!r}: 'float32'}} to read it as NaN, or on_bad_rows='skip'"
        raise SourceError(f"row {block.first_line + lo + i}: {reason}; {fix}.", path=block.path, column=column)
    keep = np.ones(table.num_rows, bool)
    keep[bad] = False
    entries = tuple(
        bad_entry(i, block.path, also[i][1], row=block.first_line + lo + i, column=also[i][0]) if i in also and not names[i] else
        bad_entry(i, block.path, missing_reason(names[i], table.schema.field(names[i]).type),
                  row=block.first_line + lo + i, column=names[i])
        for i in bad.tolist()
    )
    return table.filter(pa.array(keep)), entries


class ReaderCache:
    """Open readers, per thread and least recently used first out.

    A PyArrow file reader is not safe to share between threads (sharing one across thread
    workers crashed), and opening one parses the file's footer or index, which is not free for
    wide files; so each thread keeps its own few open readers. An object's reader reads through
    the Storage it was opened with, so it is kept per (URL, Storage): two sources of one URL
    never share one (NOTE [ Remote files in workers ] in storage.py).

    Args:
        opener: opens one file, an object through the Storage given; raises
            ``OSError``/``pa.ArrowException`` on a bad file.
        what: the format in words, for error messages ("Parquet file").
        hint: what to suggest when a file cannot be opened.
        max_open: readers kept open per thread (each holds a file, or a memory map of one);
            None: 16, fewer where the process may open few files (a sixteenth of its budget,
            NOTE [ Open files ] in openfiles.py), at least 2.
    """

    def __init__(self, opener: Callable[[str, Storage | None], Any], what: str, hint: str, max_open: int | None = None) -> None:
        self._opener = opener
        self._what = what
        self._hint = hint
        self._max_open = max_open
        # Per thread of this process: a forked child's thread starts with none of the parent's
        # readers, whose files and connections are the parent's (NOTE [ Per-process state ]).
        self._local = ProcessLocal(threading.local, name=f"naiad {what} readers")

    def get(self, path: str, store: Storage | None = None) -> Any:
        """The open reader of ``path`` (opened now if needed; an object through ``store``, its
        source's Storage), or a SourceError naming the file."""
        local = self._local.get()
        cache: OrderedDict[tuple[str, Storage | None], Any] | None = getattr(local, "open", None)
        if cache is None:
            cache = local.open = OrderedDict()
        # A Storage is keyed by identity: the reader holds it, so it outlives no entry.
        key = (path, store if is_remote(path) else None)
        reader = cache.get(key)
        if reader is not None:
            cache.move_to_end(key)
            return reader
        try:
            reader = self._opener(path, store)
        except FileNotFoundError:
            raise SourceError("file not found.", path=path) from None
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"not a readable {self._what} ({exc}); {self._hint}", path=path) from None
        cache[key] = reader
        if self._max_open is None:  # decided in the process that reads (its limit on open files)
            self._max_open = max(2, min(16, open_files_budget() // 16))
        if len(cache) > self._max_open:
            cache.popitem(last=False)
        return reader


def indexed_blocks(path: str, row_counts: Sequence[int]) -> list[Block]:
    """One block per non-empty part (row group, record batch) of a file, with its row counts."""
    blocks, row = [], 0
    for i, n in enumerate(row_counts):
        if n:
            blocks.append(Block(path, i, i + 1, n, row))
        row += n
    return blocks
