"""``naiad inspect`` for videos: a video file, a glob or a folder of them (``naiad.read_videos``'
layouts). For each video looked at (all of a few; a sample spread over a large folder): its
codec, size, frame rate, frame count, duration, keyframe interval and the time one clip takes to
decode with ``naiad.decode_video``; over them, totals and what would stream faster
(tools/video_report.py). Videos inside tar shards or a table are probed from their bytes by
the same :func:`probe_video_bytes` (tools/inspect_video_samples.py). docs/VIDEO.md.

NOTE [ Video inspection ]
The keyframe interval is measured without decoding: the container is demuxed (PyAV's
``demux``: packets read, none decoded) and the keyframe flag of each video packet gives the
keyframes' frame numbers (a packet's position among the sorted presentation timestamps, which
is how ``decode_video`` numbers frames, constant rate or not: NOTE [ Variable frame rate ] in
``media/video_stream.py``; a video whose timestamps are off its average rate's grid is
reported as of a variable frame rate). The clip time is ``decode_video``'s own, on one thread,
for a few random clips keyed as a loader keys them (the median, so the first call's set-up does
not count); the frames a clip decodes are counted from the keyframe before its first frame to its
last, which is what the decode does (NOTE [ Clip decoding ] in ``media/video.py``). A clip that
starts deep in a long keyframe interval decodes many frames it drops: that is the advice to
re-encode with a shorter interval (``naiad convert --keyframe-interval``).

A file that does not open, demux or decode is reported by name with the problem (never a
traceback): in a loader it would be a bad row.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from naiad.errors import DecodeError, NaiadError
from naiad.media.video_stream import on_rate_grid, opened_video
from naiad.sources.options import StorageLike
from naiad.sources.storage import is_remote
from naiad.tools.progress import json_safe
from naiad.tools.video_files import VideoFiles, list_videos, pyav_for
from naiad.tools.video_report import clip_line, probe_lines, totals_lines, video_notes, video_totals
from naiad.trust.paths import read_local_file

__all__ = ["VideoProbe", "VideoReport", "inspect_videos", "probe_video", "probe_video_bytes"]

_MAX_READ_BYTES = 4 << 30  # a video inspected is read whole (the clip decode takes bytes)


@dataclass
class VideoProbe:
    """What :func:`probe_video` found in one video (``error`` set: it did not open or decode).

    Attributes:
        path: the file; ``bytes`` its size; ``label`` its class name (None without classes).
        codec, width, height, fps, frames, duration_s: the video stream's, ``frames`` counted
            from its packets (one a frame), ``duration_s`` frames over fps.
        keyframes: how many keyframes; ``keyframe_interval``: ``{"mean", "max"}`` frames between
            consecutive ones (a video with one keyframe: its frame count).
        b_frames: whether frames are stored out of presentation order.
        variable_rate: whether the frames' timestamps are off the average rate's grid (a
            variable frame rate: ``decode_video`` numbers them by their timestamps, NOTE [
            Variable frame rate ]); ``fps`` is then the average.
        clip_ms: the median time of one clip's decode with ``decode_video`` on one thread.
        decoded_per_clip: the mean frames a clip decodes (from the keyframe before its first
            frame to its last), of which ``frames`` (T) are kept.
        error: why the video cannot be read, else None.
    """

    path: str
    bytes: int
    label: str | None = None
    codec: str = ""
    width: int = 0
    height: int = 0
    fps: float = 0.0
    frames: int = 0
    duration_s: float = 0.0
    keyframes: int = 0
    keyframe_interval: dict[str, float] = field(default_factory=dict)
    b_frames: bool = False
    variable_rate: bool = False
    clip_ms: float = float("nan")
    decoded_per_clip: float = float("nan")
    error: str | None = None


def probe_video(path: str, *, frames: int = 16, stride: int = 2, clips: int = 3, seed: int = 0,
                label: str | None = None, warm_up: bool = False) -> VideoProbe:
    """Probe one video file (NOTE [ Video inspection ]); never raises for a bad video: the
    problem is in the result's ``error``. ``warm_up``: decode one clip untimed first (the
    process's first decode pays for FFmpeg's and PyAV's set-up).

    Raises:
        ConfigError: PyAV is not installed, or ``frames``/``stride`` are out of range.
    """
    pyav_for("`naiad inspect` on videos")
    try:
        data = read_local_file(path, _MAX_READ_BYTES)
    except OSError as exc:
        return VideoProbe(path=path, bytes=_size(path), label=label,
                          error=f"cannot read the file ({exc.strerror or exc})")
    return probe_video_bytes(data, path, frames=frames, stride=stride, clips=clips, seed=seed, label=label,
                             warm_up=warm_up)


def probe_video_bytes(data: bytes, name: str, *, frames: int = 16, stride: int = 2, clips: int = 3, seed: int = 0,
                      label: str | None = None, warm_up: bool = False) -> VideoProbe:
    """Probe one video's bytes (a tar member, a table's value) as :func:`probe_video` probes a
    file; ``name`` says where it came from (the probe's ``path``). Never raises for a bad video.

    Raises:
        ConfigError: PyAV is not installed, or ``frames``/``stride`` are out of range.
    """
    from naiad.media.video import decode_video

    av = pyav_for("`naiad inspect` on videos")
    decode = decode_video("video", frames=frames, stride=stride, seed=seed, threads=1)
    probe = VideoProbe(path=name, bytes=len(data), label=label)
    try:
        keyframes = _demux(av, data, probe)
    except Exception as exc:  # noqa: BLE001 - any failure of FFmpeg's is the file's problem, reported
        probe.error = _problem(exc)
        return probe
    try:
        _time_clips(decode, data, probe, keyframes, clips, warm_up)
    except DecodeError as exc:
        probe.error = exc.reasons[0] if exc.reasons else str(exc)
    except NaiadError:
        raise
    except Exception as exc:  # noqa: BLE001 - as above: reported, not raised
        probe.error = _problem(exc)
    return probe


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _problem(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


def _demux(av: Any, data: bytes, probe: VideoProbe) -> np.ndarray:
    """Fill ``probe`` with the stream's facts and keyframe interval from its packets alone; the
    keyframes' frame numbers, sorted. Frames are numbered by their timestamps' positions (as
    ``decode_video`` numbers them: NOTE [ Variable frame rate ]), or in stored order where a
    packet has none."""
    with opened_video(av, data) as (container, stream):
        ctx = stream.codec_context
        probe.codec = str(ctx.name)
        probe.width, probe.height = int(ctx.width), int(ctx.height)
        rate = stream.average_rate or stream.guessed_rate
        probe.fps = float(rate) if rate else 0.0
        stamps: list[int | None] = []
        keys: list[bool] = []
        for packet in container.demux(stream):
            if packet.size == 0:
                continue  # the demuxer's empty packet at the end
            stamps.append(packet.pts if packet.pts is not None else packet.dts)
            keys.append(bool(packet.is_keyframe))
        base = stream.time_base
    count = len(stamps)
    if count == 0:
        raise ValueError("the video stream has no frames")
    if any(p is None for p in stamps):  # without timestamps each packet is the next frame
        numbers = np.arange(count, dtype=np.int64)
    else:
        pts = np.asarray(stamps, np.int64)
        # B-frames: packets stored out of presentation order.
        probe.b_frames = bool(np.any(np.diff(pts) < 0))
        order = np.argsort(pts, kind="stable")
        numbers = np.empty(count, np.int64)
        numbers[order] = np.arange(count, dtype=np.int64)
        ordered = pts[order]
        probe.variable_rate = bool(base and rate and not on_rate_grid(ordered, int(ordered[0]), Fraction(base),
                                                                     Fraction(rate)))
    probe.frames = count
    probe.duration_s = count / probe.fps if probe.fps else 0.0
    marks = np.unique(numbers[np.asarray(keys, bool)])
    probe.keyframes = int(marks.size)
    # The interval is between keyframes; the frames after the last one are a run cut short by the
    # video's end, so they count only in the max, and only a video with one keyframe is measured
    # by its length (the interval is at least that).
    tail = count - int(marks[-1]) if marks.size else count
    gaps = np.diff(marks) if marks.size > 1 else np.array([tail])
    probe.keyframe_interval = {"mean": round(float(gaps.mean()), 1), "max": float(max(gaps.max(), tail))}
    return marks


def _time_clips(decode: Any, data: bytes, probe: VideoProbe, keyframes: np.ndarray, clips: int, warm_up: bool) -> None:
    """Decode ``clips`` random clips one at a time, as a loader's samples ``0..clips-1`` would be
    drawn; keep the median time and the frames each decoded."""
    if warm_up:
        decode({"video": [data], "__index__": np.array([clips], np.int64)})
    times: list[float] = []
    decoded: list[int] = []
    for key in range(max(1, clips)):
        t0 = time.perf_counter()
        out = decode({"video": [data], "__index__": np.array([key], np.int64)})
        times.append(time.perf_counter() - t0)
        numbers = out["video_frames"][0].numpy()
        first, last = int(numbers.min()), int(numbers.max())
        before = keyframes[keyframes <= first]
        decoded.append(last - int(before[-1] if before.size else 0) + 1)
    probe.clip_ms = 1e3 * statistics.median(times)
    probe.decoded_per_clip = float(np.mean(decoded))


@dataclass
class VideoReport:
    """What :func:`inspect_videos` found (``as_dict()`` is ``naiad inspect --json``'s output).

    Attributes:
        source: what was asked for; ``root``: the folder the videos are listed under.
        videos, total_bytes, classes: the whole listing's count, bytes and class names, with
            ``class_counts`` (videos per class).
        clip: ``{"frames", "stride", "span"}`` of the clip timed.
        probes: one :class:`VideoProbe` (as a dict) per video looked at.
        totals: over the videos looked at that decode: medians of size, fps, frames, keyframe
            interval; the mean clip time and clips per second on one thread; ``epoch_s``, the
            decode time on one thread of one clip of every video of the listing.
        notes: what would stream faster, and the videos that do not decode.
    """

    source: str
    root: str
    videos: int
    total_bytes: int
    classes: list[str]
    class_counts: list[int]
    clip: dict[str, int]
    probes: list[dict[str, Any]]
    totals: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-able data."""
        return asdict(self)

    def to_json(self) -> str:
        """The report as JSON (NaN written as null)."""
        return json.dumps(json_safe(self.as_dict()), indent=2)

    def summary(self) -> str:
        """The report in words, for a terminal."""
        from naiad.tools.progress import human_bytes

        kinds = f" in {len(self.classes)} classes" if self.classes else ""
        looked = len(self.probes)
        lines = [f"{self.source}: {self.videos:,} video(s){kinds}, {human_bytes(self.total_bytes)} (naiad.read_videos); "
                 + (f"{looked} looked at, spread over the listing" if looked < self.videos else f"{looked} looked at")]
        if self.classes:
            shown = ", ".join(f"{c} {n}" for c, n in zip(self.classes[:8], self.class_counts[:8], strict=False))
            lines.append(f"classes: {shown}" + (f", ... ({len(self.classes) - 8} more)" if len(self.classes) > 8 else ""))
        lines.append(clip_line(self.clip))
        lines += probe_lines(self.probes, [_name(p["path"], self.root) for p in self.probes])
        lines += totals_lines(self.totals)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def inspect_videos(src: str | Sequence[str], *, videos: int = 8, frames: int = 16, stride: int = 2, max_size: int = 256,
                   clips: int = 3, seed: int = 0, storage: StorageLike = None) -> VideoReport:
    """Inspect a video file, a glob or a folder of videos (``naiad.read_videos``' layouts, local
    or behind URLs read through ``storage``): see :class:`VideoReport` and NOTE [ Video
    inspection ]. ``videos`` files are looked at, spread evenly over the listing (so every class
    is seen), and only they are read (fetched, behind a URL); each has ``clips`` clips of
    ``frames`` frames every ``stride`` decoded and timed. A video whose shorter side is at least
    twice ``max_size`` gets the advice to make it smaller (``naiad convert --max-size``).

    Raises:
        SourceError: no such file or folder, or a folder without videos, naming it.
        ConfigError: PyAV is not installed (``pip install 'naiad[video]'``).
    """
    pyav_for("`naiad inspect` on videos")
    listing = list_videos(src, storage=storage)
    n = len(listing)
    picked = sorted({int(i) for i in np.linspace(0, n - 1, min(max(1, videos), n)).round()}) if n else []
    probes = [_probe(listing, i, frames=frames, stride=stride, clips=clips, seed=seed, warm_up=not k)
              for k, i in enumerate(picked)]
    counts: list[int] = []
    if listing.classes:
        counts = np.bincount(listing.labels[listing.labels >= 0], minlength=len(listing.classes)).tolist()
    span = (frames - 1) * stride + 1
    report = VideoReport(
        source=src if isinstance(src, str) else ", ".join(map(str, src)), root=listing.root, videos=n,
        total_bytes=int(listing.sizes.sum()), classes=listing.classes, class_counts=[int(c) for c in counts],
        clip={"frames": frames, "stride": stride, "span": span}, probes=[asdict(p) for p in probes],
        totals=video_totals([asdict(p) for p in probes], n))
    report.notes = video_notes(report.totals, report.clip, report.probes, max_size, convert_from=report.source)
    return report


def _probe(listing: VideoFiles, i: int, **probe: Any) -> VideoProbe:
    """Video ``i`` of ``listing`` probed: a local file read, an object fetched (NOTE [ Remote
    folder listing ]: as listed, at most the source's ``media.max_bytes``)."""
    label = listing.classes[listing.labels[i]] if listing.classes else None
    path = listing.paths[i]
    if not listing.remote:
        return probe_video(path, label=label, **probe)
    data = listing.fetch([i])[0]
    if isinstance(data, str):
        return VideoProbe(path=path, bytes=int(listing.sizes[i]), label=label, error=data)
    return probe_video_bytes(data, path, label=label, **probe)


def _name(path: str, root: str) -> str:
    if is_remote(root):
        return path[len(root) + 1:] if path.startswith(root + "/") else path
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


