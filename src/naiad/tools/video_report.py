"""What ``naiad inspect`` says of the videos it looked at, wherever they are (a folder: tools/
inspect_video.py; tar shards or a table: tools/inspect_video_samples.py): totals over the probes,
what would stream faster (NOTE [ Video inspection ]), and the lines of the terminal report.
Each takes probes as dicts (:class:`~naiad.tools.inspect_video.VideoProbe` as ``asdict`` makes it).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from naiad.tools.progress import human_duration

__all__ = ["clip_line", "probe_lines", "totals_lines", "video_notes", "video_totals"]

_CODECS_SLOWER_THAN_H264 = {"hevc", "av1", "vp9"}  # decoded on CPUs at a fraction of H.264's rate


def clip_line(clip: dict[str, int]) -> str:
    """The clip timed, in words."""
    return (f"a clip: {clip['frames']} frames every {clip['stride']} ({clip['span']} frames from first to last), "
            "decoded with naiad.decode_video on one thread")


def probe_lines(probes: Sequence[dict[str, Any]], names: Sequence[str], indent: str = "  ") -> list[str]:
    """One line per probe (a :class:`VideoProbe` as a dict) under a header, named by ``names``."""
    width = min(48, max([len(n) for n in names] + [4]))
    lines = [f"{indent}{'file':<{width}} {'codec':<6} {'size':>9} {'fps':>7} {'frames':>7} {'duration':>9} "
             f"{'keyframe every':>15} {'ms/clip':>8} {'decoded/clip':>13}"]
    for p, full in zip(probes, names, strict=True):
        name = full[-width:]
        if p["error"] is not None:
            lines.append(f"{indent}{name:<{width}} does not decode: {p['error']}")
            continue
        every = f"{p['keyframe_interval']['mean']:g}" + (f" ({p['keyframe_interval']['mean'] / p['fps']:.1f} s)"
                                                        if p["fps"] else "")
        fps = f"{p['fps']:.2f}" + ("v" if p.get("variable_rate") else " ")
        lines.append(f"{indent}{name:<{width}} {p['codec']:<6} {p['width']:>4}x{p['height']:<4} {fps:>7} "
                     f"{p['frames']:>7,} {p['duration_s']:>8.1f}s {every:>15} {p['clip_ms']:>8.1f} "
                     f"{p['decoded_per_clip']:>13.0f}")
    if any(p.get("variable_rate") for p in probes):
        lines.append(f"{indent}(v: a variable frame rate; fps is its average)")
    return lines


def totals_lines(t: dict[str, Any], indent: str = "") -> list[str]:
    """The totals over the videos that decode (:func:`video_totals`), in words."""
    if not t.get("decoded"):
        return []
    return [f"{indent}over the {t['decoded']} that decode: median {t['width']}x{t['height']}, {t['fps']:g} fps, "
            f"{t['frames']:,} frames, a keyframe every {t['keyframe_interval']:g} frames; a clip decodes in "
            f"{t['clip_ms']:.1f} ms ({t['clips_per_s']:,.0f} clips/s on one thread), one clip of every video "
            f"in about {human_duration(t['epoch_s'])} on one thread (workers divide it)"]


def video_totals(probes: Sequence[dict[str, Any]], videos: int) -> dict[str, Any]:
    """Over the probes of videos that decode: medians of size, fps, frames, keyframe interval;
    the mean clip time and clips per second on one thread; ``epoch_s``, one clip of each of
    ``videos`` videos on one thread."""
    good = [p for p in probes if p["error"] is None]
    if not good:
        return {"decoded": 0, "failed": len(probes)}
    clip_ms = float(np.mean([p["clip_ms"] for p in good]))
    return {
        "decoded": len(good), "failed": len(probes) - len(good),
        "width": int(statistics.median(p["width"] for p in good)), "height": int(statistics.median(p["height"] for p in good)),
        "fps": round(float(statistics.median(p["fps"] for p in good)), 2),
        "frames": int(statistics.median(p["frames"] for p in good)),
        "duration_s": round(float(statistics.median(p["duration_s"] for p in good)), 2),
        "keyframe_interval": round(float(statistics.median(p["keyframe_interval"]["mean"] for p in good)), 1),
        "decoded_per_clip": round(float(np.mean([p["decoded_per_clip"] for p in good])), 1),
        "clip_ms": round(clip_ms, 3), "clips_per_s": 1e3 / clip_ms if clip_ms > 0 else float("nan"),
        "epoch_s": videos * clip_ms / 1e3,
    }


def video_notes(totals: dict[str, Any], clip: dict[str, int], probes: Sequence[dict[str, Any]], max_size: int, *,
                convert_from: str | None) -> list[str]:
    """What would stream faster, from :func:`video_totals` and the probes (NOTE [ Video
    inspection ]); ``convert_from``: the video files `naiad convert` would re-encode (None:
    videos inside shards or a table, which it does not)."""
    t, c = totals, clip
    notes: list[str] = []
    failed = [p for p in probes if p["error"] is not None]
    if failed:
        notes.append(f"{len(failed)} of the {len(probes)} videos looked at do not decode (named above); in a "
                     "loader each is a bad row: a DecodeError naming it, or skipped into the ledger with "
                     "on_bad_rows='skip'.")
    if not t.get("decoded"):
        return notes
    span, kept, target = c["span"], c["frames"], os.path.join(".", "shards", "train.tar")
    interval, decoded = t["keyframe_interval"], t["decoded_per_clip"]
    suggested = max(1, min(span, round(t["fps"]))) if t["fps"] else span
    if interval > 2 * span and decoded > 1.5 * span:
        better = suggested / 2 + span  # a random start lands, on average, half an interval past a keyframe
        how = (f"`naiad convert {convert_from} {target} --keyframe-interval {suggested}`" if convert_from else
               f"with a keyframe every {suggested} frames (`naiad convert --keyframe-interval {suggested}` does it "
               "for a folder of video files, before they go into shards or a table)")
        notes.append(
            f"a keyframe every {interval:g} frames is much longer than a clip ({span} frames): each clip decodes "
            f"about {decoded:.0f} frames to keep {kept}. Re-encoding with a keyframe about every second, "
            f"{how}, would make that about "
            f"{better:.0f} ({decoded / better:.1f}x fewer frames decoded; the files grow somewhat).")
    short_side = min(t["width"], t["height"])
    if short_side >= 2 * max_size:
        notes.append(
            f"the videos are {t['width']}x{t['height']}: every frame a clip decodes is {short_side}p, and a training "
            f"clip is usually resized to a shorter side near {max_size}. `naiad convert ... --max-size {max_size}` "
            f"(the shorter side) would decode about {(short_side / max_size) ** 2:.1f}x fewer pixels a frame.")
    codecs = sorted({p["codec"] for p in probes if p["error"] is None} & _CODECS_SLOWER_THAN_H264)
    if codecs:
        notes.append(f"codec {', '.join(codecs)}: CPUs decode it at a fraction of H.264's rate; `naiad convert` with "
                     "--keyframe-interval or --max-size re-encodes to H.264.")
    variable = [p for p in probes if p["error"] is None and p.get("variable_rate")]
    if variable:
        notes.append(f"{len(variable)} of the {len(probes)} videos looked at have a variable frame rate: decode_video "
                     "numbers their frames by their timestamps (a demux pass each, docs/VIDEO.md), and fps= "
                     "resamples them by time.")
    short = [p for p in probes if p["error"] is None and p["frames"] < span]
    if short:
        notes.append(f"{len(short)} of the {len(probes)} videos looked at are shorter than a clip ({span} frames): decode_video "
                     "repeats their last frame to fill it (fewer `frames` or a smaller `stride` would fit them).")
    if len(notes) == len(failed) + bool(variable):
        notes.append(f"nothing to change: a clip decodes {decoded:.0f} frames to keep {kept}, in {t['clip_ms']:.1f} ms "
                     "on one thread.")
    return notes
