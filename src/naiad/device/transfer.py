"""Moving one batch to a device: the per-batch half of :mod:`naiad.device.prefetch`.

A mover runs in the prefetcher's background thread and returns ``(moved batch, event or None,
copied tensors, foreign)``: the batch with its CPU tensors on their way to the device, the CUDA
event recorded after the copies, the device tensors the consumer must ``record_stream``, and
whether some leaf lives on a third device (the consumer moves those on its own stream). The
protocol is NOTE [ Stream synchronization of prefetched batches ] in :mod:`naiad.device.prefetch`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from naiad.device.tree import map_tensors

__all__ = ["CudaMover", "GenericMover", "Mover", "move_to_device"]

T = TypeVar("T")


def move_to_device(batch: T, device: str | torch.device, *, non_blocking: bool = False) -> T:
    """``batch`` with every tensor moved to ``device``; containers walked as the prefetcher does.

    The synchronous counterpart of :class:`~naiad.device.prefetch.DevicePrefetcher`, for a plain training loop.

    Example:
        >>> move_to_device({"x": torch.ones(2), "name": "a"}, "cpu")
        {'x': tensor([1., 1.]), 'name': 'a'}
    """
    target = torch.device(device)
    moved: T = map_tensors(lambda t: t.to(target, non_blocking=non_blocking), batch)  # same containers
    return moved


class Mover:
    """Moves a batch for one target device; the base class keeps CPU tensors where they are."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.foreign = False  # set when a leaf must be moved by the consumer (another device)

    def _leaf(self, t: torch.Tensor) -> torch.Tensor:
        if t.device != self.device:
            self.foreign = True
        return t

    def __call__(self, batch: Any) -> tuple[Any, Any, list[torch.Tensor], bool]:
        self.foreign = False
        moved = map_tensors(self._leaf, batch)
        return moved, None, [], self.foreign


class GenericMover(Mover):
    """A device without streams we manage (``mps``, ``xpu``, ...): a plain copy in the thread."""

    def _leaf(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.device else t.to(self.device)


class CudaMover(Mover):
    """Pin, then copy on a dedicated stream; see NOTE [ Stream synchronization of prefetched batches ]."""

    def __init__(self, device: torch.device, pin_memory: bool) -> None:
        super().__init__(device)
        self.pin_memory = pin_memory
        self.stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]  # unannotated in torch
        self.copied: list[torch.Tensor] = []

    def _leaf(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu":
            if self.pin_memory and not t.is_pinned():
                t = t.pin_memory()  # CPU work, in this thread, off the training loop
            out = t.to(self.device, non_blocking=True)
            self.copied.append(out)
            return out
        if t.device != self.device:
            self.foreign = True
        return t

    def __call__(self, batch: Any) -> tuple[Any, Any, list[torch.Tensor], bool]:
        self.foreign = False
        self.copied = []
        # The current device and stream are per thread: set both for this producer thread.
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            moved = map_tensors(self._leaf, batch)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
            event.record(self.stream)
        copied, self.copied = self.copied, []  # hold no batch between calls
        return moved, event, copied, self.foreign
