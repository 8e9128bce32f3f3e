"""AutoTuner driving a real WorkerPool: cheap batches stay inline, CPU-heavy ones get workers."""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from naiad.dataset.sampling import plan_batches
from naiad.dataset.worker import map_handler_factory
from naiad.parallel import AutoTuner, WorkerPool
from tests.helpers import child_pids

pytestmark = pytest.mark.timeout(60)


class Heavy(Dataset):
    """About 200 µs of NumPy work per row, like a per-sample augmentation."""

    def __init__(self, n: int) -> None:
        self.x = np.random.default_rng(0).random((n, 64))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        row = self.x[i]
        for _ in range(20):
            row = np.sqrt(np.abs(np.fft.rfft(row, 64)[:64].real.repeat(2)[:64]) + 1.0)
        return torch.from_numpy(row)


def tune(dataset: Any, strategy: str, batch_size: int, step_s: float, epochs: int = 3) -> tuple[AutoTuner, list[Any]]:
    tuner = AutoTuner(max_workers=2, min_steps=8, min_window_s=0.1)
    factory = functools.partial(map_handler_factory, dataset, default_collate, True, strategy)
    pool = WorkerPool(factory, num_workers=0, init_inline=False)  # type: ignore[arg-type]
    out = []
    sampler = torch.utils.data.BatchSampler(range(len(dataset)), batch_size, False)
    try:
        for epoch in range(epochs):
            batches = []
            for b in tuner.drive(pool, pool.imap(enumerate(plan_batches(sampler, None, True)), epoch=epoch)):
                batches.append(b)
                if step_s:
                    time.sleep(step_s)  # the training step: the accelerator works, the CPU is free
            out.append(batches)
            if tuner.settled:
                break
    finally:
        pool.close()
    return tuner, out


def test_in_memory_tensors_settle_on_no_workers() -> None:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(20_000, 8, generator=g), torch.randint(0, 2, (20_000, 1), generator=g))
    before = child_pids()
    tuner, epochs = tune(ds, "gather", 32, step_s=0.0)
    d = tuner.decision
    assert d.settled and d.num_workers == 0, tuner.stats()
    assert "0 workers" in d.reason and child_pids() == before
    assert torch.equal(torch.cat([b[0] for b in epochs[0]]), ds.tensors[0])


def test_cpu_heavy_rows_get_workers_and_batches_stay_in_order() -> None:
    ds = Heavy(4000)
    tuner, epochs = tune(ds, "items", 16, step_s=0.004)
    d = tuner.decision
    assert d.settled and d.num_workers >= 1, tuner.stats()
    assert "workers" in d.reason and len(tuner.stats()["trials"]) >= 2
    # Ordered delivery stayed exact while the pool was resized under it.
    got = torch.cat(epochs[0])
    assert got.shape == (len(ds), 64)
    for i in (0, 1, 777, len(ds) - 1):
        assert torch.equal(got[i], ds[i])
