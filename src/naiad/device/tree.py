"""Walk nested batches: dicts, lists, tuples and namedtuples of tensors, other leaves untouched."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import numpy as np
import torch

__all__ = ["count_rows", "map_tensors"]


def map_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply ``fn`` to every tensor in ``data``, keeping the containers' types.

    Mappings keep their type (mutable ones are copied and updated, so subclasses keep their
    extra attributes), namedtuples stay namedtuples, lists and tuples keep their type; strings,
    bytes and any other leaf pass through unchanged.

    Example:
        >>> map_tensors(lambda t: t * 2, {"x": torch.ones(2), "name": "a"})["x"].tolist()
        [2.0, 2.0]
    """
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        items = {k: map_tensors(fn, v) for k, v in data.items()}
        if isinstance(data, MutableMapping):
            clone = copy.copy(data)
            clone.update(items)
            return clone
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(map_tensors(fn, v) for v in data))
    if isinstance(data, tuple):
        return tuple(map_tensors(fn, v) for v in data)
    if isinstance(data, list):
        return [map_tensors(fn, v) for v in data]
    return data


def count_rows(batch: Any) -> int | None:
    """Rows in a batch: the length of its first array leaf (a 0-d leaf counts as one row), or
    of its first list of strings (a text column: one string a row)."""
    kind = type(batch)
    if kind is dict or kind is list or kind is tuple:  # the common cases first: tensors in a dict or a list
        first = (next(iter(batch.values())) if kind is dict else batch[0]) if batch else None
        if type(first) is torch.Tensor:
            return int(first.shape[0]) if first.ndim else 1
        if kind is not dict and isinstance(first, (str, bytes)) and isinstance(batch[-1], (str, bytes)):
            return len(batch)  # not a walk over every string
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, Mapping):
        values: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for v in values:
        n = count_rows(v)
        if n is not None:
            return n
    return None
