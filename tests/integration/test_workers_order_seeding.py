"""Delivery order and per-worker randomness, whatever the worker count and mode."""

from __future__ import annotations

import functools
import random
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, default_collate

import naiad
from naiad.dataset.worker import map_handler_factory
from naiad.parallel import WorkerPool, worker_rng
from naiad.parallel.context import epoch_seed_sequence
from tests.helpers import assert_same_batches

pytestmark = pytest.mark.timeout(60)


class UnevenDataset(Dataset):
    """The first rows are slow, so later batches finish first on other workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i < 4:
            time.sleep(0.03)
        return {"i": i, "x": np.full(2, i, np.float32)}


class Draws(Dataset):
    """Each sample is the row index and one draw from every generator a user might use."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, random.random(), float(np.random.rand()), float(torch.rand(()))], dtype=torch.float64)


class RngDraws(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, worker_rng().random()], dtype=torch.float64)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_in_order_batches_are_the_plan_order_for_any_worker_count(mode: str) -> None:
    ds = UnevenDataset(64)
    serial = list(naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=3))
    for workers in (1, 3):
        got = list(naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=workers, worker_mode=mode))
        assert_same_batches(serial, got)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_out_of_order_yields_as_completed_and_yields_everything(mode: str) -> None:
    ds = UnevenDataset(64)
    loader = naiad.DataLoader(ds, batch_size=4, num_workers=2, worker_mode=mode, in_order=False)
    got = [b["i"].tolist() for b in loader]
    assert sorted(sum(got, [])) == list(range(64))
    # Batch 0 (slow rows) is overtaken by the fast ones on the other worker.
    assert got[0] != [0, 1, 2, 3]


def _pool(mode: str = "process", workers: int = 2, seed: int = 7, dataset: Any = None) -> WorkerPool:
    factory = functools.partial(map_handler_factory, dataset or Draws(), default_collate, True, "items")
    return WorkerPool(factory, num_workers=workers, mode=mode, base_seed=seed)  # type: ignore[arg-type]


def _epoch(pool: WorkerPool, epoch: int) -> torch.Tensor:
    tasks = [(b, list(range(4 * b, 4 * b + 4))) for b in range(8)]
    return torch.cat(list(pool.imap(tasks, epoch=epoch)))


def test_process_workers_reseed_globals_per_worker_and_epoch_and_repeat_between_runs() -> None:
    with _pool() as pool:
        e0, e1 = _epoch(pool, 0), _epoch(pool, 1)
    with _pool() as pool:
        again = _epoch(pool, 1), _epoch(pool, 0)
    assert torch.equal(e1, again[0]) and torch.equal(e0, again[1])  # repeat, in any order of epochs
    for col in (1, 2, 3):  # random, numpy, torch
        draws = e0[:, col]
        # Batches alternate between workers: worker 0 has batches 0, 2, ...; worker 1 has 1, 3, ...
        w0, w1 = draws.view(8, 4)[0::2], draws.view(8, 4)[1::2]
        assert not torch.equal(w0, w1), "workers drew the same numbers"
        assert not torch.equal(e0[:, col], e1[:, col]), "epochs drew the same numbers"
    # A different seed, different draws.
    with _pool(seed=8) as pool:
        assert not torch.equal(_epoch(pool, 0)[:, 1:], e0[:, 1:])


def test_process_worker_numpy_draws_follow_the_seed_sequence() -> None:
    # Worker 1's first draw in epoch 3 is the first draw of the documented sequence.
    with _pool() as pool:
        first = _epoch(pool, 3)[4]  # batch 1 -> worker 1, its first sample
    ss = epoch_seed_sequence(7, 3, 0, 1)
    npy = np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 1))
    expected = np.random.RandomState(npy.generate_state(4, np.uint32)).rand()
    assert float(first[2]) == expected


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_worker_rng_is_per_worker_per_epoch_and_goes_on_within_an_epoch(mode: str) -> None:
    with _pool(mode, dataset=RngDraws()) as pool:
        e0, e1 = _epoch(pool, 0)[:, 1], _epoch(pool, 1)[:, 1]
    w0 = e0.view(8, 4)[0::2].reshape(-1)
    expected = np.random.default_rng(np.random.SeedSequence([7, 0, 0, 0])).random(16)
    assert np.array_equal(w0.numpy(), expected)  # worker 0, epoch 0, draws in order
    assert len(set(e0.tolist())) == 32 and not torch.equal(e0, e1)


def test_thread_workers_leave_the_training_loops_generators_alone() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), float(torch.rand(())))
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    with _pool("thread", dataset=RngDraws()) as pool:
        _epoch(pool, 0)
        _epoch(pool, 1)
    assert (random.random(), np.random.rand(), float(torch.rand(()))) == expected


def test_inline_worker_rng_continues_across_batches() -> None:
    with _pool(workers=0, dataset=RngDraws()) as pool:
        e0 = _epoch(pool, 0)[:, 1]
    assert len(set(e0.tolist())) == 32
    expected = np.random.default_rng(np.random.SeedSequence([7, 0, 0, 0])).random(32)
    assert np.array_equal(e0.numpy(), expected)


def test_loader_persistent_workers_draw_differently_each_epoch_and_repeat_between_runs() -> None:
    def two_epochs() -> list[torch.Tensor]:
        loader = naiad.DataLoader(Draws(), batch_size=4, num_workers=2, seed=5, persistent_workers=True)
        out = [torch.cat(list(loader)) for _ in range(2)]
        loader.close()
        return out

    a, b = two_epochs(), two_epochs()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0][:, 1:], a[1][:, 1:])


def test_loader_workers_draw_differently_each_epoch_without_persistent_workers() -> None:
    loader = naiad.DataLoader(Draws(), batch_size=4, num_workers=2, seed=5)
    e0, e1 = torch.cat(list(loader)), torch.cat(list(loader))
    assert not torch.equal(e0[:, 1:], e1[:, 1:])
    again = naiad.DataLoader(Draws(), batch_size=4, num_workers=2, seed=5)
    assert torch.equal(e0, torch.cat(list(again)))  # and repeat between runs


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_the_same_epoch_twice_draws_the_same_numbers_twice(mode: str) -> None:
    dataset = Draws() if mode == "process" else RngDraws()
    with _pool(mode, dataset=dataset) as pool:
        first, other, again = _epoch(pool, 4), _epoch(pool, 5), _epoch(pool, 4)
    assert torch.equal(first, again) and not torch.equal(first, other)
