"""naiad.DataLoader against torch's DataLoader on in-memory data: rows/s and the ratio.

The question: a user with a diabetes-shaped table in memory (1M rows, 8 float features and a
label, as a TensorDataset) switches one import line. How many more rows per second does the
training loop get, shuffled, at batch 32 and 1024, with 0 and 2 workers?

    python bench/bench_loader.py            # 1M rows, 3 repeats (median)
    python bench/bench_loader.py --quick    # 100k rows, 1 repeat
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402
from naiad.cli.demo_data import make_diabetes_table  # noqa: E402


def make_dataset(rows: int) -> TensorDataset:
    table = make_diabetes_table(rows)
    x = torch.stack([torch.tensor(table[c].to_numpy()) for c in table.column_names[:-1]], dim=1)
    y = torch.tensor(table["Outcome"].to_numpy()).float().unsqueeze(1)
    return TensorDataset(x, y)


def epoch(loader_cls: type, dataset: TensorDataset, batch_size: int, num_workers: int, max_batches: int) -> int:
    loader = loader_cls(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)
    rows = 0
    for i, (x, _) in enumerate(loader):
        rows += len(x)
        if i + 1 == max_batches:
            break
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100k rows, 1 repeat")
    parser.add_argument(
        "--torch-max-batches", type=int, default=5_000,
        help="cap torch's batches per run (its batch-32 epoch takes minutes); rows/s is measured on what ran",
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 100_000, 1
    print(environment())
    dataset = make_dataset(args.rows)
    print(f"{args.rows:,} rows x 8 features, TensorDataset, shuffle=True, median of {args.repeats}\n")
    rows = []
    for batch_size in (32, 1024):
        for num_workers in (0, 2):
            loaders = {"torch": (TorchDataLoader, args.torch_max_batches), "naiad": (naiad.DataLoader, 0)}
            n_rows = {name: epoch(cls, dataset, batch_size, num_workers, cap) for name, (cls, cap) in loaders.items()}
            times: dict[str, list[float]] = {name: [] for name in loaders}
            for _ in range(args.repeats):  # alternate, so both see the same machine load
                for name, (cls, cap) in loaders.items():
                    t0 = time.perf_counter()
                    epoch(cls, dataset, batch_size, num_workers, cap)
                    times[name].append(time.perf_counter() - t0)
            result = {name: n_rows[name] / statistics.median(times[name]) for name in loaders}
            ratio = result["naiad"] / result["torch"]
            rows.append([batch_size, num_workers, f"{result['torch']:,.0f}", f"{result['naiad']:,.0f}", f"{ratio:.1f}x"])
            print(f"batch {batch_size:5d} workers {num_workers}: torch {result['torch']:>14,.0f} rows/s  "
                  f"naiad {result['naiad']:>14,.0f} rows/s  {ratio:6.1f}x", flush=True)
    print()
    print(markdown_table(["batch", "workers", "torch rows/s", "naiad rows/s", "naiad / torch"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
