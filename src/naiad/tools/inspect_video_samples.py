"""``naiad inspect`` of videos inside tar shards or a table: what a video folder's inspect reports
(tools/inspect_video.py), for the videos of a WebDataset member or a binary column.

NOTE [ Videos in samples ]
A column holds videos when it is a WebDataset member whose extension is a video's (``mp4``,
``webm``... ``sources/videos.VIDEO_EXTENSIONS``; ``seg.mp4`` by its last part) or a binary
column whose first value among the first rows read begins with a video container's magic
number (``sample_media.video_format``: MP4/MOV/3GP, Matroska/WebM, AVI, FLV, MPEG-PS/TS). The
samples' inspect (tools/inspect_samples.py) then reads ``videos`` rows instead of ``images``
(a video is megabytes: the sample stays bounded), and each video column's values are probed
from their bytes as a folder's files are (:func:`~naiad.tools.inspect_video.probe_video_bytes`:
codec, size, fps, frames, duration, B-frames, keyframe interval, the time of a clip), at most
``videos`` of them, spread over the rows read; the report says how many were inspected of how
many samples. The totals and advice are the folder's (tools/video_report.py), except that
`naiad convert` re-encodes folders of video files, not shards or tables, which the advice says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from naiad.sources.videos import VIDEO_EXTENSIONS
from naiad.tools.sample_media import video_format
from naiad.tools.video_report import clip_line, probe_lines, totals_lines, video_notes, video_totals

__all__ = ["VideoLook", "place_names", "video_column", "video_column_lines", "video_columns"]

_MEMBER_EXTENSIONS = frozenset(ext.lstrip(".") for ext in VIDEO_EXTENSIONS)


@dataclass(frozen=True)
class VideoLook:
    """How ``naiad inspect`` looks at videos (``--videos``, ``--frames``, ``--stride``).

    Attributes:
        videos: the most videos probed (per column of shards or a table).
        frames, stride: the clip timed, as ``naiad.decode_video``'s.
        clips: clips timed per video (the median kept).
        seed: the clips' keyed draws.
    """

    videos: int = 8
    frames: int = 16
    stride: int = 2
    clips: int = 3
    seed: int = 0


def video_columns(binary: Sequence[str], first: Mapping[str, Any], *, members: bool) -> list[str]:
    """The columns of ``binary`` that hold videos (NOTE [ Videos in samples ]): by their member
    extension where they are WebDataset members (``members``), else by the magic number of their
    first value in ``first`` (the first rows read)."""
    out = []
    for name in binary:
        if members and name.rsplit(".", 1)[-1].lower() in _MEMBER_EXTENSIONS:
            out.append(name)
            continue
        value = next((v for v in first.get(name, []) if v is not None), None)
        if value is not None and video_format(value) is not None:
            out.append(name)
    return out


def video_column(name: str, values: Sequence[Any], places: Sequence[str], look: VideoLook, *, samples: int,
                 max_size: int) -> dict[str, Any]:
    """The ``videos`` entry of a column's report: ``{"inspected", "sampled", "samples", "clip",
    "probes", "totals", "notes"}``: up to ``look.videos`` of the sampled ``values`` probed
    (``places`` names each: its shard and key, or its file and row), spread over them;
    ``samples`` is the source's count (``totals["epoch_s"]`` is one clip of each)."""
    from naiad.tools.inspect_video import probe_video_bytes

    present = [i for i, v in enumerate(values) if v is not None]
    count = min(len(present), max(1, look.videos))
    picked = sorted({present[int(k)] for k in np.linspace(0, len(present) - 1, count).round()}) if present else []
    probes = [asdict(probe_video_bytes(bytes(values[i]), places[i], frames=look.frames, stride=look.stride,
                                       clips=look.clips, seed=look.seed, warm_up=not k))
              for k, i in enumerate(picked)]
    clip = {"frames": look.frames, "stride": look.stride, "span": (look.frames - 1) * look.stride + 1}
    totals = video_totals(probes, samples)
    notes = video_notes(totals, clip, probes, max_size, convert_from=None)
    return {"inspected": len(probes), "sampled": len(present), "samples": samples, "clip": clip, "probes": probes,
            "totals": totals, "notes": [f"column {name!r}: {n}" for n in notes]}


def video_column_lines(videos: dict[str, Any]) -> list[str]:
    """A column's ``videos`` entry in words, for the terminal report."""
    lines = [f"    videos: {videos['inspected']} of the {videos['samples']:,} inspected (rows read at random); "
             + clip_line(videos["clip"])]
    lines += probe_lines(videos["probes"], [p["path"] for p in videos["probes"]], indent="      ")
    lines += totals_lines(videos["totals"], indent="    ")
    return lines


def place_names(places: Sequence[tuple[str, int]], keys: Sequence[Any] | None, member: str | None) -> list[str]:
    """Each sampled row named for the report: ``shard.tar: key.mp4`` (a WebDataset member's
    key and extension), else ``file.parquet row 12``."""
    if keys is not None and member is not None:
        return [f"{os.path.basename(path)}: {key}.{member}" for (path, _), key in zip(places, keys, strict=True)]
    return [f"{os.path.basename(path)} row {row}" for path, row in places]
