"""state_dict() never raises: every configuration torch accepts gives a state, resumable where
the order can be known (torch's own shuffle, a given generator, an IterableDataset by count);
a DistributedSampler describes the sharding; the loader pickles and deep-copies."""

from __future__ import annotations

import copy
import json
import pickle
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler, IterableDataset, Sampler, TensorDataset

import naiad
from tests.conftest_stream import ids_of, open_numbered, write_numbered


def _ids(batch: Any) -> list[int]:
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    return batch[0].tolist() if isinstance(batch, (list, tuple)) else ids_of(batch).tolist()


def _resumes_exactly(make: Any, k: int, rows: int) -> None:
    """A loader stopped after ``k`` batches and resumed from its state delivers the batches the
    first went on to deliver; the ``rows`` row ids (0 to rows-1) are covered once in all."""
    loader = make()
    it = iter(loader)
    head = [_ids(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [_ids(b) for b in it]
    assert rest, f"nothing left after {k} batches: the resume would compare two empty lists"
    assert sorted(i for batch in head + rest for i in batch) == list(range(rows))
    resumed = make()
    resumed.load_state_dict(state)
    assert [_ids(b) for b in resumed] == rest


def test_torchs_own_shuffle_without_seed_resumes_exactly() -> None:
    ds = TensorDataset(torch.arange(50))
    torch.manual_seed(3)
    _resumes_exactly(lambda: naiad.DataLoader(ds, batch_size=4, shuffle=True), 5, rows=50)


def test_a_given_generator_resumes_exactly_and_is_left_alone() -> None:
    ds = TensorDataset(torch.arange(50))
    g = torch.Generator().manual_seed(11)
    loader = naiad.DataLoader(ds, batch_size=4, shuffle=True, generator=g)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [_ids(b) for b in it]
    other = torch.Generator().manual_seed(99)
    before = other.get_state()
    resumed = naiad.DataLoader(ds, batch_size=4, shuffle=True, generator=other)
    resumed.load_state_dict(state)
    assert [_ids(b) for b in resumed] == rest
    assert not torch.equal(other.get_state(), before)  # torch's base seed came from it, as in torch


def test_a_state_is_under_4_kb_and_a_given_generator_adds_its_state_in_base64() -> None:
    # docs/CHECKPOINTING.md: under 4 KB; torch's shuffle from a given generator adds its state.
    ds = TensorDataset(torch.arange(10_000))
    sizes = {}
    for name, kw in (("seed", {"seed": 3}), ("drawn", {}), ("generator", {"generator": torch.Generator().manual_seed(1)})):
        loader = naiad.DataLoader(ds, batch_size=4, shuffle=True, **kw)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        sizes[name] = len(json.dumps(state))
        del it
    generator_chars = 4 * -(-torch.Generator().get_state().numel() // 3)  # base64 of its bytes
    assert len(state["pipeline"]["order"]["generator_state"]) == generator_chars == 6744  # torch 2.x: 5,056 bytes
    assert sizes["seed"] < 4096 and sizes["drawn"] < 4096
    assert sizes["generator"] - generator_chars < 4096 and 6 << 10 < sizes["generator"] < 8 << 10  # "about 7 KB"


class EveryOther(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(list(range(0, self.n, 2)) + list(range(1, self.n, 2)))

    def __len__(self) -> int:
        return self.n


def test_a_custom_sampler_gives_a_state_that_says_why_and_restarts_its_epoch_with_a_warning() -> None:
    ds = TensorDataset(torch.arange(10))
    loader = naiad.DataLoader(ds, batch_size=2, sampler=EveryOther(10))
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["resumable"] is False and "EveryOther" in state["reason"] and state["batches_yielded"] == 1
    fresh = naiad.DataLoader(ds, batch_size=2, sampler=EveryOther(10))
    with pytest.warns(UserWarning, match="starts that epoch afresh"):
        fresh.load_state_dict(state)
    assert [_ids(b) for b in fresh] == [[0, 2], [4, 6], [8, 1], [3, 5], [7, 9]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at an epoch boundary there is nothing to warn about
        fresh.load_state_dict(fresh.state_dict())


class Counting(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(torch.arange(lo, self.n, step).tolist())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_resumes_by_count(num_workers: int) -> None:
    _resumes_exactly(lambda: naiad.DataLoader(Counting(40), batch_size=3, num_workers=num_workers), 4, rows=40)


def test_an_iterable_dataset_state_names_its_workers() -> None:
    loader = naiad.DataLoader(Counting(40), batch_size=3)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(naiad.StateError, match="'num_workers': stored 0, current 2"):
        naiad.DataLoader(Counting(40), batch_size=3, num_workers=2).load_state_dict(state)


def test_a_distributed_sampler_describes_the_sharding() -> None:
    ds = TensorDataset(torch.arange(23))
    seen, steps = [], []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=4)
        loader = naiad.DataLoader(ds, batch_size=2, sampler=sampler)
        batches = [_ids(b) for b in loader]
        steps.append(len(batches))
        seen += [i for b in batches for i in b]
        assert loader.fetch_strategy == "gather"  # still vectorized
    assert sorted(seen) == list(range(23)) and len(set(steps)) == 1  # no padding, equal steps
    with pytest.raises(naiad.ConfigError, match="disagree with the DistributedSampler"):
        naiad.DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, num_replicas=3, rank=0), rank=1, world_size=3)


def test_a_distributed_sampler_on_a_stream_takes_rank_shuffle_and_seed(tmp_path) -> None:
    paths = write_numbered(str(tmp_path), "parquet", [30, 11])
    seen = []
    for rank in range(2):
        src = open_numbered(paths, "parquet")
        loader = naiad.DataLoader(src, batch_size=4, shuffle=False,
                                  sampler=DistributedSampler(src, num_replicas=2, rank=rank, shuffle=True, seed=2))
        seen += [i for b in loader for i in _ids(b)]
    assert sorted(seen) == list(range(41)) and seen != sorted(seen)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", [{}, {"num_workers": "auto"}, {"num_workers": 2, "persistent_workers": True}])
def test_the_loader_pickles_and_deep_copies_mid_training(kwargs: dict) -> None:
    ds = TensorDataset(torch.arange(12))
    loader = naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=0, **kwargs)
    first = [_ids(b) for b in loader]
    clones = [pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)]
    second = [_ids(b) for b in loader]
    assert second != first
    for clone in clones:
        assert clone.epoch == 1 and [_ids(b) for b in clone] == second
        clone.close()
    loader.close()


def test_the_epoch_set_after_iter_and_before_the_first_batch_is_the_passs() -> None:
    # Lightning calls iter(loader) and then set_epoch on the loader's samplers.
    ds = TensorDataset(torch.arange(30))
    reference = naiad.DataLoader(ds, batch_size=5, shuffle=True, seed=1)
    reference.set_epoch(4)
    epoch4 = [_ids(b) for b in reference]
    for set_epoch in ("loader", "sampler"):
        loader = naiad.DataLoader(ds, batch_size=5, shuffle=True, seed=1)
        it = iter(loader)
        (loader if set_epoch == "loader" else loader.sampler).set_epoch(4)
        assert [_ids(b) for b in it] == epoch4 and loader.epoch == 5
        state = loader.state_dict()
        assert state["epoch"] == 5 and state["batches_yielded"] == 0


def test_an_end_of_epoch_state_resumes_with_the_next_epoch_when_the_epoch_is_set_after_iter(tmp_path) -> None:
    paths = write_numbered(str(tmp_path), "csv", [40])
    make = lambda: naiad.DataLoader(open_numbered(paths, "csv"), batch_size=8, shuffle=True, seed=3)  # noqa: E731
    first = make()
    epoch0 = [_ids(b) for b in first]
    state = first.state_dict()
    epoch1 = [_ids(b) for b in first]
    resumed = make()
    resumed.load_state_dict(state)
    it = iter(resumed)
    resumed.set_epoch(1)
    assert [_ids(b) for b in it] == epoch1 != epoch0


class SkipsSampleThree:
    """An iterator object: after it raises for sample 3, it carries on with sample 4."""

    def __init__(self) -> None:
        self.i = -1

    def __iter__(self):
        return self

    def __next__(self) -> int:
        self.i += 1
        if self.i >= 12:
            raise StopIteration
        if self.i == 3:
            raise ValueError("bad sample 3")
        return self.i


class SkippingDataset(IterableDataset):
    def __iter__(self):
        return SkipsSampleThree()


def test_an_iterable_dataset_resumed_past_a_failed_batch_goes_on_after_it() -> None:
    loader = naiad.DataLoader(SkippingDataset(), batch_size=None)
    it = iter(loader)
    seen = []
    while len(seen) < 5:
        try:
            seen.append(int(next(it)))
        except ValueError:
            pass  # the training loop skips the bad batch, as with torch
    state = loader.state_dict()
    rest = [int(b) for b in it]
    resumed = naiad.DataLoader(SkippingDataset(), batch_size=None)
    resumed.load_state_dict(state)
    assert [int(b) for b in resumed] == rest == list(range(6, 12)) and seen == [0, 1, 2, 4, 5]
