"""Rows into batches: chunks of rows cut into the plan's batch sizes (:class:`Batcher`), NumPy
columns into tensors (:func:`to_torch`), and the ``x``/``y`` packing transform (:func:`pack_xy`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from naiad.errors import ConfigError
from naiad.stream.shuffle import as_array

__all__ = ["Batcher", "PackXY", "pack_xy", "ragged_tensors", "to_torch"]


def to_torch(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """NumPy columns to tensors (zero-copy where the array is writable); a ragged column (each
    row a 1-D array: NOTE [ Ragged columns ]) to a list of 1-D tensors; other object columns to
    lists."""
    out: dict[str, Any] = {}
    for name, arr in arrays.items():
        if arr.dtype.kind == "O":
            out[name] = _object_column(arr)
            continue
        flags = arr.flags
        if not (flags.writeable and flags.c_contiguous):
            arr = np.array(arr)  # a view of a memory map or of Arrow memory
        out[name] = torch.from_numpy(arr)
    return out


def _object_column(arr: np.ndarray) -> list[Any]:
    """An object column as a list: of tensors when every row is a NumPy array of numbers (a
    ragged column, or a worker-side transform's arrays of unequal length), else as it is."""
    rows: list[Any] = arr.tolist()
    if rows and set(map(type, rows)) == {np.ndarray}:
        try:
            return ragged_tensors(rows)
        except (TypeError, ValueError):  # strings or dates, or shapes past the first axis that differ
            pass
    return rows


def ragged_tensors(rows: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """A batch's ragged column (its rows' 1-D arrays, or arrays alike past their first axis) as a
    list of tensors: one copy of all the rows' values, then views of it, with no loop per row in
    Python."""
    if not rows:
        return []
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    flat = torch.from_numpy(np.concatenate(rows))
    return list(torch.split(flat, lengths.tolist()))


class Batcher:
    """Cuts a stream of row chunks into the planned batch sizes."""

    def __init__(self, sizes: np.ndarray | None, first: int, empty: Mapping[str, Any], batch_size: int) -> None:
        self.sizes = sizes  # None: not known yet, every batch until then is ``batch_size`` (one rank)
        self.batch_size = batch_size
        self.next = first
        self.chunks: deque[tuple[dict[str, np.ndarray], int]] = deque()  # each chunk with its rows
        self._at = 0  # rows of the first chunk already taken
        self.rows = 0
        self.empty = {name: as_array(col) for name, col in empty.items()}

    @property
    def done(self) -> bool:
        return self.sizes is not None and self.next >= len(self.sizes)

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        n = len(next(iter(chunk.values()))) if chunk else 0
        if n:
            self.chunks.append((chunk, n))
            self.rows += n

    def _size(self) -> int:
        return self.batch_size if self.sizes is None else int(self.sizes[self.next])

    def ready(self) -> Iterator[dict[str, np.ndarray]]:
        while not self.done and self.rows >= self._size():
            yield self._take(self._size())

    def finish(self) -> Iterator[dict[str, np.ndarray]]:
        # Rows were skipped as bad: the last batches are short (even empty) rather than
        # missing, so every rank still yields the planned number of batches.
        assert self.sizes is not None
        while not self.done:
            yield self._take(min(self.rows, self._size()))

    def _take(self, k: int) -> dict[str, np.ndarray]:
        self.next += 1
        if k == 0:
            return dict(self.empty)
        pieces: list[dict[str, np.ndarray]] = []
        need = k
        while need:
            # The head chunk's rows before ``_at`` are taken: a batch is one slice a column, and
            # the rest is not cut again for every batch.
            (head, rows), at = self.chunks[0], self._at
            n = rows - at
            if n <= need:
                self.chunks.popleft()
                self._at = 0
                pieces.append(head if at == 0 else {name: col[at:] for name, col in head.items()})
                need -= n
            else:
                pieces.append({name: col[at:at + need] for name, col in head.items()})
                self._at = at + need
                need = 0
        self.rows -= k
        if len(pieces) == 1:
            return pieces[0]
        return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}


def pack_xy(
    label: str | None = None,
    features: Sequence[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    label_dtype: torch.dtype | None = None,
) -> PackXY:
    """A per-batch transform that packs feature columns into ``x`` and the label into ``y``.

    Args:
        label: the label column (None: the last column, as in ``x = cols[:-1]; y = cols[-1]``).
        features: the feature columns in order (None: every column but the label).
        dtype: the dtype of ``x``.
        label_dtype: the dtype of ``y`` (None: keep the column's; use float32 for BCE losses).

    Example:
        >>> t = pack_xy(label="y")
        >>> out = t({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3, 4]), "y": torch.tensor([0, 1])})
        >>> out["x"].tolist(), out["y"].tolist()
        ([[1.0, 3.0], [2.0, 4.0]], [0, 1])
    """
    return PackXY(label, tuple(features) if features is not None else None, dtype, label_dtype)


@dataclass(frozen=True)
class PackXY:
    """The transform made by :func:`pack_xy` (picklable; runs on whole batches)."""

    label: str | None
    features: tuple[str, ...] | None
    dtype: torch.dtype
    label_dtype: torch.dtype | None

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        names = list(batch)
        label = self.label if self.label is not None else names[-1]
        if label not in batch:
            raise ConfigError(f"pack_xy: `label` {label!r} is not a column; the columns are {names}.")
        features = self.features if self.features is not None else [n for n in names if n != label]
        missing = [f for f in features if f not in batch]
        if missing:
            raise ConfigError(f"pack_xy: feature column(s) {missing} not in the batch; the columns are {names}.")
        cols = []
        for f in features:
            t = batch[f]
            if not isinstance(t, torch.Tensor):
                what = "rows of unequal length" if t and isinstance(t[0], torch.Tensor) else "not numeric"
                raise ConfigError(f"pack_xy: column {f!r} is not one tensor ({what}); leave it out with `features=`.")
            cols.append(t.reshape(len(t), -1).to(self.dtype))
        y = batch[label]
        if self.label_dtype is not None:
            y = y.to(self.label_dtype)
        return {"x": torch.cat(cols, dim=1), "y": y}
