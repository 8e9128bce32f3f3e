"""Workers: how fast do they start, how well do they scale, what does a batch's trip cost?

Two questions, naiad's DataLoader beside torch's in the same run (fork, the Linux default):

1. Time to first batch with ``num_workers=2``: construct the loader, ``next(iter(loader))``.
   Target: naiad <= 0.3 s. On an in-memory ``TensorDataset`` (the tutorial's data) and on a
   per-sample Python dataset.
2. A CPU-bound per-sample transform (about 200 µs of NumPy work per row, calibrated at start):
   one epoch with 0 and with 2 workers (a fresh loader: start-up included), and a second epoch
   of persistent workers (steady state); the speed-up of 2 over 0, naiad against torch (and
   naiad's thread workers), and the CPU the training process itself spent on loading.
(How fast batches cross from the workers, by size, is ``bench/bench_transport.py``'s question.)

Times are medians over ``--repeats`` runs; the machine is shared and noisy, so read the ratios.

Run: ``python bench/bench_workers.py [--repeats 5] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

Loader = Callable[..., Any]
LOADERS: dict[str, Loader] = {"torch": TorchDataLoader, "naiad": naiad.DataLoader}


def median_of(fn: Callable[[], float], repeats: int) -> float:
    return interleaved({"": fn}, repeats)[""]


def interleaved(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median of each function's result, running them in turn so noise hits all alike."""
    values: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            values[k].append(fn())
            gc.collect()
    return {k: statistics.median(v) for k, v in values.items()}


# -- 1. time to first batch ---------------------------------------------------------------------


class Rows(Dataset):
    """A per-sample dataset over a list of small arrays (torch's per-sample path in both loaders)."""

    def __init__(self, n: int) -> None:
        self.x = np.random.default_rng(0).random((n, 8), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.x[i], i % 2


def first_batch_s(make: Loader, dataset: Any, **kw: Any) -> float:
    t0 = time.perf_counter()
    loader = make(dataset, batch_size=128, shuffle=True, num_workers=2, **kw)
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - t0
    del it, loader  # teardown is not part of the wait for the first batch
    gc.collect()
    return elapsed


def bench_first_batch(repeats: int) -> tuple[str, list[list[Any]]]:
    g = torch.Generator().manual_seed(0)
    datasets = {
        "TensorDataset 1M x 8 (in memory)": TensorDataset(torch.randn(1_000_000, 8, generator=g), torch.randint(0, 2, (1_000_000,), generator=g)),
        "per-sample Dataset, 100k rows": Rows(100_000),
    }
    rows = []
    for name, ds in datasets.items():
        t = interleaved({k: functools.partial(first_batch_s, make, ds) for k, make in LOADERS.items()}, repeats)
        rows.append([name, f"{t['torch']:.3f}", f"{t['naiad']:.3f}", f"{t['torch'] / t['naiad']:.2f}x", "yes" if t["naiad"] <= 0.3 else "NO"])
    return "Time to first batch, num_workers=2, batch 128 (s; median)", rows


# -- 2. CPU-bound per-sample transform ----------------------------------------------------------


def _numpy_work(row: np.ndarray, reps: int) -> np.ndarray:
    out = row
    for _ in range(reps):
        out = np.sqrt(np.abs(np.fft.rfft(out, 256)[:128].real) + 1.0)
    return out


def calibrate(target_s: float = 200e-6) -> int:
    row = np.random.default_rng(0).random(128)
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(50):
            _numpy_work(row, reps)
        per_row = (time.perf_counter() - t0) / 50
        if per_row >= target_s or reps > 10_000:
            return max(1, round(reps * target_s / per_row))
        reps *= 2


class Augmented(Dataset):
    """Each row costs ``reps`` rounds of small NumPy work, like a per-sample augmentation."""

    def __init__(self, n: int, reps: int) -> None:
        self.x = np.random.default_rng(0).random((n, 128))
        self.reps = reps

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(_numpy_work(self.x[i], self.reps))


def epoch_s(make: Loader, dataset: Any, workers: int, **kw: Any) -> float:
    t0 = time.perf_counter()
    for _ in make(dataset, batch_size=32, shuffle=True, num_workers=workers, **kw):
        pass
    return time.perf_counter() - t0


def _rows_work(dataset: Augmented, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        dataset[i]


def ceiling_s(dataset: Augmented, workers: int) -> float:
    """The same rows with no loader: inline, or split over ``workers`` forked processes. The
    ratio is what the machine offers at that moment (other jobs share its cores)."""
    import multiprocessing as mp

    n = len(dataset)
    t0 = time.perf_counter()
    if workers == 0:
        _rows_work(dataset, 0, n)
    else:
        ctx = mp.get_context("fork")
        step = -(-n // workers)
        procs = [ctx.Process(target=_rows_work, args=(dataset, lo, min(n, lo + step))) for lo in range(0, n, step)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    return time.perf_counter() - t0


def steady(make: Loader, dataset: Any, **kw: Any) -> tuple[float, float]:
    """A second epoch with persistent workers (no start-up): its seconds, and the CPU seconds
    the training process itself used (what the loader takes from the training loop)."""
    import psutil

    me = psutil.Process()
    loader = make(dataset, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True, **kw)
    for _ in loader:
        pass
    c0 = me.cpu_times()
    t0 = time.perf_counter()
    for _ in loader:
        pass
    elapsed = time.perf_counter() - t0
    c1 = me.cpu_times()
    del loader
    return elapsed, (c1.user + c1.system) - (c0.user + c0.system)


def bench_transform(repeats: int, rows: int) -> tuple[str, list[list[Any]], float]:
    reps = calibrate()
    ds = Augmented(rows, reps)
    t0 = time.perf_counter()
    for i in range(200):
        ds[i]
    per_row_us = (time.perf_counter() - t0) / 200 * 1e6
    variants: dict[str, tuple[Loader, dict[str, Any]]] = {
        "torch": (TorchDataLoader, {}),
        "naiad (processes)": (naiad.DataLoader, {}),
        "naiad (threads)": (naiad.DataLoader, {"worker_mode": "thread"}),
    }
    fns: dict[str, Callable[[], float]] = {
        "torch/0": functools.partial(epoch_s, TorchDataLoader, ds, 0),
        "naiad/0": functools.partial(epoch_s, naiad.DataLoader, ds, 0),
    }
    fns["ceiling/0"] = functools.partial(ceiling_s, ds, 0)
    fns["ceiling/2"] = functools.partial(ceiling_s, ds, 2)
    cpu: dict[str, list[float]] = {name: [] for name in variants}

    def steady_s(name: str, make: Loader, kw: dict[str, Any]) -> float:
        seconds, main_cpu = steady(make, ds, **kw)
        cpu[name].append(main_cpu)
        return seconds

    for name, (make, kw) in variants.items():
        fns[f"{name}/2"] = functools.partial(epoch_s, make, ds, 2, **kw)
        fns[f"{name}/steady"] = functools.partial(steady_s, name, make, kw)
    t = interleaved(fns, repeats)
    c_0, c_2 = t["ceiling/0"], t["ceiling/2"]
    out = [["no loader: 2 processes split the rows (the machine's ceiling)", f"{c_0:.2f}", f"{c_2:.2f}", f"{c_0 / c_2:.2f}x", "-", "-", "-"]]
    for name in variants:
        t_0 = t["torch/0" if name == "torch" else "naiad/0"]
        t_2, t_s = t[f"{name}/2"], t[f"{name}/steady"]
        out.append([
            name, f"{t_0:.2f}", f"{t_2:.2f}", f"{t_0 / t_2:.2f}x", f"{t_s:.2f}", f"{t_0 / t_s:.2f}x",
            f"{statistics.median(cpu[name]):.3f}",
        ])
    title = f"CPU-bound transform: {rows:,} rows, {per_row_us:.0f} µs of NumPy per row, batch 32 (epoch s; median)"
    return title, out, per_row_us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4096, help="rows of the transform benchmark")
    parser.add_argument("--out", help="write the results as markdown here")
    parser.add_argument("--only", choices=("first", "transform"))
    args = parser.parse_args()
    env = environment()
    print(env, flush=True)
    load_start = os.getloadavg()[0]
    sections = []
    if args.only in (None, "first"):
        title, rows = bench_first_batch(args.repeats)
        sections.append((title, ["dataset", "torch", "naiad", "torch / naiad", "naiad <= 0.3 s"], rows))
        print(f"\n{title}\n{markdown_table(sections[-1][1], rows)}", flush=True)
    if args.only in (None, "transform"):
        title, rows, _ = bench_transform(args.repeats, args.rows)
        header = [
            "loader", "0 workers", "2 workers (with start-up)", "speed-up", "2 workers, persistent (2nd epoch)",
            "speed-up", "training-process CPU s (2nd epoch)",
        ]
        sections.append((title, header, rows))
        print(f"\n{title}\n{markdown_table(sections[-1][1], rows)}", flush=True)
    # The machines are shared: a load above the core count means other jobs took the cores.
    load = f"load average (1 min) at the start {load_start:.1f}, at the end {os.getloadavg()[0]:.1f}"
    print(f"\n{load}")
    if args.out:
        command = "python bench/bench_workers.py " + " ".join(sys.argv[1:])
        text = [f"# Workers benchmark\n\n`{command}`\n\n{env}; {load}\n"]
        text += [f"## {title}\n\n{markdown_table(header, rows)}\n" for title, header, rows in sections]
        with open(args.out, "a" if os.path.exists(args.out) else "w") as f:
            f.write("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
