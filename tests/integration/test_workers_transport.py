"""Batches cross from worker processes exactly: small ones inline, large ones via shared memory."""

from __future__ import annotations

import collections
import os
import time
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from naiad.parallel import WorkerContext, WorkerPool
from naiad.parallel.transport import SHM_MIN_BYTES, _InlineTensor, _SharedArray, pack
from tests.helpers import assert_same_batch, shm_entries

pytestmark = pytest.mark.timeout(60)

Pair = collections.namedtuple("Pair", "x y")
BIG = SHM_MIN_BYTES // 8 + 1  # float64 elements: just over the threshold


def batch(k: int) -> Any:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + k
    return {
        "f16": torch.full((3, 2), k, dtype=torch.float16),
        "bf16": torch.full((5,), k, dtype=torch.bfloat16),
        "bool": torch.arange(6) % 2 == k % 2,
        "complex": torch.full((2,), complex(k, -k), dtype=torch.complex64),
        "strided": base.t(),  # non-contiguous
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(k),
        "np": np.arange(10, dtype=np.int16) * k,
        "pair": Pair(torch.ones(2) * k, np.zeros(3)),
        "tags": [f"row{i}" for i in range(300)],  # a long list: pickled as it is
        "big_t": torch.full((BIG,), float(k), dtype=torch.float64),
        "big_np": np.full(BIG, k, np.float64),
        "nested": [(torch.ones(1) * k, {"z": np.ones(2, np.float32)})],
    }


def batch_factory(context: WorkerContext) -> Any:
    return batch


def test_pack_sends_small_inline_and_large_through_shared_memory() -> None:
    packed = pack(batch(1))
    assert isinstance(packed["f16"], _InlineTensor) and isinstance(packed["pair"].x, _InlineTensor)
    assert isinstance(packed["big_np"], _SharedArray) and type(packed["big_t"]) is torch.Tensor
    assert type(packed["np"]) is np.ndarray and type(packed["tags"]) is list
    assert type(packed["scalar"]) is torch.Tensor  # 0-d: left to torch


def test_every_kind_of_batch_arrives_exactly_and_leaves_no_segment() -> None:
    shm = shm_entries()
    with WorkerPool(batch_factory, num_workers=2) as pool:
        for k, got in enumerate(pool.imap(range(6))):
            assert_same_batch(batch(k), got)
            assert got["f16"].dtype == torch.float16 and isinstance(got["pair"], Pair)
            got["np"][0] = 1  # arrays that arrive are writable
            got["f16"][0, 0] = 1
    assert shm_entries() <= shm


def _varying_blocks_factory(context: WorkerContext) -> Any:
    def handle(k: int) -> Any:
        # Blocks of megabytes and varying sizes, allocated and freed per task (NumPy's and
        # torch's), as a decode's pixels and a read's arrays are; the result crosses through
        # shared memory.
        arr = np.random.default_rng(k).integers(0, 255, (6 << 20) + (k % 7) * 100_000, dtype=np.uint8)
        scratch = torch.empty(arr.shape, dtype=torch.uint8)
        scratch.copy_(torch.from_numpy(arr))
        return {"pixels": np.array(scratch.numpy()), "pid": np.full(1, os.getpid())}

    return handle


def test_a_worker_freeing_big_blocks_of_varying_sizes_stays_flat() -> None:
    # NOTE [ Worker heap ]: with glibc's moving mmap threshold such a worker once grew by tens of
    # megabytes over these tasks although it kept nothing; now blocks up to 32 MiB are kept for
    # reuse, and the heap is trimmed: what it holds has no trend.
    with WorkerPool(_varying_blocks_factory, num_workers=1) as pool:
        uss = []
        for k, got in enumerate(pool.imap(range(120))):
            assert len(got["pixels"]) == (6 << 20) + (k % 7) * 100_000
            if k >= 14 and k % 5 == 4:
                uss.append(psutil.Process(int(got["pid"][0])).memory_full_info().uss)
    half = len(uss) // 2
    early, late = float(np.median(uss[:half])), float(np.median(uss[half:]))
    assert late - early < 8 << 20, f"the worker grew from {early / 2**20:.0f} to {late / 2**20:.0f} MiB (medians)"
    assert max(uss) < 160 << 20, f"the worker held {max(uss) >> 20} MiB for 6-7 MiB blocks"


_PINNED: list[np.ndarray] = []


def _scattered_heap_factory(context: WorkerContext) -> Any:
    def handle(k: int) -> Any:
        # 200 blocks of 1 MiB from the heap (under the fixed threshold), freed at the task's end,
        # and a block allocated after them kept: it pins the heap's top, so only a trim of the
        # heap's inside gives their pages back.
        blocks = [np.ones(1 << 20, np.uint8) for _ in range(200)]
        _PINNED.append(np.ones(64 << 10, np.uint8))
        del blocks
        return np.full(1, os.getpid())

    return handle


def test_an_idle_worker_gives_its_free_heap_back() -> None:
    with WorkerPool(_scattered_heap_factory, num_workers=1) as pool:
        pid = int(next(iter(pool.imap(range(1))))[0])
        proc = psutil.Process(pid)
        # The worker trims after waiting half a second with nothing to do (NOTE [ Worker heap ]).
        deadline = time.monotonic() + 10
        while proc.memory_full_info().uss > 120 << 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.memory_full_info().uss < 120 << 20, "the idle worker kept its 200 MiB of freed heap"
