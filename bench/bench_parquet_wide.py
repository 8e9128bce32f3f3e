"""Where a shuffled epoch of ten float columns from Parquet spends its CPU, by page encoding.

The same 10 x float32 data is written four ways: as ``pq.write_table`` writes it by default
(1 Mi-row groups, snappy, dictionary pages that fall back to PLAIN once the dictionary passes
1 MiB), and in 64 Ki-row groups (every column chunk fits its dictionary) with snappy, with no
compression (the small-group file ``bench_stream.py`` uses), and uncompressed PLAIN
(``use_dictionary=False``). For each file, side by side in one run:

* decode: one thread reading every row group with PyArrow (ns of CPU per row);
* naiad, shuffled and in order: rows/s of a second epoch (2 thread workers, batch 8192), and the
  CPU each thread used per row (Linux: /proc/self/task), which shows which thread is the
  critical path and how many of the cores the epoch kept busy.

Medians over ``--repeats`` runs, alternating files. Machines here are shared and noisy: read the
ratios and the per-thread CPU, not single absolute times.

    python bench/bench_parquet_wide.py --rows 5000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_stream_data import write_wide  # noqa: E402
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

ENCODINGS: dict[str, dict[str, object]] = {
    "PyArrow's defaults (1 Mi-row groups, snappy, dictionary)": {"row_group_size": 1 << 20},
    "64 Ki-row groups, snappy + dictionary": {},
    "64 Ki-row groups, uncompressed + dictionary": {"compression": "none"},
    "64 Ki-row groups, uncompressed PLAIN": {"compression": "none", "use_dictionary": False},
}


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, keyed by thread id."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def decode_ns_per_row(path: str) -> float:
    """One thread decoding every row group (the reader's work in a naiad worker)."""
    pf = pq.ParquetFile(path, memory_map=True)
    t0 = time.thread_time()
    rows = 0
    for i in range(pf.metadata.num_row_groups):
        table = pf.read_row_group(i, use_threads=False)
        for col in table.columns:
            col.chunk(0).to_numpy()
        rows += table.num_rows
    return (time.thread_time() - t0) / rows * 1e9


def epoch(loader: naiad.DataLoader) -> tuple[float, float, float, list[float]]:
    """(rows/s, wall ns/row, cores busy, per-thread CPU ns/row sorted high to low) of one epoch."""
    before = thread_cpu_s()
    t0 = time.perf_counter()
    rows = sum(len(b["f0"]) for b in loader)
    wall = time.perf_counter() - t0
    after = thread_cpu_s()
    per_thread = sorted(((after[t] - before.get(t, 0.0)) / rows * 1e9 for t in after), reverse=True)
    busy = [x for x in per_thread if x >= 0.5]
    return rows / wall, wall / rows * 1e9, sum(busy) * rows / 1e9 / wall, busy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args()
    if not os.path.isdir("/proc/self/task"):
        sys.exit("needs Linux (/proc/self/task) for the per-thread CPU")
    print(environment() + "\n")
    work = tempfile.mkdtemp(prefix="naiad-bench-pq-", dir=args.cache_dir)
    try:
        base = write_wide(work, args.rows)["parquet"]
        table = pq.read_table(base)
        paths = {}
        for i, (label, kwargs) in enumerate(ENCODINGS.items()):
            paths[label] = os.path.join(work, f"wide{i}.parquet")
            pq.write_table(table, paths[label], **{"row_group_size": 1 << 16, **kwargs})
        del table
        loaders = {
            (label, shuffle): naiad.DataLoader(
                naiad.read_parquet(path), batch_size=8192, shuffle=shuffle, num_workers=2,
                worker_mode="thread", persistent_workers=True,
            )
            for label, path in paths.items() for shuffle in (True, False)
        }
        for loader in loaders.values():  # warm the page cache, count rows, start the workers
            for _ in loader:
                pass
        decode: dict[str, list[float]] = {k: [] for k in paths}
        runs: dict[tuple[str, bool], list[tuple[float, float, float, list[float]]]] = {k: [] for k in loaders}
        for _ in range(args.repeats):
            for label, path in paths.items():
                decode[label].append(decode_ns_per_row(path))
            for key, loader in loaders.items():
                runs[key].append(epoch(loader))
        rows = []
        for label in paths:
            cells = [label, f"{statistics.median(decode[label]):.0f}"]
            for shuffle in (True, False):
                r = runs[(label, shuffle)]
                best = sorted(r, key=lambda x: x[0])[len(r) // 2]  # the median run by rate
                cells += [f"{best[0] / 1e6:.1f}", f"{best[2]:.2f}",
                          " / ".join(f"{x:.0f}" for x in best[3])]
            rows.append(cells)
        print(f"{args.rows:,} rows x 10 float32 columns, batch 8192, shuffle buffer 131,072 rows, "
              f"2 thread workers, median of {args.repeats}\n")
        print(markdown_table(
            ["file", "decode, 1 thread (ns CPU/row)", "shuffled M rows/s", "cores busy",
             "CPU ns/row per thread", "in order M rows/s", "cores busy", "CPU ns/row per thread"],
            rows,
        ))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
