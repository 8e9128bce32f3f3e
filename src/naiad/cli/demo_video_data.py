"""Built-in videos for ``naiad demo video``: an action-recognition-shaped folder made with PyAV on
first use and cached (nothing is downloaded).

Each class is a motion: a bright square crosses a noisy background leftwards, rightwards, upwards
or downwards, at a random speed, size, colour and height, so no single frame tells the class
and a model must compare frames, as an action recogniser does. The videos are short H.264
(MPEG-4 part 2 where PyAV's FFmpeg lacks libx264) at 25 fps with a keyframe every 25 frames, in
one sub-folder per class, as UCF101's and Kinetics' folders are laid out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from naiad.cli.demo_data import cached_folder
from naiad.tools.video_files import pyav_for

__all__ = ["ACTION_CLASSES", "ACTION_FPS", "ACTION_SIZE", "action_folder", "action_frames"]

ACTION_CLASSES = ("move_down", "move_left", "move_right", "move_up")
"""The motions, in label order (sorted, as ``read_videos`` and ``ImageFolder`` number them)."""

ACTION_SIZE = (96, 72)
"""Each video's width and height."""

ACTION_FPS = 25
_DIRECTIONS = {"move_down": (0, 1), "move_left": (-1, 0), "move_right": (1, 0), "move_up": (0, -1)}


def action_frames(label: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """One video's RGB frames, ``uint8 [frames, H, W, 3]``: a square moving as ``ACTION_CLASSES[label]``."""
    width, height = ACTION_SIZE
    dx, dy = _DIRECTIONS[ACTION_CLASSES[label]]
    side = int(rng.integers(12, 21))
    colour = rng.integers(150, 256, 3)
    # Start on the side it leaves from and cross most of the frame within the video.
    x0 = width / 2 - dx * (width / 2 - side) + (0 if dx else rng.uniform(-width / 4, width / 4))
    y0 = height / 2 - dy * (height / 2 - side) + (0 if dy else rng.uniform(-height / 4, height / 4))
    speed = rng.uniform(0.6, 1.0) * (width if dx else height) / frames
    background = rng.integers(20, 70, (height, width, 3)).astype(np.uint8)
    out = np.empty((frames, height, width, 3), np.uint8)
    for t in range(frames):
        frame = background.copy()
        x, y = int(x0 + dx * speed * t - side / 2), int(y0 + dy * speed * t - side / 2)
        frame[max(0, y):max(0, y + side), max(0, x):max(0, x + side)] = colour
        out[t] = frame
    return out


def _write_video(path: Path, pixels: np.ndarray) -> None:
    av = pyav_for("`naiad demo video`")
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=ACTION_FPS)
        stream.width, stream.height, stream.pix_fmt = ACTION_SIZE[0], ACTION_SIZE[1], "yuv420p"
        stream.codec_context.gop_size = ACTION_FPS
        if codec == "libx264":
            stream.options = {"crf": "23", "preset": "veryfast", "x264-params": f"keyint={ACTION_FPS}:scenecut=0"}
        for frame in pixels:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))


def _write_split(root: Path, videos: int, rng: np.random.Generator) -> None:
    """``videos`` videos under ``root/<class>/<number>.mp4``, the classes in turn, 40-64 frames each."""
    for name in ACTION_CLASSES:
        (root / name).mkdir(parents=True)
    for i in range(videos):
        label = i % len(ACTION_CLASSES)
        frames = int(rng.integers(40, 65))
        _write_video(root / ACTION_CLASSES[label] / f"{i:04d}.mp4", action_frames(label, frames, rng))


def action_folder(videos: int = 48, test_videos: int = 16, seed: int = 0) -> Path:
    """An action-recognition-shaped video folder, made once in the cache and reused: its path.

    ``<path>/train`` holds ``videos`` videos and ``<path>/test`` ``test_videos``, each in one
    sub-folder per class (``ACTION_CLASSES``), as ``naiad.read_videos`` reads them. Needs PyAV
    (``naiad[video]``).

    Raises:
        ConfigError: PyAV is not installed.
    """
    pyav_for("`naiad demo video`")
    def write(tmp: Path) -> None:
        rng = np.random.default_rng(seed)
        _write_split(tmp / "train", videos, rng)
        _write_split(tmp / "test", test_videos, rng)

    return cached_folder(f"actions-{videos}-{test_videos}-{seed}", write)
