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

Then, over the same file and two more token files of half its tokens each (``--sections``):

* ``mixture``: ``naiad.mix([half0, half1], [0.5, 0.5])`` (by tokens) against the one file, the
  same total size, through naiad's loader with 0 workers, ``--workers`` worker processes and
  ``--workers`` thread workers, alternating per round; medians and the ratio mixture / one
  source. Target: >= 0.95 (NOTE [ Mixture table ] in tokens/mixture.py: a batch of a mixture
  is one index into a per-epoch table and one read, as a single source's).
* ``shift``: ``read_tokens(path, seq_len=..., shift=True)`` (windows that start at an offset
  drawn per epoch, NOTE [ Moving window boundaries ] in tokens/shift.py) against the same file
  without it, through naiad's loader with 0 workers, ``--workers`` worker processes and
  ``--workers`` thread workers, alternating per round; medians and the ratio shift / no shift.
  Target: no measurable cost (the offset is a cached lookup per batch; the reads are the same).
* ``resume``: a state saved at 90% of an epoch, then the time from ``load_state_dict`` to the
  first batch, with 0 workers and with ``--workers`` worker processes (their start counted), in
  the same process (dataset and loader made anew) and in a new process (the process's whole
  run shown beside it: imports, opening the files). The first batch must be the one the
  uninterrupted epoch delivered next. Target: under 1 s.
* ``memory``: resident memory (RSS) of the loop's process and of each of ``--workers`` worker
  processes (persistent) at the end of epochs 1 .. ``--epochs``, for the one file and the
  mixture: it must stay flat (windows are read with pread; a mixture's tables are per epoch,
  two at most).

Run: ``python bench/bench_tokens.py [--tokens 64M | --gb 1] [--seq-len 1024] [--batch 12]
[--sections throughput,mixture,shift,resume,memory]``; the issue's target size is ``--gb 1`` (a 1 GB
uint16 file: 512 Mi tokens; the halves add 1 GB more on disk). A quick check: ``--tokens 4M
--batches 200 --rounds 3 --epochs 3``. The machines here are shared and noisy: compare the
ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
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


def make_file(path: str, n: int, seed: int = 0) -> None:
    """As nanoGPT's prepare.py: a uint16 memmap filled in slices."""
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(n,))
    rng = np.random.default_rng(seed)
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


def timed(batches: Iterator[Any], count: int, tokens_per_batch: int) -> tuple[float, float, float]:
    """Tokens/s over ``count`` batches after the first, the RSS added meanwhile (MB), and tokens
    per CPU second of this process (all of the work with no worker processes: the cost, which a
    shared machine's scheduling does not change)."""
    next(batches)
    before = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(count):
        next(batches)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return count * tokens_per_batch / dt, rss_mb() - before, count * tokens_per_batch / max(cpu, 1e-9)


def throughput(args: argparse.Namespace, path: str) -> None:
    """naiad.read_tokens against nanoGPT's get_batch and torch's map-style loader."""
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
    med, grown = run_rounds(methods, args, per_batch)
    base = med["get_batch"]
    torch0, torchw = med["torch map-style, 0 workers"], med[f"torch map-style, {args.workers} workers"]
    rows = []
    for name in methods:
        same = torch0 if "0 workers" in name else torchw if "workers" in name else None
        rows.append([name, f"{med[name] / 1e6:.1f}", f"{med[name] / base:.2f}x",
                     f"{med[name] / same:.2f}x" if same else "-", f"{max(grown[name]):+.0f}" if name == "get_batch" or "0 workers" in name else "-"])
    print(f"\n{args.n:,} tokens ({2 * args.n / 1e6:.0f} MB), seq_len {L}, batch {B}, {args.batches} batches x {args.rounds} rounds (medians)\n")
    print(markdown_table(["method", "M tokens/s", "vs get_batch", "vs torch map-style (same workers)", "RSS added, MB"], rows))


def run_rounds(methods: dict[str, Callable[[], Iterator[Any]]], args: argparse.Namespace,
               per_batch: int, cpu_rates: dict[str, float] | None = None) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each method ``--batches`` batches per round, alternating, ``--rounds`` rounds: the median
    tokens/s of each, and the RSS each added per round (and, into ``cpu_rates``, the median
    tokens per CPU second of this process)."""
    rates: dict[str, list[float]] = {k: [] for k in methods}
    grown: dict[str, list[float]] = {k: [] for k in methods}
    per_cpu: dict[str, list[float]] = {k: [] for k in methods}
    for r in range(args.rounds):
        for name, make in methods.items():
            it = make()
            rate, rss, cpu_rate = timed(it, args.batches, per_batch)
            per_cpu[name].append(cpu_rate)
            close = getattr(it, "close", None)
            if close is not None:
                close()
            rates[name].append(rate)
            grown[name].append(rss)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1] / 1e6:.1f}M" for k, v in rates.items()), flush=True)
    if cpu_rates is not None:
        cpu_rates.update({k: statistics.median(v) for k, v in per_cpu.items()})
    return {k: statistics.median(v) for k, v in rates.items()}, grown


def one_and_mixture(path: str, halves: list[str], seq_len: int) -> dict[str, Any]:
    """The one file and the mixture of its two halves, 0.5/0.5 by tokens (made anew)."""
    parts = [naiad.read_tokens(h, seq_len=seq_len) for h in halves]
    return {"one source": naiad.read_tokens(path, seq_len=seq_len), "mixture": naiad.mix(parts, [0.5, 0.5], seed=0)}


def pair_throughput(args: argparse.Namespace, data: dict[str, Any]) -> list[list[str]]:
    """Two datasets (``data``'s first against its second) under the loader at 0 workers, W worker
    processes and W thread workers, alternating: a row per setting with both rates (M tokens/s),
    their ratio, and the ratio per CPU second of the loop's process (the whole cost without worker
    processes; with them the work is theirs, and that column would not count it)."""
    L, B, W = args.seq_len, args.batch, args.workers
    (base, _), (other, _) = data.items()
    configs = {"0 workers": {}, f"{W} workers": {"num_workers": W, "persistent_workers": True},
               f"{W} thread workers": {"num_workers": W, "worker_mode": "thread"}}
    methods: dict[str, Callable[[], Iterator[Any]]] = {}
    for config, kw in configs.items():
        for name, ds in data.items():
            methods[f"{name}, {config}"] = (lambda ds=ds, kw=kw: endless(
                lambda: naiad.DataLoader(ds, batch_size=B, shuffle=True, seed=0, **kw)))
    cpu: dict[str, float] = {}
    med, _ = run_rounds(methods, args, B * L, cpu)
    return [[config, f"{med[f'{base}, {config}'] / 1e6:.1f}", f"{med[f'{other}, {config}'] / 1e6:.1f}",
             f"{med[f'{other}, {config}'] / med[f'{base}, {config}']:.3f}",
             "-" if config == f"{W} workers" else f"{cpu[f'{other}, {config}'] / cpu[f'{base}, {config}']:.3f}"]
            for config in configs]


def mixture_throughput(args: argparse.Namespace, path: str, halves: list[str]) -> None:
    """(a) a two-source mixture against one source of the same size."""
    data = one_and_mixture(path, halves, args.seq_len)
    print(f"\nmixture: {data['mixture']!r}", flush=True)
    rows = pair_throughput(args, data)
    print(f"\n(a) two token files mixed 0.5/0.5 by tokens against one file of the same {args.n:,} tokens, "
          f"seq_len {args.seq_len}, batch {args.batch}, {args.batches} batches x {args.rounds} rounds (medians); "
          "target >= 0.95\n")
    print(markdown_table(["loader", "one source, M tokens/s", "mixture, M tokens/s", "mixture / one source",
                          "the same per CPU second"], rows))


def shift_throughput(args: argparse.Namespace, path: str) -> None:
    """``shift=True`` against the same file read without it."""
    L = args.seq_len
    rows = pair_throughput(args, {"no shift": naiad.read_tokens(path, seq_len=L),
                                  "shift": naiad.read_tokens(path, seq_len=L, shift=True)})
    print(f"\nshift=True against no shift over one file of {args.n:,} tokens, seq_len {L}, batch {args.batch}, "
          f"{args.batches} batches x {args.rounds} rounds (medians); target: 1.00 within the noise\n")
    print(markdown_table(["loader", "no shift, M tokens/s", "shift, M tokens/s", "shift / no shift",
                          "the same per CPU second"], rows))


def resume_child(args: argparse.Namespace) -> None:
    """In a new process: make the dataset and loader, time load_state_dict to the first batch."""
    with open(args.resume_child) as f:
        job = json.load(f)
    ds = one_and_mixture(job["path"], job["halves"], job["seq_len"])[job["dataset"]]
    loader = naiad.DataLoader(ds, batch_size=job["batch"], shuffle=True, seed=0, num_workers=job["workers"])
    t0 = time.perf_counter()
    loader.load_state_dict(job["state"])
    it = iter(loader)  # kept until timed: dropping it ends the pass (workers joined), not part of a resume
    first = next(it)
    dt = time.perf_counter() - t0
    del it
    loader.close()
    print(json.dumps({"seconds": dt, "first": first["input_ids"][:, 0].tolist()}))


def resume(args: argparse.Namespace, path: str, halves: list[str]) -> None:
    """(b) load_state_dict of a state saved at 90% of an epoch, to the first batch."""
    L, B = args.seq_len, args.batch
    rows = []
    for name in ("one source", "mixture"):
        ds = one_and_mixture(path, halves, L)[name]
        loader = naiad.DataLoader(ds, batch_size=B, shuffle=True, seed=0)
        it = iter(loader)
        at = int(len(loader) * 0.9)
        for _ in range(at):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        expected = next(it)["input_ids"][:, 0].tolist()
        del it
        loader.close()
        for workers in (0, args.workers):
            same, new, whole = [], [], []
            for _ in range(args.repeats):
                fresh = naiad.DataLoader(one_and_mixture(path, halves, L)[name], batch_size=B, shuffle=True, seed=0,
                                         num_workers=workers)
                t0 = time.perf_counter()
                fresh.load_state_dict(state)
                resumed = iter(fresh)  # kept until timed (see resume_child)
                first = next(resumed)["input_ids"][:, 0].tolist()
                same.append(time.perf_counter() - t0)
                del resumed
                fresh.close()
                assert first == expected, "the resumed first batch is not the one the epoch delivered next"
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                    json.dump({"path": path, "halves": halves, "seq_len": L, "batch": B, "dataset": name,
                               "workers": workers, "state": state}, f)
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, __file__, "--resume-child", f.name], capture_output=True,
                                     text=True, check=True)
                whole.append(time.perf_counter() - t0)
                os.unlink(f.name)
                child = json.loads(out.stdout.strip().splitlines()[-1])
                assert child["first"] == expected, "the new process resumed at another batch"
                new.append(child["seconds"])
            rows.append([name, workers, f"{at} of {len(loader)}", f"{statistics.median(same):.3f}",
                         f"{statistics.median(new):.3f}", f"{statistics.median(whole):.2f}"])
    print(f"\n(b) load_state_dict of a state at 90% of an epoch to the first batch, seconds (medians of "
          f"{args.repeats}); target < 1 s\n")
    print(markdown_table(["dataset", "workers", "batches delivered", "same process", "new process",
                          "new process, whole run"], rows))


def memory(args: argparse.Namespace, path: str, halves: list[str]) -> None:
    """(c) RSS of the loop's process and of each worker at the end of each epoch."""
    import psutil

    L, B, W = args.seq_len, args.batch, args.workers
    rows = []
    for name, ds in one_and_mixture(path, halves, L).items():
        loader = naiad.DataLoader(ds, batch_size=B, shuffle=True, seed=0, num_workers=W, persistent_workers=True)
        series: list[list[float]] = []
        try:
            for epoch in range(args.epochs):
                batches = sum(1 for _ in loader)
                pids = [p for p in loader._pool.worker_pids if p is not None]  # type: ignore[union-attr]
                rss = [psutil.Process().memory_info().rss] + [psutil.Process(p).memory_info().rss for p in pids]
                series.append([r / 2**20 for r in rss])
                print(f"{name}, epoch {epoch + 1}: {batches} batches, RSS MiB "
                      + ", ".join(f"{r:.0f}" for r in series[-1]), flush=True)
        finally:
            loader.close()
        for epoch, values in enumerate(series):
            rows.append([name, epoch + 1, f"{values[0]:.0f}", " / ".join(f"{v:.0f}" for v in values[1:])])
        grown = [last - first for first, last in zip(series[0], series[-1], strict=True)]
        verdict = "flat" if max(grown) < 8 else "GROWS"
        rows.append([name, f"1 -> {args.epochs}", f"{grown[0]:+.1f}",
                     " / ".join(f"{g:+.1f}" for g in grown[1:]) + f" ({verdict}: < 8 MiB)"])
    print(f"\n(c) resident memory at the end of each epoch, {W} worker processes (persistent), MiB\n")
    print(markdown_table(["dataset", "epoch", "loop's process", "workers"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="64M", help="tokens in the file")
    ap.add_argument("--gb", type=float, default=None, help="the file's size in GiB instead of --tokens (1: the issue's 1 GB file)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=12, help="windows per batch (nanoGPT's default 12)")
    ap.add_argument("--batches", type=int, default=1000, help="batches per method and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the memory section")
    ap.add_argument("--repeats", type=int, default=3, help="resumes timed per case in the resume section")
    ap.add_argument("--sections", default="throughput,mixture,resume,memory")
    ap.add_argument("--dir", default=None, help="where to write the token files (default: a temporary folder)")
    ap.add_argument("--resume-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.resume_child:
        resume_child(args)
        return
    args.n = int(args.gb * 2**30) // 2 if args.gb else parse_count(args.tokens)
    sections = args.sections.split(",")
    unknown = set(sections) - {"throughput", "mixture", "shift", "resume", "memory"}
    if unknown:
        ap.error(f"--sections: unknown {sorted(unknown)}")
    print(environment())
    folder = args.dir or tempfile.mkdtemp(prefix="naiad-bench-tokens-")
    try:
        run_sections(args, folder, sections)
    finally:
        if not args.dir:  # a folder of its own: its files (hundreds of MB) go with the run
            shutil.rmtree(folder, ignore_errors=True)


def run_sections(args: argparse.Namespace, folder: str, sections: list[str]) -> None:
    """The token files made (or found) in ``folder``, then each section asked for."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.bin")
    files = [(path, args.n, 0)]
    if set(sections) - {"throughput", "shift"}:
        files += [(os.path.join(folder, f"half{i}.bin"), args.n // 2, i + 1) for i in range(2)]
    for file, n, seed in files:
        if not os.path.exists(file) or os.path.getsize(file) != 2 * n:
            t0 = time.perf_counter()
            make_file(file, n, seed)
            print(f"wrote {file}: {n:,} tokens, {2 * n / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
        with open(file, "rb") as f:  # into the page cache: every method reads from memory
            while f.read(1 << 24):
                pass
    halves = [f for f, _, _ in files[1:]]
    if "throughput" in sections:
        throughput(args, path)
    if "mixture" in sections:
        mixture_throughput(args, path, halves)
    if "shift" in sections:
        shift_throughput(args, path)
    if "resume" in sections:
        resume(args, path, halves)
    if "memory" in sections:
        memory(args, path, halves)


if __name__ == "__main__":
    main()
