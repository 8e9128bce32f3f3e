"""Memory with 2 workers: a dataset of millions of Python objects, and the same data as columns.

The classic copy-on-read problem: a dataset that is a list of small tuples is a few Python
objects per row. Forked workers share the parent's pages until they *write* to them, and reading
a Python object writes its reference count, so every page a worker reads becomes its own copy.
After an epoch each worker holds a copy of most of the list. ``naiad.dataset.worker.columnar`` lays the
same samples out as a few NumPy arrays once, before the loader starts: reading those writes
nothing, the pages stay shared, and batches are gathered a column at a time.

Each variant runs in a fresh process (the same start-up for all): build the data, then one
shuffled epoch with ``num_workers=2``, batch 256. Memory is the sum of the proportional set size
(PSS: a shared page counts 1/n to each of the n processes sharing it) of the training process
and its workers, sampled every 50 ms; "growth" is its peak minus the value before the loader
started, i.e. what the workers cost. USS is the memory private to each worker at the end.

Run: ``python bench/bench_memory_workers.py [--rows 1000000] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "torch, list of tuples": ("torch", "list"),
    "naiad, list of tuples": ("naiad", "list"),
    "torch, columnar()": ("torch", "columnar"),
    "naiad, columnar()": ("naiad", "columnar"),
}


def _pss(procs: list[Any]) -> int:
    import psutil

    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def child(loader_name: str, layout: str, rows: int) -> dict[str, Any]:
    """One variant, in this process: returns its measurements."""
    import psutil
    import torch
    from torch.utils.data import DataLoader as TorchDataLoader

    import naiad
    from naiad.dataset.worker import columnar

    # Rows like a tabular sample: an id, two features and a label.
    samples = [(i, i * 0.5, float(i % 7), i % 2) for i in range(rows)]
    layout_s = 0.0
    if layout == "columnar":
        t0 = time.perf_counter()
        dataset: Any = columnar(samples)
        layout_s = time.perf_counter() - t0
        del samples
    else:
        dataset = samples
    import gc

    gc.collect()
    me = psutil.Process()
    before = _pss([me])
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], _pss([me, *me.children(recursive=True)]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    make = naiad.DataLoader if loader_name == "naiad" else TorchDataLoader
    loader = make(dataset, batch_size=256, shuffle=True, num_workers=2, persistent_workers=True,
                  generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += len(batch[0])
    epoch_s = time.perf_counter() - t0
    workers = me.children(recursive=True)
    uss = [w.memory_full_info().uss for w in workers]
    peak[0] = max(peak[0], _pss([me, *workers]))
    stop.set()
    sampler.join()
    assert n == rows
    return {
        "before_mb": before / 2**20,
        "peak_mb": peak[0] / 2**20,
        "growth_mb": (peak[0] - before) / 2**20,
        "worker_uss_mb": [u / 2**20 for u in uss],
        "epoch_s": epoch_s,
        "layout_s": layout_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", help="append the results as markdown here")
    parser.add_argument("--child", nargs=2, metavar=("LOADER", "LAYOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.rows)))
        return 0
    from harness import environment, markdown_table

    env = environment()
    print(env, flush=True)
    results = {}
    for name, (loader_name, layout) in VARIANTS.items():
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--rows", str(args.rows), "--child", loader_name, layout],
            capture_output=True, text=True, check=True,
        )
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {results[name]}", flush=True)
    base = results["torch, list of tuples"]["growth_mb"]
    header = ["variant", "before MB", "peak MB", "growth MB", "growth vs torch+list", "worker USS MB", "epoch s", "columnar() s"]
    rows = [
        [
            name, f"{r['before_mb']:.0f}", f"{r['peak_mb']:.0f}", f"{r['growth_mb']:.0f}",
            f"{r['growth_mb'] / base:.2f}x" if base > 0 else "-",
            " / ".join(f"{u:.0f}" for u in r["worker_uss_mb"]), f"{r['epoch_s']:.2f}",
            f"{r['layout_s']:.2f}" if r["layout_s"] else "-",
        ]
        for name, r in results.items()
    ]
    title = f"Memory, 2 workers, one epoch over {args.rows:,} rows of (int, float, float, int): sum of PSS"
    table = markdown_table(header, rows)
    print(f"\n{title}\n{table}")
    if args.out:
        command = "python bench/bench_memory_workers.py " + " ".join(sys.argv[1:])
        with open(args.out, "a" if os.path.exists(args.out) else "w") as f:
            f.write(f"\n## {title}\n\n`{command}`\n\n{env}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
