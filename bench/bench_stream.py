"""A shuffled epoch over a big CSV / Parquet file: naiad against what a user would write instead.

Side by side in one run (machines here are noisy; compare ratios, not absolute times):

* naiad: ``naiad.DataLoader(naiad.read_csv(...), shuffle=True, num_workers=W)``; the first epoch
  includes the one-off row count (a newline scan), the second does not.
* (a) the hand-written buffer loader: readline, split, float, a shuffle buffer, batches.
* (b) torch's ``IterableDataset`` over ``csv.reader`` with torch's DataLoader.
* (c) PyArrow's multi-threaded ``read_csv`` of the whole file into NumPy: the parser ceiling
  (no shuffling, no batches, and memory for the whole file).

(a) and (b) run on the first ``--baseline-rows`` rows (they are slow; rows/s is a rate).
Then the same for Parquet, then ten float32 columns from Parquet (two layouts: small
uncompressed row groups, and PyArrow's defaults) / Arrow IPC / NumPy, and the shuffle quality of
a naiad epoch with a buffer of 1% of the rows.

    python bench/bench_stream.py                # 1 GB CSV (written to a cache dir, deleted after)
    python bench/bench_stream.py --quick        # 50 MB, a minute
    python bench/bench_stream.py --sections wide --repeats 5   # only the ten-float-column table
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_stream_data import csv_to_parquet, write_diabetes_csv, write_wide  # noqa: E402
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402
from naiad.stream.batches import DEFAULT_SHUFFLE_BUFFER_ROWS  # noqa: E402
from naiad.stream.shuffle import shuffle_quality  # noqa: E402

LABEL = "Outcome"


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    """(seconds, rows) of one call of ``fn`` (which returns the rows it delivered)."""
    t0 = time.perf_counter()
    rows = fn()
    return time.perf_counter() - t0, rows


def naiad_epochs(source: naiad.Source, args: argparse.Namespace, epochs: int = 2) -> list[tuple[float, int]]:
    """Time each epoch of a shuffled naiad DataLoader packing x/y, as training would use it."""
    loader = naiad.DataLoader(
        source, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.workers,
        worker_mode=args.mode, persistent_workers=True, shuffle_buffer=args.buffer_rows,
        transform=naiad.pack_xy(label=LABEL),
    )

    def one() -> int:
        return sum(len(b["y"]) for b in loader)

    return [timed(one) for _ in range(epochs)]


def handwritten_csv(path: str, args: argparse.Namespace, limit: int) -> int:
    """(a): what the tutorial writes: readline, split, float, shuffle a buffer, serve batches."""
    rows = 0
    buffer: list[list[float]] = []
    rng = random.Random(0)

    def serve(buf: list[list[float]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        rng.shuffle(buf)
        for i in range(0, len(buf), args.batch_size):
            chunk = torch.tensor(buf[i : i + args.batch_size])
            yield chunk[:, :-1], chunk[:, -1]

    with open(path) as f:
        f.readline()
        for line in f:
            buffer.append([float(v) for v in line.split(",")])
            rows += 1
            if len(buffer) == args.buffer_rows:
                for _x, _y in serve(buffer):
                    pass
                buffer = []
            if rows >= limit:
                break
    for _x, _y in serve(buffer):
        pass
    return rows


class CsvRows(torch.utils.data.IterableDataset):
    """(b): torch's IterableDataset over csv.reader, one row at a time."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        with open(self.path, newline="") as f:
            reader = csv.reader(f)
            next(reader)
            for i, row in enumerate(reader):
                if i >= self.limit:
                    return
                values = [float(v) for v in row]
                yield torch.tensor(values[:-1]), torch.tensor(values[-1])


def torch_iterable(path: str, args: argparse.Namespace, limit: int) -> int:
    loader = torch.utils.data.DataLoader(CsvRows(path, limit), batch_size=args.batch_size)
    return sum(len(y) for _x, y in loader)


def arrow_ceiling_csv(path: str) -> int:
    """(c): PyArrow's multi-threaded read of the whole file, every column to NumPy."""
    table = pacsv.read_csv(path)
    arrays = [c.to_numpy() for c in table.columns]
    return len(arrays[0])


def handwritten_parquet(path: str, args: argparse.Namespace, limit: int) -> int:
    """(a) for Parquet: record batches into a NumPy buffer, permuted when full, sliced into batches."""
    rng = np.random.default_rng(0)
    rows, parts, held = 0, [], 0

    def serve(parts: list[np.ndarray]) -> None:
        buf = np.concatenate(parts)
        buf = buf[rng.permutation(len(buf))]
        for i in range(0, len(buf), args.batch_size):
            chunk = torch.from_numpy(buf[i : i + args.batch_size])
            _x, _y = chunk[:, :-1], chunk[:, -1]

    for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
        block = np.stack([c.to_numpy().astype(np.float32) for c in batch.columns], axis=1)
        parts.append(block)
        held += len(block)
        rows += len(block)
        if held >= args.buffer_rows:
            serve(parts)
            parts, held = [], 0
        if rows >= limit:
            break
    if parts:
        serve(parts)
    return rows


class ParquetRows(torch.utils.data.IterableDataset):
    """(b) for Parquet: an IterableDataset yielding rows from record batches."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = 0
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=65536):
            block = np.stack([c.to_numpy().astype(np.float32) for c in batch.columns], axis=1)
            for row in block:
                if n >= self.limit:
                    return
                n += 1
                yield torch.from_numpy(row[:-1]), torch.tensor(row[-1])


def torch_iterable_parquet(path: str, args: argparse.Namespace, limit: int) -> int:
    loader = torch.utils.data.DataLoader(ParquetRows(path, limit), batch_size=args.batch_size)
    return sum(len(y) for _x, y in loader)


def arrow_ceiling_parquet(path: str) -> int:
    table = pq.read_table(path)
    arrays = [c.to_numpy() for c in table.columns]
    return len(arrays[0])


def rate(seconds: float, rows: int) -> float:
    return rows / seconds if seconds > 0 else float("nan")


def compare(title: str, results: list[tuple[str, float, int]], ceiling: str) -> str:
    """A markdown table of rows/s with the ratio to the ceiling entry."""
    base = next(rate(s, n) for name, s, n in results if name == ceiling)
    rows = [[name, f"{n:,}", f"{s:.2f}", f"{rate(s, n) / 1e6:.2f}", f"{rate(s, n) / base:.2f}x"] for name, s, n in results]
    return f"### {title}\n\n" + markdown_table(["loader", "rows", "seconds", "M rows/s", "vs ceiling"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=1.0, help="size of the diabetes-shaped CSV")
    p.add_argument("--quick", action="store_true", help="50 MB and small baselines")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", choices=["thread", "process"], default="thread")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--buffer-rows", type=int, default=None, help="naiad's and the baselines' shuffle buffer (default: naiad's)")
    p.add_argument("--baseline-rows", type=int, default=500_000, help="rows given to the slow baselines (a), (b)")
    p.add_argument("--wide-rows", type=int, default=20_000_000, help="rows of the ten-float-column files")
    p.add_argument("--repeats", type=int, default=3, help="epochs timed per ten-float-column loader (median)")
    p.add_argument("--sections", default="csv,parquet,wide,quality",
                   help="which sections to run, comma-separated (csv, parquet, wide, quality)")
    p.add_argument("--cache-dir", default=None, help="where to write the data (deleted afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--out", default=None, help="write the markdown report here")
    args = p.parse_args()
    if args.quick:
        args.size_gb, args.baseline_rows, args.wide_rows = 0.05, 100_000, 2_000_000
    args.buffer_rows = args.buffer_rows or DEFAULT_SHUFFLE_BUFFER_ROWS
    work = tempfile.mkdtemp(prefix="naiad-bench-stream-", dir=args.cache_dir)
    report = ["## Streaming: a shuffled epoch\n", f"`{' '.join(['python', *sys.argv])}`\n", environment() + "\n"]
    print(report[-1])
    sections = set(args.sections.split(","))
    try:
        if sections & {"csv", "parquet"}:
            report += csv_and_parquet_sections(work, args, sections)
        if "wide" in sections:
            report.append(wide_section(work, args))
            print(report[-1], flush=True)
        if "quality" in sections:
            report.append(quality_section(work, args))
            print(report[-1], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n\n".join(report) + "\n")
        print(f"wrote {args.out}")


def csv_and_parquet_sections(work: str, args: argparse.Namespace, sections: set[str]) -> list[str]:
    """The diabetes-shaped CSV (and, converted from it, Parquet): naiad against (a), (b), (c)."""
    csv_path = os.path.join(work, "diabetes.csv")
    t0 = time.perf_counter()
    n = write_diabetes_csv(csv_path, int(args.size_gb * 1e9))
    size = os.path.getsize(csv_path)
    print(f"wrote {size / 1e9:.2f} GB, {n:,} rows in {time.perf_counter() - t0:.0f} s")
    settings = (f"{size / 1e9:.2f} GB diabetes-shaped CSV ({n:,} rows, 8 features + 0/1 label), batch {args.batch_size}, "
                f"shuffle buffer {args.buffer_rows:,} rows, naiad with {args.workers} {args.mode} workers; "
                f"(a) and (b) on the first {args.baseline_rows:,} rows.\n")
    report = [settings]
    limit = min(args.baseline_rows, n)

    if "csv" in sections:
        (e0, e1) = naiad_epochs(naiad.read_csv(csv_path), args)
        results = [
            ("naiad, epoch 1 (with the row count)", *e0),
            ("naiad, epoch 2", *e1),
            ("(a) hand-written buffer loader", *timed(lambda: handwritten_csv(csv_path, args, limit))),
            ("(b) torch IterableDataset + csv.reader", *timed(lambda: torch_iterable(csv_path, args, limit))),
            ("(c) pyarrow.csv.read_csv to NumPy (ceiling)", *timed(lambda: arrow_ceiling_csv(csv_path))),
        ]
        report.append(compare("CSV", results, "(c) pyarrow.csv.read_csv to NumPy (ceiling)"))
        print(report[-1], flush=True)

    if "parquet" in sections:
        pq_path = os.path.join(work, "diabetes.parquet")
        csv_to_parquet(csv_path, pq_path)
        os.remove(csv_path)
        (e0, e1) = naiad_epochs(naiad.read_parquet(pq_path), args)
        results = [
            ("naiad, epoch 1", *e0),
            ("naiad, epoch 2", *e1),
            ("(a) hand-written buffer loader", *timed(lambda: handwritten_parquet(pq_path, args, limit))),
            ("(b) torch IterableDataset over record batches", *timed(lambda: torch_iterable_parquet(pq_path, args, limit))),
            ("(c) pyarrow.parquet.read_table to NumPy (ceiling)", *timed(lambda: arrow_ceiling_parquet(pq_path))),
        ]
        report.append(compare("Parquet (row groups of 65,536 rows)", results, "(c) pyarrow.parquet.read_table to NumPy (ceiling)"))
        print(report[-1], flush=True)
        os.remove(pq_path)
    return report


PARQUET_64K = "parquet (64 Ki-row groups, uncompressed)"
PARQUET_DEFAULTS = "parquet (PyArrow's defaults: 1 Mi-row groups, snappy)"


def wide_section(work: str, args: argparse.Namespace) -> str:
    """Ten float32 columns from Parquet, Arrow IPC and .npy: naiad shuffled and in order."""
    paths = write_wide(work, args.wide_rows)
    ceilings: dict[str, Callable[[], int]] = {
        PARQUET_64K: lambda: len(pq.read_table(paths["parquet"]).column(0).to_numpy()),
        PARQUET_DEFAULTS: lambda: len(pq.read_table(paths["parquet_defaults"]).column(0).to_numpy()),
        "arrow": lambda: len(ipc.open_file(paths["arrow"]).read_all().column(0).to_numpy()),
        "npy": lambda: len(np.array(np.load(paths["npy"], mmap_mode="r"))),
    }
    readers = {
        PARQUET_64K: lambda: naiad.read_parquet(paths["parquet"]),
        PARQUET_DEFAULTS: lambda: naiad.read_parquet(paths["parquet_defaults"]),
        "arrow": lambda: naiad.read_arrow(paths["arrow"]),
        "npy": lambda: naiad.read_npy(paths["npy"]),
    }
    runs: dict[tuple[str, str], Callable[[], int]] = {}
    for fmt, make in readers.items():
        for shuffle in (True, False):
            loader = naiad.DataLoader(make(), batch_size=8192, shuffle=shuffle, num_workers=args.workers,
                                      worker_mode=args.mode, persistent_workers=True)
            for _ in loader:  # the first epoch warms the page cache and counts rows
                pass
            runs[(fmt, "shuffled" if shuffle else "in order")] = functools.partial(_count_rows, loader)
        runs[(fmt, "ceiling")] = ceilings[fmt]
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.repeats):  # round after round, so a busy spell slows every entry alike
        for key, fn in runs.items():
            rates[key].append(rate(*timed(fn)))
    rows = [[fmt] + [f"{statistics.median(rates[(fmt, kind)]) / 1e6:.1f}" for kind in ("shuffled", "in order", "ceiling")]
            for fmt in readers]
    return (f"### Ten float32 columns, {args.wide_rows:,} rows, batch 8192 "
            f"(M rows/s, median of {args.repeats} epochs after the first)\n\n"
            + markdown_table(["format", "naiad shuffled", "naiad in order", "read all to NumPy"], rows))


def _count_rows(loader: naiad.DataLoader) -> int:
    return sum(len(next(iter(b.values()))) for b in loader)


def quality_section(work: str, args: argparse.Namespace) -> str:
    """Shuffle quality of one naiad epoch over a numbered CSV, buffer = 1% of the rows."""
    n = 2_000_000 if not args.quick else 200_000
    path = os.path.join(work, "numbered.csv")
    with open(path, "w") as f:
        f.write("id,x\n")
        ids = np.arange(n)
        np.savetxt(f, np.stack([ids, ids % 7], 1), fmt="%d", delimiter=",")
    buffer_rows = n // 100
    rows = []
    for name, shuffle_buffer, block_bytes in [("naiad (default blocks)", buffer_rows, None), ("naiad (1 MiB blocks)", buffer_rows, 1 << 20)]:
        loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=block_bytes), batch_size=1024, shuffle=True,
                                  shuffle_buffer=shuffle_buffer, num_workers=0)
        order = np.concatenate([b["id"].numpy() for b in loader])
        q = shuffle_quality(order)
        rows.append([name, f"{q['position_correlation']:+.3f}", f"{q['neighbour_share']:.5f}", f"{q['mean_displacement']:.3f}"])
    for name, order in [("uniform permutation", np.random.default_rng(0).permutation(n)), ("file order", np.arange(n))]:
        q = shuffle_quality(order)
        rows.append([name, f"{q['position_correlation']:+.3f}", f"{q['neighbour_share']:.5f}", f"{q['mean_displacement']:.3f}"])
    os.remove(path)
    return (f"### Shuffle quality: {n:,} rows, shuffle buffer {buffer_rows:,} rows (1%)\n\n"
            + markdown_table(["order", "corr(position, row)", "neighbours kept", "mean |displacement| / n"], rows))


if __name__ == "__main__":
    main()
