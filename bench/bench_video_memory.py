"""Video clips with naiad's defaults: resident memory over epochs, and the time to the first
batch from a folder of fresh videos (issue 39, item 6: "resident memory flat over 10 epochs,
first batch from 1,000 fresh videos in under 1 s").

``--section memory``: ``--videos`` videos as ``bench_video.py`` writes them (320x240 and
640x360 H.264, keyframe intervals 30 and 250), ``--epochs`` shuffled epochs of
``naiad.DataLoader(naiad.read_videos(root), batch_size=8, shuffle=True, transform=decode_video(
"video", frames=16, stride=2, size=112, resize=128, crop="random"))``: with the defaults
(``num_workers=0``: the clips decode on the decode stage's threads in this process) and with 2
persistent process workers (the decode in the workers). After each epoch: the RSS and PSS of the
training process and of its workers (psutil; PSS counts a page shared by n processes 1/n to
each), and the workers' USS. ``growth`` is the last epoch's minus the first's.

``--section first-batch``: ``--fresh`` tiny videos (64x48, 36 frames at 30 fps, H.264,
``ultrafast``) written in four class folders, then, in a new process that has imported naiad
(the clock starts after the imports), ``read_videos(root)`` (the folder never listed before) to
the first batch of the same loader, with the defaults and with 2 workers; each in its own
folder, so each lists a folder it never saw. Median of ``--repeats`` folders.

Run: ``python bench/bench_video_memory.py [--section memory first-batch] [--videos 48 --epochs 10
--fresh 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_video import make_folder  # noqa: E402
from harness import environment, markdown_table  # noqa: E402
from video_peers import CROP, FRAMES, SHORTER, STRIDE  # noqa: E402

MiB = 2**20
TRAIN = {"frames": FRAMES, "stride": STRIDE, "size": CROP, "resize": SHORTER, "crop": "random"}


def loader(root: str, workers: int) -> Any:
    import naiad

    extra = {"num_workers": workers, "persistent_workers": True} if workers else {}
    return naiad.DataLoader(naiad.read_videos(root), batch_size=8, shuffle=True,
                            transform=naiad.decode_video("video", **TRAIN), **extra)


def memory(workers: int, root: str, epochs: int, count: int) -> list[dict[str, float]]:
    """Per epoch: main RSS and PSS, the workers' summed RSS, PSS and USS, in MiB."""
    import psutil

    me = psutil.Process()
    got = []
    data = loader(root, workers)
    try:
        for _ in range(epochs):
            seen = sum(len(b["video"]) for b in data)
            if seen != count:
                raise RuntimeError(f"an epoch delivered {seen} clips, expected {count}")
            main = me.memory_full_info()
            row = {"main_rss": main.rss / MiB, "main_pss": main.pss / MiB, "workers": 0,
                   "workers_rss": 0.0, "workers_pss": 0.0, "workers_uss": 0.0}
            for child in me.children(recursive=True):
                try:
                    info = child.memory_full_info()
                except psutil.Error:
                    continue
                row["workers"] += 1
                row["workers_rss"] += info.rss / MiB
                row["workers_pss"] += info.pss / MiB
                row["workers_uss"] += info.uss / MiB
            got.append(row)
    finally:
        data.close()
    return got


def write_tiny(root: Path, count: int) -> None:
    """``count`` 64x48 H.264 videos of 36 frames in four class folders."""
    rng = np.random.default_rng(0)
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    for k in range(count):
        folder = root / f"class{k % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        with av.open(str(folder / f"{k:05d}.mp4"), "w") as container:
            stream = container.add_stream(codec, rate=30)
            stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
            if codec == "libx264":
                stream.options = {"preset": "ultrafast", "crf": "28"}
            for i in range(36):
                frame = av.VideoFrame.from_ndarray(np.roll(base, 2 * i, axis=1), format="rgb24")
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)


CHILD = """
import json, sys, time
sys.path.insert(0, {bench!r})
import bench_video_memory as b
import naiad, av, torch
t0 = time.perf_counter()
data = b.loader({root!r}, {workers})
batch = next(iter(data))
first = time.perf_counter() - t0
assert tuple(batch["video"].shape) == (8, 16, 3, 112, 112), batch["video"].shape
data.close()
print(json.dumps({{"first_s": first}}))
"""


def first_batch(root: str, workers: int) -> float:
    """Seconds from ``read_videos(root)`` to the first batch, in a new process (imports done)."""
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), root=root, workers=workers)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(json.loads(out.stdout.strip().splitlines()[-1])["first_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--section", nargs="+", default=["memory", "first-batch"], choices=["memory", "first-batch"])
    p.add_argument("--videos", type=int, default=48)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--fresh", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(environment())
    print(f"PyAV {av.__version__}; clips of {FRAMES} frames stride {STRIDE}, shorter side {SHORTER}, crop {CROP}, "
          f"batches of 8; load average {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    with tempfile.TemporaryDirectory(prefix="naiad-bench-video-memory-") as tmp:
        if "memory" in args.section:
            root = Path(tmp) / "train"
            make_folder(args.videos, args.seconds, root)
            rows = []
            for workers in (0, 2):
                got = memory(workers, str(root), args.epochs, args.videos)
                first, last = got[0], got[-1]
                name = "defaults (num_workers=0)" if workers == 0 else "num_workers=2, persistent"
                for key, label in (("main_rss", "main RSS"), ("main_pss", "main PSS"),
                                   ("workers_rss", "workers' RSS (sum)"), ("workers_pss", "workers' PSS (sum)"),
                                   ("workers_uss", "workers' USS (sum)")):
                    if workers == 0 and key.startswith("workers"):
                        continue
                    series = [g[key] for g in got]
                    rows.append([name, label, f"{first[key]:.1f}", f"{last[key]:.1f}", f"{last[key] - first[key]:+.1f}",
                                 f"{max(series):.1f}", " ".join(f"{v:.0f}" for v in series)])
                print(f"  memory, {workers} workers done", flush=True)
            print(f"\n{args.videos} videos of {args.seconds:g} s, {args.epochs} epochs, MiB after each epoch:")
            print(markdown_table(["loader", "measure", "epoch 1", f"epoch {args.epochs}", "growth", "max", "per epoch"],
                                 rows))
        if "first-batch" in args.section:
            rows = []
            for workers in (0, 2):
                times = []
                for r in range(args.repeats):
                    root = Path(tmp) / f"fresh-{workers}-{r}"
                    t0 = time.perf_counter()
                    write_tiny(root, args.fresh)
                    wrote = time.perf_counter() - t0
                    times.append(first_batch(str(root), workers))
                    print(f"  {args.fresh} videos written in {wrote:.1f} s; first batch {times[-1]:.3f} s", flush=True)
                name = "defaults (num_workers=0)" if workers == 0 else "num_workers=2"
                rows.append([name, f"{statistics.median(times):.3f}", ", ".join(f"{t:.3f}" for t in times)])
            print(f"\nfirst batch from {args.fresh} fresh 64x48 videos (36 frames), seconds:")
            print(markdown_table(["loader", "median", "runs"], rows))


if __name__ == "__main__":
    main()
