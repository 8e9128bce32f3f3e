"""``naiad convert --keyframe-interval`` keeps a video's audio (NOTE [ Re-encoded audio ] in
tools/video_encode.py): AAC copied packet for packet, PCM (which MP4 does not hold as it is)
encoded to AAC, about as long as before; a video without audio stays without; and a
variable-frame-rate video keeps its timestamps, its frames read back by their numbers. Videos
written here with PyAV, the shards read with the ``webdataset`` library."""

from __future__ import annotations

import glob
import io
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.cli import main
from tests.video_data import codec, frame_numbers, write_vfr_video, write_video

av = pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")
wds = pytest.importorskip("webdataset", reason="the shard tests read shards with webdataset (pip install 'naiad[test]')")

pytestmark = pytest.mark.timeout(300)

GAPS_MS = [40, 20, 20, 80, 33, 67, 40, 100, 20, 40] * 3
"""The variable-rate video's frames: 30, shown for these milliseconds each (1.38 s)."""


def streams(data: bytes) -> dict[str, Any]:
    """What a video's bytes hold: per stream type, its codec, duration (s), packets' payloads,
    and the video's keyframes' frame numbers and presentation times (ms)."""
    out: dict[str, Any] = {}
    with av.open(io.BytesIO(data)) as container:
        for stream in container.streams:
            packets = [p for p in container.demux(stream) if p.size]
            container.seek(0)
            seconds = float(stream.duration * stream.time_base) if stream.duration else float(
                sum(p.duration for p in packets) * stream.time_base)
            out[stream.type] = {"codec": stream.codec_context.name, "seconds": seconds,
                                "payloads": [bytes(p) for p in packets]}
            if stream.type == "video":
                pts = sorted(p.pts for p in packets)
                keys = {p.pts for p in packets if p.is_keyframe}
                out["keyframes"] = [i for i, t in enumerate(pts) if t in keys]
                out["times_ms"] = [round(float(t * stream.time_base) * 1000) for t in pts]
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bytes, bytes]]:
    """key -> (the source's bytes, the member's bytes) of a folder converted with a keyframe every 4 frames."""
    root = tmp_path_factory.mktemp("audio") / "train"
    write_video(root / "aac.mp4", 50, audio="aac")
    write_video(root / "pcm.mkv", 40, audio="pcm_s16le")
    write_video(root / "silent.mp4", 30)
    write_vfr_video(root / "vfr.mp4", GAPS_MS, audio="aac")
    dst = root.parent / "shards" / "train.tar"
    assert main(["convert", str(root), str(dst), "--keyframe-interval", "4", "--crf", "4"]) == 0
    shards = sorted(glob.glob(str(dst.parent / "train-*.tar")))
    members = {s["__key__"]: s["mp4"] for s in wds.WebDataset(shards, shardshuffle=False, empty_check=False)}
    sources = {p.stem: p.read_bytes() for p in root.iterdir()}
    assert sorted(members) == sorted(sources)
    return {key: (sources[key], members[key]) for key in members}


@pytest.mark.skipif(codec() != "libx264", reason="the keyframe interval is exact with libx264")
@pytest.mark.parametrize("key", ["aac", "pcm", "silent", "vfr"])
def test_the_reencoded_video_has_the_keyframe_interval(converted, key):
    before, after = (streams(data) for data in converted[key])
    assert after["video"]["codec"] == "h264"
    assert after["keyframes"] == list(range(0, len(after["times_ms"]), 4))
    assert len(after["times_ms"]) == len(before["times_ms"])  # every frame kept


def test_aac_audio_is_copied_as_it_is(converted):
    before, after = (streams(data) for data in converted["aac"])
    assert after["audio"]["codec"] == "aac"
    assert after["audio"]["payloads"] == before["audio"]["payloads"]  # a remux: the same packets
    assert after["audio"]["seconds"] == pytest.approx(before["audio"]["seconds"], abs=0.03)


def test_audio_that_mp4_does_not_hold_is_encoded_to_aac(converted):
    before, after = (streams(data) for data in converted["pcm"])
    assert before["audio"]["codec"] == "pcm_s16le" and after["audio"]["codec"] == "aac"
    assert after["audio"]["seconds"] == pytest.approx(40 / 25, abs=0.05)  # as long as the video


def test_a_video_without_audio_stays_without(converted):
    assert "audio" not in streams(converted["silent"][1])


def test_a_variable_rate_video_keeps_its_timestamps_and_frame_numbers(converted):
    source, member = converted["vfr"]
    before, after = streams(source), streams(member)
    assert after["times_ms"] == before["times_ms"] == np.cumsum([0, *GAPS_MS[:-1]]).tolist()
    assert after["audio"]["seconds"] == pytest.approx(sum(GAPS_MS) / 1000, abs=0.03)
    decode = naiad.decode_video("video", frames=6, stride=2, size=16, crop="center", clip="uniform", clips_per_video=2)
    out = decode({"video": [member], "__index__": np.array([0], np.int64)})
    assert out["video_frames"][0].tolist() == [[0, 2, 4, 6, 8, 10], [19, 21, 23, 25, 27, 29]]
    assert (frame_numbers(out["video"].numpy()) == out["video_frames"].numpy()).all()
