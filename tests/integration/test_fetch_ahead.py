"""Loops that fetch ahead (docs/CHECKPOINTING.md, "Loops that fetch ahead"): a loop that asks for
the next batch before the step on this one ends saves ``state_dict(pending=k)``, and the resumed
run trains on exactly the batches the uninterrupted run would have."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

import naiad
from naiad.errors import ConfigError
from tests.conftest_stream import open_numbered, write_numbered

pytestmark = pytest.mark.timeout(180)

STEPS_BEFORE = 7  # the checkpoint is taken after this many training steps


def _ids(batch: Any) -> list[int]:
    col = batch["id"] if isinstance(batch, dict) else batch[0]
    return [int(v) for v in torch.as_tensor(col).reshape(-1)]


def _fetch_ahead(loader: naiad.DataLoader, *, stop_after: int | None = None,
                 pending: int = 1) -> tuple[list[list[int]], dict[str, Any] | None]:
    """nanoGPT's loop shape: fetch the first batch, then each step fetches the next batch before
    it is done with this one. Stops after ``stop_after`` steps with the state as a checkpoint
    would save it (through JSON), or runs the epoch out."""
    trained: list[list[int]] = []
    it = iter(loader)
    ahead = [next(it) for _ in range(pending)]
    while ahead:
        batch = ahead.pop(0)
        ahead.extend(b for b in [next(it, None)] if b is not None)  # the fetch ahead, during the step
        trained.append(_ids(batch))
        if stop_after is not None and len(trained) == stop_after:
            state = json.loads(json.dumps(loader.state_dict(pending=len(ahead))))
            return trained, state
    return trained, None


def _resumed(make: Callable[[], naiad.DataLoader], pending: int = 1) -> list[list[int]]:
    """The batches trained on by a run interrupted after STEPS_BEFORE steps and resumed."""
    before, state = _fetch_ahead(make(), stop_after=STEPS_BEFORE, pending=pending)
    loader = make()
    loader.load_state_dict(state)  # type: ignore[arg-type]
    after, _ = _fetch_ahead(loader, pending=pending)
    return before + after


def _map(**kw: Any) -> Callable[[], naiad.DataLoader]:
    data = TensorDataset(torch.arange(97))
    return lambda: naiad.DataLoader(data, batch_size=4, shuffle=True, seed=11, **kw)


@pytest.mark.parametrize("kw", [{}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"},
                                {"device": "cpu", "device_prefetch": 3}, {"num_workers": 2, "in_order": False}],
                         ids=["inline", "processes", "threads", "device", "out-of-order"])
def test_a_map_style_fetch_ahead_loop_resumes_exactly(kw: dict[str, Any]) -> None:
    make = _map(**kw)
    whole, _ = _fetch_ahead(make())
    got = _resumed(make)
    if kw.get("in_order") is False:  # delivery order may differ: each index once, all of them
        assert sorted(i for b in got for i in b) == list(range(97))
    else:
        assert got == whole


def test_without_pending_a_fetch_ahead_loop_loses_the_batch_it_held() -> None:
    # What pending= is for: the state counts the batch fetched ahead as trained.
    make = _map()
    whole, _ = _fetch_ahead(make())
    before, _ = _fetch_ahead(make(), stop_after=STEPS_BEFORE)
    loader = make()
    it = iter(loader)
    for _ in range(STEPS_BEFORE + 1):
        next(it)
    lossy = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(lossy)
    after = [_ids(b) for b in resumed]
    assert before + after != whole and len(before + after) == len(whole) - 1


def test_a_stream_gives_back_two_batches() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = open_numbered(write_numbered(tmp, "csv", [150, 133]), "csv", index_dir=False)

        def make() -> naiad.DataLoader:
            return naiad.DataLoader(src, batch_size=8, shuffle=True, seed=5, shuffle_buffer=64)

        whole, _ = _fetch_ahead(make(), pending=2)
        assert _resumed(make, pending=2) == whole


def test_an_elastic_resume_of_fetch_ahead_ranks_delivers_every_row_once() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = open_numbered(write_numbered(tmp, "csv", [150, 133]), "csv", index_dir=False)
        trained: list[int] = []
        state = None
        for rank in range(2):
            loader = naiad.DataLoader(src, batch_size=8, shuffle=True, seed=5, rank=rank, world_size=2)
            before, saved = _fetch_ahead(loader, stop_after=STEPS_BEFORE)
            trained += [i for b in before for i in b]
            state = state or saved  # ranks step in lockstep: rank 0's state describes the job
        one = naiad.DataLoader(src, batch_size=8, shuffle=True, seed=5)
        one.load_state_dict(state)  # type: ignore[arg-type]
        trained += [i for b in one for i in _ids(b)]
        assert sorted(trained) == list(range(283))


class Counting(IterableDataset):
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 64, step):
            yield {"id": torch.tensor(i)}


def test_an_iterable_dataset_with_workers_gives_back_its_batch() -> None:
    def make() -> naiad.DataLoader:
        return naiad.DataLoader(Counting(), batch_size=4, num_workers=2)

    whole, _ = _fetch_ahead(make())
    assert _resumed(make) == whole


def test_more_than_was_received_is_refused_with_the_count() -> None:
    loader = _map()()
    with pytest.raises(ConfigError, match="received 0 batch"):
        loader.state_dict(pending=1)  # nothing received yet
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict(pending=2)["batches_yielded"] == 0
    with pytest.raises(ConfigError, match=r"state_dict\(pending=3\): the training loop received 2 batch"):
        loader.state_dict(pending=3)
    for bad in (-1, 1.0, True, "1"):
        with pytest.raises(ConfigError, match="`pending` must be an int >= 0"):
            loader.state_dict(pending=bad)  # type: ignore[arg-type]
    state = loader.state_dict()
    del it
    resumed = _map()()
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError, match="since the state was loaded"):
        resumed.state_dict(pending=1)


def test_pending_counts_from_the_resumed_pass() -> None:
    make = _map()
    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    it = iter(resumed)
    next(it)
    assert resumed.state_dict(pending=1)["batches_yielded"] == 5
    with pytest.raises(ConfigError, match="received 1 batch.*since the pass began \\(a resumed one\\)"):
        resumed.state_dict(pending=2)


def test_the_last_batch_of_an_epoch_can_be_given_back() -> None:
    make = _map()
    loader = make()
    batches = [_ids(b) for b in loader]
    state = loader.state_dict(pending=1)  # the epoch's last batch was received, not trained on
    assert state["epoch"] == 0 and state["batches_yielded"] == len(batches) - 1
    resumed = make()
    resumed.load_state_dict(state)
    assert [_ids(b) for b in resumed] == batches[-1:]
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(97))
