"""How fast does naiad.read_tokens deliver training windows, against what nanoGPT users run?

One flat uint16 token file, made here as nanoGPT's ``prepare.py`` writes ``train.bin`` (a
``np.memmap`` filled with random GPT-2-range tokens; nothing is downloaded), read from the page
cache (it is read once before timing). Batches of ``--batch`` windows of ``--seq-len`` tokens,
tokens per second of:

* ``get_batch``: nanoGPT's ``train.py`` loop: the memmap made again for every batch (its fix for
  nanoGPT#287), ``torch.randint`` offsets, one ``torch.from_numpy(...astype(np.int64))`` per row
  for x and for y, ``torch.stack``. Random windows with replacement: no epoch, no resume.
* ``torch map-style``: the exactly-once way users write it: a ``Dataset`` whose ``__getitem__``
  slices window ``i`` out of a memmap (opened once per worker), under torch's DataLoader with
  ``shuffle=True`` and its default collate.
* ``naiad``: ``naiad.DataLoader(naiad.read_tokens(path, seq_len=...), shuffle=True, seed=0)``:
  every window once per epoch, resumable, a batch read with one call (pread, NOTE [ Reading
  windows with pread ]).

The two loaders run with 0 workers (in the loop's process, as ``get_batch`` runs) and with
``--workers`` worker processes; naiad also with ``--workers`` thread workers (``worker_mode=
"thread"``: no batch crosses a process boundary). Each method runs ``--batches`` batches per round, timed from its
first batch, the methods alternating in each of ``--rounds`` rounds; medians. The resident memory
each in-process method adds over its run is printed too (a memmap's pages count in it).

Run: ``python bench/bench_tokens.py [--tokens 64M] [--seq-len 1024] [--batch 12]``; the issue's
target size is ``--tokens 512M`` (a 1 GB file). The machines here are shared and noisy: compare
the ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402


def parse_count(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def make_file(path: str, n: int) -> None:
    """As nanoGPT's prepare.py: a uint16 memmap filled in slices."""
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(n,))
    rng = np.random.default_rng(0)
    step = 1 << 24
    for a in range(0, n, step):
        arr[a : a + step] = rng.integers(0, 50257, min(step, n - a), dtype=np.uint16)
    arr.flush()
    del arr


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def get_batch_batches(path: str, block_size: int, batch_size: int) -> Iterator[Any]:
    """nanoGPT train.py's get_batch('train'), on the CPU."""
    while True:
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i : i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix])
        yield x, y


class MemmapWindows(torch.utils.data.Dataset):
    """The map-style window dataset users write: window i from a memmap opened once per process."""

    def __init__(self, path: str, seq_len: int) -> None:
        self.path, self.seq_len = path, seq_len
        self.n = (os.path.getsize(path) // 2 - 1) // seq_len
        self.data: np.memmap | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.data is None:
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        w = torch.from_numpy(self.data[i * self.seq_len : (i + 1) * self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


def endless(make: Callable[[], Any]) -> Iterator[Any]:
    loader = make()
    try:
        while True:
            yield from loader
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()


def timed(batches: Iterator[Any], count: int, tokens_per_batch: int) -> tuple[float, float]:
    """Tokens/s over ``count`` batches after the first, and the RSS added meanwhile (MB)."""
    next(batches)
    before = rss_mb()
    t0 = time.perf_counter()
    for _ in range(count):
        next(batches)
    dt = time.perf_counter() - t0
    return count * tokens_per_batch / dt, rss_mb() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="64M", help="tokens in the file (512M: the issue's 1 GB file)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=12, help="windows per batch (nanoGPT's default 12)")
    ap.add_argument("--batches", type=int, default=1000, help="batches per method and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write the token file (default: a temporary folder)")
    args = ap.parse_args()
    n = parse_count(args.tokens)
    print(environment())
    folder = args.dir or tempfile.mkdtemp(prefix="naiad-bench-tokens-")
    path = os.path.join(folder, "train.bin")
    if not os.path.exists(path) or os.path.getsize(path) != 2 * n:
        t0 = time.perf_counter()
        make_file(path, n)
        print(f"wrote {path}: {n:,} tokens, {2 * n / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
    with open(path, "rb") as f:  # into the page cache: every method reads from memory
        while f.read(1 << 24):
            pass
    L, B = args.seq_len, args.batch
    tokens = naiad.read_tokens(path, seq_len=L)
    windows = MemmapWindows(path, L)
    per_batch = B * L
    methods: dict[str, Callable[[], Iterator[Any]]] = {
        "get_batch": lambda: get_batch_batches(path, L, B),
        "torch map-style, 0 workers": lambda: endless(lambda: torch.utils.data.DataLoader(windows, batch_size=B, shuffle=True)),
        "naiad, 0 workers": lambda: endless(lambda: naiad.DataLoader(tokens, batch_size=B, shuffle=True, seed=0)),
        f"torch map-style, {args.workers} workers": lambda: endless(lambda: torch.utils.data.DataLoader(
            windows, batch_size=B, shuffle=True, num_workers=args.workers, persistent_workers=True)),
        f"naiad, {args.workers} workers": lambda: endless(lambda: naiad.DataLoader(
            tokens, batch_size=B, shuffle=True, seed=0, num_workers=args.workers, persistent_workers=True)),
        f"naiad, {args.workers} thread workers": lambda: endless(lambda: naiad.DataLoader(
            tokens, batch_size=B, shuffle=True, seed=0, num_workers=args.workers, worker_mode="thread")),
    }
    rates: dict[str, list[float]] = {k: [] for k in methods}
    grown: dict[str, list[float]] = {k: [] for k in methods}
    for r in range(args.rounds):
        for name, make in methods.items():
            it = make()
            rate, rss = timed(it, args.batches, per_batch)
            close = getattr(it, "close", None)
            if close is not None:
                close()
            rates[name].append(rate)
            grown[name].append(rss)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1] / 1e6:.1f}M" for k, v in rates.items()))
    med = {k: statistics.median(v) for k, v in rates.items()}
    base = med["get_batch"]
    torch0, torchw = med["torch map-style, 0 workers"], med[f"torch map-style, {args.workers} workers"]
    rows = []
    for name in methods:
        same = torch0 if "0 workers" in name else torchw if "workers" in name else None
        rows.append([name, f"{med[name] / 1e6:.1f}", f"{med[name] / base:.2f}x",
                     f"{med[name] / same:.2f}x" if same else "-", f"{max(grown[name]):+.0f}" if name == "get_batch" or "0 workers" in name else "-"])
    print(f"\n{n:,} tokens ({2 * n / 1e6:.0f} MB), seq_len {L}, batch {B}, {args.batches} batches x {args.rounds} rounds (medians)\n")
    print(markdown_table(["method", "M tokens/s", "vs get_batch", "vs torch map-style (same workers)", "RSS added, MB"], rows))


if __name__ == "__main__":
    main()
