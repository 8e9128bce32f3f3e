"""Reusable shared-memory slots: a process worker's batches cross into the training process
without pickling their bytes or a new shared-memory file per tensor (NOTE [ Batch transport ]
in :mod:`naiad.parallel.transport`).

A worker owns its slots (:class:`WorkerSlots`): memory files with no name (``memfd_create``),
created when no free slot holds the batch and announced once to the training process with
their descriptor (a :attr:`Kind.SLOT` message, then the descriptor over the same Unix socket).
The worker copies a batch's arrays and tensors into a free slot and sends, in their place,
small :class:`_SlotView` records; unpickled in the training process (:func:`_view`) each is
an array or tensor over the slot's mapping there, made without a copy. The first byte of a
slot says who holds it: 0 the worker (free), 1 the training process. The worker sets it before
it sends; the training process clears it once the last array of that batch over the slot is
gone (NOTE [ Slot release ]), so a slot is never written while anything views it.

NOTE [ Slot release ]
A batch's arrays are views of one memoryview of the slot's mapping, made for that batch. A weak
reference to it has ``list.append`` of a module list for its callback: when the last array goes,
CPython appends the reference, and the training process clears the flags of the batches so gone
each time it sends a worker a task or waits for one (:func:`collect`). No Python code runs when
a batch dies. A finalizer in Python did (one per array), and a Ctrl-C that landed in it was
raised there, printed as "Exception ignored" and lost: the loop went on. The cost: a slot comes
back when the training process next sends or waits, not the moment its batch goes, so a worker
may hold one slot more.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from naiad.parallel.transport import MAX_WALK, NOT_IN_NUMPY, plain_tensor
from naiad.parallel.transport import pack as transport_pack

__all__ = ["MAX_SLOTS", "WorkerSlots", "batch_array", "building", "collect", "forget", "memory", "receive", "supported", "use"]

MAX_SLOTS = 8
"""Slots a worker may hold at most: enough for its tasks in flight and the batches the loop
and a pinning or device-prefetch thread hold; past it, a batch goes the old way (pickled, or
torch's shared memory for large arrays) rather than wait."""

_ALIGN = 64  # each array's offset: cache-line aligned, and aligned for every dtype
_HEADER = _ALIGN  # the holder byte, alone on its cache line
_MIN_SLOT = 64 << 10
_LOG = logging.getLogger("naiad.workers")


def supported() -> bool:
    """Whether this platform has unnamed memory files (Linux)."""
    return hasattr(os, "memfd_create")


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


# --------------------------------------------------------------------------------------------
# In a worker process.


class _Slot:
    __slots__ = ("address", "gen", "index", "mm", "size", "t8", "u8")

    def __init__(self, index: int, size: int, fd: int) -> None:
        self.index, self.size, self.gen = index, size, 0
        self.mm = mmap.mmap(fd, size)
        self.u8 = np.frombuffer(self.mm, np.uint8)
        self.address = int(self.u8.ctypes.data) + _HEADER  # where offsets count from
        self.t8: Any = None  # a tensor over u8, made the first time a tensor is copied in

    @property
    def free(self) -> bool:
        return int(self.u8[0]) == 0


# What a view is rebuilt as: an array, a tensor of a NumPy dtype, a tensor of a dtype NumPy
# lacks (bfloat16, float8: its bytes reinterpreted by torch).
_ARRAY, _TENSOR, _RAW_TENSOR = 0, 1, 2


class _SlotView:
    """In a worker: one array's place in a slot; unpickled in the training process as the array."""

    __slots__ = ("copy", "count", "dtype", "gen", "index", "kind", "nbytes", "offset", "ptr", "shape", "source",
                 "token")

    def __init__(self, source: Any, kind: int, dtype: Any, nbytes: int, ptr: int | None) -> None:
        # ``source``: the array, or the tensor; ``ptr``: its first byte's address where it lies
        # in one contiguous run (None: it does not, or it is not known yet: an array's).
        self.source, self.kind, self.dtype, self.nbytes, self.ptr = source, kind, dtype, nbytes, ptr
        self.shape = tuple(source.shape)
        self.token = self.index = self.gen = self.count = self.offset = 0
        self.copy = True

    def __reduce__(self) -> tuple[Any, ...]:
        return (_view, (self.token, self.index, self.gen, self.count, self.offset, self.nbytes, self.kind,
                        self.dtype, self.shape))


class WorkerSlots:
    """A worker process's slots, and how a batch is put into one.

    Args:
        announce: sends the training process a new slot: ``announce(token, index, size, fd)``
            (a :attr:`Kind.SLOT` message, then the descriptor).
        max_slots: the most slots held at once (None: :data:`MAX_SLOTS`).
    """

    def __init__(self, announce: Callable[[int, int, int, int], None], max_slots: int | None = None) -> None:
        self._announce = announce
        self._max = MAX_SLOTS if max_slots is None else max_slots
        # A name for this worker's slots in the training process, not its pid: pids are reused.
        self.token = int.from_bytes(os.urandom(7), "little")
        self._slots: list[_Slot] = []
        self._sent: _Slot | None = None
        # The slot the task being run builds its arrays in (batch_array), and its first free byte.
        self._arena: _Slot | None = None
        self._arena_end = 0
        self._last_need = _MIN_SLOT
        self._thread = threading.get_ident()

    def pack(self, obj: Any) -> Any:
        """``obj`` with its arrays and tensors in a free slot (those built there by
        :func:`batch_array` stay where they are; the rest are copied in); ``transport.pack(obj)``
        when it has none, or no slot is free and no more may be made."""
        self._sent = None  # a batch sent before this one is the training process's: never unsent
        views: list[_SlotView] = []
        tree = _place(obj, views)
        arena, self._arena = self._arena, None
        if not views:
            return transport_pack(obj)
        slot = self._in_arena(arena, views) if arena is not None else None
        if slot is None:
            end = 0
            for v in views:
                v.offset, v.copy, end = end, True, _round_up(end + v.nbytes, _ALIGN)
            slot = self._slot_for(_HEADER + end, besides=arena)
            if slot is None:
                return transport_pack(obj)
        slot.gen += 1
        for v in views:
            if v.copy:
                _copy_in(slot, v)
            v.token, v.index, v.gen, v.count, v.source = self.token, slot.index, slot.gen, len(views), None
        slot.u8[0] = 1  # the training process holds it from now on
        self._sent = slot
        return tree

    def _in_arena(self, arena: _Slot, views: list[_SlotView]) -> _Slot | None:
        """Place ``views`` in the task's arena: arrays built there stay, the rest go after them;
        None when they do not fit."""
        base, end = arena.address, self._arena_end
        for v in views:
            ptr = v.ptr
            if ptr is None and v.kind == _ARRAY and v.source.flags.c_contiguous:
                ptr = v.source.ctypes.data
            if ptr is not None and v.kind != _RAW_TENSOR and base <= ptr < base + arena.size:
                v.offset, v.copy = ptr - base, False
            else:
                v.offset, v.copy, end = end, True, _round_up(end + v.nbytes, _ALIGN)
        self._last_need = _HEADER + end
        return arena if _HEADER + end <= arena.size else None

    def array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        """An array in the task's arena (a free slot, kept for the batch), or None: another
        thread than the worker's, no free slot, or no room left."""
        if threading.get_ident() != self._thread:
            return None
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return None
        if self._arena is None:
            self._arena = self._slot_for(max(self._last_need, _HEADER + nbytes))
            self._arena_end = 0
            if self._arena is None:
                return None
        start = self._arena_end
        if _HEADER + start + nbytes > self._arena.size:
            return None
        self._arena_end = _round_up(start + nbytes, _ALIGN)
        return self._arena.u8[_HEADER + start:_HEADER + start + nbytes].view(dtype).reshape(shape)

    @property
    def in_slot(self) -> bool:
        """Whether the batch last packed went into a slot (until the task ends)."""
        return self._sent is not None

    def end_task(self) -> None:
        """The task's reply is sent (or failed): its arena, if any, is free again, and nothing
        is left for :meth:`unsent` to give back."""
        self._arena = None
        self._sent = None

    def unsent(self) -> None:
        """The batch last packed was not sent (it failed to pickle): its slot is free again."""
        if self._sent is not None:
            self._sent.u8[0] = 0
            self._sent = None

    def _slot_for(self, need: int, besides: _Slot | None = None) -> _Slot | None:
        free = [s for s in self._slots if s.free and s is not besides]
        fits = [s for s in free if s.size >= need]
        if fits:
            return min(fits, key=lambda s: s.size)
        size = _round_up(max(need + need // 8, _MIN_SLOT), mmap.PAGESIZE)
        if len(self._slots) < self._max:
            return self._make(len(self._slots), size)
        if free:  # all made, none big enough: a free one grows (is replaced by a bigger one)
            return self._make(max(free, key=lambda s: s.size).index, size)
        return None

    def _make(self, index: int, size: int) -> _Slot | None:
        try:
            fd = os.memfd_create(f"naiad-batch-{index}", os.MFD_CLOEXEC)
        except OSError as exc:
            _LOG.debug("no shared-memory slot (%s): the batch is pickled", exc)
            return None
        try:
            os.ftruncate(fd, size)
            slot = _Slot(index, size, fd)
            self._announce(self.token, index, size, fd)
        finally:
            os.close(fd)
        if index < len(self._slots):
            self._slots[index] = slot  # the old mapping goes; the training process's copy lives on
        else:
            self._slots.append(slot)
        return slot


def _place(obj: Any, views: list[_SlotView]) -> Any:
    """``obj`` with each numeric array and tensor replaced by a :class:`_SlotView` (its place
    in a slot is set by :meth:`WorkerSlots.pack`), walked as :func:`transport.pack` walks it."""
    kind = type(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufc" or obj.ndim == 0 or obj.size == 0:
            return obj
        return _add(_SlotView(obj, _ARRAY, obj.dtype.str, obj.nbytes, None), views)
    if kind.__module__ == "torch" and plain_tensor(obj) and obj.numel():
        nbytes = obj.numel() * obj.element_size()
        if obj.dtype in NOT_IN_NUMPY or obj.is_conj() or obj.is_neg():  # NumPy cannot view it
            return _add(_SlotView(obj, _RAW_TENSOR, obj.dtype, nbytes, None), views)
        # The tensor itself, not ``.numpy()``: a batch built in its slot is not copied, and
        # asking the tensor is a fraction of making the array (a few µs a batch, per worker).
        ptr = obj.data_ptr() if obj.is_contiguous() else None
        return _add(_SlotView(obj, _TENSOR, _numpy_dtype(obj.dtype), nbytes, ptr), views)
    if kind is dict:
        return {k: _place(v, views) for k, v in obj.items()}
    if kind is list or kind is tuple:
        return obj if len(obj) > MAX_WALK else kind(_place(v, views) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return kind(*(_place(v, views) for v in obj))
    return obj


_NUMPY_DTYPES: dict[Any, str] = {}  # torch dtype -> NumPy's dtype string, as ``tensor.numpy()`` gives it


def _numpy_dtype(dtype: Any) -> str:
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        import torch

        found = _NUMPY_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype.str
    return found


def _add(view: _SlotView, views: list[_SlotView]) -> _SlotView:
    views.append(view)
    return view


def _copy_in(slot: _Slot, v: _SlotView) -> None:
    start = _HEADER + v.offset
    if v.kind != _RAW_TENSOR:
        src = v.source if v.kind == _ARRAY else v.source.numpy()
        np.copyto(slot.u8[start:start + v.nbytes].view(src.dtype).reshape(v.shape), src, casting="no")
        return
    import torch

    if slot.t8 is None:
        slot.t8 = torch.from_numpy(slot.u8)
    slot.t8[start:start + v.nbytes].view(v.dtype).view(v.shape).copy_(v.source)


_CURRENT: WorkerSlots | None = None  # this process's, in a process worker (set by the backend)


def use(held: WorkerSlots | None) -> None:
    """Make ``held`` the slots :func:`batch_array` builds in (a process worker, at its start)."""
    global _CURRENT
    _CURRENT = held


def building() -> bool:
    """Whether :func:`batch_array` builds in a slot here (a process worker with slots)."""
    return _CURRENT is not None


def batch_array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array to build one of a batch's columns in.

    In a process worker it lies in the shared-memory slot the batch will cross in, so the batch
    crosses without a copy (NOTE [ Batch transport ]); elsewhere, and when the slot has no room,
    it is ``numpy.empty``. Use it for arrays the task returns, not for scratch: the slot is the
    training process's once the batch is sent.
    """
    dt = np.dtype(dtype)
    held = _CURRENT
    out = held.array(tuple(shape), dt) if held is not None else None
    return out if out is not None else np.empty(shape, dt)


# --------------------------------------------------------------------------------------------
# In the training process.


class _SlotMap:
    """A worker's slot as mapped in the training process."""

    __slots__ = ("__weakref__", "flag", "gen", "left", "mm", "size", "whole")

    def __init__(self, mm: mmap.mmap, size: int) -> None:
        self.mm, self.size = mm, size
        self.flag = np.frombuffer(mm, np.uint8, count=1)
        self.gen = -1
        self.left = 0  # arrays of the batch being unpickled still to make
        self.whole: np.ndarray | None = None  # the batch's view of the mapping, while it is unpickled


_MAPS: dict[tuple[int, int], _SlotMap] = {}
# Batches out (id of the weak reference -> it, its slot, weakly: a worker's slots go with it,
# and the process that holds the batch), and the weak references of those gone, appended by
# CPython (NOTE [ Slot release ]).
_OUT: dict[int, tuple[weakref.ref[Any], weakref.ref[_SlotMap], int]] = {}
_GONE: list[weakref.ref[Any]] = []


def receive(conn: Any, token: int, index: int, size: int) -> None:
    """Take a worker's new slot: its descriptor is the next thing on ``conn``."""
    from multiprocessing.reduction import recv_handle

    from naiad.errors import WorkerError

    if not conn.poll(5.0):  # sent right after the announcement: only a stopped worker delays it
        raise WorkerError("naiad: a worker announced a shared-memory slot but sent no descriptor within 5 s.")
    fd = recv_handle(conn)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    _MAPS[(token, index)] = _SlotMap(mm, size)


def forget(token: int) -> None:
    """Drop a worker's slots (it ended): arrays still viewing them keep their own mappings, and
    the mappings go with the last of them."""
    collect()
    for key in [k for k in _MAPS if k[0] == token]:
        del _MAPS[key]


def memory() -> dict[str, int]:
    """This process's slots from live workers: how many, and their bytes."""
    maps = list(_MAPS.values())
    return {"slots": len(maps), "bytes": sum(m.size for m in maps)}


def collect() -> None:
    """Give back the slots whose batches are all gone (the training process, before it sends a
    task and at each wait)."""
    pid = None
    while _GONE:
        _, slot, owner = _OUT.pop(id(_GONE.pop()))
        pid = os.getpid() if pid is None else pid
        m = slot()
        # A forked child's copies of our arrays must not free the slot; a slot is never
        # replaced while held, so the map found is the batch's own.
        if m is not None and owner == pid:
            m.flag[0] = 0


def _view(token: int, index: int, gen: int, count: int, offset: int, nbytes: int, kind: int, dtype: Any,
          shape: tuple[int, ...]) -> Any:
    """One array of a batch, over the slot it was sent in (the unpickling side of :class:`_SlotView`)."""
    m = _MAPS[(token, index)]
    if m.gen != gen:  # this batch's first array: the previous batch's arrays are all gone
        m.gen, m.left, m.whole = gen, count, np.frombuffer(m.mm, np.uint8)
        ref = weakref.ref(m.whole.base, _GONE.append)
        _OUT[id(ref)] = (ref, weakref.ref(m), os.getpid())
    whole = m.whole
    assert whole is not None
    m.left -= 1
    if m.left <= 0:
        m.whole = None  # from here the batch's arrays alone hold the memoryview
    raw = whole[_HEADER + offset:_HEADER + offset + nbytes]
    if kind == _ARRAY:
        return raw.view(dtype).reshape(shape)
    import torch

    if kind == _TENSOR:
        return torch.from_numpy(raw.view(dtype).reshape(shape))
    return torch.from_numpy(raw).view(dtype).view(shape)
