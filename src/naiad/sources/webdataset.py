"""WebDataset tar shards: a sample is the members that share a key, a block a byte range of samples."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.base import Source
from naiad.sources.contract import Block, BlockData, GroupPart, SourceTraits
from naiad.sources.index import Identity, IndexDir, TableFile, check_index_dir, identity
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.paths import PathLike
from naiad.sources.samples import early_grid, extension_type, grid_blocks, sample_block_bytes
from naiad.sources.tarindex import KeptIndexes, ShardIndex, keep_indexes, scan_shard, table_of
from naiad.sources.tarsamples import KEY, read_samples

_LOG = logging.getLogger("naiad.index")

__all__ = ["KEY", "WebDatasetSource", "read_webdataset"]


class WebDatasetSource(Source):
    """A lazy source over WebDataset tar shards (a path, a glob, a brace range, URLs or a list),
    cut into byte ranges of samples: ``naiad.read_webdataset``.

    A sample is the members that share a key, as WebDataset groups them: the name up to the
    first dot of its base name (``train/n0144/x_17.jpg`` and ``train/n0144/x_17.cls`` are the
    sample ``train/n0144/x_17``). A batch is a dict with ``"__key__"`` (a list of str) and one
    entry per extension: ``cls``, ``idx``, ``id`` and ``index`` as int64 tensors, ``txt`` as a
    list of str, ``json`` as a list of parsed values, anything else (``jpg``, ``png``,
    ``flac``...) as a list of ``bytes``, to decode (docs/SAMPLES.md).

    Each shard's members are indexed once by walking its tar headers (NOTE [ Member index ]),
    and the indexes of all the shards are kept in one file like the block index, so a worker, a
    resume or a remote read goes straight to its samples with range reads. Blocks are byte
    ranges of about 1/4096 of the source (NOTE [ Sample blocks ]); a fresh pass on one rank
    reads before every shard is indexed (NOTE [ Early reads ]), and a worker-side transform
    keys each sample by its shard's number times 2**32 plus its number in the shard.

    Args:
        paths, storage: as every reader takes them (:class:`~naiad.Source`).
        extensions: the extensions to read, in this order (``["jpg", "cls"]``); None: those
            every sample of the first shard has, in the order of its first sample. A sample
            without one of them is a bad sample.
        on_bad_rows: what a bad sample does (a member missing, a ``cls`` that is not a number, a
            ``json`` that does not parse, two members with one extension): as every reader's,
            the error naming the shard and the key.
        block_bytes: the grid step blocks are cut on (None: about 1/4096 of the source,
            between 1 MiB and 32 MiB).
        index_dir: where the member indexes are kept (one file for all the shards), as every
            reader's; for URLs, None is the storage's ``cache_dir`` when it has one.

    Example:
        >>> ds = naiad.read_webdataset("shards/train-{0000..0099}.tar")  # doctest: +SKIP
        >>> loader = naiad.DataLoader(ds, batch_size=256, shuffle=True, seed=0)  # doctest: +SKIP
    """

    reader_name = "read_webdataset"
    # Counting a shard's samples is walking its headers, far more than the first reads need:
    # a fresh pass reads from the byte grid while the shards are indexed beside it, whatever
    # their size, keying its samples by shard and sample (NOTE [ Early reads ]).
    traits = SourceTraits(early_cut=True, reads_before_count=True, keys_by_file=True)

    def __init__(
        self,
        paths: PathLike,
        *,
        extensions: Sequence[str] | None = None,
        on_bad_rows: BadRows = "raise",
        block_bytes: int | None = None,
        index_dir: IndexDir = None,
        storage: StorageLike = None,
        **deprecated: Any,
    ) -> None:
        if block_bytes is not None and (isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 512):
            raise ConfigError(f"`block_bytes` must be an int >= 512 (a tar block) or None, got {block_bytes!r}.")
        if extensions is not None:
            if isinstance(extensions, str) or not all(isinstance(e, str) and e for e in extensions):
                raise ConfigError(f"`extensions` must be a list of extension names such as ['jpg', 'cls'], got {extensions!r}.")
            extensions = [e.lower().lstrip(".") for e in extensions]
            if KEY in extensions or len(set(extensions)) != len(extensions):
                raise ConfigError(f"`extensions` must name each extension once, and not {KEY!r}; got {extensions!r}.")
        super().__init__(paths, on_bad_rows=on_bad_rows, storage=storage, deprecated=deprecated)
        self.extensions = list(extensions) if extensions is not None else None
        self.block_bytes = block_bytes
        self.index_dir = check_index_dir(index_dir)
        self._step: int | None = None
        self._init_indexes()
        self.schema()  # the first shard's index: the columns, checked now

    def _init_indexes(self) -> None:
        self._indexes: dict[str, ShardIndex] = {}
        self._indexing: dict[str, Future[ShardIndex]] = {}
        self._index_lock = threading.Lock()
        self._kept_indexes: KeptIndexes | None = None  # the kept indexes, read once when first needed
        self._table: TableFile | None = None  # where they are kept (worked out with them)
        self._idents: dict[str, Identity | None] = {}  # each shard's, as its index was made
        self._walked = 0  # shards walked here (not kept): the kept file is written again

    def __getstate__(self) -> dict[str, Any]:
        # Indexes are loaded again where they are needed (a worker reads few shards), from the
        # index folder when it is kept; locks and futures are this process's.
        state = super().__getstate__()
        for name in ("_indexes", "_indexing", "_index_lock", "_kept_indexes", "_table", "_idents", "_walked"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_indexes()

    # -- the member indexes -------------------------------------------------------------------

    def shard_index(self, path: str) -> ShardIndex:
        """The member index of shard ``path``: made once per process (threads asking together
        wait for one walk), from the kept indexes when they still describe the file."""
        index = self._indexes.get(path)
        if index is not None:
            return index
        with self._index_lock:
            future = self._indexing.get(path)
            mine = future is None
            if future is None:
                future = self._indexing[path] = Future()
        if mine:
            try:
                index = self._load_or_walk(path)
            except BaseException as exc:
                future.set_exception(exc)
                with self._index_lock:
                    self._indexing.pop(path, None)  # a later call tries again
                raise
            self._indexes[path] = index
            future.set_result(index)
        return future.result()

    def _load_or_walk(self, path: str) -> ShardIndex:
        """Shard ``path``'s index from the kept ones when they describe the shard as it is now,
        else walked (its identity taken first: a shard changed during the walk is walked again
        by the next process)."""
        if self.index_dir is False:
            return scan_shard(path, self.storage)
        now = identity(path, self.storage)
        self._idents[path] = now
        for again in (False, True):
            with self._index_lock:
                kept = self._kept_indexes
                if kept is None:
                    self._table = table_of(self.index_dir, self.paths, self.storage)
                if kept is None or (again and kept.outdated(self._table)):
                    # Read once, and again when another process (the one that counted every
                    # shard: a worker's parent) has kept them since: a worker walks no shard twice.
                    kept = self._kept_indexes = KeptIndexes.load(self._table, self.paths)
                elif again:
                    break
            index = kept.get(path, now)
            if index is not None:
                return index
        self._walked += 1
        return scan_shard(path, self.storage)

    def count_threads(self) -> int:
        """One thread for local shards: their header walk is Python under the GIL, and two
        threads walked 1,000 shards in 0.75-0.87 s against one's 0.58 s (the shards' bytes in the
        page cache); remote shards' threads wait on requests, so they get the default."""
        if not any(storage.is_remote(p) for p in self.paths):
            return 1
        return super().count_threads()

    def _cut_files(self) -> list[Block]:
        t0 = time.perf_counter()
        blocks = super()._cut_files()
        walked, shards, seconds = self._walked, len(self.paths), time.perf_counter() - t0
        if self.index_dir is False:
            _LOG.info("naiad: walked the member index of %d tar shards in %.2f s (index_dir=False: none kept).",
                      shards, seconds)
        elif walked:
            kept = self._kept_indexes
            why = "none was kept" if kept is None or not len(kept) else "the kept one describes other versions of them"
            _LOG.info("naiad: walked the member index of %d of %d tar shards in %.2f s (%s); keeping it in %s.",
                      walked, shards, seconds, why, "nowhere" if self._table is None else self._table.folder)
            # Every shard is indexed now: one file for the next process (NOTE [ Member index ]).
            keep_indexes(self._table, [self._idents.get(p) for p in self.paths], [self._indexes[p] for p in self.paths])
            self._walked = 0
        else:
            _LOG.debug("naiad: reused the kept member index of %d tar shards (%.2f s).", shards, seconds)
        return blocks

    def grid_step(self) -> int:
        """The byte step blocks are cut on (NOTE [ Sample blocks ]): ``block_bytes``, or about
        1/4096 of the shards' bytes together."""
        if self._step is None:
            self._step = self.block_bytes or sample_block_bytes(sum(storage.size(p, store=self.storage) for p in self.paths))
        return self._step

    # -- the format contract ------------------------------------------------------------------

    def _read_schema(self) -> pa.Schema:
        first = self.shard_index(self.paths[0])
        if self.extensions is not None:
            exts = self.extensions
        else:
            exts = [e for i, e in enumerate(first.exts) if len(first) and bool(np.all(first.offsets[i] >= 0))]
            if not exts:
                found = ", ".join(first.exts) or "none"
                raise SourceError(
                    f"no extension is in every sample of the first shard (found: {found}); pass "
                    "`extensions=` to name the ones to read.", path=self.paths[0])
        return pa.schema([pa.field(KEY, pa.string()), *(extension_type(e) for e in exts)])

    def _file_blocks(self, path: str) -> list[Block]:
        index = self.shard_index(path)
        return grid_blocks(path, index.starts, index.size, self.grid_step())

    def _early_cut(self, path: str) -> list[Block] | None:
        return early_grid(path, storage.size(path, store=self.storage), self.grid_step())

    def early_rows(self, block: Block) -> int:
        """The samples of a block of ``early_blocks()``: its shard indexed (once), counted."""
        return self.early_block(block).rows

    def early_block(self, block: Block) -> Block:
        """A block of ``early_blocks()`` as ``blocks()`` has it: its shard indexed (once), its
        samples counted and its first sample's number known (the shard alone tells both)."""
        starts = self.shard_index(block.path).starts
        first, stop = np.searchsorted(starts, [block.start, block.stop]).tolist()
        return block._replace(rows=stop - first, first_line=first)

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        first = self._first_sample(block)
        return self._read_samples([(block.path, np.arange(first + lo, first + hi, dtype=np.int64))])

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        # The group's shards read, then made into columns together (NOTE [ Shard reads ]).
        asks = []
        for block, lo, hi, take in parts:
            first = self._first_sample(block)
            asks.append((block.path, first + (np.arange(lo, hi, dtype=np.int64) if take is None else lo + take)))
        return self._read_samples(asks)

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        # Only the samples asked for: each run of consecutive ones is one range read.
        return self._read_samples([(block.path, self._first_sample(block) + rows) for block, rows in parts])

    def sample_bytes(self) -> int | None:
        """The first shard's bytes per sample (what the default shuffle buffer is sized by)."""
        first = self.shard_index(self.paths[0])
        return max(1, first.size // max(len(first), 1))

    def parsed_bytes(self) -> int:
        """The shards' bytes: what keeping every sample in memory would take."""
        return sum(storage.size(p, store=self.storage) for p in self.paths)

    # -- reading samples ----------------------------------------------------------------------

    def _first_sample(self, block: Block) -> int:
        """The shard's number of the block's first sample: the first that starts in its range
        (an early block, not yet counted, has no first sample of its own)."""
        return int(np.searchsorted(self.shard_index(block.path).starts, block.start))

    def _read_samples(self, asks: list[tuple[str, np.ndarray]]) -> BlockData:
        """Samples of shards (each ask: a shard and its sample numbers, ascending) as columns, bad
        ones raised or skipped (NOTE [ Shard reads ] in tarsamples.py)."""
        if not any(len(rows) for _, rows in asks):
            return BlockData(self.empty_columns())
        return read_samples([(path, self.shard_index(path), rows) for path, rows in asks if len(rows)], self.schema(),
                            self.on_bad_rows, self.storage)


read_webdataset = WebDatasetSource
