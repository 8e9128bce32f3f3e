"""``naiad inspect`` on videos written with PyAV: a class folder, one file and a glob; the codec,
size, frame rate, frame count and keyframe interval measured from the packets; the decode time
per clip; the advice (a shorter keyframe interval, a smaller size, short videos); and files that
do not decode named with their problem, never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from naiad.cli import main
from naiad.tools.inspect_video import probe_video
from naiad.tools.video_files import is_video_source
from tests.video_data import codec, write_audio_only, write_video

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")
H264 = codec() == "libx264"  # the keyframe interval is exact with x264's scene cuts off


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect") / "train"
    # One long GOP (a single keyframe in 150 frames), short GOPs, a video shorter than a clip.
    write_video(root / "archery" / "a_long_gop.mp4", 150, width=160, height=120, gop=300)
    write_video(root / "archery" / "b_gop8.mp4", 40, width=160, height=120, gop=8)
    write_video(root / "bowling" / "c_short.mp4", 12, width=160, height=120, gop=8)
    write_video(root / "bowling" / "d_gop10.mp4", 60, width=160, height=120, gop=10)
    (root / "bowling" / "e_junk.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video" * 4)
    (root / "cycling").mkdir()
    write_audio_only(root / "cycling" / "f_audio.mp4")
    return root


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["inspect", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(p["path"]).name: p for p in report["probes"]}


def test_folder_reports_each_video_measured_from_its_packets(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = inspect_json(capsys, str(folder), "--videos", "10")
    assert report["videos"] == 6 and report["classes"] == ["archery", "bowling", "cycling"]
    assert report["class_counts"] == [2, 3, 1]
    assert report["clip"] == {"frames": 16, "stride": 2, "span": 31}
    probes = by_name(report)
    assert len(probes) == 6  # fewer than --videos: every one looked at
    for name, frames in (("a_long_gop.mp4", 150), ("b_gop8.mp4", 40), ("c_short.mp4", 12), ("d_gop10.mp4", 60)):
        p = probes[name]
        assert p["error"] is None, p
        assert p["frames"] == frames and p["fps"] == 25.0 and (p["width"], p["height"]) == (160, 120)
        assert p["duration_s"] == pytest.approx(frames / 25)
        assert p["codec"] == ("h264" if H264 else "mpeg4")
        assert p["clip_ms"] > 0 and p["decoded_per_clip"] >= min(frames, 31) - 1
        assert p["label"] == ("archery" if name < "c" else "bowling")
    if H264:
        assert probes["a_long_gop.mp4"]["keyframes"] == 1
        assert probes["a_long_gop.mp4"]["keyframe_interval"] == {"mean": 150.0, "max": 150.0}
        assert probes["b_gop8.mp4"]["keyframes"] == 5 and probes["b_gop8.mp4"]["keyframe_interval"]["mean"] == 8.0
        assert probes["d_gop10.mp4"]["keyframe_interval"] == {"mean": 10.0, "max": 10.0}
        assert probes["b_gop8.mp4"]["b_frames"]
        # A clip of the long GOP decodes from frame 0 to its last frame: more than it keeps.
        assert probes["a_long_gop.mp4"]["decoded_per_clip"] > 31
    t = report["totals"]
    assert t["decoded"] == 4 and t["failed"] == 2 and t["epoch_s"] > 0


def test_files_that_do_not_decode_are_named_with_their_problem(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probes = by_name(inspect_json(capsys, str(folder), "--videos", "10"))
    assert "not a video FFmpeg can read" in probes["e_junk.mp4"]["error"]
    assert "no video stream" in probes["f_audio.mp4"]["error"]
    assert main(["inspect", str(folder), "--videos", "10"]) == 0
    out, err = capsys.readouterr()
    assert "bowling/e_junk.mp4" in out and "does not decode: not a video FFmpeg can read" in out
    assert "cycling/f_audio.mp4" in out and "no video stream" in out
    assert "2 of the 6 videos looked at do not decode" in out
    assert "Traceback" not in out + err


def test_the_advice_names_the_convert_that_would_stream_faster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "long"
    for k in range(3):
        write_video(root / f"v{k}.mp4", 120, width=160, height=120, gop=250)
    write_video(root / "v3.mp4", 20, width=160, height=120, gop=250)
    assert main(["inspect", str(root), "--max-size", "48"]) == 0
    out = capsys.readouterr().out
    if H264:
        assert "is much longer than a clip (31 frames)" in out
        assert f"naiad convert {root}" in out and "--keyframe-interval 25" in out  # about a second at 25 fps
    assert "--max-size 48" in out  # 120p against 48: more than twice
    assert "1 of the 4 videos looked at are shorter than a clip" in out
    # With short GOPs and a training size near the videos', nothing to change.
    short = tmp_path / "short"
    write_video(short / "s.mp4", 60, width=64, height=48, gop=8)
    assert main(["inspect", str(short / "s.mp4"), "--frames", "8", "--stride", "2"]) == 0
    out = capsys.readouterr().out
    assert "1 video(s)" in out and "a clip: 8 frames every 2 (15 frames" in out
    assert "note: nothing to change" in out


def test_one_file_and_a_glob_are_inspected_as_videos(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = inspect_json(capsys, str(folder / "archery" / "b_gop8.mp4"))
    assert one["videos"] == 1 and one["classes"] == [] and len(one["probes"]) == 1
    assert one["probes"][0]["frames"] == 40
    many = inspect_json(capsys, str(folder / "*" / "[a-d]_*.mp4"), "--videos", "2")
    assert many["videos"] == 4 and len(many["probes"]) == 2  # spread over the listing: the first and last
    assert [Path(p["path"]).name for p in many["probes"]] == ["a_long_gop.mp4", "d_gop10.mp4"]


def test_probe_never_raises_for_a_truncated_video(tmp_path: Path) -> None:
    whole = write_video(tmp_path / "whole.mp4", 40, gop=8).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: len(whole) // 3])
    probe = probe_video(str(cut))
    assert probe.error is not None and probe.error  # the problem in words
    assert probe_video(str(tmp_path / "missing.mp4")).error.startswith("cannot read the file")


def test_video_sources_are_told_from_image_folders_and_tables(folder: Path, tmp_path: Path) -> None:
    assert is_video_source(str(folder)) and is_video_source(folder / "archery" / "b_gop8.mp4")
    assert is_video_source(str(folder / "*" / "*.mp4")) and is_video_source(str(tmp_path / "absent.MKV"))
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    (images / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert not is_video_source(str(tmp_path / "images"))
    assert not is_video_source("data/*.parquet") and not is_video_source("s3://bucket/t-*.parquet")


def test_without_pyav_inspect_says_how_to_install_it(folder: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    assert main(["inspect", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "naiad inspect: error:" in err and "pip install 'naiad[video]'" in err and "Traceback" not in err
