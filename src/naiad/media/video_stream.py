"""A video's container opened on one thread (``opened_video``), and how its stream's frames are
counted, numbered and found: by the average frame rate where the rate is constant, by the
packets' own timestamps where it is not (NOTE [ Variable frame rate ]). Nothing here decodes a
frame.

NOTE [ Variable frame rate ]
Frames are numbered 0, 1, ... in presentation order (NOTE [ Clip decoding ] in
``media/video.py``). A constant-rate stream numbers a frame by its timestamp times the average
frame rate, rounded, with no table. A variable-rate stream (a phone's recording, a screen
capture) cannot: its timestamps are not on one grid, so numbers by the average rate collide or
skip, and ``_frames`` would not say which frame was delivered. Such a stream's frames are
numbered by their position among the sorted presentation timestamps of its packets, read by a
demux pass (packets only: no pixel is decoded). A frame ``n`` is then found by seeking to the
keyframe at or before timestamp ``pts[n]`` and decoding to the last frame wanted; a decoded
frame's number is its timestamp's position in the table (``searchsorted``). With ``fps=`` the
timeline's frame ``i`` is the frame presented at ``i / fps`` seconds after the first frame's
timestamp: the last whose timestamp is at or before it (NOTE [ Clip timelines ] in
``media/clips.py``).

When the demux is paid:

* MP4, MOV, 3GP (FFmpeg's ``mov`` demuxer): the sample table holds every frame's duration, and
  FFmpeg sets the stream's base rate (``r_frame_rate``) from it when they are all equal, so
  the base rate equal to the average rate (frames over duration) says constant: no demux, and
  such a file costs what it did before. Unequal rates (a variable table, or a last frame of
  another length) are checked by the demux.
* Every other container (Matroska, WebM, AVI, MPEG-TS, FLV...): the header states a nominal
  rate (Matroska's default duration), not each frame's, so the demux is always paid. Measured
  on one core (PyAV 18; a 320x240 H.264 Matroska file of 10 s at 25 fps, 1.6 MB; a clip of 16
  frames every 2, resized to 128 and cropped to 112): ``decode_video`` took 11-12 ms a clip
  without the demux and 5-8 % more with it (0.6-0.9 ms); it grows with the file, not the clip
  (a 60 s 640x360 MP4 of 28 MB demuxed alone in 8.8 ms, against 26 ms a clip).

After a demux the stream is taken as constant-rate when its sorted timestamps lie on the
average rate's grid, each within a tick (the time base's rounding: a Matroska file at 29.97 fps
with millisecond timestamps is constant-rate), and numbering them by the rate gives exactly 0,
1, ..., n - 1: it is then numbered by the rate as before, and ``fps=`` maps through the rate.
Anything else is variable, even where the rate's rounding happens to give each frame its
position: ``fps=`` must then go by the timestamps. Frame 0 is the first packet's timestamp (an
AVI's can begin a frame after the stream's start time). A stream whose packets lack timestamps
is numbered by the rate, as before. The frame count is the packets' where they were demuxed,
else the container's (NOTE [ Clip decoding ]).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from naiad.media.clips import Timestamps

__all__ = ["FrameTimes", "frame_count", "frame_times", "on_rate_grid", "opened_video"]

_MOV_DEMUXER = "mov"  # FFmpeg's demuxer of MP4, MOV, M4V and 3GP: its header is the sample table


@contextlib.contextmanager
def opened_video(av: Any, data: bytes) -> Iterator[tuple[Any, Any]]:
    """``data``'s container and its first video stream, set to decode on the calling thread
    alone; ValueError saying what is wrong with bytes that are not a video.

    One thread per video: a batch's videos decode in parallel on the decode pool (NOTE [ Decode
    threads ]), each thread kept to one core, so FFmpeg's own threads would only contend.
    """
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except av.FFmpegError as exc:
        raise ValueError(f"not a video FFmpeg can read ({len(data)} bytes beginning {data[:8]!r}): {exc}") from None
    with container:
        if not container.streams.video:
            raise ValueError("the file has no video stream (audio only?)")
        stream = container.streams.video[0]
        stream.thread_type = "NONE"
        yield container, stream


@dataclass(frozen=True)
class FrameTimes:
    """How one stream's frames are numbered (NOTE [ Variable frame rate ]).

    Attributes:
        count: the stream's frames.
        rate: its average frame rate (None: unknown).
        time_base: its timestamps' unit, in seconds (None: unknown).
        start: the timestamp of frame 0 when numbered by the rate (the first packet's where they
            were demuxed, else the stream's start time).
        pts: a variable-rate stream's presentation timestamps, sorted (int64); None: numbered
            by the rate.
        timestamps: the same, from the first frame's, for the ``fps=`` timeline; None with ``pts``.
    """

    count: int
    rate: Fraction | None
    time_base: Fraction | None
    start: int = 0
    pts: np.ndarray | None = None
    timestamps: Timestamps | None = None

    @property
    def variable(self) -> bool:
        """Whether frames are numbered by their timestamps' positions (a variable-rate stream)."""
        return self.pts is not None

    def seek_pts(self, frame: int) -> int:
        """The timestamp to seek to (the keyframe at or before it) for frame ``frame``.

        Raises:
            ValueError: the stream has no frame rate or time base to number its frames by.
        """
        if self.pts is not None:
            return int(self.pts[min(frame, len(self.pts) - 1)])
        if not self.rate or not self.time_base:
            raise ValueError("the video stream has no frame rate or time base to number its frames by")
        return self.start + int(frame / (self.rate * self.time_base))

    def number(self, pts: int | None, previous: int) -> int:
        """The number of a decoded frame of timestamp ``pts``; without one, the frame after
        ``previous`` (the next in presentation order)."""
        if pts is None:
            return previous + 1
        if self.pts is not None:
            # The frame presented at pts: its own entry, or the last before a timestamp the
            # demuxer did not list.
            at = int(np.searchsorted(self.pts, pts, side="right")) - 1
            return max(at, 0)
        assert self.rate is not None and self.time_base is not None  # seek_pts checked them first
        return int(round(float((pts - self.start) * self.time_base * self.rate)))


def frame_count(stream: Any) -> int:
    """The stream's frames as its container says: its index's count, else duration x frame rate."""
    if stream.frames and stream.frames > 0:
        return int(stream.frames)
    rate = stream.average_rate or stream.guessed_rate
    if stream.duration and stream.time_base and rate:
        return int(round(float(stream.duration * stream.time_base * rate)))
    container_duration = stream.container.duration  # microseconds, when only the container knows
    if container_duration and rate:
        return int(round(container_duration / 1_000_000 * float(rate)))
    return 0


def header_says_constant(container: Any, stream: Any) -> bool:
    """Whether the container's header alone says the frame rate is constant: an MP4/MOV whose
    base rate (set from its sample table when every frame lasts the same) is its average rate."""
    demuxers = str(getattr(container.format, "name", "")).split(",")
    base, average = stream.base_rate, stream.average_rate
    return _MOV_DEMUXER in demuxers and bool(base) and bool(average) and Fraction(base) == Fraction(average)


def frame_times(container: Any, stream: Any) -> FrameTimes:
    """How ``stream``'s frames are numbered, demuxing its packets where the header cannot say
    the rate is constant (NOTE [ Variable frame rate ]). The container is left anywhere: the
    decode seeks before it reads.

    Raises:
        ValueError: the stream has no frames.
    """
    rate = stream.average_rate or stream.guessed_rate
    rate = Fraction(rate) if rate else None
    base = Fraction(stream.time_base) if stream.time_base else None
    start = stream.start_time or 0
    if header_says_constant(container, stream):
        return FrameTimes(frame_count(stream), rate, base, start)
    pts, packets, last = _demux(container, stream)
    if packets == 0:
        raise ValueError("the video stream has no frames")
    if pts is None:  # a packet without a timestamp: the rate numbers them, as before
        return FrameTimes(packets, rate, base, start)
    # Frame 0 is the first shown, whatever the stream's start time says (an AVI's pts can begin
    # a frame after it).
    first = int(pts[0])
    if base is None or (rate is not None and on_rate_grid(pts, first, base, rate)):
        return FrameTimes(int(pts.size), rate, base, first)
    ticks = pts - pts[0]
    return FrameTimes(int(pts.size), rate, base, start, pts,
                      Timestamps(ticks=ticks, time_base=base, end=int(ticks[-1]) + last))


def _demux(container: Any, stream: Any) -> tuple[np.ndarray | None, int, int]:
    """The stream's packets' presentation timestamps, sorted and unique (None when a packet has
    none), the packets' count, and the last frame's duration in ticks (its packet's, else the
    gap before it, else 1)."""
    pts: list[int] = []
    durations: list[int] = []
    untimed = 0
    for packet in container.demux(stream):
        if packet.size == 0:
            continue  # the demuxer's empty packet at the end
        if packet.pts is None:
            untimed += 1
            continue
        pts.append(packet.pts)
        durations.append(packet.duration or 0)
    if untimed or not pts:
        return None, len(pts) + untimed, 1
    table = np.asarray(pts, np.int64)
    order = np.argsort(table, kind="stable")
    table = table[order]
    last = int(np.asarray(durations, np.int64)[order[-1]])
    if last <= 0:
        last = int(table[-1] - table[-2]) if table.size > 1 else 1
    keep = np.concatenate(([True], np.diff(table) > 0))  # a timestamp twice is one frame shown
    return table[keep], len(pts), max(last, 1)


def on_rate_grid(pts: np.ndarray, start: int, base: Fraction, rate: Fraction) -> bool:
    """Whether the sorted timestamps are a constant rate's (NOTE [ Variable frame rate ]): frame
    ``k`` within a tick of ``start + k / rate`` (a timestamp is rounded to its time base: a
    Matroska file's milliseconds at 29.97 fps are), and numbering them by the rate gives each
    its position, 0, 1, ..., n - 1 (with a time base as coarse as the rate, a tick is a frame)."""
    ticks_per_frame = float(1 / (rate * base))
    offsets = (pts - start).astype(np.float64)
    positions = np.arange(pts.size, dtype=np.float64)
    if np.abs(offsets - positions * ticks_per_frame).max(initial=0.0) > 1.0:
        return False
    return bool(np.array_equal(np.rint(offsets / ticks_per_frame), positions))
