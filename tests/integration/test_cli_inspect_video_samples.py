"""``naiad inspect`` of videos inside WebDataset shards (written by the ``webdataset`` library's
ShardWriter) and a Parquet binary column (written by pyarrow): the video members or column are
reported as a video folder is (codec, size, fps, frames, duration, B-frames, keyframe interval,
decode time per clip, advice), from a bounded sample that the report counts (NOTE [ Videos in
samples ] in tools/inspect_video_samples.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from naiad.cli import main
from naiad.tools.sample_media import video_format
from tests.video_data import codec, write_vfr_video, write_video, write_video_shards

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")
H264 = codec() == "libx264"
FRAMES = [40, 48, 56, 64, 72, 80]
"""Frames of the constant-rate videos (25 fps, a keyframe every 100 frames: longer than a clip)."""


def videos(root: Path) -> list[bytes]:
    out = [write_video(root / f"v{i}.mp4", n, width=96, height=72, gop=100).read_bytes() for i, n in enumerate(FRAMES)]
    out.append(write_vfr_video(root / "vfr.mp4", [40, 20, 60] * 12, width=96, height=72).read_bytes())
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("video_shards")
    blobs = videos(root / "videos")
    pattern = write_video_shards(root, blobs, [i % 2 for i in range(len(blobs))], per_shard=2)
    assert pattern.endswith("train-{0000..0003}.tar")
    return pattern


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root = tmp_path_factory.mktemp("video_table")
    data = videos(root / "videos")
    table = pa.table({"clip": pa.array(data, pa.binary()), "name": [f"v{i}" for i in range(len(data))]})
    pq.write_table(table, root / "videos.parquet", row_group_size=3)
    return root / "videos.parquet"


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["inspect", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def video_report(report: dict[str, Any], column: str) -> dict[str, Any]:
    columns = {c["name"]: c for c in report["samples"]["columns"]}
    assert columns[column]["videos"] is not None, columns[column]
    return dict(columns[column]["videos"])


def check_probes(videos: dict[str, Any], inspected: int) -> None:
    assert videos["inspected"] == inspected and videos["samples"] == 7 and len(videos["probes"]) == inspected
    for p in videos["probes"]:
        assert p["error"] is None, p
        assert p["codec"] == ("h264" if H264 else "mpeg4") and (p["width"], p["height"]) == (96, 72)
        assert p["clip_ms"] > 0 and p["decoded_per_clip"] > 0
        if p["variable_rate"]:
            assert p["frames"] == 36 and p["duration_s"] > 0
            continue
        assert p["frames"] in FRAMES and p["fps"] == 25.0 and p["duration_s"] == pytest.approx(p["frames"] / 25)
        if H264:
            assert p["keyframes"] == 1 and p["keyframe_interval"]["mean"] == p["frames"] and p["b_frames"]
    assert videos["totals"]["decoded"] == inspected


def test_shards_report_their_mp4_members_as_a_video_folder_is(shards, capsys):
    report = inspect_json(capsys, shards, "--videos", "7", "--frames", "8", "--stride", "2")
    assert report["reader"] == "read_webdataset" and report["samples"]["extensions"] == {"mp4": 7, "cls": 7}
    videos = video_report(report, "mp4")
    assert videos["clip"] == {"frames": 8, "stride": 2, "span": 15}
    check_probes(videos, 7)
    assert sorted(p["path"].split(": ")[1] for p in videos["probes"]) == [f"clip_{i:03d}.mp4" for i in range(7)]
    assert sum(p["variable_rate"] for p in videos["probes"]) == 1
    if H264:  # one keyframe in 40 to 80 frames: the advice to re-encode, worded for shards
        assert any("column 'mp4': a keyframe every" in n and "--keyframe-interval" in n for n in report["notes"])
    # In words: the probes' table under the column, with the count inspected.
    assert main(["inspect", shards, "--videos", "3"]) == 0
    out = capsys.readouterr().out
    assert "videos: 3 of the 7 inspected" in out and "keyframe every" in out and "ms/clip" in out
    assert "over the 3 that decode" in out and "Traceback" not in out


def test_the_sample_of_videos_is_bounded_by_videos(shards, capsys):
    videos = video_report(inspect_json(capsys, shards, "--videos", "2"), "mp4")
    check_probes(videos, 2)
    assert videos["sampled"] == 2  # only the rows probed were read, not an image sample's 64


def test_a_parquet_column_of_videos_is_found_by_its_magic_number(parquet, capsys):
    report = inspect_json(capsys, str(parquet), "--videos", "4", "--frames", "8")
    videos = video_report(report, "clip")
    check_probes(videos, 4)
    assert all(p["path"].startswith("videos.parquet row ") for p in videos["probes"])
    assert report["samples"]["columns"][0]["formats"] == {"MP4": 4}
    assert report["head"][0]["clip"].startswith("<MP4, ")


def test_video_containers_are_told_by_their_magic_numbers(tmp_path):
    assert video_format(write_video(tmp_path / "a.mkv", 4).read_bytes()) == ("Matroska", "mkv")
    assert video_format(write_video(tmp_path / "a.mp4", 4).read_bytes()) == ("MP4", "mp4")
    assert video_format(b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00") is None  # an AVIF image
    assert video_format(b"\x89PNG\r\n\x1a\n") is None and video_format(b"") is None
