"""naiad against its peers: one shuffled epoch of the same table, batch 1024, each loader in a new process.

The question: a user has a table (2M rows: nine float32 features and an int64 row id; Parquet in
64 Ki-row groups and the same rows as CSV) and wants one shuffled epoch of batches of 1024 on a
2-core machine. How fast is each loader a user would pick, how long until its first batch, what does
converting into its format cost, how much memory does its process tree take, how well does it shuffle,
and does every row come exactly once?

    python bench/bench_peers.py                          # 2M rows, 3 rounds (installs the peers once)
    python bench/bench_peers.py --rows 200000 --rounds 1 # a smoke run
    python bench/bench_peers.py --naiad-best-args '{"num_workers": 0}'   # adds naiad's "best" rows
    python bench/bench_peers.py --only naiad-parquet,ray # a subset (keys as in the settings list)

The peers are installed into their own virtual environments under ``--venv-dir`` (default
~/.cache/naiad-bench/peers-venv), with the pinned versions of bench/peers/requirements.txt and
requirements-mosaic.txt (MosaicML Streaming cannot share an environment with ``datasets`` 5), and torch
constrained to the version installed here, so pip never fetches another build. naiad and torch's own
loader run in this interpreter with naiad from this checkout's src/.

Measured, per loader (medians over ``--rounds``; in each round the loaders run one after another, each
round starting at the next loader, so a noisy spell does not land on one loader only):

- rows/s: rows delivered / seconds from opening the loader (reading the file into tensors, starting
  workers or a Ray cluster) to the end of the epoch; imports are reported apart ("import s");
- first batch s: opening the loader to its first batch;
- setup s: converting the table into the loader's format, once (tar shards, LitData chunks, MDS,
  Arrow files, Parquet shards); 0 for loaders that read the Parquet or CSV file as it is;
- peak PSS / RSS MB: the largest sum over the process tree (the loader process, its workers, and
  anything they start), sampled every 50 ms; PSS splits shared pages between the processes that
  share them, RSS counts them in each;
- correlation of position in the epoch with row id, and batch span = median over batches of
  (max id - min id) / rows (a full permutation gives about 0 and about 1);
- every row once: the ids delivered, sorted, are exactly 0..rows-1 (else what was missing or repeated).

A loader that fails to install, convert or run shows the error in its row; the others go on.
``--epoch-budget-s S`` stops an epoch after S seconds (the slowest peers take many minutes per
epoch on two cores): its rows/s and quality are those of the part read, marked "partial". The
peers' row shuffle buffers default to naiad's default buffer (``--peer-buffer``), so the sizes match.

The target line: naiad's defaults reach >= 10x the rows/s of the fastest peer whose shuffle is
row-level (batch span >= 0.9, every row once), with equal or better quality (|correlation| at most
the peer's + 0.01, span at least the peer's - 0.01).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.path.join(HERE, "peers")
SRC_DIR = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, HERE)
sys.path.insert(0, SRC_DIR)
sys.path.insert(0, PEERS_DIR)
from harness import environment, markdown_table  # noqa: E402
from processes import run_child  # noqa: E402

from naiad.stream.batches import DEFAULT_SHUFFLE_BUFFER_ROWS  # noqa: E402

ENV_REQUIREMENTS = {"peers": "requirements.txt", "mosaic": "requirements-mosaic.txt"}
FEATURES = [f"f{i}" for i in range(9)]
SHARDS = 16  # files for the loaders that split work by file (WebDataset, HF streaming, Ray)


@dataclass(frozen=True)
class Runner:
    """One loader configuration: where it runs, its adapter, and the conversion it needs."""

    key: str  # for --only
    name: str
    env: str  # "main" (this interpreter), or a key of ENV_REQUIREMENTS
    module: str
    opts: dict[str, Any]
    settings: str
    convert: str | None = None  # a key of conversions(), or "shards"
    peer: bool = True  # counts for the target (naiad's own rows do not)


def runners(args: argparse.Namespace) -> list[Runner]:
    """Every loader, with the settings its docs suggest for a shuffled epoch on 2 cores."""
    buf = args.peer_buffer
    out = [
        Runner("torch-0", "torch DataLoader(TensorDataset), 0 workers", "main", "peer_torch",
               {"loader": "torch", "num_workers": 0}, "shuffle=True, num_workers=0"),
        Runner("torch-2", "torch DataLoader(TensorDataset), 2 workers", "main", "peer_torch",
               {"loader": "torch", "num_workers": 2}, "shuffle=True, num_workers=2"),
        Runner("torchdata", "torchdata StatefulDataLoader(TensorDataset)", "peers", "peer_torch",
               {"loader": "torchdata", "num_workers": 2}, "shuffle=True, num_workers=2"),
        Runner("wds-rows", "WebDataset, row shuffle", "peers", "peer_webdataset",
               {"rows": True, "num_workers": 2, "chunk_buffer": 64, "row_buffer": buf},
               f"shard shuffle, 64-chunk buffer, unbatched, {buf}-row buffer, batched; WebLoader num_workers=2",
               "webdataset"),
        Runner("wds-blocks", "WebDataset, block shuffle", "peers", "peer_webdataset",
               {"rows": False, "num_workers": 2, "chunk_buffer": 64},
               "shard shuffle, 64-chunk buffer (a 1024-row chunk is a batch); WebLoader num_workers=2", "webdataset"),
        Runner("litdata", "LitData StreamingDataset", "peers", "peer_litdata", {"num_workers": 2},
               "optimize(chunk_bytes=64MB, num_workers=2); StreamingDataset(shuffle=True), "
               "StreamingDataLoader num_workers=2",
               "litdata"),
        Runner("mosaic", "MosaicML Streaming (MDS)", "mosaic", "peer_mosaic", {"num_workers": 2},
               "MDSWriter (no compression); StreamingDataset(shuffle=True, default py1e), DataLoader num_workers=2",
               "mosaic"),
        Runner("hf-map", "HF datasets, map-style", "peers", "peer_hf", {"streaming": False, "num_workers": 2},
               "load_from_disk(), DataLoader(shuffle=True, num_workers=2) (default format, rows collated by torch)",
               "hf"),
        Runner("hf-stream", "HF datasets, streaming=True", "peers", "peer_hf",
               {"streaming": True, "num_workers": 2, "buffer_size": buf},
               f"{SHARDS} Parquet shards, .shuffle(seed=0, buffer_size={buf}), DataLoader num_workers=2 "
               "(default format)", "shards"),
        Runner("ray", "Ray Data iter_torch_batches", "peers", "peer_ray", {"num_cpus": 2, "buffer_size": buf},
               f"ray.init(num_cpus=2) (in the first batch's time), read_parquet({SHARDS} shards, shuffle='files'), "
               f"local_shuffle_buffer_size={buf}", "shards"),
        Runner("naiad-parquet", "naiad defaults, Parquet", "main", "peer_naiad", {"source": "parquet"},
               "DataLoader(read_parquet(p), batch_size=1024, shuffle=True, seed=0)", peer=False),
        Runner("naiad-csv", "naiad defaults, CSV", "main", "peer_naiad", {"source": "csv"},
               "DataLoader(read_csv(p), batch_size=1024, shuffle=True, seed=0)", peer=False),
        Runner("naiad-converted", "naiad defaults, Parquet from naiad convert", "main", "peer_naiad",
               {"source": "converted"}, "`naiad convert table.parquet out/` (row groups of 1/4096 of the rows, "
               "no --shuffle), then DataLoader(read_parquet(out/*.parquet), batch_size=1024, shuffle=True, seed=0)",
               "naiad", peer=False),
        Runner("naiad-dropin", "naiad drop-in (TensorDataset)", "main", "peer_naiad", {"source": "tensors"},
               "DataLoader(TensorDataset, batch_size=1024, shuffle=True, seed=0)", peer=False),
    ]
    if args.naiad_best_args:
        best = json.loads(args.naiad_best_args)
        for source, label in (("parquet", "Parquet"), ("csv", "CSV")):
            out.append(Runner(f"naiad-best-{source}", f"naiad best, {label}", "main", "peer_naiad",
                              {"source": source, "loader_args": best}, f"defaults + {best}", peer=False))
    return out


def conversions() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Conversion key -> (environment, adapter module, options)."""
    return {
        "webdataset": ("peers", "peer_webdataset", {"shards": SHARDS, "chunk_rows": 1024}),
        "litdata": ("peers", "peer_litdata", {"num_workers": 2, "chunk_bytes": "64MB"}),
        "mosaic": ("mosaic", "peer_mosaic", {}),
        "hf": ("peers", "peer_hf", {}),
        "naiad": ("main", "peer_naiad", {}),
    }


# ---------------------------------------------------------------------------------------------- data


def make_table(data_dir: str, rows: int) -> dict[str, str]:
    """The table as Parquet (64 Ki-row groups), CSV, and SHARDS Parquet shards; reused when present.

    ``paths["reused"]`` is set when the files were already there.
    """
    paths = {"parquet": os.path.join(data_dir, "table.parquet"), "csv": os.path.join(data_dir, "table.csv"),
             "shards": os.path.join(data_dir, "shards")}
    marker = os.path.join(data_dir, "table.json")
    if os.path.exists(marker) and json.load(open(marker)).get("rows") == rows:
        paths["reused"] = "yes"
        return paths
    os.makedirs(paths["shards"], exist_ok=True)
    rng = np.random.default_rng(0)
    table = pa.table({**{name: rng.standard_normal(rows, dtype=np.float32) for name in FEATURES},
                      "id": np.arange(rows, dtype=np.int64)})
    pq.write_table(table, paths["parquet"], row_group_size=1 << 16)
    pacsv.write_csv(table, paths["csv"])
    t0 = time.perf_counter()
    step = -(-rows // SHARDS)
    for i in range(SHARDS):
        pq.write_table(table.slice(i * step, step), os.path.join(paths["shards"], f"part-{i:03d}.parquet"),
                       row_group_size=1 << 16)
    with open(marker, "w") as f:
        json.dump({"rows": rows, "shards_s": time.perf_counter() - t0}, f)
    return paths


def disk_mb(path: str) -> float:
    """Bytes under ``path`` (a file or a folder), in MB."""
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e6
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 1e6


# ----------------------------------------------------------------------------------- environments


def ensure_env(name: str, venv_dir: str, install: bool) -> tuple[str | None, str | None]:
    """The Python of environment ``name`` (made and filled when missing or stale), or why not."""
    if name == "main":
        return sys.executable, None
    import torch

    path = os.path.join(venv_dir, name)
    python = os.path.join(path, "bin", "python")
    requirements = os.path.join(PEERS_DIR, ENV_REQUIREMENTS[name])
    torch_version = torch.__version__.split("+")[0]
    stamp = hashlib.sha256((open(requirements).read() + torch_version).encode()).hexdigest()
    marker = os.path.join(path, "naiad-bench.json")
    if os.path.exists(marker) and json.load(open(marker)).get("stamp") == stamp:
        return python, None
    if not install:
        return None, f"environment {path} missing or stale (run without --no-install)"
    print(f"installing {ENV_REQUIREMENTS[name]} into {path} (torch=={torch_version}) ...", flush=True)
    log = os.path.join(venv_dir, f"{name}-install.log")
    os.makedirs(venv_dir, exist_ok=True)
    try:
        with open(log, "w") as out:
            if not os.path.exists(python):  # else pip brings the existing one to the pins
                shutil.rmtree(path, ignore_errors=True)
                subprocess.run([sys.executable, "-m", "venv", path], check=True, stdout=out, stderr=out)
            constraints = os.path.join(path, "constraints.txt")
            with open(constraints, "w") as f:
                f.write(f"torch=={torch_version}\n")  # keeps pip from replacing the installed build
            pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-c", constraints]
            subprocess.run(pip + [f"torch=={torch_version}"], check=True, stdout=out, stderr=out, timeout=1800)
            subprocess.run(pip + ["-r", requirements], check=True, stdout=out, stderr=out, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        tail = open(log).read().strip().splitlines()[-1:] if os.path.exists(log) else []
        return None, f"install failed ({exc.__class__.__name__}): {' '.join(tail)[:200]} (log: {log})"
    with open(marker, "w") as f:
        json.dump({"stamp": stamp}, f)
    return python, None


# -------------------------------------------------------------------------------------- figures


def check_epoch(order: np.ndarray, lengths: np.ndarray, rows: int, partial: bool = False) -> dict[str, Any]:
    """Exactly-once and the two shuffle-quality figures of one epoch's delivery order (of the
    part delivered, for an epoch stopped by ``--epoch-budget-s``)."""
    inside = (order >= 0) & (order < rows)
    counts = np.bincount(order[inside], minlength=rows)
    missing, repeated = int((counts == 0).sum()), int((counts[counts > 1] - 1).sum())
    outside = int((~inside).sum())
    if partial:
        once = f"partial: {len(order) / rows:.0%} of the epoch, {repeated} repeated" + (f", {outside} out of range" if outside else "")
    elif missing or repeated or outside:
        once = f"FAIL: {missing} missing, {repeated} repeated" + (f", {outside} out of range" if outside else "")
    else:
        once = "yes"
    lengths = lengths[lengths > 0]
    if len(order) < 2 or len(lengths) == 0:
        return {"once": once, "corr": float("nan"), "span": float("nan")}
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    spans = (np.maximum.reduceat(order, starts) - np.minimum.reduceat(order, starts)) / rows
    corr = float(np.corrcoef(np.arange(len(order), dtype=np.float64), order.astype(np.float64))[0, 1])
    return {"once": once, "corr": corr, "span": float(np.median(spans))}


def summarize(results: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """Medians over a runner's rounds, with the first failure (if any) kept."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"error": results[0]["error"] if results else "not run"}
    checks = [check_epoch(r["ids"], r["lengths"], rows, bool(r.get("partial"))) for r in ok]
    failed = [c["once"] for c in checks if c["once"] != "yes"]
    med = lambda key: statistics.median(r[key] for r in ok)  # noqa: E731
    return {
        "rows_s": statistics.median(r["rows"] / r["epoch_s"] for r in ok), "first_batch_s": med("first_batch_s"),
        "import_s": med("import_s"), "pss_mb": med("peak_pss_mb"), "rss_mb": med("peak_rss_mb"),
        "corr": statistics.median(c["corr"] for c in checks), "span": statistics.median(c["span"] for c in checks),
        "once": failed[0] if failed else "yes", "versions": ok[0]["versions"],
        "errors": [r["error"] for r in results if "error" in r],
    }


def report(runs: list[Runner], summary: dict[str, dict[str, Any]], setup: dict[str, tuple[float, float, str]],
           args: argparse.Namespace) -> str:
    """The markdown table, the settings, and the target line."""
    base = summary.get("naiad defaults, Parquet", {}).get("rows_s")
    header = ["loader", "rows/s", "naiad defaults (Parquet) ÷ this", "first batch s", "import s", "setup s",
              "on disk MB", "peak PSS MB", "peak RSS MB", "corr(position, id)", "batch span", "every row once"]
    table = []
    for run in runs:
        s = summary[run.name]
        setup_s, size_mb, note = setup.get(run.convert or run.opts.get("source", "parquet"), (0.0, 0.0, ""))
        if "error" in s:
            table.append([run.name, "error: " + s["error"].replace("|", "/")] + [""] * (len(header) - 2))
            continue
        ratio = f"{base / s['rows_s']:.2f}x" if base else "n/a"
        table.append([run.name, f"{s['rows_s']:,.0f}", ratio, f"{s['first_batch_s']:.2f}", f"{s['import_s']:.2f}",
                      f"{setup_s:.1f}{note}", f"{size_mb:.0f}", f"{s['pss_mb']:.0f}", f"{s['rss_mb']:.0f}",
                      f"{s['corr']:+.4f}", f"{s['span']:.3f}", s["once"]])
    lines = [markdown_table(header, table), "",
             "Settings (batch_size=1024 everywhere, seed 0 where the loader takes one):"]
    for run in runs:
        s = summary[run.name]
        extra = f" [{s['versions']}]" if "versions" in s else ""
        errors = f" ({len(s['errors'])} of {args.rounds} rounds failed: {s['errors'][0]})" if s.get("errors") else ""
        lines.append(f"- {run.name} (`{run.key}`): {run.settings}{extra}{errors}")
    if any(note for _, _, note in setup.values()):
        lines.append("- setup s marked * : measured when the conversion was made (reused; --reconvert to redo)")
    lines += ["", target_line(runs, summary)]
    return "\n".join(lines)


def target_line(runs: list[Runner], summary: dict[str, dict[str, Any]]) -> str:
    """naiad's defaults >= 10x the fastest row-level peer, with equal or better quality."""
    row_level = [(summary[r.name]["rows_s"], r.name) for r in runs if r.peer and "error" not in summary[r.name]
                 and summary[r.name]["span"] >= 0.9 and summary[r.name]["once"] == "yes"]
    if not row_level:
        return "Target: no peer with a row-level shuffle (batch span >= 0.9) and every row once ran."
    peer_rate, peer = max(row_level)
    p = summary[peer]
    out = [f"Target: naiad defaults >= 10x the fastest row-level peer ({peer}: {peer_rate:,.0f} rows/s, "
           f"corr {p['corr']:+.4f}, span {p['span']:.3f}), equal or better quality (|corr| <= peer's + 0.01, "
           "span >= peer's - 0.01):"]
    for name in ("naiad defaults, Parquet", "naiad defaults, CSV", "naiad defaults, Parquet from naiad convert"):
        n = summary.get(name)
        if not n or "error" in n:
            out.append(f"- {name}: not run")
            continue
        ratio = n["rows_s"] / peer_rate
        quality = abs(n["corr"]) <= abs(p["corr"]) + 0.01 and n["span"] >= p["span"] - 0.01 and n["once"] == "yes"
        met = "MET" if ratio >= 10 and quality else "NOT MET"
        out.append(f"- {name}: {ratio:.2f}x, corr {n['corr']:+.4f}, span {n['span']:.3f}, every row once: "
                   f"{n['once']}; quality {'equal or better' if quality else 'worse'} -> {met}")
    return "\n".join(out)


def convert_all(runs: list[Runner], pythons: dict[str, tuple[str | None, str | None]], paths: dict[str, str],
                setup: dict[str, tuple[float, float, str]], data_dir: str, args: argparse.Namespace) -> dict[str, str]:
    """Make (or reuse) each format the runs need, each in a new process; fills ``setup``, returns the failures."""
    failed_setup: dict[str, str] = {}
    for key, (env_name, module, opts) in conversions().items():
        if not any(r.convert == key for r in runs):
            continue
        python, why = pythons[env_name]
        out = os.path.join(data_dir, "converted", key)
        marker = os.path.join(out, "naiad-bench-convert.json")
        if python is None:
            failed_setup[key] = why or "no environment"
            continue
        made = json.load(open(marker)) if os.path.exists(marker) else {}
        if made.get("opts") == opts and not args.reconvert:
            setup[key] = (made["convert_s"], disk_mb(out), "*")
            continue
        shutil.rmtree(out, ignore_errors=True)
        print(f"converting for {key} ...", flush=True)
        res = run_child(python, "convert", module, opts, {**paths, "out": out},
                        os.path.join(data_dir, "logs", f"convert-{key}"), args.timeout_s)
        if "error" in res:
            failed_setup[key] = "conversion failed: " + res["error"]
            print(f"  {failed_setup[key]}", flush=True)
            continue
        with open(marker, "w") as f:
            json.dump({"convert_s": res["convert_s"], "opts": opts}, f)
        setup[key] = (res["convert_s"], disk_mb(out), "")
    return failed_setup


def run_rounds(runs: list[Runner], pythons: dict[str, tuple[str | None, str | None]], failed_setup: dict[str, str],
               paths: dict[str, str], data_dir: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """``args.rounds`` epochs of every run, each in a new process, each round starting one run later."""
    results: dict[str, list[dict[str, Any]]] = {r.name: [] for r in runs}
    for round_i in range(args.rounds):
        for k in range(len(runs)):
            run = runs[(k + round_i) % len(runs)]
            python, why = pythons[run.env]
            if python is None or run.convert in failed_setup:
                error = why if python is None else failed_setup[str(run.convert)]
                print(f"round {round_i + 1}/{args.rounds}: {run.name}: not run: {error}", flush=True)
                results[run.name].append({"error": error})
                continue
            out = os.path.join(data_dir, "converted", run.convert) if run.convert else data_dir
            child_paths = {**paths, "out": out, "batch_size": args.batch_size, "epoch_budget_s": args.epoch_budget_s}
            res = run_child(python, "epoch", run.module, run.opts, child_paths,
                            os.path.join(data_dir, "logs", f"r{round_i}-{run.key}"), args.timeout_s)
            status = res.get("error") or f"{res['rows'] / res['epoch_s']:,.0f} rows/s"
            print(f"round {round_i + 1}/{args.rounds}: {run.name}: {status}", flush=True)
            results[run.name].append(res)
    return results


# ------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="epochs per loader, each in its own process (median)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--peer-buffer", type=int, default=DEFAULT_SHUFFLE_BUFFER_ROWS,
                        help="the peers' row shuffle buffer (default: naiad's default buffer, so the sizes match)")
    parser.add_argument("--naiad-best-args", default=None,
                        help='JSON keywords for naiad\'s "best" rows, e.g. \'{"num_workers": 0}\' (default: none)')
    parser.add_argument("--only", default=None, help="comma-separated loader keys (see the settings list) to run")
    parser.add_argument("--work-dir", default=os.path.expanduser("~/.cache/naiad-bench/peers"))
    parser.add_argument("--venv-dir", default=os.path.expanduser("~/.cache/naiad-bench/peers-venv"))
    parser.add_argument("--no-install", action="store_true", help="use the environments as they are")
    parser.add_argument("--reconvert", action="store_true", help="redo the conversions (and time them)")
    parser.add_argument("--timeout-s", type=float, default=1800, help="per process")
    parser.add_argument("--epoch-budget-s", type=float, default=None,
                        help="stop an epoch after this many seconds and report the part read (slow peers)")
    parser.add_argument("--out", default=None, help="also write the report here (markdown)")
    args = parser.parse_args()

    runs = runners(args)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        unknown = wanted - {r.key for r in runs}
        if unknown:
            parser.error(f"--only: unknown {sorted(unknown)}; the keys are {[r.key for r in runs]}")
        runs = [r for r in runs if r.key in wanted]
    header = environment()
    print(header, flush=True)
    data_dir = os.path.join(args.work_dir, f"rows-{args.rows}")
    paths = make_table(data_dir, args.rows)
    shards_s = json.load(open(os.path.join(data_dir, "table.json")))["shards_s"]
    print(f"table: {args.rows:,} rows x 10 columns; Parquet {disk_mb(paths['parquet']):.0f} MB, "
          f"CSV {disk_mb(paths['csv']):.0f} MB, in {data_dir}", flush=True)

    pythons: dict[str, tuple[str | None, str | None]] = {}
    for env_name in sorted({r.env for r in runs}):
        pythons[env_name] = ensure_env(env_name, args.venv_dir, not args.no_install)

    setup: dict[str, tuple[float, float, str]] = {
        "parquet": (0.0, disk_mb(paths["parquet"]), ""), "csv": (0.0, disk_mb(paths["csv"]), ""),
        "tensors": (0.0, disk_mb(paths["parquet"]), ""),
        "shards": (shards_s, disk_mb(paths["shards"]), "*" if paths.pop("reused", None) else ""),
    }
    failed_setup = convert_all(runs, pythons, paths, setup, data_dir, args)
    results = run_rounds(runs, pythons, failed_setup, paths, data_dir, args)

    summary = {run.name: summarize(results[run.name], args.rows) for run in runs}
    text = (f"{header}\n\nOne shuffled epoch, batch {args.batch_size}, {args.rows:,} rows x 10 columns "
            f"(9 float32 + int64 id), medians of {args.rounds} round(s), each epoch in a new process:\n\n"
            + report(runs, summary, setup, args))
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
