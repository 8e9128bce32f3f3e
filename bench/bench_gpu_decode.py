"""Decoding JPEGs on the GPU against naiad's decode on the CPU: how many cores is a GPU worth?

One workload, made here (nothing is downloaded): ImageNet-shaped JPEGs (about 500x375 and
375x500, quality 90, the photo-like images of bench_decode.py) through the classic evaluation
transform (decode, shorter side to 256, centre crop 224), into a ``uint8 [B, 3, 224, 224]``
batch. Images/s of:

* ``torchvision on <device>``: what a user with a GPU would do instead: batched
  ``torchvision.io.decode_jpeg(list_of_tensors, device=...)`` (nvJPEG on CUDA), then per image an
  antialiased bilinear resize and the centre crop with torch ops on the same device, stacked.
  The encoded bytes go up from pageable memory inside the call; the timing ends with a
  ``torch.cuda.synchronize()``.
* ``naiad t=1`` and ``naiad t=N``: ``naiad.decode_images("image", resize=256, crop="center",
  size=224)`` on the CPU with 1 thread and with the default (N = the usable cores).

Then the ratios: the GPU path against naiad's default, and against one thread (the CPU cores
the GPU's decode is worth). Both outputs are compared pixel by pixel (mean absolute difference
on a 0-255 scale): the decoders' IDCTs and the resizes' rounding differ slightly, a wrong channel
order or crop does not pass. Exit status 1 when they disagree.

Without torchvision, or with ``--device cuda`` and no CUDA, the GPU side is skipped with the
reason (the CPU side still runs). ``--dry-run``: a handful of images, one round, torchvision (if
installed) on the CPU, so the script is tested on a machine with no GPU.

Run: ``PYTHONPATH=src python bench/bench_gpu_decode.py [--images 512] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402
from naiad.parallel.threads import usable_cores  # noqa: E402

#: The disagreement (mean absolute difference, 0-255) above which the two pipelines are taken to
#: compute different things: decoders and resizes that round differently stay within a few levels.
MAX_MEAN_ABS_DIFF = 20.0


def make_jpegs(count: int, unique: int) -> list[bytes]:
    """``count`` ImageNet-shaped JPEGs, ``unique`` of them distinct (cycled: making a photo costs
    more than decoding it, and a decoder keeps nothing from one image to the next)."""
    from bench_decode import encode, photo  # Pillow's encoder; bench_decode needs Pillow

    rng = np.random.default_rng(0)
    distinct = []
    for _ in range(min(count, unique)):
        w, h = (500, 375) if rng.random() < 0.8 else (375, 500)
        w, h = int(w * rng.uniform(0.9, 1.1)), int(h * rng.uniform(0.9, 1.1))
        distinct.append(encode(photo(rng, w, h), "JPEG", quality=90))
    return [distinct[i % len(distinct)] for i in range(count)]


def resize_centre_crop(image: torch.Tensor, shorter: int, crop: int) -> torch.Tensor:
    """torchvision's ``Resize(shorter)`` (bilinear, antialiased) then ``CenterCrop(crop)`` of one
    ``uint8 [C, H, W]`` image, with torch ops on the image's device."""
    _, h, w = image.shape
    rw, rh = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
    # Float on the device: torch's uint8 antialiased resize is a CPU kernel only.
    resized = F.interpolate(image[None].float(), size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
    out = resized[0].round_().clamp_(0, 255).to(torch.uint8)
    top, left = int(round((rh - crop) / 2)), int(round((rw - crop) / 2))
    return out[:, top : top + crop, left : left + crop]


def torchvision_decoder(device: str, batch: int) -> tuple[Callable[[list[bytes]], torch.Tensor] | None, str]:
    """The GPU path as a function of the encoded images, or None and why it cannot run here."""
    try:
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as exc:
        return None, f"torchvision is not installed ({exc})"
    if device.startswith("cuda") and not torch.cuda.is_available():
        return None, f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)"
    label = f"torchvision {torchvision.__version__} decode_jpeg on {device}"

    def decode(datas: list[bytes]) -> torch.Tensor:
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # frombuffer of read-only bytes: only read
            for start in range(0, len(datas), batch):
                encoded = [torch.frombuffer(d, dtype=torch.uint8) for d in datas[start : start + batch]]
                images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)
                out.append(torch.stack([resize_centre_crop(im, 256, 224) for im in images]))
        result = torch.cat(out)
        if result.is_cuda:
            torch.cuda.synchronize(result.device)
        return result

    return decode, label


def naiad_decoder(threads: int | None, batch: int) -> Callable[[list[bytes]], torch.Tensor]:
    """naiad's CPU decode of the same images, a batch of ``batch`` at a time, as the loader's
    ``transform=`` would run it."""
    evaluate = naiad.decode_images("image", resize=256, crop="center", size=224, threads=threads)

    def decode(datas: list[bytes]) -> torch.Tensor:
        return torch.cat([evaluate({"image": datas[s : s + batch]})["image"] for s in range(0, len(datas), batch)])

    return decode


def measure(methods: dict[str, Callable[[], object]], images: int, rounds: int) -> dict[str, float]:
    """Median images per second of each method, the methods interleaved in every round (so a
    noisy neighbour slows them all alike), after one warm-up call each (nvJPEG's handles, thread
    pools, CUDA kernels' first launch)."""
    for fn in methods.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(images / (time.perf_counter() - t0))
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--images", type=int, default=512, help="JPEGs per round (default 512)")
    parser.add_argument("--unique", type=int, default=128, help="distinct JPEGs among them (default 128)")
    parser.add_argument("--batch", type=int, default=128, help="images per decode call (default 128)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--device", default="cuda", help="the torchvision side's device (default cuda)")
    parser.add_argument("--threads", type=int, default=None, help="naiad's threads (default: the usable cores)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
    parser.add_argument(
        "--dry-run", action="store_true", help="8 images, 1 round, torchvision on the CPU: a check of the script"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.images, args.unique, args.batch, args.rounds, args.device = 8, 8, 4, 1, "cpu"
    for name in ("images", "unique", "batch", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        from PIL import Image
    except ImportError:
        print("bench_gpu_decode: failed: Pillow is not installed; naiad's CPU decode and the test images need it")
        return 1
    from naiad.media.images import simplejpeg

    torch.set_num_threads(1)  # as in a DataLoader worker: the threads are the decoder's
    cores = usable_cores()
    threads = args.threads or cores
    print(environment())
    print(f"command: python bench/bench_gpu_decode.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    jpeg_path = (
        f"simplejpeg {simplejpeg().__version__} (libjpeg-turbo, DCT-domain shrink)"
        if simplejpeg() is not None
        else "Pillow (simplejpeg is not installed: naiad's fast JPEG path is off, so its CPU rates "
        "are below what naiad[images] gives)"
    )
    print(f"naiad's CPU JPEG path: {jpeg_path}; Pillow {getattr(Image, '__version__', '?')}")
    print(f"CPU threads: naiad t={threads} (usable cores {cores}), torch intra-op threads {torch.get_num_threads()}")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})")

    t0 = time.perf_counter()
    datas = make_jpegs(args.images, args.unique)
    print(
        f"data: {len(datas)} JPEGs ({min(args.unique, args.images)} distinct), quality 90, "
        f"mean {statistics.mean(map(len, datas)) / 1024:.1f} KiB, made in {time.perf_counter() - t0:.1f} s; "
        f"batches of {args.batch}, {args.rounds} rounds"
    )

    gpu, gpu_label = torchvision_decoder(args.device, args.batch)
    cpu_one, cpu_all = naiad_decoder(1, args.batch), naiad_decoder(threads, args.batch)
    methods: dict[str, Callable[[], object]] = {
        "naiad t=1": lambda: cpu_one(datas),
        f"naiad t={threads}": lambda: cpu_all(datas),
    }
    if gpu is None:
        print(f"bench_gpu_decode: GPU side skipped: {gpu_label}")
    else:
        methods[gpu_label] = lambda: gpu(datas)
    rates = measure(methods, len(datas), args.rounds)

    results: dict[str, Any] = {
        "environment": environment(),
        "images": len(datas),
        "batch": args.batch,
        "rounds": args.rounds,
        "threads": threads,
        "usable_cores": cores,
        "naiad_jpeg_path": "simplejpeg" if simplejpeg() is not None else "pillow",
        "images_per_s": rates,
        "gpu_side": gpu_label,
    }
    rows = [[name, f"{rate:.0f}", f"{rate / rates[f'naiad t={threads}']:.2f}x", f"{rate / rates['naiad t=1']:.2f}x"]
            for name, rate in rates.items()]
    status = 0
    if gpu is not None:
        ratio_all = rates[gpu_label] / rates[f"naiad t={threads}"]
        ratio_one = rates[gpu_label] / rates["naiad t=1"]
        head = datas[: args.batch]
        diff = (gpu(head).cpu().int() - cpu_all(head).int()).abs().float().mean().item()
        results.update(gpu_over_naiad=ratio_all, gpu_over_one_thread=ratio_one, mean_abs_diff=diff)
    print()
    print(f"Images per second, decode + resize 256 + centre crop 224 (median of {args.rounds} rounds):")
    print(markdown_table(["method", "images/s", f"/ naiad t={threads}", "/ naiad t=1"], rows))
    if gpu is not None:
        verdict = "agree" if diff <= MAX_MEAN_ABS_DIFF else "DISAGREE"
        print(
            f"\npixels: mean |torchvision - naiad| = {diff:.2f} of 255 on the first {len(head)} images: {verdict} "
            f"(<= {MAX_MEAN_ABS_DIFF:g}: the same transform, decoders and resizes rounding differently)"
        )
        if diff > MAX_MEAN_ABS_DIFF:
            print("bench_gpu_decode: failed: the two pipelines do not compute the same images")
            status = 1
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
