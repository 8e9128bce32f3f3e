"""Small real videos for the video tests, written with PyAV: frame ``i`` of a video is filled with
red ``(i * STEP) % 256`` and green ``GREEN[kind]``, so a test reads each delivered frame's number
back from its pixels (within a lossy codec's error, well under STEP / 2)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

STEP = 8
"""Red levels between consecutive frames: 32 frames before the value wraps."""


def codec() -> str:
    """H.264 (libx264, with B-frames) where PyAV's FFmpeg has it, else MPEG-4 part 2."""
    import av

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def write_video(path: Path, frames: int, *, width: int = 64, height: int = 48, fps: int | Fraction = 25, gop: int = 8,
                green: int = 128, texture: bool = False, audio: str | None = None) -> Path:
    """A video of ``frames`` frames, keyframe every ``gop`` frames, each frame's number in its red;
    ``texture``: blue a ramp across and down (the same in every frame), so crops at different
    places differ; ``audio``: an audio stream of that codec (``"aac"``, ``"pcm_s16le"``...) as
    long as the video, a 440 Hz tone in stereo at 44.1 kHz."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    name = codec()
    with av.open(str(path), "w") as container:
        stream = container.add_stream(name, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        if name == "libx264":
            stream.options = {"bf": "2", "crf": "8", "preset": "ultrafast",
                              "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
        else:
            stream.bit_rate = 20_000_000  # MPEG-4 at its default rate skips flat frames' small changes
        sound = None if audio is None else add_tone(container, audio)
        for i in range(frames):
            pixels = np.zeros((height, width, 3), np.uint8)
            pixels[:, :, 0] = (i * STEP) % 256
            pixels[:, :, 1] = green
            if texture:
                pixels[:, :, 2] = np.arange(width)[None, :] * 160 // width + np.arange(height)[:, None] * 90 // height
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            write_tone(container, sound, seconds=float(frames / Fraction(fps)))
    return path


def add_tone(container: Any, name: str, rate: int = 44100) -> Any:
    """A stereo ``name`` audio stream of ``container`` at ``rate`` (added before anything is muxed)."""
    stream = container.add_stream(name, rate=rate)
    stream.layout = "stereo"
    return stream


def write_tone(container: Any, stream: Any, *, seconds: float) -> None:
    """``seconds`` of a 440 Hz stereo tone into ``stream`` of ``container``."""
    import av

    rate = stream.codec_context.sample_rate
    formats = stream.codec_context.codec.audio_formats
    resampler = av.AudioResampler(format=formats[0].name if formats else "s16", layout="stereo", rate=rate,
                                  frame_size=stream.codec_context.frame_size or 1024)
    samples = int(round(seconds * rate))
    wave = (0.2 * np.sin(2 * np.pi * 440 * np.arange(samples) / rate)).astype(np.float32)
    for lo in range(0, samples, 1024):
        part = np.ascontiguousarray(np.stack([wave[lo: lo + 1024]] * 2))
        frame = av.AudioFrame.from_ndarray(part, format="fltp", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = rate, lo, Fraction(1, rate)
        for chunk in resampler.resample(frame):
            container.mux(stream.encode(chunk))
    for chunk in resampler.resample(None):
        container.mux(stream.encode(chunk))
    container.mux(stream.encode(None))


def write_audio_only(path: Path, *, empty_video: bool = False) -> Path:
    """An ``.mp4`` holding one second of silence and no video stream (``empty_video``: a video
    stream with no frames beside it)."""
    import av

    with av.open(str(path), "w") as container:
        if empty_video:
            video = container.add_stream("mpeg4", rate=25)
            video.width, video.height, video.pix_fmt = 32, 24, "yuv420p"
        stream = container.add_stream("aac", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for k in range(16):
            frame.pts = k * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


READ_BIAS = 1.5
"""Red levels added before rounding: the colour conversions (RGB to limited-range YUV 4:2:0 when
written, back when decoded, FFmpeg's scaler when resized) read these frames' red 0 to 4 levels
low (measured: -4 to +1 through the scaler, -3 to 0 without), so the reading is centred on that
range and a frame's number is read right from 5.5 levels low to 2.5 high."""


def write_video_shards(root: Path, blobs: Sequence[bytes], labels: Sequence[int], per_shard: int) -> str:
    """``blobs`` as ``clip_000.mp4`` + ``.cls`` samples in tar shards written by webdataset's own
    ShardWriter under ``root``, ``per_shard`` a shard; the shards' brace pattern."""
    import pytest

    wds = pytest.importorskip("webdataset")
    with wds.ShardWriter(str(root / "train-%04d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i, (data, label) in enumerate(zip(blobs, labels, strict=True)):
            sink.write({"__key__": f"clip_{i:03d}", "mp4": data, "cls": label})
    count = -(-len(blobs) // per_shard)
    assert len(list(root.glob("train-*.tar"))) == count
    return str(root / f"train-{{0000..{count - 1:04d}}}.tar")


def frame_numbers(clip: np.ndarray) -> np.ndarray:
    """Each frame's number as its red says (``clip``: ``[..., T, 3, H, W]`` uint8), assuming no
    wrap: the centre pixel's red (plus READ_BIAS) over STEP, rounded."""
    red = clip[..., 0, clip.shape[-2] // 2, clip.shape[-1] // 2].astype(np.float64)
    return np.floor((red + READ_BIAS) / STEP + 0.5).astype(np.int64)


def write_vfr_video(path: Path, gaps_ms: list[int], *, width: int = 64, height: int = 48, gop: int = 8,
                    audio: str | None = None) -> Path:
    """A variable-frame-rate video (the container by ``path``'s suffix: ``.mp4``, ``.mkv``...):
    frame ``i`` shown at ``sum(gaps_ms[:i])`` milliseconds, and lasting ``gaps_ms[i]``, its
    number in its red as :func:`write_video`'s; B-frames and a keyframe every ``gop`` frames
    where libx264 is; ``audio``: a tone as long, as :func:`write_video`'s."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    name = codec()
    base = Fraction(1, 1000)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(name, rate=25)  # a nominal rate: the timestamps say otherwise
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = stream.codec_context.time_base = base
        stream.codec_context.gop_size = gop
        if name == "libx264":
            stream.options = {"bf": "2", "crf": "8", "preset": "ultrafast",
                              "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
        else:
            stream.bit_rate = 20_000_000
        sound = None if audio is None else add_tone(container, audio)
        pts = 0
        for i, gap in enumerate(gaps_ms):
            pixels = np.zeros((height, width, 3), np.uint8)
            pixels[:, :, 0] = (i * STEP) % 256
            pixels[:, :, 1] = 128
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base, frame.duration = pts, base, gap
            for packet in stream.encode(frame):
                container.mux(packet)
            pts += gap
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            write_tone(container, sound, seconds=sum(gaps_ms) / 1000)
    return path
