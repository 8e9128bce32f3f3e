"""NumPy ``.npy`` files, memory-mapped: blocks are row ranges of the first axis."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.base import Source
from naiad.sources.columnar import ReaderCache
from naiad.sources.columns import Columns, DTypes, to_arrow_type
from naiad.sources.contract import Block, BlockData, default_block_rows
from naiad.sources.options import BadRows, StorageLike, old_storage
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.storage import Storage
from naiad.trust.npy_header import read_npy_header

__all__ = ["NpySource", "read_npy"]


class RemoteNpy:
    """A remote ``.npy`` object read by row ranges: the header once, then one range request
    per slice of rows (what a memory map gives for a local file), through ``store``, its
    source's Storage."""

    def __init__(self, url: str, store: Storage) -> None:
        self.url = url
        self._store = store
        with storage.open_input(url, 1 << 16, store=store) as f:
            try:
                shape, fortran, dtype = read_npy_header(f)
            except ValueError as exc:
                raise SourceError(f"not a readable .npy file ({exc}); is it truncated?", path=url) from None
            self.offset = f.tell()
        _check_rows(url, shape, dtype)
        if fortran and len(shape) > 1:
            raise SourceError("a Fortran-order array cannot be read by row ranges; save it in C order.", path=url)
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype: np.dtype = dtype
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, step = rows.indices(self.shape[0])
        if step != 1:
            raise IndexError("rows are read as contiguous ranges")
        b = max(a, b)
        data = storage.read_range(self.url, self.offset + a * self._row_bytes, self.offset + b * self._row_bytes,
                                  store=self._store)
        return np.frombuffer(data, self.dtype).reshape((b - a, *self.shape[1:]))


def _check_rows(path: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """A SourceError unless the header's array can be read as rows: not of objects (they would
    need pickle), and with a first axis."""
    if dtype.hasobject:
        raise SourceError("object arrays are not read (they would need pickle).", path=path)
    if not shape:
        raise SourceError("expected an array with a first (row) axis, got a scalar.", path=path)


def _load(path: str, store: Storage | None = None) -> np.ndarray | RemoteNpy:
    if storage.is_remote(path):
        return RemoteNpy(path, storage.needs_store(path, store))
    try:
        # The header read here, not by NumPy's np.load (NOTE [ npy headers without ast ] in
        # naiad/trust/npy_header.py), then the rest mapped as np.load(mmap_mode="r") maps it.
        with open(path, "rb") as f:
            shape, fortran, dtype = read_npy_header(f)
            offset = f.tell()
        _check_rows(path, shape, dtype)
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    except FileNotFoundError:
        raise SourceError("file not found.", path=path) from None
    except SourceError:
        raise
    except Exception as exc:
        # A damaged header fails in many ways (ValueError names the problem; an OSError or a map
        # longer than the file): all are this file's.
        raise SourceError(f"not a readable .npy file ({type(exc).__name__}: {exc}); is it truncated?", path=path) from None


# Opening parses the header (a Python literal) and maps the file: once per file and thread, not
# once per block.
_MAPS = ReaderCache(_load, ".npy file", "is it truncated?")


def _open(path: str, store: Storage) -> np.ndarray | RemoteNpy:
    """The memory-mapped array of ``path`` (or a remote one, read through ``store``, its source's
    Storage; cached per thread), or a SourceError."""
    arr: np.ndarray | RemoteNpy = _MAPS.get(path, store)
    return arr


class NpySource(Source):
    """A lazy source over memory-mapped ``.npy`` files; a block is ``block_rows`` rows of the
    first axis: ``naiad.read_npy``.

    An array of shape ``(n, ...)`` gives one column of that name whose batches have shape
    ``(batch, ...)``; a structured array gives one column per field. A mapping
    ``{"x": "x-*.npy", "y": "y-*.npy"}`` reads aligned files as columns (same row counts).

    Args:
        paths: a file, a glob or a list of them (as every reader takes them,
            :class:`~naiad.Source`), or a mapping column -> files.
        column: the column name for plain (not structured) arrays given without a mapping.
        dtypes: a mapping column -> dtype, or one dtype for every column (cast per block).
        block_rows: rows per block, the unit of reading and of block shuffling (None: about
            1/4096 of the source's rows (its local files together; each remote file alone),
            between 1,024 and 65,536 rows).
        on_bad_rows, storage: as every reader takes them (no row of an array is bad).

    Example:
        >>> ds = naiad.read_npy({"x": "features.npy", "y": "labels.npy"})  # doctest: +SKIP
    """

    reader_name = "read_npy"

    def __init__(
        self,
        paths: PathLike | Mapping[str, PathLike],
        *,
        column: str = "x",
        dtypes: DTypes = None,
        block_rows: int | None = None,
        on_bad_rows: BadRows = "raise",
        storage: StorageLike = None,
        **deprecated: Any,
    ) -> None:
        if block_rows is not None and block_rows < 1:
            raise ConfigError(f"`block_rows` must be >= 1, got {block_rows}.")
        store = Storage.of(old_storage(self.reader_name, storage, deprecated))
        if isinstance(paths, Mapping):
            groups = {name: expand_paths(p, store) for name, p in paths.items()}
            counts = {name: len(ps) for name, ps in groups.items()}
            if len(set(counts.values())) != 1:
                raise ConfigError(f"each column needs as many files as the others, got {counts}.")
            first = next(iter(groups))
            super().__init__(groups[first], on_bad_rows=on_bad_rows, storage=store, deprecated=deprecated, expand=False)
            # file of the first column -> the aligned files of every column
            self._aligned = {p: {n: groups[n][i] for n in groups} for i, p in enumerate(groups[first])}
        else:
            super().__init__(paths, on_bad_rows=on_bad_rows, storage=store, deprecated=deprecated)
            self._aligned = {p: {column: p} for p in self.paths}
        self.block_rows = block_rows
        self._dtypes_arg = dtypes
        self.schema()  # headers are metadata: check dtypes and shapes now

    def _read_schema(self) -> pa.Schema:
        fields = []
        for name, path in self._aligned[self.paths[0]].items():
            arr = _open(path, self.storage)
            if arr.dtype.names and len(self._aligned[self.paths[0]]) == 1:
                for field in arr.dtype.names:
                    fields.append(pa.field(field, _arrow_type(arr[:0][field])))
            else:
                fields.append(pa.field(name, _arrow_type(arr[:0])))
        if self._dtypes_arg is not None:
            if isinstance(self._dtypes_arg, Mapping):
                unknown = [c for c in self._dtypes_arg if c not in [f.name for f in fields]]
                if unknown:
                    raise ConfigError(f"`dtypes` names unknown column(s) {unknown}; the columns are {[f.name for f in fields]}.")
            fields = [pa.field(f.name, _retype(f.type, self._dtypes_arg, f.name)) for f in fields]
        return pa.schema(fields)

    def known_rows(self) -> int | None:
        """Total rows: the files' headers say (no scan)."""
        return len(self)

    def _file_blocks(self, path: str) -> list[Block]:
        lengths = {name: len(_open(p, self.storage)) for name, p in self._aligned[path].items()}
        if len(set(lengths.values())) != 1:
            raise SourceError(f"aligned files have different row counts {lengths}.", path=path)
        n = next(iter(lengths.values()))
        # Many blocks, so that the epoch permutation shuffles; each is a cheap memory-map slice,
        # and consecutive ones are read as one task (NOTE [ Read groups ] in plan.py).
        total = self.local_bytes()
        step = self.block_rows or default_block_rows(n, os.path.getsize(path) if total else 0, total)
        return [Block(path, lo, min(lo + step, n), min(lo + step, n) - lo, lo) for lo in range(0, n, step)]

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        schema = self.schema()
        out: Columns = {}
        a, b = block.start + lo, block.start + hi
        for name, path in self._aligned[block.path].items():
            arr = _open(path, self.storage)
            if arr.dtype.names and len(self._aligned[block.path]) == 1:
                rows = arr[a:b]
                for field in arr.dtype.names:
                    out[field] = np.array(rows[field], dtype=_np(schema.field(field).type))
            else:
                out[name] = np.array(arr[a:b], dtype=_np(schema.field(name).type))
        return BlockData(out)


    def empty_columns(self) -> Columns:
        """Zero rows of every column, with the trailing shape of the arrays."""
        schema = self.schema()
        out: Columns = {}
        for name, path in self._aligned[self.paths[0]].items():
            arr = _open(path, self.storage)
            if arr.dtype.names and len(self._aligned[self.paths[0]]) == 1:
                for field in arr.dtype.names:
                    out[field] = np.zeros((0, *arr[:0][field].shape[1:]), _np(schema.field(field).type))
            else:
                out[name] = np.zeros((0, *arr.shape[1:]), _np(schema.field(name).type))
        return out


def _arrow_type(arr: np.ndarray) -> pa.DataType:
    """A plain array of shape (n, d1, ...) is described as its element type (shape kept aside)."""
    try:
        return pa.from_numpy_dtype(arr.dtype)
    except (pa.ArrowNotImplementedError, TypeError):
        raise SourceError(f"unsupported dtype {arr.dtype} (numeric and bool only).") from None


def _retype(t: pa.DataType, dtypes: Any, name: str) -> pa.DataType:
    if isinstance(dtypes, Mapping):
        return to_arrow_type(dtypes[name]) if name in dtypes else t
    return to_arrow_type(dtypes)


def _np(t: pa.DataType) -> np.dtype:
    dt: np.dtype = np.dtype(t.to_pandas_dtype())
    return dt


read_npy = NpySource
