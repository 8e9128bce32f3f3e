"""Video clips: naiad against torch's DataLoader over a per-sample PyAV dataset, and the bare
decode loop (issue 39, item 6).

The data is made here with PyAV (H.264 through ``libx264`` where PyAV's FFmpeg has it, else
MPEG-4 part 2): ``--videos`` videos of ``--seconds`` seconds at 30 fps, split evenly over
320x240 and 640x360 and keyframe intervals 30 and 250, in four class folders (the Kinetics and
UCF101 layout). Every loader takes one 16-frame clip (stride 2) of each video per epoch, resized
to a shorter side of 128 and cropped to 112x112, in batches of ``--batch`` with ``--workers``
workers, shuffled; side by side in one run, alternating, medians of ``--rounds`` after a warm-up:

* ``torch + PyAV dataset``: torch's DataLoader over a map-style ``Dataset`` whose
  ``__getitem__`` decodes one clip as PyAV's docs and torchvision's ``read_video`` write it:
  open the file, seek to the keyframe before the clip (``container.seek(..., backward=True)``),
  decode to the clip's last frame, ``to_ndarray(format="rgb24")``, then torch: a bilinear
  antialiased resize of the float clip to the shorter side 128 and a random 112 crop (the
  ``Resize(128)`` + ``RandomCrop(112)`` of video recipes). PyAV's decoder threading left at its
  default, as a user leaves it.
* ``naiad, resize 128 + centre crop``: ``naiad.decode_video("video", frames=16, stride=2,
  size=112, resize=128, crop="center")``. The same work as the torch row (the crop's place does
  not change its cost): ``decode_video`` has no fixed-size random crop after a resize;
  ``crop="random"`` is ``RandomResizedCrop`` of the original frame and refuses ``resize=128``
  (a ConfigError), so the brief's ``crop="random", resize=128`` cannot be run as written.
* ``naiad, crop="random" (RandomResizedCrop)``: ``decode_video("video", frames=16, stride=2,
  size=112, crop="random")``: not the same work (each frame converted to RGB at full size, cut,
  then scaled), shown for what ``crop="random"`` costs.
* the bare loops, one process, no loader: PyAV's decode (threading off) with FFmpeg's scaler
  resizing (``frame.reformat``), and the same decode with torch's resize; the ceiling is the
  faster of the two times the cores.

Clips/s and frames/s (clips x 16) per wall second, and clips per CPU second of the process tree
(this process and its workers, psutil). ``vs ceiling`` is the wall rate over the ceiling's;
``vs ceiling (CPU)`` the clips per CPU second over the best bare loop's (what a clip costs
against the bare decode, whatever else the machine runs). Run: ``python bench/bench_video.py [--videos 24
--seconds 4 --rounds 3 --workers 2]``.
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
from typing import Any

import av
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, markdown_table  # noqa: E402
from harness import epoch_rate as harness_epoch_rate  # noqa: E402

import naiad  # noqa: E402

FRAMES, STRIDE, SHORTER, CROP, FPS = 16, 2, 128, 112, 30
SPAN = (FRAMES - 1) * STRIDE + 1
SIZES = ((320, 240), (640, 360))
GOPS = (30, 250)
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


# --- (a) the per-sample dataset, as PyAV's docs and torchvision's read_video write it ----------------


def pyav_clip(path: str, start: int, threads_off: bool = False, scaler: tuple[int, int] | None = None) -> list[Any]:
    """Frames ``start, start + STRIDE, ...`` of a video: seek to the keyframe before ``start``,
    decode to the last, each kept frame as an ``[H, W, 3]`` uint8 array (``scaler``: resized to
    (width, height) by FFmpeg's scaler on the way)."""
    wanted = set(range(start, start + SPAN, STRIDE))
    last = start + SPAN - 1
    out: dict[int, np.ndarray] = {}
    with av.open(path) as container:
        stream = container.streams.video[0]
        if threads_off:
            stream.thread_type = "NONE"
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


def frame_count(path: str) -> int:
    with av.open(path) as container:
        return int(container.streams.video[0].frames)


def shorter_side(width: int, height: int) -> tuple[int, int]:
    """(width, height) with the shorter side SHORTER, as torchvision's Resize(int)."""
    if width <= height:
        return SHORTER, int(SHORTER * height / width)
    return int(SHORTER * width / height), SHORTER


def torch_resize_crop(frames: list[np.ndarray], rng: random.Random) -> torch.Tensor:
    """``Resize(128)`` (bilinear, antialiased, on the float clip) then ``RandomCrop(112)``: uint8 [T, 3, 112, 112]."""
    clip = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()
    height, width = clip.shape[-2:]
    rw, rh = shorter_side(width, height)
    clip = F.interpolate(clip, size=(rh, rw), mode="bilinear", align_corners=False, antialias=True)
    y, x = rng.randint(0, rh - CROP), rng.randint(0, rw - CROP)
    return clip[:, :, y:y + CROP, x:x + CROP].round().clamp(0, 255).to(torch.uint8)


class PyAVClips(torch.utils.data.Dataset):
    """One random clip of each video per ``__getitem__``, decoded and resized per sample."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.labels = [int(Path(p).parent.name.removeprefix("class")) for p in paths]
        self.counts = [frame_count(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = random.Random(torch.randint(0, 2**31, ()).item())  # torch's per-worker seeding
        start = rng.randint(0, max(self.counts[i] - SPAN, 0))
        return torch_resize_crop(pyav_clip(self.paths[i], start), rng), self.labels[i]


# --- (c) the bare loops ------------------------------------------------------------------------------


def bare_scaler(path: str, start: int, rng: random.Random) -> np.ndarray:
    """PyAV's decode (threads off) with FFmpeg's scaler: resize in the YUV->RGB pass, then crop."""
    with av.open(path) as container:
        s = container.streams.video[0]
        width, height = s.codec_context.width, s.codec_context.height
    rw, rh = shorter_side(width, height)
    y, x = rng.randint(0, rh - CROP), rng.randint(0, rw - CROP)
    frames = pyav_clip(path, start, threads_off=True, scaler=(rw, rh))
    return np.stack([f[y:y + CROP, x:x + CROP] for f in frames]).transpose(0, 3, 1, 2)


def bare_torch(path: str, start: int, rng: random.Random) -> torch.Tensor:
    """PyAV's decode (threads off) to full-size RGB, then torch's resize and crop."""
    return torch_resize_crop(pyav_clip(path, start, threads_off=True), rng)


def bare_rate(fn: Callable[[str, int, random.Random], Any], paths: list[str], counts: list[int]) -> tuple[float, float]:
    """Clips per wall second and per CPU second of one process decoding one clip of every video."""
    rng = random.Random(0)
    order = list(range(len(paths)))
    rng.shuffle(order)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in order:
        fn(paths[i], rng.randint(0, max(counts[i] - SPAN, 0)), rng)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(paths) / elapsed, len(paths) / max(cpu, 1e-9)


# --- the loaders -------------------------------------------------------------------------------------


def _clips_of(batch: Any) -> int:
    video = batch["video"] if isinstance(batch, dict) else batch[0]
    if tuple(video.shape[1:]) != (FRAMES, 3, CROP, CROP):
        raise RuntimeError(f"a batch of shape {tuple(video.shape)}")
    return len(video)


def epoch_rate(loader: Iterable[Any], clips: int) -> tuple[float, float]:
    """Clips per wall second and per CPU second of the process tree, over one epoch."""
    return harness_epoch_rate(loader, clips, _clips_of)


def loaders(root: str, paths: list[str], args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    common = {"batch_size": args.batch, "num_workers": args.workers, "persistent_workers": True}
    same = naiad.decode_video("video", frames=FRAMES, stride=STRIDE, size=CROP, resize=SHORTER, crop="center")
    rrc = naiad.decode_video("video", frames=FRAMES, stride=STRIDE, size=CROP, crop="random")
    return {
        "torch + PyAV dataset": lambda: torch.utils.data.DataLoader(PyAVClips(paths), shuffle=True, **common),
        "naiad, resize 128 + centre crop": lambda: naiad.DataLoader(naiad.read_videos(root), shuffle=True, seed=0,
                                                                    transform=same, **common),
        'naiad, crop="random" (RandomResizedCrop)': lambda: naiad.DataLoader(naiad.read_videos(root), shuffle=True,
                                                                             seed=0, transform=rrc, **common),
    }


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
    print(f"PyAV {av.__version__} ({CODEC}), {args.videos} videos of {args.seconds:g} s at {FPS} fps "
          f"({' and '.join(f'{w}x{h}' for w, h in SIZES)}, keyframe every {' and '.join(map(str, GOPS))}), "
          f"{FRAMES} frames stride {STRIDE}, shorter side {SHORTER}, crop {CROP}, {args.workers} workers, "
          f"batches of {args.batch}, {args.rounds} rounds, {cores} cores; load average {os.getloadavg()[0]:.2f} (1 min)",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="naiad-bench-video-") as tmp:
        root = Path(tmp) / "train"
        t0 = time.perf_counter()
        paths = make_folder(args.videos, args.seconds, root)
        print(f"  videos written in {time.perf_counter() - t0:.1f} s "
              f"({sum(os.path.getsize(q) for q in paths) / 2**20:.1f} MiB)", flush=True)
        counts = [frame_count(q) for q in paths]
        bare = {"bare loop, FFmpeg's scaler": bare_scaler, "bare loop, torch's resize": bare_torch}
        made = {name: make() for name, make in loaders(str(root), paths, args).items()}
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in [*made, *bare]}
        try:
            for loader in made.values():
                epoch_rate(loader, len(paths))  # warm-up: workers started, listing kept, page cache
            for fn in bare.values():
                bare_rate(fn, paths, counts)
            for r in range(args.rounds):
                for name, loader in made.items():
                    rates[name].append(epoch_rate(loader, len(paths)))
                for name, fn in bare.items():
                    rates[name].append(bare_rate(fn, paths, counts))
                print(f"  round {r + 1} done", flush=True)
        finally:
            for loader in made.values():
                close = getattr(loader, "close", None)
                if close is not None:
                    close()
    med = {name: (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
           for name, got in rates.items()}
    torch_wall, torch_cpu = med["torch + PyAV dataset"]
    ceiling = max(med[name][0] for name in bare) * cores
    # The bare loop's clips per CPU second: what one clip costs with nothing around it. On a busy
    # machine the wall ceiling falls with the share of a core the loop gets; this does not.
    bare_cpu = max(med[name][1] for name in bare)
    rows = []
    for name, (wall, cpu) in med.items():
        single = name in bare
        runs = ", ".join(f"{w / torch_wall:.2f}" for w, _ in rates[name])
        rows.append([name + (" (1 process)" if single else ""), f"{wall:,.1f}", f"{wall * FRAMES:,.0f}",
                     f"{cpu:,.1f}", f"{wall / torch_wall:.2f}x", f"{cpu / torch_cpu:.2f}x",
                     "" if single else f"{wall / ceiling:.2f}x", f"{cpu / bare_cpu:.2f}x", runs])
    rows.append([f"ceiling: the best bare loop x {cores} cores", f"{ceiling:,.1f}", f"{ceiling * FRAMES:,.0f}",
                 f"{bare_cpu:,.1f}", f"{ceiling / torch_wall:.2f}x", "", "1.00x", "1.00x", ""])
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    print(markdown_table(["loader", "clips/s (wall)", "frames/s (wall)", "clips/CPU s", "vs torch",
                          "vs torch (CPU)", "vs ceiling", "vs ceiling (CPU)", "rounds vs torch's median"], rows))


if __name__ == "__main__":
    main()
