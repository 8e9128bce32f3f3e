"""A worker process's heap: glibc's mmap threshold fixed, and the free heap given back.

NOTE [ Worker heap ]
glibc's malloc serves a big block (a batch's decoded pixels, a read's arrays, a user's fresh batch
tensor: megabytes) with its own mmap at first, and unmaps it when freed; each such free raises
the threshold (up to 32 MiB) and the heap's trim threshold with it (to 64 MiB), after which
blocks of those sizes come from the heap and up to 64 MiB of free heap stays resident. A worker
freeing multi-MiB blocks of varying sizes per task grew by megabytes an epoch that way
(bench/bench_soak.py, 28x28 PNGs decoded in the reads: 6 MiB an epoch per worker, before
batches were built in their slots). A threshold fixed at 1 MiB kept it flat, but then every
block of a MiB or more was mapped, page-faulted and unmapped afresh per task: a user's fresh 10
MiB batch tensor cost its pages' faults every batch, and ready batches of 3-16 MiB crossed at
2.4-2.8x torch's rate against 4.3-4.6x with the blocks reused (bench_transport.py).

So the threshold is fixed at MMAP_THRESHOLD, glibc's own ceiling for its moving one: blocks up to
it come from the heap, and a batch-sized block freed is the next batch's, without faults; fixing
it also keeps the heap's trim threshold at its 128 KiB default, so free memory at the heap's top
goes back at once. Free pages inside the heap go back too: ``malloc_trim(0)`` every TRIM_EVERY
tasks, and when the worker has waited for a task for a while (between epochs: the backend's
POLL_S). Measured (bench_soak.py, 20 epochs): the workers' USS grows by what it grew with the 1
MiB threshold (+0.15 MiB an epoch for the PNG folder, +0.45 for the JPEG shards, which 60 epochs
showed bounded); a worker freeing 6-7 MiB blocks of seven sizes per task holds 46-60 MiB against
28 MiB with the 1 MiB threshold, flat over 120 tasks (blocks kept for reuse), and one left idle
with 200 MiB of freed heap gives it back within a second.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["MMAP_THRESHOLD", "TRIM_EVERY", "HeapTrimmer", "fix_mmap_threshold"]

MMAP_THRESHOLD = 32 << 20
"""Bytes from which a worker process's ``malloc`` maps each block on its own (NOTE [ Worker heap ])."""

TRIM_EVERY = 64
"""Tasks between two ``malloc_trim(0)`` in a worker process (NOTE [ Worker heap ])."""

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _libc(name: str) -> Any:
    """glibc's function ``name``, or None (another C library)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` in this process (NOTE [ Worker
    heap ]); whether it was set (only glibc has ``mallopt``; elsewhere this does nothing)."""
    mallopt = _libc("mallopt")
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class HeapTrimmer:
    """Gives a worker process's free heap back to the system every :data:`TRIM_EVERY` tasks and
    when the worker idles (NOTE [ Worker heap ]); does nothing without glibc."""

    def __init__(self) -> None:
        self._trim = _libc("malloc_trim")
        self._served = 0  # tasks since the last trim

    def task(self) -> None:
        """A task is about to run."""
        if self._served >= TRIM_EVERY:
            self._now()
        self._served += 1

    def idle(self) -> None:
        """The worker waited with nothing to do: what its tasks freed goes back."""
        if self._served:
            self._now()

    def _now(self) -> None:
        if self._trim is not None:
            self._trim(0)
        self._served = 0
