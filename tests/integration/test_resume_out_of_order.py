"""Resuming a loader made with ``in_order=False``: the state names the batches delivered (the
prefix of the plan and the runs beyond it, or each worker's count), so a resume delivers exactly
the batches not yet delivered, each once (NOTE [ Out-of-order delivery ] in
naiad/order/delivered.py). A slow sample makes the out-of-order delivery certain."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import naiad
from naiad.testing import check_resume
from tests.conftest_stream import ids_of, open_numbered, write_numbered
from tests.helpers import assert_same_batches

# -- datasets (module level: process workers pickle them) ---------------------------------------


class SlowItems(Dataset):
    """``n`` integers; reading ``slow`` takes ``delay_s``, so the items after it overtake it."""

    def __init__(self, n: int = 20, slow: int = 0, delay_s: float = 1.0) -> None:
        self.n, self.slow, self.delay_s = n, slow, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.slow:
            time.sleep(self.delay_s)
        return i


class SlowStream(IterableDataset):
    """Worker ``w`` of ``n`` yields ``w, w + n, ...`` below 20; item 0 takes ``delay_s``."""

    def __init__(self, delay_s: float = 1.0) -> None:
        self.delay_s = delay_s

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, 20, n):
            if i == 0:
                time.sleep(self.delay_s)
            yield i


def slow_first(n: int, batch_size: int, seed: int, delay_s: float) -> SlowItems:
    """``n`` items whose shuffled plan (``seed``, epoch 0) begins with the slow one."""
    plain = naiad.DataLoader(SlowItems(n, delay_s=0), batch_size=batch_size, shuffle=True, seed=seed)
    return SlowItems(n, slow=_ints(next(iter(plain)))[0], delay_s=delay_s)


def _ints(batch: Any) -> list[int]:
    return [int(x) for x in batch.reshape(-1).tolist()] if isinstance(batch, torch.Tensor) else [int(batch)]


def _take(make: Callable[[], naiad.DataLoader], k: int) -> tuple[list[int], dict[str, Any]]:
    """The first ``k`` batches' items and the state after them (through JSON, as a checkpoint)."""
    loader = make()
    try:
        it = iter(loader)
        first = [i for _ in range(k) for i in _ints(next(it))]
        state = json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.close()
    return first, state


def _rest(make: Callable[[], naiad.DataLoader], state: dict[str, Any]) -> list[int]:
    loader = make()
    try:
        loader.load_state_dict(state)
        return [i for batch in loader for i in _ints(batch)]
    finally:
        loader.close()


# -- the case: a map-style dataset, thread and process workers ----------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_out_of_order_map_resume_delivers_every_batch_once(mode: str) -> None:
    def make() -> naiad.DataLoader:
        return naiad.DataLoader(SlowItems(), batch_size=None, num_workers=2, worker_mode=mode, in_order=False)

    first, state = _take(make, 5)
    assert 0 not in first  # item 0 was overtaken: the 5 delivered are not plan batches 0..4
    rest = _rest(make, state)
    assert sorted(first + rest) == list(range(20)), (first, rest)
    part = state["pipeline"]  # the prefix (nothing: batch 0 was not delivered) and the runs beyond it
    assert (part["batches"], part["beyond"], part["in_order"], part["rank"]) == (0, _runs(first), False, 0)


def _runs(items: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in sorted(items):
        if runs and runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, i + 1])
    return runs


@pytest.mark.timeout(120)
def test_out_of_order_state_resumes_in_order_and_again() -> None:
    ds = slow_first(30, 2, 7, 1.0)

    def make(in_order: bool) -> naiad.DataLoader:
        return naiad.DataLoader(ds, batch_size=2, num_workers=2, worker_mode="thread", in_order=in_order,
                                shuffle=True, seed=7)

    reference = list(make(True))
    first, state = _take(lambda: make(False), 4)
    assert ds.slow not in first
    # Loaded in order: the batches not yet delivered, in plan order.
    resumed = make(True)
    try:
        resumed.load_state_dict(state)
        it = iter(resumed)
        second = [_ints(next(it)) for _ in range(3)]
        again = json.loads(json.dumps(resumed.state_dict()))
    finally:
        resumed.close()
    delivered = [sorted(_ints(b)) for b in reference]
    missing = [b for b in delivered if not set(b) <= set(first)]
    assert [sorted(b) for b in second] == missing[:3]
    # Saved again mid-way (its runs beyond the prefix carried on), resumed again: exact.
    rest = _rest(lambda: make(False), again)
    assert sorted(first + sum(second, []) + rest) == list(range(30))


@pytest.mark.timeout(120)
def test_out_of_order_state_inside_a_device_prefetch_counts_only_received_batches() -> None:
    def make() -> naiad.DataLoader:
        return naiad.DataLoader(SlowItems(slow=1, delay_s=0.5), batch_size=2, num_workers=2, worker_mode="thread",
                                in_order=False, device="cpu", device_prefetch=3)

    first, state = _take(make, 2)  # the prefetcher has read more than the loop received
    assert state["batches_yielded"] == 2
    assert sorted(first + _rest(make, state)) == list(range(20))


# -- an IterableDataset: each worker's own count ----------------------------------------------------


@pytest.mark.timeout(120)
def test_out_of_order_iterable_resume_skips_each_workers_own_batches() -> None:
    def make(delay_s: float, in_order: bool = False) -> naiad.DataLoader:
        return naiad.DataLoader(SlowStream(delay_s), batch_size=None, num_workers=2, worker_mode="process",
                                in_order=in_order)

    first, state = _take(lambda: make(1.0), 5)
    assert first == [1, 3, 5, 7, 9]  # worker 1's, while worker 0 waits on item 0
    # Resumed with another timing (nothing slow), and in order: each worker skips its own.
    for resumed in (lambda: make(0.0), lambda: make(0.0, in_order=True)):
        rest = _rest(resumed, state)
        assert sorted(first + rest) == list(range(20)), (first, rest)
    assert state["pipeline"]["workers"] == [0, 5]


@pytest.mark.timeout(60)
def test_an_iterable_state_of_before_worker_counts_resumes_in_order() -> None:
    class Numbers(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(12))

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(Numbers(), batch_size=3, in_order=False)

    _, state = _take(make, 2)
    assert state["pipeline"]["workers"] == [2]
    del state["pipeline"]["workers"]  # as naiad wrote it before counting per worker
    loader = make()
    loader.load_state_dict(state)
    it = iter(loader)
    assert _ints(next(it)) == [6, 7, 8]
    assert loader.state_dict()["pipeline"]["workers"] == [3]  # the skipped ones counted too
    assert [_ints(b) for b in it] == [[9, 10, 11]]


# -- elastic resume ---------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_out_of_order_state_of_one_rank_resumes_elastically_exactly_once() -> None:
    ds = slow_first(50, 2, 2, 0.5)  # the first batch of the plan is slow

    def make(**kw: Any) -> naiad.DataLoader:
        return naiad.DataLoader(ds, num_workers=2, worker_mode="thread", shuffle=True, seed=2, **kw)

    first, state = _take(lambda: make(batch_size=2, in_order=False), 6)
    assert ds.slow not in first  # the slow batch left a hole
    rest: list[int] = []
    for rank in range(3):  # another world size and batch size
        rest += _rest(functools.partial(make, batch_size=3, rank=rank, world_size=3, in_order=False), state)
    assert sorted(first + rest) == list(range(50))
    # The new leg in plan order on 3 ranks is in step again: any rank's state resumes any rank.
    resumed = make(batch_size=3, rank=0, world_size=3)
    try:
        resumed.load_state_dict(state)
        it = iter(resumed)
        next(it)
        in_step = json.loads(json.dumps(resumed.state_dict()))
    finally:
        resumed.close()
    assert "in_order" not in in_step["pipeline"]
    make(batch_size=3, rank=2, world_size=3).load_state_dict(in_step)
    # Another batch size on one rank, saved again mid-way: the finished leg keeps its runs.
    resumed = make(batch_size=3, in_order=False)
    try:
        resumed.load_state_dict(state)
        it = iter(resumed)
        middle = [i for _ in range(4) for i in _ints(next(it))]
        again = json.loads(json.dumps(resumed.state_dict()))
    finally:
        resumed.close()
    assert again["pipeline"]["legs"][0]["beyond"] == state["pipeline"]["beyond"]
    last = _rest(lambda: make(batch_size=4), again)
    assert sorted(first + middle + last) == list(range(50))


@pytest.mark.timeout(120)
def test_out_of_order_state_on_several_ranks_is_its_own_ranks() -> None:
    ds = SlowItems(n=40, slow=21, delay_s=0.5)

    def make(rank: int, world_size: int = 2, batch_size: int = 2, in_order: bool = False) -> naiad.DataLoader:
        return naiad.DataLoader(ds, batch_size=batch_size, rank=rank, world_size=world_size, num_workers=2,
                                worker_mode="thread", in_order=in_order)

    first, state = _take(lambda: make(1), 4)
    assert ds.slow not in first  # rank 1's first batch was overtaken
    with pytest.raises(naiad.StateError, match="loader state rank: stored 1, current 0"):
        make(0).load_state_dict(state)
    with pytest.raises(naiad.StateError, match="holds only its own rank's deliveries"):
        make(0, world_size=1).load_state_dict(state)
    with pytest.raises(naiad.StateError, match="holds only its own rank's deliveries"):
        make(1, batch_size=3).load_state_dict(state)
    whole = [i for b in make(1, in_order=True) for i in _ints(b)]
    assert sorted(first + _rest(lambda: make(1), state)) == sorted(whole)


# -- the streaming pipeline: always in plan order -----------------------------------------------------


@pytest.mark.timeout(120)
def test_a_stream_with_in_order_false_is_in_plan_order_and_resumes_exactly(tmp_path: Path) -> None:
    paths = write_numbered(str(tmp_path), "csv", [23, 31, 9])

    def make(in_order: bool) -> naiad.DataLoader:
        return naiad.DataLoader(open_numbered(paths, "csv"), batch_size=4, shuffle=True, seed=3, shuffle_buffer=8,
                                num_workers=2, worker_mode="thread", in_order=in_order)

    ordered, unordered = make(True), make(False)
    try:
        assert_same_batches(list(ordered), list(unordered))  # the shuffle buffer takes blocks in plan order
    finally:
        ordered.close()
        unordered.close()
    loader = make(False)
    try:
        it = iter(loader)
        first = [ids_of(next(it)).tolist() for _ in range(5)]
        state = json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.close()
    assert "beyond" not in state["pipeline"]  # a count says where a stream stands
    resumed = make(False)
    try:
        resumed.load_state_dict(state)
        rest = [ids_of(b).tolist() for b in resumed]
    finally:
        resumed.close()
    assert sorted(sum(first + rest, [])) == list(range(63))


# -- the conformance check itself, with in_order=False ---------------------------------------------------


class ForgetfulLoader(naiad.DataLoader):
    """A loader whose state forgets the batches delivered beyond the prefix (the old count)."""

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        part = state["pipeline"]
        part.pop("beyond", None)
        part["batches"] = state["batches_yielded"]
        return state


@pytest.mark.timeout(120)
def test_check_resume_catches_an_out_of_order_resume_that_repeats_batches() -> None:
    ds = SlowItems(n=12, slow=0, delay_s=0.3)

    def make() -> naiad.DataLoader:
        return ForgetfulLoader(ds, batch_size=None, num_workers=2, worker_mode="thread", in_order=False)

    with pytest.raises(AssertionError, match=r"in_order=False: in any order\) is not one of the reference's"):
        check_resume(make, epochs=1, positions=[0.5])
    report = check_resume(lambda: naiad.DataLoader(ds, batch_size=None, num_workers=2, worker_mode="thread",
                                                   in_order=False), epochs=1, positions=[0.5])
    assert report.batches_per_epoch == (12,)
