"""torch's ``default_collate``, stacking tensors straight into the batch's slot in a process worker.

In a worker, ``default_collate`` stacks each tensor field into a fresh shared-memory file of
torch's (``get_worker_info()`` tells it it is in one), which naiad's transport then copies into
a batch slot (NOTE [ Batch transport ] in parallel/transport.py): a file made, its pages
faulted in and its bytes copied, per batch. :func:`slot_collate` stacks the tensors and arrays of
the common samples (a tensor or array; a plain dict or tuple of them and of other values) into
the slot with ``torch.stack(..., out=)`` instead, and hands everything else to
``default_collate``, field by field, so the batch is the one torch builds: the same types,
dtypes, shapes and values (tests/unit/test_slot_collate.py checks it against torch's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from naiad.parallel import slots

__all__ = ["slot_collate"]


def slot_collate(samples: list[Any]) -> Any:
    """``default_collate(samples)``, its stacked tensors built in the batch's slot when this is a
    process worker with slots (elsewhere it is ``default_collate``)."""
    if not slots.building() or not samples:
        return default_collate(samples)
    first = samples[0]
    kind = type(first)
    if kind is dict and all(type(s) is dict and s.keys() == first.keys() for s in samples):
        return {k: _field([s[k] for s in samples]) for k in first}
    if kind is tuple and all(type(s) is tuple and len(s) == len(first) for s in samples):
        return [_field(list(column)) for column in zip(*samples)]  # default_collate: a list
    return _field(samples)


def _field(values: list[Any]) -> Any:
    first = values[0]
    if type(first) is torch.Tensor:
        stacked = _stack_tensors(values)
    elif type(first) is np.ndarray and first.dtype.kind in "biufc" and first.dtype.isnative:
        stacked = _stack_arrays(values)
    else:
        stacked = None
    return default_collate(values) if stacked is None else stacked


def _stack_tensors(values: list[torch.Tensor]) -> torch.Tensor | None:
    first = values[0]
    if first.layout != torch.strided or first.device.type != "cpu" or first.requires_grad or first.is_nested:
        return None
    if any(type(v) is not torch.Tensor or v.dtype != first.dtype or v.shape != first.shape for v in values):
        return None  # default_collate raises for these, with its own message
    try:
        out = torch.from_numpy(slots.batch_array((len(values), *first.shape), _numpy_dtype(first.dtype)))
    except TypeError:  # a dtype NumPy lacks (bfloat16...)
        return None
    return torch.stack(values, 0, out=out)


def _stack_arrays(values: list[np.ndarray]) -> torch.Tensor | None:
    first = values[0]
    if any(type(v) is not np.ndarray or v.dtype != first.dtype or v.shape != first.shape for v in values):
        return None
    out = slots.batch_array((len(values), *first.shape), first.dtype)
    np.stack(values, axis=0, out=out)
    return torch.from_numpy(out)


_NUMPY_DTYPES: dict[torch.dtype, np.dtype[Any]] = {}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """NumPy's dtype for ``dtype``; TypeError for one NumPy lacks."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        found = _NUMPY_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return found
