"""Which frames a clip takes: :func:`naiad.decode_video`'s options and its clip plan, a pure
function of the video's frame count and frame rate (or, for a variable-rate video, its frames'
timestamps), the options and the sample's draws (NOTE [ Clip decoding ] in ``media/video.py``;
NOTE [ Clip timelines ] here). Nothing here decodes.

NOTE [ Clip timelines ]
A clip's ``frames`` and ``stride`` count frames of a timeline: the video's own frames, numbered
0, 1, ... in presentation order, or with ``fps=`` a resampled one, whose frame ``i`` is the
source frame nearest ``i / fps`` seconds. Source frame ``n`` is shown at ``n / rate`` seconds
(``rate`` the stream's average frame rate, as frames are numbered), so ``i`` maps to
``floor(i * rate / fps + 1/2)`` (a tie goes to the later frame), computed with exact fractions:
``rate`` is a fraction in the container and ``fps`` is read as the nearest fraction with a
denominator up to 10**6 (29.97 is 2997/100), so the same clip comes on any machine. The
resampled timeline holds every ``i`` that maps inside the video: ``ceil((count - 1/2) * fps /
rate)`` frames. Fewer frames per second than the source skips source frames (a clip covers
more seconds); more repeats them (each source frame delivered as often as the timeline meets
it), and ``_frames`` says which source frame each is.

A variable-rate video (NOTE [ Variable frame rate ] in ``media/video_stream.py``) has no rate to
map through: its frames are numbered by position and known by their timestamps (``Timestamps``:
ticks from the first frame's, and when the last stops being shown). Timeline frame ``i`` is
then the frame presented at ``i / fps`` seconds after the first: the last whose timestamp is at
or before it (``floor`` of the time in ticks, then ``searchsorted``, exact integers), and the
timeline holds the ``ceil(duration * fps)`` frames that start before the video ends.

On that timeline the clip's start is placed (``clip=``), its frames taken every ``stride``, and a
timeline shorter than the clip's span handled as ``short=`` says: ``"pad"`` repeats the last
frame, ``"loop"`` wraps to frame 0 and keeps the stride going (frame ``j`` of the clip is ``(start
+ j * stride) mod length``), ``"skip"`` refuses the video before any frame is decoded (a failed
sample: a DecodeError naming it, or a ledgered bad row). Then each timeline frame is mapped to
its source frame, which is what is decoded and what ``_frames`` reports.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from naiad.media import geometry
from naiad.media.image_options import ImageOptions

__all__ = ["CLIPS", "FLIP_DRAW", "SHORTS", "Timestamps", "VideoOptions", "clip_draws", "clip_starts", "decode_runs",
           "fps_fraction", "presented_frames", "resampled_count", "source_frames", "timed_count", "wanted_frames"]

CLIPS = ("random", "center", "uniform")
"""Where a clip starts (``clip=``)."""

SHORTS = ("pad", "loop", "skip")
"""What a video shorter than a clip does (``short=``)."""

FLIP_DRAW = geometry.RRC_DRAWS
"""A sample's draws: the crop's (``geometry.RRC_DRAWS``), the flip's (this index), then one per
clip's start."""

FPS_DENOMINATOR = 10**6
"""The largest denominator ``fps`` is read with (NOTE [ Clip timelines ])."""


@dataclass(frozen=True)
class VideoOptions:
    """What :func:`naiad.decode_video` does to each video (see its arguments); ``image`` holds
    the geometry, as :func:`naiad.decode_images` would place each frame."""

    frames: int = 16
    stride: int = 2
    clip: str = "random"
    clips_per_video: int = 1
    short: str = "pad"
    fps: float | None = None
    image: ImageOptions = dataclasses.field(default_factory=ImageOptions)

    @property
    def random(self) -> bool:
        """Whether samples draw random numbers (a random clip, crop or flip)."""
        return self.clip == "random" or self.image.random

    @property
    def span(self) -> int:
        """Timeline frames from a clip's first to its last, both included."""
        return (self.frames - 1) * self.stride + 1


@dataclass(frozen=True)
class Timestamps:
    """A variable-rate video's frames in time (NOTE [ Clip timelines ]).

    Attributes:
        ticks: each frame's presentation time from the first frame's, in presentation order
            (int64, sorted, ``ticks[0] == 0``).
        time_base: the ticks' unit, in seconds.
        end: the tick at which the last frame stops being shown.
    """

    ticks: np.ndarray
    time_base: Fraction
    end: int


def clip_draws(options: VideoOptions) -> int:
    """How many uniforms a sample draws: the crop's, the flip's, one per clip."""
    return FLIP_DRAW + 1 + options.clips_per_video


def clip_starts(count: int, options: VideoOptions, draws: np.ndarray | None) -> list[int]:
    """The first timeline frame of each clip on a timeline of ``count`` frames (NOTE [ Clip
    decoding ] in ``media/video.py``): random (keyed), centre or uniformly spaced; 0 where no
    clip fits."""
    room = max(count - options.span, 0)
    k = options.clips_per_video
    if options.clip == "random":
        assert draws is not None  # drawn whenever the options are random
        return [min(int(u * (room + 1)), room) for u in draws[FLIP_DRAW + 1 : FLIP_DRAW + 1 + k]]
    if options.clip == "uniform" and k > 1:
        return [int(round(j * room / (k - 1))) for j in range(k)]
    return [room // 2] * k


def fps_fraction(fps: float) -> Fraction:
    """``fps`` as the exact fraction the timeline is computed with (NOTE [ Clip timelines ])."""
    return Fraction(fps).limit_denominator(FPS_DENOMINATOR)


def resampled_count(count: int, rate: Fraction, fps: Fraction) -> int:
    """Frames of the ``fps`` timeline of a video of ``count`` frames at ``rate``: the ``i`` whose
    nearest source frame, ``floor(i * rate / fps + 1/2)``, is below ``count``."""
    ratio = rate / fps
    # i * ratio + 1/2 < count  <=>  i < (count - 1/2) / ratio; the count of such i >= 0 is the ceiling.
    return max(math.ceil((count - Fraction(1, 2)) / ratio), 0)


def source_frames(timeline: np.ndarray, rate: Fraction, fps: Fraction) -> np.ndarray:
    """The source frame nearest each timeline frame's time (``floor(i * rate / fps + 1/2)``), in
    exact integers (a clip's few frames: no per-row loop)."""
    ratio = rate / fps
    p, q = ratio.numerator, ratio.denominator
    # Python ints: p and q can be large enough (a guessed rate's fraction) to overflow int64.
    mapped = [(2 * i * p + q) // (2 * q) for i in timeline.ravel().tolist()]
    return np.array(mapped, np.int64).reshape(timeline.shape)


def timed_count(times: Timestamps, fps: Fraction) -> int:
    """Frames of the ``fps`` timeline of a variable-rate video: the ``i`` whose time ``i / fps``
    falls before the video's end, ``ceil(end * time_base * fps)`` (at least 1)."""
    return max(math.ceil(times.end * times.time_base * fps), 1)


def presented_frames(timeline: np.ndarray, times: Timestamps, fps: Fraction) -> np.ndarray:
    """The frame presented at each timeline frame's time ``i / fps`` (NOTE [ Clip timelines ]):
    the last whose timestamp is at or before it."""
    per_tick = 1 / (fps * times.time_base)  # ticks per timeline frame, exact
    p, q = per_tick.numerator, per_tick.denominator
    flat = timeline.ravel()
    if flat.size and int(flat.max()) * p < 2**62:
        at = flat * p // q
    else:  # p too large for int64 (a fine time base at a fraction's rate): Python's integers
        at = np.array([i * p // q for i in flat.tolist()], np.int64)
    found = np.searchsorted(times.ticks, at, side="right") - 1
    return np.maximum(found, 0).astype(np.int64).reshape(timeline.shape)


def wanted_frames(count: int, rate: Fraction | None, options: VideoOptions, draws: np.ndarray | None,
                  times: Timestamps | None = None) -> np.ndarray:
    """The source frame each clip frame is (int64 ``[K, T]``) for a video of ``count`` frames at
    ``rate`` frames per second, or for a variable-rate video at the ``times`` its frames are
    presented (NOTE [ Clip timelines ]).

    Raises:
        ValueError: the video is shorter than a clip with ``short="skip"``, or ``fps`` is given
            and the stream has no frame rate to resample by.
    """
    length = count
    fps = None
    if options.fps is not None:
        fps = fps_fraction(options.fps)
        if times is not None:
            length = timed_count(times, fps)
        elif rate:
            length = resampled_count(count, rate, fps)
        else:
            raise ValueError(f"the video stream has no frame rate to resample to fps={options.fps} by")
    if options.short == "skip" and length < options.span:
        at = "" if fps is None else f" ({length} at fps={options.fps})"
        raise ValueError(
            f"the video has {count} frames{at}, shorter than a clip of {options.span} ({options.frames} frames "
            f"every {options.stride}); short='skip' skips it"
        )
    starts = np.array(clip_starts(length, options, draws), np.int64)
    timeline = starts[:, None] + options.stride * np.arange(options.frames, dtype=np.int64)
    timeline = timeline % length if options.short == "loop" else np.minimum(timeline, length - 1)
    if fps is None:
        return timeline
    if times is not None:
        return presented_frames(timeline, times, fps)
    assert rate is not None  # checked with fps above
    return source_frames(timeline, rate, fps)


def decode_runs(wanted: np.ndarray) -> list[list[int]]:
    """The wanted source frames (``[K, T]``) as sorted runs, one per group of clips that overlap
    or lie within a clip's extent of each other: each run is one seek and one forward decode, so
    K clips spread over a long video do not decode all of it."""
    gap = int(np.max(wanted.max(axis=1) - wanted.min(axis=1))) + 1  # the widest clip, in source frames
    runs: list[list[int]] = []
    for number in np.unique(wanted).tolist():
        if runs and number - runs[-1][-1] <= gap:
            runs[-1].append(number)
        else:
            runs.append([number])
    return runs
