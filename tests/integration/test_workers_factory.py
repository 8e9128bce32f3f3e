"""WorkerLocal: only a recipe crosses the process boundary; each worker builds its own dataset."""

from __future__ import annotations

import functools
import os
import pickle
import threading

import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, TensorDataset

import naiad
from naiad.dataset.worker import WorkerLocal
from tests.helpers import assert_same_batches

pytestmark = pytest.mark.timeout(60)


class Recorded(Dataset):
    """Remembers which process and thread built it, and whether it was ever pickled."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.built_in = (os.getpid(), threading.get_ident())
        info = torch.utils.data.get_worker_info()
        self.worker = None if info is None else info.id

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        return i, self.built_in[0], -1 if self.worker is None else self.worker

    def __reduce__(self) -> tuple:
        raise TypeError("a built dataset must never be pickled")


def table(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(n)
    return TensorDataset(torch.randn(n, 3, generator=g), torch.arange(n))


def test_each_worker_process_builds_its_own_and_nothing_built_is_pickled() -> None:
    # (Under spawn and forkserver the wrapper is pickled: test_pickling_carries_only_the_recipe.)
    ds = WorkerLocal(functools.partial(Recorded, 40), length=40)
    batches = list(naiad.DataLoader(ds, batch_size=5, num_workers=2))
    rows = torch.cat([torch.stack(b, 1) for b in batches])
    assert rows[:, 0].tolist() == list(range(40))
    builders = {int(p) for p in rows[:, 1]}
    assert len(builders) == 2 and os.getpid() not in builders
    assert sorted({int(w) for w in rows[:, 2]}) == [0, 1]  # get_worker_info() answered in the factory
    assert ds._local.peek() is None  # the training process never built one


def test_threads_build_one_each_and_inline_builds_once() -> None:
    built: list[int] = []
    counting = WorkerLocal(lambda: built.append(threading.get_ident()) or Recorded(40), length=40)
    list(naiad.DataLoader(counting, batch_size=5, num_workers=2, worker_mode="thread"))
    threads = set(built)
    assert len(built) == 2 and len(threads) == 2
    built.clear()
    inline = naiad.DataLoader(counting, batch_size=5)
    list(inline), list(inline)
    assert len(built) == 1  # the training process keeps its instance across epochs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_those_of_the_built_dataset_gathered(num_workers: int) -> None:
    ds = WorkerLocal(functools.partial(table, 100), length=100)
    expected = list(TorchDataLoader(table(100), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)))
    got = list(
        naiad.DataLoader(ds, batch_size=16, shuffle=True, num_workers=num_workers, generator=torch.Generator().manual_seed(1))
    )
    assert_same_batches(expected, got)


def test_torch_dataloader_accepts_worker_local_too() -> None:
    ds = WorkerLocal(functools.partial(table, 30), length=30)
    assert_same_batches(list(TorchDataLoader(table(30), batch_size=8)), list(TorchDataLoader(ds, batch_size=8, num_workers=2)))


def test_pickling_carries_only_the_recipe() -> None:
    ds = WorkerLocal(functools.partial(table, 10), length=10)
    ds[0]  # builds here
    assert isinstance(ds._local.peek(), TensorDataset)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._local.peek() is None and len(clone) == 10 and torch.equal(clone[3][0], ds[3][0])


def test_length_mismatch_and_bad_arguments_are_config_errors() -> None:
    with pytest.raises(naiad.ConfigError, match="pass length=10"):
        WorkerLocal(functools.partial(table, 10), length=12)[0]
    with pytest.raises(naiad.ConfigError, match="callable"):
        WorkerLocal("not a factory", length=3)  # type: ignore[arg-type]
    with pytest.raises(naiad.ConfigError, match="length"):
        WorkerLocal(functools.partial(table, 10), length=-1)
