"""``naiad check`` on big data: how long does proving a configuration's coverage take?

Question: for 10 M rows (a ``.npy`` file of int64, written as a sparse file: only its header is
real, and the check never reads past it), what does ``naiad.testing.check_coverage`` cost for a
shuffled epoch on 8 and 64 ranks, with and without an elastic resume, and with the real stream
over row numbers compared (its default, 200,000 rows per checked rank) or not? The rows are
counted once beforehand (a header read), so the times are the plan's dry run, the checks and the
quality figures.

    python bench/bench_check.py                # 10 M rows
    python bench/bench_check.py --rows 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import environment, markdown_table, median_time  # noqa: E402

import naiad  # noqa: E402
from naiad.testing import CoverageReport, check_coverage  # noqa: E402


def sparse_npy(path: str, rows: int) -> None:
    """An int64 ``.npy`` of ``rows`` rows whose data pages are never written (a sparse file)."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.int64))
    header["shape"] = (rows,)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.truncate(f.tell() + rows * 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    print(environment())
    cases = [
        ("8 ranks, batch 256", {"world_size": 8, "batch_size": 256}),
        ("8 ranks, batch 256, no stream compare", {"world_size": 8, "batch_size": 256, "stream_rows": 0}),
        ("64 ranks, batch 32", {"world_size": 64, "batch_size": 32}),
        ("8 -> 6 ranks at 0.4, 2 epochs", {"world_size": 8, "batch_size": 256, "epochs": 2, "resume_at": 0.4,
                                           "new_world_size": 6}),
    ]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "big.npy")
        sparse_npy(path, args.rows)
        src = naiad.read(path)
        src.blocks()  # counted once: the header
        rows = []
        for name, kw in cases:
            reports: list[CoverageReport] = []
            seconds = median_time(lambda kw=kw, out=reports: out.append(check_coverage(src, **kw)), args.repeats)
            report = reports[-1]
            assert report.ok, report.problems
            rows.append([name, f"{report.batches_per_rank:,}", f"{seconds:.2f}"])
    print(f"\n{args.rows:,} rows, shuffled (buffer 131,072 rows), seed 0\n")
    print(markdown_table(["configuration", "batches per rank", "check s"], rows))


if __name__ == "__main__":
    main()
