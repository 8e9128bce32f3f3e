"""Token files: what a file holds (layout, dtype, where token 0 is, how many tokens), and reading
windows of tokens out of many files at once.

Three layouts, told apart by their first bytes, not their names:

``npy``    a NumPy ``.npy`` file of a 1-D integer array (OLMo's arrays, ``np.save``).
``shard``  modded-nanogpt's shards: a header of 256 int32 (magic 20240520, version 1, the token
           count, then zeros), then the count's uint16 tokens.
``bin``    a flat array of tokens and nothing else (nanoGPT's ``train.bin``): uint16 unless
           ``dtype=`` says otherwise.

NOTE [ Reading windows with pread ]
A window is ``seq_len + 1`` tokens at a known offset, so a batch is ``B`` small reads at scattered
offsets. A memory map reads them with one fancy index, but every page it touches stays mapped in
the process and counts in its resident memory until the map is dropped: a worker's RSS grows to
the size of the file it has read (nanoGPT#287), which on a shared machine looks like a leak and
can trip a memory limit. ``os.preadv`` into one preallocated array reads the same bytes from the
page cache at the same speed or better (bench/RESULTS.md, "Token windows") and the worker's
resident memory stays the size of a batch, epoch after epoch. Each process opens its own file
descriptors on first use and keeps a bounded number of them open, the oldest closed past the
budget (NOTE [ Open files ] in sources/openfiles.py: a corpus of thousands of
files in every worker would pass the limit on open files). A URL is read with one range request
per run of a batch's nearby windows through the source's Storage, the runs in flight together
(NOTE [ Remote windows ] in tokens/remote.py; NOTE [ Remote files in workers ]).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.openfiles import Descriptors, descriptors
from naiad.sources.storage import Storage
from naiad.tokens.remote import read_remote_rows
from naiad.trust.npy_header import read_npy_header

__all__ = ["HEADER_BYTES", "HEADER_MAGIC", "HEADER_VERSION", "TokenFile", "TokenReader", "inspect_token_file", "token_dtype"]

HEADER_MAGIC = 20240520
HEADER_VERSION = 1
HEADER_BYTES = 256 * 4
_NPY_MAGIC = b"\x93NUMPY"
# The most a .npy header takes (NumPy pads it to 64 bytes; a 1-D array's is about 128): what
# is read to tell the layout and parse the header.
_HEAD_BYTES = 1 << 16


def token_dtype(dtype: Any, what: str = "`dtype`") -> np.dtype:
    """``dtype`` as a NumPy integer dtype, or a ConfigError."""
    try:
        dt: np.dtype = np.dtype(dtype)
    except TypeError:
        raise ConfigError(f"{what} must be a NumPy integer dtype such as np.uint16, got {dtype!r}.") from None
    if dt.kind not in "iu":
        raise ConfigError(f"{what} must be an integer dtype (tokens are integers), got {dt}.")
    return dt


@dataclass(frozen=True)
class TokenFile:
    """One token file: where its tokens are and what they are.

    Attributes:
        path: the file or URL.
        layout: ``"bin"``, ``"shard"`` or ``"npy"`` (see the module's docstring).
        dtype: the tokens' dtype in the file.
        offset: the byte offset of token 0.
        tokens: how many tokens the file holds.
    """

    path: str
    layout: str
    dtype: np.dtype
    offset: int
    tokens: int


def inspect_token_file(path: str, dtype: np.dtype | None, store: Storage | None) -> TokenFile:
    """Read the head of ``path`` and say what it holds.

    Raises:
        SourceError: naming the file and the problem: a ``.npy`` that does not hold a 1-D integer
            array, a shard header whose version or token count does not fit the file, a flat
            file whose size is not a whole number of tokens.
    """
    try:
        size = storage.size(path, store=store)
    except FileNotFoundError:
        raise SourceError("file not found.", path=path) from None
    head = storage.read_range(path, 0, min(size, _HEAD_BYTES), store=store)
    if head.startswith(_NPY_MAGIC):
        return _npy(path, head, size, dtype)
    if size >= HEADER_BYTES and int(np.frombuffer(head, "<i4", count=1)[0]) == HEADER_MAGIC:
        return _shard(path, head, size, dtype)
    dt = dtype if dtype is not None else np.dtype(np.uint16)
    if size % dt.itemsize:
        raise SourceError(
            f"{size} bytes is not a whole number of {dt} tokens ({dt.itemsize} bytes each): the file is "
            f"truncated, or its tokens are not {dt} (set `dtype=` to the dtype it was written with).", path=path)
    return TokenFile(path, "bin", dt, 0, size // dt.itemsize)


def _npy(path: str, head: bytes, size: int, dtype: np.dtype | None) -> TokenFile:
    f = io.BytesIO(head)
    try:
        shape, _fortran, dt = read_npy_header(f)  # NOTE [ npy headers without ast ]
    except Exception as exc:  # a damaged header fails in many ways; all are this file's
        raise SourceError(f"not a readable .npy header ({type(exc).__name__}: {exc}).", path=path) from None
    if dt.hasobject or dt.kind not in "iu":
        raise SourceError(f"a token array must hold integers, this .npy holds {dt}; convert it with "
                          "arr.astype(np.uint16) (or the integer dtype your vocabulary needs) and save it again.",
                          path=path)
    if len(shape) != 1:
        raise SourceError(f"a token array must be 1-D, this .npy has shape {tuple(shape)}; save arr.reshape(-1).",
                          path=path)
    if dtype is not None and dtype != dt:
        raise SourceError(f"`dtype` is {dtype}, but this .npy holds {dt}; leave `dtype` unset for .npy files "
                          "(their header names the dtype).", path=path)
    offset, count = f.tell(), int(shape[0])
    if size != offset + count * dt.itemsize:
        raise SourceError(f"the .npy header says {count} tokens of {dt} ({count * dt.itemsize} bytes), the file "
                          f"has {size - offset} bytes after its header: it is truncated or was changed.", path=path)
    return TokenFile(path, "npy", dt, offset, count)


def _shard(path: str, head: bytes, size: int, dtype: np.dtype | None) -> TokenFile:
    header = np.frombuffer(head, "<i4", count=3)
    version, count = int(header[1]), int(header[2])
    if version != HEADER_VERSION:
        raise SourceError(f"token shard header: version {version}, expected {HEADER_VERSION} (magic {HEADER_MAGIC}, "
                          "version, token count, then uint16 tokens, as modded-nanogpt writes).", path=path)
    if count < 0 or size != HEADER_BYTES + 2 * count:
        raise SourceError(f"token shard header: says {count} tokens ({2 * count} bytes after the {HEADER_BYTES}-byte "
                          f"header), the file has {size - HEADER_BYTES}: it is truncated or its header is wrong.",
                          path=path)
    if dtype is not None and dtype != np.dtype(np.uint16):
        raise SourceError(f"`dtype` is {dtype}, but a token shard (magic {HEADER_MAGIC}) holds uint16 tokens; "
                          "leave `dtype` unset.", path=path)
    return TokenFile(path, "shard", np.dtype(np.uint16), HEADER_BYTES, count)


class TokenReader:
    """Reads runs of tokens at scattered offsets of many files into one int64 array
    (NOTE [ Reading windows with pread ]).

    Plain data (paths, layouts, the Storages), so it pickles; descriptors are opened per process
    and kept in the process's bounded table (NOTE [ Open files ]).

    Args:
        files: the files, in order.
        stores: the Storage their URLs are read through: one for all, or one per file (the
            files of several sources, each read with its own options: ``TokenWindows.joined``).
    """

    def __init__(self, files: list[TokenFile], stores: Storage | Sequence[Storage]) -> None:
        self.files = files
        self.stores = [stores] * len(files) if isinstance(stores, Storage) else list(stores)
        if len(self.stores) != len(files):
            raise ValueError(f"{len(self.stores)} storages for {len(files)} files")
        self._local = [not storage.is_remote(f.path) for f in files]
        self._offsets = np.array([f.offset for f in files], np.int64)  # each file's token 0, in bytes
        # Every file local and of one dtype (one source's files, most mixtures): a batch's rows are
        # read straight into the result, with no grouping by file.
        dtypes = {f.dtype for f in files}
        self._uniform: np.dtype | None = next(iter(dtypes)) if len(dtypes) == 1 and all(self._local) else None
        self._paths = [storage.local_path(f.path) for f in files]
        # (the table's generation, descriptors by file) of the last read: reused while the
        # generation stands (NOTE [ Open files ]).
        self._kept: tuple[int, dict[int, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_kept"] = None  # this process's descriptors
        return state

    def read(self, file_ids: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
        """``out[j] = tokens[starts[j] : starts[j] + length]`` of file ``file_ids[j]``, as
        ``[len(starts), length]`` in the files' dtype (their common integer dtype when the rows
        come from files of several); one read per row, grouped by file. Rows of local files in
        the result's dtype are read straight into it: the only copy is the read's."""
        if self._uniform is not None:
            out = np.empty((len(starts), length), self._uniform)
            self._read_rows(out, file_ids, starts)
            return out
        unique = np.unique(file_ids)
        ids = unique.tolist()
        dtypes = {self.files[i].dtype for i in ids}
        common = np.result_type(*dtypes) if dtypes else np.dtype(np.int64)
        if common.kind not in "iu":  # uint64 beside a signed dtype: NumPy's answer is float64
            common = np.dtype(np.int64)
        out = np.empty((len(starts), length), common)
        if len(ids) > 1 and all(self._local[i] and self.files[i].dtype == common for i in ids):
            # Local files of one dtype (a mixture's sources, a folder of shards): each row from its
            # own file into its row of the result, with no buffer per file and no copy after.
            self._read_rows(out, file_ids, starts)
            return out
        for i in ids:
            f = self.files[i]
            whole = len(ids) == 1 and f.dtype == common
            rows = None if whole else np.flatnonzero(file_ids == i)
            buf = out if rows is None else np.empty((len(rows), length), f.dtype)
            if self._local[i]:
                self._read_rows(buf, file_ids if rows is None else file_ids[rows], starts if rows is None else starts[rows])
            else:  # a batch's windows in few requests, in flight together (NOTE [ Remote windows ])
                offsets = f.offset + np.asarray(starts if rows is None else starts[rows], np.int64) * f.dtype.itemsize
                read_remote_rows(f.path, self.stores[i], offsets, buf)
            if not whole:
                out[rows] = buf
        return out

    def _read_rows(self, out: np.ndarray, file_ids: np.ndarray, starts: np.ndarray) -> None:
        """``out[j]`` from file ``file_ids[j]`` at token ``starts[j]``, one ``preadv`` per row
        (the files all local, all of ``out``'s dtype: its item size is theirs), inside a read of
        the process's table of descriptors (none closed under it; those looked up before reused
        while the table's generation stands), a group of files at a time when the batch's files
        are more than a group may hold (NOTE [ Open files ])."""
        if not len(file_ids):
            return
        table = descriptors()
        ids = file_ids.tolist()
        offsets = (self._offsets[file_ids] + starts * out.dtype.itemsize).tolist()
        nbytes = out.shape[1] * out.dtype.itemsize
        generation = table.enter()
        kept = self._kept
        if kept is not None and kept[0] == generation and len(kept[1]) == len(self.files):
            # Every file's descriptor looked up and still open (a source of few files, after its
            # first batches): no lookup at all.
            try:
                self._check_reads(self._read_into(kept[1], out, ids, offsets, None), nbytes, ids, offsets, None)
            finally:
                table.leave()
            return
        table.leave()
        files = list(dict.fromkeys(ids))  # in order of first use: a batch's few files, no sort
        step = table.group_size
        for lo in range(0, len(files), step):
            group = files[lo:lo + step]
            chosen = set(group)
            rows = None if len(group) == len(files) else [j for j, i in enumerate(ids) if i in chosen]
            generation = table.enter()
            try:
                got = self._read_into(self._descriptors(table, generation, group), out, ids, offsets, rows)
            finally:
                table.leave()
            self._check_reads(got, nbytes, ids, offsets, rows)

    def _read_into(self, fd_of: dict[int, int], out: np.ndarray, ids: list[int], offsets: list[int],
                   rows: list[int] | None) -> list[int]:
        """``os.preadv`` of each row (``rows``: only those) into ``out``: the bytes each read."""
        try:
            if rows is None:
                return [os.preadv(fd_of[i], [row], off) for i, row, off in zip(ids, out, offsets)]
            return [os.preadv(fd_of[ids[j]], [out[j]], offsets[j]) for j in rows]
        except OSError as exc:
            path = exc.filename if isinstance(exc.filename, str) else self.files[ids[0]].path
            raise SourceError(f"cannot open or read: {exc.strerror}.", path=path) from None

    def _check_reads(self, got: list[int], nbytes: int, ids: list[int], offsets: list[int], rows: list[int] | None) -> None:
        if got.count(nbytes) != len(got):
            k = next(k for k, n in enumerate(got) if n != nbytes)
            j = k if rows is None else rows[k]
            raise SourceError(f"read {got[k]} of {nbytes} bytes at offset {offsets[j]}: the file shrank after it was "
                              "opened.", path=self.files[ids[j]].path)

    def _descriptors(self, table: Descriptors, generation: int, group: list[int]) -> dict[int, int]:
        """The descriptors of files ``group`` by id, inside a read of ``table`` entered at
        ``generation``: those this reader looked up at the same generation again, the others
        looked up now (NOTE [ Open files ])."""
        kept = self._kept
        if kept is None or kept[0] != generation:
            kept = (generation, {})  # (a fork moves the generation on too)
        fd_of = kept[1]
        missing = [i for i in group if i not in fd_of]
        if missing:
            fd_of.update(table.lookup(self._paths, missing))
            kept = kept if table.generation == generation else None
        self._kept = kept
        return fd_of
