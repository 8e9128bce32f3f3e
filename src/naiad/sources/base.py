"""The :class:`Source` interface shared by every file format, and the :class:`Block` it is cut into.

A source is a lazy description of some files: constructing one reads at most metadata (a CSV
header, a Parquet footer). At first iteration it is cut into *blocks* (byte ranges of a text
file, row groups, record batches, row ranges), each with an exact row count, so the epoch plan
(:mod:`naiad.plan`) is a pure function of the row counts. Workers only ever call
:meth:`Source.read_block`; the source object crosses the process boundary once, inside the
handler factory.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.ledger import check_max_bad_rows
from naiad.parallel.threads import one_core_each, usable_cores
from naiad.sources.cache import CacheDir
from naiad.sources.columns import (
    Columns,
    cast_to_schema,
    concat_columns,
    null_rows,
    numpy_dtype,
    row_bytes,
    table_to_columns,
)
from naiad.sources.decoded import KeptBlocks, default_keep_bytes
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.readahead import io_map
from naiad.sources.retries import RetryPolicy
from naiad.sources.storage import Storage, is_remote

__all__ = [
    "Block",
    "BlockData",
    "GroupPart",
    "OnBadRows",
    "Source",
    "bad_entry",
    "default_block_rows",
    "join_data",
    "take_positions",
]


OnBadRows = Literal["raise", "skip"]


class Block(NamedTuple):
    """One unit of reading: plain data, so it pickles cheaply and prints clearly in errors.

    Attributes:
        path: the file.
        start: first byte (text formats), row group / record batch index, or first row (npy).
        stop: end of the byte range, index + 1, or end row (npy); -1 means the whole file.
        rows: number of rows (samples) in the block.
        first_line: 1-based line of the block's first line (text formats) or 0-based row of its
            first row in the file (columnar formats); used in error messages.
    """

    path: str
    start: int
    stop: int
    rows: int
    first_line: int


GroupPart = tuple[Block, int, int, "np.ndarray | None"]
"""One read of a group: (block, lo, hi, take) as in :class:`~naiad.plan.ReadTask`."""


class BlockData(NamedTuple):
    """What a worker returns for one task: the columns, and the rows it skipped as bad.

    Attributes:
        columns: the rows read, less the skipped ones.
        bad: one entry per skipped row (``on_bad_rows="skip"``), in order: ``{"at": its position
            among the rows asked for, "file": path, "line": 1-based line (text formats) or
            "row": 0-based row (columnar formats), "column": name (when known), "reason": str}``.
            A skipped row keeps its position, so a resume can place every row (NOTE [ Bad rows
            keep their positions ] in naiad/ledger.py).
    """

    columns: Columns
    bad: tuple[dict[str, Any], ...] = ()

    @property
    def bad_rows(self) -> int:
        """How many rows were skipped."""
        return len(self.bad)


def default_block_rows(file_rows: int, file_bytes: int, source_bytes: int | None) -> int:
    """Rows per block of a file of ``file_rows`` rows in ``file_bytes`` bytes, for a source of
    ``source_bytes`` (None: the file alone): about 1/4096 of the source's rows, estimated from
    its bytes at this file's bytes per row, between 1,024 and 65,536 (as
    ``lines.default_block_bytes`` for text)."""
    rows = file_rows
    if source_bytes and file_bytes > 0:
        rows = file_rows * source_bytes // file_bytes
    return int(min(1 << 16, max(1 << 10, rows // 4096)))


def bad_entry(at: int, path: str, reason: str, *, line: int | None = None, row: int | None = None,
              column: str | None = None) -> dict[str, Any]:
    """One skipped row for :attr:`BlockData.bad` (``line`` for text formats, ``row`` for others;
    each only when known)."""
    out: dict[str, Any] = {"at": at, "file": path}
    for key, value in (("line", line), ("row", row), ("column", column)):
        if value is not None:
            out[key] = value
    out["reason"] = reason
    return out


_KEEP_DECISION = threading.Lock()


class Source(ABC):
    """A lazy, picklable description of the files to stream, cut into blocks with row counts.

    Sources are made by the readers (:func:`naiad.read_csv` and friends) and are passed to
    ``naiad.DataLoader`` as its ``dataset``. Construction reads at most metadata; the blocks and
    their row counts are computed at first use and cached (for CSV, JSONL and text this is one
    sequential scan for newlines; for Parquet, Arrow IPC and npy it is metadata only).

    Attributes:
        paths: the files (local paths or URLs), in the order they are planned.
        on_bad_rows: "raise" (a :class:`~naiad.SourceError`) or "skip" (counted, reported).
        max_bad_rows: with "skip", the most bad rows an epoch may skip on a rank: a count (int)
            or a fraction (float) of the rows the rank reads in the epoch; past it, a
            SourceError summarises them. None: no limit.
        storage: how remote files are reached (options, retries, the local cache; docs/STORAGE.md).
    """

    blocks_from_metadata: ClassVar[bool] = False
    """Whether the blocks are the file's own parts, read from its metadata (row groups, record
    batches) rather than cut to a size: they may be large (see ``stream.default_buffer_rows``)."""

    keeps_parsed: ClassVar[bool] = False
    """Whether this format keeps its parsed blocks across epochs by default, when they fit the
    budget: parsing costs far more than reading (NOTE [ Kept blocks ] in sources/decoded.py)."""

    keep_parsed_bytes: int | None = None  # the reader's option; class defaults for subclasses
    _kept: KeptBlocks | bool | None = None  # that build themselves (coverage.PositionSource)
    _local_bytes: int | None = None  # local_bytes(), once
    _counting: Future[list[Block]] | None = None  # count_beside()'s

    def __init__(
        self, paths: PathLike, *, on_bad_rows: OnBadRows = "raise", max_bad_rows: int | float | None = None,
        storage_options: Mapping[str, Any] | Storage | None = None, retry: RetryPolicy | None = None,
        cache_dir: CacheDir = None, cache_bytes: int | None = None, keep_parsed_bytes: int | None = None,
    ) -> None:
        if keep_parsed_bytes is not None and keep_parsed_bytes < 0:
            raise ConfigError(f"`keep_parsed_bytes` must be >= 0 (0: keep nothing), got {keep_parsed_bytes}.")
        if on_bad_rows not in ("raise", "skip"):
            raise ConfigError(f"`on_bad_rows` must be 'raise' or 'skip', got {on_bad_rows!r}.")
        if max_bad_rows is not None and on_bad_rows != "skip":
            raise ConfigError(f"`max_bad_rows` limits the rows on_bad_rows='skip' skips; got it with on_bad_rows={on_bad_rows!r}.")
        self.storage = Storage.of(storage_options, retry, cache_dir=cache_dir, cache_bytes=cache_bytes)
        self.paths: list[str] = expand_paths(paths, self.storage)
        self.on_bad_rows: OnBadRows = on_bad_rows
        self.max_bad_rows = check_max_bad_rows(max_bad_rows)
        self._schema: pa.Schema | None = None
        self._blocks: list[Block] | None = None
        self.keep_parsed_bytes = keep_parsed_bytes
        self._kept: KeptBlocks | bool | None = None  # None: not decided yet; False: keep nothing

    # -- what subclasses provide ------------------------------------------------------------

    @abstractmethod
    def _read_schema(self) -> pa.Schema:
        """The output schema (after column selection and dtypes), from metadata or a sample."""

    @abstractmethod
    def _file_blocks(self, path: str) -> list[Block]:
        """Cut one file into blocks with exact row counts."""

    @abstractmethod
    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        """Rows ``lo:hi`` of ``block`` (row positions counted before any bad row is skipped)."""

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
        :meth:`count_beside` is waited for."""
        if self._blocks is None:
            counting = self._counting
            if counting is not None:
                return counting.result()
            self._blocks = self._cut_files()
        return self._blocks

    def _cut_files(self) -> list[Block]:
        threads = min(usable_cores(), len(self.paths), 8)
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="naiad-blocks", initializer=one_core_each) as pool:
                per_file = list(pool.map(self._file_blocks, self.paths))
        else:
            per_file = [self._file_blocks(path) for path in self.paths]
        return [b for blocks in per_file for b in blocks]

    def count_beside(self) -> None:
        """Start cutting and counting the files on a thread of their own, while this one goes on
        (NOTE [ Early reads ] in naiad/early.py); :meth:`blocks` waits for it."""
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
        reads that start beside the count (NOTE [ Early reads ] in naiad/early.py); None when
        the format or a file does not cut that way, or the blocks are known or being counted."""
        if self._blocks is not None or self._counting is not None:
            return None
        out: list[Block] = []
        for path in self.paths:
            cut = self._early_cut(path)
            if cut is None:
                return None
            out += cut
        return out

    def _early_cut(self, path: str) -> list[Block] | None:
        """``path``'s blocks before their rows are counted, where the format can cut it so."""
        return None

    def early_rows(self, block: Block) -> int:
        """The rows of a block of :meth:`early_blocks`, counted alone as :meth:`blocks` would."""
        raise NotImplementedError(f"{type(self).__name__} has no early blocks")

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
                budget = default_keep_bytes() if self.keeps_parsed else 0
            if budget and self._blocks is None:
                return None  # not counted yet: decided at a later read
            with _KEEP_DECISION:
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

    def __getitem__(self, index: Any) -> Any:
        # A Source is streamed by naiad.DataLoader, never indexed; reaching here means a torch
        # DataLoader was made over it (Accelerate's prepare() or a trainer rebuilt the loader).
        raise ConfigError(
            f"{type(self).__name__} is streamed by naiad.DataLoader, not indexed by a torch DataLoader: "
            "something rebuilt the loader as torch's. Give the trainer naiad's loader itself: "
            "accelerator.prepare() keeps it as it is."
        )

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
        if self._blocks is None and not self.blocks_from_metadata:
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

    def _fill_kept(self, kept: KeptBlocks, parts: Sequence[GroupPart], use_threads: bool) -> dict[str, np.ndarray | list] | None:
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
        and row."""
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

    def _group_table(self, parts: list[GroupPart], use_threads: bool) -> pa.Table | None:
        """The rows of several whole-range reads of local files, in order, as one Arrow table in
        the file's types, when this reader can read them together cheaper than one by one (one
        decode call, zero-copy slices); None to read them one by one (also when one of them
        fails: that path names the block)."""
        return None

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
        """The parts' rows: by default each part's span, read whole, then taken."""
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
            dt = numpy_dtype(f.type)
            if dt is None:
                out[f.name] = []
            elif pa.types.is_fixed_size_list(f.type):
                out[f.name] = np.zeros((0, f.type.list_size), dt)
            else:
                out[f.name] = np.zeros(0, dt)
        return out

    def __repr__(self) -> str:
        files = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"
        return f"{type(self).__name__}({files!r})"

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


def _take(column: np.ndarray | list, rows: np.ndarray) -> np.ndarray | list:
    if isinstance(column, np.ndarray):
        return column[rows]
    return [column[i] for i in rows.tolist()]


