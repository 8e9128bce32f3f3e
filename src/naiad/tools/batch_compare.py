"""Batches compared value by value: where two batches first differ, named by its path in the
batch (``batch['x'].right[1]``), with both sides; and a batch snapshot that a later in-place
write cannot change (what :func:`naiad.testing.check_resume` compares)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["first_difference", "snapshot"]


def first_difference(expected: Any, got: Any, path: str = "batch") -> str | None:
    """Where two batches first differ, in words (None: the same batch).

    Batches are the same when they have the same types and nesting (dicts with keys in the same
    order, lists, tuples, namedtuples), and their leaves are equal: tensors and NumPy arrays of
    the same dtype, shape, device and values (NaN equals NaN), strings, bytes and numbers.

    Example:
        >>> first_difference({"x": torch.tensor([1, 2])}, {"x": torch.tensor([1, 3])})
        "batch['x']: values differ at index (1,): expected 2, got 3"
    """
    if type(expected) is not type(got):
        return f"{path}: type {_type_name(got)}, expected {_type_name(expected)}"
    if isinstance(expected, torch.Tensor):
        return _tensor_difference(expected, got, path)
    if isinstance(expected, np.ndarray):
        return _array_difference(expected, got, path)
    if isinstance(expected, Mapping):
        return _mapping_difference(expected, got, path)
    if isinstance(expected, (list, tuple)):
        return _sequence_difference(expected, got, path)
    return _value_difference(expected, got, path)


def _mapping_difference(expected: Mapping[Any, Any], got: Mapping[Any, Any], path: str) -> str | None:
    if list(expected.keys()) != list(got.keys()):
        return f"{path}: keys {list(got.keys())!r:.300}, expected {list(expected.keys())!r:.300}"
    for key in expected:
        diff = first_difference(expected[key], got[key], f"{path}[{key!r}]")
        if diff is not None:
            return diff
    return None


def _sequence_difference(expected: list[Any] | tuple[Any, ...], got: list[Any] | tuple[Any, ...], path: str) -> str | None:
    if len(expected) != len(got):
        return f"{path}: length {len(got)}, expected {len(expected)}"
    fields = getattr(expected, "_fields", None)  # a namedtuple: name its fields
    for i, (a, b) in enumerate(zip(expected, got)):
        diff = first_difference(a, b, f"{path}.{fields[i]}" if fields else f"{path}[{i}]")
        if diff is not None:
            return diff
    return None


def _value_difference(expected: Any, got: Any, path: str) -> str | None:
    if isinstance(expected, (float, np.floating)) and math.isnan(expected) and math.isnan(got):
        return None
    try:
        same = bool(expected == got)
    except Exception as exc:  # noqa: BLE001 - an object that cannot say: report it, not crash
        return f"{path}: {_type_name(expected)} values cannot be compared ({exc})"
    return None if same else f"{path}: {got!r:.200}, expected {expected!r:.200}"


def _tensor_difference(a: torch.Tensor, b: torch.Tensor, path: str) -> str | None:
    if a.dtype != b.dtype:
        return f"{path}: dtype {b.dtype}, expected {a.dtype}"
    if a.shape != b.shape:
        return f"{path}: shape {tuple(b.shape)}, expected {tuple(a.shape)}"
    if a.device != b.device:
        return f"{path}: device {b.device}, expected {a.device}"
    if a.layout != torch.strided or b.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        equal = (a == b) | (torch.isnan(a) & torch.isnan(b))
    else:
        equal = a == b
    if bool(equal.all()):
        return None
    where = tuple(int(i) for i in torch.nonzero(~equal)[0].tolist())
    return f"{path}: values differ at index {where}: expected {a[where].item()!r}, got {b[where].item()!r}"


def _array_difference(a: np.ndarray, b: np.ndarray, path: str) -> str | None:
    if a.dtype != b.dtype:
        return f"{path}: dtype {b.dtype}, expected {a.dtype}"
    if a.shape != b.shape:
        return f"{path}: shape {b.shape}, expected {a.shape}"
    if a.dtype.kind in "fc":
        equal = (a == b) | (np.isnan(a) & np.isnan(b))
    elif a.dtype.kind in "biumMSUV":
        equal = np.asarray(a == b)
    else:  # objects: element by element, through first_difference
        for where in np.ndindex(a.shape):
            diff = first_difference(a[where], b[where], f"{path}{list(where)}")
            if diff is not None:
                return diff
        return None
    if bool(np.all(equal)):
        return None
    where = tuple(int(i) for i in np.argwhere(~equal)[0])
    return f"{path}: values differ at index {where}: expected {a[where]!r}, got {b[where]!r}"


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def snapshot(batch: Any) -> Any:
    """A copy of ``batch`` that later passes cannot change (tensors and arrays copied)."""
    if isinstance(batch, torch.Tensor):
        return batch.detach().clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if type(batch) is dict:
        return {k: snapshot(v) for k, v in batch.items()}
    if type(batch) is list:
        return [snapshot(v) for v in batch]
    if type(batch) is tuple:
        return tuple(snapshot(v) for v in batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(snapshot(v) for v in batch))
    return batch  # other containers and leaves as they are
