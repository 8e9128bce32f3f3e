"""``naiad.read``: the reader chosen by the files' suffix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from naiad.errors import ConfigError
from naiad.sources.arrow import read_arrow
from naiad.sources.base import Source
from naiad.sources.csv import CsvFormat, read_csv
from naiad.sources.jsonl import read_jsonl
from naiad.sources.npy import read_npy
from naiad.sources.options import StorageLike, old_storage
from naiad.sources.parquet import read_parquet
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.storage import Storage
from naiad.sources.text import read_text
from naiad.sources.webdataset import read_webdataset

__all__ = ["READERS", "read", "reader_name"]

READERS: dict[str, tuple[type[Source], dict[str, Any]]] = {
    ".csv": (read_csv, {}),
    ".tsv": (read_csv, {"csv": CsvFormat(delimiter="\t")}),
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


def read(paths: PathLike, *, storage: StorageLike = None, **options: Any) -> Source:
    """A lazy source over ``paths`` (a file, a glob or a list), with the reader for their suffix.

    ``.csv``/``.tsv`` (also compressed: ``.csv.gz``, ``.csv.zst``), ``.parquet``,
    ``.arrow``/``.feather``/``.ipc``, ``.jsonl``/``.ndjson``, ``.npy``, ``.txt`` and ``.tar``
    (WebDataset shards). ``options`` go to that reader (``columns=``, ``dtypes=``,
    ``on_bad_rows=``, ...); ``storage`` is every reader's (a ``naiad.Storage``, or a dict of its
    filesystem options), so ``paths`` may be URLs (``s3://bucket/train-*.parquet``;
    docs/STORAGE.md). A ``.tsv`` file is read with a tab delimiter unless ``csv=`` names another.

    Raises:
        SourceError: no file matches.
        ConfigError: the files' suffix has no reader, or the files mix formats.

    Example:
        >>> ds = naiad.read("train-*.parquet", columns=["x", "y"])  # doctest: +SKIP
    """
    # Listed once: the reader gets the files and the Storage that recorded them.
    store = Storage.of(old_storage("read", storage, options))
    files = expand_paths(paths, store)
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
    return reader(files, **_with_implied(implied, options), storage=store)


def _with_implied(implied: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``options`` over what the suffix implies; a ``CsvFormat`` given without a delimiter takes
    the suffix's (a ``.tsv`` file's tab)."""
    out = {**implied, **options}
    given, suffix_csv = options.get("csv"), implied.get("csv")
    if isinstance(given, CsvFormat) and isinstance(suffix_csv, CsvFormat) and given.delimiter is None:
        out["csv"] = replace(given, delimiter=suffix_csv.delimiter)
    return out


def reader_name(paths: PathLike) -> str:
    """The name of the reader :func:`read` uses for ``paths`` (``"read_parquet"``), for messages."""
    suffix = _suffix(expand_paths(paths)[0])
    return READERS[suffix][0].reader_name if suffix in READERS else "none"


def _suffix(path: str) -> str:
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED and len(suffixes) > 1:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""
