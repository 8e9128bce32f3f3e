"""Peak memory of a shuffled epoch over a CSV larger than memory should care about.

Each run is a fresh child process that iterates one shuffled epoch with ``naiad.DataLoader``
while a sampler thread records the resident memory (RSS) of the process and its workers. The
claim: the peak is the shuffle buffer plus a constant, whatever the file size. So the same
buffer is run on the big file and on a tenth of it, and two buffer sizes on the big file; for
contrast, PyArrow reading the tenth into memory.

    python bench/bench_stream_memory.py               # 2 GB CSV, written to a temp dir, deleted after
    python bench/bench_stream_memory.py --quick       # 200 MB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_stream_data import write_diabetes_csv  # noqa: E402
from harness import environment, markdown_table  # noqa: E402

ROW_BYTES = 9 * 8  # nine float64/int64 columns in the shuffle buffer


class PeakRss:
    """Samples the RSS of this process and its children every few milliseconds."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        while not self._stop.is_set():
            total = self._proc.memory_info().rss
            for child in self._proc.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def child(path: str, how: str, buffer_rows: int, workers: int, mode: str, block_bytes: int) -> None:
    """One measured run; prints a JSON line."""
    import naiad  # imported here so the baseline includes torch and pyarrow

    if how == "arrow":
        import pyarrow.csv as pacsv

        base = psutil.Process().memory_info().rss
        with PeakRss() as peak:
            table = pacsv.read_csv(path)
            arrays = [c.to_numpy() for c in table.columns]
            rows = len(arrays[0])
    else:
        src = naiad.read_csv(path, block_bytes=block_bytes or None)
        loader = naiad.DataLoader(src, batch_size=1024, shuffle=True, shuffle_buffer=buffer_rows,
                                  num_workers=workers, worker_mode=mode, transform=naiad.pack_xy(label="Outcome"))
        base = psutil.Process().memory_info().rss
        rows = 0
        with PeakRss() as peak:
            t0 = time.perf_counter()
            for batch in loader:
                rows += len(batch["y"])
            seconds = time.perf_counter() - t0
    print(json.dumps({"rows": rows, "base": base, "peak": peak.peak,
                      "seconds": locals().get("seconds", 0.0)}))


def run_child(path: str, how: str, buffer_rows: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", path, how, str(buffer_rows), str(args.workers),
           args.mode, str(args.block_bytes)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        path, how, buffer_rows, workers, mode, block_bytes = sys.argv[2:8]
        child(path, how, int(buffer_rows), int(workers), mode, int(block_bytes))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help="200 MB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", choices=["thread", "process"], default="process")
    p.add_argument("--block-bytes", type=int, default=1 << 20,
                   help="CSV block size for every run (0: naiad's default, which grows with the file)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", default=None, help="append the markdown report to this file")
    args = p.parse_args()
    if args.quick:
        args.size_gb = 0.2
    work = tempfile.mkdtemp(prefix="naiad-bench-memory-", dir=args.cache_dir)
    report = [f"## Streaming: peak memory of a shuffled epoch\n\n`{' '.join(['python', *sys.argv])}`\n\n{environment()}\n"]
    print(report[0])
    try:
        big = os.path.join(work, "big.csv")
        small = os.path.join(work, "small.csv")
        write_diabetes_csv(big, int(args.size_gb * 1e9))
        write_diabetes_csv(small, int(args.size_gb * 1e8), seed=1)
        rows = []
        for path, how, buffer_rows in [
            (small, "naiad", 1 << 16), (big, "naiad", 1 << 16), (big, "naiad", 1 << 20),
            (small, "arrow", 0),
        ]:
            r = run_child(path, how, buffer_rows, args)
            name = (f"naiad, {args.workers} {args.mode} workers, {args.block_bytes >> 10} KiB blocks" if how == "naiad"
                    else "pyarrow read_csv, whole file")
            buf = f"{buffer_rows:,} rows ({buffer_rows * ROW_BYTES / 2**20:.0f} MiB)" if buffer_rows else "-"
            rows.append([name, f"{os.path.getsize(path) / 1e9:.2f} GB", f"{r['rows']:,}", buf,
                         f"{r['base'] / 2**20:.0f}", f"{r['peak'] / 2**20:.0f}", f"{(r['peak'] - r['base']) / 2**20:.0f}"])
            print(rows[-1], flush=True)
        report.append(markdown_table(
            ["run", "file", "rows", "shuffle buffer", "RSS before (MiB)", "peak RSS (MiB)", "peak - before (MiB)"], rows))
        print(report[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n\n".join(report) + "\n")


if __name__ == "__main__":
    main()
