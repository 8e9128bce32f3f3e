"""naiad.read_videos + naiad.decode_video through the loader, on a folder of real videos written
with PyAV: every video once across ranks and workers, random clips keyed by (seed, epoch, sample)
so any worker count and an exact resume deliver the same clips and pixels, and a video that does
not decode named or ledgered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import naiad
from naiad.errors import DecodeError, SourceError
from tests.conftest_stream import two_ranks_then_three
from tests.video_data import frame_numbers, write_video

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")

CLASSES = {"archery": 4, "bowling": 3, "cycling": 3}
"""Class folders and their videos: 10 videos of 5 to 21 frames (some shorter than a clip)."""


def write_folder(root: Path, bad: tuple[str, ...] = ()) -> list[str]:
    """The class folders of small videos (32x24 or 40x30 px); ``bad`` names files to write as junk."""
    paths = []
    n = 0
    for name, count in CLASSES.items():
        for k in range(count):
            path = root / name / f"{name}_{k}.mp4"
            if path.name in bad:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"\x00\x00\x00\x18ftypmp42 truncated junk" * 3)
            else:
                size = (32, 24) if n % 2 else (40, 30)
                write_video(path, 5 + 2 * n, width=size[0], height=size[1], gop=6)
            paths.append(str(path))
            n += 1
    return paths


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("videos") / "train"
    return root, write_folder(root)


def random_clips() -> naiad.Transform:
    return naiad.decode_video("video", frames=4, stride=2, clip="random", size=16, crop="random", flip=True)


def by_path(batches: list[dict[str, Any]], size: int = 16) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """Each video's clip, frame numbers and label by its path: delivered once, in 4-frame clips of
    ``size`` x ``size``, its frame numbers those its pixels say."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
    for b in batches:
        assert b["video"].dtype == torch.uint8 and b["video"].shape[1:] == (4, 3, size, size)
        for path, clip, frames, label in zip(b["path"], b["video"], b["video_frames"], b["label"], strict=True):
            assert path not in out, f"{path} delivered twice"
            assert (frame_numbers(clip.numpy()) == frames.numpy()).all(), path
            out[path] = (clip, frames, int(label))
    return out


def same(a: dict[str, tuple[torch.Tensor, torch.Tensor, int]], b: dict[str, tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    assert sorted(a) == sorted(b)
    differ = [p for p in a if not (torch.equal(a[p][0], b[p][0]) and torch.equal(a[p][1], b[p][1]))]
    assert not differ, f"clips differ for {differ[:3]}"


def run(loader: naiad.DataLoader) -> list[dict[str, Any]]:
    try:
        return list(loader)
    finally:
        loader.close()


@pytest.mark.timeout(240)
def test_every_video_once_across_two_ranks_of_two_workers_labelled_by_class_folder(folder):
    root, paths = folder
    seen: list[dict[str, Any]] = []
    steps = []
    for rank in (0, 1):
        loader = naiad.DataLoader(naiad.read_videos(root), batch_size=2, shuffle=True, seed=7, rank=rank, world_size=2,
                                  num_workers=2, transform=random_clips())
        batches = run(loader)
        steps.append(len(batches))
        seen += batches
    clips = by_path(seen)
    assert sorted(clips) == sorted(paths) and steps[0] == steps[1]
    classes = sorted(CLASSES)
    assert all(classes[label] == Path(p).parent.name for p, (_, _, label) in clips.items())


@pytest.mark.timeout(240)
def test_random_clips_are_the_same_for_zero_and_two_workers_and_after_an_exact_resume(folder):
    root, _ = folder

    def make(workers: int) -> naiad.DataLoader:
        loader = naiad.DataLoader(naiad.read_videos(root), batch_size=3, shuffle=True, seed=11, num_workers=workers,
                                  transform=random_clips())
        loader.set_epoch(1)
        return loader

    whole = by_path(run(make(0)))
    same(whole, by_path(run(make(2))))
    first = make(2)
    it = iter(first)
    before = [next(it), next(it)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = make(2)
    resumed.load_state_dict(state)
    same(whole, by_path(before + run(resumed)))
    other_epoch = make(0)
    other_epoch.set_epoch(2)
    moved = by_path(run(other_epoch))
    assert any(not torch.equal(moved[p][1], whole[p][1]) for p in whole)  # the clips move between epochs


@pytest.mark.timeout(240)
def test_a_video_that_does_not_decode_is_named_or_skipped_into_the_ledger(tmp_path):
    paths = write_folder(tmp_path / "train", bad=("bowling_1.mp4",))
    decode = naiad.decode_video("video", frames=3, stride=1, clip="center", size=8, crop="center")
    loader = naiad.DataLoader(naiad.read_videos(tmp_path / "train", on_bad_rows="skip"), batch_size=4, transform=decode)
    batches = run(naiad.DataLoader(naiad.read_videos(tmp_path / "train", on_bad_rows="skip"), batch_size=4,
                                   num_workers=2, transform=decode))
    delivered = [p for b in batches for p in b["path"]]
    assert sorted(delivered) == sorted(p for p in paths if not p.endswith("bowling_1.mp4"))
    try:
        list(loader)
        ledger = loader.stats().bad_row_ledger
    finally:
        loader.close()
    # The folder is the source's one file; the sample's key is the video's path.
    assert [Path(e["key"]).name for e in ledger] == ["bowling_1.mp4"] and ledger[0]["file"] == str(tmp_path / "train")
    assert ledger[0]["column"] == "video" and "not a video FFmpeg can read" in ledger[0]["reason"]
    strict = naiad.DataLoader(naiad.read_videos(tmp_path / "train"), batch_size=4, transform=decode)
    try:
        with pytest.raises(SourceError) as info:
            list(strict)
    finally:
        strict.close()
    assert isinstance(info.value, DecodeError) and "bowling_1.mp4" in str(info.value)


@pytest.mark.timeout(240)
def test_random_clips_resumed_from_two_ranks_on_three_are_the_same_clips(folder):
    root, paths = folder

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_videos(root), batch_size=1, shuffle=True, seed=5, rank=rank,
                                world_size=world_size, num_workers=1, worker_mode="thread", transform=random_clips())

    whole = by_path(run(make(0, 1)))
    seen, counts = two_ranks_then_three(make, 2)
    assert len(set(counts)) == 1  # equal steps on the new ranks
    same(by_path(seen), whole)
    assert sorted(whole) == sorted(paths)


@pytest.mark.timeout(240)
def test_a_video_shorter_than_a_clip_with_short_skip_is_ledgered_like_one_that_does_not_decode(folder):
    root, paths = folder
    decode = naiad.decode_video("video", frames=4, stride=2, clip="random", size=8, crop="center", short="skip")
    loader = naiad.DataLoader(naiad.read_videos(root, on_bad_rows="skip"), batch_size=4, shuffle=True, seed=1,
                              num_workers=2, transform=decode)
    try:
        batches = list(loader)
        ledger = loader.stats().bad_row_ledger
    finally:
        loader.close()
    # archery_0.mp4 has 5 frames, short of a clip's 7; archery_1.mp4 has 7, exactly a clip.
    assert sorted(p for b in batches for p in b["path"]) == sorted(p for p in paths if not p.endswith("archery_0.mp4"))
    assert all((frame_numbers(b["video"].numpy()) == b["video_frames"].numpy()).all() for b in batches)
    assert [Path(e["key"]).name for e in ledger] == ["archery_0.mp4"] and ledger[0]["column"] == "video"
    assert "5 frames, shorter than a clip of 7" in ledger[0]["reason"]
