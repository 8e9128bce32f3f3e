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

from collections.abc import Mapping
from typing import Any

from naiad.errors import ConfigError
from naiad.sources.cache import CacheDir
from naiad.sources.contract import (
    Block,
    BlockData,
    GroupPart,
    OnBadRows,
    bad_entry,
    default_block_rows,
)
from naiad.sources.engine import BlockEngine, join_data, take_positions
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.retries import RetryPolicy
from naiad.sources.storage import Storage

__all__ = [
    "Block",
    "BlockData",
    "GroupPart",
    "MaxBadRows",
    "OnBadRows",
    "Source",
    "bad_entry",
    "check_max_bad_rows",
    "default_block_rows",
    "join_data",
    "take_positions",
]

MaxBadRows = int | float | None


def check_max_bad_rows(value: Any) -> MaxBadRows:
    """``max_bad_rows`` checked: None, a count (int >= 0), or a fraction (0 < float < 1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"`max_bad_rows` must be an int count or a float fraction, got {value!r}.")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"`max_bad_rows` must be >= 0, got {value}.")
        return value
    if not 0.0 < value < 1.0:
        raise ConfigError(f"`max_bad_rows` as a fraction must be between 0 and 1, got {value}; a count is an int.")
    return float(value)


class Source(BlockEngine):
    """A lazy, picklable description of the files to stream, cut into blocks with row counts.

    Sources are made by the readers (:func:`naiad.read_csv` and friends) and are passed to
    ``naiad.DataLoader`` as its ``dataset``. Construction reads at most metadata; the blocks and
    their row counts are computed at first use and cached (for CSV, JSONL and text this is one
    sequential scan for newlines; for Parquet, Arrow IPC and npy it is metadata only).

    A new format subclasses it and writes ``_read_schema``, ``_file_blocks`` and ``_read``
    (NOTE [ Format contract ] in sources/contract.py); the engine it inherits
    (:class:`~naiad.sources.engine.BlockEngine`) does the rest.

    Attributes:
        paths: the files (local paths or URLs), in the order they are planned.
        on_bad_rows: "raise" (a :class:`~naiad.SourceError`) or "skip" (counted, reported).
        max_bad_rows: with "skip", the most bad rows an epoch may skip on a rank: a count (int)
            or a fraction (float) of the rows the rank reads in the epoch; past it, a
            SourceError summarises them. None: no limit.
        storage: how remote files are reached (options, retries, the local cache; docs/STORAGE.md).
    """

    max_bad_rows: MaxBadRows = None  # the reader's option; a class default for sources that build themselves

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
        self.paths = expand_paths(paths, self.storage)
        self.on_bad_rows = on_bad_rows
        self.max_bad_rows = check_max_bad_rows(max_bad_rows)
        self._schema = None
        self._blocks = None
        self.keep_parsed_bytes = keep_parsed_bytes
        self._kept = None  # None: not decided yet; False: keep nothing

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
