"""Hugging Face ``datasets`` as they are: a ``Dataset`` read from its own Arrow cache files, or a
``save_to_disk`` folder, through ``read_arrow`` (``naiad.read_hf``).

NOTE [ Hugging Face datasets ]
A ``datasets.Dataset`` is a table of Arrow IPC *stream* files (its ``cache_files``), memory-mapped,
and maybe an *indices mapping*: the rows it shows, as row numbers of that table, left by
``select``, ``shuffle``, ``filter`` or ``train_test_split`` (which write no new data). Its table
may also be a slice of its files (a contiguous ``select``) or a vertical concatenation of them
(``concatenate_datasets``, ``load_from_disk`` of several shards). So a dataset is read as
(files, row mapping): :func:`read_hf` walks ``dataset.data`` (the public ``datasets.table.Table``:
``MemoryMappedTable`` pieces, each a file and the slice its replays say, under
``ConcatenationTable`` rows) into the rows of its files in order, and applies the indices mapping
on top. When that is every row of every file in order, the source is ``read_arrow`` over the
files; otherwise it is :class:`HFSource`, whose blocks are runs of the mapping and whose reads
take those rows from the files' record batches (``ArrowSource.read_positions``: views of the
memory maps, one ``take``), so the plan, the shuffle, exactly-once and the resumes are a
stream's, over the dataset's rows in its own order.

``datasets`` keeps the mapping in ``Dataset._indices`` and offers no public accessor: it is
read there, checked to be what it has always been (a table of one unsigned integer column, a row
number of the table per row of the dataset), and anything else is refused with the fix that
always works, ``dataset.flatten_indices()``, which writes the rows as they are shown to a new
cache file. The same fix is named for a table that cannot be read from its files: one held in
memory (``Dataset.from_dict``: ``save_to_disk`` it, or give the folder), columns joined from
several tables, or renamed or cast in memory since the files were written. A ``save_to_disk``
folder has no mapping (it is written flattened): its ``state.json`` lists its shards.

``Image`` and ``Audio`` columns are the ``{bytes, path}`` struct the readers already read as
bytes (NOTE [ Media structs ] in media.py); a ``ClassLabel`` is stored as int64.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.arrow import ArrowSource
from naiad.sources.base import Source
from naiad.sources.columns import DTypes
from naiad.sources.contract import Block, BlockData, GroupPart
from naiad.sources.index import IndexDir
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.storage import Storage, is_remote
from naiad.trust.paths import MediaAccess

__all__ = ["HFSource", "read_hf"]

_STATE_MAX_BYTES = 16 << 20  # a state.json lists its shards: a few hundred bytes each
_SAME_ROWS = frozenset(("replace_schema_metadata", "combine_chunks", "drop", "remove_column", "select", "cast"))
_FIX = ("call dataset = dataset.flatten_indices() first (it writes the rows as they are shown to a new cache file), "
        "or save_to_disk it and read the folder")


def read_hf(
    dataset: Any,
    *,
    columns: Sequence[str] | None = None,
    dtypes: DTypes = None,
    on_bad_rows: BadRows = "raise",
    block_rows: int | None = None,
    storage: StorageLike = None,
    media: MediaAccess | None = None,
    index_dir: IndexDir = None,
) -> Source:
    """A Hugging Face ``datasets.Dataset``, or a ``save_to_disk`` folder, as a naiad source:
    read from its own Arrow files, zero copy, with its indices mapping (``select``, ``shuffle``,
    ``filter``, ``train_test_split``) honoured (NOTE [ Hugging Face datasets ]).

    ``Image`` and ``Audio`` columns arrive as bytes, ready for :func:`naiad.decode_images` and
    :func:`naiad.decode_audio`; ``ClassLabel`` columns as int64. The source streams as every
    other: block shuffle, every row once across ranks and workers, exact and elastic resume.

    Args:
        dataset: a ``datasets.Dataset`` whose table is in cache files (``load_dataset``,
            ``load_from_disk``, and what ``map``/``filter``/``select``... make of them), or the
            folder (local or a URL) ``Dataset.save_to_disk`` wrote. A ``DatasetDict`` is refused:
            pass one split.
        columns, dtypes, on_bad_rows, storage, media, index_dir: as every reader takes them
            (:class:`~naiad.Source`); ``storage`` reaches a folder behind a URL, ``media`` the
            files an ``Image`` column names by path, ``index_dir`` keeps the walks of the files.
        block_rows: the most rows of a block (None: record batches as ``read_arrow`` cuts them;
            under a mapping, runs of as many rows as those blocks hold on average).

    Returns:
        ``naiad.read_arrow`` over the files when the dataset is every row of them in order, else
        an :class:`HFSource`.

    Raises:
        ConfigError: a ``DatasetDict``, an ``IterableDataset``, a dataset held in memory, or a
            folder that ``save_to_disk`` did not write; each with its fix.

    Example:
        >>> ds = datasets.load_from_disk("cats").shuffle(seed=0)  # doctest: +SKIP
        >>> loader = naiad.DataLoader(naiad.read_hf(ds), batch_size=256, shuffle=True, seed=0,
        ...                           transform=naiad.decode_images(size=224))  # doctest: +SKIP
    """
    store = Storage.of(storage)
    pieces: list[tuple[str, int, int]] | None = None
    mapping: np.ndarray | None = None
    shown: pa.Schema | None = None
    if isinstance(dataset, (str, os.PathLike)):
        files = _folder_files(os.fspath(dataset), store)
    else:
        files, pieces, mapping, shown = _dataset_parts(dataset)
    if columns is not None and shown is not None:
        unknown = [c for c in columns if c not in shown.names]
        if unknown:
            raise ConfigError(f"`columns` {unknown} are not columns of the dataset, which has {shown.names}.")
    # Escaped: a cache folder named like a glob ("run[1]") names its files, not a pattern.
    inner = ArrowSource([f if is_remote(f) else glob.escape(f) for f in files],
                        columns=columns if columns is not None or shown is None else shown.names,
                        dtypes=dtypes, on_bad_rows=on_bad_rows, block_rows=block_rows, storage=store, media=media,
                        index_dir=index_dir)
    if pieces is None:
        return inner
    _check_types(inner, shown)
    rows = _shown_rows(inner, files, pieces, mapping)
    if len(rows) == len(inner) and np.array_equal(rows, np.arange(len(rows))):
        return inner  # every row of every file in order: the files are the dataset
    return HFSource(inner, rows, block_rows=block_rows)


def _shown_rows(inner: ArrowSource, files: list[str], pieces: list[tuple[str, int, int]],
                mapping: np.ndarray | None) -> np.ndarray:
    """The rows of ``inner`` (numbered across its files) that the dataset shows, in its order:
    its table's pieces ``(file, offset, length)``, then its indices mapping over them.

    Raises:
        ConfigError: files or a mapping that do not fit the table.
        SourceError: a piece past its file's rows (the file changed).
    """
    if len(inner.paths) != len(files):
        raise ConfigError(f"the dataset's {len(files)} cache files are {len(inner.paths)} files on disk; {_FIX}.")
    named = dict(zip(files, inner.paths))
    file_rows = dict.fromkeys(inner.paths, 0)
    for b in inner.blocks():
        file_rows[b.path] += b.rows
    starts = dict(zip(inner.paths, np.concatenate([[0], np.cumsum(list(file_rows.values()))]).tolist()))
    runs = []
    for given, offset, length in pieces:
        path = named[given]
        if offset + length > file_rows[path]:
            raise SourceError(f"the dataset's table holds rows {offset}:{offset + length} of a file of "
                              f"{file_rows[path]} rows: did the file change since the dataset was loaded?", path=path)
        runs.append(np.arange(starts[path] + offset, starts[path] + offset + length, dtype=np.int64))
    rows = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    if mapping is None:
        return rows
    if len(mapping) and (mapping.min() < 0 or mapping.max() >= len(rows)):
        raise ConfigError(f"the dataset's indices mapping names rows outside its table of {len(rows)} rows; {_FIX}.")
    shown: np.ndarray = rows[mapping]
    return shown


class HFSource(Source):
    """The rows of a Hugging Face dataset's files that its table and indices mapping show, in its
    order (NOTE [ Hugging Face datasets ]); made by :func:`naiad.read_hf`.

    A block is a run of consecutive rows of the dataset; its read takes their rows from the
    files' record batches at once (:meth:`ArrowSource.read_positions`), as does a read group and a
    resume's scattered rows. The mapping travels with the source to the workers: 8 bytes a row.

    Attributes:
        inner: the ``read_arrow`` source of the dataset's files.
    """

    reader_name = "read_hf"

    def __init__(self, inner: ArrowSource, rows: np.ndarray, *, block_rows: int | None = None) -> None:
        super().__init__(inner.paths, on_bad_rows=inner.bad_rows, storage=inner.storage, expand=False)
        self.inner = inner
        self.traits = inner.traits
        self._rows = np.asarray(rows, np.int64)
        blocks = inner.blocks()
        # As many rows a block as the files' blocks hold: a filter or a slice keeps their reads' size.
        self.block_rows = block_rows or max(1, round(sum(b.rows for b in blocks) / max(1, len(blocks))))

    def __repr__(self) -> str:
        return f"HFSource({len(self._rows)} rows of {self.inner!r})"

    def _read_schema(self) -> pa.Schema:
        return self.inner.schema()

    def _cut_files(self) -> list[Block]:
        # Runs of the mapping, not parts of files: a block's start and stop are positions in it.
        edges = list(range(0, len(self._rows), self.block_rows)) + [len(self._rows)]
        return [Block(self.paths[0], lo, hi, hi - lo, lo) for lo, hi in zip(edges, edges[1:]) if hi > lo]

    def _file_blocks(self, path: str) -> list[Block]:
        return [b for b in self.blocks() if b.path == path]

    def sample_bytes(self) -> int | None:
        """The files' bytes per row (their record batches')."""
        return self.inner.sample_bytes()

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        return self.inner.read_positions(self._rows[block.start + lo:block.start + hi], use_threads=use_threads)

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        wanted = [self._rows[b.start + lo:b.start + hi] if take is None else self._rows[b.start + lo + np.asarray(take)]
                  for b, lo, hi, take in parts]
        return self.inner.read_positions(np.concatenate(wanted), use_threads=use_threads)

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        wanted = np.concatenate([self._rows[b.start + np.asarray(rows, np.int64)] for b, rows in parts])
        return self.inner.read_positions(wanted, use_threads=use_threads)


# -- what a dataset or a folder is made of -------------------------------------------------------


def _refuse_other_kinds(dataset: Any) -> None:
    kind = type(dataset).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise ConfigError(f"read_hf reads one split, got a {kind} of the splits {list(dataset)}: pass one, "
                          f"read_hf(dataset[{next(iter(dataset), 'train')!r}]).")
    if kind == "IterableDataset":
        raise ConfigError("read_hf got a streaming IterableDataset, which has no files to plan: load it without "
                          "streaming=True, or read its Parquet files with naiad.read_parquet.")
    if not (hasattr(dataset, "data") and hasattr(dataset, "cache_files")):
        raise ConfigError(f"read_hf takes a datasets.Dataset or a save_to_disk folder, got {kind}.")


def _dataset_parts(dataset: Any) -> tuple[list[str], list[tuple[str, int, int]], np.ndarray | None, pa.Schema]:
    """(its files, the (file, offset, rows) pieces of its table in order, its indices mapping or
    None, the schema it shows) of a ``datasets.Dataset``."""
    _refuse_other_kinds(dataset)
    table = dataset.data
    pieces = _pieces(table)
    files = list(dict.fromkeys(path for path, _, _ in pieces))
    if not files:
        raise ConfigError(f"the dataset has no rows in cache files; {_FIX}.")
    mapping = None
    indices = getattr(dataset, "_indices", None)  # NOTE [ Hugging Face datasets ]: no public accessor
    if indices is not None:
        try:
            column = indices.column(0)
            if indices.num_columns != 1 or not pa.types.is_unsigned_integer(column.type) or indices.num_rows != len(dataset):
                raise TypeError(f"{indices.num_columns} columns of {column.type}")
            mapping = column.to_numpy().astype(np.int64)
        except (AttributeError, TypeError, IndexError, pa.ArrowException) as exc:
            raise ConfigError(f"the dataset's indices mapping is not the table of row numbers it used to be ({exc}); "
                              f"{_FIX}.") from None
    return files, pieces, mapping, table.schema


def _pieces(table: Any) -> list[tuple[str, int, int]]:
    """The (file, offset, rows) pieces of a ``datasets.table.Table``, in order."""
    kind = type(table).__name__
    if kind == "ConcatenationTable":
        out: list[tuple[str, int, int]] = []
        for row in table.blocks:
            if len(row) != 1:
                raise ConfigError(f"the dataset's columns are joined from several tables (concatenate_datasets(axis=1), "
                                  f"add_column); {_FIX}.")
            out += _pieces(row[0])
        return out
    if kind == "MemoryMappedTable":
        offset = 0
        for name, args, kwargs in table.replays or ():
            if name == "slice":
                offset += int(args[0] if args else kwargs.get("offset", 0))
            elif name not in _SAME_ROWS:
                raise ConfigError(f"the dataset's table was changed in memory ({name}) since its cache file "
                                  f"{table.path} was written; {_FIX}.")
        # Absolute: load_from_disk("saved") keeps the relative path, which a later chdir would break.
        return [(os.path.abspath(os.fspath(table.path)), offset, table.num_rows)]
    raise ConfigError(f"the dataset's table is held in memory ({kind}: Dataset.from_dict, from_pandas, "
                      "keep_in_memory=True), not in cache files; save_to_disk it and read the folder, or "
                      "load_from_disk it first.")


def _check_types(inner: ArrowSource, shown: pa.Schema | None) -> None:
    """Every column the dataset shows has that type in each of its files (a cast in memory has
    not changed it)."""
    if shown is None:
        return
    for path in inner.paths:
        schema = inner.file_schema(path)
        for field in (f for f in shown if f.name in inner.column_names):
            index = schema.get_field_index(field.name)
            if index < 0 or not schema.field(index).type.equals(field.type):
                found = "no such column" if index < 0 else str(schema.field(index).type)
                raise ConfigError(f"the dataset's column {field.name!r} is {field.type} but its cache file {path} "
                                  f"holds {found} (cast or renamed in memory); {_FIX}.")


def _folder_files(folder: str, store: Storage) -> list[str]:
    """The shards a ``save_to_disk`` folder's ``state.json`` lists, in order."""
    state = _read_json(_join(folder, "state.json"), store)
    if state is None:
        splits = _read_json(_join(folder, "dataset_dict.json"), store)
        if isinstance(splits, dict) and isinstance(splits.get("splits"), list):
            names = [str(s) for s in splits["splits"]][:100]
            raise ConfigError(f"{folder} is a DatasetDict saved with the splits {names}: pass one split's folder, "
                              f"read_hf({_join(folder, names[0] if names else 'train')!r}).")
        raise ConfigError(f"{folder} is not a folder Dataset.save_to_disk wrote (no state.json): pass a "
                          "datasets.Dataset, or read Arrow files with naiad.read_arrow.")
    listed = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(listed, list) or not listed:
        raise SourceError("its state.json lists no data files (`_data_files`).", path=_join(folder, "state.json"))
    if state.get("_indices_data_files"):
        raise SourceError(f"its state.json has an indices mapping file, which read_hf does not read; load it and "
                          f"{_FIX}.", path=_join(folder, "state.json"))
    names = []
    for entry in listed:
        name = entry.get("filename") if isinstance(entry, dict) else None
        # Only plain names inside the folder: a state.json is data, and may not send reads elsewhere.
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise SourceError(f"its state.json lists {entry!r}, not the name of a file in the folder.",
                              path=_join(folder, "state.json"))
        names.append(_join(folder, name))
    return names


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if storage.is_remote(folder) else os.path.join(folder, name)


def _read_json(path: str, store: Storage) -> Any:
    """A small JSON file's value, or None when there is none."""
    if storage.is_remote(path):
        if not store.call(path, None, lambda: store.filesystem(path).isfile(storage.object_path(path))):
            return None
    elif not os.path.isfile(path):
        return None
    try:
        size = storage.size(path, store=store)
        if size > _STATE_MAX_BYTES:
            raise SourceError(f"{size:,} bytes, more than a save_to_disk state holds.", path=path)
        return json.loads(storage.read_range(path, 0, size, store=store).decode("utf-8"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"cannot read it ({exc}).", path=path) from None
    except (ValueError, RecursionError) as exc:
        raise SourceError(f"not readable JSON ({type(exc).__name__}).", path=path) from None
