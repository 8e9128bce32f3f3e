"""Failures that heal: a shard that fails to count or index is counted again by the next pass of
the same source (a transient error, or a shard repaired since), not re-raised for the source's
life; its failure is never kept in the indexes written for the next process."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

import pytest

import naiad
from naiad.errors import SourceError

pytestmark = pytest.mark.timeout(120)

SHARDS, PER_SHARD = 6, 20


def write_shard(path: Path, first: int) -> None:
    with tarfile.open(path, "w") as tar:
        for k in range(first, first + PER_SHARD):
            for ext, data in (("cls", str(k).encode()), ("bin", bytes([k % 256]) * 300)):
                info = tarfile.TarInfo(f"s{k:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_shards(folder: Path) -> str:
    for i in range(SHARDS):
        write_shard(folder / f"train-{i:04d}.tar", i * PER_SHARD)
    return str(folder / f"train-{{0000..{SHARDS - 1:04d}}}.tar")


def epoch_of(loaders: list[naiad.DataLoader]) -> list[int]:
    out = []
    for loader in loaders:
        loader.set_epoch(0)
        out += [int(c) for b in loader for c in b["cls"]]
    return sorted(out)


@pytest.mark.parametrize("kept", [False, True])
def test_a_truncated_shard_repaired_is_counted_by_the_next_pass(tmp_path, kept: bool) -> None:
    # Two ranks: the count comes before any read (blocks()).
    pattern = write_shards(tmp_path)
    victim = tmp_path / f"train-{SHARDS - 2:04d}.tar"
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])  # cut inside a member, as a download cut short
    src = naiad.read_webdataset(pattern, block_bytes=2048, index_dir=str(tmp_path / "index") if kept else False)
    loaders = [naiad.DataLoader(src, batch_size=8, shuffle=True, seed=1, rank=r, world_size=2) for r in range(2)]
    with pytest.raises(SourceError, match=rf"train-{SHARDS - 2:04d}\.tar.*(cut short|truncated)"):
        epoch_of(loaders)
    victim.write_bytes(good)  # repaired
    assert epoch_of(loaders) == list(range(SHARDS * PER_SHARD))
    if kept:  # the next process reads the kept indexes, the repaired shard's included
        again = naiad.read_webdataset(pattern, block_bytes=2048, index_dir=str(tmp_path / "index"))
        assert len(again) == SHARDS * PER_SHARD


def test_a_count_beside_early_reads_that_failed_is_made_again(tmp_path, monkeypatch) -> None:
    # One rank counts its shards on a thread beside its first reads (NOTE [ Early reads ]); a
    # transient error there (the first walk of one shard) was kept, and ended every later pass.
    pattern = write_shards(tmp_path)
    victim = str(tmp_path / f"train-{SHARDS - 1:04d}.tar")
    walk = naiad.sources.webdataset.scan_shard
    failed: list[str] = []

    def flaky(path: str, store: object = None) -> object:
        if path == victim and not failed:
            failed.append(path)
            raise SourceError("connection reset while indexing (a transient error).", path=path)
        return walk(path, store)

    monkeypatch.setattr(naiad.sources.webdataset, "scan_shard", flaky)
    src = naiad.read_webdataset(pattern, block_bytes=2048, index_dir=False)
    src.count_beside()  # as a fresh pass on one rank starts it
    deadline = time.monotonic() + 30
    while not src.counted() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(SourceError, match="connection reset"):
        src.blocks()  # the pass that started the count sees its error
    assert failed == [victim]
    assert epoch_of([naiad.DataLoader(src, batch_size=8, shuffle=True, seed=1)]) == list(range(SHARDS * PER_SHARD))
