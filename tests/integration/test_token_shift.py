"""Moving window boundaries (``read_tokens(..., shift=True)``) through real loaders and real
files: each epoch's cut delivered exactly once and moved between epochs, the same windows for 0
workers, process and thread workers, an exact and an elastic (2 ranks -> 1) resume, the same
windows across runs, and torch's DataLoader following the dataset's ``set_epoch``."""

from __future__ import annotations

import json
import pathlib
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.testing import check_resume
from naiad.tokens.shift import epoch_offset

SPACING = 100_000  # file k holds the tokens k * SPACING + 0, 1, 2, ...: a token names its place
SIZES = (1203, 45, 2000, 512)  # 512 = 32 * 16: the file whose size is a multiple of seq_len
SEQ = 16


def numbered_files(folder: pathlib.Path, sizes: tuple[int, ...] = SIZES) -> list[str]:
    """Flat uint32 files (nanoGPT's layout, a wider dtype) and one .npy, tokens numbered."""
    paths = []
    for k, n in enumerate(sizes):
        tokens = (k * SPACING + np.arange(n)).astype(np.uint32)
        if k == 1:
            np.save(folder / f"f{k}.npy", tokens)
            paths.append(str(folder / f"f{k}.npy"))
        else:
            tokens.tofile(folder / f"f{k}.bin")
            paths.append(str(folder / f"f{k}.bin"))
    return paths


def read(folder: pathlib.Path, **kwargs: Any) -> naiad.tokens.TokenWindows:
    return naiad.read_tokens(numbered_files(folder), seq_len=SEQ, dtype=np.uint32, shift=True, **kwargs)


def windows_of(batches: list[dict]) -> np.ndarray:
    """Each delivered window as its ``seq_len + 1`` tokens (the inputs, then the last label)."""
    return np.concatenate([np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1) for b in batches])


def epoch_cut(windows: np.ndarray, sizes: tuple[int, ...] = SIZES) -> int:
    """Check that ``windows`` are one epoch's cut, each window once, and return its offset.

    Every window must be consecutive tokens of one file; together they must be windows
    ``o + i * seq_len`` (``i`` < ``n // seq_len - 1``) of every file, each exactly once, which
    covers tokens ``[o, o + W * seq_len + 1)`` of each file: every token of the cut once as an
    input and once as a label, but for the cut's first (input only) and last (label only)."""
    starts = windows[:, 0].astype(np.int64)
    assert (windows == starts[:, None] + np.arange(SEQ + 1)).all()  # consecutive tokens of one file
    assert Counter(starts.tolist()).most_common(1)[0][1] == 1
    offsets = {int(s % SPACING) % SEQ for s in starts}
    assert len(offsets) == 1, f"windows of several cuts: offsets {sorted(offsets)}"
    offset = offsets.pop()
    expected = sorted(k * SPACING + offset + SEQ * i for k, n in enumerate(sizes) for i in range(max(n // SEQ - 1, 0)))
    assert sorted(starts.tolist()) == expected
    for k, n in enumerate(sizes):  # the cut's tokens, each an input once: nothing skipped, nothing twice
        inputs = windows[starts // SPACING == k, :SEQ].reshape(-1) - k * SPACING
        count = max(n // SEQ - 1, 0)
        assert sorted(inputs.tolist()) == list(range(offset, offset + count * SEQ))
        assert offset + count * SEQ + 1 <= n  # the cut fits the file, whatever the offset
    return offset


def run_epochs(loader: naiad.DataLoader, epochs: int) -> list[list[dict]]:
    try:
        return [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(epochs)]
    finally:
        loader.close()


@pytest.mark.timeout(180)
def test_each_epochs_cut_is_delivered_once_and_moves_between_epochs(tmp_path):
    tokens = read(tmp_path)
    assert len(tokens) == 74 + 1 + 124 + 31  # one window fewer per file, but for the multiple of seq_len
    epochs = run_epochs(naiad.DataLoader(tokens, batch_size=7, shuffle=True, seed=3), 5)
    offsets = [epoch_cut(windows_of(batches)) for batches in epochs]
    assert offsets == [epoch_offset(3, e, SEQ) for e in range(5)]  # a function of (seed, epoch)
    assert len(set(offsets)) > 1  # the boundaries move
    assert {len(batches) for batches in epochs} == {33}  # the same length every epoch


@pytest.mark.timeout(300)
def test_the_same_windows_for_no_workers_process_and_thread_workers(tmp_path):
    tokens = read(tmp_path)
    runs = {
        (workers, mode, persistent): run_epochs(naiad.DataLoader(
            tokens, batch_size=9, shuffle=True, seed=8, num_workers=workers, worker_mode=mode,
            persistent_workers=persistent), 3)
        for workers, mode, persistent in [(0, "process", False), (2, "process", False), (2, "process", True),
                                          (2, "thread", False)]
    }
    reference = [windows_of(batches) for batches in runs[(0, "process", False)]]
    assert len({epoch_cut(w) for w in reference}) > 1
    for key, epochs in runs.items():
        for e, batches in enumerate(epochs):
            assert np.array_equal(windows_of(batches), reference[e]), f"{key}, epoch {e}"


@pytest.mark.timeout(300)
def test_the_same_seed_gives_the_same_windows_in_another_run_and_another_seed_others(tmp_path):
    tokens = read(tmp_path)
    one = [windows_of(b) for b in run_epochs(naiad.DataLoader(tokens, batch_size=5, shuffle=True, seed=21), 3)]
    again = read(tmp_path)  # made again, as a new run makes it
    two = [windows_of(b) for b in run_epochs(naiad.DataLoader(again, batch_size=5, shuffle=True, seed=21), 3)]
    assert len(one) == len(two) and all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    other = [windows_of(b) for b in run_epochs(naiad.DataLoader(again, batch_size=5, shuffle=True, seed=22), 3)]
    assert [epoch_cut(w) for w in other] == [epoch_offset(22, e, SEQ) for e in range(3)]
    # the dataset's own seed, when given, keys the offsets instead of the loader's
    own = read(tmp_path, seed=5)
    mine = [windows_of(b) for b in run_epochs(naiad.DataLoader(own, batch_size=5, shuffle=True, seed=21), 3)]
    assert [epoch_cut(w) for w in mine] == [epoch_offset(5, e, SEQ) for e in range(3)]


@pytest.mark.timeout(180)
def test_set_epoch_on_the_loader_moves_the_cut_to_that_epochs(tmp_path):
    tokens = read(tmp_path)
    loader = naiad.DataLoader(tokens, batch_size=8, shuffle=True, seed=4, num_workers=2, persistent_workers=True)
    try:
        for epoch in (7, 2, 9):
            loader.set_epoch(epoch)
            assert epoch_cut(windows_of(list(loader))) == epoch_offset(4, epoch, SEQ)
    finally:
        loader.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers, mode", [(0, "process"), (2, "process"), (2, "thread")])
def test_an_exact_resume_gives_the_uninterrupted_runs_windows(tmp_path, workers, mode):
    tokens = naiad.read_tokens(numbered_files(tmp_path, (203, 45, 300)), seq_len=8, dtype=np.uint32, eos_id=5,
                               shift=True)
    report = check_resume(lambda: naiad.DataLoader(tokens, batch_size=6, shuffle=True, seed=2, num_workers=workers,
                                                   worker_mode=mode), epochs=2)
    assert report.batches_per_epoch == (11, 11)  # 24 + 4 + 36 windows


@pytest.mark.timeout(300)
def test_an_elastic_resume_from_two_ranks_on_one_delivers_the_cut_once(tmp_path):
    tokens = read(tmp_path)

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(tokens, batch_size=6, shuffle=True, seed=13, rank=rank, world_size=world_size,
                                num_workers=2)

    first: list[dict] = []
    state: dict[str, Any] = {}
    for rank in range(2):
        loader = make(rank, 2)
        try:
            it = iter(loader)
            first += [next(it) for _ in range(6)]
            if rank == 0:
                state = json.loads(json.dumps(loader.state_dict()))
        finally:
            loader.close()
    resumed = make(0, 1)
    resumed.load_state_dict(state)
    rest, following = run_epochs(resumed, 2)
    assert len(rest) < len(following)
    assert epoch_cut(windows_of(first + rest)) == epoch_offset(13, 0, SEQ)  # every window of epoch 0 once
    assert epoch_cut(windows_of(following)) == epoch_offset(13, 1, SEQ)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_torchs_dataloader_follows_the_datasets_set_epoch_and_seed(tmp_path, workers):
    tokens = read(tmp_path, seed=17)
    loader = torch.utils.data.DataLoader(tokens, batch_size=10, shuffle=True, num_workers=workers)
    for epoch in range(3):
        tokens.set_epoch(epoch)  # before iter(): torch's workers take a copy of the dataset then
        assert epoch_cut(windows_of(list(loader))) == epoch_offset(17, epoch, SEQ)


@pytest.mark.timeout(180)
def test_shifted_windows_read_from_an_s3_url_equal_the_local_ones(s3, tmp_path):
    from tests.s3server import BUCKET

    paths = numbered_files(tmp_path)
    for i, p in enumerate(paths):
        s3.put(f"shifted/part-{i}{pathlib.Path(p).suffix}", pathlib.Path(p).read_bytes())
    remote = naiad.read_tokens(f"s3://{BUCKET}/shifted/part-*", seq_len=SEQ, dtype=np.uint32, shift=True,
                               storage=s3.options())
    epochs = run_epochs(naiad.DataLoader(remote, batch_size=10, shuffle=True, seed=6, num_workers=2,
                                         worker_mode="thread"), 2)
    local = run_epochs(naiad.DataLoader(read(tmp_path), batch_size=10, shuffle=True, seed=6), 2)
    for e in range(2):
        assert np.array_equal(windows_of(epochs[e]), windows_of(local[e]))
        assert epoch_cut(windows_of(epochs[e])) == epoch_offset(6, e, SEQ)
