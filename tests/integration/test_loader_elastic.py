"""Elastic resume through naiad.DataLoader: a state saved on W1 ranks with batch size B1 (and any
worker count) loads on W2 ranks with B2; the rest of the epoch delivers every index (row) that no
old rank delivered exactly once, with equal batch counts, and the next epoch is an ordinary one."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

import naiad
from tests.conftest_stream import ids_of, open_numbered, write_numbered

MakeLoader = Callable[[int, int, int, int], naiad.DataLoader]  # (rank, world_size, batch_size, num_workers)


def _ids(batch: Any) -> list[int]:
    if isinstance(batch, dict):
        return ids_of(batch).tolist()
    return batch[0].tolist()


def _first_leg(make: MakeLoader, world_size: int, batch_size: int, workers: int, stop: int, epoch: int):
    """Every rank delivers ``stop`` batches of ``epoch`` then breaks; rank 0's JSON state."""
    seen: list[int] = []
    state = None
    for rank in range(world_size):
        loader = make(rank, world_size, batch_size, workers)
        loader.set_epoch(epoch)
        it = iter(loader)
        for _ in range(stop):  # a training loop that checkpoints after `stop` steps
            batch = next(it, None)
            if batch is None:
                break
            seen += _ids(batch)
        if rank == 0:
            state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    return seen, state


def _second_leg(make: MakeLoader, world_size: int, batch_size: int, workers: int, state: dict):
    seen, counts, next_epoch = [], [], []
    for rank in range(world_size):
        loader = make(rank, world_size, batch_size, workers)
        loader.load_state_dict(state)
        batches = [_ids(b) for b in loader]
        counts.append(len(batches))
        seen += [i for b in batches for i in b]
        next_epoch.append([_ids(b) for b in loader])  # the epoch after: an ordinary one
        loader.close()
    return seen, counts, next_epoch


def _map_loader(n: int, shuffle: bool) -> MakeLoader:
    ds = TensorDataset(torch.arange(n))

    def make(rank: int, world_size: int, batch_size: int, workers: int) -> naiad.DataLoader:
        return naiad.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, seed=3 if shuffle else None,
                                rank=rank, world_size=world_size, num_workers=workers, worker_mode="thread")
    return make


@pytest.mark.timeout(240)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(0, 120), shuffle=st.booleans(),
    w1=st.integers(1, 4), b1=st.integers(1, 9), k1=st.integers(0, 12), n1=st.sampled_from([0, 2]),
    w2=st.integers(1, 4), b2=st.integers(1, 9), n2=st.sampled_from([0, 2]),
)
def test_map_style_elastic_resume_delivers_each_remaining_index_once(n, shuffle, w1, b1, k1, n1, w2, b2, n2):
    make = _map_loader(n, shuffle)
    first, state = _first_leg(make, w1, b1, n1, k1, epoch=2)
    if state["epoch"] == 3:  # the first leg finished the epoch: the state is the next one's start
        assert sorted(first) == list(range(n)) and state["batches_yielded"] == 0
        return
    rest, counts, next_epoch = _second_leg(make, w2, b2, n2, state)
    assert sorted(first + rest) == list(range(n))
    assert len(set(counts)) == 1
    ordinary = [[_ids(b) for b in _set(make(r, w2, b2, 0), 3)] for r in range(w2)]
    assert next_epoch == ordinary


def _set(loader: naiad.DataLoader, epoch: int) -> naiad.DataLoader:
    loader.set_epoch(epoch)
    return loader


@pytest.mark.timeout(240)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(["csv", "parquet", "npy", "jsonl"]), sizes=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    w1=st.integers(1, 3), b1=st.integers(1, 8), k1=st.integers(0, 8), buf1=st.integers(1, 30),
    w2=st.integers(1, 3), b2=st.integers(1, 8), buf2=st.integers(1, 30), workers=st.sampled_from([0, 2]),
)
def test_stream_elastic_resume_through_the_loader(fmt, sizes, w1, b1, k1, buf1, w2, b2, buf2, workers):
    with tempfile.TemporaryDirectory() as d:
        paths = write_numbered(d, fmt, sizes)

        def make_with(buffer: int) -> MakeLoader:
            def make(rank: int, world_size: int, batch_size: int, num_workers: int) -> naiad.DataLoader:
                return naiad.DataLoader(open_numbered(paths, fmt), batch_size=batch_size, shuffle=True, seed=8,
                                        shuffle_buffer=buffer, rank=rank, world_size=world_size,
                                        num_workers=num_workers)
            return make

        first, state = _first_leg(make_with(buf1), w1, b1, workers, k1, epoch=1)
        if state["epoch"] == 2:  # the first leg finished the epoch
            assert sorted(first) == list(range(sum(sizes)))
            return
        rest, counts, _ = _second_leg(make_with(buf2), w2, b2, 0, state)
        assert sorted(first + rest) == list(range(sum(sizes)))
        assert len(set(counts)) == 1


def test_state_of_a_resumed_elastic_epoch_resumes_again(tmp_path):
    # 2 ranks -> 3 ranks (checkpoint again mid-leg) -> 1 rank: still every row once.
    paths = write_numbered(str(tmp_path), "parquet", [70, 33])

    def make(rank: int, world_size: int, batch_size: int, workers: int) -> naiad.DataLoader:
        return naiad.DataLoader(open_numbered(paths, "parquet"), batch_size=batch_size, shuffle=True, seed=1,
                                shuffle_buffer=12, rank=rank, world_size=world_size)

    first, state = _first_leg(make, 2, 5, 0, 4, epoch=0)
    second: list[int] = []
    for rank in range(3):
        loader = make(rank, 3, 4, 0)
        loader.load_state_dict(state)
        it = iter(loader)
        for _ in range(3):
            second += _ids(next(it))
        if rank == 0:
            state2 = json.loads(json.dumps(loader.state_dict()))
    assert len(state2["pipeline"]["plan"]["legs"]) == 1 and len(json.dumps(state2)) < 4096
    rest, _, _ = _second_leg(make, 1, 7, 0, state2)
    assert sorted(first + second + rest) == list(range(103))
    assert np.unique(first + second + rest).size == 103
