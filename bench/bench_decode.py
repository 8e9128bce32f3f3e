"""How fast does naiad.decode_images decode a batch, against the bare decode loops it is built on?

Three workloads, made here (nothing is downloaded): ImageNet-shaped JPEGs (about 500x375,
quality 90) and large photos (about 2000x1500, quality 90), both through the classic evaluation
transform (decode, shorter side to 256, centre crop 224); and FashionMNIST-shaped 28x28 grayscale
PNGs (decode only). For each, images/s of:

* ``pillow``: what a torchvision user's folder dataset does per image: ``Image.open``,
  ``convert("RGB")``, ``resize`` (bilinear) and ``crop``, then into the batch tensor.
* ``pillow+draft``: the same with ``Image.draft`` (Pillow's DCT-domain shrink), Pillow at its best.
* ``simplejpeg``: the bare loop naiad's fast path is made of (libjpeg-turbo decode, shrunk in the
  DCT where the target allows, torch's uint8 antialiased resize, crop), in one thread: the ceiling
  per core. (PNG: Pillow's decode alone.)
* ``naiad t=1`` and ``naiad t=N``: ``decode_images(...)`` on a batch with 1 thread and with the
  default (the usable cores).

Then the ratios: naiad on one thread against the one-thread ceiling, naiad's default against the
ceiling times the cores, and naiad against Pillow. And whether the decoders release the GIL:
each call on 1 and 2 threads, with the CPU the process got, beside two controls (a call known to
release the GIL and one known to hold it).

Run: ``python bench/bench_decode.py [--rounds 5]``. The machines here are shared and noisy:
compare the ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402
from naiad.parallel.threads import usable_cores  # noqa: E402

try:
    from PIL import Image
except ImportError:  # pragma: no cover
    sys.exit("bench_decode needs Pillow: pip install 'naiad[images]'")
try:
    import simplejpeg
except ImportError:  # pragma: no cover
    simplejpeg = None


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like image: smooth colour waves at random frequencies, a hard-edged disc, noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    f = rng.uniform(0.5, 2.0, size=6)
    base = np.stack(
        [128 + 90 * np.sin(x / (23 * f[c]) + c) * np.cos(y / (31 * f[c + 3]) + 2 * c) for c in range(3)], -1
    )
    cx, cy, r = rng.uniform(0.2, 0.8) * width, rng.uniform(0.2, 0.8) * height, min(width, height) / rng.uniform(4, 8)
    base[(x - cx) ** 2 + (y - cy) ** 2 < r**2] = rng.integers(0, 256, 3)
    base += rng.normal(0, 4.0, base.shape)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def make_data(count: int, big_count: int, png_count: int) -> dict[str, list[bytes]]:
    rng = np.random.default_rng(0)
    imagenet = []
    for _ in range(count):
        w, h = (500, 375) if rng.random() < 0.8 else (375, 500)
        w, h = int(w * rng.uniform(0.9, 1.1)), int(h * rng.uniform(0.9, 1.1))
        imagenet.append(encode(photo(rng, w, h), "JPEG", quality=90))
    large = [encode(photo(rng, 2000, 1500), "JPEG", quality=90) for _ in range(big_count)]
    mnist = []
    for _ in range(png_count):
        arr = np.zeros((28, 28), np.uint8)
        arr[4:24, 6:22] = rng.integers(0, 256, (20, 16))  # a garment-like blob on black
        mnist.append(encode(Image.fromarray(arr), "PNG"))
    return {"imagenet": imagenet, "large": large, "png28": mnist}


# --- the bare loops -------------------------------------------------------------------------


def _eval_box(w: int, h: int) -> tuple[int, int, int, int]:
    rw, rh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    return rw, rh, int(round((rw - 224) / 2)), int(round((rh - 224) / 2))


def pillow_eval(datas: list[bytes], draft: bool) -> torch.Tensor:
    out = torch.empty((len(datas), 3, 224, 224), dtype=torch.uint8)
    for i, data in enumerate(datas):
        im = Image.open(io.BytesIO(data))
        if draft:
            w, h = im.size
            short = min(w, h)
            im.draft("RGB", (w * 256 // short, h * 256 // short))
        im = im.convert("RGB")
        rw, rh, left, top = _eval_box(*im.size)
        im = im.resize((rw, rh), Image.BILINEAR).crop((left, top, left + 224, top + 224))
        out[i].copy_(torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1))
    return out


def simplejpeg_eval(datas: list[bytes]) -> torch.Tensor:
    assert simplejpeg is not None
    out = torch.empty((len(datas), 3, 224, 224), dtype=torch.uint8)
    for i, data in enumerate(datas):
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
        reduction = 1
        while reduction < 8 and min(w, h) / (reduction * 2) >= 256:
            reduction *= 2
        pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=-(-h // reduction), min_width=-(-w // reduction))
        rw, rh, left, top = _eval_box(w, h)
        image = torch.from_numpy(pixels).permute(2, 0, 1)[None]
        resized = F.interpolate(image, size=(rh, rw), mode="bilinear", antialias=True)[0]
        out[i].copy_(resized[:, top : top + 224, left : left + 224])
    return out


def pillow_png(datas: list[bytes]) -> torch.Tensor:
    out = torch.empty((len(datas), 1, 28, 28), dtype=torch.uint8)
    for i, data in enumerate(datas):
        out[i, 0].copy_(torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("L")).copy()))
    return out


# --- measuring ------------------------------------------------------------------------------


def rate(fn: Callable[[], object], images: int) -> tuple[float, float]:
    """Images per wall second and per CPU second (the process's, every thread's) of one call."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    fn()
    return images / (time.perf_counter() - wall0), images / max(1e-9, time.process_time() - cpu0)


def measure(methods: dict[str, Callable[[], object]], images: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median images per wall second and per CPU second of each method, the methods interleaved
    in every round (so a noisy neighbour slows them all alike)."""
    for fn in methods.values():
        fn()  # warm-up: imports, thread pools, caches
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            samples[name].append(rate(fn, images))
    return {
        name: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for name, v in samples.items()
    }


def threaded(fn: Callable[[list[bytes]], object], datas: list[bytes], threads: int) -> Callable[[], object]:
    """The bare loop split over ``threads`` threads, each taking its share of the images."""

    def run() -> None:
        shares = [datas[k::threads] for k in range(threads)]
        workers = [threading.Thread(target=fn, args=(share,)) for share in shares]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return run


def thread_probe(call: Callable[[], object], calls: int, rounds: int) -> list[str]:
    """``calls`` calls on one thread, then split over two: calls/s and the process's CPU seconds
    per wall second for each. A call that releases the GIL runs on both threads at once: two
    threads use about twice the CPU of one (when the cores are free) and finish sooner; one that
    holds it stays near one thread's CPU whatever the thread count."""

    def run(threads: int) -> tuple[float, float]:
        def share() -> None:
            for _ in range(calls // threads):
                call()

        workers = [threading.Thread(target=share) for _ in range(threads)]
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        return calls / wall, cpu / wall

    one = [run(1) for _ in range(rounds)]
    two = [run(2) for _ in range(rounds)]
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    return [f"{med(one, 0):.0f}", f"{med(two, 0):.0f}", f"{med(two, 0) / med(one, 0):.2f}x",
            f"{med(one, 1):.2f}", f"{med(two, 1):.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=128, help="ImageNet-shaped JPEGs (one batch)")
    parser.add_argument("--large", type=int, default=12, help="2000x1500 photos (one batch)")
    parser.add_argument("--pngs", type=int, default=1024, help="28x28 PNGs (one batch)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker: the threads are the decoder's
    cores = usable_cores()
    print(environment())
    print(f"Pillow {Image.__version__ if hasattr(Image, '__version__') else '?'}, simplejpeg "
          f"{getattr(simplejpeg, '__version__', 'not installed')}, usable cores {cores}, "
          f"load average {os.getloadavg()[0]:.1f} at the start (a shared machine: other jobs compete)")
    data = make_data(args.images, args.large, args.pngs)
    for name, datas in data.items():
        print(f"{name}: {len(datas)} images, mean {statistics.mean(map(len, datas)) / 1024:.1f} KiB encoded")

    evaluate = naiad.decode_images("image", resize=256, crop="center", size=224, threads=1)
    evaluate_all = naiad.decode_images("image", resize=256, crop="center", size=224)
    gray = naiad.decode_images("image", mode="L", size=28, resize="stretch", threads=1)
    gray_all = naiad.decode_images("image", mode="L", size=28, resize="stretch")
    rows: list[list[str]] = []
    cpu_rows: list[list[str]] = []
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for workload in ("imagenet", "large", "png28"):
        datas = data[workload]
        batch = {"image": datas}
        if workload == "png28":
            bare: Callable[[list[bytes]], object] = pillow_png
            methods: dict[str, Callable[[], object]] = {
                "pillow": lambda d=datas: pillow_png(d),
                "bare 2 threads": threaded(pillow_png, datas, 2),
                "naiad t=1": lambda b=batch: gray(b),
                f"naiad t={cores}": lambda b=batch: gray_all(b),
            }
        else:
            bare = simplejpeg_eval if simplejpeg is not None else (lambda d: pillow_eval(d, True))
            methods = {
                "pillow": lambda d=datas: pillow_eval(d, False),
                "pillow+draft": lambda d=datas: pillow_eval(d, True),
                "simplejpeg": lambda d=datas, f=bare: f(d),
                "bare 2 threads": threaded(bare, datas, 2),
                "naiad t=1": lambda b=batch: evaluate(b),
                f"naiad t={cores}": lambda b=batch: evaluate_all(b),
            }
        both = measure(methods, len(datas), args.rounds)
        results[workload] = both
        for k, table in ((0, rows), (1, cpu_rows)):
            got = {name: v[k] for name, v in both.items()}
            ceiling = got.get("simplejpeg", got["pillow"])
            table.append(
                [workload]
                + [f"{got[m]:.0f}" if m in got else "-" for m in ("pillow", "pillow+draft", "simplejpeg")]
                + [f"{got['bare 2 threads']:.0f}", f"{got['naiad t=1']:.0f}", f"{got[f'naiad t={cores}']:.0f}"]
                + [
                    f"{got['naiad t=1'] / ceiling:.2f}x",
                    f"{got[f'naiad t={cores}'] / (ceiling * (cores if k == 0 else 1)):.2f}x",
                    f"{got[f'naiad t={cores}'] / got['pillow']:.2f}x",
                ]
            )
    header = ["workload", "pillow", "pillow+draft", "simplejpeg (ceiling/core)", "bare 2 threads", "naiad t=1",
              f"naiad t={cores}", "naiad t=1 / ceiling"]
    print()
    print(f"Images per wall second (median of {args.rounds} rounds, one batch of each workload per round; "
          "ceiling = simplejpeg's loop, Pillow's for PNG):")
    print(markdown_table(header + [f"naiad t={cores} / (ceiling x {cores})", f"naiad t={cores} / pillow"], rows))
    print()
    print("Images per CPU second (the process's CPU time, all threads: the work per image, which a busy "
          "machine disturbs less than the wall clock):")
    print(markdown_table(header + [f"naiad t={cores} / ceiling", f"naiad t={cores} / pillow"], cpu_rows))
    one = data["imagenet"][0]
    probes = {"pillow decode": lambda: Image.open(io.BytesIO(one)).load()}
    if simplejpeg is not None:
        probes["simplejpeg decode"] = lambda: simplejpeg.decode_jpeg(one, "RGB")
    image = torch.from_numpy(np.asarray(Image.open(io.BytesIO(one)).convert("RGB")).copy()).permute(2, 0, 1)[None]
    probes["torch uint8 resize"] = lambda: F.interpolate(image, size=(256, 341), mode="bilinear", antialias=True)
    pil_image = Image.open(io.BytesIO(one)).convert("RGB")
    probes["pillow resize"] = lambda: pil_image.resize((341, 256), Image.BILINEAR)
    # Controls: hashlib releases the GIL over large buffers, a Python loop holds it. When the
    # control that releases it does not speed up either, the machine is not giving this process
    # a second core (a shared machine: the scheduler shares CPU out per session, not per thread),
    # and the probe cannot tell.
    chunk = b"x" * (1 << 20)
    probes["control: hashlib.sha256 of 1 MiB (releases)"] = lambda: hashlib.sha256(chunk).digest()
    probes["control: a Python loop (holds)"] = lambda: sum(range(20000))
    resizers = {
        "Pillow resize (bilinear)": lambda: pil_image.resize((341, 256), Image.BILINEAR),
        "Pillow resize, reducing_gap=2": lambda: pil_image.resize((341, 256), Image.BILINEAR, reducing_gap=2.0),
        "torch uint8 antialiased (naiad)": lambda: F.interpolate(image, size=(256, 341), mode="bilinear", antialias=True),
    }
    times: dict[str, list[float]] = {name: [] for name in resizers}
    for _ in range(args.rounds):
        for name, fn in resizers.items():
            t0 = time.perf_counter()
            for _ in range(50):
                fn()
            times[name].append((time.perf_counter() - t0) / 50 * 1e3)
    print()
    print(f"Resize only, {pil_image.size[0]}x{pil_image.size[1]} to 341x256, one thread (median ms per image):")
    print(markdown_table(["resizer", "ms"], [[k, f"{statistics.median(v):.3f}"] for k, v in times.items()]))
    print()
    print("Threads: each call on 1 thread, then split over 2 (calls/s; CPU = the process's CPU seconds per wall "
          "second; a call that releases the GIL uses more CPU on 2 threads):")
    print(markdown_table(
        ["call", "1 thread /s", "2 threads /s", "speed-up", "CPU, 1 thread", "CPU, 2 threads"],
        [[k, *thread_probe(v, 60, args.rounds)] for k, v in probes.items()],
    ))


if __name__ == "__main__":
    main()
