"""How a batch crosses from a worker process to the training process.

NOTE [ Batch transport ]
torch's pickler for tensors (registered by ``torch.multiprocessing``) moves a tensor's storage
into a shared-memory file and passes its file descriptor over a Unix socket: no copy of the
data, but a fixed cost of about a millisecond per tensor on the receiving side (a socket
connection to the sender's resource sharer, ``recvmsg``, ``mmap``). For the small batches most
training loops use, copying the bytes through the result pipe is several times cheaper, so
:func:`pack` sends arrays and tensors below :data:`SHM_MIN_BYTES` inline (pickled bytes) and only
large ones through shared memory. ``bench/bench_workers.py --transport`` measures the crossover
(about 4 MiB per array on a 2-core machine: below it inline wins by 3-10x, above it shared memory
wins and keeps winning as batches grow).

Shared-memory files never outlive an error: torch creates each one and unlinks it at once, so
only open descriptors keep it alive and the kernel frees it when the last process holding one
exits or drops it. Nothing is left under /dev/shm after a kill. One consequence is that a
descriptor can only be received while the sender lives; a worker that dies with a large
result still in the pipe loses it (the pool reports the death instead).

Both wrappers rebuild themselves while unpickling (``__reduce__``), so the receiving side makes
no second pass over the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["SHM_MIN_BYTES", "pack"]

SHM_MIN_BYTES = 4 << 20
"""Arrays and tensors of at least this many bytes cross through shared memory; smaller, inline."""

# Lists longer than this are pickled as they are instead of walked: a collated list of strings
# has one entry per row, and walking it would be a per-row loop on every batch.
_MAX_WALK = 256


def _numpy_from_tensor(tensor: torch.Tensor) -> np.ndarray:
    return tensor.numpy()


def _tensor_from_bytes(data: np.ndarray, dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(data).view(dtype).reshape(shape)


class _SharedArray:
    """A large NumPy array carried as a tensor, so torch moves it through shared memory."""

    __slots__ = ("tensor",)

    def __init__(self, array: np.ndarray) -> None:
        import torch

        self.tensor = torch.from_numpy(np.ascontiguousarray(array))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_numpy_from_tensor, (self.tensor,))


class _InlineTensor:
    """A small tensor carried as its bytes through the pipe, rebuilt as a tensor on arrival."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        import torch

        t = self.tensor.contiguous()
        if t.dtype not in _NOT_IN_NUMPY:  # NumPy pickles dtype and shape; one call rebuilds it
            return (torch.from_numpy, (t.numpy(),))
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        return (_tensor_from_bytes, (raw, t.dtype, tuple(t.shape)))


def _not_in_numpy() -> frozenset[Any]:
    import torch

    names = ("bfloat16", "complex32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    return frozenset(getattr(torch, n) for n in names if hasattr(torch, n))


_NOT_IN_NUMPY = _not_in_numpy()


def _plain_tensor(obj: Any) -> bool:
    import torch

    return (
        type(obj) is torch.Tensor
        and obj.layout == torch.strided
        and obj.device.type == "cpu"
        and not obj.requires_grad
        and obj.ndim > 0
    )


def pack(obj: Any) -> Any:
    """Wrap the arrays and tensors in ``obj`` for the trip to the training process.

    Dicts, lists, tuples and named tuples are walked (lists of up to 256 entries); anything
    else is left to pickle (tensors inside it then take torch's shared-memory path).
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biufc" and obj.nbytes >= SHM_MIN_BYTES:
            return _SharedArray(obj)
        return obj
    if type(obj).__module__ == "torch" and _plain_tensor(obj):
        nbytes = obj.numel() * obj.element_size()
        return obj if nbytes >= SHM_MIN_BYTES else _InlineTensor(obj)
    kind = type(obj)
    if kind is dict:
        return {k: pack(v) for k, v in obj.items()}
    if kind is list or kind is tuple:
        if len(obj) > _MAX_WALK:
            return obj
        return kind(pack(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return kind(*(pack(v) for v in obj))
    return obj
