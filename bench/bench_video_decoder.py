"""The decoder chosen by measurement (issue 39, item 3): PyAV, as ``naiad.decode_video`` runs it,
against torchcodec and SPDL decoding the same clips in one process.

The same videos as ``bench_video.py`` (``--videos`` of ``--seconds`` s at 30 fps, 320x240 and
640x360, keyframe intervals 30 and 250), held as bytes in memory (as naiad's readers give them).
Every decoder takes one 16-frame clip (stride 2) of each video, the same starts for all, shorter
side 128, a random 112 crop, uint8 ``[T, 3, 112, 112]``; a batch of ``--batch`` videos at a time
on ``--threads`` threads, one video per thread, as naiad's decode threads run (FFmpeg's own
threading off or at one thread):

* ``PyAV (naiad.decode_video)``: ``decode_video("video", frames=16, stride=2, size=112,
  resize=128, crop="random", threads=N)`` called on the batch: PyAV's decode, FFmpeg's scaler
  resizing to RGB in one pass (``VideoFrame.reformat``), the crop pasted.
* ``PyAV + FFmpeg's filter graph``: the same PyAV decode, each kept frame pushed through
  ``av.filter.Graph`` ``scale=w:h:flags=bilinear,crop=112:112:x:y,format=rgb24``: scaled in YUV,
  only the crop converted to RGB (what SPDL's filter graph does; not what naiad does today).
* ``torchcodec + torch's resize``: ``VideoDecoder(bytes, seek_mode="approximate")``,
  ``get_frames_at(indices)`` at full size, then torch's bilinear antialiased resize of the float
  clip and the crop (torchcodec itself has no shorter-side resize).
* ``torchcodec + its Resize, RandomCrop``: the decoder's own transforms (0.13 has ``Resize``,
  ``CenterCrop``, ``RandomCrop``), applied by FFmpeg's filter graph inside the decoder.
* ``SPDL load_video + its filter graph``: ``spdl.io.load_video(bytes, timestamp=window,
  filter_desc=get_video_filter_desc(...))``: every 2nd frame, scaled in YUV, cropped, then RGB.

Clips per wall second and per CPU second of the process, medians of ``--rounds`` after a
warm-up, alternating; ``vs PyAV`` is against naiad's decode at the same thread count. A decoder
that does not load is a row saying why. Run: ``python bench/bench_video_decoder.py [--videos 48
--seconds 5 --rounds 3]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_video import CODEC, make_folder  # noqa: E402
from harness import environment, markdown_table  # noqa: E402
from video_peers import (  # noqa: E402
    CROP,
    FRAMES,
    SHORTER,
    SPAN,
    STRIDE,
    shorter_side,
    spdl_clip,
    spdl_version,
    torchcodec_version,
    why_not,
)

import naiad  # noqa: E402

Clip = Callable[[bytes, int, tuple[int, int], random.Random], Any]  # (video, start, (w, h) resized, rng)


def pyav_filter_graph(data: bytes, start: int, size: tuple[int, int], rng: random.Random) -> np.ndarray:
    """PyAV's decode (threads off), each kept frame pushed through FFmpeg's filter graph: scaled in
    YUV, cropped, and only the crop converted to RGB (what SPDL's filter graph does)."""
    import io

    import av
    import av.filter

    rw, rh = size
    y, x = rng.randint(0, rh - CROP), rng.randint(0, rw - CROP)
    wanted = set(range(start, start + SPAN, STRIDE))
    out = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "NONE"
        graph = av.filter.Graph()
        chain = [graph.add_buffer(template=stream), graph.add("scale", f"{rw}:{rh}:flags=bilinear"),
                 graph.add("crop", f"{CROP}:{CROP}:{x}:{y}"), graph.add("format", "rgb24"), graph.add("buffersink")]
        for a, b in zip(chain, chain[1:]):
            a.link_to(b)
        graph.configure()
        rate, base = stream.average_rate, stream.time_base
        container.seek(int(start / (rate * base)), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            number = int(round(float(frame.pts * base * rate)))
            if number in wanted:
                graph.push(frame)
                out.append(graph.pull().to_ndarray())
            if number >= start + SPAN - 1:
                break
    while len(out) < FRAMES:  # pad a short end
        out.append(out[-1])
    return np.stack(out).transpose(0, 3, 1, 2)


def torchcodec_torch_resize(data: bytes, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    from torchcodec.decoders import VideoDecoder

    frames = VideoDecoder(data, seek_mode="approximate").get_frames_at(list(range(start, start + SPAN, STRIDE))).data
    rw, rh = size
    clip = F.interpolate(frames.float(), size=(rh, rw), mode="bilinear", align_corners=False, antialias=True)
    y, x = rng.randint(0, rh - CROP), rng.randint(0, rw - CROP)
    return clip[:, :, y:y + CROP, x:x + CROP].round().clamp(0, 255).to(torch.uint8)


def torchcodec_transforms(data: bytes, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import RandomCrop, Resize

    decoder = VideoDecoder(data, seek_mode="approximate", transforms=[Resize((size[1], size[0])), RandomCrop((CROP, CROP))])
    return decoder.get_frames_at(list(range(start, start + SPAN, STRIDE))).data


def spdl_filter_graph(data: bytes, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    return spdl_clip(data, start, *size)


def batch_runner(clip: Clip, threads: int) -> Callable[[list[bytes], list[int], list[tuple[int, int]], list[int]], int]:
    """Decode a batch's clips on a pool of ``threads`` threads, one video per thread."""
    pool = ThreadPoolExecutor(threads)

    def run(videos: list[bytes], starts: list[int], sizes: list[tuple[int, int]], keys: list[int]) -> int:
        rng = random.Random(keys[0])
        out = list(pool.map(lambda i: clip(videos[i], starts[i], sizes[i], rng), range(len(videos))))
        if any(tuple(c.shape) != (FRAMES, 3, CROP, CROP) for c in out):
            raise RuntimeError(f"a clip of shape {[tuple(c.shape) for c in out]}")
        return len(out)

    return run


def naiad_runner(threads: int) -> Callable[[list[bytes], list[int], list[tuple[int, int]], list[int]], int]:
    decode = naiad.decode_video("video", frames=FRAMES, stride=STRIDE, size=CROP, resize=SHORTER, crop="random",
                                seed=0, threads=threads)

    def run(videos: list[bytes], starts: list[int], sizes: list[tuple[int, int]], keys: list[int]) -> int:
        # Its clip starts are its own keyed draws: uniform over the same range as the others'.
        out = decode({"video": videos, "__index__": np.asarray(keys, np.int64)})["video"]
        if tuple(out.shape[1:]) != (FRAMES, 3, CROP, CROP):
            raise RuntimeError(f"a batch of shape {tuple(out.shape)}")
        return len(out)

    return run


def decoders(threads: int) -> dict[str, Callable[..., int] | str]:
    got: dict[str, Callable[..., int] | str] = {"PyAV (naiad.decode_video)": naiad_runner(threads),
                                                "PyAV + FFmpeg's filter graph": batch_runner(pyav_filter_graph, threads)}
    for name, version, clip in (("torchcodec + torch's resize", torchcodec_version, torchcodec_torch_resize),
                                ("torchcodec + its Resize, RandomCrop", torchcodec_version, torchcodec_transforms),
                                ("SPDL load_video + its filter graph", spdl_version, spdl_filter_graph)):
        try:
            version()
            got[name] = batch_runner(clip, threads)
        except Exception as e:  # a decoder that does not load
            got[name] = why_not(e)
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--videos", type=int, default=48)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    print(environment())
    print(f"{args.videos} videos of {args.seconds:g} s ({CODEC}), clips of {FRAMES} frames stride {STRIDE}, shorter side "
          f"{SHORTER}, crop {CROP}, batches of {args.batch}, threads {args.threads}, {args.rounds} rounds", flush=True)
    import av

    with tempfile.TemporaryDirectory(prefix="naiad-bench-video-decoder-") as tmp:
        paths = make_folder(args.videos, args.seconds, Path(tmp) / "train")
        videos = [Path(q).read_bytes() for q in paths]
        counts, sizes = [], []
        for q in paths:
            with av.open(q) as c:
                s = c.streams.video[0]
                counts.append(int(s.frames))
                sizes.append(shorter_side(s.codec_context.width, s.codec_context.height))
    rows: list[list[str]] = []
    for threads in args.threads:
        runs = decoders(threads)
        made = {name: fn for name, fn in runs.items() if not isinstance(fn, str)}
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in made}

        def epoch(fn: Callable[..., int], r: int) -> tuple[float, float]:
            rng = random.Random(r)
            order = list(range(len(videos)))
            rng.shuffle(order)
            t0, c0 = time.perf_counter(), time.process_time()
            done = 0
            for b in range(0, len(order), args.batch):
                idx = order[b:b + args.batch]
                done += fn([videos[i] for i in idx], [rng.randint(0, max(counts[i] - SPAN, 0)) for i in idx],
                           [sizes[i] for i in idx], [r * len(videos) + i for i in idx])
            return done / (time.perf_counter() - t0), done / max(1e-9, time.process_time() - c0)

        for fn in made.values():
            epoch(fn, 0)  # warm-up
        for r in range(args.rounds):
            for name, fn in made.items():
                rates[name].append(epoch(fn, r + 1))
        med = {n: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for n, v in rates.items()}
        base_wall, base_cpu = med["PyAV (naiad.decode_video)"]
        for name, fn in runs.items():
            if isinstance(fn, str):
                rows.append([name, str(threads), "not run: " + fn, "", "", "", ""])
                continue
            wall, cpu = med[name]
            rows.append([name, str(threads), f"{wall:,.1f}", f"{cpu:,.1f}", f"{1000 / cpu:,.1f}",
                         f"{wall / base_wall:.2f}x", f"{cpu / base_cpu:.2f}x"])
        print(f"  {threads} thread(s) done", flush=True)
    print(markdown_table(["decoder", "threads", "clips/s (wall)", "clips/CPU s", "CPU ms a clip", "vs PyAV (wall)",
                          "vs PyAV (CPU)"], rows))


if __name__ == "__main__":
    main()
