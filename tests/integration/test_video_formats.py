"""naiad.decode_video on videos kept in the layouts users have besides a folder: ``.mp4`` members
of WebDataset tar shards written by the ``webdataset`` library's own ShardWriter, read through
``naiad.read_webdataset``, and video bytes in a Parquet binary column written by pyarrow, read
through ``naiad.read_parquet``. Every sample once, the delivered frame numbers checked against
the pixels, the same clips and crops with 0 and 2 workers and after an exact resume, and a video
that ``short="skip"`` refuses ledgered as a bad row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import naiad
from naiad.errors import DecodeError, SourceError
from tests.video_data import frame_numbers, write_video, write_video_shards

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")

LENGTHS = [5, 9, 12, 16, 20, 24, 28, 31]
"""Frames of each video (under 32, where the red frame number wraps): the first shorter than a clip."""


def videos(root: Path) -> list[bytes]:
    """The test videos' bytes: two sizes, keyframes every 6 frames, B-frames where libx264 is."""
    return [write_video(root / f"v{i}.mp4", n, width=40 if i % 2 else 32, height=30 if i % 2 else 24, gop=6).read_bytes()
            for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three tar shards (3, 3 and 2 samples) written by webdataset's ShardWriter: ``.mp4`` and ``.cls``."""
    root = tmp_path_factory.mktemp("shards")
    pattern = write_video_shards(root, videos(root / "videos"), LENGTHS, per_shard=3)
    assert pattern.endswith("train-{0000..0002}.tar")
    return pattern


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Parquet file of two row groups: ``video`` (binary), ``frames`` (int64) and ``name`` (str)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root = tmp_path_factory.mktemp("parquet")
    table = pa.table({"video": pa.array(videos(root / "videos"), pa.binary()),
                      "frames": pa.array(LENGTHS, pa.int64()),
                      "name": [f"v{i}" for i in range(len(LENGTHS))]})
    pq.write_table(table, root / "videos.parquet", row_group_size=4)
    return root / "videos.parquet"


def run(loader: naiad.DataLoader) -> list[dict[str, Any]]:
    try:
        return list(loader)
    finally:
        loader.close()


def by_name(batches: list[dict[str, Any]], column: str, name: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each sample's clip and frame numbers by its name, checked: delivered once, the numbers the pixels'."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for b in batches:
        for key, clip, frames in zip(b[name], b[column], b[column + "_frames"], strict=True):
            assert key not in out, f"{key} delivered twice"
            assert (frame_numbers(clip.numpy()) == frames.numpy()).all(), key
            out[key] = (clip, frames)
    return out


def same(a: dict[str, tuple[torch.Tensor, torch.Tensor]], b: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not (torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]))]
    assert not differ, f"clips differ for {differ[:3]}"


def train_clips(column: str) -> naiad.Transform:
    """VideoMAE's training clips: random starts, shorter side 20 then a random 16x16 crop, flips; short videos loop."""
    return naiad.decode_video(column, frames=4, stride=2, clip="random", resize=20, crop="random", size=16, flip=True,
                              short="loop")


@pytest.mark.timeout(240)
def test_mp4_members_of_webdataset_shards_give_the_same_clips_for_0_and_2_workers_and_after_a_resume(shards):
    def make(workers: int) -> naiad.DataLoader:
        loader = naiad.DataLoader(naiad.read_webdataset(shards, index_dir=False), batch_size=3, shuffle=True, seed=3,
                                  num_workers=workers, transform=train_clips("mp4"))
        loader.set_epoch(1)
        return loader

    whole = by_name(run(make(0)), "mp4", "__key__")
    assert sorted(whole) == [f"clip_{i:03d}" for i in range(len(LENGTHS))]
    first = next(b for b in run(make(0)) if "clip_000" in b["__key__"])
    row = first["__key__"].index("clip_000")
    assert int(first["cls"][row]) == 5 and first["mp4_frames"][row].tolist() == [0, 2, 4, 1]  # 5 frames, looped
    assert len({(int(f[0]), int(f[1])) for _, f in whole.values()}) > 1
    same(whole, by_name(run(make(2)), "mp4", "__key__"))
    interrupted = make(2)
    it = iter(interrupted)
    before = [next(it)]
    state = json.loads(json.dumps(interrupted.state_dict()))
    interrupted.close()
    resumed = make(2)
    resumed.load_state_dict(state)
    same(whole, by_name(before + run(resumed), "mp4", "__key__"))


@pytest.mark.timeout(240)
def test_video_bytes_in_a_parquet_binary_column_decode_through_read_parquet(parquet):
    # Two clips a video, spaced from its first frame to its last, on a 12.5 fps timeline of the 25 fps videos.
    decode = naiad.decode_video("video", frames=3, stride=2, clip="uniform", clips_per_video=2, fps=12.5, size=16,
                                crop="center")
    batches = run(naiad.DataLoader(naiad.read_parquet(parquet), batch_size=3, num_workers=2, transform=decode))
    seen = {}
    for b in batches:
        assert b["video"].shape[1:] == (2, 3, 3, 16, 16)
        for name, count, clip, frames in zip(b["name"], b["frames"], b["video"], b["video_frames"], strict=True):
            assert (frame_numbers(clip.numpy()) == frames.numpy()).all(), name
            seen[name] = (int(count), frames.tolist())
    assert sorted(seen) == [f"v{i}" for i in range(len(LENGTHS))]
    for count, (first, last) in seen.values():
        timeline = (count + 1) // 2  # ceil((count - 1/2) / 2): the 12.5 fps frames inside the video
        if timeline >= 5:  # a clip's span: the first clip starts at 0, the last ends on the timeline's last frame
            assert first == [0, 4, 8] and last == [2 * (timeline - 1) - 8, 2 * (timeline - 1) - 4, 2 * (timeline - 1)]
    assert seen["v0"][1] == [[0, 4, 4], [0, 4, 4]]  # 5 frames: a timeline of 3 (0, 2, 4), padded with its last


@pytest.mark.timeout(240)
def test_a_video_shorter_than_a_clip_with_short_skip_is_ledgered_from_parquet_or_named(parquet):
    decode = naiad.decode_video("video", frames=5, stride=2, clip="center", size=8, crop="center", short="skip")
    loader = naiad.DataLoader(naiad.read_parquet(parquet, on_bad_rows="skip"), batch_size=4, transform=decode)
    try:
        names = [n for b in loader for n in b["name"]]
        ledger = loader.stats().bad_row_ledger
    finally:
        loader.close()
    assert names == [f"v{i}" for i in range(1, len(LENGTHS))]  # v0's 5 frames are short of a clip's 9
    assert len(ledger) == 1 and ledger[0]["file"] == str(parquet) and ledger[0]["column"] == "video"
    assert "shorter than a clip of 9" in ledger[0]["reason"] and "short='skip'" in ledger[0]["reason"]
    strict = naiad.DataLoader(naiad.read_parquet(parquet), batch_size=4, transform=decode)
    try:
        with pytest.raises(SourceError) as info:
            list(strict)
    finally:
        strict.close()
    assert isinstance(info.value, DecodeError) and "5 frames, shorter than a clip of 9" in str(info.value)
