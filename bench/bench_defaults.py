"""Do naiad's defaults come close to the best setting, on every format and size?

For each format and data size, one shuffled epoch (batch 1024, seed 0) through
``naiad.DataLoader(naiad.read(path), batch_size=1024, shuffle=True, seed=0)`` with nothing else
set, against a sweep of the settings a user could tune (worker count and mode, and for the text
formats the block size), in one process, settings alternating round after round, medians of
the epochs after a first one. Also, per format, the defaults' shuffle quality (correlation of
position in the epoch with row number; batch span, the median over batches of
(max row - min row) / N), and for CSV: PyArrow's multi-threaded whole-file read (the parser's
ceiling) in the same run, the first epoch of a fresh process (it counts the file's rows beside
its first reads), and the time to the first batch of a new process without and with the block
index, and without early reads (every row counted before the first read).

Every setting's order is measured too (the dry run over row numbers that ``naiad tune`` ranks
by: corr and batch span over two epochs), and the defaults are compared with the fastest setting
that mixes as well as ``naiad tune``'s bar (``|corr| <= 0.02``, batch span >= 98% of a full
permutation's, or the defaults' own figures where they miss it); the fastest of any order is
named beside it. The pick is then measured again against the defaults, in as many new rounds
alternating the two: the best of a dozen noisy medians is picked for its luck as well as its
speed, and the second ratio leaves the luck out.

Contention (the defaults must hold up when the cores are shared): ``--step-ms 5`` runs a
CPU-bound training step of about 5 ms after every batch (torch matmuls on all cores), as a CPU
training loop does; ``--busy 2`` keeps two spinning processes running beside the whole
measurement, as other jobs or preprocessing on the same machine do.

The table: ten columns (an int64 row id and nine floats with four decimals, about 74 bytes a
row as CSV). ``--sizes`` are CSV megabytes; every format gets the same rows (``txt``: each row
as one line of text, a string for ``naiad.read_text``, the CSV's lines without the header).

    python bench/bench_defaults.py --sizes 10,150,1000 --formats csv,jsonl,txt,parquet,arrow,npy
    python bench/bench_defaults.py --sizes 150 --formats csv,parquet --step-ms 5
    python bench/bench_defaults.py --sizes 150 --formats csv,parquet --busy 2

``--keep-parsed-bytes 0`` makes CSV, JSONL and text parse every epoch, as a source too big to keep its
parsed blocks does (NOTE [ Kept blocks ] in naiad/sources/decoded.py), at a size that runs quickly.
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

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import environment  # noqa: E402

import naiad  # noqa: E402
from naiad.cli.tune_measure import shuffle_figures  # noqa: E402
from naiad.cli.tune_report import quality_bar  # noqa: E402

BYTES_PER_ROW = 74
STEP: list[Any] = []  # the training step's operands and repeats, when --step-ms is given


def calibrate_step(ms: float) -> None:
    """Size a CPU-bound step (square float32 matmuls, torch's threads on every core) to ``ms``."""
    import torch

    a = torch.randn(384, 384)
    for _ in range(5):
        a @ a
    t = time.perf_counter()
    for _ in range(50):
        a @ a
    one = (time.perf_counter() - t) / 50
    STEP[:] = [a, max(1, round(ms / 1000 / one))]
    print(f"- training step: {STEP[1]} matmuls of 384x384 per batch, about {STEP[1] * one * 1000:.1f} ms")


def train_step() -> None:
    if STEP:
        a, n = STEP
        for _ in range(n):
            a @ a


def spin() -> None:  # a busy process beside the measurement
    while True:
        pass


def make_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    cols: dict[str, Any] = {"id": np.arange(rows, dtype=np.int64)}
    for i in range(9):
        cols[f"f{i}"] = np.round(rng.standard_normal(rows), 4)
    return pa.table(cols)


def write(table: pa.Table, fmt: str, folder: Path, files: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    paths = []
    for i in range(files):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        p = folder / f"part-{i:03d}.{fmt}"
        if not p.exists():
            if fmt == "csv":
                pacsv.write_csv(part, p)
            elif fmt == "txt":  # the same rows as lines of text, one string each
                pacsv.write_csv(part, p, write_options=pacsv.WriteOptions(include_header=False))
            elif fmt == "jsonl":
                with open(p, "w") as f:
                    for chunk in part.to_batches(100_000):
                        d = chunk.to_pydict()
                        keys = list(d)
                        f.writelines(json.dumps(dict(zip(keys, vals))) + "\n" for vals in zip(*d.values()))
            elif fmt == "parquet":
                pq.write_table(part, p)  # PyArrow's defaults, as a user writes it
            elif fmt == "arrow":
                with pa.ipc.new_file(p, part.schema) as w:
                    w.write_table(part, max_chunksize=65536)
            elif fmt == "npy":
                arr = np.stack([part.column(n).to_numpy().astype(np.float64) for n in part.column_names], axis=1)
                np.save(p, arr)
        paths.append(str(p))
    return paths


def settings_for(fmt: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, loader kwargs, reader kwargs): the defaults first."""
    out: list[tuple[str, dict[str, Any], dict[str, Any]]] = [("defaults", {}, {})]
    blocks = [None, 1 << 20, 4 << 20] if fmt in ("csv", "jsonl", "txt") else [None]
    for bb in blocks:
        for label, kw in (("inline (read_ahead=0)", {"read_ahead": 0}), ("1 read-ahead thread", {"read_ahead": 1}),
                          ("2 threads", {"num_workers": 2, "worker_mode": "thread"}),
                          ("2 processes", {"num_workers": 2, "worker_mode": "process", "persistent_workers": True})):
            rkw = {} if bb is None else {"block_bytes": bb}
            name = label + ("" if bb is None else f", {bb >> 20} MiB blocks")
            out.append((name, kw, rkw))
    return [run for run in out if run[0] == "defaults" or not ONLY or run[0].startswith(tuple(ONLY))]


def ids_column(batch: Any) -> np.ndarray:
    if isinstance(batch, dict) and "text" in batch:  # a line "id,f0,...": only the untimed epoch parses it
        return np.array([int(line[: line.index(",")]) for line in batch["text"]], dtype=np.int64)
    if isinstance(batch, dict) and "id" in batch:
        return batch["id"].numpy()
    arr = next(iter(batch.values())) if isinstance(batch, dict) else batch
    return arr[:, 0].numpy().astype(np.int64)  # npy: the whole row, the id first


KEEP_PARSED: list[int] = []  # --keep-parsed-bytes, for the CSV, JSONL and text readers
ONLY: list[str] = []  # --settings: label prefixes


def make_loader(paths: list[str], kw: dict[str, Any], rkw: dict[str, Any]) -> naiad.DataLoader:
    if KEEP_PARSED and paths[0].endswith((".csv", ".jsonl", ".txt")):
        rkw = {**rkw, "keep_parsed_bytes": KEEP_PARSED[0]}
    return naiad.DataLoader(naiad.read(paths, **rkw), batch_size=1024, shuffle=True, seed=0, **kw)


def epoch(loader: naiad.DataLoader, ep: int, keep_ids: bool = False) -> tuple[float, int, list[np.ndarray]]:
    loader.set_epoch(ep)
    t = time.perf_counter()
    n, ids = 0, []
    for b in loader:
        if keep_ids:
            ids.append(ids_column(b))
            n += len(ids[-1])
        else:
            n += len(b["text"]) if isinstance(b, dict) and "text" in b else len(ids_column(b))
        train_step()
    dt = time.perf_counter() - t
    return dt, n, ids


def quality(ids: list[np.ndarray], total: int) -> tuple[float, float]:
    order = np.concatenate(ids)
    assert len(order) == total and len(np.unique(order)) == total, "an epoch lost or repeated a row"
    corr = float(np.corrcoef(np.arange(total), order)[0, 1])
    span = float(np.median([(b.max() - b.min()) / total for b in ids if len(b) > 1]))
    return corr, span


def fresh_first_batch(paths: list[str], index_dir: str, early: bool = True) -> dict[str, float]:
    """A new process's first batch and first epoch; ``early=False``: its rows all counted before
    the first read, as before early reads (NOTE [ Early reads ] in naiad/stream/early.py)."""
    code = (
        "import time, json, sys, naiad, naiad.stream.early\n"
        + ("" if early else "naiad.stream.early.EARLY_MIN_BYTES = 1 << 62\n")
        + "t = time.perf_counter()\n"
        f"src = naiad.read({paths!r}, index_dir={index_dir!r})\n"
        "loader = naiad.DataLoader(src, batch_size=1024, shuffle=True, seed=0)\n"
        "it = iter(loader); next(it); first = time.perf_counter() - t\n"
        "n = 1024\n"
        "for b in it: n += len(b['id'])\n"
        "print(json.dumps({'first': first, 'epoch': time.perf_counter() - t, 'rows': n}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fresh_arrow(paths: list[str]) -> float:
    """PyArrow's whole-file read as the first thing a new process does (after its import), as
    naiad's first epoch is measured: neither has warmed its thread pool or allocator."""
    code = (
        "import time, sys, pyarrow.csv as pacsv\n"
        "t = time.perf_counter()\n"
        f"for p in {paths!r}:\n"
        "    cols = [c.to_numpy() for c in pacsv.read_csv(p).columns]\n"
        "print(time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def arrow_ceiling(paths: list[str]) -> float:
    t = time.perf_counter()
    n = 0
    for p in paths:
        table = pacsv.read_csv(p)
        cols = [c.to_numpy() for c in table.columns]
        n += len(cols[0])
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,150", help="CSV megabytes, comma-separated")
    p.add_argument("--files", default="1", help="file counts, comma-separated (the data split evenly)")
    p.add_argument("--formats", default="csv,jsonl,txt,parquet,arrow,npy")
    p.add_argument("--repeats", type=int, default=3,
                   help="epochs per setting after a first one (median); more for small data, up to 12M rows a setting")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "naiad-bench" / "defaults"))
    p.add_argument("--step-ms", type=float, default=0.0, help="a CPU-bound training step after every batch (ms)")
    p.add_argument("--busy", type=int, default=0, help="spinning processes beside the measurement")
    p.add_argument("--settings", default="",
                   help="only the settings whose labels start with one of these (comma-separated; the defaults always run), "
                        "e.g. 'inline,1 read-ahead' for the in-process ones")
    p.add_argument("--fresh-runs", type=int, default=5,
                   help="CSV: new processes per way of starting (naiad's first epoch, PyArrow's read), alternating (median)")
    p.add_argument("--keep-parsed-bytes", type=int, default=None,
                   help="the CSV and JSONL readers' keep_parsed_bytes (0: parse every epoch, as a source over the budget does)")
    args = p.parse_args()
    print(environment())
    print(f"\n`python bench/bench_defaults.py {' '.join(sys.argv[1:])}`")
    if args.step_ms:
        calibrate_step(args.step_ms)
    if args.keep_parsed_bytes is not None:
        KEEP_PARSED.append(args.keep_parsed_bytes)
    ONLY.extend(x.strip() for x in args.settings.split(",") if x.strip())
    import multiprocessing as mp

    busy = [mp.get_context("fork").Process(target=spin, daemon=True) for _ in range(args.busy)]
    for proc in busy:
        proc.start()
    try:
        run_all(args)
    finally:
        for proc in busy:
            proc.kill()
            proc.join(5)


def run_all(args: argparse.Namespace) -> None:
    cache = Path(args.cache_dir)
    for size in [int(s) for s in args.sizes.split(",")]:
        rows = size * 1_000_000 // BYTES_PER_ROW
        table = None
        for files in [int(f) for f in args.files.split(",")]:
            for fmt in args.formats.split(","):
                folder = cache / f"{size}MB-{files}" / fmt
                if not folder.exists() or len(list(folder.iterdir())) < files:
                    table = table if table is not None else make_table(rows)
                paths = write(table if table is not None else make_table(0), fmt, folder, files) if table is not None else sorted(str(x) for x in folder.iterdir())
                report(fmt, size, files, rows, paths, args.repeats, args.fresh_runs)


def report(fmt: str, size: int, files: int, rows: int, paths: list[str], repeats: int, fresh_runs: int = 5) -> None:
    mb = sum(os.path.getsize(x) for x in paths) / 1e6
    print(f"\n#### {fmt}, {size} MB as CSV ({rows:,} rows; {mb:.0f} MB as {fmt}), {files} file(s)\n")
    extra: list[str] = []
    if fmt == "csv":
        for path in paths:  # from the page cache, as every other figure here: a cold start, not a cold disk
            with open(path, "rb") as f:
                while f.read(64 << 20):
                    pass
        # New processes, alternating: naiad's first epoch without the block index, PyArrow's read.
        firsts, arrows, counted_first = [], [], []
        for _ in range(fresh_runs):
            with tempfile.TemporaryDirectory() as idx:
                firsts.append(fresh_first_batch(paths, idx))
                again = fresh_first_batch(paths, idx)
            arrows.append(fresh_arrow(paths))
            with tempfile.TemporaryDirectory() as idx:
                counted_first.append(fresh_first_batch(paths, idx, early=False))
        fresh = {k: statistics.median(f[k] for f in firsts) for k in ("first", "epoch")}
        before = {k: statistics.median(f[k] for f in counted_first) for k in ("first", "epoch")}
        ceiling = statistics.median(arrow_ceiling(paths) for _ in range(3))
        new_arrow = statistics.median(arrows)
        per_run = ", ".join(f"{a / f['epoch']:.2f}" for a, f in zip(arrows, firsts))
        extra.append(f"- new process, no block index (medians of {fresh_runs}): first batch {fresh['first']:.3f} s, first epoch "
                     f"{rows / fresh['epoch'] / 1e6:.2f} M rows/s = **{new_arrow / fresh['epoch']:.2f}x** PyArrow's whole-file read "
                     f"in a new process ({rows / new_arrow / 1e6:.2f} M rows/s; per run "
                     f"{per_run}), "
                     f"{ceiling / fresh['epoch']:.2f}x its read in a warm process ({rows / ceiling / 1e6:.2f} M rows/s, median of 3)")
        extra.append(f"- new process, no block index, every row counted before the first read (no early reads): first batch "
                     f"{before['first']:.3f} s, first epoch {rows / before['epoch'] / 1e6:.2f} M rows/s; early reads: first batch "
                     f"**{before['first'] / fresh['first']:.2f}x** sooner, first epoch {before['epoch'] / fresh['epoch']:.2f}x as fast")
        extra.append(f"- new process, block index kept: first batch {again['first']:.3f} s, epoch {rows / again['epoch'] / 1e6:.2f} M rows/s")
    runs = settings_for(fmt)
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    ids: list[np.ndarray] = []
    # One loader per setting, as a training script keeps it; its first epoch scans, infers and
    # warms the page cache; the later ones are timed, settings alternating round after round.
    loaders = {name: make_loader(paths, kw, rkw) for name, kw, rkw in runs}
    for name, loader in loaders.items():
        # The quality figures come from this untimed epoch: keeping every batch's ids costs a
        # timed epoch memory the others do not hold.
        _, _, got = epoch(loader, 0, keep_ids=(name == "defaults"))
        ids = got or ids
    # Short epochs are noisy (a 10 MB epoch is about 30 ms, a kept 150 MB one 0.5 s, and a
    # median of 3 of those moved by 15% between runs): more rounds for them, as many as give
    # each setting about 12M rows (5 at 150 MB), 30 at most.
    order = np.random.default_rng(0)
    rounds = max(repeats, min(30, 12_000_000 // max(rows, 1)))
    for r in range(rounds):
        # A new order each round (seeded), so no setting always runs first, nor always after the
        # same one: rotating the list, the defaults always followed "2 processes, 4 MiB blocks",
        # and a 10 MB CSV's defaults measured 0.82-0.88x of settings they tie with run in pairs.
        for k in order.permutation(len(runs)).tolist():
            name = runs[k][0]
            dt, n, _ = epoch(loaders[name], 1 + r)
            assert n == rows, f"{name}: {n} rows, expected {rows}"
            times[name].append(dt)
    rates = {name: rows / statistics.median(ts) / 1e6 for name, ts in times.items()}
    # Each block size's order over two epochs, from the dry run over row numbers (workers never
    # change it): what `naiad tune` ranks by, with the same bar.
    figures: dict[str, tuple[float, float]] = {}
    for _name, _kw, rkw in runs:
        key = repr(sorted(rkw.items()))
        figures[key] = figures.get(key) or shuffle_figures(naiad.read(paths, **rkw), None, 1024)
    quality_of = {name: figures[repr(sorted(rkw.items()))] for name, _kw, rkw in runs}
    d_corr, d_span = quality_of["defaults"]
    bar = quality_bar(d_corr, d_span, 1024)
    mixes = {name: abs(c) <= bar.corr and s >= bar.span for name, (c, s) in quality_of.items()}
    best = max(((v, k) for k, v in rates.items() if k != "defaults" and mixes[k]), default=(rates["defaults"], "defaults"))
    fastest = max(((v, k) for k, v in rates.items() if k != "defaults"), default=best)
    # The best of a dozen noisy medians is picked for its luck as well as its speed (on this
    # machine settings that do the same work, such as "2 threads" and the defaults, differed by
    # 20% in one sweep): measure the pick again against the defaults, in as many new rounds,
    # the two in a random order each round, and report that ratio beside the sweep's.
    again: dict[str, list[float]] = {"defaults": [], best[1]: []}
    for r in range(rounds if best[1] != "defaults" else 0):
        for name in order.permutation(list(again)).tolist():
            dt, n, _ = epoch(loaders[name], 1 + rounds + r)
            assert n == rows, f"{name}: {n} rows, expected {rows}"
            again[name].append(dt)
    for loader in loaders.values():
        loader.close()
    print("| setting | M rows/s (median) | vs defaults | corr | batch span |")
    print("|---|---|---|---|---|")
    for name, rate in rates.items():
        c, sp = quality_of[name]
        flag = "" if mixes[name] else " (mixes less)"
        print(f"| {name}{flag} | {rate:.2f} | {rate / rates['defaults']:.2f}x | {c:+.3f} | {sp:.3f} |")
    corr, span = quality(ids, rows)
    print(f"\n- defaults / best setting with {bar.words()} ({best[1]}): **{rates['defaults'] / best[0]:.2f}x**")
    if again["defaults"]:
        confirmed = statistics.median(again[best[1]]) / statistics.median(again["defaults"])
        print(f"- the same two again, {rounds} new rounds alternating (the pick's luck left out): **{confirmed:.2f}x**")
    if fastest[1] != best[1]:
        print(f"- defaults / fastest of any order ({fastest[1]}): {rates['defaults'] / fastest[0]:.2f}x")
    print(f"- defaults' shuffle quality (epoch 0 as delivered): corr(position, row) {corr:+.3f}, batch span {span:.3f}")
    if fmt == "csv":
        ceiling = statistics.median(arrow_ceiling(paths) for _ in range(3))
        print(f"- later epochs, defaults: {rates['defaults'] / (rows / ceiling / 1e6):.2f}x PyArrow's whole-file read in this run")
    for line in extra:
        print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
