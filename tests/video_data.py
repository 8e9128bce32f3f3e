"""Small real videos for the video tests, written with PyAV: frame ``i`` of a video is filled with
red ``(i * STEP) % 256`` and green ``GREEN[kind]``, so a test reads each delivered frame's number
back from its pixels (within a lossy codec's error, well under STEP / 2)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

STEP = 8
"""Red levels between consecutive frames: 32 frames before the value wraps."""


def codec() -> str:
    """H.264 (libx264, with B-frames) where PyAV's FFmpeg has it, else MPEG-4 part 2."""
    import av

    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


def write_video(path: Path, frames: int, *, width: int = 64, height: int = 48, fps: int | Fraction = 25, gop: int = 8,
                green: int = 128, texture: bool = False) -> Path:
    """A video of ``frames`` frames, keyframe every ``gop`` frames, each frame's number in its red;
    ``texture``: blue a ramp across and down (the same in every frame), so crops at different
    places differ."""
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
    return path


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


def frame_numbers(clip: np.ndarray) -> np.ndarray:
    """Each frame's number as its red says (``clip``: ``[..., T, 3, H, W]`` uint8), assuming no
    wrap: the centre pixel's red (plus READ_BIAS) over STEP, rounded."""
    red = clip[..., 0, clip.shape[-2] // 2, clip.shape[-1] // 2].astype(np.float64)
    return np.floor((red + READ_BIAS) / STEP + 0.5).astype(np.int64)
