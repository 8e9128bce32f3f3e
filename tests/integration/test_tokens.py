"""Token windows and mixtures through naiad.DataLoader with real worker processes and real files:
every window exactly once across ranks and workers, exact resume, elastic resume (2 -> 3 ranks),
the mixture's shares held through it, flat worker memory across epochs, and token files read
from a loopback S3 server."""

from __future__ import annotations

import json
import os
import pathlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.testing import check_resume
from naiad.tokens.files import HEADER_MAGIC

SPACING = 21000  # file k holds the tokens k * SPACING + 0, 1, 2, ...: a window is its first token


def write_bin(path: pathlib.Path, tokens: np.ndarray, dtype=np.uint16) -> str:
    """As nanoGPT's prepare.py writes train.bin."""
    arr = np.memmap(path, dtype=dtype, mode="w+", shape=(len(tokens),))
    arr[:] = tokens
    arr.flush()
    del arr
    return str(path)


def write_shard(path: pathlib.Path, tokens: np.ndarray) -> str:
    """As modded-nanogpt writes a shard: 256 int32 (magic, version 1, count), uint16 tokens."""
    header = np.zeros(256, np.int32)
    header[:3] = HEADER_MAGIC, 1, len(tokens)
    path.write_bytes(header.tobytes() + tokens.astype(np.uint16).tobytes())
    return str(path)


def numbered_files(folder: pathlib.Path, sizes=(1203, 45, 2000)) -> list[str]:
    """A flat .bin, a .npy and a shard, with the tokens numbered so that a window's first token
    names it; sizes leave a dropped tail in each file."""
    tokens = [k * SPACING + np.arange(n) for k, n in enumerate(sizes)]
    np.save(folder / "b.npy", tokens[1].astype(np.int32))
    return [write_bin(folder / "a.bin", tokens[0]), str(folder / "b.npy"), write_shard(folder / "c.bin", tokens[2])]


def expected_firsts(sizes, seq_len: int) -> list[int]:
    return sorted(k * SPACING + i for k, n in enumerate(sizes) for i in range(0, n - seq_len, seq_len))


def firsts(batch: dict) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


@pytest.mark.timeout(180)
def test_every_window_once_across_two_ranks_of_two_worker_processes(tmp_path):
    tokens = naiad.read_tokens(numbered_files(tmp_path), seq_len=16, eos_id=7)
    loaders = [naiad.DataLoader(tokens, batch_size=7, shuffle=True, seed=11, rank=r, world_size=2, num_workers=2,
                                persistent_workers=True) for r in range(2)]
    try:
        for epoch in range(2):
            per_rank = [[firsts(b) for b in loader] for loader in loaders]
            assert len(per_rank[0]) == len(per_rank[1])  # equal steps: DDP never waits on a rank
            seen = [t for rank in per_rank for b in rank for t in b]
            assert sorted(seen) == expected_firsts((1203, 45, 2000), 16)
            assert Counter(seen).most_common(1)[0][1] == 1
            if epoch == 0:
                first_order = seen
        assert seen != first_order  # another epoch, another order
    finally:
        for loader in loaders:
            loader.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers, mode", [(0, "process"), (2, "thread")])
def test_read_tokens_resumes_exactly(tmp_path, workers, mode):
    tokens = naiad.read_tokens(numbered_files(tmp_path, (203, 45, 300)), seq_len=8, eos_id=5)
    report = check_resume(lambda: naiad.DataLoader(tokens, batch_size=6, shuffle=True, seed=2, num_workers=workers,
                                                   worker_mode=mode))
    assert report.batches_per_epoch == (12, 12)  # 25 + 5 + 37 windows


def mixture(folder: pathlib.Path, length: int | None = None) -> naiad.tokens.TokenMixture:
    a, b, c = numbered_files(folder, (403, 45, 2000))
    sources = [naiad.read_tokens([a, b], seq_len=4), naiad.read_tokens(c, seq_len=4)]
    return naiad.mix(sources, [0.75, 0.25], seed=4, length=length)


@pytest.mark.timeout(300)
def test_mix_resumes_exactly(tmp_path):
    m = mixture(tmp_path, length=400)  # 100 windows: 75 of source 0's 111, 25 of source 1's 499
    assert m.windows_per_epoch.tolist() == [75, 25]
    report = check_resume(lambda: naiad.DataLoader(m, batch_size=8, shuffle=True, seed=1, num_workers=2,
                                                   worker_mode="thread"), epochs=3)
    assert report.batches_per_epoch == (13, 13, 13)


MakeLoader = Callable[[int, int], naiad.DataLoader]  # (rank, world_size)


def run_legs(make: MakeLoader, stop: int) -> tuple[list[int], list[int], list[int], dict, dict]:
    """Two ranks deliver ``stop`` batches of epoch 0 and checkpoint; three ranks resume from rank
    0's state. Returns what the first leg delivered, what the second delivered, the second leg's
    batch counts per rank, and the two states (after the first leg, after the second)."""
    first: list[int] = []
    state: dict[str, Any] = {}
    for rank in range(2):
        loader = make(rank, 2)
        try:
            it = iter(loader)
            for _ in range(stop):
                first += firsts(next(it))
            if rank == 0:
                state = json.loads(json.dumps(loader.state_dict()))
        finally:
            loader.close()
    second: list[int] = []
    counts: list[int] = []
    end: dict[str, Any] = {}
    for rank in range(3):
        loader = make(rank, 3)
        try:
            loader.load_state_dict(state)
            batches = [firsts(b) for b in loader]
            counts.append(len(batches))
            second += [t for b in batches for t in b]
            if rank == 0:
                end = json.loads(json.dumps(loader.state_dict()))
        finally:
            loader.close()
    return first, second, counts, state, end


@pytest.mark.timeout(240)
def test_read_tokens_resumes_elastically_from_two_ranks_on_three(tmp_path):
    tokens = naiad.read_tokens(numbered_files(tmp_path), seq_len=16)

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(tokens, batch_size=9, shuffle=True, seed=5, rank=rank, world_size=world_size,
                                num_workers=2)

    first, second, counts, _, end = run_legs(make, stop=5)
    assert len(first) == 2 * 5 * 9
    assert sorted(first + second) == expected_firsts((1203, 45, 2000), 16)  # every window once
    assert len(set(counts)) == 1
    assert end["epoch"] == 1 and end["batches_yielded"] == 0


@pytest.mark.timeout(240)
def test_mix_resumes_elastically_with_its_weights(tmp_path):
    m = mixture(tmp_path, length=1200)  # 300 windows: 225 of source 0 (up-sampled), 75 of source 1
    reference = Counter(t for b in naiad.DataLoader(m, batch_size=10, shuffle=True, seed=3) for t in firsts(b))

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(m, batch_size=10, shuffle=True, seed=3, rank=rank, world_size=world_size,
                                num_workers=2)

    first, second, counts, state, end = run_legs(make, stop=6)
    assert len(set(counts)) == 1
    assert Counter(first + second) == reference  # the same windows, as often, as without the stop
    by_source = Counter(t // SPACING >= 2 for t in first + second)
    assert [by_source[False], by_source[True]] == m.windows_per_epoch.tolist() == [225, 75]
    # stats() counts what was delivered from the loader's state, by source
    mid = m.stats(state)
    assert [s.tokens for s in mid.sources] == [4 * sum(t // SPACING < 2 for t in first),
                                               4 * sum(t // SPACING >= 2 for t in first)]
    done = m.stats(end)
    assert done.epoch == 1 and [s.tokens for s in done.sources] == [225 * 4, 75 * 4]
    assert [round(s.share, 2) for s in done.sources] == [0.75, 0.25]


@pytest.mark.timeout(180)
def test_mix_over_epochs_sees_every_window_and_keeps_its_proportions(tmp_path):
    m = mixture(tmp_path)  # default length: 111 + 499 windows per epoch, 3/4 of them source 0
    loader = naiad.DataLoader(m, batch_size=32, shuffle=True, seed=0, num_workers=2)
    try:
        seen: Counter[int] = Counter()
        for _ in range(3):
            epoch_firsts = [t for b in loader for t in firsts(b)]
            share = sum(t // SPACING < 2 for t in epoch_firsts) / len(epoch_firsts)
            assert abs(share - 0.75) < 0.005
            seen.update(epoch_firsts)
        assert m.stats(loader).epoch == 3
    finally:
        loader.close()
    # source 1 (499 windows, 153 per epoch) is not all seen in 3 epochs; source 0 is, many times
    source0 = expected_firsts((403, 45), 4)
    assert all(seen[t] >= 3 for t in source0)
    s1 = [t for t in seen if t // SPACING == 2]
    assert len(s1) == len(set(s1)) == 3 * m.windows_per_epoch[1] and max(seen[t] for t in s1) == 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mixed", [False, True])
def test_worker_memory_stays_flat_across_epochs(tmp_path, mixed):
    """Windows are read with pread, not through a memory map: a worker that reads a 32 MB file
    three times over holds no more than a few batches more than after its first batch (a memory
    map's pages stay mapped and count in its RSS: about the file's size). A mixture of two such
    halves too: its per-epoch tables are kept two at a time."""
    n = 16 << 20
    if mixed:
        halves = [write_bin(tmp_path / f"half{i}.bin", (np.arange(n // 2, dtype=np.uint32) + i) % 50000) for i in range(2)]
        tokens = naiad.mix([naiad.read_tokens(h, seq_len=1024) for h in halves], [0.5, 0.5], seed=1)
    else:
        tokens = naiad.read_tokens(write_bin(tmp_path / "big.bin", np.arange(n, dtype=np.uint32) % 50000), seq_len=1024)
    loader = naiad.DataLoader(tokens, batch_size=64, shuffle=True, seed=0, num_workers=1, persistent_workers=True)

    def worker_rss() -> int:
        # Anonymous and file-backed pages: a memory map of the file counts here; the batch slots
        # (shared memory, RssShmem) do not: they are reused, bounded by the prefetch depth, and
        # the first tasks go alone, so a later bundle's slot is bigger than the first batch's.
        def private(pid: int) -> int:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f)
            return sum(int(fields[k].split()[0]) << 10 for k in ("RssAnon", "RssFile"))
        return max(private(p) for p in loader._pools.kept.worker_pids)  # type: ignore[union-attr]

    try:
        it = iter(loader)
        rows = len(next(it)["input_ids"])
        start = worker_rss()
        rss = []
        for _ in range(3):
            rows += sum(len(b["input_ids"]) for b in it)
            assert rows == len(tokens)
            rss.append(worker_rss())
            it, rows = iter(loader), 0
    finally:
        loader.close()
    grown = max(rss) - start
    assert grown < 8e6, f"worker RSS {start / 1e6:.0f} MB after one batch, then {[f'{r / 1e6:.0f} MB' for r in rss]}"


# -- object storage -------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_batch_of_remote_windows_is_few_requests_in_flight_together(s3, tmp_path, shuffle):
    """NOTE [ Remote windows ]: against a far server (a proxy adding 30 ms to every request), a
    batch's nearby windows share one range request (an unshuffled batch is one), and scattered
    ones are fetched several at a time; the batches are the local file's."""
    from tests.s3server import BUCKET, FaultProxy

    key = f"far/tokens-{int(shuffle)}.bin"
    path = write_bin(tmp_path / "t.bin", np.arange(4_000_000, dtype=np.uint32) % 60000)  # 8 MB
    s3.put(key, pathlib.Path(path).read_bytes())
    proxy = FaultProxy(s3.port, latency_s=0.03)
    try:
        remote = naiad.read_tokens(f"s3://{BUCKET}/{key}", seq_len=64, storage=s3.options(endpoint=proxy.endpoint))
        local = naiad.read_tokens(path, seq_len=64)
        before = len(proxy.object_gets(key))
        batches = 3
        far, near = (iter(naiad.DataLoader(ds, batch_size=32, shuffle=shuffle, seed=0)) for ds in (remote, local))
        for _ in range(batches):
            a, b = next(far), next(near)
            assert all(bool((a[k] == b[k]).all()) for k in b)
        gets = len(proxy.object_gets(key)) - before
    finally:
        proxy.close()
    if shuffle:  # 32 windows spread over 8 MB: most alone, but several requests at once
        assert proxy.max_concurrent > 1 and gets <= batches * 32, (proxy.max_concurrent, gets)
    else:
        assert gets == batches, gets


@pytest.mark.timeout(60)
def test_a_remote_token_file_shorter_than_listed_is_a_source_error_naming_it(s3, tmp_path):
    from tests.s3server import BUCKET

    key = "far/shrinks.bin"
    path = write_bin(tmp_path / "t.bin", np.arange(200_000, dtype=np.uint32) % 60000)
    s3.put(key, pathlib.Path(path).read_bytes())
    tokens = naiad.read_tokens(f"s3://{BUCKET}/{key}", seq_len=64, storage=s3.options())
    s3.put(key, pathlib.Path(path).read_bytes()[:1000])  # replaced by a shorter object after the listing
    with pytest.raises(naiad.SourceError) as info:
        list(naiad.DataLoader(tokens, batch_size=32, shuffle=True, seed=0))
    assert f"s3://{BUCKET}/{key}" in str(info.value)


@pytest.mark.timeout(180)
def test_token_files_read_from_an_s3_url_equal_the_local_ones(s3, tmp_path):
    from tests.s3server import BUCKET

    paths = numbered_files(tmp_path, (203, 45, 300))
    for i, p in enumerate(paths):
        s3.put(f"tokens/part-{i}{os.path.splitext(p)[1]}", pathlib.Path(p).read_bytes())
    remote = naiad.read_tokens(f"s3://{BUCKET}/tokens/part-*", seq_len=8, eos_id=3, storage=s3.options())
    local = naiad.read_tokens(paths, seq_len=8, eos_id=3)
    assert [f.layout for f in remote.files] == ["bin", "npy", "shard"] and len(remote) == len(local)
    loaders = [naiad.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2) for ds in (remote, local)]
    try:
        for a, b in zip(*loaders, strict=True):
            assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    finally:
        for loader in loaders:
            loader.close()
