"""Shuffle quality and speed against the file's layout: how many blocks a block shuffle has to mix.

A block shuffle permutes blocks and mixes rows in a bounded buffer. However big the buffer, a
row's place in the epoch stays close to its block's place in the permutation, so the
correlation of epoch position with row number is about that of a random permutation of the
blocks: roughly ``1/sqrt(blocks)``, a different value for every seed. This script measures it,
with the speed, for one table laid out several ways:

- Parquet as ``pq.write_table`` writes it by default, and in smaller row groups (``--groups``);
- the same as Arrow IPC with 64 Ki-row record batches, read whole (``block_rows=65536``) and as
  naiad's default slices (NOTE [ Record batch slices ]);
- Parquet in 64 Ki-row groups with a shuffle buffer holding the whole table (a full shuffle);
- CSV with naiad's defaults.

Each setting runs one shuffled epoch per seed (``--seeds``) in a new process, with
``naiad.DataLoader(source, batch_size=1024, shuffle=True, seed=s)``; the table gives the median
rows/s, the median and largest |correlation| over the seeds, and the median batch span (the
median over batches of (max row - min row) / rows; 1 is a full permutation).

    python bench/bench_layout.py --rows 2000000 --seeds 0,1,2,3,4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import environment, markdown_table  # noqa: E402

EPOCH = r"""
import json, sys, time
import numpy as np
import naiad
spec = json.loads(sys.argv[1])
read = {"parquet": naiad.read_parquet, "arrow": naiad.read_arrow, "csv": naiad.read_csv}[spec["format"]]
source = read(spec["path"], **spec["reader"])
loader = naiad.DataLoader(source, batch_size=1024, shuffle=True, seed=spec["seed"], **spec["loader"])
ids = []
t = time.perf_counter()
first = None
for batch in loader:
    ids.append(batch["id"].numpy())
    if first is None:
        first = time.perf_counter() - t
elapsed = time.perf_counter() - t
order = np.concatenate(ids)
n = len(order)
assert n == spec["rows"] and len(np.unique(order)) == n, "a row lost or repeated"
corr = float(np.corrcoef(np.arange(n), order)[0, 1])
span = float(np.median([(b.max() - b.min()) / n for b in ids if len(b) > 1]))
print(json.dumps({"rows_s": n / elapsed, "first": first, "corr": corr, "span": span, "blocks": len(source.blocks())}))
"""


def make_files(folder: Path, rows: int, groups: list[int]) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"csv": str(folder / "table.csv"), "arrow": str(folder / "table.arrow"), "parquet": str(folder / "table.parquet")}
    table = None
    if not all(os.path.exists(p) for p in paths.values()) or not all((folder / f"g{g}.parquet").exists() for g in groups):
        rng = np.random.default_rng(0)
        cols: dict[str, Any] = {f"f{i}": rng.standard_normal(rows).astype(np.float32) for i in range(9)}
        cols["id"] = np.arange(rows, dtype=np.int64)
        table = pa.table(cols)
        pq.write_table(table, paths["parquet"])  # PyArrow's defaults: groups of 1 Mi rows
        pacsv.write_csv(table, paths["csv"])
        with pa.ipc.new_file(paths["arrow"], table.schema) as w:
            w.write_table(table, max_chunksize=65536)
        for g in groups:
            pq.write_table(table, folder / f"g{g}.parquet", row_group_size=g, use_dictionary=False)
    for g in groups:
        paths[f"g{g}"] = str(folder / f"g{g}.parquet")
    return paths


def settings(paths: dict[str, str], groups: list[int], rows: int) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [
        ("Parquet, pq.write_table defaults (1 Mi-row groups)", {"format": "parquet", "path": paths["parquet"]})]
    for g in groups:
        out.append((f"Parquet, {g:,}-row groups, no dictionary", {"format": "parquet", "path": paths[f"g{g}"]}))
    if 65536 in groups:
        out.append(("Parquet, 65,536-row groups, buffer = whole table",
                    {"format": "parquet", "path": paths["g65536"], "loader": {"shuffle_buffer": rows}}))
    out += [
        ("Arrow, 64 Ki-row batches read whole (block_rows=65536)",
         {"format": "arrow", "path": paths["arrow"], "reader": {"block_rows": 65536}}),
        ("Arrow, 64 Ki-row batches, default slices", {"format": "arrow", "path": paths["arrow"]}),
        ("CSV, defaults", {"format": "csv", "path": paths["csv"], "reader": {"index_dir": False}}),
    ]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--groups", default="65536,16384,4096,1024", help="Parquet row-group sizes to compare")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--only", default=None, help="run only the settings whose name contains this")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "naiad-bench" / "layout"))
    args = p.parse_args()
    print(environment())
    print(f"\n`python bench/bench_layout.py {' '.join(sys.argv[1:])}`\n")
    groups = [int(g) for g in args.groups.split(",") if g]
    seeds = [int(s) for s in args.seeds.split(",")]
    paths = make_files(Path(args.cache_dir) / f"rows-{args.rows}", args.rows, groups)
    runs = [(name, spec) for name, spec in settings(paths, groups, args.rows) if not args.only or args.only in name]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in runs}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    for seed in seeds:  # settings alternate within each seed's round
        for name, spec in runs:
            full = {"reader": {}, "loader": {}, **spec, "seed": seed, "rows": args.rows}
            out = subprocess.run([sys.executable, "-c", EPOCH, json.dumps(full)], capture_output=True, text=True,
                                 env=env, timeout=900)
            if out.returncode:
                raise SystemExit(f"{name}, seed {seed}: {out.stderr.strip().splitlines()[-1]}")
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  seed {seed}: {name}: {results[name][-1]}", flush=True)
    table = []
    for name, res in results.items():
        corrs = [abs(r["corr"]) for r in res]
        table.append([name, f"{res[0]['blocks']:,}", f"{statistics.median(r['rows_s'] for r in res) / 1e6:.2f}",
                      f"{statistics.median(r['first'] for r in res):.2f}", f"{statistics.median(corrs):.3f}",
                      f"{max(corrs):.3f}", f"{statistics.median(r['span'] for r in res):.3f}",
                      f"{1 / np.sqrt(res[0]['blocks']):.3f}"])
    print()
    print(markdown_table(["layout", "blocks", "M rows/s", "first batch s", "median abs(corr)", "max abs(corr)",
                          "batch span", "1/sqrt(blocks)"], table))


if __name__ == "__main__":
    main()
