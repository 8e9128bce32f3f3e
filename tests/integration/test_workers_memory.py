"""columnar(): a list of samples laid out as arrays, shared by forked workers without copies."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader

import naiad
from naiad.dataset.worker import columnar
from tests.helpers import assert_same_batches

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "samples",
    [
        [(i, i * 0.5, i % 3 == 0) for i in range(50)],
        [{"x": np.full(3, i, np.float32), "y": i} for i in range(50)],
        [torch.full((2, 2), float(i)) for i in range(50)],
    ],
    ids=["tuples", "dicts", "tensors"],
)
def test_batches_equal_those_torch_builds_from_the_samples(samples: list) -> None:
    expected = list(TorchDataLoader(samples, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0)))
    ds = columnar(samples)
    got = list(naiad.DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert naiad.DataLoader(ds, batch_size=8).fetch_strategy == "gather"
    assert_same_batches(expected, got)


def test_text_and_ragged_samples_are_config_errors() -> None:
    with pytest.raises(naiad.ConfigError, match="field 1 holds str"):
        columnar([(1, "a"), (2, "b")])
    with pytest.raises(naiad.ConfigError, match="2 fields"):
        columnar([(1, 2), (3,)])
    with pytest.raises(naiad.ConfigError, match="empty"):
        columnar([])


def test_forked_workers_read_columns_without_copying_them() -> None:
    def worker_uss(n: int) -> list[int]:
        ds = naiad.ArrayDataset(np.arange(n, dtype=np.int64), np.ones(n), np.zeros(n))
        loader = naiad.DataLoader(ds, batch_size=4096, shuffle=True, num_workers=2, persistent_workers=True)
        rows = sum(len(b[0]) for b in loader)
        assert rows == n
        own = [psutil.Process(p).memory_full_info().uss for p in loader._pools.kept.worker_pids]  # type: ignore[union-attr]
        loader.close()
        return own

    # What a forked worker owns anyway (the pages of the parent it touches: more after a long
    # test session), against a run over 3 columns of 40 MB in all: each worker gathered half
    # the rows from every page of every column, yet owns little more.
    base = max(worker_uss(8192))
    own = worker_uss(2_000_000)
    assert max(own) - base < 40e6 / 2, f"worker-private memory {[f'{u / 1e6:.0f} MB' for u in own]}, {base / 1e6:.0f} MB without the data"
