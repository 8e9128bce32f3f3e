"""naiad.testing.check_resume over every source and mode: the project's own proof that a
``state_dict()`` taken anywhere in an epoch resumes with exactly the batches an uninterrupted
run yields (NOTE [ What check_resume checks ] in naiad/testing.py).

Not the full cross product (CI has two cores): every source with shuffle on and off, inline;
then every mode (drop_last, thread and process workers, "auto", device="cpu", ranks,
persistent workers, in_order=False) with one map-style dataset and one streaming source, the
sources rotating between modes; then randomness drawn inside workers, an IterableDataset out of
order, and an elastic resume under "auto".
"""

from __future__ import annotations

import collections
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import naiad
from naiad.testing import check_resume, first_difference
from tests.conftest_stream import ids_of, open_numbered, write_numbered
from tests.helpers import assert_same_batches

ROWS = 53  # map-style samples: batches of 8 leave a short last one
SIZES = [23, 0, 31, 9]  # streaming rows per file: uneven, one file empty
BATCH = 8
BUFFER = 16  # a streaming shuffle buffer smaller than the data, so it matters


# -- map-style datasets (module level: process workers pickle them) ---------------------------

Pair = collections.namedtuple("Pair", ["left", "right"])


class TupleSamples(Dataset):
    """Per sample (torch's path): a tuple of an int, a float tensor and a string."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, str]:
        return i, torch.full((3,), i * 0.5), f"row-{i}"


class DictSamples(Dataset):
    """Per sample: a dict holding an array, a namedtuple and a float."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": np.arange(4, dtype=np.float32) + i, "pair": Pair(i, -i), "w": i / 7}


class ManyAtOnce(Dataset):
    """A dataset with ``__getitems__``: one call per batch."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [{"id": int(i), "v": torch.tensor([i, i * i], dtype=torch.int32)} for i in indices]


class SlowSamples(Dataset):
    """Per sample, every eleventh one slow to read: with ``in_order=False`` the batches after a
    slow one overtake it, so deliveries leave the plan's order."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        if i % 11 == 0:
            time.sleep(0.03)
        return i, torch.tensor([i, -i], dtype=torch.int64)


def map_dataset(name: str) -> Any:
    ids = torch.arange(ROWS)
    if name == "tensor":
        return ids.float().reshape(ROWS, 1) * 3
    if name == "tensordataset":
        return TensorDataset(ids.float().reshape(ROWS, 1), ids)
    if name == "arraydataset":
        return naiad.ArrayDataset({"x": np.arange(ROWS * 2, dtype=np.float64).reshape(ROWS, 2), "y": np.arange(ROWS)})
    if name == "numpy":
        return np.arange(ROWS * 3, dtype=np.int16).reshape(ROWS, 3)
    if name == "getitems":
        return ManyAtOnce()
    if name == "tuples":
        return TupleSamples()
    if name == "dicts":
        return DictSamples()
    if name == "slow":
        return SlowSamples()
    raise AssertionError(name)


MAP_SOURCES = ["tensor", "tensordataset", "arraydataset", "numpy", "getitems", "tuples", "dicts"]
STREAM_SOURCES = ["csv", "jsonl", "text", "parquet", "arrow", "npy"]


def maker(source: str, directory: Path, **kw: Any) -> Callable[[], naiad.DataLoader]:
    """make_loader for check_resume: a fresh loader over ``source`` with ``kw``."""
    if source in STREAM_SOURCES:
        sub = directory / source
        if not sub.exists():
            sub.mkdir()
            write_numbered(str(sub), source, SIZES)
        paths = sorted(str(p) for p in sub.iterdir())
        if kw.get("shuffle"):
            kw.setdefault("shuffle_buffer", BUFFER)
        return lambda: naiad.DataLoader(open_numbered(paths, source), batch_size=BATCH, **kw)
    dataset = map_dataset(source)
    return lambda: naiad.DataLoader(dataset, batch_size=BATCH, **kw)


def shuffled(shuffle: bool) -> dict[str, Any]:
    return {"shuffle": True, "seed": 11} if shuffle else {"shuffle": False}


# -- every source, shuffled and not -----------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("source", MAP_SOURCES + STREAM_SOURCES)
def test_every_source_resumes_exactly(source: str, shuffle: bool, tmp_path: Path) -> None:
    report = check_resume(maker(source, tmp_path, **shuffled(shuffle)), epochs=2)
    n = report.batches_per_epoch
    assert n[0] == n[1] == (7 if source in MAP_SOURCES else 8)
    assert {p.how for p in report.save_points} == {
        "break", "resumed, then saved again", "continue", "end of epoch", "later epoch",
    }
    assert report.largest_state_bytes < 2048


# -- every mode, with a map-style dataset and a streaming source -------------------------------

# mode -> (loader options, the map-style dataset, the streaming format, check_resume options)
MODES: dict[str, tuple[dict[str, Any], str, str, dict[str, Any]]] = {
    "drop_last": ({"drop_last": True, "shuffle": True, "seed": 5}, "dicts", "parquet", {}),
    "threads": ({"num_workers": 2, "worker_mode": "thread", "shuffle": True, "seed": 5}, "getitems", "jsonl", {}),
    "processes": ({"num_workers": 2, "worker_mode": "process", "shuffle": True, "seed": 5}, "tuples", "csv", {}),
    "auto": ({"num_workers": "auto", "shuffle": True, "seed": 5}, "tensordataset", "arrow", {}),
    "device_cpu": ({"device": "cpu", "shuffle": True, "seed": 5}, "arraydataset", "npy", {}),
    "device_cpu_threads": (
        {"device": "cpu", "device_prefetch": 3, "num_workers": 2, "worker_mode": "thread"}, "numpy", "text", {},
    ),
    "ranks": ({"rank": 1, "world_size": 3, "shuffle": True, "seed": 5}, "numpy", "arrow", {}),
    "ranks_drop_last": ({"rank": 2, "world_size": 3, "drop_last": True}, "tensor", "csv", {}),
    "persistent": (
        {"num_workers": 2, "worker_mode": "process", "persistent_workers": True, "shuffle": True, "seed": 5},
        "dicts", "text", {},
    ),
    "everything": (
        {"num_workers": 2, "worker_mode": "process", "persistent_workers": True, "drop_last": True, "shuffle": True,
         "seed": 5, "rank": 0, "world_size": 2, "device": "cpu", "prefetch_factor": 3},
        "getitems", "parquet", {},
    ),
    # Batches delivered as they complete: a stream keeps its plan order (its shuffle buffer
    # needs it), a map-style dataset's state names the batches delivered beyond the prefix.
    "out_of_order_threads": (
        {"num_workers": 2, "worker_mode": "thread", "in_order": False, "shuffle": True, "seed": 5}, "slow", "jsonl", {},
    ),
    "out_of_order_processes_device": (
        {"num_workers": 2, "worker_mode": "process", "in_order": False, "device": "cpu", "drop_last": True,
         "shuffle": True, "seed": 5},
        "slow", "parquet", {},
    ),
    "out_of_order_ranks": (
        {"num_workers": 2, "worker_mode": "thread", "in_order": False, "rank": 1, "world_size": 2}, "slow", "csv", {},
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["map", "stream"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_resumes_exactly(mode: str, kind: str, tmp_path: Path) -> None:
    options, map_source, stream_source, check = MODES[mode]
    source = map_source if kind == "map" else stream_source
    report = check_resume(maker(source, tmp_path, **options), epochs=2, **check)
    if options.get("drop_last"):
        assert all(n > 0 for n in report.batches_per_epoch)
    assert report.largest_state_bytes < 2048


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_three_epochs_and_chosen_positions(kind: str, tmp_path: Path) -> None:
    make = maker("tuples" if kind == "map" else "jsonl", tmp_path, shuffle=True, seed=2, num_workers=2,
                 worker_mode="thread")
    report = check_resume(make, epochs=3, positions=[0.25, 0.75])
    assert [(p.epoch, p.how) for p in report.save_points if p.how in ("break", "later epoch")] == [
        (0, "break"), (0, "break"), (2, "later epoch"),
    ]


# -- naiad bugs the conformance check found -----------------------------------------------------


@pytest.mark.timeout(60)
def test_device_state_taken_after_the_break_is_the_position(tmp_path: Path) -> None:
    check_resume(maker("tensordataset", tmp_path, device="cpu", shuffle=True, seed=1), epochs=1, positions=[0.5])


def test_device_state_inside_the_loop_counts_only_received_batches(tmp_path: Path) -> None:
    # Inline and prefetching 2 ahead, the prefetcher has read the whole epoch when the loop has
    # its last-but-one batch; the state used to say "epoch 1" and lose the last batch.
    make = maker("tensordataset", tmp_path, device="cpu", device_prefetch=2)
    loader = make()
    it = iter(loader)
    n = len(loader)
    for _ in range(n - 1):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (0, n - 1)
    resumed = make()
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 1


def test_state_after_a_break_is_where_the_loop_stopped() -> None:
    loader = naiad.DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True, seed=3)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    state = loader.state_dict()  # the pass's iterator is gone: the loop dropped it
    assert (state["epoch"], state["batches_yielded"]) == (0, 3)
    loader.set_epoch(4)  # moved on by hand: that pass is no longer the position
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches_yielded"]) == (4, 0)


def test_state_after_every_batch_but_before_the_end_is_the_next_epoch() -> None:
    loader = naiad.DataLoader(TensorDataset(torch.arange(12)), batch_size=4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()  # the loop has every batch, not yet StopIteration
    assert (state["epoch"], state["batches_yielded"]) == (1, 0)


def test_state_right_after_loading_is_the_loaded_state() -> None:
    make = lambda: naiad.DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True, seed=3)  # noqa: E731
    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # a checkpoint saved before the first batch keeps it


# -- randomness drawn inside workers ------------------------------------------------------------


class GlobalNoise(Dataset):
    """Augmentation as users write it: the global generators of random, NumPy and torch."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, float, float]:
        return i, torch.rand(2), float(np.random.rand()), random.random()


class WorkerRngNoise(Dataset):
    """Augmentation drawn from naiad.worker_rng()."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, float]:
        return i, float(naiad.worker_rng().random())


def noise_epochs(dataset: Dataset, epochs: int = 2, **kw: Any) -> list[list[Any]]:
    loader = naiad.DataLoader(dataset, batch_size=4, shuffle=True, seed=21, **kw)
    try:
        return [list(loader) for _ in range(epochs)]
    finally:
        loader.close()


def noise_by_index(batches: list[Any]) -> dict[int, tuple[float, ...]]:
    out: dict[int, tuple[float, ...]] = {}
    for batch in batches:
        ids, *noise = batch
        for row, i in enumerate(ids.tolist()):
            out[i] = tuple(float(n[row].sum()) if isinstance(n, torch.Tensor) else float(n[row]) for n in noise)
    return out


@pytest.mark.timeout(120)
def test_global_generator_noise_is_the_same_for_any_process_worker_count() -> None:
    runs = {n: noise_epochs(GlobalNoise(), num_workers=n, worker_mode="process") for n in (1, 2, 3)}
    for n in (2, 3):
        for epoch in range(2):
            assert_same_batches(runs[1][epoch], runs[n][epoch])
    first, second = (noise_by_index(runs[1][e]) for e in range(2))
    assert sorted(first) == sorted(second) == list(range(24))
    assert all(first[i] != second[i] for i in range(24))  # each epoch draws afresh
    assert len({v for v in first.values()}) == 24  # and each sample its own


@pytest.mark.timeout(120)
def test_global_generator_noise_resumes_exactly_with_process_workers() -> None:
    make = lambda: naiad.DataLoader(GlobalNoise(), batch_size=4, shuffle=True, seed=21, num_workers=2)  # noqa: E731
    check_resume(make, epochs=2, positions=[0.0, 0.5])


@pytest.mark.timeout(120)
def test_worker_rng_noise_is_the_same_inline_in_threads_and_in_processes() -> None:
    reference = noise_epochs(WorkerRngNoise(), num_workers=0)
    for kw in ({"num_workers": 1}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"}):
        got = noise_epochs(WorkerRngNoise(), **kw)  # type: ignore[arg-type]
        for epoch in range(2):
            assert_same_batches(reference[epoch], got[epoch])
    first, second = (noise_by_index(reference[e]) for e in range(2))
    assert all(first[i] != second[i] for i in range(24))
    make = lambda: naiad.DataLoader(WorkerRngNoise(), batch_size=4, shuffle=True, seed=21, num_workers=2,  # noqa: E731
                                    worker_mode="thread")
    check_resume(make, epochs=2)


# -- an IterableDataset out of order: each worker's own count -----------------------------------


class SlowIterable(IterableDataset):
    """Each worker yields its share of ``range(40)``; every seventh sample is slow to read."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(lo, 40, step):
            if i % 7 == 0:
                time.sleep(0.03)
            yield torch.tensor([i, i * i])


@pytest.mark.timeout(120)
def test_an_iterable_dataset_out_of_order_resumes_exactly() -> None:
    make = lambda: naiad.DataLoader(SlowIterable(), batch_size=3, num_workers=2, in_order=False)  # noqa: E731
    # Its length is not known, so a state after the last batch is still that epoch's: not 1.0.
    report = check_resume(make, epochs=2, positions=[0.0, 0.2, 0.5, 0.8])
    assert report.batches_per_epoch == (14, 14)


# -- "auto" over a stream: the state keeps the stream's part ------------------------------------


@pytest.mark.timeout(60)
def test_auto_workers_stream_resumed_with_another_buffer_is_elastic_exactly_once(tmp_path: Path) -> None:
    paths = write_numbered(str(tmp_path), "parquet", [40, 17, 33], chunk_rows=6)
    total = sum([40, 17, 33])

    def make(buffer_rows: int) -> naiad.DataLoader:
        return naiad.DataLoader(open_numbered(paths, "parquet"), batch_size=BATCH, shuffle=True, seed=4,
                                shuffle_buffer=buffer_rows, num_workers="auto")

    loader = make(16)
    it = iter(loader)
    first = [ids_of(next(it)) for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert state["kind"] == "stream" and state["batches_yielded"] == 5
    part = state["pipeline"]
    assert (part["batches"]["yielded"], part["shuffle"]["buffer_rows"], part["plan"]["shuffle"]) == (5, 16, True)

    same = make(16)
    same.load_state_dict(state)
    uninterrupted = make(16)
    expected_rest = list(uninterrupted)[5:]
    uninterrupted.close()
    assert_same_batches(expected_rest, list(same))  # the same buffer: exact
    same.close()

    other = make(48)
    other.load_state_dict(state)
    rest = [ids_of(b) for b in other]
    seen = np.concatenate(first + rest)
    assert sorted(seen.tolist()) == list(range(total))  # every row of the epoch exactly once
    following = np.concatenate([ids_of(b) for b in other])  # the next epoch: a whole one
    assert sorted(following.tolist()) == list(range(total))
    other.close()


# -- the check itself: it catches what it should, and says where ---------------------------------


class LaggingLoader(naiad.DataLoader):
    """A loader whose state is one batch behind: a resume repeats a batch."""

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state["batches_yielded"] > 0:
            state["batches_yielded"] -= 1
            state["pipeline"]["batches"] -= 1
        return state


def test_check_resume_names_the_save_point_epoch_and_batch_that_differ() -> None:
    ds = TensorDataset(torch.arange(28))
    make = lambda: LaggingLoader(ds, batch_size=4, shuffle=True, seed=1)  # noqa: E731
    with pytest.raises(AssertionError, match=r"resumed from the state taken in epoch 0 after 1 batch\(es\) \(break\): "
                                             r"epoch 0, batch 1 differs from the reference: batch\[0\]: values differ"):
        check_resume(make, positions=[0.15])


def test_check_resume_says_when_make_loader_is_not_reproducible() -> None:
    calls = iter(range(100))
    make = lambda: naiad.DataLoader(TensorDataset(torch.arange(8) + next(calls)), batch_size=4)  # noqa: E731
    with pytest.raises(AssertionError, match="make_loader must build the same loader each time"):
        check_resume(make)
    with pytest.raises(naiad.ConfigError, match="positions"):
        check_resume(make, positions=[1.5])


def test_first_difference_shows_the_path_and_both_sides() -> None:
    a = {"x": Pair(torch.tensor([1.0, float("nan")]), ["s", "t"]), "n": np.array([1, 2], np.int32)}
    assert first_difference(a, {"x": Pair(torch.tensor([1.0, float("nan")]), ["s", "t"]), "n": np.array([1, 2], np.int32)}) is None
    assert first_difference(a, {**a, "n": np.array([1, 2], np.int64)}) == "batch['n']: dtype int64, expected int32"
    assert first_difference(a, {**a, "x": Pair(a["x"].left, ["s", "u"])}) == "batch['x'].right[1]: 'u', expected 't'"
    assert first_difference(a, {**a, "x": (a["x"].left, ["s", "t"])}) == "batch['x']: type tuple, expected " + (
        f"{Pair.__module__}.Pair"
    )
