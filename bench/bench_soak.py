"""Soak: many epochs with persistent process workers; does anything grow?

Runs ``--epochs`` epochs (default 100) over a small streaming CSV source and over a per-sample
map-style dataset, both with ``persistent_workers=True`` and process workers, and records after
each epoch: the RSS of the main process and of the workers (and the workers' USS, the pages
only they hold), open file descriptors, threads, and
the entries in /dev/shm. Prints a least-squares slope per epoch for each, fitted after a warm-up
(the first ``--warmup`` epochs fill caches and allocator pools), and the change from the first
fitted epoch to the last. Flat means the slope times the number of epochs is small against the
value itself (a few hundred KiB of RSS over 100 epochs is allocator noise; one fd or thread per
epoch is a leak). The main process's RSS also holds the telemetry's trace ring, which fills up
to 100,000 events (about 14 MiB) and then stays: ``trace_events`` shows where it is.

With ``--image-epochs N`` (default 20; 0 skips them) it also runs images with
``naiad.decode_images`` for N epochs, each loader with persistent process workers: 28x28 PNGs
from a class folder (decoded in the reads: NOTE [ Small samples decode in the reads ]), 96x96
JPEGs from WebDataset shards (decoded on the stream's stage, read by worker processes; a stream's
default thread workers would live in the loop's process), and, side by side, torch's
DataLoader over the same PNG folder opened with PIL per sample.

    python bench/bench_soak.py                 # about 3 minutes on 2 cores
    python bench/bench_soak.py --epochs 20     # a quick look
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

METRICS = ("main_rss_mib", "workers_rss_mib", "workers_uss_mib", "main_fds", "workers_fds", "main_threads", "workers_threads", "shm",
           "py_objects", "trace_events")


class Samples(Dataset):
    """A per-sample map-style dataset: torch's per-sample path, collated in the worker."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": np.full(16, i, np.float32), "y": i % 10}


def _shm_count() -> int:
    try:
        return len(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return 0


def _measure(pids: list[int], loader: Any) -> dict[str, float]:
    gc.collect()
    main = psutil.Process()
    workers = [psutil.Process(p) for p in pids]
    return {
        "main_rss_mib": main.memory_info().rss / 2**20,
        "workers_rss_mib": sum(w.memory_info().rss for w in workers) / 2**20,
        # Pages only the workers hold: a forked worker's RSS also grows as it touches (and so
        # copies) its parent's pages, up to the parent's size; its USS is what it allocated.
        "workers_uss_mib": sum(w.memory_full_info().uss for w in workers) / 2**20,
        "main_fds": main.num_fds(),
        "workers_fds": sum(w.num_fds() for w in workers),
        "main_threads": main.num_threads(),
        "workers_threads": sum(w.num_threads() for w in workers),
        "shm": _shm_count(),
        # Python objects alive in the main process: a leak of per-batch objects shows here.
        "py_objects": len(gc.get_objects()),
        # The telemetry's trace ring (100,000 events, then the oldest go): bounded growth.
        "trace_events": len(loader._telemetry._events) if isinstance(loader, naiad.DataLoader) else 0,
    }


def soak(name: str, loader: Any, epochs: int) -> list[dict[str, float]]:
    """Run ``epochs`` epochs; the measurements after each."""
    series = []
    t0 = time.perf_counter()
    for epoch in range(epochs):
        batches = 0
        for _ in loader:
            batches += 1
        assert batches > 0
        if isinstance(loader, naiad.DataLoader):
            # The persistent worker processes: this process's children (the loaders before it
            # are closed). Thread workers (a stream's default) live in this process: none then.
            pids = [c.pid for c in psutil.Process().children()]
        else:  # torch's DataLoader: its persistent iterator's worker processes
            pids = [w.pid for w in loader._iterator._workers]
        series.append(_measure(pids, loader))
        if epoch == 0:
            print(f"{name}: {batches} batches per epoch, workers {pids}", flush=True)
    print(f"{name}: {epochs} epochs in {time.perf_counter() - t0:.1f} s", flush=True)
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    else:
        del loader._iterator  # torch's: its persistent workers stop with the iterator
    return series


def slope(values: list[float]) -> float:
    """Least-squares slope per epoch."""
    if len(values) < 2:
        return 0.0
    x = np.arange(len(values), dtype=np.float64)
    return float(np.polyfit(x, np.asarray(values, np.float64), 1)[0])


def report(name: str, series: list[dict[str, float]], warmup: int) -> list[list[Any]]:
    rows = []
    fitted = series[warmup:]
    for metric in METRICS:
        values = [m[metric] for m in fitted]
        rows.append([name, metric, f"{values[0]:.1f}", f"{values[-1]:.1f}", f"{slope(values):+.4f}",
                     f"{slope(values) * len(values):+.2f}"])
    return rows


IMAGE_WARMUP = 3


def image_soaks(root: Path, args: argparse.Namespace) -> list[list[Any]]:
    """The image loaders' soaks (``--image-epochs``), side by side with torch's folder loader."""
    import webdataset as wds
    from bench_decode import photo
    from bench_images import FolderDataset, encode, pil_gray
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "png28"
    for i in range(8_000):
        arr = np.zeros((28, 28), np.uint8)
        arr[4:24, 6:22] = rng.integers(0, 256, (20, 16))
        (folder / f"class{i % 10}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(folder / f"class{i % 10}" / f"{i:05d}.png")
    shards = root / "shards"
    shards.mkdir()
    with wds.ShardWriter(str(shards / "s-%04d.tar"), maxcount=250, verbose=0) as sink:
        for i in range(1_000):
            sink.write({"__key__": f"{i:05d}", "jpg": encode(photo(rng, 160, 120), "JPEG", quality=90), "cls": i % 10})
    common: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True, "shuffle": True}
    loaders: dict[str, Any] = {
        "PNG folder, decoded in the reads": naiad.DataLoader(
            naiad.read_images(str(folder)), batch_size=256, seed=0,
            transform=naiad.decode_images("image", mode="L", size=(28, 28), crop="center"), **common),
        "JPEG shards, decoded on the stage": naiad.DataLoader(
            naiad.read_webdataset(str(shards / "*.tar"), index_dir=str(root / "index")), batch_size=64, seed=0,
            transform=naiad.decode_images("jpg", resize=112, crop="center", size=96), worker_mode="process",
            **common),
        "torch, PNG folder": torch.utils.data.DataLoader(FolderDataset(str(folder), pil_gray), batch_size=256,
                                                         **common),
    }
    rows = []
    for name, loader in loaders.items():
        rows += report(name, soak(name, loader, args.image_epochs), IMAGE_WARMUP)
    return [r for r in rows if r[1] in ("main_rss_mib", "workers_rss_mib", "workers_uss_mib", "shm", "main_threads",
                                            "workers_fds")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image-epochs", type=int, default=20, help="epochs of the image loaders (0: none)")
    args = parser.parse_args()
    print(environment())
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="naiad-soak-") as tmp:
        path = Path(tmp) / "rows.csv"
        n = 200_000
        ids = np.arange(n)
        table = np.column_stack([ids, ids * 0.5, ids % 7, (ids * 7919) % 1000])
        np.savetxt(path, table, delimiter=",", header="id,x,y,z", comments="", fmt=["%d", "%.1f", "%d", "%d"])
        common: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True, "shuffle": True, "seed": 0}
        stream = naiad.DataLoader(naiad.read_csv(str(path), block_bytes=64 << 10), batch_size=256,
                                  shuffle_buffer=4096, worker_mode="process", **common)
        mapped = naiad.DataLoader(Samples(16_384), batch_size=64, **common)
        rows = report("CSV stream", soak("CSV stream", stream, args.epochs), args.warmup)
        rows += report("map-style", soak("map-style", mapped, args.epochs), args.warmup)
        if args.image_epochs:
            rows += image_soaks(Path(tmp), args)
    print()
    print(f"{args.epochs} epochs ({args.image_epochs} for images), {args.workers} persistent process workers; "
          f"slopes fitted after {args.warmup} warm-up epochs ({IMAGE_WARMUP} for images)")
    print(markdown_table(["data", "metric", f"epoch {args.warmup}", "last epoch", "slope per epoch",
                          "slope x epochs"], rows))


if __name__ == "__main__":
    main()
