"""naiad.DataLoader on a CUDA device: device=, pin_memory=, and streaming sources to the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import TensorDataset

import naiad

pytestmark = pytest.mark.timeout(120)


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(1000, 8, generator=g), torch.randint(0, 2, (1000,), generator=g))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_cuda_yields_the_cpu_batches_on_the_gpu(num_workers: int) -> None:
    ds = _dataset()
    cpu = list(naiad.DataLoader(ds, batch_size=64, shuffle=True, seed=1))
    gpu = list(naiad.DataLoader(ds, batch_size=64, shuffle=True, seed=1, device="cuda", num_workers=num_workers))
    assert len(cpu) == len(gpu)
    for (x, y), (gx, gy) in zip(cpu, gpu, strict=True):
        assert gx.is_cuda and gy.is_cuda
        # Read on the current stream right away: the loader made it wait for the copy.
        assert torch.equal(gx.cpu(), x) and torch.equal(gy.cpu(), y)


def test_pin_memory_pins_like_torch() -> None:
    ds = _dataset()
    for batch in naiad.DataLoader(ds, batch_size=100, pin_memory=True, num_workers=2):
        assert all(t.is_pinned() for t in batch)
    expected = list(TorchDataLoader(ds, batch_size=100, pin_memory=True))
    got = list(naiad.DataLoader(ds, batch_size=100, pin_memory=True))
    assert all(torch.equal(a, b) for e, g in zip(expected, got, strict=True) for a, b in zip(e, g, strict=True))


def test_streaming_source_to_cuda(tmp_path) -> None:  # type: ignore[no-untyped-def]
    np.save(tmp_path / "x.npy", np.arange(5000 * 4, dtype=np.float32).reshape(5000, 4))
    loader = naiad.DataLoader(naiad.read_npy(str(tmp_path / "x.npy")), batch_size=256, shuffle=True, device="cuda")
    rows = torch.cat([b["x"] for b in loader])
    assert rows.is_cuda and rows.shape == (5000, 4)
    assert sorted(rows[:, 0].cpu().tolist()) == [4.0 * i for i in range(5000)]
    assert loader.stats().stages["transfer"].count == len(loader)
