"""Fetch: turn one batch of indices into one batch, calling the dataset as few times as possible.

Three strategies, chosen once per loader (:func:`choose_fetch`), fastest first:

``gather``    the dataset is data naiad can index as a whole (a tensor, a numeric NumPy array,
              a ``TensorDataset``, an :class:`ArrayDataset`, a dataset whose class defines
              ``gather_batch(indices)``, or a ``Subset`` of one) and the collate function is
              torch's default: one vectorized index per column and batch, giving exactly the
              batch ``default_collate`` would build sample by sample.
``getitems``  the dataset defines ``__getitems__`` (torch's batched protocol): one call per
              batch, then ``collate_fn`` on the list it returns.
``items``     anything else: ``dataset[i]`` per index, then ``collate_fn`` (torch's own path).

An exception from the dataset or the collate function keeps its type and message and gains a
note naming the index (or indices) it came from.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset, default_collate, default_convert

from naiad.dataset.slot_collate import slot_collate
from naiad.errors import ConfigError
from naiad.parallel import slots
from naiad.parallel.pool import add_note

__all__ = ["ArrayDataset", "FetchStrategy", "choose_fetch", "describe_indices", "make_fetch"]

FetchStrategy = Literal["gather", "getitems", "items"]

_DEFAULT_COLLATES = (default_collate,)


def describe_indices(indices: Sequence[int] | np.ndarray, most: int = 8) -> str:
    """``indices`` for a message: the first ``most`` of them, and how many there are in all."""
    shown = ", ".join(str(int(i)) for i in indices[:most])
    more = f", ... ({len(indices)} in all)" if len(indices) > most else ""
    return f"[{shown}{more}]"


def _numeric_array(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype.kind in "biufc" and a.ndim >= 1


class ArrayDataset(Dataset[Any]):
    """A map-style dataset over whole arrays or tensors, gathered a batch at a time.

    ``ArrayDataset(x, y)`` yields ``(x[i], y[i])`` samples and ``ArrayDataset({"x": x, "y": y})``
    yields dicts, like a ``TensorDataset`` but also for NumPy arrays. naiad's DataLoader builds
    each batch with one vectorized index per column; torch's DataLoader works with it too,
    through ``__getitems__``.

    Args:
        *arrays: tensors or numeric NumPy arrays with the same first dimension, or a single
            mapping of names to them.

    Example:
        >>> import numpy as np
        >>> ds = ArrayDataset(np.zeros((10, 8), np.float32), np.ones(10, np.float32))
        >>> len(ds), ds[3][0].shape
        (10, (8,))
    """

    def __init__(self, *arrays: Any) -> None:
        if len(arrays) == 1 and isinstance(arrays[0], Mapping):
            self.keys: list[str] | None = list(arrays[0].keys())
            columns = list(arrays[0].values())
        else:
            self.keys = None
            columns = list(arrays)
        if not columns:
            raise ConfigError("ArrayDataset needs at least one array or tensor.")
        for c in columns:
            if not (isinstance(c, torch.Tensor) or _numeric_array(c)):
                raise ConfigError(
                    f"ArrayDataset takes tensors or numeric NumPy arrays, got {type(c).__name__}"
                    + (f" of dtype {c.dtype}" if isinstance(c, np.ndarray) else "")
                    + "."
                )
        lengths = {len(c) for c in columns}
        if len(lengths) != 1:
            raise ConfigError(f"ArrayDataset: every array needs the same length, got {sorted(lengths)}.")
        self.columns = columns
        self._len = lengths.pop()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        row = [c[index] for c in self.columns]
        return dict(zip(self.keys, row)) if self.keys is not None else tuple(row)

    def __getitems__(self, indices: list[int]) -> list[Any]:
        # torch's DataLoader contract: a list of samples for collate_fn.
        return [self[i] for i in indices]

    def gather(self, indices: np.ndarray) -> Any:
        """The collated batch for ``indices``: what ``default_collate`` makes of the samples."""
        cols = [_gather_one(c, np.asarray(indices, dtype=np.int64)) for c in self.columns]
        return dict(zip(self.keys, cols)) if self.keys is not None else cols


def _gather_one(column: Any, indices: np.ndarray) -> torch.Tensor:
    return _column_gatherer(column)(indices)


def _column_gatherer(column: Any) -> Callable[[np.ndarray], torch.Tensor]:
    """``indices -> column[indices]`` as a tensor, the fastest way the column allows.

    ``numpy.take`` on a NumPy view of a CPU tensor is 2-3x faster than ``index_select`` at
    every batch size (no per-call dispatch, no index-tensor wrapper); tensors NumPy cannot view
    (bfloat16, requires_grad) take ``index_select``.
    """
    if isinstance(column, np.ndarray):
        return functools.partial(_take, column)
    if column.ndim == 0:
        return lambda idx: column
    if column.device.type == "cpu" and not column.requires_grad:
        try:
            view = column.numpy()
        except (TypeError, RuntimeError):
            view = None
        if view is not None:
            return functools.partial(_take, view)
    return lambda idx: column.index_select(0, torch.from_numpy(idx))


def _take(column: np.ndarray, idx: np.ndarray) -> torch.Tensor:
    """``column[idx]``; in a process worker, built where the batch will cross to the training
    process (its slot: NOTE [ Batch transport ])."""
    if not slots.building():
        return torch.from_numpy(column.take(idx, axis=0))
    n = len(column)
    if len(idx) and (int(idx.min()) < -n or int(idx.max()) >= n):
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"index {int(bad)} is out of bounds for axis 0 with size {n}")
    out = slots.batch_array((len(idx), *column.shape[1:]), column.dtype)
    # mode="wrap" takes negative indices as Python does and, unlike "raise", writes into ``out``
    # without a buffer; the bounds are checked above.
    return torch.from_numpy(column.take(idx, axis=0, out=out, mode="wrap"))


def _gatherable(dataset: Any) -> bool:
    """True when naiad can index ``dataset`` as a whole, column by column."""
    if isinstance(dataset, torch.Tensor):
        return dataset.ndim >= 1 and dataset.layout == torch.strided
    if isinstance(dataset, np.ndarray):
        return _numeric_array(dataset)
    kind = type(dataset)
    if kind is TensorDataset:
        return all(t.ndim >= 1 and t.layout == torch.strided for t in dataset.tensors)
    if kind is ArrayDataset or _batch_gatherer(dataset) is not None:
        return True
    if kind is Subset:
        return _gatherable(dataset.dataset)
    return False


def _batch_gatherer(dataset: Any) -> Callable[[np.ndarray], Any] | None:
    """``dataset.gather_batch`` when its class defines one (looked up on the class, so a proxy
    that answers every attribute is not mistaken for one), else None.

    The protocol: ``gather_batch(indices)`` takes a 1-D int64 array and returns the batch that
    ``default_collate`` would build from ``[dataset[i] for i in indices]``, in one call (token
    windows read a whole batch with one gather: naiad.tokens).
    """
    if not callable(getattr(type(dataset), "gather_batch", None)):
        return None
    method: Callable[[np.ndarray], Any] = dataset.gather_batch
    return method


def _compile_gather(dataset: Any) -> Callable[[np.ndarray], Any]:
    """``indices -> batch`` for a gatherable dataset, with each column's gatherer built once."""
    kind = type(dataset)
    if isinstance(dataset, (torch.Tensor, np.ndarray)):
        return _column_gatherer(dataset)
    if kind is TensorDataset:
        # default_collate turns a batch of tuples into a list of stacked columns.
        columns = [_column_gatherer(t) for t in dataset.tensors]
        return lambda idx: [g(idx) for g in columns]
    if kind is ArrayDataset:
        columns = [_column_gatherer(c) for c in dataset.columns]
        if dataset.keys is not None:
            keys = dataset.keys
            return lambda idx: {k: g(idx) for k, g in zip(keys, columns)}
        return lambda idx: [g(idx) for g in columns]
    batch_gather = _batch_gatherer(dataset)
    if batch_gather is not None:
        return batch_gather
    if kind is Subset:
        base = np.asarray(dataset.indices, dtype=np.int64)
        inner = _compile_gather(dataset.dataset)
        return lambda idx: inner(base.take(idx))
    raise TypeError(f"cannot gather from {kind.__name__}")  # guarded by _gatherable


def choose_fetch(dataset: Any, collate_fn: Callable[[Any], Any] | None, auto_collation: bool) -> FetchStrategy:
    """Pick the fastest strategy that yields exactly the batches torch's DataLoader would."""
    if not auto_collation:
        return "items"
    if (collate_fn is None or collate_fn in _DEFAULT_COLLATES) and _gatherable(dataset):
        return "gather"
    getitems = getattr(dataset, "__getitems__", None)
    if getitems:
        return "getitems"
    return "items"


def make_fetch(
    dataset: Any,
    collate_fn: Callable[[Any], Any] | None,
    auto_collation: bool,
    strategy: FetchStrategy | None = None,
) -> Callable[[Any], Any]:
    """Return ``fetch(indices) -> batch`` for ``dataset``.

    With auto-collation, ``indices`` is a 1-D int64 NumPy array or a list of indices; without
    it (``batch_size=None``), a single index. The result equals what torch's DataLoader builds
    from the same indices.
    """
    if collate_fn is None:
        collate_fn = default_collate if auto_collation else default_convert
    if strategy is None:
        strategy = choose_fetch(dataset, collate_fn, auto_collation)
    if not auto_collation:
        return _fetch_one(dataset, collate_fn)
    if collate_fn is default_collate:
        collate_fn = slot_collate  # the same batches; in a process worker, stacked into its slot
    if strategy == "gather":
        return _fetch_gather(dataset)
    if strategy == "getitems":
        return _fetch_getitems(dataset, _noted(collate_fn))
    return _fetch_items(dataset, _noted(collate_fn))


def _noted(collate: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """``collate``, its exceptions noted with the indices of the samples it was given."""

    def collate_noted(data: Any, indices: Any) -> Any:
        try:
            return collate(data)
        except Exception as exc:
            add_note(exc, f"naiad: raised by collate_fn on the samples at indices {describe_indices(indices)}")
            raise

    return collate_noted


def _fetch_one(dataset: Any, collate: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One sample a call (``batch_size=None``), converted as torch converts it."""

    def fetch_one(index: Any) -> Any:
        try:
            sample = dataset[index]
        except Exception as exc:
            add_note(exc, f"naiad: raised by dataset[{index!r}]")
            raise
        return collate(sample)

    return fetch_one


def _fetch_gather(dataset: Any) -> Callable[[Any], Any]:
    """A batch as one vectorized index per column (``_compile_gather``)."""
    gather = _compile_gather(dataset)

    def fetch_gather(indices: Any) -> Any:
        idx = np.asarray(indices, dtype=np.int64)
        try:
            return gather(idx)
        except IndexError as exc:
            add_note(exc, f"naiad: raised while gathering indices {describe_indices(idx)} (dataset of length {len(dataset)})")
            raise

    return fetch_gather


def _fetch_getitems(dataset: Any, collate: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """A batch as one ``__getitems__`` call, then the collate."""

    def fetch_getitems(indices: Any) -> Any:
        idx = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        try:
            data = dataset.__getitems__(idx)
        except Exception as exc:
            add_note(exc, f"naiad: raised by dataset.__getitems__ for indices {describe_indices(idx)}")
            raise
        return collate(data, idx)

    return fetch_getitems


def _fetch_items(dataset: Any, collate: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """A batch sample by sample, torch's path, then the collate."""

    def fetch_items(indices: Any) -> Any:
        idx = indices.tolist() if isinstance(indices, np.ndarray) else indices
        data = []
        index = None
        try:
            for index in idx:
                data.append(dataset[index])
        except Exception as exc:
            add_note(exc, f"naiad: raised by dataset[{index!r}]")
            raise
        return collate(data, idx)

    return fetch_items
