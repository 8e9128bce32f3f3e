"""scripts/gpu_check.sh, the prepared device check, as far as a machine without a GPU can run it:
``--dry-run`` end to end, a failing step, and the real check refusing to run without CUDA."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_to_end

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.timeout(300)


def run_check(*args: str, out: Path, python: str = sys.executable, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """The script, its whole process tree killed whatever happens (a hang ends every process it
    started)."""
    env = {**os.environ, "PYTHON": python, "GPU_CHECK_OUT": str(out)}
    env.pop("OUT", None)
    return run_to_end(["bash", str(SCRIPT), *args], timeout_s=timeout_s, cwd=ROOT, env=env)


def step_rows(report: Path) -> dict[str, str]:
    """The report's step table: step number -> its result column."""
    rows = {}
    for line in report.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 4 and cells[1] in ("1", "2", "3"):
            rows[cells[1]] = cells[3]
    return rows


def test_dry_run_lists_the_three_steps_and_runs_what_a_cpu_can(tmp_path: Path) -> None:
    res = run_check("--dry-run", out=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    # The three steps, each with its command and its limit.
    for line in ("1. tests/gpu (limit ", "2. bench_h2d (limit ", "3. bench_gpu_decode (limit "):
        assert line in res.stdout
    assert "-m pytest" in res.stdout and "bench/bench_h2d.py" in res.stdout and "bench/bench_gpu_decode.py" in res.stdout
    assert "gpu_check: all steps passed" in res.stdout or "step(s) skipped" in res.stdout
    report = tmp_path / "gpu_check.md"
    assert step_rows(report) == {"1": "PASS", "2": "PASS", "3": "PASS"}
    text = report.read_text()
    assert "- naiad commit: " in text and "- torch: " in text and "- naiad: imports from " + str(ROOT / "src") in text
    # The GPU tests were collected from the source tree, and the CPU side of the decode ran.
    collected = re.search(r"(\d+) tests? collected", (tmp_path / "step1_pytest_gpu.log").read_text())
    assert collected is not None and int(collected.group(1)) >= 13
    decode = json.loads((tmp_path / "bench_gpu_decode.json").read_text())
    assert decode["images"] == 8 and decode["threads"] >= 1
    assert decode["images_per_s"]["naiad t=1"] > 0


def test_a_failing_step_fails_the_check_and_the_next_ones_still_run(tmp_path: Path) -> None:
    wrapper = tmp_path / "python"
    # A Python that fails the second step only.
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        'for a in "$@"; do [ "$a" = bench/bench_h2d.py ] && { echo "bench_h2d: failed: planted"; exit 3; }; done\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    out = tmp_path / "out"
    res = run_check("--dry-run", out=out, python=str(wrapper))
    assert res.returncode == 1, res.stdout + res.stderr
    assert step_rows(out / "gpu_check.md") == {"1": "PASS", "2": "FAIL (exit 3)", "3": "PASS"}
    assert "gpu_check: FAILED" in res.stdout


def test_the_real_check_without_cuda_says_so_and_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, even on a machine with one
    res = run_check(out=tmp_path, timeout_s=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no CUDA device" in res.stdout and "--dry-run" in res.stdout
    assert "NOT RUN" in (tmp_path / "gpu_check.md").read_text()
    assert not (tmp_path / "step1_pytest_gpu.log").exists()
    bad = run_check("--bogus", out=tmp_path, timeout_s=30)
    assert bad.returncode == 2 and "unknown argument '--bogus'" in bad.stderr
