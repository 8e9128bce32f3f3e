"""Resuming mid-epoch: the first batch after ``load_state_dict`` against a fresh epoch's first.

Question: resuming at 10%, 50% and 90% of a shuffled epoch over a diabetes-shaped CSV (1 GB by
default) and its Parquet copy (as PyArrow writes it by default: 1 Mi-row groups, snappy), what
does the first batch after ``load_state_dict`` cost, against the first batch of a fresh epoch?
The loader is what a user gets with no tuning::

    naiad.DataLoader(naiad.read_csv(path), batch_size=1024, shuffle=True, seed=0)

(and the same with ``naiad.read_parquet``). Every measurement runs in a new process, as a
restarted job would (nothing cached in-process: row counts, open files); the files themselves
are in the page cache (written or read just before). The states come from one uninterrupted
epoch per file, which also records the batch that follows each state: the first resumed batch
must equal it.

Per (file, position) the table shows, as medians over ``--repeats`` rounds:

* fresh: ``next(iter(loader))`` of a new loader whose rows were already counted (``len()``);
* resumed: ``load_state_dict(state)`` then ``next(iter(loader))``, rows counted beforehand
  (``load_state_dict`` needs ``len()``, which counts the rows of a CSV: a newline scan);
* the same two from a new loader with nothing counted yet (what a restarted job pays: for a
  CSV the row count comes first on both sides; for Parquet it is the footer): fresh measured
  as such, resumed as the timed ``len()`` plus the above;
* the size of ``json.dumps(loader.state_dict())``.

A second table splits the resumed first batch: rows read and parsed (``Source.read_block``,
timed), the shuffle buffer's replay over row positions (``naiad.stream.replay.BufferReplay.replay``,
timed when that internal exists) and the rest (plan, putting rows back in the buffer,
shuffling, batching).

Targets: the resumed first batch within 2x of the fresh first batch at every position (so it
does not grow with the position), and the state under 4 KB, at each size run.

    python bench/bench_resume.py --csv-bytes 100000000 1000000000   # 100 MB and 1 GB
    python bench/bench_resume.py --csv-bytes 100000000 --repeats 5  # the small size alone

Data are written once to ``--work`` (default ``~/.cache/naiad-bench/resume``) and reused; the
writer rounds up to whole 1 Mi-row chunks (about 33 MB), so 100 MB asked gives 133 MB.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_stream_data import write_diabetes_csv  # noqa: E402
from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

BATCH_SIZE = 1024
SEED = 0
POSITIONS = (0.1, 0.5, 0.9)
RATIO_TARGET = 2.0
STATE_BYTES_TARGET = 4096
PARQUET_ROW_GROUP_ROWS = 1 << 20  # PyArrow's default (pq.write_table, ParquetWriter)
FORMATS = ("csv", "parquet")
DEFAULT_WORK = os.path.join(os.path.expanduser("~"), ".cache", "naiad-bench", "resume")


# -- data ------------------------------------------------------------------------------------


def ensure_data(work: str, csv_bytes: int) -> dict[str, str]:
    """The diabetes-shaped CSV of ``csv_bytes`` and its Parquet copy, written once in ``work``."""
    directory = os.path.join(work, f"diabetes-{csv_bytes}")
    os.makedirs(directory, exist_ok=True)
    paths = {"csv": os.path.join(directory, "diabetes.csv"),
             "parquet": os.path.join(directory, "diabetes.parquet")}
    if not os.path.exists(paths["csv"]):
        t0 = time.perf_counter()
        partial = paths["csv"] + ".partial"
        rows = write_diabetes_csv(partial, csv_bytes)
        os.replace(partial, paths["csv"])  # a run cut short never leaves a truncated file behind
        seconds = time.perf_counter() - t0
        print(f"wrote {paths['csv']}: {rows:,} rows in {seconds:.0f} s", flush=True)
    if not os.path.exists(paths["parquet"]):
        t0 = time.perf_counter()
        partial = paths["parquet"] + ".partial"
        parquet_copy(paths["csv"], partial)
        os.replace(partial, paths["parquet"])
        print(f"wrote {paths['parquet']} in {time.perf_counter() - t0:.0f} s", flush=True)
    return paths


def parquet_copy(csv_path: str, path: str) -> None:
    """``csv_path`` as ``pq.write_table(pyarrow.csv.read_csv(csv_path), path)`` writes it: row
    groups of 1 Mi rows, snappy, dictionary pages; streamed, so memory stays bounded."""
    reader = pacsv.open_csv(csv_path, read_options=pacsv.ReadOptions(block_size=64 << 20))
    pending: list[pa.RecordBatch] = []
    held = 0
    with pq.ParquetWriter(path, reader.schema) as writer:
        for batch in reader:
            pending.append(batch)
            held += batch.num_rows
            if held >= PARQUET_ROW_GROUP_ROWS:
                table = pa.Table.from_batches(pending)
                cut = held - held % PARQUET_ROW_GROUP_ROWS
                writer.write_table(table.slice(0, cut))
                pending = table.slice(cut).to_batches()
                held -= cut
        if held:
            writer.write_table(pa.Table.from_batches(pending, schema=reader.schema))


def make_source(fmt: str, path: str) -> naiad.Source:
    """The reader a user calls, with no options."""
    return naiad.read_csv(path) if fmt == "csv" else naiad.read_parquet(path)


def make_loader(source: naiad.Source) -> naiad.DataLoader:
    """The loader a user gets with no tuning."""
    return naiad.DataLoader(source, batch_size=BATCH_SIZE, shuffle=True, seed=SEED)


# -- the states, from one uninterrupted epoch -------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A state taken after ``k`` batches, and the batch an uninterrupted epoch yields next."""

    position: float
    k: int
    state_path: str
    expected_path: str
    state_bytes: int


def make_checkpoints(fmt: str, path: str, out_dir: str) -> tuple[int, str, list[Checkpoint]]:
    """One uninterrupted epoch up to the last position: (batches per epoch, the first batch's
    file, a checkpoint per position)."""
    loader = make_loader(make_source(fmt, path))
    n = len(loader)
    ks = {max(1, round(p * n)): p for p in POSITIONS}
    first_path = os.path.join(out_dir, f"{fmt}-first.pt")
    checkpoints = []
    t0 = time.perf_counter()
    it = iter(loader)
    for i in range(max(ks) + 1):
        if i in ks:
            state = loader.state_dict()
            text = json.dumps(state)
            state_path = os.path.join(out_dir, f"{fmt}-{i}.json")
            with open(state_path, "w") as f:
                f.write(text)
        batch = next(it)
        if i == 0:
            torch.save(batch, first_path)
        if i in ks:
            expected_path = os.path.join(out_dir, f"{fmt}-{i}-next.pt")
            torch.save(batch, expected_path)
            checkpoints.append(Checkpoint(ks[i], i, state_path, expected_path, len(text.encode())))
    del it
    seconds = time.perf_counter() - t0
    print(f"{fmt}: {n:,} batches per epoch; states at {sorted(ks)} in {seconds:.1f} s", flush=True)
    return n, first_path, checkpoints


# -- one measurement, in a new process ---------------------------------------------------------


def same_batch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same columns, dtypes and values."""
    return list(a) == list(b) and all(
        isinstance(a[k], torch.Tensor) and a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
        for k in a
    )


def hook_replay(timings: dict[str, float]) -> bool:
    """Time ``naiad.stream.replay.BufferReplay.replay`` (internal, in ``naiad.stream.shuffle`` before; False
    when it is not there)."""
    try:
        from naiad.stream.replay import BufferReplay
    except ImportError:
        try:
            from naiad.stream.shuffle import BufferReplay  # type: ignore[attr-defined,no-redef]
        except ImportError:
            return False
    original = BufferReplay.__dict__.get("replay")
    if not isinstance(original, classmethod):
        return False
    func = original.__func__

    def timed(cls: type, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return func(cls, *args, **kwargs)
        finally:
            timings["replay_s"] += time.perf_counter() - t0

    BufferReplay.replay = classmethod(timed)  # type: ignore[method-assign, assignment]
    return True


def hook_reads(source: Any, timings: dict[str, float]) -> None:
    """Time ``source.read_block`` and count its rows (inline, the loader calls this object's)."""
    original: Callable[..., Any] = source.read_block

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        data = original(*args, **kwargs)
        timings["read_s"] += time.perf_counter() - t0
        timings["rows_read"] += len(next(iter(data.columns.values()))) if data.columns else 0
        return data

    source.read_block = timed


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """The child's work: one loader, optionally counted and resumed, timed to its first batch."""
    timings: dict[str, float] = {"read_s": 0.0, "rows_read": 0, "replay_s": 0.0}
    has_replay = hook_replay(timings)
    out: dict[str, Any] = {}
    source = make_source(spec["format"], spec["path"])
    hook_reads(source, timings)
    loader = make_loader(source)
    if spec["count_first"]:
        t0 = time.perf_counter()
        len(loader)
        out["count_s"] = time.perf_counter() - t0
    load_s = 0.0
    if spec["state"] is not None:
        with open(spec["state"]) as f:
            state = json.load(f)
        t0 = time.perf_counter()
        loader.load_state_dict(state)
        load_s = time.perf_counter() - t0
    reads_before = dict(timings)  # load_state_dict reads nothing; keep the first batch's own
    t0 = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    first_s = time.perf_counter() - t0
    out.update(load_s=load_s, first_s=first_s, total_s=load_s + first_s,
               read_s=timings["read_s"] - reads_before["read_s"],
               rows_read=int(timings["rows_read"] - reads_before["rows_read"]),
               replay_s=timings["replay_s"] - reads_before["replay_s"] if has_replay else None)
    out["matches"] = same_batch(batch, torch.load(spec["expected"]))
    del it
    return out


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``measure(spec)`` in a new Python process (nothing cached in-process)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {spec} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# -- the runs and the report -------------------------------------------------------------------


@dataclass
class Row:
    """One table row's medians."""

    file: str
    position: str
    k: str
    fresh_s: float
    resumed_s: float
    fresh_cold_s: float
    resumed_cold_s: float
    state_bytes: int | None
    matches: bool
    load_s: float
    read_s: float
    rows_read: int
    replay_s: float | None
    count_s: float

    @property
    def ratio(self) -> float:
        return self.resumed_s / self.fresh_s

    @property
    def ratio_cold(self) -> float:
        return self.resumed_cold_s / self.fresh_cold_s


def bench_file(fmt: str, path: str, label: str, repeats: int, scratch: str) -> list[Row]:
    """Fresh and resumed first batches of one file, round after round (medians)."""
    n, first_path, checkpoints = make_checkpoints(fmt, path, scratch)
    base = {"format": fmt, "path": path}
    specs: dict[str, dict[str, Any]] = {
        "fresh": {**base, "state": None, "expected": first_path, "count_first": True},
        "fresh cold": {**base, "state": None, "expected": first_path, "count_first": False},
    }
    for c in checkpoints:
        specs[f"{c.position:.0%}"] = {**base, "state": c.state_path, "expected": c.expected_path,
                                      "count_first": True}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
    for _ in range(repeats):  # round after round, so a busy spell slows every entry alike
        for name, spec in specs.items():
            results[name].append(run_child(spec))

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    fresh, fresh_cold = med("fresh", "first_s"), med("fresh cold", "first_s")
    fresh_row = Row(label, "fresh", "0", fresh, fresh, fresh_cold, fresh_cold, None,
                    all(r["matches"] for name in ("fresh", "fresh cold") for r in results[name]),
                    0.0, med("fresh", "read_s"), int(med("fresh", "rows_read")), None,
                    med("fresh", "count_s"))
    rows = [fresh_row]
    for c in checkpoints:
        name = f"{c.position:.0%}"
        replays = [r["replay_s"] for r in results[name]]
        rows.append(Row(
            label, name, f"{c.k:,} / {n:,}", fresh, med(name, "total_s"), fresh_cold,
            statistics.median(r["count_s"] + r["total_s"] for r in results[name]), c.state_bytes,
            all(r["matches"] for r in results[name]), med(name, "load_s"), med(name, "read_s"),
            int(med(name, "rows_read")), None if None in replays else statistics.median(replays),
            med(name, "count_s"),
        ))
    return rows


def main_table(rows: list[Row]) -> str:
    header = ["file", "position", "batches k / epoch", "fresh first batch s", "resumed s",
              "resumed / fresh", "fresh, rows not counted s", "resumed, rows not counted s",
              "ratio (not counted)", "state bytes", "batch k+1 matches"]
    body = [[r.file, r.position, r.k, f"{r.fresh_s:.3f}", f"{r.resumed_s:.3f}", f"{r.ratio:.2f}x",
             f"{r.fresh_cold_s:.3f}", f"{r.resumed_cold_s:.3f}", f"{r.ratio_cold:.2f}x",
             f"{r.state_bytes:,}", "yes" if r.matches else "NO"]
            for r in rows if r.state_bytes is not None]
    return markdown_table(header, body)


def split_table(rows: list[Row]) -> str:
    header = ["file", "position", "row count s (len)", "first batch s (with load_state_dict)",
              "load_state_dict s", "rows read", "reading s", "buffer replay s", "rest s"]
    body = []
    for r in rows:
        replay = r.replay_s or 0.0
        rest = r.resumed_s - r.load_s - r.read_s - replay
        body.append([r.file, r.position, f"{r.count_s:.3f}", f"{r.resumed_s:.3f}",
                     f"{r.load_s:.3f}", f"{r.rows_read:,}", f"{r.read_s:.3f}",
                     "n/a" if r.replay_s is None else f"{r.replay_s:.3f}", f"{rest:.3f}"])
    return markdown_table(header, body)


def verdicts(rows: list[Row]) -> tuple[list[str], bool]:
    """PASS/FAIL lines per file against the targets, and whether all passed."""
    lines, ok = [], True
    for file in dict.fromkeys(r.file for r in rows):
        mine = [r for r in rows if r.file == file and r.state_bytes is not None]
        worst = max(mine, key=lambda r: r.ratio)
        biggest = max(r.state_bytes or 0 for r in mine)
        checks = [
            (worst.ratio <= RATIO_TARGET,
             f"resumed first batch <= {RATIO_TARGET:g}x fresh at every position "
             f"(worst {worst.ratio:.2f}x at {worst.position}; rows not counted: "
             f"{max(r.ratio_cold for r in mine):.2f}x)"),
            (biggest < STATE_BYTES_TARGET,
             f"state < {STATE_BYTES_TARGET:,} bytes (largest {biggest:,})"),
            (all(r.matches for r in rows if r.file == file),
             "first resumed batch == batch k+1 of an uninterrupted epoch (and fresh == batch 1)"),
        ]
        for passed, text in checks:
            ok &= passed
            lines.append(f"{'PASS' if passed else 'FAIL'}  {file}: {text}")
    return lines, ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv-bytes", type=int, nargs="+", default=[1_000_000_000],
                   help="size(s) of the diabetes-shaped CSV, one run per size (default 1 GB)")
    p.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    p.add_argument("--repeats", type=int, default=3, help="rounds of measurements (medians)")
    p.add_argument("--work", default=DEFAULT_WORK, help="where the data are written once and kept")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(measure(json.loads(args.child))))
        return

    print(environment() + "\n")
    print(f"`python {' '.join(sys.argv)}`\n", flush=True)
    rows: list[Row] = []
    for csv_bytes in args.csv_bytes:
        paths = ensure_data(args.work, csv_bytes)
        scratch = tempfile.mkdtemp(prefix="states-", dir=args.work)
        try:
            for fmt in args.formats:
                size = os.path.getsize(paths[fmt])
                label = f"{fmt} {size / 1e6:,.0f} MB"
                rows += bench_file(fmt, paths[fmt], label, args.repeats, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n### Resuming mid-epoch: first batch after load_state_dict (median of {args.repeats}, "
          f"each in a new process; batch {BATCH_SIZE}, shuffle=True, seed={SEED}, no other "
          "option)\n")
    print(main_table(rows) + "\n")
    print("### Where the resumed first batch's time goes (medians)\n")
    print(split_table(rows) + "\n")
    lines, ok = verdicts(rows)
    print("\n".join(lines))
    print(f"\n{'PASS' if ok else 'FAIL'}: all targets")


if __name__ == "__main__":
    main()
