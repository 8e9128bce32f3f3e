"""``naiad tune`` end to end, in a subprocess, on small data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert sum(1 for line in table if line.strip().startswith(("*", "0", "1"))) == 3  # 0, 1 process, 1 thread
    assert "Recommended: naiad.DataLoader(..., num_workers=" in proc.stdout
    assert "3/3" in proc.stderr  # the progress bar, on stderr
    data = json.loads(out.read_text())
    assert len(data["results"]) == 3 and data["recommended"]["num_workers"] in (0, 1)
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
