"""``naiad convert`` for videos, on class folders of videos written with PyAV: tar shards that the
``webdataset`` library reads (``.mp4`` and ``.cls`` members), read back by naiad.read_webdataset
+ decode_video with every video once, its label and its frame numbers checked against its
pixels; re-encoding to a requested keyframe interval and shorter side; shards bounded by bytes
and by samples; bad videos named or skipped; options that do not apply refused."""

from __future__ import annotations

import glob
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.cli import main
from naiad.tools.convert_video import VideoConvertOptions, convert_videos
from tests.video_data import codec, frame_numbers, write_video

av = pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")
wds = pytest.importorskip("webdataset", reason="the shard tests read shards with webdataset (pip install 'naiad[test]')")

pytestmark = pytest.mark.timeout(300)

CLASSES = {"archery": 4, "bowling": 3, "cycling": 3}
"""10 videos of 5 to 23 frames (fewer than 32: the red of frame 32 would wrap to frame 0's)."""


def write_folder(root: Path) -> dict[str, tuple[int, int]]:
    """Class folders of small videos; each key -> (label, frames)."""
    expected = {}
    n = 0
    for label, (name, count) in enumerate(CLASSES.items()):
        for k in range(count):
            frames = 5 + 2 * n
            size = (64, 48) if n % 2 else (80, 60)
            write_video(root / name / f"{name}.{k}.mp4", frames, width=size[0], height=size[1], gop=12)
            expected[f"{name}/{name}_{k}"] = (label, frames)  # the dot of the name's last part made "_"
            n += 1
    return expected


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[int, int]]]:
    root = tmp_path_factory.mktemp("convert") / "train"
    return root, write_folder(root)


def shards_of(dst: Path) -> list[str]:
    return sorted(glob.glob(str(dst.parent / f"{dst.stem}-*.tar")))


def keyframes(data: bytes) -> tuple[list[int], int, tuple[int, int]]:
    """The keyframes' frame numbers, the frame count and the size of a video's bytes, from its packets."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        rate, base = stream.average_rate, stream.time_base
        numbers = [(int(round(float(p.pts * base * rate))), p.is_keyframe) for p in container.demux(stream) if p.size]
        size = (stream.codec_context.width, stream.codec_context.height)
    return sorted(n for n, key in numbers if key), len(numbers), size


def read_back(shards: list[str], **decode: Any) -> dict[str, tuple[int, torch.Tensor, torch.Tensor]]:
    """Every sample through naiad.read_webdataset + decode_video: key -> (label, clip, frame numbers)."""
    loader = naiad.DataLoader(naiad.read_webdataset(shards), batch_size=4, shuffle=True, seed=3,
                              transform=naiad.decode_video("mp4", frames=4, stride=2, size=16, crop="center", **decode))
    out: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}
    for batch in loader:
        for key, label, clip, frames in zip(batch["__key__"], batch["cls"], batch["mp4"], batch["mp4_frames"], strict=True):
            assert key not in out, f"{key} delivered twice"
            out[key] = (int(label), clip, frames)
    return out


def test_reencoded_shards_have_the_keyframe_interval_size_labels_and_frames(
        folder: tuple[Path, dict[str, tuple[int, int]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, expected = folder
    dst = tmp_path / "shards" / "train.tar"
    assert main(["convert", str(root), str(dst), "--keyframe-interval", "4", "--max-size", "32", "--crf", "4",
                 "--shard-size", "20KiB", "--shuffle", "--seed", "1"]) == 0
    assert "10 videos (10 re-encoded, 0 copied)" in capsys.readouterr().out
    shards = shards_of(dst)
    assert len(shards) >= 2 and all(Path(s).stat().st_size <= 20 << 10 for s in shards)
    manifest = json.loads((dst.parent / "train.manifest.json").read_text())
    assert manifest["rows"] == 10 and manifest["samples"]["classes"] == list(CLASSES)
    assert [s["file"] for s in manifest["shards"]] == [Path(s).name for s in shards]

    # The webdataset library reads every sample: an .mp4 and a .cls member under each key.
    seen = {}
    for sample in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
        assert sample["__key__"] not in seen
        seen[sample["__key__"]] = sample
    assert sorted(seen) == sorted(expected)
    for key, sample in seen.items():
        label, frames = expected[key]
        assert int(sample["cls"]) == label
        marks, count, size = keyframes(sample["mp4"])
        assert count == frames  # every frame kept
        if codec() == "libx264":
            assert marks == list(range(0, frames, 4)), key  # a keyframe every 4 frames exactly
        assert min(size) == 32 and size[0] % 2 == 0  # the shorter side made 32, sides even

    # naiad reads them back: each video once, its label, and the frames decode_video says it gave.
    got = read_back(shards)
    assert sorted(got) == sorted(expected)
    for key, (label, clip, numbers) in got.items():
        assert label == expected[key][0]
        assert (frame_numbers(clip.numpy()) == numbers.numpy()).all(), key
        assert int(numbers.max()) <= expected[key][1] - 1


def test_copied_videos_keep_their_bytes_and_samples_per_shard_bounds_the_shards(
        folder: tuple[Path, dict[str, tuple[int, int]]], tmp_path: Path) -> None:
    root, expected = folder
    dst = tmp_path / "copy" / "train.tar"
    result = convert_videos(str(root), str(dst), VideoConvertOptions(samples_per_shard=3))
    assert result.rows == 10 and [s.rows for s in result.shards] == [3, 3, 3, 1]
    assert result.manifest["samples"]["copied"] == 10 and result.manifest["samples"]["videos"] == ["mp4"]
    files = {f"{p.parent.name}/{p.name.replace('.', '_', 1)[:-4]}": p.read_bytes() for p in root.rglob("*.mp4")}
    samples = list(wds.WebDataset(shards_of(dst), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == sorted(expected)  # the listing's order without --shuffle
    for s in samples:
        assert s["mp4"] == files[s["__key__"]]
    got = read_back(shards_of(dst), clip="center")
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in expected.items()}
    # Again without --overwrite: refused, naming the file; with it, replaced.
    with pytest.raises(naiad.errors.ConfigError, match="exists; pass --overwrite"):
        convert_videos(str(root), str(dst))
    again = convert_videos(str(root), str(dst), VideoConvertOptions(overwrite=True))
    assert len(again.shards) == 1 and shards_of(dst) == [str(dst.parent / "train-00000.tar")]


def test_a_flat_folder_has_no_labels_and_a_shared_key_is_made_unique(tmp_path: Path) -> None:
    root = tmp_path / "flat"
    write_video(root / "clip.mp4", 6, gop=4)
    with av.open(str(root / "clip.mkv"), "w") as container:  # another container, the same stem
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((24, 32, 3), 8 * i, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    result = convert_videos(str(root), str(tmp_path / "out" / "flat.tar"))
    samples = list(wds.WebDataset(shards_of(tmp_path / "out" / "flat.tar"), shardshuffle=False, empty_check=False))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples] == [
        ("clip", ["mkv"]), ("clip_mp4", ["mp4"])]
    assert result.manifest["samples"]["classes"] == [] and result.manifest["samples"]["videos"] == ["mkv", "mp4"]


def test_a_bad_video_is_named_or_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "train"
    write_video(root / "a" / "good.mp4", 8, gop=4)
    (root / "a" / "junk.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 junk" * 4)
    dst = tmp_path / "out" / "train.tar"
    assert main(["convert", str(root), str(dst), "--keyframe-interval", "4"]) == 1
    err = capsys.readouterr().err
    assert str(root / "a" / "junk.mp4") in err and "not a video FFmpeg can read" in err and "--on-bad-rows skip" in err
    assert "Traceback" not in err and not shards_of(dst)  # nothing half written
    assert main(["convert", str(root), str(dst), "--keyframe-interval", "4", "--on-bad-rows", "skip"]) == 0
    assert "1 bad video(s) skipped" in capsys.readouterr().out
    manifest = json.loads((dst.parent / "train.manifest.json").read_text())
    assert manifest["rows"] == 1 and manifest["bad_rows"] == 1
    assert manifest["bad_row_examples"][0]["key"] == "a/junk"


def test_options_that_do_not_apply_are_refused(folder: tuple[Path, dict[str, tuple[int, int]]], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = folder
    assert main(["convert", str(root), str(tmp_path / "x.tar"), "--decode"]) == 1
    assert "--decode do(es) not apply to videos" in capsys.readouterr().err
    assert main(["convert", str(root), str(tmp_path / "x.parquet")]) == 1
    assert "videos convert to WebDataset tar shards" in capsys.readouterr().err
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    assert main(["convert", str(table), str(tmp_path / "t.parquet"), "--keyframe-interval", "8"]) == 1
    assert "--keyframe-interval apply to videos" in capsys.readouterr().err
    with pytest.raises(naiad.errors.ConfigError, match="`shard_bytes` must be at least"):
        VideoConvertOptions(shard_bytes=1000)


def test_without_pyav_a_reencode_says_how_to_install_it(folder: tuple[Path, dict[str, tuple[int, int]]], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)
    assert main(["convert", str(folder[0]), str(tmp_path / "x.tar"), "--keyframe-interval", "8"]) == 1
    assert "pip install 'naiad[video]'" in capsys.readouterr().err
