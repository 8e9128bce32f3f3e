"""How a batch crosses from a worker process to the training process.

NOTE [ Batch transport ]
Each process worker owns a few shared-memory *slots* (:mod:`naiad.parallel.slots`): memory files
without a name (``memfd_create``), each mapped once in the worker and once in the training
process, its descriptor passed once over the worker's socket. A worker copies a batch's arrays
and tensors into a free slot (one copy, into pages already faulted in) and sends small records
of where each lies; the training process rebuilds them as arrays and tensors over its own
mapping of the slot, without a copy. Pickling the bytes through the socket (what naiad did below
4 MiB) copied them twice more and ran at 2-6% of one core's memcpy; torch's pickler makes a new
shared-memory file per tensor, passes its descriptor over a fresh socket connection and faults
every page in again, about a millisecond per tensor whatever its size.

Safe by construction:

* a slot is never written while anything views it: its first byte says who holds it (0 the
  worker, 1 the training process). The worker sets it before it sends; the training process
  clears it when it next sends a task or waits, after the last array of the batch is gone (NOTE
  [ Slot release ] in :mod:`naiad.parallel.slots`: no Python code runs when a batch dies, so a
  Ctrl-C is never lost).
  A batch the loop keeps (a list of batches, a tensor held across steps) keeps its slot; the
  worker makes another, up to :data:`~naiad.parallel.slots.MAX_SLOTS`, and past that sends the
  batch the old way (:func:`pack`), never waits and never overwrites;
* nothing outlives a kill: a slot has no name in /dev/shm, only descriptors and mappings, which
  the kernel frees with the last process holding one;
* memory is bounded: at most ``MAX_SLOTS`` slots per worker, each about the largest batch it
  carried (a free slot too small is replaced by a bigger one); ``loader.stats().workers
  ["batch_slots"]`` shows the slots mapped and their bytes;
* a result that fails to pickle after it took a slot gives it back; a worker that dies takes its
  slots with it (the training process's arrays keep their own mappings).

What is not an array or tensor of a numeric dtype (strings, Python objects, lists longer than
256 entries) is pickled as before. Without ``memfd_create`` (not Linux), :func:`pack` is the
transport: arrays below :data:`SHM_MIN_BYTES` inline, larger ones through torch's shared memory,
whose files torch unlinks at creation. ``bench/bench_transport.py`` measures both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["SHM_MIN_BYTES", "pack"]

SHM_MIN_BYTES = 4 << 20
"""Without slots, arrays and tensors of at least this many bytes cross through torch's shared memory; smaller, inline."""

# Lists longer than this are pickled as they are instead of walked: a collated list of strings
# has one entry per row, and walking it would be a per-row loop on every batch.
MAX_WALK = 256


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
        if t.dtype not in NOT_IN_NUMPY:  # NumPy pickles dtype and shape; one call rebuilds it
            return (torch.from_numpy, (t.numpy(),))
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        return (_tensor_from_bytes, (raw, t.dtype, tuple(t.shape)))


def _not_in_numpy() -> frozenset[Any]:
    import torch

    names = ("bfloat16", "complex32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    return frozenset(getattr(torch, n) for n in names if hasattr(torch, n))


NOT_IN_NUMPY = _not_in_numpy()
"""torch dtypes with no NumPy equivalent: their tensors cross as raw bytes."""


def plain_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a dense CPU tensor of at least one dimension, outside autograd."""
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
    if type(obj).__module__ == "torch" and plain_tensor(obj):
        nbytes = obj.numel() * obj.element_size()
        return obj if nbytes >= SHM_MIN_BYTES else _InlineTensor(obj)
    kind = type(obj)
    if kind is dict:
        return {k: pack(v) for k, v in obj.items()}
    if kind is list or kind is tuple:
        if len(obj) > MAX_WALK:
            return obj
        return kind(pack(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return kind(*(pack(v) for v in obj))
    return obj
