"""The block-reading engine every source shares: what the planner and the workers call.

A format (:class:`~naiad.sources.contract.SourceFormat`) says how to cut a file into blocks and
read a block's rows (NOTE [ Format contract ] in sources/contract.py); :class:`BlockEngine`
turns that into what the stream pipeline uses: the schema and the block list, computed once
(files cut side by side on threads, or counted beside the first reads: NOTE [ Early reads ] in
naiad/stream/early.py); parsed blocks kept across epochs (NOTE [ Kept blocks ] in sources/decoded.py);
read groups (NOTE [ Read groups ] in plan.py); a resume's scattered rows; and the row counts.
:class:`~naiad.sources.base.Source` joins the two with the options every source takes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.parallel.threads import one_core_each, usable_cores
from naiad.process_state import per_process
from naiad.sources.columns import (
    Columns,
    cast_to_schema,
    concat_columns,
    field_shape,
    null_rows,
    numpy_dtype,
    row_bytes,
    table_to_columns,
)
from naiad.sources.contract import Block, BlockData, GroupPart, SourceFormat
from naiad.sources.decoded import KeptBlocks, default_keep_bytes
from naiad.sources.readahead import io_map
from naiad.sources.storage import is_remote

__all__ = ["BlockEngine", "join_data", "take_positions"]


# This process's: a forked child's is free (NOTE [ Per-process state ]).
_KEEP_DECISION = per_process("naiad.sources.engine keep decision", threading.Lock)


class BlockEngine(SourceFormat):
    """The reading a source's format does not: schema and blocks cached, rows counted, parsed
    blocks kept, read groups, scattered rows (NOTE [ Format contract ] in sources/contract.py).

    Its state starts empty at class level; ``Source.__init__`` sets it for every reader (with
    ``expand=False`` for a source whose parts are not files on disk: an in-memory table).

    Attributes:
        keep_parsed_bytes: the budget for parsed blocks kept across epochs (the reader's
            option); None: the format's default (:meth:`kept_blocks`), 0: keep nothing.
    """

    keep_parsed_bytes: int | None = None
    _schema: pa.Schema | None = None  # schema(), once
    _blocks: list[Block] | None = None  # blocks(), once
    _kept: KeptBlocks | bool | None = None  # None: not decided yet; False: keep nothing
    _local_bytes: int | None = None  # local_bytes(), once
    _counting: Future[list[Block]] | None = None  # count_beside()'s

    # -- the interface the planner and the workers use ---------------------------------------

    def schema(self) -> pa.Schema:
        """The columns and their types, in file order (cached; reads metadata or a sample)."""
        if self._schema is None:
            self._schema = self._read_schema()
        return self._schema

    @property
    def column_names(self) -> list[str]:
        """Output column names, in file order."""
        return list(self.schema().names)

    def blocks(self) -> list[Block]:
        """Every block of every file, in file order, with row counts (computed once, cached).

        Files are cut side by side on threads (a newline scan, a footer read, a request: all
        release the GIL); the first file that fails, in file order, raises. A count started by
        :meth:`count_beside` is waited for. A failure is not kept: the next call (the next pass)
        counts again, so a file repaired or a transient error passed heals the source."""
        if self._blocks is None:
            counting = self._counting
            if counting is not None:
                try:
                    return counting.result()
                except BaseException:
                    if self._counting is counting:
                        self._counting = None  # raised once; the next pass counts again
                    raise
            self._blocks = self._cut_files()
        return self._blocks

    def count_threads(self) -> int:
        """Threads that cut and count the files: one per core (8 at most); a format whose count
        is Python under the GIL says fewer."""
        return min(usable_cores(), len(self.paths), 8)

    def _cut_files(self) -> list[Block]:
        threads = self.count_threads()
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="naiad-blocks", initializer=one_core_each) as pool:
                per_file = list(pool.map(self._file_blocks, self.paths))
        else:
            per_file = [self._file_blocks(path) for path in self.paths]
        return [b for blocks in per_file for b in blocks]

    def count_beside(self) -> None:
        """Start cutting and counting the files on a thread of their own, while this one goes on
        (NOTE [ Early reads ] in naiad/stream/early.py); :meth:`blocks` waits for it."""
        if self._blocks is not None or self._counting is not None:
            return
        counting: Future[list[Block]] = Future()

        def count() -> None:
            try:
                self._blocks = self._cut_files()
                counting.set_result(self._blocks)
            except BaseException as exc:  # noqa: BLE001 - raised by blocks(), in its caller's thread
                counting.set_exception(exc)

        self._counting = counting
        threading.Thread(target=count, name="naiad-count", daemon=True).start()

    def counted(self) -> bool:
        """Whether the blocks' rows are known (a count beside the reads has ended, or failed)."""
        return self._blocks is not None or (self._counting is not None and self._counting.done())

    def early_blocks(self) -> list[Block] | None:
        """Every block's byte range before the rows are counted (rows -1, first line 0), for the
        reads that start beside the count (NOTE [ Early reads ] in naiad/stream/early.py); None when
        the format or a file does not cut that way, or the blocks are known or being counted."""
        if not self.traits.early_cut or self._blocks is not None or self._counting is not None:
            return None
        out: list[Block] = []
        for path in self.paths:
            cut = self._early_cut(path)
            if cut is None:
                return None
            out += cut
        return out

    def prepare(self) -> None:
        """Cut the files into blocks and read the schema, both at once when neither is known: the
        newline scan (NumPy) and the type inference (PyArrow's parse of a sample) release the
        GIL, so a fresh text source pays the longer of the two, not their sum."""
        if self._blocks is not None or self._schema is not None:
            self.blocks()
            self.schema()
            return
        failed: list[BaseException] = []

        def scan() -> None:
            try:
                self.blocks()
            except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
                failed.append(exc)

        t = threading.Thread(target=scan, name="naiad-scan", daemon=True)
        t.start()
        try:
            self.schema()
        finally:
            t.join()
        if failed:
            raise failed[0]

    def kept_blocks(self) -> KeptBlocks | None:
        """The parsed blocks this process keeps across epochs, or None when it keeps none (NOTE [
        Kept blocks ] in sources/decoded.py). Decided once the rows are counted: kept when the
        source's rows, at their parsed width (:meth:`parsed_bytes`), fit ``keep_parsed_bytes``
        (None: the format's default, :func:`~naiad.sources.decoded.default_keep_bytes` for CSV,
        JSON Lines and text, nothing for the others, whose reads decode rather than parse)."""
        kept = self._kept
        if kept is None:
            budget = self.keep_parsed_bytes
            if budget is None:
                budget = default_keep_bytes() if self.traits.keeps_parsed else 0
            if budget and self._blocks is None:
                return None  # not counted yet: decided at a later read
            with _KEEP_DECISION.get():
                if self._kept is None:
                    fits = bool(budget) and self.parsed_bytes() <= budget
                    self._kept = KeptBlocks(self.blocks(), budget) if fits else False
                kept = self._kept
        return kept if isinstance(kept, KeptBlocks) else None

    def parsed_bytes(self) -> int:
        """About the memory the source's rows take parsed, as :meth:`kept_blocks` would keep them
        (may trigger the row count)."""
        return len(self) * row_bytes(self.schema())

    def keep_nothing(self) -> None:
        """Keep no parsed blocks in this copy of the source, and forget any kept (a process
        worker's copy: each would hold its own)."""
        self._kept = False

    def local_bytes(self) -> int | None:
        """The bytes of the source's files together when they are all local (a ``stat`` each,
        once), else None (a remote object's size may cost a request). What the default block
        sizes are a share of: the blocks of a source, not of each file, are what its epoch
        permutation orders."""
        if self._local_bytes is None and not any(is_remote(p) for p in self.paths):
            total = 0
            for path in self.paths:
                try:
                    total += os.path.getsize(path)
                except OSError:
                    pass  # opening it will say what is wrong
            self._local_bytes = total
        return self._local_bytes

    def __len__(self) -> int:
        """Total rows over all files (may trigger the row count)."""
        return sum(b.rows for b in self.blocks())

    def known_rows(self) -> int | None:
        """Total rows when they cost no scan: the blocks are known, or come from metadata (a
        footer, a header); else None."""
        if self._blocks is None and not self.traits.blocks_from_metadata:
            return None
        return len(self)

    def read_block(self, block: Block, lo: int = 0, hi: int | None = None, *, use_threads: bool = False) -> BlockData:
        """Read rows ``lo:hi`` of ``block`` as columns, skipping bad rows if asked to.

        Raises:
            SourceError: naming the file, the line or row, and the problem.
        """
        hi = block.rows if hi is None else hi
        if not 0 <= lo <= hi <= block.rows:
            raise ConfigError(f"rows {lo}:{hi} are outside block {block}.")
        kept = self.kept_blocks()
        columns = kept.gather([(block, lo, hi, None)]) if kept is not None else None
        if columns is not None:
            return BlockData(columns)
        data = self._read(block, lo, hi, use_threads)
        if kept is not None and lo == 0 and hi == block.rows and not data.bad:
            kept.put([(block, block.rows)], data.columns)
        return data

    def read_group(self, parts: Sequence[GroupPart], *, use_threads: bool = False) -> BlockData:
        """The rows of several reads as one chunk, in order: a read group of the plan (NOTE [ Read
        groups ] in plan.py). Each part is ``(block, lo, hi, take)``: rows ``lo:hi`` of the block,
        or only the offsets ``take`` from ``lo`` when it is given. Line-based readers parse every
        part's lines in one call; others read the parts one after another.

        Raises:
            SourceError: naming the file, the line or row, and the problem.
        """
        for block, lo, hi, _ in parts:
            if not 0 <= lo <= hi <= block.rows:
                raise ConfigError(f"rows {lo}:{hi} are outside block {block}.")
        kept = self.kept_blocks()
        columns = None if kept is None else kept.gather(parts)
        if kept is not None and columns is None:
            columns = self._fill_kept(kept, parts, use_threads)
        if columns is not None:
            return BlockData(columns)
        data = self._read_group(list(parts), use_threads)
        if kept is not None and not data.bad and all(take is None and lo == 0 and hi == b.rows for b, lo, hi, take in parts):
            kept.put([(b, b.rows) for b, _, _, _ in parts], data.columns)
        return data

    def _fill_kept(self, kept: KeptBlocks, parts: Sequence[GroupPart], use_threads: bool) -> dict[str, np.ndarray | list[Any]] | None:
        """The parts' rows when some of their blocks are kept: the others parsed whole, kept, and
        the group gathered (NOTE [ Kept blocks ]); None when none are kept, or a block cannot be
        (a skipped bad row, over the budget): the group is then read as it is."""
        missing = kept.missing([block for block, _, _, _ in parts])
        if not missing or len(missing) == len({block for block, _, _, _ in parts}):
            return None
        data = self._read_group([(block, 0, block.rows, None) for block in missing], use_threads)
        if data.bad:
            return None
        kept.put([(block, block.rows) for block in missing], data.columns)
        return kept.gather(parts)

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        """The parts as one table when the reader can hand them over so (:meth:`_group_table`),
        cast, checked and converted once; else read one by one (remote ones at once: NOTE [
        Remote read-ahead ]), their columns joined. Anything unusual (a row pick, a damaged
        block, a failed cast, a missing value) takes the one-by-one path, which names the block
        and row. A format that parses a group in one call overrides this (the line formats)."""
        whole_local = len(parts) > 1 and all(take is None and not is_remote(b.path) for b, _, _, take in parts)
        table = self._group_table(parts, use_threads) if whole_local else None
        if table is not None:
            try:
                table = cast_to_schema(table, self.schema(), "a read group", parts[0][0].path)
            except SourceError:
                table = None
        if table is not None and not null_rows(table).size:
            return BlockData(table_to_columns(table), ())

        def one(part: GroupPart) -> BlockData:
            block, lo, hi, take = part
            return self._read(block, lo, hi, use_threads) if take is None else self.read_rows(block, lo + take, use_threads=use_threads)

        datas = io_map(one, parts) if any(is_remote(p[0].path) for p in parts) else [one(p) for p in parts]
        return join_data(datas, [hi - lo if take is None else len(take) for _, lo, hi, take in parts])

    def read_rows(self, block: Block, rows: np.ndarray, *, use_threads: bool = False) -> BlockData:
        """Read only the rows ``rows`` of ``block`` (ascending row numbers within the block).

        Raises:
            SourceError: naming the file, the line or row, and the problem.
        """
        return self.read_rows_many([(block, rows)], use_threads=use_threads)

    def read_rows_many(self, parts: Sequence[tuple[Block, np.ndarray]], *, use_threads: bool = False) -> BlockData:
        """Read the rows ``rows`` of each ``(block, rows)`` part, concatenated in order.

        What a resume reads: the scattered rows a shuffle buffer held, a few from each of many
        blocks. Readers of line-based formats parse only those lines, all in one parse; others
        read each part's span and take its rows.

        Raises:
            SourceError: naming the file, the line or row, and the problem.
            StateError: rows were skipped as bad among a part's span (a resume cannot place them).
        """
        checked = []
        for block, rows in parts:
            rows = np.asarray(rows, np.int64)
            if len(rows) and not (0 <= rows[0] and rows[-1] < block.rows and np.all(np.diff(rows) > 0)):
                raise ConfigError(f"rows to read must ascend within block {block}, got {rows[:8]}...")
            if len(rows):
                checked.append((block, rows))
        if not checked:
            return BlockData(self.empty_columns())
        kept = self.kept_blocks()
        columns = kept.gather([(b, 0, b.rows, rows) for b, rows in checked]) if kept is not None else None
        if columns is not None:
            return BlockData(columns)
        return self._read_rows_many(checked, use_threads)

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        """The parts' rows: by default each part's span, read whole, then taken. A format that
        parses only the rows asked for overrides this (the line formats)."""
        def one(part: tuple[Block, np.ndarray]) -> BlockData:
            return self._read_span_take(part[0], part[1], use_threads)

        datas = io_map(one, parts) if any(is_remote(b.path) for b, _ in parts) else [one(p) for p in parts]
        return join_data(datas, [len(rows) for _, rows in parts])

    def _read_span_take(self, block: Block, rows: np.ndarray, use_threads: bool) -> BlockData:
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        data = self._read(block, lo, hi, use_threads)
        if hi - lo == len(rows):
            return data
        return take_positions(data, hi - lo, rows - lo)

    def empty_columns(self) -> Columns:
        """Zero rows of every column, with the right dtypes (for a rank that has no rows)."""
        out: Columns = {}
        for f in self.schema():
            dt = numpy_dtype(f)
            out[f.name] = [] if dt is None else np.zeros((0, *field_shape(f)), dt)
        return out

    def __getstate__(self) -> dict[str, Any]:
        # The block list can be long (thousands of byte ranges); tasks carry their own block, so
        # workers never need it.
        state = self.__dict__.copy()
        state["_blocks"] = None
        state["_kept"] = None  # a copy decides again, and keeps its own
        state.pop("_counting", None)  # a thread's: the copy counts again if it must
        return state


def join_data(datas: Sequence[BlockData], positions: Sequence[int]) -> BlockData:
    """Reads one after another as one: their columns joined, each skipped row's ``at`` counted
    from the start of the whole (``positions``: how many rows each read was asked for)."""
    if len(datas) == 1:
        return datas[0]
    bad: list[dict[str, Any]] = []
    offset = 0
    for d, n in zip(datas, positions):
        bad += [{**e, "at": e["at"] + offset} for e in d.bad]
        offset += n
    return BlockData(concat_columns([d.columns for d in datas]), tuple(bad))


def take_positions(data: BlockData, span: int, rel: np.ndarray) -> BlockData:
    """The rows at positions ``rel`` (ascending) of ``data``, a read of ``span`` positions some of
    which were skipped as bad: the good ones' values, the bad ones' entries (renumbered)."""
    if not data.bad:
        return BlockData({k: _take(v, rel) for k, v in data.columns.items()})
    at = np.array([e["at"] for e in data.bad], np.int64)
    keep = np.ones(span, bool)
    keep[at] = False
    compact = np.cumsum(keep) - 1  # position -> index among the rows kept
    columns = {k: _take(v, compact[rel[keep[rel]]]) for k, v in data.columns.items()}
    where = np.minimum(np.searchsorted(rel, at), len(rel) - 1)
    bad = tuple({**e, "at": int(w)} for e, w, a in zip(data.bad, where.tolist(), at.tolist()) if rel[w] == a)
    return BlockData(columns, bad)


def _take(column: np.ndarray | list[Any], rows: np.ndarray) -> np.ndarray | list[Any]:
    if isinstance(column, np.ndarray):
        taken: np.ndarray = column[rows]
        return taken
    return [column[i] for i in rows.tolist()]


