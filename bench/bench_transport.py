"""Process workers at memory bandwidth: how fast do batches cross from worker processes?

Side by side in one run, 2 process workers each, every loader with its defaults:

1. **Bytes**: a map-style dataset whose ``__getitems__`` returns a fresh uint8 tensor per batch
   (identity collate), batches of 64 KiB to 16 MiB: GB/s the training loop receives from naiad
   (batch slots, NOTE [ Batch transport ]), from naiad without slots (the transport before them:
   inline below 4 MiB, torch's shared memory above) and from torch's DataLoader, beside one
   core's memcpy of the same bytes (a warm ``np.copyto``). Targets: naiad >= 3x torch from 64 KiB
   to 10 MiB, >= 0.2x the memcpy.
2. **Samples collated in the workers**: a map-style dataset of in-memory 3x224x224 uint8 tensors
   (and an int label) per sample, torch's default collate, batch 64 (9.6 MB): GB/s from naiad,
   naiad without slots and torch.
3. **Batches made in naiad's workers against the loop's own process**: token windows
   (``read_tokens``, batch 32 x 1024) and 28x28 uint8 images (an ``ArrayDataset``, batch 256),
   with 0 workers and with 2 process workers. Target: token windows with 2 process workers >=
   0.5x the loop's own rate.
4. **A user's PIL dataset**: ImageNet-shaped JPEGs (about 500x375) decoded, resized to 224x224
   and turned into uint8 tensors per sample, default collate, batch 64: naiad against torch's
   DataLoader and against naiad without slots. Target: not below naiad without slots.

Rates are medians over ``--repeats`` rounds, the loaders taking turns within each round.

Run: ``python bench/bench_transport.py [--repeats 5] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tokens import make_file  # noqa: E402
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

try:
    from naiad.parallel import slots
except ImportError:  # a naiad before the slots (to measure it with --only pil): "no slots" is naiad
    slots = None

W = 2


def identity(batch: Any) -> Any:
    return batch


class ReadyBatches(Dataset[Any]):
    """Each index is a whole batch: a fresh uint8 tensor of ``nbytes`` (a copy of a template)."""

    def __init__(self, nbytes: int, n: int) -> None:
        self.template = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.template.clone()


def without_slots(make: Callable[[], float]) -> Callable[[], float]:
    """``make`` with the batch slots turned off (forked workers inherit the setting)."""

    def run() -> float:
        if slots is None:
            return make()
        saved, slots.MAX_SLOTS = slots.MAX_SLOTS, 0
        try:
            return make()
        finally:
            slots.MAX_SLOTS = saved

    return run


def rate(loader: Any, units: Callable[[Any], int], skip: int = 2) -> float:
    """Units per second over one epoch of ``loader``, its first ``skip`` batches (start-up) not timed."""
    it = iter(loader)
    for _ in range(skip):
        next(it)
    total, t0 = 0, time.perf_counter()
    for batch in it:
        total += units(batch)
    return total / (time.perf_counter() - t0)


def rounds(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    values: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            values[k].append(fn())
    return {k: statistics.median(v) for k, v in values.items()}


def memcpy_gb_s(nbytes: int) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    n = max(20, (2 << 30) // nbytes)
    t0 = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
    return n * nbytes / (time.perf_counter() - t0) / 1e9


def bytes_section(repeats: int) -> list[list[str]]:
    rows = []
    for nbytes in (64 << 10, 256 << 10, 1 << 20, 3 << 20, 10 << 20, 16 << 20):
        n = max(60, min(3000, (1500 << 20) // nbytes))
        data = ReadyBatches(nbytes, n)

        def run(make: Any, data: Any = data) -> float:
            loader = make(data, batch_size=1, num_workers=W, collate_fn=identity)
            return rate(loader, lambda b: b.numel()) / 1e9

        r = rounds({"naiad": lambda: run(naiad.DataLoader), "no slots": without_slots(lambda: run(naiad.DataLoader)),
                    "torch": lambda: run(TorchDataLoader)}, repeats)
        copy = memcpy_gb_s(nbytes)
        size = f"{nbytes >> 10} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
        rows.append([size, f"{r['naiad']:.2f}", f"{r['no slots']:.2f}", f"{r['torch']:.2f}", f"{copy:.1f}",
                     f"{r['naiad'] / r['torch']:.2f}x", f"{r['naiad'] / copy:.2f}x"])
        print(markdown_table(BYTES_HEADER, rows[-1:]).splitlines()[-1], flush=True)
    return rows


BYTES_HEADER = ["batch", "naiad GB/s", "naiad, no slots", "torch", "one core's memcpy", "naiad / torch",
                "naiad / memcpy"]


class SampleTensors(Dataset[Any]):
    """In-memory samples: a 3x224x224 uint8 tensor (one of 64) and an int label."""

    def __init__(self, n: int) -> None:
        self.images = [torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8) for _ in range(64)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i % 64], i


def collate_section(repeats: int) -> list[list[str]]:
    data = SampleTensors(64 * 60)

    def run(make: Any) -> float:
        return rate(make(data, batch_size=64, num_workers=W), lambda b: b[0].numel()) / 1e9

    r = rounds({"naiad": lambda: run(naiad.DataLoader), "no slots": without_slots(lambda: run(naiad.DataLoader)),
                "torch": lambda: run(TorchDataLoader)}, repeats)
    return [[f"{r['naiad']:.2f}", f"{r['no slots']:.2f}", f"{r['torch']:.2f}", f"{r['naiad'] / r['torch']:.2f}x"]]


def loop_section(repeats: int, tmp: str) -> list[list[str]]:
    path = os.path.join(tmp, "tokens.bin")
    make_file(path, 48 << 20)
    tokens = naiad.read_tokens(path, seq_len=1024)
    images = naiad.ArrayDataset({"image": np.random.default_rng(0).integers(0, 255, (60_000, 28, 28), dtype=np.uint8),
                                 "label": np.arange(60_000) % 10})
    cases = {"token windows (32 x 1024)": (tokens, 32, lambda b: b["input_ids"].numel()),
             "28x28 images (256)": (images, 256, lambda b: len(b["label"]))}
    rows = []
    for name, (data, batch, units) in cases.items():
        def run(workers: int, data: Any = data, batch: int = batch, units: Any = units) -> float:
            return rate(naiad.DataLoader(data, batch_size=batch, shuffle=True, seed=0, num_workers=workers), units)

        r = rounds({"0": lambda: run(0), "2": lambda: run(W), "2 no slots": without_slots(lambda: run(W))}, repeats)
        rows.append([name, f"{r['0'] / 1e6:.1f}M", f"{r['2'] / 1e6:.1f}M", f"{r['2 no slots'] / 1e6:.1f}M",
                     f"{r['2'] / r['0']:.2f}x"])
        print(rows[-1], flush=True)
    return rows


class PILImages(Dataset[Any]):
    """A user's per-sample dataset: decode a JPEG with PIL, resize to 224x224, a uint8 tensor."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        img = Image.open(io.BytesIO(self.blobs[i])).convert("RGB").resize((224, 224))
        return torch.from_numpy(np.array(img)).permute(2, 0, 1), i % 1000


def pil_section(repeats: int) -> list[list[str]]:
    from PIL import Image

    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(64):
        buf = io.BytesIO()
        pixels = rng.integers(0, 255, (375, 500, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        blobs.append(buf.getvalue())
    data = PILImages(blobs * 12)

    def run(make: Any) -> float:
        return rate(make(data, batch_size=64, shuffle=True, num_workers=W), lambda b: len(b[1]))

    r = rounds({"naiad": lambda: run(naiad.DataLoader), "no slots": without_slots(lambda: run(naiad.DataLoader)),
                "torch": lambda: run(TorchDataLoader)}, repeats)
    return [[f"{r['naiad']:.0f}", f"{r['no slots']:.0f}", f"{r['torch']:.0f}", f"{r['naiad'] / r['no slots']:.2f}x",
             f"{r['naiad'] / r['torch']:.2f}x"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=("bytes", "collate", "loop", "pil"))
    parser.add_argument("--out", help="write the results as markdown here")
    args = parser.parse_args()
    env = environment()
    print(env, flush=True)
    out = [f"Command: `python bench/bench_transport.py {' '.join(sys.argv[1:])}`", "", env, ""]
    if args.only in (None, "bytes"):
        rows = bytes_section(args.repeats)
        out += ["Bytes from 2 process workers (GB/s, median)", "", markdown_table(BYTES_HEADER, rows), ""]
    if args.only in (None, "collate"):
        rows = collate_section(args.repeats)
        header = ["naiad GB/s", "naiad, no slots", "torch", "naiad / torch"]
        out += ["Per-sample tensors, default collate, batch 64 x 3x224x224 uint8, 2 process workers (GB/s, median)",
                "", markdown_table(header, rows), ""]
    if args.only in (None, "loop"):
        with tempfile.TemporaryDirectory() as tmp:
            rows = loop_section(args.repeats, tmp)
        header = ["batches", "0 workers (items/s)", "2 process workers", "2, no slots", "2 / 0"]
        out += ["Made in the workers against the loop's own process (items/s, median)", "",
                markdown_table(header, rows), ""]
    if args.only in (None, "pil"):
        rows = pil_section(args.repeats)
        header = ["naiad images/s", "naiad, no slots", "torch", "naiad / no slots", "naiad / torch"]
        out += ["A user's PIL dataset, 2 process workers (images/s, median)", "", markdown_table(header, rows), ""]
    text = "\n".join(out)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
