"""``naiad inspect`` on samples: keys, member extensions, image sizes and formats, and the decode
time per image, with what would stream faster (docs/CONVERT.md, "Samples").

Sizes and formats come from the headers of a seeded random sample of images (Pillow reads the
header, not the pixels); the decode time from decoding some of them with ``naiad.decode_images``
on one thread, as a worker decodes them, and, for large images, the same images made smaller as
``naiad convert --max-size`` would make them, decoded again: the speed-up it reports is
measured, not guessed.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.sources.base import Source
from naiad.sources.images import ImageFolderSource
from naiad.sources.webdataset import KEY, WebDatasetSource
from naiad.tools.inspect_video_samples import VideoLook, place_names, video_column, video_columns
from naiad.tools.sample_media import IMAGE_FORMATS, image_header, media_format, shrink, video_format

__all__ = ["sample_notes", "inspect_samples"]

_SMALL = 64  # a longer side this small decodes in microseconds: store the pixels instead
_KEYS_SHOWN = 5


def inspect_samples(source: Source, *, images: int = 64, max_size: int = 256, time_budget_s: float = 1.0,
                    seed: int = 0, video: VideoLook | None = None) -> dict[str, Any] | None:
    """The samples part of ``naiad inspect``'s report, or None for a source without bytes.

    Returns:
        ``{"kind", "samples", "keys", "extensions", "columns"}``: ``kind`` is "webdataset",
        "images" (a folder) or "table"; ``keys`` the key column and its first values;
        ``extensions`` the member (or file) extensions with their counts (None for a table);
        ``columns`` one entry per column of bytes: ``name``, ``sampled``, ``formats`` and
        ``modes`` (counts), ``width``/``height``/``bytes`` (min, median, max), ``not_images``
        (sampled values that are not images), and ``decode``: ``{"images", "ms_per_image"}``,
        with ``max_size``: ``{"max_size", "ms_per_image", "speedup"}`` where images are larger;
        and ``videos``, for a column of videos (NOTE [ Videos in samples ] in
        tools/inspect_video_samples.py, ``video`` saying how many and which clip), else None.
    """
    schema = source.schema()
    binary = [f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
    if not binary:
        return None
    kind = "webdataset" if isinstance(source, WebDatasetSource) else ("images" if isinstance(source, ImageFolderSource) else "table")
    blocks = [b for b in source.blocks() if b.rows]
    rows = sum(b.rows for b in blocks)
    key_column = KEY if KEY in schema.names else ("path" if "path" in schema.names else None)
    first = source.read_block(blocks[0], 0, min(blocks[0].rows, _KEYS_SHOWN)).columns if blocks else {}
    look = video or VideoLook()
    videos = video_columns(binary, first, members=kind == "webdataset")
    # Videos are megabytes each: read as many rows as are probed, not an image sample's.
    sample, places = _sample_rows(source, blocks, look.videos if videos else images, seed)
    shown = [_key(source, v) for v in first.get(key_column, [])] if key_column else []
    columns = [_column(name, sample.get(name, []), max_size, time_budget_s) for name in binary]
    for col in columns:
        if col["name"] in videos:
            names = place_names(places, sample.get(KEY), col["name"] if kind == "webdataset" else None)
            col["videos"] = video_column(col["name"], sample.get(col["name"], []), names, look, samples=rows,
                                         max_size=max_size)
    return {
        "kind": kind,
        "samples": rows,
        "keys": {"column": key_column, "first": shown},
        "extensions": _extensions(source),
        "columns": columns,
    }


def _key(source: Source, value: Any) -> str:
    if isinstance(source, ImageFolderSource):
        return os.path.relpath(str(value), source.root).replace(os.sep, "/")
    return str(value)


def _sample_rows(source: Source, blocks: Sequence[Any], want: int, seed: int
                 ) -> tuple[dict[str, list[Any]], list[tuple[str, int]]]:
    """About ``want`` rows from random blocks (a few from each, at a random offset), and where
    each is: its file and row (a shard's sample) in that file."""
    out: dict[str, list[Any]] = {}
    places: list[tuple[str, int]] = []
    if not blocks or want <= 0:
        return out, places
    rng = np.random.default_rng(seed)
    per_block = max(1, -(-want // min(len(blocks), 8)))  # from 8 blocks or more, where there are
    got = 0
    for i in rng.permutation(len(blocks)).tolist():
        block = blocks[i]
        n = min(block.rows, per_block, want - got)
        lo = int(rng.integers(0, block.rows - n + 1))
        for name, values in source.read_block(block, lo, lo + n).columns.items():
            out.setdefault(name, []).extend(list(values))
        places += [(block.path, block.first_line + lo + j) for j in range(n)]
        got += n
        if got >= want:
            break
    return out, places


def _extensions(source: Source) -> dict[str, int] | None:
    counts: Counter[str] = Counter()
    if isinstance(source, WebDatasetSource):
        for path in source.paths:
            index = source.shard_index(path)
            for ext, present in zip(index.exts, (index.offsets >= 0).sum(axis=1).tolist()):
                counts[ext] += int(present)
    elif isinstance(source, ImageFolderSource):
        listing = source.listing()
        names = bytes(listing["path_bytes"]).decode("utf-8", "surrogateescape")
        ends = listing["path_ends"].tolist()
        for start, end in zip([0, *ends[:-1]], ends):
            counts[os.path.splitext(names[start:end])[1].lower().lstrip(".")] += 1
    else:
        return None
    return dict(counts.most_common())


def _stats(values: Sequence[int]) -> dict[str, int]:
    if not values:
        return {"min": 0, "median": 0, "max": 0}
    arr = np.asarray(values)
    return {"min": int(arr.min()), "median": int(np.median(arr)), "max": int(arr.max())}


def _column(name: str, values: Sequence[Any], max_size: int, budget_s: float) -> dict[str, Any]:
    formats: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    widths, heights, sizes = [], [], []
    images: list[bytes] = []
    not_images = 0
    for v in values:
        if v is None:
            continue
        data = bytes(v)
        sizes.append(len(data))
        found = media_format(data) or video_format(data)
        try:
            header = image_header(data) if found is None or found[0] in IMAGE_FORMATS else None
        except (ValueError, OSError):
            header = None
        if header is None:
            not_images += 1
            formats[found[0] if found else "unknown"] += 1
            continue
        formats[header.format] += 1
        modes[header.mode] += 1
        widths.append(header.width)
        heights.append(header.height)
        images.append(data)
    out: dict[str, Any] = {
        "name": name, "sampled": len(sizes), "formats": dict(formats.most_common()), "modes": dict(modes.most_common()),
        "width": _stats(widths), "height": _stats(heights), "bytes": _stats(sizes), "not_images": not_images,
        "decode": None, "videos": None,
    }
    if images:
        decode = _time_decode(images, budget_s)
        longer = int(np.median(np.maximum(widths, heights)))
        if longer >= 2 * max_size:
            smaller = [shrink(d, max_size, 90) or d for d in images[: decode["images"]]]
            small = _time_decode(smaller, budget_s)
            # The same images both ways: their own time, not the first pass's, is the baseline.
            base = _time_decode(images[: small["images"]], budget_s)
            speedup = base["ms_per_image"] / small["ms_per_image"] if small["ms_per_image"] > 0 else 0.0
            decode["max_size"] = {"max_size": max_size, "ms_per_image": small["ms_per_image"], "speedup": speedup}
        out["decode"] = decode
    return out


def _time_decode(images: Sequence[bytes], budget_s: float) -> dict[str, Any]:
    """Decode images with ``naiad.decode_images`` on one thread, in batches of 4, until the
    budget is spent (at least one batch): ``{"images", "ms_per_image"}``."""
    from naiad.media.images import decode_images

    transform = decode_images("image", threads=1)
    done = 0
    began = time.perf_counter()
    elapsed = 0.0
    while done < len(images):
        part = list(images[done: done + 4])
        transform({"image": part})
        done += len(part)
        elapsed = time.perf_counter() - began
        if elapsed >= budget_s:
            break
    return {"images": done, "ms_per_image": 1000 * elapsed / max(done, 1)}


def sample_notes(samples: dict[str, Any]) -> list[str]:
    """Advice on what would stream faster, from :func:`inspect_samples`'s findings."""
    notes = []
    for col in samples["columns"]:
        if col.get("videos"):
            notes += col["videos"]["notes"]
        decode = col["decode"]
        if decode is None:
            continue
        w, h = col["width"], col["height"]
        fmt = ", ".join(col["formats"]) or "?"
        varied = w["min"] != w["max"] or h["min"] != h["max"]
        size = f"about {w['median']}x{h['median']}" if varied else f"{w['max']}x{h['max']}"
        what = f"column {col['name']!r}: images are {size} {fmt}"
        cost = f"decode {decode['ms_per_image']:.2f} ms each (one thread)"
        shrunk = decode.get("max_size")
        if shrunk:
            notes.append(f"{what}; {cost}; `naiad convert --max-size {shrunk['max_size']}` would make decode about "
                         f"{shrunk['speedup']:.0f}x faster ({shrunk['ms_per_image']:.2f} ms each, measured on "
                         f"{decode['images']} of them made smaller); pick the size your training crops need")
        elif max(w["max"], h["max"]) <= _SMALL:
            hint = ("`naiad convert --decode` stores their pixels (uint8, read back as [B, C, H, W]), so batches "
                    "stream at memory speed with no decode" if not varied else
                    "they differ in size: `naiad convert --decode` needs one size (--max-size can bring them to it)")
            notes.append(f"{what}; {cost}, and per-image overhead dominates at this size; {hint}")
    return notes
