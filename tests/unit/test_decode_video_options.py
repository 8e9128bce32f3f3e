"""naiad.decode_video's short videos (``short="pad" | "loop" | "skip"``), its random crop after a
resize (``resize=N, crop="random", size=S``) and its resampling by timestamps (``fps=``), on real
videos written here with PyAV: every delivered frame number is checked against the frame's
pixels (tests/video_data.py), and each crop against the frame resized whole."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.errors import ConfigError, DecodeError
from naiad.media import clips, geometry
from naiad.media.keys import sample_uniforms
from naiad.media.video import DecodeVideo
from tests.video_data import frame_numbers, write_video

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("videos")
    return {
        "long": write_video(root / "long.mp4", 30).read_bytes(),  # 25 fps
        "short": write_video(root / "short.mp4", 5, width=32, height=24).read_bytes(),
        "seven": write_video(root / "seven.mp4", 7, width=32, height=24).read_bytes(),
        "ntsc": write_video(root / "ntsc.mp4", 32, fps=Fraction(30000, 1001)).read_bytes(),
        "texture": write_video(root / "texture.mp4", 12, width=80, height=48, texture=True).read_bytes(),
    }


def decode(transform: DecodeVideo, *values: bytes, keys: list[int] | None = None) -> dict[str, Any]:
    batch = {"video": list(values), "__index__": np.array(keys or range(len(values)), np.int64),
             "path": [f"v{i}.mp4" for i in range(len(values))]}
    return transform(batch)


def delivered(out: dict[str, Any]) -> list[Any]:
    """The ``_frames`` column, after checking it against the pixels of every delivered frame."""
    video = out["video"]
    pixels = video.numpy() if isinstance(video, torch.Tensor) else np.stack([v.numpy() for v in video])
    assert (frame_numbers(pixels) == out["video_frames"].numpy()).all()
    frames: list[Any] = out["video_frames"].tolist()
    return frames


def test_a_short_video_pads_with_its_last_frame_or_loops_on_from_frame_zero(videos):
    def frames(short: str, **kwargs: Any) -> list[Any]:
        return delivered(decode(naiad.decode_video("video", short=short, size=8, crop="center", **kwargs),
                                videos["short"]))

    assert frames("pad", frames=6, stride=2, clip="center") == [[0, 2, 4, 4, 4, 4]]
    assert frames("loop", frames=6, stride=2, clip="center") == [[0, 2, 4, 1, 3, 0]]  # 6 % 5 = 1: the stride goes on
    assert frames("loop", frames=4, stride=2, clip="random", seed=3) == [[0, 2, 4, 1]]  # no room: the start is 0
    assert frames("loop", frames=3, stride=3, clip="uniform", clips_per_video=2) == [[[0, 3, 1], [0, 3, 1]]]
    # A video the clip fits in is the same whatever `short` says.
    for short in clips.SHORTS:
        assert frames(short, frames=3, stride=2, clip="center") == [[0, 2, 4]]


def test_a_short_video_with_short_skip_is_a_failed_sample_refused_before_decoding(videos, monkeypatch):
    from naiad.media import video

    decoded: list[int] = []
    real = video._frames_at
    monkeypatch.setattr(video, "_frames_at", lambda *a: decoded.append(1) or real(*a))
    transform = naiad.decode_video("video", frames=4, stride=2, clip="random", size=8, crop="center", short="skip",
                                   seed=0)
    with pytest.raises(DecodeError) as info:
        decode(transform, videos["long"], videos["short"], videos["seven"])  # 7 frames: exactly a clip's span
    error = info.value
    assert error.rows == [1] and len(decoded) == 2  # the short video's frames were never decoded
    assert "path 'v1.mp4'" in str(error) and "5 frames, shorter than a clip of 7" in str(error)
    assert "short='skip'" in error.reasons[0]
    assert error.kept is not None and error.kept["path"] == ["v0.mp4", "v2.mp4"]
    assert error.kept["video_frames"][1].tolist() == [0, 2, 4, 6]
    assert (frame_numbers(error.kept["video"].numpy()) == error.kept["video_frames"].numpy()).all()


def test_fps_resamples_the_clip_by_timestamps_and_frames_gives_source_numbers(videos):
    def frames(video: str, fps: float, **kwargs: Any) -> list[Any]:
        return delivered(decode(naiad.decode_video("video", fps=fps, size=8, crop="center", **kwargs), videos[video]))

    # 25 fps read at 12.5: every other source frame; 15 timeline frames, the centre clip starts at 5.
    assert frames("long", 12.5, frames=4, stride=1, clip="center") == [[10, 12, 14, 16]]
    # At 10 fps, timeline frame i is source frame floor(2.5 i + 1/2): a tie goes to the later frame.
    assert frames("long", 10, frames=4, stride=1, clip="uniform", clips_per_video=2) == [[[0, 3, 5, 8], [20, 23, 25, 28]]]
    # At 50 fps each source frame comes twice (the timeline is 59 frames; the centre clip starts at 27).
    assert frames("long", 50, frames=5, stride=1, clip="center") == [[14, 14, 15, 15, 16]]
    # 29.97 fps (30000/1001) read at 15: the source frame nearest i / 15 seconds.
    ntsc = frames("ntsc", 15, frames=5, stride=2, clip="center")
    timeline = int(np.ceil((32 - 0.5) * 15 * 1001 / 30000))
    start = (timeline - 9) // 2
    assert ntsc == [[int(np.floor((start + 2 * j) / 15 * 30000 / 1001 + 0.5)) for j in range(5)]]


def test_fps_on_a_video_shorter_than_the_clip_pads_loops_or_skips_on_its_timeline(videos):
    # 5 frames at 25 fps read at 12.5: a timeline of 3 frames, source frames 0, 2, 4.
    def frames(short: str) -> list[Any]:
        t = naiad.decode_video("video", fps=12.5, frames=5, stride=1, clip="center", short=short)
        return delivered(decode(t, videos["short"]))

    assert frames("pad") == [[0, 2, 4, 4, 4]]
    assert frames("loop") == [[0, 2, 4, 0, 2]]
    with pytest.raises(DecodeError, match=r"5 frames \(3 at fps=12.5\), shorter than a clip of 5"):
        frames("skip")


def test_the_timeline_arithmetic_is_exact():
    rate = Fraction(30000, 1001)
    assert clips.fps_fraction(29.97) == Fraction(2997, 100) and clips.fps_fraction(30000 / 1001) == rate
    for count in (1, 2, 7, 300, 301):
        for fps in (Fraction(1), Fraction(15), Fraction(2997, 100), Fraction(60)):
            n = clips.resampled_count(count, rate, fps)
            mapped = clips.source_frames(np.arange(n + 1), rate, fps)
            assert n >= 1 and mapped[n - 1] <= count - 1 < mapped[n]  # every frame inside, the next outside
            exact = [int((Fraction(i) * rate / fps + Fraction(1, 2)) // 1) for i in range(n)]
            assert mapped[:n].tolist() == exact


def test_a_random_crop_after_a_resize_is_one_keyed_window_of_every_frame_resized(videos):
    # resize=40: the 80x48 frames become 66x40; a random 32x24 box of that, the same for every frame.
    whole = decode(naiad.decode_video("video", frames=3, stride=2, clip="center", resize=40), videos["texture"])
    resized = whole["video"][0]
    assert resized.shape == (3, 3, 40, 66)
    transform = naiad.decode_video("video", frames=3, stride=2, clip="center", resize=40, crop="random",
                                   size=(24, 32), flip=True, seed=9)
    out = decode(transform, *[videos["texture"]] * 8)
    assert out["video"].shape == (8, 3, 3, 24, 32)
    delivered(out)
    boxes = set()
    for key in range(8):
        draws = sample_uniforms(9, 0, key, clips.clip_draws(transform.options))
        placement = geometry.random_crop_placement(80, 48, (66, 40), (24, 32), draws)
        x0, y0, x1, y1 = placement.window  # type: ignore[misc]
        boxes.add((x0, y0))
        expected = resized[:, :, y0:y1, x0:x1]
        if draws[clips.FLIP_DRAW] < 0.5:
            expected = expected.flip(-1)
        assert torch.equal(out["video"][key], expected), key  # FFmpeg's scaler on the same frames: the same pixels
    assert len(boxes) > 4  # the box moves with the sample
    again = decode(transform, videos["texture"], keys=[5])  # another batch, the same sample: the same crop
    assert torch.equal(again["video"][0], out["video"][5])


def test_a_random_crop_larger_than_a_resized_side_is_centred_with_zero_padding_on_that_side(videos):
    # resize=24: 40x24; a 32x32 crop: random across (8 columns to spare), centred down with 4 rows of zeros each side.
    out = decode(naiad.decode_video("video", frames=2, stride=1, clip="center", resize=24, crop="random", size=32,
                                    seed=0), *[videos["texture"]] * 4)["video"]
    assert (out[:, :, :, :4] == 0).all() and (out[:, :, :, 28:] == 0).all()
    assert (out[:, :, 1, 4:28] > 100).all()  # green 128 everywhere inside


def test_bad_short_fps_and_crop_arguments_are_config_errors():
    bad = [
        (dict(short="wrap"), "`short` must be one of \\['pad', 'loop', 'skip'\\], got 'wrap'"),
        (dict(fps=0), "`fps` must be None"),
        (dict(fps=-30.0), "`fps` must be None"),
        (dict(fps=True), "`fps` must be None"),
        (dict(fps="30"), "`fps` must be None"),
        (dict(fps=float("inf")), "`fps` must be None"),
        (dict(size=32, crop="random", resize="stretch"), "`crop='random'` with `resize='stretch'`"),
    ]
    for kwargs, match in bad:
        with pytest.raises(ConfigError, match=match):
            naiad.decode_video("video", **kwargs)  # type: ignore[arg-type]
    options = naiad.decode_video("video", short="loop", fps=24, size=112, resize=128, crop="random").options
    assert options.short == "loop" and options.fps == 24.0 and options.random
