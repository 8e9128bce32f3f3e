"""``naiad tune`` end to end, in a subprocess, on small data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from naiad.cli import main
from naiad.cli.tune import _sizes, settings_for

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def tune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NAIAD_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "naiad", "tune", *args],
        capture_output=True, text=True, timeout=100, cwd=ROOT, env=env,
    )


def test_tune_demo_sweeps_prints_a_table_and_recommends(tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    proc = tune(
        tmp_path, "demo", "--rows", "3000", "--batch-size", "64", "--seconds", "0.2",
        "--workers", "0,1", "--prefetch", "2", "--step-ms", "0.5", "--json", str(out),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if "rows/s" in line)
    for column in ("workers", "mode", "prefetch", "wait/step ms", "CPU %", "peak mem MB"):
        assert column in header
    table = lines[lines.index(header) + 1 :]
    # At the default block size 0, 1 process, 1 thread; at 1 MiB and 4 MiB 0 and 1 thread.
    assert sum(1 for line in table if line.strip().startswith(("*", "0", "1"))) == 7
    assert "Recommended: naiad.DataLoader(" in proc.stdout
    assert "8/8" in proc.stderr  # the progress bar, on stderr: 7 settings, then the shuffle figures
    data = json.loads(out.read_text())
    assert len(data["results"]) == 7 and data["recommended"]["num_workers"] in (0, 1)
    assert {r["block_bytes"] for r in data["results"]} == {None, 1 << 20, 4 << 20}
    assert all(r["rows_per_s"] > 0 and r["peak_mem_mb"] > 0 for r in data["results"])


def test_tune_a_csv_file_loaded_in_memory(tmp_path: Path) -> None:
    csv = tmp_path / "small.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(500)))
    proc = tune(tmp_path, str(csv), "--load", "memory", "--seconds", "0.1", "--workers", "0", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "in memory" in proc.stdout and "Recommended: naiad.DataLoader(..., num_workers=0)" in proc.stdout
    assert proc.stderr == ""


def test_tune_reports_a_missing_source_without_a_traceback(tmp_path: Path) -> None:
    proc = tune(tmp_path, str(tmp_path / "nope-*.csv"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "`source` must be 'demo', a file or a glob" in proc.stderr


def small_csv(tmp_path: Path, rows: int = 3000) -> Path:
    csv = tmp_path / "small.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(rows)))
    return csv


def test_tune_sweeps_block_sizes_and_buffers_and_compares_the_defaults(tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    proc = tune(
        tmp_path, str(small_csv(tmp_path)), "--batch-size", "64", "--seconds", "0.2", "--workers", "0,1",
        "--modes", "thread", "--prefetch", "2", "--block-bytes", "auto,8K", "--buffer", "auto,1000",
        "--json", str(out), "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if "rows/s" in line)
    assert header.split()[:5] == ["workers", "mode", "prefetch", "block", "buffer"]
    table = lines[lines.index(header) + 1 : lines.index(header) + 9]
    assert sum("8 KiB" in line for line in table) == 4 and sum("1,000" in line for line in table) == 4
    assert "Defaults: naiad.DataLoader(naiad.read(path), batch_size=64, shuffle=True, seed=0) (num_workers=0" in proc.stdout

    data = json.loads(out.read_text())
    # Every worker setting at the defaults, the other three block/buffer pairs at 0 and 1 thread.
    assert len(data["results"]) == 8
    assert {(r["block_bytes"], r["shuffle_buffer"]) for r in data["results"]} == {
        (None, None), (None, 1000), (8192, None), (8192, 1000)
    }
    defaults = data["defaults"]
    assert (defaults["num_workers"], defaults["block_bytes"], defaults["shuffle_buffer"]) == (0, None, None)
    assert defaults in data["results"] and defaults["rows_per_s"] > 0  # the sweep's own 0-worker run
    assert data["default_block_bytes"] > 0 and data["recommended_over_defaults"] > 0
    chosen = data["recommended"]
    if data["changes"]:
        differ = {k for k in ("block_bytes", "shuffle_buffer") if chosen[k] is not None}
        differ |= {"num_workers"} if chosen["num_workers"] else set()
        assert {c["option"] for c in data["changes"]} == differ
        assert "the recommendation changes " + " and ".join(c["words"] for c in data["changes"]) in proc.stdout
        coarser = (chosen["block_bytes"] or 0) > data["default_block_bytes"] or (
            chosen["shuffle_buffer"] is not None and chosen["shuffle_buffer"] < data["default_shuffle_buffer"]
        )
        assert ("shuffle less" in proc.stdout) == coarser
    else:
        assert "within 5% of the best" in proc.stdout and "nothing to change" in proc.stdout
        bar = data["quality_bar"]
        best = max(r["rows_per_s"] for r in data["results"] if abs(r["corr"]) <= bar["corr"] and r["span"] >= bar["span"])
        assert defaults["rows_per_s"] >= 0.95 * best


def test_tune_parquet_sweeps_no_block_size_and_measures_the_defaults_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "small.parquet"
    pq.write_table(pa.table({"a": list(range(2000)), "label": [i % 2 for i in range(2000)]}), path, row_group_size=250)
    out = tmp_path / "tune.json"
    proc = tune(
        tmp_path, str(path), "--batch-size", "64", "--seconds", "0.2", "--workers", "1", "--modes", "thread",
        "--prefetch", "2", "--buffer", "auto,500", "--json", str(out),
    )
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if "rows/s" in line)
    assert "buffer" in header and "block" not in header
    assert "the defaults" in proc.stderr  # not a setting of this sweep: measured once more
    data = json.loads(out.read_text())
    assert len(data["results"]) == 2  # 1 thread at the default buffer and at 500 rows
    assert all(r["block_bytes"] is None and r["num_workers"] == 1 for r in data["results"])
    assert data["defaults"]["num_workers"] == 0 and data["defaults"]["rows_per_s"] > 0
    assert data["default_block_bytes"] is None
    assert all(c["option"] != "block_bytes" for c in data["changes"])

    assert main(["tune", str(path), "--block-bytes", "auto,1M"]) == 2
    assert "`--block-bytes` applies to CSV, JSONL and text sources" in capsys.readouterr().err


def test_tune_never_recommends_a_setting_that_mixes_less_unless_asked(tmp_path: Path) -> None:
    # 8 KiB blocks and a 64-row buffer keep a batch's rows close together in the file; the
    # defaults (one block, a buffer bigger than the file) mix it whole.
    csv = small_csv(tmp_path, rows=20_000)
    args = [str(csv), "--batch-size", "64", "--seconds", "0.2", "--workers", "0", "--block-bytes", "auto,8K",
            "--buffer", "auto,64", "--no-progress"]
    out = tmp_path / "tune.json"
    proc = tune(tmp_path, *args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    figures = {(r["block_bytes"], r["shuffle_buffer"]): (r["corr"], r["span"]) for r in data["results"]}
    assert len(figures) == 4
    assert figures[(None, None)][1] > 0.95 and abs(figures[(None, None)][0]) < 0.02  # 63/65: a full permutation
    assert figures[(8192, 64)][1] < 0.2 and figures[(None, 64)][1] < 0.2
    bar = data["quality_bar"]
    assert bar == {"corr": 0.02, "span": round(0.98 * 63 / 65, 4)}
    chosen = figures[(data["recommended"]["block_bytes"], data["recommended"]["shuffle_buffer"])]
    assert abs(chosen[0]) <= bar["corr"] and chosen[1] >= bar["span"]
    header = next(line for line in proc.stdout.splitlines() if "rows/s" in line)
    assert header.split()[-2:] == ["corr", "span"]
    marked = [line for line in proc.stdout.splitlines() if line.startswith("-")]
    assert marked and all("64" in line for line in marked)  # the small buffer's rows
    assert "among those with |corr| <= 0.02 and batch span >= 0.95" in proc.stdout

    proc = tune(tmp_path, *args, "--any-order", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["quality_bar"] is None
    best = max(data["results"], key=lambda r: r["rows_per_s"])
    assert data["recommended_over_defaults"] > 0 and best["rows_per_s"] > 0
    assert not any(line.startswith("-") for line in proc.stdout.splitlines())


@pytest.mark.parametrize("bad", ["0", "abc", "4X", "-1M", "auto,", "0.5"])
def test_tune_rejects_bad_block_sizes_with_exit_2(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tune", "demo", f"--block-bytes={bad}"] if bad != "auto," else ["tune", "demo", "--block-bytes", ","])
    assert exc.value.code == 2
    assert "--block-bytes: expected 'auto' or sizes" in capsys.readouterr().err


def test_tune_rejects_a_zero_buffer_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tune", "demo", "--buffer", "auto,0"])
    assert exc.value.code == 2 and "--buffer: expected 'auto' or row counts >= 1" in capsys.readouterr().err


def test_block_sizes_parse_binary_units_and_the_default_sweep_stays_small() -> None:
    assert _sizes("auto,1M,4MiB") == [None, 1 << 20, 4 << 20]
    assert _sizes("65536, 512k,1.5MB,auto,1M") == [65536, 512 << 10, 3 << 19, None, 1 << 20]
    # 2 cores: every worker setting (0; 1, 2 x process, thread x prefetch 2, 4) at the default
    # block size, and 0 workers and 2 threads at 1 MiB and 4 MiB.
    sweep = settings_for([0, 1, 2], ["process", "thread"], [2, 4], [None, 1 << 20, 4 << 20], [None])
    assert len(sweep) == 9 + 2 * 2
    assert {(s.num_workers, s.worker_mode, s.prefetch_factor) for s in sweep if s.block_bytes} == {(0, "inline", None), (2, "thread", 2)}
    full = settings_for([0, 1, 2], ["process", "thread"], [2, 4], [None, 1 << 20, 4 << 20], [None], full=True)
    assert len(full) == 9 * 3
