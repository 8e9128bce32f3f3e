"""Video clips: naiad against the loaders users run for them, side by side in one run, and the
bare decode loop (issue 39, item 6).

The data is made here with PyAV (H.264 through ``libx264`` where PyAV's FFmpeg has it, else
MPEG-4 part 2): ``--videos`` videos of ``--seconds`` seconds at 30 fps, split evenly over
320x240 and 640x360 and keyframe intervals 30 and 250, in four class folders (the Kinetics and
UCF101 layout), and the same videos in four WebDataset tar shards (webdataset's ``ShardWriter``:
``<key>.mp4``, ``<key>.cls``). Every loader takes one 16-frame clip (stride 2) of each video per
epoch, resized to a shorter side of 128 and cropped to a random 112x112 (``Resize(128)`` +
``RandomCrop(112)``, the video recipes' training crop), in batches of ``--batch`` with
``--workers`` workers (or threads), shuffled; side by side in one run, alternating, medians of
``--rounds`` after a warm-up:

* ``torch + PyAV dataset``: torch's DataLoader over a map-style ``Dataset`` whose
  ``__getitem__`` decodes one clip as PyAV's docs and torchvision's ``read_video`` write it:
  open the file, seek to the keyframe before the clip (``container.seek(..., backward=True)``),
  decode to the clip's last frame, ``to_ndarray(format="rgb24")``, then torch: a bilinear
  antialiased resize of the float clip to the shorter side 128 and a random 112 crop. PyAV's
  decoder threading left at its default, as a user leaves it.
* ``torch + torchcodec dataset``: torch's DataLoader over a ``Dataset`` decoding as torchcodec's
  docs write it (``bench/video_peers.py``): a ``VideoDecoder`` per sample with the decoder's own
  ``Resize`` and ``RandomCrop`` (FFmpeg's filter graph), ``clips_at_random_indices`` for the clip.
* ``webdataset + PyAV``: WebDataset's own loader over the shards, ``.shuffle(64)``, the ``.mp4``
  decoded per sample with PyAV in its ``.map`` (the same decode as the PyAV dataset),
  ``.batched``, ``WebLoader``.
* ``SPDL pipeline``: SPDL's pipeline with ``--workers`` threads (``pipe(load, concurrency=N)``,
  ``build(num_threads=N)``), the load ``spdl.io.load_video`` of the clip's window with the filter
  graph of ``get_video_filter_desc`` (every 2nd frame, the scale and a centre crop in FFmpeg;
  SPDL has no random crop, and a crop's place does not change its cost).
* ``naiad folder``: ``naiad.DataLoader(naiad.read_videos(root), ..., transform=naiad.decode_video(
  "video", frames=16, stride=2, size=112, resize=128, crop="random"))``; ``naiad shards``: the
  same over ``naiad.read_webdataset(shards)`` with ``decode_video("mp4", ...)``.
* the bare loops, one process, no loader: PyAV's decode (threading off) with FFmpeg's scaler
  resizing (``frame.reformat``), the same decode with torch's resize, naiad's ``decode_video``
  called on one video at a time (its seek, its unreferenced frames left undecoded, one scaler
  per video), and where they load torchcodec's decoder with its ``Resize`` + ``RandomCrop`` and
  SPDL's ``load_video`` with its filter graph; the ceiling is the fastest of them times the
  cores.

DALI is not measured: its video reader decodes on NVIDIA GPUs only, and this benchmark's
machine has none. A peer that is not installed or does not load (torchcodec needs FFmpeg's shared
libraries, SPDL too) is a row saying why, and the rest runs.

Clips/s and frames/s (clips x 16) per wall second, and clips per CPU second of the process tree
(this process and its workers, psutil). ``vs best peer`` is the wall rate over the fastest of the
loaders that are not naiad's; ``vs ceiling`` over the ceiling's; ``vs ceiling (CPU)`` is clips per
CPU second over the best bare loop's (what a clip costs against the bare decode, whatever else
the machine runs). Run: ``python bench/bench_video.py [--videos 24 --seconds 4 --rounds 3
--workers 2]``. The decoder comparison is ``bench/bench_video_decoder.py``; memory over epochs
and the first batch from fresh videos ``bench/bench_video_memory.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import av
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, markdown_table  # noqa: E402
from harness import epoch_rate as harness_epoch_rate  # noqa: E402
from video_peers import (  # noqa: E402
    CROP,
    FPS,
    FRAMES,
    SHORTER,
    SPAN,
    STRIDE,
    label_of,
    shorter_side,
    spdl_clip,
    spdl_loader,
    spdl_version,
    torchcodec_loader,
    torchcodec_version,
    webdataset_loader,
    why_not,
    write_shards,
)

import naiad  # noqa: E402

SIZES = ((320, 240), (640, 360))
GOPS = (30, 250)
SHARDS = 4
CODEC = "libx264" if "libx264" in av.codecs_available else "mpeg4"


def write_video(path: Path, width: int, height: int, frames: int, gop: int, seed: int) -> None:
    """A moving textured scene (a random low-resolution texture scaled up, panning, with a square
    crossing it): enough motion and detail that the codec does real work."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 8 + 2, width // 8 + 2, 3), dtype=np.uint8)
    texture = np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(CODEC, rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        if CODEC == "libx264":
            stream.options = {"bf": "2", "crf": "23", "preset": "veryfast",
                              "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
        else:
            stream.bit_rate = 2_000_000
        for i in range(frames):
            dx, dy = (2 * i) % 16, i % 16
            pixels = np.ascontiguousarray(texture[dy:dy + height, dx:dx + width])
            x = (7 * i) % max(1, width - 40)
            pixels[40:80, x:x + 40] = (255 - 2 * i % 256, 128, 2 * i % 256)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def make_folder(count: int, seconds: float, root: Path) -> list[str]:
    """``count`` videos in four class folders, evenly over SIZES x GOPS; their paths."""
    paths = []
    for k in range(count):
        width, height = SIZES[k % 2]
        gop = GOPS[(k // 2) % 2]
        folder = root / f"class{k % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{k:04d}_{width}x{height}_g{gop}.mp4"
        write_video(path, width, height, int(seconds * FPS), gop, seed=k)
        paths.append(str(path))
    return sorted(paths)


# --- the per-sample dataset, as PyAV's docs and torchvision's read_video write it --------------------


def decode_frames(container: Any, start: int | None, rng: random.Random | None = None, threads_off: bool = False,
                  scaler: tuple[int, int] | None = None) -> list[np.ndarray]:
    """Frames ``start, start + STRIDE, ...`` of an open video (``start`` None: drawn from ``rng``
    over the starts that fit): seek to the keyframe before ``start``, decode to the last, each kept
    frame as an ``[H, W, 3]`` uint8 array (``scaler``: resized to (width, height) by FFmpeg's
    scaler on the way)."""
    stream = container.streams.video[0]
    if threads_off:
        stream.thread_type = "NONE"
    if start is None:
        start = (rng or random).randint(0, max(int(stream.frames) - SPAN, 0))
    wanted = set(range(start, start + SPAN, STRIDE))
    last = start + SPAN - 1
    out: dict[int, np.ndarray] = {}
    rate, base = stream.average_rate, stream.time_base
    first_pts = stream.start_time or 0
    container.seek(first_pts + int(start / (rate * base)), stream=stream, backward=True, any_frame=False)
    for frame in container.decode(stream):
        number = int(round(float((frame.pts - first_pts) * base * rate)))
        if number in wanted:
            if scaler is None:
                out[number] = frame.to_ndarray(format="rgb24")
            else:
                out[number] = frame.reformat(width=scaler[0], height=scaler[1], format="rgb24").to_ndarray()
        if number >= last:
            break
    have = sorted(out)
    return [out[n] if n in out else out[have[-1]] for n in sorted(wanted)]  # pad a short end


def pyav_clip(source: str | BinaryIO, start: int | None, rng: random.Random | None = None, threads_off: bool = False,
              scaler: tuple[int, int] | None = None) -> list[np.ndarray]:
    """:func:`decode_frames` of a file (a path or an open binary file)."""
    with av.open(source) as container:
        return decode_frames(container, start, rng, threads_off, scaler)


def frame_count(path: str) -> int:
    with av.open(path) as container:
        return int(container.streams.video[0].frames)


def frame_size(path: str) -> tuple[int, int]:
    """(width, height) after the resize to the shorter side."""
    with av.open(path) as container:
        context = container.streams.video[0].codec_context
        return shorter_side(context.width, context.height)


def torch_resize_crop(frames: list[np.ndarray], rng: random.Random) -> torch.Tensor:
    """``Resize(128)`` (bilinear, antialiased, on the float clip) then ``RandomCrop(112)``: uint8 [T, 3, 112, 112]."""
    clip = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()
    height, width = clip.shape[-2:]
    rw, rh = shorter_side(width, height)
    clip = F.interpolate(clip, size=(rh, rw), mode="bilinear", align_corners=False, antialias=True)
    y, x = rng.randint(0, rh - CROP), rng.randint(0, rw - CROP)
    return clip[:, :, y:y + CROP, x:x + CROP].round().clamp(0, 255).to(torch.uint8)


def pyav_random_clip(source: str | BinaryIO, rng: random.Random) -> torch.Tensor:
    """A random clip of a video, PyAV's decode and torch's resize and crop (the webdataset row's map)."""
    return torch_resize_crop(pyav_clip(source, None, rng), rng)


class PyAVClips(torch.utils.data.Dataset):
    """One random clip of each video per ``__getitem__``, decoded and resized per sample."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.labels = [label_of(p) for p in paths]
        self.counts = [frame_count(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = random.Random(torch.randint(0, 2**31, ()).item())  # torch's per-worker seeding
        start = rng.randint(0, max(self.counts[i] - SPAN, 0))
        return torch_resize_crop(pyav_clip(self.paths[i], start), rng), self.labels[i]


# --- the bare loops: fn(path, start, (width, height) resized, rng) -------------------------------------


def bare_scaler(path: str, start: int, size: tuple[int, int], rng: random.Random) -> np.ndarray:
    """PyAV's decode (threads off) with FFmpeg's scaler: resize in the YUV->RGB pass, then crop."""
    rw, rh = size
    y, x = rng.randint(0, rh - CROP), rng.randint(0, rw - CROP)
    frames = pyav_clip(path, start, threads_off=True, scaler=size)
    return np.stack([f[y:y + CROP, x:x + CROP] for f in frames]).transpose(0, 3, 1, 2)


def bare_torch(path: str, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    """PyAV's decode (threads off) to full-size RGB, then torch's resize and crop."""
    return torch_resize_crop(pyav_clip(path, start, threads_off=True), rng)


def bare_torchcodec(path: str, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    """torchcodec's decoder (one FFmpeg thread, its default) with its own Resize and RandomCrop."""
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import RandomCrop, Resize

    decoder = VideoDecoder(path, seek_mode="approximate", transforms=[Resize((size[1], size[0])), RandomCrop((CROP, CROP))])
    return decoder.get_frames_at(list(range(start, start + SPAN, STRIDE))).data


def bare_spdl(path: str, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    """SPDL's ``load_video`` of the clip's window with its filter graph (one decode thread, its default)."""
    return spdl_clip(path, start, *size)


_NAIAD_DECODE: list[Any] = []


def bare_naiad(path: str, start: int, size: tuple[int, int], rng: random.Random) -> torch.Tensor:
    """naiad's ``decode_video`` called on one video in this process, no loader: its seek, its
    unreferenced frames left undecoded, FFmpeg's scaler (the clip's start its own keyed draw)."""
    if not _NAIAD_DECODE:
        _NAIAD_DECODE.append(naiad.decode_video("video", frames=FRAMES, stride=STRIDE, size=CROP, resize=SHORTER,
                                                crop="random"))
    with open(path, "rb") as f:
        data = f.read()
    batch = {"video": np.array([data], dtype=object), "__index__": np.array([rng.randrange(1 << 30)])}
    return _NAIAD_DECODE[0](batch)["video"]


def bare_loops() -> dict[str, Callable[[str, int, tuple[int, int], random.Random], Any] | str]:
    """The bare loops, a peer's a reason when it does not load."""
    loops: dict[str, Callable[[str, int, tuple[int, int], random.Random], Any] | str] = {
        "bare loop, PyAV + FFmpeg's scaler": bare_scaler, "bare loop, PyAV + torch's resize": bare_torch,
        "bare loop, naiad's decode_video": bare_naiad}
    for name, version, fn in (("torchcodec + its Resize, RandomCrop", torchcodec_version, bare_torchcodec),
                              ("SPDL load_video + its filter graph", spdl_version, bare_spdl)):
        try:
            version()
            loops["bare loop, " + name] = fn
        except Exception as e:  # a peer that does not load
            loops["bare loop, " + name] = why_not(e)
    return loops


def bare_rate(fn: Callable[[str, int, tuple[int, int], random.Random], Any], paths: list[str], counts: list[int],
              sizes: list[tuple[int, int]]) -> tuple[float, float]:
    """Clips per wall second and per CPU second of one process decoding one clip of every video."""
    rng = random.Random(0)
    order = list(range(len(paths)))
    rng.shuffle(order)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in order:
        fn(paths[i], rng.randint(0, max(counts[i] - SPAN, 0)), sizes[i], rng)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(paths) / elapsed, len(paths) / max(cpu, 1e-9)


# --- the loaders -------------------------------------------------------------------------------------


def _clips_of(batch: Any) -> int:
    video = batch["video" if "video" in batch else "mp4"] if isinstance(batch, dict) else batch[0]
    if tuple(video.shape[1:]) != (FRAMES, 3, CROP, CROP):
        raise RuntimeError(f"a batch of shape {tuple(video.shape)}")
    return len(video)


def epoch_rate(loader: Iterable[Any], clips: int) -> tuple[float, float]:
    """Clips per wall second and per CPU second of the process tree, over one epoch."""
    return harness_epoch_rate(loader, clips, _clips_of)


PEERS = ("torch + PyAV dataset", "torch + torchcodec dataset", "webdataset + PyAV", "SPDL pipeline")


def loaders(root: Path, paths: list[str], urls: list[str], counts: list[int], sizes: list[tuple[int, int]],
            args: argparse.Namespace) -> dict[str, Callable[[], Any] | str]:
    """Each loader's factory, or why it does not run."""
    common = {"batch_size": args.batch, "num_workers": args.workers, "persistent_workers": True}
    train = {"frames": FRAMES, "stride": STRIDE, "size": CROP, "resize": SHORTER, "crop": "random"}
    folder = naiad.decode_video("video", **train)
    shards = naiad.decode_video("mp4", **train)
    return {
        "torch + PyAV dataset": lambda: torch.utils.data.DataLoader(PyAVClips(paths), shuffle=True, **common),
        "torch + torchcodec dataset": torchcodec_loader(paths, args.batch, args.workers),
        "webdataset + PyAV": webdataset_loader(urls, args.batch, args.workers, pyav_random_clip),
        "SPDL pipeline": spdl_loader(paths, counts, sizes, args.batch, args.workers),
        "naiad folder": lambda: naiad.DataLoader(naiad.read_videos(str(root)), shuffle=True, seed=0,
                                                 transform=folder, **common),
        "naiad shards": lambda: naiad.DataLoader(
            naiad.read_webdataset(urls, index_dir=str(root.parent / "index")), shuffle=True, seed=0,
            transform=shards, **common),
    }


def versions() -> str:
    """The decoders' versions, a peer's reason when it does not load."""
    got = [f"PyAV {av.__version__} ({CODEC})"]
    for name, version in (("torchcodec", torchcodec_version), ("SPDL", spdl_version)):
        try:
            got.append(f"{name} {version()}")
        except Exception as e:  # a peer that does not load
            got.append(f"{name}: {why_not(e)}")
    try:
        import webdataset
        got.append(f"webdataset {getattr(webdataset, '__version__', '?')}")
    except ImportError as e:
        got.append(f"webdataset: {why_not(e)}")
    return ", ".join(got)


def measure(made: dict[str, Any], bare: dict[str, Callable[..., Any]], paths: list[str], counts: list[int],
            sizes: list[tuple[int, int]], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each loader's and bare loop's (clips/s, clips/CPU s) per round, after a warm-up."""
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in [*made, *bare]}
    for fn in bare.values():  # warm-up (the loaders' was their first epoch, in main)
        bare_rate(fn, paths, counts, sizes)
    for r in range(rounds):
        for name, loader in made.items():
            rates[name].append(epoch_rate(loader, len(paths)))
        for name, fn in bare.items():
            rates[name].append(bare_rate(fn, paths, counts, sizes))
        print(f"  round {r + 1} done", flush=True)
    return rates


def table(rates: dict[str, list[tuple[float, float]]], bare: dict[str, Any], skipped: dict[str, str], cores: int) -> str:
    med = {name: (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
           for name, got in rates.items()}
    torch_wall, torch_cpu = med["torch + PyAV dataset"]
    best_peer = max(med[name][0] for name in PEERS if name in med)
    ceiling = max(med[name][0] for name in bare) * cores
    # The bare loop's clips per CPU second: what one clip costs with nothing around it. On a busy
    # machine the wall ceiling falls with the share of a core the loop gets; this does not.
    bare_cpu = max(med[name][1] for name in bare)
    rows = []
    for name, (wall, cpu) in med.items():
        single = name in bare
        runs = ", ".join(f"{w / best_peer:.2f}" for w, _ in rates[name])
        rows.append([name + (" (1 process)" if single else ""), f"{wall:,.1f}", f"{wall * FRAMES:,.0f}",
                     f"{cpu:,.1f}", f"{wall / torch_wall:.2f}x", f"{wall / best_peer:.2f}x", f"{cpu / torch_cpu:.2f}x",
                     "" if single else f"{wall / ceiling:.2f}x", f"{cpu / bare_cpu:.2f}x", runs])
    rows.append([f"ceiling: the best bare loop x {cores} cores", f"{ceiling:,.1f}", f"{ceiling * FRAMES:,.0f}",
                 f"{bare_cpu:,.1f}", f"{ceiling / torch_wall:.2f}x", f"{ceiling / best_peer:.2f}x", "", "1.00x", "1.00x", ""])
    rows += [[name, "not run: " + why, "", "", "", "", "", "", "", ""] for name, why in skipped.items()]
    rows.append(["DALI", "not run: its video reader decodes on NVIDIA GPUs only (none here)", "", "", "", "", "", "",
                 "", ""])
    return markdown_table(["loader", "clips/s (wall)", "frames/s (wall)", "clips/CPU s", "vs torch + PyAV",
                           "vs best peer", "vs torch (CPU)", "vs ceiling", "vs ceiling (CPU)",
                           "rounds vs best peer's median"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--videos", type=int, default=24)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(environment())
    print(f"{versions()}; {args.videos} videos of {args.seconds:g} s at {FPS} fps "
          f"({' and '.join(f'{w}x{h}' for w, h in SIZES)}, keyframe every {' and '.join(map(str, GOPS))}), "
          f"{FRAMES} frames stride {STRIDE}, shorter side {SHORTER}, crop {CROP}, {args.workers} workers, "
          f"batches of {args.batch}, {args.rounds} rounds, {cores} cores; load average {os.getloadavg()[0]:.2f} (1 min)",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="naiad-bench-video-") as tmp:
        root = Path(tmp) / "train"
        t0 = time.perf_counter()
        paths = make_folder(args.videos, args.seconds, root)
        urls = write_shards(paths, Path(tmp) / "shards", SHARDS)
        print(f"  videos written in {time.perf_counter() - t0:.1f} s "
              f"({sum(os.path.getsize(q) for q in paths) / 2**20:.1f} MiB, {len(urls)} shards)", flush=True)
        counts = [frame_count(q) for q in paths]
        sizes = [frame_size(q) for q in paths]
        skipped: dict[str, str] = {}
        bare: dict[str, Callable[..., Any]] = {}
        for name, fn in bare_loops().items():
            if isinstance(fn, str):
                skipped[name] = fn
            else:
                bare[name] = fn
        made: dict[str, Any] = {}
        for name, make in loaders(root, paths, urls, counts, sizes, args).items():
            try:
                if isinstance(make, str):
                    raise RuntimeError(make)
                made[name] = make()
                epoch_rate(made[name], len(paths))  # one epoch: a peer that fails to run is left out, not fatal
            except Exception as e:  # a peer that does not load or run
                made.pop(name, None)
                skipped[name] = str(e) if isinstance(make, str) else why_not(e)
                print(f"  {name}: not run ({skipped[name]})", flush=True)
                if name.startswith("naiad") or name == "torch + PyAV dataset":
                    raise
        try:
            rates = measure(made, bare, paths, counts, sizes, args.rounds)
        finally:
            for loader in made.values():
                close = getattr(loader, "close", None)
                if close is not None:
                    close()
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    print(table(rates, bare, skipped, cores))


if __name__ == "__main__":
    main()
