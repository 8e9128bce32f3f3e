"""The :class:`Source` every reader returns: a format's contract joined to the block-reading engine.

A source is a lazy description of some files: constructing one reads at most metadata (a CSV
header, a Parquet footer). At first iteration it is cut into *blocks* (byte ranges of a text
file, row groups, record batches, row ranges), each with an exact row count, so the epoch plan
(:mod:`naiad.stream.plan`) is a pure function of the row counts. Workers only ever call
:meth:`Source.read_block` (or a group or rows of blocks); the source object crosses the process
boundary once, inside the handler factory.

What a format supplies is in :mod:`naiad.sources.contract` (NOTE [ Format contract ]), what
every source does with it in :mod:`naiad.sources.engine`; this module adds the options every
reader takes. ``Block``, ``BlockData`` and the helpers are re-exported here, where callers have
always found them.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from naiad.errors import ConfigError
from naiad.sources.contract import (
    Block,
    BlockData,
    GroupPart,
    OnBadRows,
    SourceTraits,
    bad_entry,
    default_block_rows,
)
from naiad.sources.engine import BlockEngine, join_data, take_positions
from naiad.sources.options import (
    BadRows,
    MaxBadRows,
    SkipBadRows,
    StorageLike,
    bad_rows_policy,
    check_max_bad_rows,
    old_bad_rows,
    old_storage,
    refuse_unknown,
)
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.storage import Storage

__all__ = [
    "BadRows",
    "Block",
    "BlockData",
    "GroupPart",
    "MaxBadRows",
    "OnBadRows",
    "SkipBadRows",
    "Source",
    "SourceTraits",
    "StorageLike",
    "bad_entry",
    "check_max_bad_rows",
    "default_block_rows",
    "join_data",
    "take_positions",
]


class Source(BlockEngine):
    """A lazy, picklable description of the files to stream, cut into blocks with row counts.

    Sources are made by the readers (:func:`naiad.read_csv` and friends: each reader is its
    source class) and are passed to ``naiad.DataLoader`` as its ``dataset``. Construction reads
    at most metadata; the blocks and their row counts are computed at first use and cached (for
    CSV, JSONL and text this is one sequential scan for newlines; for Parquet, Arrow IPC and npy
    it is metadata only).

    A new format subclasses it, calls this initialiser and writes ``_read_schema``,
    ``_file_blocks`` and ``_read`` (NOTE [ Format contract ] in sources/contract.py); the
    engine it inherits (:class:`~naiad.sources.engine.BlockEngine`) does the rest. A source made
    of another is a :class:`~naiad.sources.wrapper.FormatWrapper`.

    The options the readers share, documented here once (NOTE [ Reader options ] in
    sources/options.py; each reader names those it takes):

    Args:
        paths: a file, a glob (``"data/*.csv"``), a brace range (``"train-{0000..0099}.tar"``),
            a local folder (its data files: hidden ``.*``, ``_*`` markers and ``naiad
            convert``'s manifests left out), a URL or URL glob (``"s3://bucket/data/*.csv"``),
            or a list of them; files are read in this order.
        on_bad_rows: what a bad row (one the format cannot read as the schema says) does:
            "raise" a :class:`~naiad.SourceError` naming the file, the line or row and the
            problem; "skip" it, counted and kept in the loader's ledger (docs/STREAMING.md, "Bad
            input"); or :class:`~naiad.sources.options.SkipBadRows` (``naiad.SkipBadRows``):
            skip, at most ``max_rows`` an epoch on a rank (a count, or a fraction of the rows
            the rank reads), past which a SourceError summarises them.
        storage: where the bytes of URLs live and how they are fetched: a
            :class:`~naiad.sources.storage.Storage` (``naiad.Storage``: the fsspec filesystem's
            options, the retry policy, a local cache of fetched byte ranges; docs/STORAGE.md),
            or a dict of the filesystem's options; None: the environment's credentials, the
            default retries, no cache.
        keep_parsed_bytes: the most memory for parsed blocks kept across epochs in the process
            that reads them, so that later epochs gather rows instead of parsing again (NOTE [
            Kept blocks ] in sources/decoded.py): kept only when every row fits (None: 1/16 of
            the memory, at most 1 GiB, for the formats that parse: CSV, JSON Lines, text; 0:
            keep nothing).
        expand: for a format: False takes ``paths`` as the source's parts as they are (an
            image folder's root, the names of parts held in memory), not looked up as files.
        deprecated: the keywords of the release before a reader was given (NOTE [ Reader
            options ]), folded into ``on_bad_rows`` and ``storage`` with a warning.

    Options of several readers, each documented once here too:

    - ``columns``: keep only these columns (the output keeps the file's order).
    - ``dtypes``: a mapping column -> dtype (``"float32"``, ``np.int64``, ``pa.string()``...),
      or one dtype for every numeric column (``dtypes="float32"``).
    - ``block_bytes``: the size of a block, the unit of reading and of block shuffling (None:
      about 1/4096 of the source's bytes; each reader says its bounds).
    - ``index_dir``: where what the first count learned is kept (the block index of line-based
      files, the member indexes of tar shards, an image folder's listing), so that a new
      process, every rank and a resume skip it: None (naiad's user cache folder), "beside" (a
      ``.naiad-index`` folder next to the files), a folder, or False (never kept). A file
      whose size or modification time changed is counted again.
    - ``media``: a :class:`~naiad.trust.paths.MediaAccess` (``naiad.MediaAccess``): the folders
      or URL prefixes the paths inside a table may name besides the table's own folder
      (``roots``), and the most bytes one such file may hold (``max_bytes``, 256 MiB);
      docs/SECURITY.md.

    Attributes:
        paths: the files (local paths or URLs), in the order they are planned.
        on_bad_rows: "raise" or "skip".
        max_bad_rows: with "skip", the most bad rows an epoch may skip on a rank (``SkipBadRows``'s
            ``max_rows``); None: no limit.
        storage: the source's own copy of its Storage.
        traits: what the planner knows of it besides its blocks (NOTE [ Source traits ]).
    """

    reader_name: ClassVar[str] = ""
    """The reader users call for this class (``"read_csv"``), for messages; "" for a class no
    reader makes."""

    max_bad_rows: MaxBadRows = None  # a class default for sources that build themselves

    def __init__(
        self, paths: PathLike, *, on_bad_rows: BadRows = "raise", storage: StorageLike = None,
        keep_parsed_bytes: int | None = None, expand: bool = True, deprecated: dict[str, Any] | None = None,
    ) -> None:
        if deprecated:
            who = self.reader_name or type(self).__name__
            storage = old_storage(who, storage, deprecated)
            on_bad_rows = old_bad_rows(who, on_bad_rows, deprecated)
            refuse_unknown(who, deprecated)
        if keep_parsed_bytes is not None and keep_parsed_bytes < 0:
            raise ConfigError(f"`keep_parsed_bytes` must be >= 0 (0: keep nothing), got {keep_parsed_bytes}.")
        self.on_bad_rows, self.max_bad_rows = bad_rows_policy(on_bad_rows)
        self.storage = Storage.of(storage)
        if expand:
            self.paths = expand_paths(paths, self.storage)
        else:
            self.paths = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self._schema = None
        self._blocks = None
        self.keep_parsed_bytes = keep_parsed_bytes
        self._kept = None  # None: not decided yet; False: keep nothing

    @property
    def bad_rows(self) -> BadRows:
        """The source's ``on_bad_rows`` as a reader takes it: "raise" or a :class:`SkipBadRows`."""
        return SkipBadRows(self.max_bad_rows) if self.on_bad_rows == "skip" else "raise"

    def __getitem__(self, index: Any) -> Any:
        # A Source is streamed by naiad.DataLoader, never indexed; reaching here means a torch
        # DataLoader was made over it (Accelerate's prepare() or a trainer rebuilt the loader).
        raise ConfigError(
            f"{type(self).__name__} is streamed by naiad.DataLoader, not indexed by a torch DataLoader: "
            "something rebuilt the loader as torch's. Give the trainer naiad's loader itself: "
            "accelerator.prepare() keeps it as it is."
        )

    def __repr__(self) -> str:
        files = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"
        return f"{type(self).__name__}({files!r})"
