"""naiad.decode_video on variable-frame-rate videos (NOTE [ Variable frame rate ] in
media/video_stream.py), written here with PyAV in MP4 and Matroska with uneven gaps between the
frames' timestamps: frames are numbered by their position in presentation order, so
``video_frames`` equals the frame numbers read back from the pixels for random, centre and
uniform clips; ``fps=`` takes the frame presented at each output time; ``short=`` pads and
loops; and a constant-rate MP4 is decoded without a demux pass, as before."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.media import video_stream
from naiad.media.video import DecodeVideo
from tests.video_data import frame_numbers, write_vfr_video, write_video

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")

GAPS_MS = [40, 20, 20, 80, 33, 67, 40, 100, 20, 40, 10, 50]
"""Milliseconds each frame is shown: the average rate (about 26 fps) numbers these frames wrong."""


def gaps(frames: int) -> list[int]:
    return [GAPS_MS[i % len(GAPS_MS)] for i in range(frames)]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("vfr")
    out = {f"{ext}{n}": write_vfr_video(root / f"v{n}.{ext}", gaps(n)).read_bytes()
           for ext in ("mp4", "mkv") for n in (30, 64)}
    out["short"] = write_vfr_video(root / "short.mp4", [20, 80, 40, 60, 20]).read_bytes()
    out["cfr"] = write_video(root / "cfr.mp4", 30).read_bytes()
    out["cfr_mkv"] = write_video(root / "cfr.mkv", 30).read_bytes()
    return out


def decode(transform: DecodeVideo, *values: bytes, keys: list[int] | None = None) -> dict[str, Any]:
    batch = {"video": list(values), "__index__": np.array(keys or range(len(values)), np.int64)}
    return transform(batch)


def delivered(out: dict[str, Any], wrap: bool = False) -> np.ndarray:
    """The ``_frames`` column, checked against the frame numbers the pixels say (modulo 32, where
    the red wraps, with ``wrap``)."""
    video = out["video"]
    pixels = video.numpy() if isinstance(video, torch.Tensor) else np.stack([v.numpy() for v in video])
    numbers: np.ndarray = out["video_frames"].numpy()
    assert (frame_numbers(pixels) == (numbers % 32 if wrap else numbers)).all(), (frame_numbers(pixels), numbers)
    return numbers


def presented(frames: int, seconds: Fraction) -> int:
    """The frame on screen ``seconds`` after the first: the last shown at or before it."""
    shown = np.cumsum([0, *gaps(frames)[:-1]])
    return int(np.searchsorted(shown, seconds * 1000, side="right")) - 1


@pytest.mark.parametrize("name", ["mp430", "mkv30"])
def test_frames_are_numbered_by_their_position_for_random_center_and_uniform_clips(videos, name):
    data = videos[name]
    for clip, k in (("random", 1), ("center", 1), ("uniform", 3)):
        transform = naiad.decode_video("video", frames=6, stride=2, size=16, crop="center", clip=clip,
                                       clips_per_video=k, seed=5)
        numbers = delivered(decode(transform, data, data, data, keys=[0, 1, 2])).reshape(3, k, 6)
        # Consecutive positions, every second frame: no collision, no skip, inside the video.
        assert (np.diff(numbers, axis=-1) == 2).all() and numbers.min() >= 0 and numbers.max() < 30, numbers
        if clip == "center":
            assert numbers[0, 0].tolist() == [9, 11, 13, 15, 17, 19]  # (30 - 11) // 2
        if clip == "uniform":
            assert numbers[0, :, 0].tolist() == [0, 10, 19]
    # A clip deep in a longer video: the seek finds the keyframe before it by the table's timestamp.
    transform = naiad.decode_video("video", frames=4, stride=3, clip="uniform", clips_per_video=4, size=16, crop="center")
    numbers = delivered(decode(transform, videos[name.replace("30", "64")]), wrap=True)
    assert numbers[0, :, 0].tolist() == [0, 18, 36, 54]


@pytest.mark.parametrize("name", ["mp4", "mkv"])
def test_fps_takes_the_frame_presented_at_each_output_time(videos, name):
    fps = 12.5  # an output frame every 80 ms: some source frames skipped, some shown twice
    transform = naiad.decode_video("video", frames=5, stride=1, clip="uniform", clips_per_video=3, fps=fps,
                                   size=16, crop="center")
    numbers = delivered(decode(transform, videos[f"{name}64"]), wrap=True)[0]
    step = Fraction(2, 25)
    assert numbers[0].tolist() == [presented(64, i * step) for i in range(5)]  # the first clip starts at 0
    for clip in numbers[1:]:  # the others: frames presented 80 ms apart from some output frame on
        starts = [s for s in range(64) if [presented(64, (s + i) * step) for i in range(5)] == clip.tolist()]
        assert starts, clip
    assert len(set(numbers[0].tolist())) == 5


def test_short_pad_and_loop_on_a_variable_rate_video(videos):
    def frames(short: str, **kwargs: Any) -> list[Any]:
        return delivered(decode(naiad.decode_video("video", short=short, size=8, crop="center", **kwargs),
                                videos["short"])).tolist()

    assert frames("pad", frames=6, stride=2, clip="center") == [[0, 2, 4, 4, 4, 4]]
    assert frames("loop", frames=6, stride=2, clip="center") == [[0, 2, 4, 1, 3, 0]]
    # 5 frames over 220 ms at 25 fps: a timeline of 6 frames, frame i the one shown at 40 i ms.
    assert frames("pad", frames=4, stride=2, clip="center", fps=25.0) == [[0, 1, 3, 4]]
    assert frames("loop", frames=4, stride=2, clip="center", fps=25.0) == [[0, 1, 3, 0]]


def test_a_constant_rate_mp4_is_numbered_from_its_header_without_a_demux(videos, monkeypatch):
    calls: list[int] = []
    real = video_stream._demux
    monkeypatch.setattr(video_stream, "_demux", lambda *a: calls.append(1) or real(*a))
    transform = naiad.decode_video("video", frames=4, stride=2, clip="uniform", clips_per_video=2, size=16,
                                   crop="center")
    assert delivered(decode(transform, videos["cfr"]))[0].tolist() == [[0, 2, 4, 6], [23, 25, 27, 29]]
    assert calls == []  # the sample table said constant: no packet read beyond the decode's
    delivered(decode(transform, videos["mp430"], videos["cfr_mkv"]))
    assert len(calls) == 2  # a variable MP4 and any Matroska: one demux pass each


def test_the_numbering_said_by_the_stream(videos):
    import io

    import av

    def times(name: str) -> video_stream.FrameTimes:
        with av.open(io.BytesIO(videos[name])) as container:
            return video_stream.frame_times(container, container.streams.video[0])

    assert not times("cfr").variable and times("cfr").count == 30
    assert not times("cfr_mkv").variable and times("cfr_mkv").count == 30  # demuxed, on the rate's grid
    vfr = times("mkv30")
    assert vfr.variable and vfr.count == 30 and vfr.timestamps is not None
    assert vfr.timestamps.ticks.tolist() == np.cumsum([0, *gaps(30)[:-1]]).tolist()  # milliseconds
    assert [vfr.number(int(p), -1) for p in vfr.pts] == list(range(30))  # type: ignore[union-attr]
