"""``naiad.read``: the reader chosen by the files' suffix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from naiad.errors import ConfigError
from naiad.sources.arrow import read_arrow
from naiad.sources.base import Source
from naiad.sources.csv import read_csv
from naiad.sources.jsonl import read_jsonl
from naiad.sources.npy import read_npy
from naiad.sources.parquet import read_parquet
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.storage import Storage
from naiad.sources.text import read_text
from naiad.sources.webdataset import read_webdataset

__all__ = ["READERS", "read", "reader_name"]

READERS: dict[str, tuple[Callable[..., Source], dict[str, Any]]] = {
    ".csv": (read_csv, {}),
    ".tsv": (read_csv, {"delimiter": "\t"}),
    ".parquet": (read_parquet, {}),
    ".feather": (read_arrow, {}),
    ".arrow": (read_arrow, {}),
    ".ipc": (read_arrow, {}),
    ".jsonl": (read_jsonl, {}),
    ".ndjson": (read_jsonl, {}),
    ".npy": (read_npy, {}),
    ".txt": (read_text, {}),
    ".tar": (read_webdataset, {}),
}
"""File suffix -> (reader, the keyword arguments that suffix implies)."""

_COMPRESSED = (".gz", ".zst", ".bz2", ".lz4")


def read(paths: PathLike, **options: Any) -> Source:
    """A lazy source over ``paths`` (a file, a glob or a list), with the reader for their suffix.

    ``.csv``/``.tsv`` (also compressed: ``.csv.gz``, ``.csv.zst``), ``.parquet``,
    ``.arrow``/``.feather``/``.ipc``, ``.jsonl``/``.ndjson``, ``.npy``, ``.txt`` and ``.tar``
    (WebDataset shards). ``options``
    go to that reader (``columns=``, ``dtypes=``, ``storage_options=``, ``cache_dir=``, ...). ``paths`` may be
    URLs (``s3://bucket/train-*.parquet``; docs/STORAGE.md).

    Raises:
        SourceError: no file matches.
        ConfigError: the files' suffix has no reader, or the files mix formats.

    Example:
        >>> ds = naiad.read("train-*.parquet", columns=["x", "y"])  # doctest: +SKIP
    """
    # Listed once: the reader gets the files and the Storage that recorded them.
    storage = Storage(options.pop("storage_options", None), options.pop("retry", None),
                      cache_dir=options.pop("cache_dir", None), cache_bytes=options.pop("cache_bytes", None))
    files = expand_paths(paths, storage)
    suffixes = {_suffix(f) for f in files}
    if len(suffixes) > 1:
        raise ConfigError(f"`paths` mix formats ({', '.join(sorted(suffixes))}); read each format on its own.")
    suffix = suffixes.pop()
    if suffix not in READERS:
        raise ConfigError(
            f"naiad cannot read {files[0]!r}: no reader for {suffix or 'files without a suffix'}; it reads "
            f"{', '.join(sorted(READERS))} (or call a reader such as naiad.read_csv directly)."
        )
    reader, implied = READERS[suffix]
    return reader(files, **{**implied, **options}, storage_options=storage)


def reader_name(paths: PathLike) -> str:
    """The name of the reader :func:`read` uses for ``paths`` (``"read_parquet"``), for messages."""
    suffix = _suffix(expand_paths(paths)[0])
    return READERS[suffix][0].__name__ if suffix in READERS else "none"


def _suffix(path: str) -> str:
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED and len(suffixes) > 1:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""
