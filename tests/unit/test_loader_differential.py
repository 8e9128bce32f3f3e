"""naiad.DataLoader against torch's DataLoader: the same batches for the same configuration."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, Subset, TensorDataset

import naiad
from tests.helpers import assert_same_batches

Point = collections.namedtuple("Point", ["x", "label"])


class DictDataset(Dataset):
    """Samples are dicts mixing arrays, NumPy scalars, Python numbers and strings."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(n)
        self.x = rng.standard_normal((n, 3)).astype(np.float32)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "x": self.x[i],
            "np_scalar": np.float64(i) / 3,
            "int": i,
            "float": i * 0.5,
            "bool": i % 2 == 0,
            "name": f"row{i}",
            "nested": {"pair": (torch.tensor([i, i + 1]), [i, -i])},
        }


class NamedTupleDataset(Dataset):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> Point:
        return Point(torch.full((2,), float(i)), i % 3)


class GetItemsDataset(Dataset):
    """Has torch's batched protocol: __getitems__ returns a list of samples."""

    def __init__(self, n: int) -> None:
        self.data = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)
        self.calls = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.data[i], i

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        self.calls += 1
        return [(self.data[i], i) for i in indices]


class ShardedIterable(IterableDataset):
    """An IterableDataset that shards itself across workers, as torch's docs show."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield {"i": i, "x": np.full(2, i, dtype=np.int32)}


def make_datasets() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 4, generator=g)
    y = torch.randint(0, 5, (37,), generator=g)
    return {
        "tensor_dataset": TensorDataset(x, y),
        "tensor": x,
        "ndarray_2d_f64": np.random.default_rng(1).standard_normal((41, 3)),
        "ndarray_1d_f32": np.arange(29, dtype=np.float32),
        "ndarray_1d_i64": np.arange(29, dtype=np.int64) * 7,
        "ndarray_bool": np.arange(13) % 3 == 0,
        "array_dataset": naiad.ArrayDataset(np.ones((19, 2), np.float32), np.arange(19)),
        "array_dataset_dict": naiad.ArrayDataset({"x": torch.randn(19, 2, generator=g), "y": np.arange(19)}),
        "subset": Subset(TensorDataset(x, y), [5, 3, 1, 30, 2, 7, 8, 9, 11, 12, 0]),
        "dict_samples": DictDataset(31),
        "namedtuple_samples": NamedTupleDataset(),
        "getitems": GetItemsDataset(26),
        "list": [float(i) for i in range(17)],
    }


DATASETS = make_datasets()


def both(dataset: Any, seed: int = 0, **kwargs: Any) -> tuple[list[Any], list[Any], int, int]:
    """Iterate torch's and naiad's loaders from the same global RNG state."""
    torch.manual_seed(seed)
    tl = TorchDataLoader(dataset, **kwargs)
    expected = list(tl)
    torch.manual_seed(seed)
    nl = naiad.DataLoader(dataset, **kwargs)
    got = list(nl)
    if isinstance(dataset, IterableDataset) and not hasattr(dataset, "__len__"):
        return expected, got, -1, -1
    return expected, got, len(tl), len(nl)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(DATASETS)),
    batch_size=st.sampled_from([1, 2, 5, 8, 64, None]),
    drop_last=st.booleans(),
    shuffle=st.sampled_from(["no", "global", "generator"]),
    seed=st.integers(0, 2**31),
)
def test_same_batches_as_torch(name: str, batch_size: int | None, drop_last: bool, shuffle: str, seed: int) -> None:
    if batch_size is None and drop_last:
        drop_last = False  # torch forbids the pair
    kwargs: dict[str, Any] = {"batch_size": batch_size, "drop_last": drop_last}
    if shuffle != "no":
        kwargs["shuffle"] = True
    if shuffle == "generator":
        kwargs["generator"] = torch.Generator().manual_seed(seed)
        # Each loader needs its own generator in the same state.
        torch.manual_seed(seed)
        expected = list(TorchDataLoader(DATASETS[name], **kwargs))
        kwargs["generator"] = torch.Generator().manual_seed(seed)
        got = list(naiad.DataLoader(DATASETS[name], **kwargs))
        assert_same_batches(expected, got)
        return
    expected, got, tlen, nlen = both(DATASETS[name], seed, **kwargs)
    assert tlen == nlen
    assert_same_batches(expected, got)


@pytest.mark.parametrize("name", ["tensor_dataset", "dict_samples", "getitems", "namedtuple_samples"])
def test_custom_sampler_and_batch_sampler(name: str) -> None:
    ds = DATASETS[name]
    order = list(range(len(ds)))[::-1]
    expected, got, tlen, nlen = both(ds, batch_size=4, sampler=order)
    assert tlen == nlen
    assert_same_batches(expected, got)
    batches = [[0, 2], [1], [5, 4, 3], [len(ds) - 1]]
    expected, got, tlen, nlen = both(ds, batch_sampler=batches)
    assert tlen == nlen == 4
    assert_same_batches(expected, got)


def test_weighted_and_subset_random_samplers_match_torch() -> None:
    ds = DATASETS["tensor_dataset"]
    for make in (
        lambda: torch.utils.data.WeightedRandomSampler(torch.rand(len(ds), generator=torch.Generator().manual_seed(3)), 50),
        lambda: torch.utils.data.SubsetRandomSampler(list(range(0, len(ds), 2))),
        lambda: torch.utils.data.RandomSampler(ds, replacement=True, num_samples=40),
        lambda: torch.utils.data.RandomSampler(ds, num_samples=90),
    ):
        torch.manual_seed(5)
        expected = list(TorchDataLoader(ds, batch_size=8, sampler=make()))
        torch.manual_seed(5)
        got = list(naiad.DataLoader(ds, batch_size=8, sampler=make()))
        assert_same_batches(expected, got)


def test_custom_collate_fn_is_called_with_samples() -> None:
    ds = DATASETS["dict_samples"]

    def collate(samples: list[dict[str, Any]]) -> tuple[list[str], int]:
        return [s["name"] for s in samples], len(samples)

    expected, got, _, _ = both(ds, batch_size=6, collate_fn=collate)
    assert_same_batches(expected, got)
    # A custom collate_fn over a gatherable dataset must see samples, not a gathered batch.
    expected, got, _, _ = both(DATASETS["tensor_dataset"], batch_size=6, collate_fn=lambda s: len(s))
    assert expected == got


def test_default_collate_passed_explicitly_still_gathers() -> None:
    from torch.utils.data import default_collate

    loader = naiad.DataLoader(DATASETS["tensor_dataset"], batch_size=4, collate_fn=default_collate)
    assert loader.fetch_strategy == "gather"
    expected, got, _, _ = both(DATASETS["tensor_dataset"], batch_size=4, collate_fn=default_collate)
    assert_same_batches(expected, got)


@pytest.mark.parametrize(
    "name, strategy",
    [
        ("tensor_dataset", "gather"),
        ("tensor", "gather"),
        ("ndarray_2d_f64", "gather"),
        ("array_dataset", "gather"),
        ("subset", "gather"),
        ("getitems", "getitems"),
        ("dict_samples", "items"),
        ("list", "items"),
    ],
)
def test_fetch_strategy_is_batch_at_a_time_where_possible(name: str, strategy: str) -> None:
    assert naiad.DataLoader(DATASETS[name], batch_size=4).fetch_strategy == strategy


def test_getitems_called_once_per_batch() -> None:
    ds = GetItemsDataset(26)
    batches = list(naiad.DataLoader(ds, batch_size=5))
    assert len(batches) == 6 and ds.calls == 6


@pytest.mark.parametrize("batch_size, drop_last", [(4, False), (4, True), (None, False), (100, False)])
def test_iterable_dataset_single_process(batch_size: int | None, drop_last: bool) -> None:
    expected, got, tlen, nlen = both(ShardedIterable(18), batch_size=batch_size, drop_last=drop_last)
    assert_same_batches(expected, got)


def test_torch_argument_errors_are_torch_errors() -> None:
    ds = DATASETS["tensor_dataset"]
    bad = [
        dict(sampler=[0, 1], shuffle=True),
        dict(batch_sampler=[[0]], batch_size=2),
        dict(batch_size=None, drop_last=True),
        dict(num_workers=-1),
        dict(timeout=-1),
        dict(prefetch_factor=2),
        dict(persistent_workers=True),
    ]
    for kwargs in bad:
        with pytest.raises(ValueError) as t_err:
            TorchDataLoader(ds, **kwargs)
        with pytest.raises(ValueError) as n_err:
            naiad.DataLoader(ds, **kwargs)
        assert str(n_err.value) == str(t_err.value)
    with pytest.raises(ValueError, match="shuffle"):
        naiad.DataLoader(ShardedIterable(3), shuffle=True)


def test_is_a_torch_dataloader_with_torch_attributes() -> None:
    ds = DATASETS["tensor_dataset"]
    loader = naiad.DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)
    assert isinstance(loader, TorchDataLoader)
    assert loader.batch_size == 8 and loader.drop_last and loader.num_workers == 0
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    assert len(loader) == len(ds) // 8
    with pytest.raises(ValueError):
        loader.batch_size = 4  # torch forbids it after construction, so do we
