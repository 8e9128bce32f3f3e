"""Token files as a map-style dataset of fixed-length windows (:func:`read_tokens`).

NOTE [ Token windows ]
A file of ``n`` tokens holds ``(n - 1) // seq_len`` windows; window ``i`` is tokens
``[i * seq_len, i * seq_len + seq_len + 1)``, so consecutive windows share one token and a
window's inputs (its first ``seq_len`` tokens) and labels (its last ``seq_len``) come from one
read. Windows never cross a file's end; the tokens after a file's last window (fewer than a
window) are dropped, and counted (:attr:`TokenWindows.dropped_tokens`). The windows of all files
are numbered one after another, so the dataset is random access: a window is a file, an offset
and a length, found with one ``searchsorted``.

That makes the token files a map-style dataset, and naiad's map pipeline does the rest: the
epoch's order is a permutation of the window numbers keyed by ``(seed, epoch)`` (``seed=``), no
shuffle buffer; ranks take contiguous ranges of it and workers whole batches, so every window is
delivered exactly once per epoch across ranks and workers, with equal steps per rank; a resume
skips what was delivered, and on another world size the new ranks split what no old rank
delivered (NOTE [ Elastic resume ]). The class defines ``gather_batch``, so the loader reads a
whole batch with one call and no per-sample collation (dataset/fetch.py).

With ``shift=True`` the windows of epoch ``e`` start ``o_e`` tokens later, ``o_e`` a function
of ``(seed, e)``, and each file keeps one window fewer unless its size is a multiple of
``seq_len`` (NOTE [ Moving window boundaries ] in tokens/shift.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from naiad.errors import ConfigError
from naiad.parallel.slots import batch_array
from naiad.sources.options import StorageLike, old_storage, refuse_unknown
from naiad.sources.paths import PathLike, expand_paths
from naiad.sources.storage import Storage
from naiad.tokens.files import TokenFile, TokenReader, inspect_token_file, token_dtype
from naiad.tokens.shift import offset_now

__all__ = ["TokenWindows", "document_ids", "position_ids", "read_tokens", "window_batch"]


def read_tokens(
    paths: PathLike,
    *,
    seq_len: int,
    dtype: Any = None,
    eos_id: int | None = None,
    storage: StorageLike = None,
    shift: bool = False,
    seed: int | None = None,
    **deprecated: Any,
) -> TokenWindows:
    """Token files as a dataset of ``seq_len``-token training windows (NOTE [ Token windows ]).

    Reads nanoGPT's flat ``.bin`` files (uint16 unless ``dtype=`` says otherwise), ``.npy`` files
    of a 1-D integer array, and modded-nanogpt's shards (a 256-int32 header: magic 20240520,
    version 1, the token count; then uint16 tokens), local or at URLs. Give it to
    :class:`naiad.DataLoader` with ``shuffle=True, seed=...``: every window once per epoch across
    ranks and workers, in an order that is a function of ``(seed, epoch)``, resumable exactly and
    on another world size. docs/TOKENS.md.

    A batch is ``{"input_ids": int64 [B, seq_len], "labels": int64 [B, seq_len]}``; with
    ``eos_id``, also ``"position_ids"`` (0, 1, 2, ... restarting after each ``eos_id`` token) and
    ``"document_ids"`` (0 for the window's first document, +1 after each ``eos_id``), so that
    attention can be kept inside documents.

    With ``shift=True`` the windows' boundaries move every epoch: epoch ``e``'s windows start at
    an offset in ``[0, seq_len)`` drawn from ``(seed, e)``, and every window of that epoch's cut
    is still delivered exactly once (NOTE [ Moving window boundaries ] in tokens/shift.py). The
    length stays the same every epoch: each file keeps the windows that fit any offset, at most
    one fewer than without a shift.

    Args:
        paths: files, globs, folders or URLs (``s3://bucket/shard_*.bin``), in that order.
        seq_len: tokens per training sequence (a window reads ``seq_len + 1``).
        dtype: the tokens' dtype in flat files (default uint16); ``.npy`` files and shards carry
            their own.
        eos_id: the token that ends a document; None: no position or document ids.
        storage: for URLs: a ``naiad.Storage`` (the filesystem's options, retries, a local
            cache of fetched ranges) or a dict of its options, as every reader takes it
            (:class:`~naiad.Source`, docs/STORAGE.md).
        shift: move the windows' start every epoch, by an offset drawn from ``(seed, epoch)``.
        seed: keys the offsets of ``shift=True``; None: the naiad loader's base seed (its
            ``seed=``), or 0 outside naiad's loader (torch's DataLoader: give one here, and call
            :meth:`TokenWindows.set_epoch` each epoch). A resume needs the same value.

    Raises:
        ConfigError: a bad argument (``seq_len`` < 1, a dtype that is not an integer one,
            ``seed`` without ``shift=True``).
        SourceError: a file that is missing or does not hold what it should, naming the file
            and the problem: a ``.npy`` of floats or of more than one axis, a flat file whose
            size is not a whole number of tokens, a shard header whose magic, version or count
            does not fit the file.

    Example:
        >>> tokens = naiad.read_tokens("data/openwebtext/train.bin", seq_len=1024)  # doctest: +SKIP
        >>> loader = naiad.DataLoader(tokens, batch_size=12, shuffle=True, seed=0, num_workers=2)  # doctest: +SKIP
        >>> batch = next(iter(loader))  # doctest: +SKIP
        >>> batch["input_ids"].shape, batch["labels"].shape  # doctest: +SKIP
        (torch.Size([12, 1024]), torch.Size([12, 1024]))
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ConfigError(f"`seq_len` must be an int >= 1, got {seq_len!r}.")
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer))):
        raise ConfigError(f"`eos_id` must be an int token id or None, got {eos_id!r}.")
    if not isinstance(shift, (bool, np.bool_)):
        raise ConfigError(f"`shift` must be True or False, got {shift!r}.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ConfigError(f"`seed` must be an int or None, got {seed!r}.")
    if seed is not None and not shift:
        # The order's seed is the loader's: a seed here that keys nothing would look like one.
        raise ConfigError(f"`seed` keys the offsets of `shift=True`, and shift is off (seed={seed!r}); pass "
                          "shift=True, or give the seed of the order to the loader (DataLoader(seed=...)).")
    store = Storage.of(old_storage("read_tokens", storage, deprecated))
    refuse_unknown("read_tokens", deprecated)
    dt = token_dtype(dtype) if dtype is not None else None
    files = [inspect_token_file(p, dt, store) for p in expand_paths(paths, store)]
    return TokenWindows(files, int(seq_len), None if eos_id is None else int(eos_id), store,
                        shift=bool(shift), seed=None if seed is None else int(seed))


class WindowSamples(Dataset[dict[str, torch.Tensor]]):
    """Samples cut from whole batches: a window dataset writes ``gather_batch(indices)`` (what
    naiad's loader calls, one batch at a time), and torch's per-sample protocol follows from it."""

    def gather_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        batch = self.gather_batch(np.array([index], np.int64))
        return {k: v[0] for k, v in batch.items()}

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        # torch's DataLoader contract: a list of samples for collate_fn (naiad's loader calls
        # gather_batch instead, one batch at a time).
        batch = self.gather_batch(np.asarray(indices, np.int64))
        return [{k: v[j] for k, v in batch.items()} for j in range(len(indices))]


class TokenWindows(WindowSamples):
    """Windows of ``seq_len + 1`` tokens over token files, random access (see :func:`read_tokens`).

    Attributes:
        files: the files, in order, with their layout, dtype and token count.
        seq_len: tokens per sequence.
        eos_id: the end-of-document token, or None.
        windows_per_file: each file's window count.
        dropped_tokens: tokens in no window (after each file's last window, and with ``shift``
            before its first), in all; the same every epoch.
        shift: whether the windows' start moves every epoch (NOTE [ Moving window boundaries ]).
        seed: the seed of the shift's offsets; None: the loader's.
        epoch: the epoch read outside naiad's workers (:meth:`set_epoch`).
    """

    def __init__(self, files: Sequence[TokenFile], seq_len: int, eos_id: int | None,
                 store: Storage | Sequence[Storage], *, shift: bool = False, seed: int | None = None) -> None:
        self.files = list(files)
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.shift = shift
        self.seed = seed
        self.epoch = 0
        counts = np.array([f.tokens for f in self.files], np.int64)
        if shift:  # the windows that fit at any offset in [0, seq_len): the same length every epoch
            self.windows_per_file = np.maximum(counts // seq_len - 1, 0)
        else:
            self.windows_per_file = np.where(counts > seq_len, (counts - 1) // seq_len, 0)
        covered = np.where(self.windows_per_file > 0, self.windows_per_file * seq_len + 1, 0)
        self.dropped_per_file = counts - covered
        self.dropped_tokens = int(self.dropped_per_file.sum())
        self.total_tokens = int(counts.sum())
        self._ends = np.cumsum(self.windows_per_file)
        self._firsts = self._ends - self.windows_per_file  # each file's first window
        self._reader = TokenReader(self.files, store)
        self._shifted: dict[int, TokenReader] = {}  # readers by offset (see _reader_at)
        digest = hashlib.sha1()
        for f in self.files:
            digest.update(f"{os.path.basename(f.path)}\0{f.layout}\0{f.dtype.str}\0{f.tokens}\n".encode())
        self._digest = digest.hexdigest()[:16]

    @classmethod
    def joined(cls, sources: Sequence[TokenWindows]) -> TokenWindows:
        """The windows of ``sources`` (same ``seq_len`` and ``eos_id``) numbered one after
        another: source ``s``'s window ``w`` is window ``sum(len(sources[:s])) + w``, each file
        read through its source's Storage.

        Raises:
            ConfigError: a source with ``shift=True`` (a mixture walks each source in passes of
                its own that span epochs, so an offset per epoch would cut a pass in two).
        """
        for i, s in enumerate(sources):
            if s.shift:
                raise ConfigError(
                    f"`sources[{i}]` reads with shift=True, which naiad.mix does not take: a mixture walks each "
                    "source in passes of its own that span its epochs, so an offset moved every epoch would read "
                    "no pass as one cut (windows overlapping, tokens skipped). Mix it read without shift "
                    "(naiad.read_tokens(..., shift=False)); docs/TOKENS.md, \"Moving window boundaries\".")
        return cls([f for s in sources for f in s.files], sources[0].seq_len, sources[0].eos_id,
                   [store for s in sources for store in s.stores])

    @property
    def stores(self) -> list[Storage]:
        """Each file's :class:`~naiad.sources.storage.Storage`, in the order of :attr:`files`."""
        return list(self._reader.stores)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def state_fingerprint(self) -> dict[str, Any]:
        """What a loader's state must match to resume over these windows (NOTE [ Dataset
        fingerprint ] in dataset/pipeline.py): the files (count, and a digest of their names
        without directories, layouts, dtypes and token counts: the data may be mounted
        elsewhere), the tokens, ``seq_len``, and the shift: None without one (so a state saved
        before shift existed, which has no such key, still fits), else where its seed comes from."""
        shift = None if not self.shift else ("loader seed" if self.seed is None else f"seed {self.seed}")
        return {"of": "naiad.read_tokens", "files": len(self.files), "tokens": self.total_tokens,
                "seq_len": self.seq_len, "digest": self._digest, "shift": shift}

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose offset a shifted read uses outside naiad's workers (torch's
        DataLoader, a plain loop; NOTE [ Moving window boundaries ]). naiad's loader needs no
        call: each task carries its epoch."""
        self.epoch = int(epoch)

    def current_offset(self) -> int:
        """Where the current epoch's windows start in each file: 0 without ``shift``; with it, the
        offset of the naiad worker's task's epoch and base seed (or of :meth:`set_epoch` and
        ``seed``, else 0, outside naiad's workers)."""
        return offset_now(self.seed, self.epoch, self.seq_len) if self.shift else 0

    @property
    def tokens_per_window(self) -> int:
        """Training tokens per window (``seq_len``; its inputs, and as many labels)."""
        return self.seq_len

    def __repr__(self) -> str:
        moving, where = (", shift=True", "before and after the windows") if self.shift else ("", "at files' ends")
        return (f"TokenWindows({len(self.files)} file(s), {self.total_tokens} tokens, seq_len={self.seq_len}{moving}: "
                f"{len(self)} windows, {self.dropped_tokens} tokens dropped {where})")

    def window_tokens(self, indices: np.ndarray) -> np.ndarray:
        """The windows ``indices`` as ``[len(indices), seq_len + 1]``, in the files' dtype (with
        ``shift``, of the current epoch's cut: :meth:`current_offset`)."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(self)
        lo, hi = (int(idx.min()), int(idx.max())) if len(idx) else (0, 0)
        if lo < -n or hi >= n:
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"window index {int(bad)} is out of range for {n} windows.")
        if lo < 0:
            idx = np.where(idx < 0, idx + n, idx)
        return self.read_windows(idx)

    def read_windows(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`window_tokens` of indices known to be in ``range(len(self))`` (a mixture's
        table holds only such), without checking them again."""
        reader = self._reader
        if self.shift:  # one offset for the whole batch (a batch is one task, of one epoch), in the reader
            offset = offset_now(self.seed, self.epoch, self.seq_len)  # current_offset() inlined: runs per batch
            reader = self._shifted.get(offset) or self._reader_at(offset)
        if len(self._ends) == 1:  # one file: a window's index is its place in the file
            return reader.read(np.zeros(len(idx), np.int64), idx * self.seq_len, self.seq_len + 1)
        file_ids = np.searchsorted(self._ends, idx, side="right")
        return reader.read(file_ids, (idx - self._firsts[file_ids]) * self.seq_len, self.seq_len + 1)

    def _reader_at(self, offset: int) -> TokenReader:
        """A reader of the files whose token 0 is their token ``offset``: a shifted epoch's
        windows are then read at the unshifted windows' starts, with no array operation per
        batch (NOTE [ Moving window boundaries ]). One per offset, the last two kept (a pass of
        the epoch before may still be read); made once per process and epoch."""
        reader = self._shifted.get(offset)
        if reader is None:
            files = [dataclasses.replace(f, offset=f.offset + offset * f.dtype.itemsize, tokens=f.tokens - offset)
                     for f in self.files]
            reader = TokenReader(files, self._reader.stores)
            # swapped whole, so a thread worker never sees the dict half made
            self._shifted = {**dict(list(self._shifted.items())[-1:]), offset: reader}
        return reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shifted"] = {}  # each process makes its own
        return state

    def gather_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch of windows ``indices``: what ``default_collate`` makes of their samples."""
        return window_batch(self.window_tokens(indices), self.eos_id)



def window_batch(windows: np.ndarray, eos_id: int | None) -> dict[str, torch.Tensor]:
    """``{"input_ids", "labels"}`` (and, with ``eos_id``, ``"position_ids"``, ``"document_ids"``)
    from integer windows ``[B, seq_len + 1]``, as int64."""
    # Built where the batch will cross to the training process (in a process worker, its slot).
    rows, width = windows.shape[0], windows.shape[1] - 1
    inputs, labels = batch_array((rows, width), np.int64), batch_array((rows, width), np.int64)
    np.copyto(inputs, windows[:, :-1], casting="unsafe")  # as astype: the token ids fit int64
    np.copyto(labels, windows[:, 1:], casting="unsafe")
    batch = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
    if eos_id is not None:
        batch["position_ids"] = torch.from_numpy(position_ids(inputs, eos_id))
        batch["document_ids"] = torch.from_numpy(document_ids(inputs, eos_id))
    return batch


def position_ids(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """Each token's position in its document: 0, 1, 2, ... from the window's start and again
    after each ``eos_id`` (the end-of-document token keeps its document's position). Vectorized:
    the position of a token is its index less the index of its document's first token, the
    running maximum of the indices where a document starts."""
    b, length = inputs.shape
    index = np.broadcast_to(np.arange(length, dtype=np.int64), (b, length))
    starts = np.zeros((b, length), bool)
    starts[:, 0] = True
    starts[:, 1:] = inputs[:, :-1] == eos_id
    first: np.ndarray = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    positions: np.ndarray = index - first
    return positions


def document_ids(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """Each token's document within the window: 0 for the first, +1 after each ``eos_id``."""
    ends = inputs == eos_id
    doc: np.ndarray = np.cumsum(ends, axis=1, dtype=np.int64) - ends
    return doc
